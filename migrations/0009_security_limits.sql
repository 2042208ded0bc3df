-- pgq migration 0009: limits that hold (issue 18, "Limits that hold").
--
-- * Intervals: every interval argument and setting must be a span (pgq._is_span): no months or
--   years, no mixed signs. A claim's lease of '3000000 mon -89999999 days' compared as 1 day and
--   gave a lease of 1.3 million days; the queues' CHECKs and schedules' every say the same now.
-- * Sizes: payloads, results and progress are measured uncompressed (pgq._jsonb_size): a 50 MB
--   payload read from a table column measured 0.6 MB compressed and was accepted.
-- * Locks: a claim never waits for another session's lock on a queue (or tenant) row: a capped
--   queue another transaction holds is skipped for that call; admin calls wait at most 5 s
--   (lock_timeout) and then raise 55P03 with a hint (pgq._lock_queue).
-- * Rejections: a repeated rejected write (same job, attempt, operation and job state) is one event with a
--   count (job_events.times).
-- * Unbounded queues and tenants: claim(queues => NULL) reads only queues that have pending jobs
--   or a due schedule; a fair queue's claim walks its tenants by virtual time (tenants_vtime_idx)
--   and reads only those it serves; pgq.drop_queue removes an empty queue; pgq.prune removes
--   tenants without jobs.
-- * Validation: a queue name with a comma given to claim is refused (22023); unique_key is
--   limited to 1024 bytes; release and snooze stop at an attempt room (pgq._attempt_room) that
--   keeps every attempt counter below 2^31 through 21,464 failover fence moves.
-- sql/schema.sql holds the same definitions (tests/test_schema_matches_migrations.py).

-- What an interval argument or setting may be: a span of days and time, of one sign. An interval
-- that counts months ('3000000 mon -89999999 days' compares as 1 day, since a comparison counts a
-- month as 30 days, but adds 1.3 million days to a timestamp) or mixes the signs of its days and
-- its time ('1 day -23:59:59', 1 second by comparison, is -59:59 on a 23-hour day) does not do to
-- a timestamp what its comparison with a cap says; one without both does, give or take the hour a
-- daylight saving change adds to or takes from a day. One expression: inlined where it is used.
CREATE OR REPLACE FUNCTION pgq._is_span(interval) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT extract(year FROM $1) = 0 AND extract(month FROM $1) = 0
           AND extract(day FROM $1) * (extract(epoch FROM $1) - 86400 * extract(day FROM $1)) >= 0
$$;
COMMENT ON FUNCTION pgq._is_span(interval) IS
    'Whether an interval counts no months or years and its days and time have the same sign.';

-- Tables --------------------------------------------------------------------------------------------

-- Settings written through the holes closed here keep the length their comparison gave them, as
-- a span of seconds (a month counts 30 days), so the new CHECKs hold for every existing row.
UPDATE pgq.queues SET lease = make_interval(secs => extract(epoch FROM lease)) WHERE NOT pgq._is_span(lease);
UPDATE pgq.queues SET backoff_base = make_interval(secs => extract(epoch FROM backoff_base))
WHERE NOT pgq._is_span(backoff_base);
UPDATE pgq.queues SET backoff_cap = make_interval(secs => extract(epoch FROM backoff_cap))
WHERE NOT pgq._is_span(backoff_cap);
UPDATE pgq.queues SET retention = make_interval(secs => extract(epoch FROM retention)) WHERE NOT pgq._is_span(retention);
UPDATE pgq.queues SET max_run_time = make_interval(secs => extract(epoch FROM max_run_time))
WHERE NOT pgq._is_span(max_run_time);
UPDATE pgq.schedules SET every = make_interval(secs => extract(epoch FROM every)) WHERE NOT pgq._is_span(every);

ALTER TABLE pgq.queues
    DROP CONSTRAINT queues_lease_check,
    DROP CONSTRAINT queues_backoff_check,
    DROP CONSTRAINT queues_retention_check,
    DROP CONSTRAINT queues_max_run_time_check,
    ADD CONSTRAINT queues_lease_check CHECK (lease > '0' AND lease <= '1 day' AND pgq._is_span(lease)),
    ADD CONSTRAINT queues_backoff_check CHECK (backoff_base > '0' AND backoff_cap >= backoff_base
                                               AND backoff_cap <= '365 days'
                                               AND pgq._is_span(backoff_base) AND pgq._is_span(backoff_cap)),
    ADD CONSTRAINT queues_retention_check CHECK (retention >= '0' AND retention <= '3650 days'
                                                 AND pgq._is_span(retention)),
    ADD CONSTRAINT queues_max_run_time_check CHECK (max_run_time > '0' AND max_run_time <= '365 days'
                                                    AND pgq._is_span(max_run_time));
ALTER TABLE pgq.schedules
    ADD CONSTRAINT schedules_every_check CHECK (every >= '1 second' AND every <= '3650 days'
                                                AND pgq._is_span(every));

ALTER TABLE pgq.job_events ADD COLUMN times integer NOT NULL DEFAULT 1;
COMMENT ON COLUMN pgq.job_events.times IS
    'How many times the event happened: 1, but for a rejected write repeated (the same job, attempt '
    'and operation), which is recorded once and counted here (at is the first time).';

-- A fair queue's claim walks its tenants by virtual time (pgq._fair_pick), reading only as many as
-- it serves, however many tenants have due jobs.
CREATE INDEX tenants_vtime_idx ON pgq.tenants (queue, vtime, tenant);

-- A claim of every queue finds the queues with a due schedule here, not by reading every queue.
CREATE INDEX queues_schedule_due_idx ON pgq.queues (next_schedule_at) WHERE next_schedule_at IS NOT NULL;


-- Functions: new helpers ---------------------------------------------------------------------------

-- Refuses an interval that is not a span (pgq._is_span), naming the argument: 22023.
CREATE OR REPLACE FUNCTION pgq._check_span(argument text, value interval) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    IF extract(year FROM value) <> 0 OR extract(month FROM value) <> 0 THEN
        PERFORM pgq._bad_argument(argument, format('must not count months or years, got %s', value),
            'Months differ in length: give days (''30 days''), hours, minutes or seconds.');
    ELSIF NOT pgq._is_span(value) THEN
        PERFORM pgq._bad_argument(argument,
            format('must not mix a positive and a negative part, got %s', value),
            'Give one span, such as ''23:00:01'' instead of ''1 day -00:59:59''.');
    END IF;
END
$$;

-- The real size of a jsonb value in bytes: pg_column_size measures a compressed datum (a value
-- read from a table column, say) as stored, so 50 MB of repeat('x', ...) measured 0.6 MB. Only a
-- compressed value is decompressed to be measured (jsonb || '{}' returns the detoasted object);
-- any other is measured as it is, at no extra cost. One expression: inlined where it is used
-- (STABLE like pg_column_size: an IMMUTABLE wrapper of a STABLE function is not inlined, and its
-- call cost an enqueue 20 to 50 us).
CREATE OR REPLACE FUNCTION pgq._jsonb_size(jsonb) RETURNS integer
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
    SELECT CASE WHEN pg_column_compression($1) IS NULL THEN pg_column_size($1)
                ELSE pg_column_size($1 || '{}'::jsonb) END
$$;

