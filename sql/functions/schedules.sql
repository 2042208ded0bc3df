-- sql/functions/schedules.sql: periodic jobs: pgq.schedule, their firing.

-- The first fire time of a schedule strictly after `after`: the instants 'epoch' + k * every,
-- computed in microseconds since the epoch (no calendar, no time zone), or pgq.cron_next.
CREATE OR REPLACE FUNCTION pgq._next_fire(cron text, every interval, timezone text, after timestamptz)
    RETURNS timestamptz
    LANGUAGE plpgsql STABLE
    AS $$
DECLARE
    step numeric;
BEGIN
    IF _next_fire.every IS NULL THEN
        RETURN pgq.cron_next(_next_fire.cron, _next_fire.after, _next_fire.timezone);
    END IF;
    step := round(extract(epoch FROM _next_fire.every) * 1000000);
    RETURN 'epoch'::timestamptz
           + ((floor(round(extract(epoch FROM _next_fire.after) * 1000000) / step) + 1) * step)::float8
             * interval '1 microsecond';
END
$$;

-- Sets queues.next_schedule_at of the given queues from their enabled schedules (the earliest
-- next_run_at), writing only rows whose value changes. The queue rows are locked first, in name
-- order; with skip_locked, a row another transaction holds is left as it is instead of waited
-- for: the firing, which holds schedule and job rows meanwhile, never waits here, so it can take
-- part in no deadlock. A value left behind is at worst early: the next claim of that queue finds
-- nothing due and corrects it. Without skip_locked (pgq.schedule, pgq.unschedule) the wait is
-- pgq._lock_queue's: at most its lock_timeout, then 55P03 with a hint.
CREATE OR REPLACE FUNCTION pgq._refresh_schedule_due(queues text[], skip_locked boolean) RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    locked text[];
BEGIN
    IF skip_locked THEN
        locked := ARRAY(SELECT u.name FROM pgq.queues AS u WHERE u.name = ANY (_refresh_schedule_due.queues)
                        ORDER BY u.name FOR NO KEY UPDATE SKIP LOCKED);
    ELSE
        locked := ARRAY(SELECT l.name
                        FROM (SELECT DISTINCT u.name FROM unnest(_refresh_schedule_due.queues) AS u(name)
                              WHERE u.name IS NOT NULL ORDER BY u.name) AS n
                        CROSS JOIN LATERAL pgq._lock_queue(n.name) AS l
                        WHERE l.name IS NOT NULL);
    END IF;
    -- A new statement, so its snapshot sees what the previous holders of these rows committed.
    UPDATE pgq.queues AS q
    SET next_schedule_at = d.at
    FROM (SELECT n.name, (SELECT min(x.next_run_at) FROM pgq.schedules AS x
                          WHERE x.queue = n.name AND x.enabled) AS at
          FROM unnest(locked) AS n(name)) AS d
    WHERE q.name = d.name AND q.next_schedule_at IS DISTINCT FROM d.at;
END
$$;

-- Fires up to max_schedules due schedules (of `queues`, or of every queue when NULL); returns how
-- many jobs it enqueued. Each due schedule
-- is locked (FOR NO KEY UPDATE SKIP LOCKED: a schedule another session is firing is skipped, not
-- waited for, and a row changed after this statement's snapshot is re-checked on its newest
-- version, so a schedule just fired elsewhere is no longer due). Its latest due occurrence (the
-- missed ones before it collapse into it) becomes one job whose run_at is the fire time, in the
-- same transaction that moves next_run_at past now: at most one job per (schedule, fire time).
-- With skip_if_running, an occurrence is skipped (counted in skipped) while the schedule's last
-- job is pending or running. A paused queue's schedule keeps at most one job waiting: while its
-- last job is still pending there, a due occurrence collapses into it, as missed ones collapse into
-- the latest (no job, nothing counted; next_run_at moves on), so a pause of a week leaves one job
-- for the resume, not a week of them (issue 24). A schedule whose queue's row a pgq.drop_queue or
-- a pgq.prune holds (FOR UPDATE) stays due for a later firing: the firing waits for nobody (it
-- runs inside claims and sweeps). Then the queues' next_schedule_at is brought up to date: of the
-- queues whose schedules it handled, and of those whose value says due (a value computed by a
-- concurrent firing from an older snapshot is corrected here, by the next claim or sweep).
CREATE OR REPLACE FUNCTION pgq._fire_schedules(max_schedules integer, queues text[] DEFAULT NULL) RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    s          pgq.schedules;
    at_now     timestamptz := pgq._now();
    fire       timestamptz;  -- the latest due occurrence
    hi         timestamptz;  -- no occurrence in (hi, at_now]
    t          timestamptz;
    q          pgq.queues;
    job_tenant text;
    new_id     bigint;
    fired      integer := 0;
    touched    text[] := '{}';
