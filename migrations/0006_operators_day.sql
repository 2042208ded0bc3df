-- pgq migration 0006: the operator's day. Find jobs (pgq.list_jobs), route by kind (pgq.claim's
-- kinds: a worker claims only the kinds it can run), refuse typos (pgq.pause and pgq.resume of a
-- queue that does not exist), tell a worker about its queues (pgq.queue_status), and report due
-- jobs of a kind that no running worker claims (pgq.health's unclaimed_kind).

-- Indexes -------------------------------------------------------------------------------------------

-- A claim that names its kinds walks each (queue, kind)'s claimable jobs in the total order: jobs
-- of other kinds ahead of them are never read. Only pending jobs are in it (an enqueue, a retry
-- or a snooze writes an entry; a claim and a completion do not).
CREATE INDEX jobs_kind_ready_idx ON pgq.jobs (queue, kind, priority DESC, run_at, id)
    WHERE state = 'pending' AND attempt < max_attempts;

-- pgq.list_jobs pages newest first by id within each queue and state. Running jobs are not in it
-- (a claim writes no entry here; list_jobs reads the few running jobs through jobs_lease_idx).
-- The key is -id, not id: ordered by -id, a page can only come from this index, where ordered by
-- id the generic plan could walk jobs_pkey backwards and filter, reading every newer job of other
-- queues and states (all the finished history) to find a page of a rare one.
CREATE INDEX jobs_list_idx ON pgq.jobs (queue, state, (-id))
    WHERE state <> 'running';

-- Helpers -------------------------------------------------------------------------------------------

-- The settings row of a queue that must exist: 22023 naming the argument and the queue otherwise
-- (a typo must not create a queue, nor act on nothing).
CREATE FUNCTION pgq._existing_queue(argument text, name text) RETURNS pgq.queues
    LANGUAGE plpgsql
    AS $$
DECLARE
    q pgq.queues;
BEGIN
    SELECT * INTO q FROM pgq.queues AS s WHERE s.name = _existing_queue.name;
    IF NOT FOUND THEN
        PERFORM pgq._check_name(argument, name);
        PERFORM pgq._bad_argument(argument, format('names no queue: %s', quote_literal(name)),
            'A queue is created by its first job or by pgq.configure_queue; pgq.stats() lists them.');
    END IF;
    RETURN q;
END
$$;

-- Fair picks and claims by kind --------------------------------------------------------------------

DROP FUNCTION pgq.claim(text, text[], integer, interval);
DROP FUNCTION pgq._fair_pick(text, integer);

-- Fair mode's pick for one queue: up to `room` claimable jobs, locked FOR NO KEY UPDATE SKIP
-- LOCKED, chosen across the queue's tenants by weighted round-robin. Tenants with a due job are
-- ranked by virtual time (jobs started / weight); the k-th job of a tenant counts as finishing at
-- vtime + k/weight, and the earliest finishers win (ties: the total order). The winners' tenants
-- then advance their virtual time. A tenant that was idle restarts no further behind the busiest
-- one than one round, so it gets its share, not a burst. Tenant rows are locked in name order
-- only for that last update, so concurrent claimers never deadlock. With `kinds`, only jobs of
-- those kinds count (a filter within each tenant's jobs).
CREATE FUNCTION pgq._fair_pick(queue text, room integer, kinds text[] DEFAULT NULL) RETURNS SETOF bigint
    LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan
    AS $$
DECLARE
    busiest double precision;
    picked bigint[];
BEGIN
    SELECT max(t.vtime) INTO busiest
    FROM pgq.tenants AS t
    WHERE t.queue = _fair_pick.queue
      AND EXISTS (SELECT FROM pgq.jobs AS j
                  WHERE j.queue = t.queue AND j.tenant = t.tenant
                    AND j.state = 'pending' AND j.attempt < j.max_attempts AND j.tenant IS NOT NULL
                    AND j.run_at <= pgq._now()
                    AND (_fair_pick.kinds IS NULL OR j.kind = ANY (_fair_pick.kinds)));
    IF busiest IS NULL THEN
        RETURN;  -- no tenant has a claimable job
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
            ORDER BY greatest(t.vtime, busiest - 1), t.tenant
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

    PERFORM FROM pgq.tenants AS t
    WHERE t.queue = _fair_pick.queue
      AND t.tenant IN (SELECT j.tenant FROM pgq.jobs AS j WHERE j.id = ANY (picked))
    ORDER BY t.tenant
    FOR NO KEY UPDATE;
    UPDATE pgq.tenants AS t
    SET vtime = greatest(t.vtime, busiest - 1) + s.n::float8 / t.weight
    FROM (SELECT j.tenant, count(*) AS n FROM pgq.jobs AS j WHERE j.id = ANY (picked) GROUP BY j.tenant) AS s
    WHERE t.queue = _fair_pick.queue AND t.tenant = s.tenant;

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
-- Two queue settings change the pick: a queue with max_running > 0 is locked for the claim and
-- offers only its free slots (claimers of a capped queue take turns; no race can pass the cap),
-- and a fair queue's candidates come from pgq._fair_pick. Queues with neither pay nothing for them.
CREATE FUNCTION pgq.claim(worker text, queues text[] DEFAULT NULL, batch integer DEFAULT 1,
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
    -- skips that match). Only a bad name pays for the per-name check that names it.
    IF claim.queues IS NOT NULL AND NOT coalesce(
           array_to_string(claim.queues, ',')
               ~ '^[A-Za-z0-9_][A-Za-z0-9_.:/-]*(,[A-Za-z0-9_][A-Za-z0-9_.:/-]*)*$'
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
               AND (length(array_to_string(claim.kinds, ',')) <= 128
                    OR array_to_string(claim.kinds, ',') !~ '[^,]{129}'), false) THEN
            PERFORM pgq._check_name(format('kinds[%s]', k.n), k.name)
            FROM unnest(claim.kinds) WITH ORDINALITY AS k(name, n);
        END IF;
    END IF;

    -- One statement reads the eligible queues (and whether one of them has a schedule due: a
    -- column of the rows read anyway, and bool_or, which allocates nothing, unlike array_agg) and
    -- probes for expired leases (one index probe).
    SELECT array_agg(q.name ORDER BY q.name), array_agg(q.fair ORDER BY q.name),
           coalesce(bool_or(q.max_running > 0), false),
           EXISTS (SELECT FROM pgq.jobs AS j WHERE j.state = 'running' AND j.lease_until < pgq._now()),
           coalesce(bool_or(q.next_schedule_at <= pgq._now()), false)
    INTO names, fairs, capped, expired, due
    FROM pgq.queues AS q
    WHERE NOT q.paused AND (claim.queues IS NULL OR q.name = ANY (claim.queues));

    -- Expired leases are recovered first, so their jobs are claimable by this very claim.
    IF expired THEN
        PERFORM pgq._recover_expired(100);
    END IF;
    IF names IS NULL THEN
        RETURN;  -- no eligible queue
    END IF;
    IF due THEN
        due_queues := names;  -- before the capped queues' rooms narrow names down
    END IF;

    IF NOT capped THEN
        rooms := array_fill(claim.batch, ARRAY[cardinality(names)]);
    ELSE
        -- Capped queues are locked in name order (so claimers never deadlock) before their running
        -- jobs are counted by the next statement, whose fresh snapshot sees every earlier claim.
        -- (Under REPEATABLE READ or SERIALIZABLE that count would come from an older snapshot and
        -- could pass the cap: such a claim of a capped queue is refused.)
        PERFORM FROM pgq.queues AS q
        WHERE q.max_running > 0 AND NOT q.paused AND (claim.queues IS NULL OR q.name = ANY (claim.queues))
        ORDER BY q.name
        FOR NO KEY UPDATE;
        IF FOUND AND current_setting('transaction_isolation') <> 'read committed' THEN
            RAISE EXCEPTION 'pgq: a claim of a queue with max_running must run at READ COMMITTED, not %',
                upper(current_setting('transaction_isolation'))
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      HINT = 'Claim in autocommit mode, or in a READ COMMITTED transaction.';
        END IF;

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
            WHERE NOT q.paused AND (claim.queues IS NULL OR q.name = ANY (claim.queues))
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
            attempt = j.attempt + 1,
            lease_until = least(pgq._now() + coalesce(claim.lease, q.lease),
                                pgq._now() + coalesce(j.max_run_time, q.max_run_time)),
            deadline = pgq._now() + coalesce(j.max_run_time, q.max_run_time),
            claimed_by = claim.worker,
            claimed_at = pgq._now(),
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

-- Typos refused ------------------------------------------------------------------------------------

-- Pausing or resuming a queue that does not exist is refused (22023): a typo creates nothing.
CREATE OR REPLACE FUNCTION pgq.pause(queue text)
    RETURNS pgq.queues
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
DECLARE
    q pgq.queues := pgq._existing_queue('queue', pause.queue);
BEGIN
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
    AS $$
DECLARE
    q pgq.queues := pgq._existing_queue('queue', resume.queue);
BEGIN
    UPDATE pgq.queues AS s SET paused = false WHERE s.name = resume.queue RETURNING * INTO q;
    IF q.notify THEN
        PERFORM pg_notify('pgq', resume.queue);
    END IF;
    RETURN q;
END
$$;
COMMENT ON FUNCTION pgq.resume(text) IS 'Lets workers claim from the queue again. Returns its settings; 22023 when there is no such queue.';

-- Observe ------------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION pgq.health(max_snapshot_age interval DEFAULT '5 minutes',
                           max_ready_age interval DEFAULT '5 minutes')
    RETURNS TABLE (severity text, "check" text, detail text, hint text)
    LANGUAGE plpgsql STABLE
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
DECLARE
    r record;
    found_any boolean;
BEGIN
    PERFORM pgq._check_interval('max_snapshot_age', health.max_snapshot_age, interval '365 days');
    PERFORM pgq._check_interval('max_ready_age', health.max_ready_age, interval '365 days');

    -- 1. Expired leases not yet recovered: workers have died and nobody claims or sweeps.
    SELECT count(*) AS n, min(j.lease_until) AS oldest INTO r
    FROM pgq.jobs AS j WHERE j.state = 'running' AND j.lease_until < pgq._now();
    IF r.n = 0 THEN
        RETURN QUERY SELECT 'ok', 'expired_leases', 'no expired leases', NULL::text;
    ELSE
        RETURN QUERY SELECT
            CASE WHEN pgq._now() - r.oldest > health.max_ready_age THEN 'critical' ELSE 'warning' END,
            'expired_leases',
            format('%s running job(s) past their lease, the oldest expired %s ago', r.n,
                   date_trunc('second', pgq._now() - r.oldest)),
            'No worker is claiming or sweeping: run pgq.sweep() and check the workers.';
    END IF;

    -- 2. Oldest due job per unpaused queue: is the queue keeping up?
    found_any := false;
    FOR r IN
        SELECT q.name, pgq._now() - min(j.run_at) AS age, count(*) AS n
        FROM pgq.queues AS q JOIN pgq.jobs AS j ON j.queue = q.name
        WHERE NOT q.paused AND j.state = 'pending' AND j.attempt < j.max_attempts
          AND j.run_at <= pgq._now()
        GROUP BY q.name
        HAVING pgq._now() - min(j.run_at) > health.max_ready_age / 2
        ORDER BY q.name
    LOOP
        found_any := true;
        RETURN QUERY SELECT
            CASE WHEN r.age > health.max_ready_age THEN 'critical' ELSE 'warning' END,
            'ready_age',
            format('queue %s: the oldest of %s due job(s) has waited %s', r.name, r.n, date_trunc('second', r.age)),
            'Add workers or concurrency, or look for a stuck handler.';
    END LOOP;
    IF NOT found_any THEN
        RETURN QUERY SELECT 'ok', 'ready_age',
            format('no due job has waited more than %s', health.max_ready_age / 2), NULL::text;
    END IF;

    -- 2b. A kind whose due jobs wait much longer than the rest of its queue while workers claim
    -- the queue's other kinds: no running worker handles it (a Worker claims only the kinds it has
    -- handlers for). "Much longer": past half of max_ready_age, and ten times the oldest due job of
    -- the queue's other kinds; "workers claim": a job of another kind of the queue was claimed
    -- after this kind's oldest due job came due (running now, or finished since).
    found_any := false;
    FOR r IN
        WITH due AS (
            SELECT j.queue, j.kind, min(j.run_at) AS oldest, count(*) AS n
            FROM pgq.queues AS q JOIN pgq.jobs AS j ON j.queue = q.name
            WHERE NOT q.paused AND j.state = 'pending' AND j.attempt < j.max_attempts
              AND j.run_at <= pgq._now()
            GROUP BY j.queue, j.kind
        )
        SELECT d.queue, d.kind, d.n, pgq._now() - d.oldest AS age,
               coalesce((SELECT pgq._now() - min(o.oldest) FROM due AS o
                         WHERE o.queue = d.queue AND o.kind <> d.kind), interval '0') AS others
        FROM due AS d
        WHERE pgq._now() - d.oldest > health.max_ready_age / 2
          AND (EXISTS (SELECT FROM pgq.jobs AS w
                       WHERE w.lease_until IS NOT NULL AND w.queue = d.queue AND w.kind <> d.kind
                         AND w.claimed_at > d.oldest)
               OR EXISTS (SELECT FROM pgq.jobs AS w
                          WHERE w.state IN ('done', 'failed', 'cancelled') AND w.finished_at > d.oldest
                            AND w.queue = d.queue AND w.kind <> d.kind AND w.claimed_at > d.oldest))
        ORDER BY d.queue, d.kind
    LOOP
        CONTINUE WHEN r.age <= r.others * 10;
        found_any := true;
        RETURN QUERY SELECT
            CASE WHEN r.age > health.max_ready_age THEN 'critical' ELSE 'warning' END,
            'unclaimed_kind',
            format('queue %s: %s due job(s) of kind %s have waited up to %s while workers claim its other '
                   'kinds (whose due jobs waited at most %s)', r.queue, r.n, r.kind,
                   date_trunc('second', r.age), date_trunc('second', r.others)),
            'No running worker handles this kind: start one that does, or cancel these jobs.';
    END LOOP;
    IF NOT found_any THEN
        RETURN QUERY SELECT 'ok', 'unclaimed_kind', 'no kind waits much longer than the rest of its queue', NULL::text;
    END IF;

    -- 3. Jobs parked as outcome_unknown wait for a person.
    SELECT count(*) AS n, min(j.claimed_at) AS oldest INTO r
    FROM pgq.jobs AS j WHERE j.state = 'outcome_unknown';
    IF r.n = 0 THEN
        RETURN QUERY SELECT 'ok', 'outcome_unknown', 'no job waits for a decision', NULL::text;
    ELSE
        RETURN QUERY SELECT 'warning', 'outcome_unknown',
            format('%s job(s) in outcome_unknown, the oldest claimed %s ago', r.n,
                   date_trunc('second', pgq._now() - r.oldest)),
            'Find out what happened, then pgq.resolve(id, ''done'' | ''pending'' | ''failed'' | ''cancelled'').';
    END IF;

    -- 4. Sessions blocked by others (lock waits: a long transaction holding a job's row, say).
    found_any := false;
    FOR r IN
        SELECT a.pid, pg_blocking_pids(a.pid) AS blockers, clock_timestamp() - a.query_start AS waited,
               left(a.query, 80) AS query
        FROM pg_stat_activity AS a
        WHERE a.datname = current_database() AND cardinality(pg_blocking_pids(a.pid)) > 0
        ORDER BY a.query_start
    LOOP
        found_any := true;
        RETURN QUERY SELECT
            CASE WHEN r.waited > health.max_snapshot_age THEN 'critical' ELSE 'warning' END,
            'blocked_sessions',
            format('pid %s has waited %s for pid(s) %s: %s', r.pid, date_trunc('second', r.waited),
                   array_to_string(r.blockers, ', '), r.query),
            'Look at what the blocking session is doing (pg_stat_activity); end it if it is stuck.';
    END LOOP;
    IF NOT found_any THEN
        RETURN QUERY SELECT 'ok', 'blocked_sessions', 'no session waits for another', NULL::text;
    END IF;

    -- 5. Long transactions and idle-in-transaction sessions: their snapshot holds back vacuum of
    -- every table, pgq.jobs included, so dead rows pile up and claims slow down.
    found_any := false;
    FOR r IN
        SELECT a.pid, a.state, a.usename, clock_timestamp() - a.xact_start AS age,
               age(a.backend_xmin) AS xmin_age, left(a.query, 80) AS query
        FROM pg_stat_activity AS a
        -- Only this database's sessions hold back vacuum of its tables.
        WHERE a.datname = current_database() AND a.xact_start IS NOT NULL
          AND a.backend_xmin IS NOT NULL AND a.pid <> pg_backend_pid()
          AND clock_timestamp() - a.xact_start > health.max_snapshot_age / 2
        ORDER BY a.xact_start
    LOOP
        found_any := true;
        RETURN QUERY SELECT
            CASE WHEN r.age > health.max_snapshot_age THEN 'critical' ELSE 'warning' END,
            CASE WHEN r.state LIKE 'idle in transaction%' THEN 'idle_in_transaction' ELSE 'long_transaction' END,
            format('pid %s (%s, %s) has held a snapshot for %s (xmin age %s transactions): %s', r.pid,
                   r.usename, r.state, date_trunc('second', r.age), r.xmin_age, r.query),
            'It holds back vacuum: end it, and set idle_in_transaction_session_timeout / statement_timeout.';
    END LOOP;
    IF NOT found_any THEN
        RETURN QUERY SELECT 'ok', 'oldest_snapshot',
            format('no snapshot older than %s', health.max_snapshot_age / 2), NULL::text;
    END IF;

    -- 6. Dead tuples and vacuum of pgq's tables; index sizes, for the record.
    FOR r IN
        SELECT s.relname, s.n_live_tup, s.n_dead_tup, greatest(s.last_autovacuum, s.last_vacuum) AS vacuumed
        FROM pg_stat_user_tables AS s WHERE s.schemaname = 'pgq' ORDER BY s.relname
    LOOP
        RETURN QUERY SELECT
            CASE WHEN r.n_dead_tup > 10000 AND r.n_dead_tup > r.n_live_tup THEN 'warning' ELSE 'ok' END,
            'dead_tuples',
            format('pgq.%s: %s live, %s dead rows, last vacuumed %s', r.relname, r.n_live_tup, r.n_dead_tup,
                   coalesce(date_trunc('second', pgq._now() - r.vacuumed)::text || ' ago', 'never')),
            CASE WHEN r.n_dead_tup > 10000 AND r.n_dead_tup > r.n_live_tup
                 THEN 'Autovacuum is not keeping up: look for old snapshots (above) and vacuum settings.' END;
    END LOOP;
    RETURN QUERY
    SELECT 'ok', 'index_size',
           format('%s: %s', i.indexrelid::regclass, pg_size_pretty(pg_relation_size(i.indexrelid))), NULL::text
    FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indrelid
    WHERE c.relnamespace = 'pgq'::regnamespace
    ORDER BY i.indexrelid::regclass::text;
END
$$;
COMMENT ON FUNCTION pgq.health(interval, interval) IS
    'One row per finding (severity ok / warning / critical, check, detail, hint): expired leases, '
    'waiting jobs, kinds no worker claims, outcome_unknown jobs, blocked sessions, old snapshots, dead '
    'tuples, index sizes.';

-- Operators find jobs here: newest first (by id), keyset-paged (pass the last id of a page as
-- before_id for the next), filtered by queue, state and kind. A page reads at most limit_rows rows
-- per (queue, state) through jobs_list_idx (keyed by -id), and the running jobs through
-- jobs_lease_idx, however much finished history the table holds; kind is a filter within those
-- (a rare kind among many jobs of its queue and state reads past the others). An unknown queue or state
-- is refused (22023), like a malformed kind.
CREATE FUNCTION pgq.list_jobs(queue text DEFAULT NULL, state text DEFAULT NULL, kind text DEFAULT NULL,
                              limit_rows integer DEFAULT 50, before_id bigint DEFAULT NULL)
    RETURNS SETOF pgq.jobs
    LANGUAGE plpgsql STABLE
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET plan_cache_mode = force_generic_plan
    SET jit = off
    AS $$
DECLARE
    states pgq.job_state[] := enum_range(NULL::pgq.job_state);
    below  bigint := coalesce(list_jobs.before_id, 9223372036854775807);
BEGIN
    IF list_jobs.state IS NOT NULL THEN
        IF NOT list_jobs.state = ANY (states::text[]) THEN
            PERFORM pgq._bad_argument('state', format('must be one of %s, got %s',
                array_to_string(states, ', '), left(quote_literal(list_jobs.state), 40)));
        END IF;
        states := ARRAY[list_jobs.state::pgq.job_state];
    END IF;
    IF list_jobs.queue IS NOT NULL THEN
        PERFORM pgq._existing_queue('queue', list_jobs.queue);
    END IF;
    IF list_jobs.kind IS NOT NULL THEN
        PERFORM pgq._check_name('kind', list_jobs.kind);
    END IF;
    IF list_jobs.limit_rows IS NULL THEN
        PERFORM pgq._bad_argument('limit_rows', 'must not be NULL');
    ELSIF list_jobs.limit_rows NOT BETWEEN 1 AND 1000 THEN
        PERFORM pgq._bad_argument('limit_rows', format('must be between 1 and 1000, got %s', list_jobs.limit_rows));
    END IF;

    RETURN QUERY
    SELECT p.*
    FROM (
        SELECT c.*
        FROM pgq.queues AS q
        CROSS JOIN unnest(states) AS s(state)
        CROSS JOIN LATERAL (
            SELECT j.*
            FROM pgq.jobs AS j
            WHERE j.queue = q.name AND j.state = s.state AND j.state <> 'running' AND -j.id > -below
              AND (list_jobs.kind IS NULL OR j.kind = list_jobs.kind)
            ORDER BY -j.id
            LIMIT list_jobs.limit_rows
        ) AS c
        WHERE (list_jobs.queue IS NULL OR q.name = list_jobs.queue) AND s.state <> 'running'
        UNION ALL
        SELECT j.*
        FROM pgq.jobs AS j
        WHERE j.lease_until IS NOT NULL AND j.state = 'running' AND 'running' = ANY (states)
          AND j.id < below
          AND (list_jobs.queue IS NULL OR j.queue = list_jobs.queue)
          AND (list_jobs.kind IS NULL OR j.kind = list_jobs.kind)
    ) AS p
    ORDER BY p.id DESC
    LIMIT list_jobs.limit_rows;
END
$$;
COMMENT ON FUNCTION pgq.list_jobs(text, text, text, integer, bigint) IS
    'Jobs newest first (by id), filtered by queue, state and kind; at most limit_rows, all older than '
    'before_id when given (keyset paging).';

-- For a worker at start: whether each of its queues exists and is paused (a worker may not read
-- pgq.stats).
CREATE FUNCTION pgq.queue_status(queues text[])
    RETURNS TABLE (queue text, known boolean, paused boolean)
    LANGUAGE sql STABLE
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
    SELECT n.name, q.name IS NOT NULL, coalesce(q.paused, false)
    FROM unnest(queue_status.queues) WITH ORDINALITY AS n(name, i)
    LEFT JOIN pgq.queues AS q ON q.name = n.name
    ORDER BY n.i
$$;
COMMENT ON FUNCTION pgq.queue_status(text[]) IS
    'For each named queue, in order: whether it exists and whether it is paused.';

CREATE OR REPLACE FUNCTION pgq.version() RETURNS text
    LANGUAGE sql IMMUTABLE
    AS $$ SELECT '6'::text $$;
COMMENT ON FUNCTION pgq.version() IS
    'The version of the installed pgq schema: the number of the newest migration applied.';

REVOKE EXECUTE ON FUNCTION
    pgq._existing_queue(text, text),
    pgq._fair_pick(text, integer, text[]),
    pgq.claim(text, text[], integer, interval, text[]),
    pgq.list_jobs(text, text, text, integer, bigint),
    pgq.queue_status(text[])
    FROM PUBLIC;

GRANT EXECUTE ON FUNCTION pgq.claim(text, text[], integer, interval, text[]), pgq.queue_status(text[])
    TO pgq_worker;
GRANT EXECUTE ON FUNCTION pgq.list_jobs(text, text, text, integer, bigint), pgq.queue_status(text[])
    TO pgq_monitor;