-- Validates a unique_key: 1 to 1024 bytes. Bytes, not characters: the key is in an index entry
-- with the queue's name (at most 128 bytes), and a B-tree entry holds at most 2704 bytes, so 1,024
-- four-byte characters (4,096 bytes) failed the insert with 54000 instead of a clear refusal.
CREATE OR REPLACE FUNCTION pgq._check_unique_key(unique_key text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    IF octet_length(unique_key) NOT BETWEEN 1 AND 1024 THEN
        PERFORM pgq._bad_argument('unique_key',
            format('must be 1 to 1024 bytes long (UTF-8), got %s bytes', octet_length(unique_key)),
            'Hash a longer key, e.g. md5(key).');
    END IF;
END
$$;

-- How far a job's max_attempts may pass its attempts so far: a job can be released or snoozed
-- (each gives one attempt back) until max_attempts - attempt_offset reaches this, never past it,
-- so no counter can overflow: with 1,000,000 here and the failover fence's 100,000 attempt numbers
-- per timeline change (pgq._fence_step), a job's counters stay below 2^31 - 1 through
-- (2147483647 - 1000000) / 100000 = 21,464 timeline changes.
CREATE OR REPLACE FUNCTION pgq._attempt_room() RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT 1000000 $$;

-- Raises 54000 for a job that would pass its attempt room (pgq._attempt_room) by one more attempt.
CREATE OR REPLACE FUNCTION pgq._no_attempt_room(id bigint, operation text) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    RAISE EXCEPTION 'pgq: % of job % refused: the job has been given % attempts (releases and snoozes '
        'count), its limit', operation, id, pgq._attempt_room()
        USING ERRCODE = 'program_limit_exceeded',
              HINT = 'Fail or cancel the job: it cannot be given an attempt back again.';
END
$$;

-- The queue row for an admin call, locked (FOR NO KEY UPDATE, or FOR UPDATE to delete it), or
-- NULL when there is none. Admin calls wait for another session's lock on a queue row at most
-- lock_timeout (5 s: this function's and theirs): an idle transaction that claimed from a capped
-- queue holds its row until it ends. Then 55P03, naming the sessions that hold it.
CREATE OR REPLACE FUNCTION pgq._lock_queue(name text, for_delete boolean DEFAULT false) RETURNS pgq.queues
    LANGUAGE plpgsql
    SET lock_timeout = '5s'
    AS $$
DECLARE
    q pgq.queues;
BEGIN
    BEGIN
        IF for_delete THEN
            SELECT * INTO q FROM pgq.queues AS s WHERE s.name = _lock_queue.name FOR UPDATE;
        ELSE
            SELECT * INTO q FROM pgq.queues AS s WHERE s.name = _lock_queue.name FOR NO KEY UPDATE;
        END IF;
    EXCEPTION WHEN lock_not_available THEN
        RAISE EXCEPTION 'pgq: queue % is locked by another session; gave up after lock_timeout %',
            _lock_queue.name, current_setting('lock_timeout')
            USING ERRCODE = 'lock_not_available',
                  HINT = 'A transaction that claimed from it (or changes it) has not ended: see '
                         'pgq.health() (idle_in_transaction) or pg_stat_activity, end it, and try again.';
    END;
    RETURN q;
END
$$;

-- Functions: redefined -----------------------------------------------------------------------------

-- pgq._reject gains its times argument: the old signature goes (plpgsql resolves calls at run time).
DROP FUNCTION pgq._reject(bigint, integer, text);

-- Validates an interval argument: a span (pgq._is_span), > 0 and at most max_value.
CREATE OR REPLACE FUNCTION pgq._check_interval(argument text, value interval, max_value interval)
    RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    IF value IS NULL THEN
        PERFORM pgq._bad_argument(argument, 'must not be NULL');
    END IF;
    PERFORM pgq._check_span(argument, value);
    IF value <= interval '0' OR value > max_value THEN
        PERFORM pgq._bad_argument(argument,
            format('must be greater than 0 and at most %s, got %s', max_value, value));
    END IF;
END
$$;

-- Validates a payload: a JSON object of at most 1 MiB (its jsonb size, uncompressed).
CREATE OR REPLACE FUNCTION pgq._check_payload(argument text, value jsonb) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    IF value IS NULL THEN
        PERFORM pgq._bad_argument(argument, 'must not be NULL', 'Pass ''{}'' for an empty payload.');
    ELSIF jsonb_typeof(value) <> 'object' THEN
        PERFORM pgq._bad_argument(argument,
            format('must be a JSON object, got %s', jsonb_typeof(value)),
            'Wrap the value: jsonb_build_object(''value'', ...).');
    ELSIF pgq._jsonb_size(value) > 1048576 THEN
        PERFORM pgq._bad_argument(argument,
            format('is %s bytes; the limit is 1048576 (1 MiB)', pgq._jsonb_size(value)),
            'Store large data in a table of your own and put its key in the payload.');
    END IF;
END
$$;

-- Records a rejected write by an owner that no longer owns the job (a stale attempt), so that a
-- duplicate execution can be diagnosed from pgq.job_events. Writes nothing for unknown ids or
-- for queues with audit off. A repeated rejection (the same job, attempt and operation, the note
-- starting with the operation's name, while the job is in the same state) is recorded once:
-- `times` more on the event that recorded it first, so 10,000 bogus calls write one event, not
-- 10,000 (a rejection after the job moved on, say from running to done, is an event of its own).
-- Rejections of one (job, attempt) take turns (a transaction-level advisory lock on the pair, one
-- bigint key), so two concurrent ones cannot both find no event and both write one.
CREATE OR REPLACE FUNCTION pgq._reject(job_id bigint, attempt integer, operation text, times integer DEFAULT 1)
    RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    job pgq.jobs;
BEGIN
    SELECT j.* INTO job FROM pgq.jobs AS j JOIN pgq.queues AS q ON q.name = j.queue AND q.audit
    WHERE j.id = _reject.job_id;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock((_reject.job_id << 31) # _reject.attempt);
    -- The key of "the same rejection": job, attempt, operation, the job's state and the login
    -- that made the call (one more condition per column that should tell rejections apart).
    UPDATE pgq.job_events AS e
    SET times = e.times + _reject.times
    WHERE e.job_id = _reject.job_id AND e.attempt = _reject.attempt AND e.event = 'rejected'
      AND starts_with(e.note, _reject.operation || ' from attempt ') AND e.from_state = job.state
      AND e.session_role IS NOT DISTINCT FROM session_user;
    IF FOUND THEN
        RETURN;
    END IF;
    INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state, note, times)
    VALUES (job.id, _reject.attempt, NULL, 'rejected', job.state, NULL,
            format('%s from attempt %s rejected: the job is %s at attempt %s (last claimed by %s%s)',
                   _reject.operation, _reject.attempt, job.state, job.attempt, job.claimed_by,
                   CASE WHEN NOT pgq._same_login(job.session_role) THEN ', login ' || job.session_role END),
            _reject.times);
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
-- job is pending or running. Then the queues' next_schedule_at is brought up to date: of the
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

        -- The queue's writer lock, shared (see pgq.drop_queue), before its settings are read.
        PERFORM pg_advisory_xact_lock_shared(1885827329, hashtext(s.queue));
        q := pgq._queue(s.queue);
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

CREATE OR REPLACE FUNCTION pgq.enqueue(queue text, kind text, payload jsonb DEFAULT '{}',
                            run_at timestamptz DEFAULT now(), priority integer DEFAULT 0,
                            max_attempts integer DEFAULT NULL, unique_key text DEFAULT NULL,
                            tenant text DEFAULT NULL, max_run_time interval DEFAULT NULL)
    RETURNS bigint
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
#variable_conflict use_column
DECLARE
    q          pgq.queues;
    new_id     bigint;
    job_tenant text := enqueue.tenant;
BEGIN
    -- Every argument checked in one plain expression (no query, no nested call); only a call that
    -- fails it runs the checks that name the bad argument and raise. (The nested checks cost about
    -- a quarter of an enqueue.)
    IF NOT coalesce(pgq._is_name(enqueue.queue)
                    AND pgq._is_name(enqueue.kind)
                    AND isfinite(enqueue.run_at)
                    AND enqueue.priority BETWEEN -1000 AND 1000
                    AND coalesce(enqueue.max_attempts BETWEEN 1 AND 10000, true)
                    AND coalesce(length(enqueue.tenant) BETWEEN 1 AND 256, true)
                    AND jsonb_typeof(enqueue.payload) = 'object'
                    AND pgq._jsonb_size(enqueue.payload) <= 1048576
                    AND coalesce(octet_length(enqueue.unique_key) BETWEEN 1 AND 1024, true)
                    AND coalesce(enqueue.max_run_time > interval '0'
                                 AND enqueue.max_run_time <= interval '365 days'
                                 AND pgq._is_span(enqueue.max_run_time), true), false) THEN
        PERFORM pgq._check_enqueue(enqueue.queue, enqueue.kind, enqueue.run_at, enqueue.priority,
                                   enqueue.max_attempts, enqueue.tenant);
        PERFORM pgq._check_payload('payload', enqueue.payload);
        PERFORM pgq._check_unique_key(enqueue.unique_key);
        IF enqueue.max_run_time IS NOT NULL THEN
            PERFORM pgq._check_interval('max_run_time', enqueue.max_run_time, interval '365 days');
        END IF;
    END IF;
    -- The queue's writer lock, shared (see pgq.drop_queue), before its settings are read.
    PERFORM pg_advisory_xact_lock_shared(1885827329, hashtext(enqueue.queue));
    SELECT * INTO q FROM pgq.queues AS s WHERE s.name = enqueue.queue;
    IF NOT FOUND THEN
        q := pgq._queue(enqueue.queue);  -- first use: created with the defaults
    END IF;
    IF q.restricted IS NOT NULL AND NOT pgq._may(q.name, q.restricted, 'enqueue') THEN
        PERFORM pgq._denied(q.name, 'enqueue');
    END IF;
    IF q.fair THEN
        job_tenant := pgq._fair_tenant(q.name, job_tenant);
    END IF;

    IF enqueue.unique_key IS NULL THEN
        -- A plain INSERT: ON CONFLICT would make it a speculative insertion even without a key.
        INSERT INTO pgq.jobs AS j (queue, kind, payload, priority, run_at, max_attempts, tenant,
                                   max_run_time)
        VALUES (enqueue.queue, enqueue.kind, enqueue.payload, enqueue.priority, enqueue.run_at,
                coalesce(enqueue.max_attempts, q.max_attempts), job_tenant, enqueue.max_run_time)
        RETURNING j.id INTO new_id;
    ELSE
        LOOP
            INSERT INTO pgq.jobs AS j (queue, kind, payload, priority, run_at, max_attempts,
                                       unique_key, tenant, max_run_time)
            VALUES (enqueue.queue, enqueue.kind, enqueue.payload, enqueue.priority, enqueue.run_at,
                    coalesce(enqueue.max_attempts, q.max_attempts), enqueue.unique_key, job_tenant,
                    enqueue.max_run_time)
            ON CONFLICT (queue, unique_key)
                WHERE unique_key IS NOT NULL AND state IN ('pending', 'running', 'outcome_unknown')
                DO NOTHING
            RETURNING j.id INTO new_id;
            EXIT WHEN FOUND;
            -- A live job holds this unique_key: hand back its id. If it finished in the meantime,
            -- the key is free again and the INSERT is tried once more.
            SELECT j.id INTO new_id
            FROM pgq.jobs AS j
            WHERE j.queue = enqueue.queue AND j.unique_key = enqueue.unique_key
              AND j.unique_key IS NOT NULL AND j.state IN ('pending', 'running', 'outcome_unknown');
            IF FOUND THEN
                RETURN new_id;
            END IF;
        END LOOP;
    END IF;

    IF q.notify AND enqueue.run_at <= pgq._now() THEN
        PERFORM pg_notify('pgq', enqueue.queue);
    END IF;
    RETURN new_id;
END
$$;
COMMENT ON FUNCTION pgq.enqueue(text, text, jsonb, timestamptz, integer, integer, text, text, interval) IS
    'Adds one job and returns its id; with unique_key, returns the id of the live job that holds it.';

CREATE OR REPLACE FUNCTION pgq.enqueue_many(queue text, kind text, payloads jsonb[],
                                 run_at timestamptz DEFAULT now(), priority integer DEFAULT 0,
                                 max_attempts integer DEFAULT NULL, tenant text DEFAULT NULL,
                                 max_run_time interval DEFAULT NULL)
    RETURNS SETOF bigint
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
DECLARE
    q   pgq.queues;
    bad record;
    job_tenant text := enqueue_many.tenant;
BEGIN
    PERFORM pgq._check_enqueue(enqueue_many.queue, enqueue_many.kind, enqueue_many.run_at,
                               enqueue_many.priority, enqueue_many.max_attempts, enqueue_many.tenant);
    IF enqueue_many.max_run_time IS NOT NULL THEN
        PERFORM pgq._check_interval('max_run_time', enqueue_many.max_run_time, interval '365 days');
    END IF;
    IF enqueue_many.payloads IS NULL THEN
        PERFORM pgq._bad_argument('payloads', 'must not be NULL');
    END IF;
    SELECT p.value, p.n INTO bad
    FROM unnest(enqueue_many.payloads) WITH ORDINALITY AS p(value, n)
    WHERE p.value IS NULL OR jsonb_typeof(p.value) <> 'object' OR pgq._jsonb_size(p.value) > 1048576
    LIMIT 1;
    IF FOUND THEN
        PERFORM pgq._check_payload(format('payloads[%s]', bad.n), bad.value);
    END IF;
    -- The queue's writer lock, shared (see pgq.drop_queue), before its settings are read.
    PERFORM pg_advisory_xact_lock_shared(1885827329, hashtext(enqueue_many.queue));
    q := pgq._queue(enqueue_many.queue);
    IF q.restricted IS NOT NULL AND NOT pgq._may(q.name, q.restricted, 'enqueue') THEN
        PERFORM pgq._denied(q.name, 'enqueue');
    END IF;
    IF q.fair THEN
        job_tenant := pgq._fair_tenant(q.name, job_tenant);
    END IF;

    -- Identity values are drawn in the order the rows are inserted, so ordering by id returns
    -- the ids in payload order.
    RETURN QUERY
    WITH inserted AS (
        INSERT INTO pgq.jobs (queue, kind, payload, priority, run_at, max_attempts, tenant, max_run_time)
        SELECT enqueue_many.queue, enqueue_many.kind, p.value, enqueue_many.priority,
               enqueue_many.run_at, coalesce(enqueue_many.max_attempts, q.max_attempts),
               job_tenant, enqueue_many.max_run_time
        FROM unnest(enqueue_many.payloads) WITH ORDINALITY AS p(value, n)
        ORDER BY p.n
        RETURNING jobs.id
    )
    SELECT i.id FROM inserted AS i ORDER BY i.id;

    IF q.notify AND enqueue_many.run_at <= pgq._now() AND cardinality(enqueue_many.payloads) > 0 THEN
        PERFORM pg_notify('pgq', enqueue_many.queue);
    END IF;
END
$$;
COMMENT ON FUNCTION pgq.enqueue_many(text, text, jsonb[], timestamptz, integer, integer, text, interval) IS
    'Adds one job per payload in one INSERT and returns their ids in payload order.';

-- Fair mode's pick for one queue: up to `room` claimable jobs, locked FOR NO KEY UPDATE SKIP
-- LOCKED, chosen across the queue's tenants by weighted round-robin. Tenants with a due job are
-- ranked by virtual time (jobs started / weight); the k-th job of a tenant counts as finishing at
-- vtime + k/weight, and the earliest finishers win (ties: the total order). The winners' tenants
-- then advance their virtual time. A tenant that was idle restarts no further behind the busiest
-- one (the largest virtual time of the queue's tenants) than one round, so it gets its share, not
-- a burst. With `kinds`, only jobs of those kinds count (a filter within each tenant's jobs).
-- The cost is bounded by the tenants served, not the tenants waiting: one probe says whether the
-- queue has a claimable job at all, one reads the busiest tenant (the top of tenants_vtime_idx),
-- and the `room` least-served tenants with a claimable job are walked from the bottom, each
-- checked by one probe (so tenants without one that are passed over cost a probe each: pgq.prune
-- removes tenants without jobs). Tenants behind the busiest by more than a round all start at
-- busiest - 1 and are served in virtual-time order, then by name.
-- The winners' tenant rows are locked for the last update with SKIP LOCKED: a tenant another
-- claimer holds (an idle transaction that claimed from this queue, say) is left for this call,
-- with its picked jobs, instead of waited for; so no claimer waits for another or deadlocks.
CREATE OR REPLACE FUNCTION pgq._fair_pick(queue text, room integer, kinds text[] DEFAULT NULL) RETURNS SETOF bigint
    LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan
    AS $$
DECLARE
    busiest double precision;
    picked bigint[];
    served text[];
BEGIN
    IF NOT EXISTS (SELECT FROM pgq.jobs AS j
                   WHERE j.queue = _fair_pick.queue AND j.state = 'pending' AND j.attempt < j.max_attempts
                     AND j.run_at <= pgq._now()
                     AND (_fair_pick.kinds IS NULL OR j.kind = ANY (_fair_pick.kinds))) THEN
        RETURN;  -- no claimable job: no tenant needs to be read
    END IF;
    SELECT t.vtime INTO busiest
    FROM pgq.tenants AS t
    WHERE t.queue = _fair_pick.queue
    ORDER BY t.vtime DESC
    LIMIT 1;
    IF NOT FOUND THEN
        RETURN;  -- no tenant
    END IF;

    picked := ARRAY(
        WITH ranked AS (
            SELECT t.tenant, t.weight, greatest(t.vtime, busiest - 1) AS vstart
            FROM pgq.tenants AS t
            WHERE t.queue = _fair_pick.queue
              AND EXISTS (SELECT FROM pgq.jobs AS j
                          WHERE j.queue = t.queue AND j.tenant = t.tenant
                            AND j.state = 'pending' AND j.attempt < j.max_attempts AND j.tenant IS NOT NULL
                            AND j.run_at <= pgq._now()
                            AND (_fair_pick.kinds IS NULL OR j.kind = ANY (_fair_pick.kinds)))
            ORDER BY t.vtime, t.tenant
            LIMIT _fair_pick.room
        )
        SELECT c.id
        FROM ranked AS r
        CROSS JOIN LATERAL (
            SELECT x.id, x.priority, x.run_at,
                   row_number() OVER (ORDER BY x.priority DESC, x.run_at, x.id) AS k
            FROM (
                SELECT j.id, j.priority, j.run_at
                FROM pgq.jobs AS j
                WHERE j.queue = _fair_pick.queue AND j.tenant = r.tenant
                  AND j.state = 'pending' AND j.attempt < j.max_attempts AND j.tenant IS NOT NULL
                  AND j.run_at <= pgq._now()
                  AND (_fair_pick.kinds IS NULL OR j.kind = ANY (_fair_pick.kinds))
                ORDER BY j.priority DESC, j.run_at, j.id
                LIMIT _fair_pick.room
                FOR NO KEY UPDATE SKIP LOCKED
            ) AS x
        ) AS c
        ORDER BY r.vstart + c.k::float8 / r.weight, c.priority DESC, c.run_at, c.id
        LIMIT _fair_pick.room);

    -- (The tenants as arrays, so that both statements read them by primary key: joined, the
    -- generic plan read every tenant of the queue.)
    served := ARRAY(SELECT t.tenant FROM pgq.tenants AS t
                    WHERE t.queue = _fair_pick.queue
                      AND t.tenant = ANY (ARRAY(SELECT j.tenant FROM pgq.jobs AS j WHERE j.id = ANY (picked)))
                    FOR NO KEY UPDATE SKIP LOCKED);
    picked := ARRAY(SELECT j.id FROM pgq.jobs AS j WHERE j.id = ANY (picked) AND j.tenant = ANY (served));
    UPDATE pgq.tenants AS t
    SET vtime = greatest(t.vtime, busiest - 1) + s.n::float8 / t.weight
    FROM (SELECT j.tenant, count(*) AS n FROM pgq.jobs AS j WHERE j.id = ANY (picked) GROUP BY j.tenant) AS s
    WHERE t.queue = _fair_pick.queue AND t.tenant = ANY (served) AND t.tenant = s.tenant;

    RETURN QUERY SELECT unnest(picked);
END
$$;

-- THE CLAIM. One statement picks up to `batch` due pending jobs of the worker's (unpaused)
-- queues in the total order priority DESC, run_at, id, locks them FOR NO KEY UPDATE SKIP LOCKED
-- (rows other claimers hold are skipped, not waited for; a foreign-key KEY SHARE lock does not
-- hide a job), marks them running under a lease measured by the database clock, and increments
-- the attempt, the fencing token every later write must quote. Rows that changed after the
-- statement's snapshot are re-checked by PostgreSQL when locked, so a cancelled or already
-- claimed job is never returned; a batch may hold fewer rows than asked.
-- Expired leases are recovered first (a cheap index probe decides whether there are any), so a
-- crashed worker's job is claimable again as soon as its lease ends, with or without a sweep.
-- Due schedules of the claimed queues fire next: the queue rows read anyway say whether one is
-- due (queues.next_schedule_at), so their jobs are claimable by this very claim.
-- An attempt's lease never passes its deadline (claimed_at + max_run_time).
-- A worker that names its `kinds` gets only jobs of those kinds (NULL: any kind), read per kind
-- from jobs_kind_ready_idx, so jobs of kinds it cannot run wait untouched for a worker that can.
-- Which queues: the named ones; with queues => NULL, the queues that have a pending job (a skip
-- scan of jobs_ready_idx: one index probe per such queue, so queues without jobs cost nothing,
-- however many exist) or a due schedule (queues_schedule_due_idx), unpaused.
-- Two queue settings change the pick: a queue with max_running > 0 is locked for the claim and
-- offers only its free slots (claimers of a capped queue take turns; no race can pass the cap),
-- and a fair queue's candidates come from pgq._fair_pick. Queues with neither pay nothing for them.
-- A claim never waits for another session's lock: a capped queue's row (or a fair queue's tenant
-- row) that another transaction holds is skipped for this call (SKIP LOCKED), so an idle
-- transaction that claimed from a capped queue holds up no other worker's claims.
-- Before any of that, the failover fence: the first claim of a session checks that the fences
-- were moved on this server's timeline (pgq._check_timeline); later ones read one setting.
CREATE OR REPLACE FUNCTION pgq.claim(worker text, queues text[] DEFAULT NULL, batch integer DEFAULT 1,
                          lease interval DEFAULT NULL, kinds text[] DEFAULT NULL)
    RETURNS SETOF pgq.claimed_job
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET plan_cache_mode = force_generic_plan
    -- A generic plan's cost can pass jit_above_cost on stale statistics (after a plain VACUUM,
    -- say), and compiling it then costs ~25 ms per claim: never worth it for a handful of rows.
    SET jit = off
    AS $$
DECLARE
    names    text[];     -- the eligible queues, in name order
    rooms    integer[];  -- how many jobs each may start now
    fairs    boolean[];  -- whether each is in fair mode
    fair_ids bigint[] := '{}';
    capped   boolean;    -- whether any of them has max_running
    locked   text[];     -- then: the capped ones this call holds (the others are skipped)
    expired  boolean;    -- whether any lease has expired
    due      boolean;    -- whether one of them has a schedule due
    due_queues text[];   -- then: the eligible queues, whose due schedules fire
BEGIN
    IF claim.worker IS NULL THEN
        PERFORM pgq._bad_argument('worker', 'must not be NULL');
    ELSIF length(claim.worker) NOT BETWEEN 1 AND 256 THEN
        PERFORM pgq._bad_argument('worker', 'must be 1 to 256 characters long');
    END IF;
    IF claim.batch IS NULL THEN
        PERFORM pgq._bad_argument('batch', 'must not be NULL');
    ELSIF claim.batch NOT BETWEEN 1 AND 1000 THEN
        PERFORM pgq._bad_argument('batch', format('must be between 1 and 1000, got %s', claim.batch));
    END IF;
    IF claim.lease IS NOT NULL THEN
        PERFORM pgq._check_interval('lease', claim.lease, interval '1 day');
    END IF;
    IF claim.queues IS NOT NULL AND (cardinality(claim.queues) = 0 OR array_position(claim.queues, NULL) IS NOT NULL) THEN
        PERFORM pgq._bad_argument('queues', 'must be NULL (all queues) or a non-empty array without NULLs');
    END IF;
    -- A malformed name can never match a queue: say so instead of claiming nothing forever.
    -- Names cannot contain a comma, so one match of the joined names (pgq._is_name's pattern,
    -- repeated) checks them all in a plain expression (no query), and so does the length (no
    -- run of 129 characters without a comma; a joined list of 128 or fewer cannot hold one, and
    -- skips that match); the joined names hold exactly one comma fewer than there are names (a
    -- name 'a,b' would otherwise pass as two). Only a bad name pays for the per-name check that
    -- names it.
    IF claim.queues IS NOT NULL AND NOT coalesce(
           array_to_string(claim.queues, ',')
               ~ '^[A-Za-z0-9_][A-Za-z0-9_.:/-]*(,[A-Za-z0-9_][A-Za-z0-9_.:/-]*)*$'
           AND length(array_to_string(claim.queues, ',')) - length(replace(array_to_string(claim.queues, ','), ',', ''))
               = cardinality(claim.queues) - 1
           AND (length(array_to_string(claim.queues, ',')) <= 128
                OR array_to_string(claim.queues, ',') !~ '[^,]{129}'), false) THEN
        PERFORM pgq._check_name(format('queues[%s]', q.n), q.name)
        FROM unnest(claim.queues) WITH ORDINALITY AS q(name, n);
    END IF;
    -- The kinds are checked the same way, and only when given.
    IF claim.kinds IS NOT NULL THEN
        IF cardinality(claim.kinds) NOT BETWEEN 1 AND 1000 OR array_position(claim.kinds, NULL) IS NOT NULL THEN
            PERFORM pgq._bad_argument('kinds',
                'must be NULL (any kind) or an array of 1 to 1000 kinds without NULLs');
        END IF;
        IF NOT coalesce(
               array_to_string(claim.kinds, ',')
                   ~ '^[A-Za-z0-9_][A-Za-z0-9_.:/-]*(,[A-Za-z0-9_][A-Za-z0-9_.:/-]*)*$'
               AND length(array_to_string(claim.kinds, ',')) - length(replace(array_to_string(claim.kinds, ','), ',', ''))
                   = cardinality(claim.kinds) - 1
               AND (length(array_to_string(claim.kinds, ',')) <= 128
                    OR array_to_string(claim.kinds, ',') !~ '[^,]{129}'), false) THEN
            PERFORM pgq._check_name(format('kinds[%s]', k.n), k.name)
            FROM unnest(claim.kinds) WITH ORDINALITY AS k(name, n);
        END IF;
    END IF;

    -- The failover fence, checked once per session (a session never outlives a promotion).
    IF coalesce(current_setting('pgq.fence', true), '') = '' THEN
        PERFORM pgq._check_timeline();
    END IF;

    -- One statement reads the eligible queues (and whether one of them has a schedule due: a
    -- column of the rows read anyway, and bool_or, which allocates nothing, unlike array_agg) and
    -- probes for expired leases (one index probe). With queues => NULL the candidates are the
    -- queues that have a pending job, found by a skip scan of jobs_ready_idx (the next queue name
    -- after the last, one index probe each: queues without jobs are never read), and those with a
    -- due schedule (queues_schedule_due_idx).
    FOR pass IN 1..2 LOOP
        SELECT array_agg(q.name ORDER BY q.name), array_agg(q.fair ORDER BY q.name),
               coalesce(bool_or(q.max_running > 0), false),
               EXISTS (SELECT FROM pgq.jobs AS j WHERE j.state = 'running' AND j.lease_until < pgq._now()),
               coalesce(bool_or(q.next_schedule_at <= pgq._now()), false)
        INTO names, fairs, capped, expired, due
        FROM pgq.queues AS q
        WHERE NOT q.paused
          AND q.name = ANY (coalesce(claim.queues, ARRAY(
                  WITH RECURSIVE pending(name) AS (
                      (SELECT j.queue FROM pgq.jobs AS j
                       WHERE j.state = 'pending' AND j.attempt < j.max_attempts
                       ORDER BY j.queue LIMIT 1)
                      UNION ALL
                      SELECT (SELECT j.queue FROM pgq.jobs AS j
                              WHERE j.queue > p.name AND j.state = 'pending' AND j.attempt < j.max_attempts
                              ORDER BY j.queue LIMIT 1)
                      FROM pending AS p WHERE p.name IS NOT NULL
                  )
                  SELECT p.name FROM pending AS p WHERE p.name IS NOT NULL
                  UNION ALL
                  SELECT u.name FROM pgq.queues AS u WHERE u.next_schedule_at <= pgq._now())))
          -- A queue with grants admits only some logins (a named one raises 42501 for the others).
          AND (q.restricted IS NULL OR pgq._may_claim(q.name, q.restricted, claim.queues IS NOT NULL));

        -- Expired leases are recovered first, so their jobs are claimable by this very claim
        -- (with queues => NULL, their queues are candidates only once recovered: read again).
        EXIT WHEN pass = 2 OR NOT expired;
        PERFORM pgq._recover_expired(100);
        EXIT WHEN claim.queues IS NOT NULL;
    END LOOP;
    IF names IS NULL THEN
        RETURN;  -- no eligible queue
    END IF;
    IF due THEN
        due_queues := names;  -- before the capped queues' rooms narrow names down
    END IF;

    IF NOT capped THEN
        rooms := array_fill(claim.batch, ARRAY[cardinality(names)]);
    ELSE
        -- Capped queues are locked before their running jobs are counted by the next statement,
        -- whose fresh snapshot sees every earlier claim; one that another transaction holds is
        -- skipped (this call claims none of its jobs), never waited for. (Under REPEATABLE READ or
        -- SERIALIZABLE that count would come from an older snapshot and could pass the cap: such
        -- a claim of a capped queue is refused.)
        IF current_setting('transaction_isolation') <> 'read committed' THEN
            RAISE EXCEPTION 'pgq: a claim of a queue with max_running must run at READ COMMITTED, not %',
                upper(current_setting('transaction_isolation'))
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      HINT = 'Claim in autocommit mode, or in a READ COMMITTED transaction.';
        END IF;
        locked := ARRAY(SELECT q.name FROM pgq.queues AS q
                        WHERE q.max_running > 0 AND NOT q.paused AND q.name = ANY (names)
                        FOR NO KEY UPDATE SKIP LOCKED);

        SELECT array_agg(e.name ORDER BY e.name), array_agg(e.room ORDER BY e.name),
               array_agg(e.fair ORDER BY e.name)
        INTO names, rooms, fairs
        FROM (
            SELECT q.name, q.fair,
                   CASE WHEN q.max_running = 0 THEN claim.batch
                        ELSE least(claim.batch, q.max_running - (
                                 SELECT count(*) FROM pgq.jobs AS j
                                 WHERE j.lease_until IS NOT NULL AND j.queue = q.name)::integer)
                   END AS room
            FROM pgq.queues AS q
            WHERE NOT q.paused AND q.name = ANY (names) AND (q.max_running = 0 OR q.name = ANY (locked))
        ) AS e
        WHERE e.room > 0;
    END IF;

    -- Then the due schedules of these queues fire (at most 10 per claim; a sweep fires the rest),
    -- after the capped queues are locked: the firing only ever skips locked queue rows, so a
    -- claim waits for queue locks in name order alone. Under REPEATABLE READ a claim leaves them
    -- to READ COMMITTED claims and sweeps: its snapshot could make a concurrent firing a
    -- serialization failure of the claim.
    IF due AND current_setting('transaction_isolation') = 'read committed' THEN
        PERFORM pgq._fire_schedules(10, due_queues);
    END IF;

    IF true = ANY (fairs) THEN
        fair_ids := ARRAY(SELECT f.id
                          FROM unnest(names, rooms, fairs) AS e(name, room, fair)
                          CROSS JOIN LATERAL pgq._fair_pick(e.name, e.room, claim.kinds) AS f(id)
                          WHERE e.fair);
    END IF;

    RETURN QUERY
    WITH picked AS (
        -- For each eligible queue, its first claimable jobs in index order (up to its room);
        -- with the fair queues' picks, the best `batch` of those across queues.
        SELECT c.id
        FROM (
            SELECT c.id, c.priority, c.run_at
            FROM unnest(names, rooms, fairs) AS e(queue, room, fair)
            CROSS JOIN LATERAL (
                SELECT j.id, j.priority, j.run_at
                FROM pgq.jobs AS j
                WHERE j.queue = e.queue
                  AND j.state = 'pending' AND j.attempt < j.max_attempts
                  AND j.run_at <= pgq._now()
                ORDER BY j.priority DESC, j.run_at, j.id
                LIMIT e.room
                FOR NO KEY UPDATE SKIP LOCKED
            ) AS c
            WHERE NOT e.fair AND claim.kinds IS NULL
            UNION ALL
            -- The same per (queue, kind) when the worker named its kinds (each kind once; no
            -- rows for NULL). Inside this one statement: a query of its own would cost a claim
            -- more than the per-kind picks do.
            SELECT c.id, c.priority, c.run_at
            FROM unnest(names, rooms, fairs) AS e(queue, room, fair)
            CROSS JOIN (SELECT DISTINCT w.kind FROM unnest(claim.kinds) AS w(kind)) AS k
            CROSS JOIN LATERAL (
                SELECT j.id, j.priority, j.run_at
                FROM pgq.jobs AS j
                WHERE j.queue = e.queue AND j.kind = k.kind
                  AND j.state = 'pending' AND j.attempt < j.max_attempts
                  AND j.run_at <= pgq._now()
                ORDER BY j.priority DESC, j.run_at, j.id
                LIMIT e.room
                FOR NO KEY UPDATE SKIP LOCKED
            ) AS c
            WHERE NOT e.fair
            UNION ALL
            SELECT j.id, j.priority, j.run_at FROM pgq.jobs AS j WHERE j.id = ANY (fair_ids)
        ) AS c
        ORDER BY c.priority DESC, c.run_at, c.id
        LIMIT claim.batch
    ), claimed AS (
        UPDATE pgq.jobs AS j
        SET state = 'running',
            -- The next number, past any a fence move skipped (attempt_skip is 0 but after a promotion).
            attempt = j.attempt + 1 + j.attempt_skip,
            max_attempts = j.max_attempts + j.attempt_skip,
            attempt_offset = j.attempt_offset + j.attempt_skip,
            attempt_skip = 0,
            lease_until = least(pgq._now() + coalesce(claim.lease, q.lease),
                                pgq._now() + coalesce(j.max_run_time, q.max_run_time)),
            deadline = pgq._now() + coalesce(j.max_run_time, q.max_run_time),
            claimed_by = claim.worker,
            claimed_at = pgq._now(),
            session_role = session_user,
            last_event = 'claimed'
        FROM pgq.queues AS q
        -- The picked ids as an array: the generic plan then reads them by primary key. Joined
        -- to the CTE instead, it hashed the CTE and read the whole table (every row ever
        -- enqueued and not yet pruned) on every claim.
        WHERE j.id = ANY (ARRAY(SELECT p.id FROM picked AS p)) AND q.name = j.queue
        RETURNING j.id, j.queue, j.kind, j.payload, j.priority, j.attempt, j.max_attempts,
                  j.run_at, j.created_at, j.lease_until, j.tenant, j.progress, j.deadline, q.audit
    ), events AS (
        INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state)
        SELECT c.id, c.attempt, claim.worker, 'claimed', 'pending', 'running'
        FROM claimed AS c WHERE c.audit
    )
    SELECT c.id, c.queue, c.kind, c.payload, c.priority, c.attempt, c.max_attempts,
           c.run_at, c.created_at, c.lease_until, c.tenant, c.progress, c.deadline
    FROM claimed AS c
    ORDER BY c.priority DESC, c.run_at, c.id;
END
$$;
COMMENT ON FUNCTION pgq.claim(text, text[], integer, interval, text[]) IS
    'Claims up to batch due jobs (of kinds, when given) for worker, in order priority DESC, run_at, '
    'id. The returned '
    'attempt is the fencing token for renew, complete, fail, release, snooze and mark_unknown.';

CREATE OR REPLACE FUNCTION pgq.complete(id bigint, attempt integer, result jsonb DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
DECLARE
    changed integer;
BEGIN
    IF complete.id IS NULL OR complete.attempt IS NULL THEN  -- a plain expression: no query on the hot path
        PERFORM pgq._check_fence(complete.id, complete.attempt);
    END IF;
    IF pgq._jsonb_size(complete.result) > 1048576 THEN
        PERFORM pgq._bad_argument('result',
            format('is %s bytes; the limit is 1048576 (1 MiB)', pgq._jsonb_size(complete.result)),
            'Store large results in a table of your own.');
    END IF;
    WITH completed AS (
        UPDATE pgq.jobs AS j
        SET state = 'done', result = complete.result, lease_until = NULL, finished_at = pgq._now(),
            last_event = 'completed', session_role = session_user
        WHERE j.id = complete.id AND j.attempt = complete.attempt AND j.state = 'running'
          AND pgq._owns(j.session_role)
        RETURNING j.id, j.queue, j.attempt, j.claimed_by
    ), events AS (
        INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state)
        SELECT c.id, c.attempt, c.claimed_by, 'completed', 'running', 'done'
        FROM completed AS c JOIN pgq.queues AS q ON q.name = c.queue AND q.audit
    )
    SELECT count(*) INTO changed FROM completed;
    IF changed > 0 THEN
        RETURN true;
    END IF;
    -- Idempotent: the same attempt already completed it (a retry after an ambiguous commit), by
    -- this login.
    IF EXISTS (SELECT FROM pgq.jobs AS j
               WHERE j.id = complete.id AND j.attempt = complete.attempt AND j.state = 'done'
                 AND j.last_event = 'completed' AND pgq._same_login(j.session_role)) THEN
        RETURN true;
    END IF;
    PERFORM pgq._reject(complete.id, complete.attempt, 'complete');
    RETURN false;
END
$$;
COMMENT ON FUNCTION pgq.complete(bigint, integer, jsonb) IS
    'Marks the caller''s attempt done; false when not yours. Repeating it returns true again.';

CREATE OR REPLACE FUNCTION pgq.complete_many(ids bigint[], attempts integer[])
    RETURNS SETOF bigint
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    -- The custom plan of the completing statement cost a re-plan per call (1.6 ms of a 4-job
    -- call here, 0.7 ms with the generic plan, which reads every pair by primary key).
    SET plan_cache_mode = force_generic_plan
    AS $$
DECLARE
    done_ids bigint[];
BEGIN
    IF complete_many.ids IS NULL THEN
        PERFORM pgq._bad_argument('ids', 'must not be NULL');
    ELSIF complete_many.attempts IS NULL THEN
        PERFORM pgq._bad_argument('attempts', 'must not be NULL');
    ELSIF cardinality(complete_many.ids) <> cardinality(complete_many.attempts) THEN
        PERFORM pgq._bad_argument('attempts',
            format('must have as many elements as ids (%s), got %s',
                   cardinality(complete_many.ids), cardinality(complete_many.attempts)));
    ELSIF array_position(complete_many.ids, NULL) IS NOT NULL
          OR array_position(complete_many.attempts, NULL) IS NOT NULL THEN
        PERFORM pgq._bad_argument('ids', 'must not contain NULL (nor may attempts)');
    END IF;

    WITH wanted AS (
        SELECT w.id, w.attempt FROM unnest(complete_many.ids, complete_many.attempts) AS w(id, attempt)
    ), owned AS (
        -- Lock in id order, so concurrent batches never deadlock.
        SELECT j.id
        FROM pgq.jobs AS j JOIN wanted AS w ON w.id = j.id AND w.attempt = j.attempt
        WHERE j.state = 'running' AND pgq._owns(j.session_role)
        ORDER BY j.id
        FOR NO KEY UPDATE OF j
    ), completed AS (
        UPDATE pgq.jobs AS j
        SET state = 'done', lease_until = NULL, finished_at = pgq._now(), last_event = 'completed',
            session_role = session_user
        FROM owned AS o, wanted AS w
        WHERE j.id = o.id AND w.id = j.id AND j.attempt = w.attempt AND j.state = 'running'
          AND pgq._owns(j.session_role)
        RETURNING j.id, j.queue, j.attempt, j.claimed_by
    ), events AS (
        INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state)
        SELECT c.id, c.attempt, c.claimed_by, 'completed', 'running', 'done'
        FROM completed AS c JOIN pgq.queues AS q ON q.name = c.queue AND q.audit
    )
    SELECT coalesce(array_agg(c.id), '{}') INTO done_ids FROM completed AS c;
    -- The common case ends here: every pair was still ours and is done now.
    IF cardinality(done_ids) = cardinality(complete_many.ids) THEN
        RETURN QUERY SELECT unnest(done_ids);
        RETURN;
    END IF;

    -- Some pair was not completed just now. This statement sees the rows completed above, so
    -- a pair counts as ours when its job is done by that same attempt: completed above, or
    -- earlier (idempotent: a retry after an ambiguous commit). The other pairs are stale: they
    -- leave the trace a rejected pgq.complete leaves, so that a duplicate execution can be
    -- diagnosed from pgq.job_events whichever call the worker used; a pair repeated in the call
    -- (or rejected before) is recorded once, with the number of times (pgq._reject).
    PERFORM pgq._reject(r.id, r.attempt, 'complete_many', r.times::integer)
    FROM (SELECT w.id, w.attempt, count(*) AS times
          FROM unnest(complete_many.ids, complete_many.attempts) AS w(id, attempt)
          JOIN pgq.jobs AS j ON j.id = w.id AND j.id = ANY (complete_many.ids)
          JOIN pgq.queues AS q ON q.name = j.queue AND q.audit
          WHERE NOT (j.attempt = w.attempt AND j.state = 'done' AND j.last_event = 'completed'
                     AND pgq._same_login(j.session_role))
          GROUP BY w.id, w.attempt
          ORDER BY w.id, w.attempt) AS r;

    -- The ids drive both statements by primary key (= ANY): a join to the pairs let the generic
    -- plan read every finished job through jobs_finished_idx instead.
    RETURN QUERY
    SELECT unnest(done_ids)
    UNION
    SELECT j.id
    FROM pgq.jobs AS j
    WHERE j.id = ANY (complete_many.ids) AND j.state = 'done' AND j.last_event = 'completed'
      AND pgq._same_login(j.session_role)
      AND (j.id, j.attempt) IN (SELECT w.id, w.attempt
                                FROM unnest(complete_many.ids, complete_many.attempts) AS w(id, attempt));
END
$$;
COMMENT ON FUNCTION pgq.complete_many(bigint[], integer[]) IS
    'Completes each (id, attempt) pair the caller still owns; returns the ids completed.';

-- Gives back a job the worker has not started (e.g. at shutdown): pending again now, without
-- using up an attempt (max_attempts is raised by one, since the attempt number never decreases).
CREATE OR REPLACE FUNCTION pgq.release(id bigint, attempt integer)
    RETURNS boolean
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
DECLARE
    changed integer;
BEGIN
    PERFORM pgq._check_fence(release.id, release.attempt);
    WITH released AS (
        UPDATE pgq.jobs AS j
        SET state = 'pending', lease_until = NULL, run_at = pgq._now(),
            max_attempts = j.max_attempts + 1, last_event = 'released', session_role = session_user
        WHERE j.id = release.id AND j.attempt = release.attempt AND j.state = 'running'
          AND pgq._owns(j.session_role)
          AND j.max_attempts - j.attempt_offset < pgq._attempt_room()
        RETURNING j.id, j.queue, j.attempt, j.claimed_by
    ), events AS (
        INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state)
        SELECT r.id, r.attempt, r.claimed_by, 'released', 'running', 'pending'
        FROM released AS r JOIN pgq.queues AS q ON q.name = r.queue AND q.audit
    )
    SELECT count(*) INTO changed FROM released;
    IF changed > 0 THEN
        PERFORM pgq._notify(j.queue) FROM pgq.jobs AS j WHERE j.id = release.id;
        RETURN true;
    END IF;
    IF EXISTS (SELECT FROM pgq.jobs AS j
               WHERE j.id = release.id AND j.attempt = release.attempt AND j.last_event = 'released'
                 AND pgq._same_login(j.session_role)) THEN
        RETURN true;
    END IF;
    -- Ours, but out of attempt room (pgq._attempt_room): refused, the job is left as it is.
    IF EXISTS (SELECT FROM pgq.jobs AS j
               WHERE j.id = release.id AND j.attempt = release.attempt AND j.state = 'running'
                 AND pgq._owns(j.session_role)) THEN
        PERFORM pgq._no_attempt_room(release.id, 'release');
    END IF;
    PERFORM pgq._reject(release.id, release.attempt, 'release');
    RETURN false;
END
$$;
COMMENT ON FUNCTION pgq.release(bigint, integer) IS
    'Gives an unstarted job back (pending now, the attempt not counted); false when not yours.';

-- Puts a job back to sleep for `delay`; the snooze does not use up an attempt.
CREATE OR REPLACE FUNCTION pgq.snooze(id bigint, attempt integer, delay interval)
    RETURNS timestamptz
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
DECLARE
    new_run_at timestamptz;
BEGIN
    PERFORM pgq._check_fence(snooze.id, snooze.attempt);
    PERFORM pgq._check_interval('delay', snooze.delay, interval '365 days');
    WITH snoozed AS (
        UPDATE pgq.jobs AS j
        SET state = 'pending', lease_until = NULL, run_at = pgq._now() + snooze.delay,
            max_attempts = j.max_attempts + 1, last_event = 'snoozed', session_role = session_user
        WHERE j.id = snooze.id AND j.attempt = snooze.attempt AND j.state = 'running'
          AND pgq._owns(j.session_role)
          AND j.max_attempts - j.attempt_offset < pgq._attempt_room()
        RETURNING j.id, j.queue, j.attempt, j.claimed_by, j.run_at
    ), events AS (
        INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state, note)
        SELECT s.id, s.attempt, s.claimed_by, 'snoozed', 'running', 'pending',
               format('until %s', s.run_at)
        FROM snoozed AS s JOIN pgq.queues AS q ON q.name = s.queue AND q.audit
    )
    SELECT s.run_at INTO new_run_at FROM snoozed AS s;
    IF FOUND THEN
        RETURN new_run_at;
    END IF;
    SELECT j.run_at INTO new_run_at FROM pgq.jobs AS j
    WHERE j.id = snooze.id AND j.attempt = snooze.attempt AND j.last_event = 'snoozed'
      AND pgq._same_login(j.session_role);
    IF FOUND THEN
        RETURN new_run_at;
    END IF;
    -- Ours, but out of attempt room (pgq._attempt_room): refused, the job is left as it is.
    IF EXISTS (SELECT FROM pgq.jobs AS j
               WHERE j.id = snooze.id AND j.attempt = snooze.attempt AND j.state = 'running'
                 AND pgq._owns(j.session_role)) THEN
        PERFORM pgq._no_attempt_room(snooze.id, 'snooze');
    END IF;
    PERFORM pgq._reject(snooze.id, snooze.attempt, 'snooze');
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION pgq.snooze(bigint, integer, interval) IS
    'Pending again after delay without using an attempt; returns the new run_at, NULL when not yours.';