BEGIN
    FOR s IN
        SELECT * FROM pgq.schedules AS x
        WHERE x.enabled AND x.next_run_at <= at_now
          AND (_fire_schedules.queues IS NULL OR x.queue = ANY (_fire_schedules.queues))
        ORDER BY x.next_run_at
        LIMIT _fire_schedules.max_schedules
        FOR NO KEY UPDATE SKIP LOCKED
    LOOP
        touched := touched || s.queue;
        -- next_run_at is an occurrence, and due: find the latest one at or before now.
        fire := s.next_run_at;
        IF s.every IS NOT NULL THEN
            -- (every is subtracted as seconds: an interval with days would follow the session's
            -- daylight saving time.)
            fire := greatest(fire, pgq._next_fire(NULL, s.every, s.timezone,
                                                  at_now - make_interval(secs => extract(epoch FROM s.every))));
        ELSE
            -- Bisection over (fire, hi]: each step halves the gap or steps to the next
            -- occurrence, so a week of missed minutes costs a few dozen cron_next calls.
            hi := at_now;
            LOOP
                t := pgq.cron_next(s.cron, fire, s.timezone);
                EXIT WHEN t > hi;
                fire := t;
                t := pgq.cron_next(s.cron, to_timestamp((extract(epoch FROM fire) + extract(epoch FROM hi)) / 2),
                                   s.timezone);
                IF t <= hi THEN
                    fire := t;
                ELSE
                    hi := to_timestamp((extract(epoch FROM fire) + extract(epoch FROM hi)) / 2);
                END IF;
            END LOOP;
        END IF;

        IF s.skip_if_running AND EXISTS (SELECT FROM pgq.jobs AS j
                                         WHERE j.id = s.last_job_id AND j.state IN ('pending', 'running')) THEN
            UPDATE pgq.schedules AS x
            SET next_run_at = pgq._next_fire(s.cron, s.every, s.timezone, at_now),
                last_skipped_at = fire, skipped = x.skipped + 1
            WHERE x.name = s.name;
            CONTINUE;
        END IF;

        IF EXISTS (SELECT FROM pgq.queues AS u WHERE u.name = s.queue AND u.paused)
           AND EXISTS (SELECT FROM pgq.jobs AS j WHERE j.id = s.last_job_id AND j.state = 'pending') THEN
            UPDATE pgq.schedules AS x
            SET next_run_at = pgq._next_fire(s.cron, s.every, s.timezone, at_now)
            WHERE x.name = s.name;
            CONTINUE;
        END IF;

        -- The queue's settings, its row held FOR KEY SHARE as an enqueue holds it (its writer lock:
        -- pgq._queue_to_write), never waited for: while a drop or a prune holds it, the schedule
        -- stays due, for the next claim or sweep.
        SELECT * INTO q FROM pgq.queues AS u WHERE u.name = s.queue FOR KEY SHARE SKIP LOCKED;
        IF NOT FOUND THEN
            CONTINUE WHEN EXISTS (SELECT FROM pgq.queues AS u WHERE u.name = s.queue);
            q := pgq._queue(s.queue);  -- (pgq.schedule created it; a drop refuses while it has schedules)
        END IF;
        job_tenant := s.tenant;
        IF q.fair THEN
            job_tenant := pgq._fair_tenant(q.name, job_tenant);
        END IF;
        INSERT INTO pgq.jobs AS j (queue, kind, payload, priority, run_at, max_attempts, tenant, schedule)
        VALUES (s.queue, s.kind, s.payload, s.priority, fire, coalesce(s.max_attempts, q.max_attempts),
                job_tenant, s.name)
        RETURNING j.id INTO new_id;
        UPDATE pgq.schedules AS x
        SET next_run_at = pgq._next_fire(s.cron, s.every, s.timezone, at_now),
            last_run_at = fire, last_job_id = new_id
        WHERE x.name = s.name;
        IF q.notify THEN
            PERFORM pg_notify('pgq', s.queue);
        END IF;
        fired := fired + 1;
    END LOOP;
    PERFORM pgq._refresh_schedule_due(ARRAY(
        SELECT DISTINCT t.name FROM unnest(touched) AS t(name)
        UNION
        SELECT u.name FROM pgq.queues AS u
        WHERE u.next_schedule_at <= at_now
          AND (_fire_schedules.queues IS NULL OR u.name = ANY (_fire_schedules.queues))), true);
    RETURN fired;