-- Runs a failed or cancelled job again, now. The attempt number is kept (it never decreases);
-- max_attempts is raised so that at least one more attempt is allowed.
CREATE OR REPLACE FUNCTION pgq.retry(id bigint)
    RETURNS boolean
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET lock_timeout = '5s'
    AS $$
DECLARE
    job pgq.jobs := pgq._admin_job(retry.id);
BEGIN
    IF job.state NOT IN ('failed', 'cancelled') THEN
        RAISE EXCEPTION 'pgq: job % is %, only failed or cancelled jobs can be retried', retry.id, job.state
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Use pgq.resolve for outcome_unknown jobs.';
    END IF;
    IF greatest(job.max_attempts, job.attempt + 1) - job.attempt_offset > pgq._attempt_room() THEN
        PERFORM pgq._no_attempt_room(retry.id, 'retry');
    END IF;
    BEGIN
        UPDATE pgq.jobs AS j
        SET state = 'pending', run_at = pgq._now(), finished_at = NULL,
            max_attempts = greatest(j.max_attempts, j.attempt + 1), last_event = 'retried'
        WHERE j.id = retry.id;
    EXCEPTION WHEN unique_violation THEN
        RAISE EXCEPTION 'pgq: job % cannot be retried: job % holds its unique_key %', retry.id,
            (SELECT j.id FROM pgq.jobs AS j
             WHERE j.queue = job.queue AND j.unique_key = job.unique_key
               AND j.unique_key IS NOT NULL AND j.state IN ('pending', 'running', 'outcome_unknown')),
            quote_literal(job.unique_key)
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Wait for that job to finish, or cancel it first.';
    END;
    PERFORM pgq._admin_event(job, 'retried', 'pending');
    PERFORM pgq._notify(job.queue);
    RETURN true;