END
$$;

-- Creates or replaces the schedule `name`: exactly one of cron (pgq.cron_next's grammar, read in
-- `timezone`) or every (the instants 'epoch' + k * every: '1 hour' fires on the hour). Its first
-- occurrence is the first one after now (after its last run, when replaced). Returns its row.
CREATE OR REPLACE FUNCTION pgq.schedule(name text, queue text, kind text, cron text DEFAULT NULL,
                             every interval DEFAULT NULL, payload jsonb DEFAULT '{}',
                             timezone text DEFAULT 'UTC', priority integer DEFAULT 0,
                             max_attempts integer DEFAULT NULL, tenant text DEFAULT NULL,
                             skip_if_running boolean DEFAULT false, enabled boolean DEFAULT true)
    RETURNS pgq.schedules
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET lock_timeout = '5s'
    AS $$
DECLARE
    result_row pgq.schedules;
    old_queue  text;  -- the queue of the schedule this call replaces, if any
BEGIN
    PERFORM pgq._check_name('name', schedule.name);
    PERFORM pgq._check_enqueue(schedule.queue, schedule.kind, pgq._now(), schedule.priority,
                               schedule.max_attempts, schedule.tenant, NULL, NULL, NULL);
    PERFORM pgq._check_payload('payload', schedule.payload);
    IF schedule.cron IS NULL AND schedule.every IS NULL THEN
        PERFORM pgq._bad_argument('cron', 'or every must be given',
            'Pass exactly one: cron => ''0 * * * *'' or every => ''1 hour''.');
    ELSIF schedule.cron IS NOT NULL AND schedule.every IS NOT NULL THEN
        PERFORM pgq._bad_argument('every', 'must be NULL when cron is given',
            'Pass exactly one of cron and every.');
    ELSIF schedule.every IS NOT NULL
          AND (extract(year FROM schedule.every) <> 0 OR extract(month FROM schedule.every) <> 0) THEN
        PERFORM pgq._bad_argument('every', format('must not count months or years, got %s', schedule.every),
            'Months differ in length: use cron (''0 0 1 * *'' is the first of every month).');
    ELSIF NOT pgq._is_span(schedule.every) THEN
        PERFORM pgq._check_span('every', schedule.every);
    ELSIF schedule.every < interval '1 second' OR schedule.every > interval '3650 days' THEN
        PERFORM pgq._bad_argument('every',
            format('must be between 1 second and 3650 days, got %s', schedule.every));
    END IF;
    IF schedule.timezone IS NULL THEN
        PERFORM pgq._bad_argument('timezone', 'must not be NULL', 'Omit it for UTC.');
    END IF;
    BEGIN
        PERFORM pgq._now() AT TIME ZONE schedule.timezone;
    EXCEPTION WHEN invalid_parameter_value THEN
        PERFORM pgq._bad_argument('timezone',
            format('is not a known time zone: %s', left(quote_literal(schedule.timezone), 80)),
            'Use a name from pg_timezone_names, such as ''Europe/Paris'' or ''UTC''.');
    END;
    IF schedule.skip_if_running IS NULL THEN
        PERFORM pgq._bad_argument('skip_if_running', 'must not be NULL');
    END IF;
    IF schedule.enabled IS NULL THEN
        PERFORM pgq._bad_argument('enabled', 'must not be NULL');
    END IF;
    -- A malformed cron expression raises here (pgq.cron_next), before anything is written.
    PERFORM pgq._next_fire(schedule.cron, schedule.every, schedule.timezone, pgq._now());

    PERFORM pgq._queue(schedule.queue);
    SELECT x.queue INTO old_queue FROM pgq.schedules AS x WHERE x.name = schedule.name;
    -- A replaced schedule's next run comes after its last one, whatever this statement's clock.
    INSERT INTO pgq.schedules AS x (name, queue, kind, cron, every, payload, timezone, priority,
                                    max_attempts, tenant, skip_if_running, enabled, next_run_at)
    VALUES (schedule.name, schedule.queue, schedule.kind, schedule.cron, schedule.every,
            schedule.payload, schedule.timezone, schedule.priority, schedule.max_attempts,
            schedule.tenant, schedule.skip_if_running, schedule.enabled,
            pgq._next_fire(schedule.cron, schedule.every, schedule.timezone, pgq._now()))
    ON CONFLICT ON CONSTRAINT schedules_pkey DO UPDATE
    SET queue = excluded.queue, kind = excluded.kind, cron = excluded.cron, every = excluded.every,
        payload = excluded.payload, timezone = excluded.timezone, priority = excluded.priority,
        max_attempts = excluded.max_attempts, tenant = excluded.tenant,
        skip_if_running = excluded.skip_if_running, enabled = excluded.enabled,
        next_run_at = pgq._next_fire(excluded.cron, excluded.every, excluded.timezone,
                                     greatest(pgq._now(), x.last_run_at, x.last_skipped_at))
    RETURNING * INTO result_row;
    PERFORM pgq._refresh_schedule_due(ARRAY[schedule.queue, old_queue], false);
    RETURN result_row;