END
$$;
COMMENT ON FUNCTION pgq.retry(bigint) IS
    'Makes a failed or cancelled job pending again; 55000 for other states; P0002 when unknown.';

-- Settles an outcome_unknown job once the outside effect's fate is known: done (it happened),
-- failed or cancelled (give up), or pending (it did not happen: run it again).
CREATE OR REPLACE FUNCTION pgq.resolve(id bigint, state text)
    RETURNS boolean
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET lock_timeout = '5s'
    AS $$
DECLARE
    job pgq.jobs;
BEGIN
    IF resolve.state IS NULL THEN
        PERFORM pgq._bad_argument('state', 'must not be NULL');
    ELSIF resolve.state NOT IN ('done', 'failed', 'cancelled', 'pending') THEN
        PERFORM pgq._bad_argument('state',
            format('must be done, failed, cancelled or pending, got %s', left(quote_literal(resolve.state), 40)));
    END IF;
    job := pgq._admin_job(resolve.id);
    IF job.state <> 'outcome_unknown' THEN
        RAISE EXCEPTION 'pgq: job % is %, only outcome_unknown jobs can be resolved', resolve.id, job.state
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    IF resolve.state = 'pending'
       AND greatest(job.max_attempts, job.attempt + 1) - job.attempt_offset > pgq._attempt_room() THEN
        PERFORM pgq._no_attempt_room(resolve.id, 'resolve');
    END IF;
    UPDATE pgq.jobs AS j
    SET state = resolve.state::pgq.job_state,
        finished_at = CASE WHEN resolve.state = 'pending' THEN NULL ELSE pgq._now() END,
        run_at = CASE WHEN resolve.state = 'pending' THEN pgq._now() ELSE j.run_at END,
        max_attempts = CASE WHEN resolve.state = 'pending' THEN greatest(j.max_attempts, j.attempt + 1)
                            ELSE j.max_attempts END,
        last_event = 'resolved'
    WHERE j.id = resolve.id;
    PERFORM pgq._admin_event(job, 'resolved', resolve.state::pgq.job_state);
    IF resolve.state = 'pending' THEN
        PERFORM pgq._notify(job.queue);
    END IF;
    RETURN true;
END
$$;
COMMENT ON FUNCTION pgq.resolve(bigint, text) IS
    'Settles an outcome_unknown job as done, failed, cancelled or pending (run again).';

-- Deletes finished (done, failed, cancelled) jobs, with their events, older than older_than, or
-- than each queue's retention when older_than is NULL. At most max_jobs per call: call it again
-- until it returns 0. Then removes up to max_jobs tenants of fair queues that have no job left and
-- the default weight 1 (a weight set with pgq.set_tenant_weight is kept; a tenant removed comes
-- back with its next job, one round behind the busiest as after any idle time). A queue whose
-- writer lock an enqueue holds is left for the next call: its new job may be one of those tenants'.
CREATE OR REPLACE FUNCTION pgq.prune(older_than interval DEFAULT NULL, max_jobs integer DEFAULT 10000)
    RETURNS integer
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET lock_timeout = '5s'
    AS $$
DECLARE
    deleted integer;
    tenants_left integer;
    r record;
BEGIN
    -- Bounded like queues.retention: a huge interval would make now() - older_than leave the
    -- timestamp range and fail with an unrelated 22008.
    PERFORM pgq._check_span('older_than', prune.older_than);
    IF prune.older_than < interval '0' OR prune.older_than > interval '3650 days' THEN
        PERFORM pgq._bad_argument('older_than',
            format('must be between 0 and 3650 days, got %s', prune.older_than));
    END IF;
    IF prune.max_jobs IS NULL THEN
        PERFORM pgq._bad_argument('max_jobs', 'must not be NULL');
    ELSIF prune.max_jobs NOT BETWEEN 1 AND 1000000 THEN
        PERFORM pgq._bad_argument('max_jobs', format('must be between 1 and 1000000, got %s', prune.max_jobs));
    END IF;
    WITH doomed AS (
        SELECT j.id
        FROM pgq.jobs AS j JOIN pgq.queues AS q ON q.name = j.queue
        WHERE j.state IN ('done', 'failed', 'cancelled')
          AND j.finished_at < pgq._now() - coalesce(prune.older_than, q.retention)
        ORDER BY j.finished_at
        LIMIT prune.max_jobs
        FOR UPDATE OF j SKIP LOCKED
    ), gone AS (
        DELETE FROM pgq.jobs AS j USING doomed AS d WHERE j.id = d.id RETURNING j.id
    ), events AS (
        DELETE FROM pgq.job_events AS e USING gone AS g WHERE e.job_id = g.id
    )
    SELECT count(*) INTO deleted FROM gone;

    -- Idle tenants, queue by queue under the queue's writer lock, taken without waiting and held
    -- (a session lock) only while they are deleted: an enqueue that read a tenant's row before
    -- has committed its job (or holds the lock still, and the queue is skipped); one that comes
    -- after inserts the row again, waiting for this transaction's deletion to commit.
    tenants_left := prune.max_jobs;
    FOR r IN
        SELECT DISTINCT t.queue FROM pgq.tenants AS t
        WHERE t.weight = 1
          AND NOT EXISTS (SELECT FROM pgq.jobs AS j WHERE j.queue = t.queue AND j.tenant = t.tenant)
    LOOP
        EXIT WHEN tenants_left <= 0;
        CONTINUE WHEN NOT pg_try_advisory_lock(1885827329, hashtext(r.queue));
        BEGIN
            WITH gone AS (
                DELETE FROM pgq.tenants AS t
                WHERE (t.queue, t.tenant) IN (
                    SELECT x.queue, x.tenant FROM pgq.tenants AS x
                    WHERE x.queue = r.queue AND x.weight = 1
                      AND NOT EXISTS (SELECT FROM pgq.jobs AS j WHERE j.queue = x.queue AND j.tenant = x.tenant)
                    LIMIT tenants_left
                    FOR UPDATE SKIP LOCKED)
                RETURNING 1
            )
            SELECT tenants_left - count(*) INTO tenants_left FROM gone;
        EXCEPTION WHEN OTHERS THEN
            PERFORM pg_advisory_unlock(1885827329, hashtext(r.queue));
            RAISE;
        END;
        PERFORM pg_advisory_unlock(1885827329, hashtext(r.queue));
    END LOOP;
    RETURN deleted;