END
$$;
COMMENT ON FUNCTION pgq.schedule(text, text, text, text, interval, jsonb, text, integer, integer, text, boolean, boolean) IS
    'Creates or replaces a periodic schedule (cron or every) and returns its row with next_run_at.';

CREATE OR REPLACE FUNCTION pgq.unschedule(name text)
    RETURNS boolean
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET lock_timeout = '5s'
    AS $$
DECLARE
    gone_queue text;
BEGIN
    IF unschedule.name IS NULL THEN
        PERFORM pgq._bad_argument('name', 'must not be NULL');
    END IF;
    DELETE FROM pgq.schedules AS x WHERE x.name = unschedule.name RETURNING x.queue INTO gone_queue;
    IF gone_queue IS NULL THEN
        RETURN false;
    END IF;
    PERFORM pgq._refresh_schedule_due(ARRAY[gone_queue], false);
    RETURN true;
END
$$;
COMMENT ON FUNCTION pgq.unschedule(text) IS
    'Deletes the schedule (its jobs stay); false when there was none of that name.';

CREATE OR REPLACE FUNCTION pgq.schedules()
    RETURNS SETOF pgq.schedules
    LANGUAGE sql STABLE
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
    -- (Not the schedules of a queue whose read grants do not admit the login: their payloads are
    -- the queue's future jobs.)
    SELECT * FROM pgq.schedules AS x WHERE pgq._may_read(x.queue) ORDER BY x.name
$$;
COMMENT ON FUNCTION pgq.schedules() IS
    'Every schedule, by name, with next_run_at, last_run_at, last_job_id and skipped.';