END
$$;
COMMENT ON FUNCTION pgq.prune(interval, integer) IS
    'Deletes up to max_jobs finished jobs (and their events) older than older_than or the queue''s retention.';

CREATE OR REPLACE FUNCTION pgq.configure_queue(queue text, lease interval DEFAULT NULL,
                                    max_attempts integer DEFAULT NULL,
                                    backoff_base interval DEFAULT NULL,
                                    backoff_cap interval DEFAULT NULL,
                                    retention interval DEFAULT NULL,
                                    notify boolean DEFAULT NULL, audit boolean DEFAULT NULL,
                                    fair boolean DEFAULT NULL, max_running integer DEFAULT NULL,
                                    max_run_time interval DEFAULT NULL)
    RETURNS pgq.queues
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET lock_timeout = '5s'
    AS $$
DECLARE
    q pgq.queues := pgq._queue(configure_queue.queue);
BEGIN
    q := pgq._lock_queue(configure_queue.queue);
    IF configure_queue.lease IS NOT NULL THEN
        PERFORM pgq._check_interval('lease', configure_queue.lease, interval '1 day');
    END IF;
    IF configure_queue.max_attempts NOT BETWEEN 1 AND 10000 THEN
        PERFORM pgq._bad_argument('max_attempts',
            format('must be between 1 and 10000, got %s', configure_queue.max_attempts));
    END IF;
    IF configure_queue.backoff_base IS NOT NULL THEN
        PERFORM pgq._check_interval('backoff_base', configure_queue.backoff_base, interval '365 days');
    END IF;
    IF configure_queue.backoff_cap IS NOT NULL THEN
        PERFORM pgq._check_interval('backoff_cap', configure_queue.backoff_cap, interval '365 days');
    END IF;
    IF coalesce(configure_queue.backoff_cap, q.backoff_cap)
       < coalesce(configure_queue.backoff_base, q.backoff_base) THEN
        PERFORM pgq._bad_argument('backoff_cap', 'must not be less than backoff_base');
    END IF;
    PERFORM pgq._check_span('retention', configure_queue.retention);
    IF configure_queue.retention < interval '0' OR configure_queue.retention > interval '3650 days' THEN
        PERFORM pgq._bad_argument('retention', 'must be between 0 and 3650 days');
    END IF;
    IF configure_queue.max_running NOT BETWEEN 0 AND 100000 THEN
        PERFORM pgq._bad_argument('max_running',
            format('must be between 0 (no cap) and 100000, got %s', configure_queue.max_running));
    END IF;
    PERFORM pgq._check_span('max_run_time', configure_queue.max_run_time);
    IF configure_queue.max_run_time < interval '0' OR configure_queue.max_run_time > interval '365 days' THEN
        PERFORM pgq._bad_argument('max_run_time',
            format('must be between 0 (no limit) and 365 days, got %s', configure_queue.max_run_time));
    END IF;
    IF configure_queue.fair AND NOT q.fair THEN
        -- Jobs already in the queue join fair mode: those without a tenant get the tenant '',
        -- and every tenant gets its row. (Switch a queue to fair mode before producers use it:
        -- an enqueue that read the queue's settings before this commits stores no tenant, and
        -- fair claims do not see such a job until it is given one.)
        UPDATE pgq.jobs AS j SET tenant = ''
        WHERE j.queue = configure_queue.queue AND j.tenant IS NULL AND j.state <> 'done';
        INSERT INTO pgq.tenants AS t (queue, tenant)
        SELECT DISTINCT j.queue, j.tenant FROM pgq.jobs AS j
        WHERE j.queue = configure_queue.queue AND j.tenant IS NOT NULL AND j.state <> 'done'
        ON CONFLICT DO NOTHING;
    END IF;
    UPDATE pgq.queues AS s
    SET lease = coalesce(configure_queue.lease, s.lease),
        max_attempts = coalesce(configure_queue.max_attempts, s.max_attempts),
        backoff_base = coalesce(configure_queue.backoff_base, s.backoff_base),
        backoff_cap = coalesce(configure_queue.backoff_cap, s.backoff_cap),
        retention = coalesce(configure_queue.retention, s.retention),
        notify = coalesce(configure_queue.notify, s.notify),
        audit = coalesce(configure_queue.audit, s.audit),
        fair = coalesce(configure_queue.fair, s.fair),
        max_running = coalesce(configure_queue.max_running, s.max_running),
        max_run_time = CASE WHEN configure_queue.max_run_time IS NULL THEN s.max_run_time
                            WHEN configure_queue.max_run_time = interval '0' THEN NULL
                            ELSE configure_queue.max_run_time END
    WHERE s.name = configure_queue.queue
    RETURNING * INTO q;
    RETURN q;
END
$$;
COMMENT ON FUNCTION pgq.configure_queue(text, interval, integer, interval, interval, interval, boolean, boolean, boolean, integer, interval) IS
    'Changes a queue''s settings (NULL leaves one unchanged; max_run_time ''0'' removes the limit) '
    'and returns them; creates the queue if new.';

-- Pausing or resuming a queue that does not exist is refused (22023): a typo creates nothing.
CREATE OR REPLACE FUNCTION pgq.pause(queue text)
    RETURNS pgq.queues
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET lock_timeout = '5s'
    AS $$
DECLARE
    q pgq.queues := pgq._existing_queue('queue', pause.queue);
BEGIN
    PERFORM pgq._lock_queue(pause.queue);
    UPDATE pgq.queues AS s SET paused = true WHERE s.name = pause.queue RETURNING * INTO q;
    RETURN q;
END
$$;
COMMENT ON FUNCTION pgq.pause(text) IS
    'Stops claims from the queue (running jobs go on); enqueue still works. Returns its settings; '
    '22023 when there is no such queue.';

CREATE OR REPLACE FUNCTION pgq.resume(queue text)
    RETURNS pgq.queues
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET lock_timeout = '5s'
    AS $$
DECLARE
    q pgq.queues := pgq._existing_queue('queue', resume.queue);
BEGIN
    PERFORM pgq._lock_queue(resume.queue);
    UPDATE pgq.queues AS s SET paused = false WHERE s.name = resume.queue RETURNING * INTO q;
    IF q.notify THEN
        PERFORM pg_notify('pgq', resume.queue);
    END IF;
    RETURN q;
END
$$;
COMMENT ON FUNCTION pgq.resume(text) IS 'Lets workers claim from the queue again. Returns its settings; 22023 when there is no such queue.';

-- Removes a queue that has nothing left in it: its settings row and its tenants. Refused with 55000
-- while the queue has jobs (of any state: cancel or finish the unfinished ones, pgq.prune the
-- finished ones) or schedules (pgq.unschedule them), and with 22023 when there is no such queue.
-- Race-free against enqueues: the queue's writer lock, taken exclusively and held to commit,
-- waits for the enqueues in flight (so their jobs are seen and refuse the drop), and an enqueue
-- that comes later waits for the drop, then creates the queue again with the defaults.
CREATE OR REPLACE FUNCTION pgq.drop_queue(queue text)
    RETURNS boolean
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET lock_timeout = '5s'
    AS $$
DECLARE
    q pgq.queues := pgq._existing_queue('queue', drop_queue.queue);
BEGIN
    BEGIN
        PERFORM pg_advisory_xact_lock(1885827329, hashtext(drop_queue.queue));
    EXCEPTION WHEN lock_not_available THEN
        RAISE EXCEPTION 'pgq: queue % is being written to by another session; gave up after lock_timeout %',
            drop_queue.queue, current_setting('lock_timeout')
            USING ERRCODE = 'lock_not_available',
                  HINT = 'A transaction that enqueued into it has not ended: end it, and try again.';
    END;
    q := pgq._lock_queue(drop_queue.queue, true);
    IF q.name IS NULL THEN
        PERFORM pgq._existing_queue('queue', drop_queue.queue);  -- dropped meanwhile: 22023
    END IF;
    IF EXISTS (SELECT FROM pgq.jobs AS j WHERE j.queue = drop_queue.queue AND j.state <> 'running')
       OR EXISTS (SELECT FROM pgq.jobs AS j WHERE j.lease_until IS NOT NULL AND j.queue = drop_queue.queue) THEN
        RAISE EXCEPTION 'pgq: queue % still has jobs; only a queue without jobs can be dropped', drop_queue.queue
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Cancel its unfinished jobs or let them finish, then remove the finished ones with '
                         'pgq.prune(older_than => ''0'').';
    END IF;
    IF EXISTS (SELECT FROM pgq.schedules AS x WHERE x.queue = drop_queue.queue) THEN
        RAISE EXCEPTION 'pgq: queue % still has schedules; only a queue without schedules can be dropped',
            drop_queue.queue
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'pgq.schedules() lists them; pgq.unschedule(name) removes one.';
    END IF;
    DELETE FROM pgq.tenants AS t WHERE t.queue = drop_queue.queue;
    DELETE FROM pgq.queues AS s WHERE s.name = drop_queue.queue;
    RETURN true;
END
$$;
COMMENT ON FUNCTION pgq.drop_queue(text) IS
    'Removes a queue without jobs or schedules (its settings and tenants); 55000 while it has any, '
    '22023 when there is no such queue.';

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
                               schedule.max_attempts, schedule.tenant);
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

-- Grants and revokes lock the queue's row like every admin call (at most 5 s, then 55P03).
CREATE OR REPLACE FUNCTION pgq._grant_target(queue text, role text, privilege text, dropped_ok boolean)
    RETURNS oid
    LANGUAGE plpgsql
    AS $$
DECLARE
    role_oid oid;
BEGIN
    PERFORM pgq._existing_queue('queue', _grant_target.queue);
    IF _grant_target.role IS NULL THEN
        PERFORM pgq._bad_argument('role', 'must not be NULL', 'Name a role: a group role the logins are members of, say.');
    END IF;
    SELECT r.oid INTO role_oid FROM pg_catalog.pg_roles AS r WHERE r.rolname = _grant_target.role;
    IF NOT FOUND AND _grant_target.dropped_ok AND _grant_target.role ~ '^[0-9]{1,10}$' THEN
        SELECT g.role INTO role_oid FROM pgq.grants AS g
        WHERE g.queue = _grant_target.queue AND g.role = _grant_target.role::bigint
          AND NOT EXISTS (SELECT FROM pg_catalog.pg_roles AS r WHERE r.oid = g.role)
        LIMIT 1;
    END IF;
    IF role_oid IS NULL THEN
        PERFORM pgq._bad_argument('role', format('names no role: %s', left(quote_literal(_grant_target.role), 80)),
            'Roles are cluster-wide: CREATE ROLE it first. PUBLIC is not a role here: a queue without '
            'grants is open to every holder of the pgq roles.');
    END IF;
    IF _grant_target.privilege IS NULL THEN
        PERFORM pgq._bad_argument('privilege', 'must not be NULL');
    ELSIF _grant_target.privilege NOT IN ('enqueue', 'claim', 'read') THEN
        PERFORM pgq._bad_argument('privilege',
            format('must be one of enqueue, claim, read, got %s', left(quote_literal(_grant_target.privilege), 40)));
    END IF;
    PERFORM pgq._lock_queue(_grant_target.queue);  -- at most lock_timeout (5 s), then 55P03
    RETURN role_oid;
END
$$;

-- Every admin call waits for a lock at most 5 s (see pgq._lock_queue).
ALTER FUNCTION pgq.cancel(bigint) SET lock_timeout = '5s';
ALTER FUNCTION pgq.set_tenant_weight(text, text, integer) SET lock_timeout = '5s';
ALTER FUNCTION pgq.unschedule(text) SET lock_timeout = '5s';

CREATE OR REPLACE FUNCTION pgq.version() RETURNS text
    LANGUAGE sql IMMUTABLE
    AS $$ SELECT '9'::text $$;

-- Grants ----------------------------------------------------------------------------------------------

REVOKE EXECUTE ON FUNCTION
    pgq._is_span(interval), pgq._check_span(text, interval), pgq._jsonb_size(jsonb),
    pgq._check_unique_key(text), pgq._attempt_room(), pgq._no_attempt_room(bigint, text),
    pgq._lock_queue(text, boolean), pgq._reject(bigint, integer, text, integer),
    pgq.drop_queue(text)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgq.drop_queue(text) TO pgq_admin;
