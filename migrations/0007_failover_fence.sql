-- pgq migration 0007: the failover fence. After a promotion, no attempt number the old primary
-- handed out is issued again.
--
-- With asynchronous replication a standby may be promoted without the old primary's last claims:
-- a job pending at attempt 0 here may have been claimed there as attempt 1, and a new claim here
-- issued attempt 1 again, so the old owner's pgq.complete(id, 1) was accepted on the new primary
-- (two live owners with one token). Now the first claim on a new timeline (detected from the
-- current WAL file's name) moves every unfinished job's next attempt past anything the old
-- primary could have issued, with no operator step; see pgq._check_timeline and docs/ha.md.
-- The backoff (pgq.fail, and a timed-out attempt in pgq._recover_expired) counts attempts
-- without the numbers a fence move skipped (attempt_offset).
-- pgq.claim is 0006's, pgq._recover_expired 0004's and pgq.fail 0001's, each with those changes.
-- sql/schema.sql holds the same definitions (tests/test_schema_matches_migrations.py).

ALTER TABLE pgq.jobs
    ADD COLUMN attempt_skip integer NOT NULL DEFAULT 0,
    ADD COLUMN attempt_offset integer NOT NULL DEFAULT 0;
COMMENT ON COLUMN pgq.jobs.attempt_skip IS
    'Attempt numbers the next claim skips: set when a promotion moved the job''s fence (pgq.fence).';
COMMENT ON COLUMN pgq.jobs.attempt_offset IS
    'Attempt numbers skipped by fence moves so far: attempt - attempt_offset is the number of attempts.';

-- The failover fence. An attempt number is a fencing token only if no server ever hands it out
-- twice. After a promotion, the new primary's jobs are a prefix of the old primary's history: with
-- asynchronous replication, attempts the old primary issued in its last moments (claims that never
-- reached the standby) are unknown here, and counting on from the attempt a job has here would
-- issue those numbers again, to a second live owner. So the first claim on a new timeline moves
-- every unfinished job's next attempt number past anything the old primary could have issued
-- (pgq._check_timeline); this table remembers the timeline the fences were last moved on.
CREATE TABLE pgq.fence (
    one          boolean     PRIMARY KEY DEFAULT true,
    timeline     integer     NOT NULL,
    moves        integer     NOT NULL DEFAULT 0,
    moved_at     timestamptz,
    jobs_moved   bigint      NOT NULL DEFAULT 0,
    CONSTRAINT fence_one_row CHECK (one)
);
COMMENT ON TABLE pgq.fence IS
    'One row: the WAL timeline on which the attempt fences were last checked and moved (see pgq.claim).';
INSERT INTO pgq.fence (timeline)
VALUES (('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::integer);
REVOKE ALL ON pgq.fence FROM PUBLIC;

-- The timeline this primary writes WAL on: the first 8 hex digits of its current WAL file's name.
-- It changes the moment a standby is promoted (or a backup is restored to a point in time);
-- pg_control_checkpoint()'s timeline only at the next checkpoint.
CREATE OR REPLACE FUNCTION pgq._timeline() RETURNS integer
    LANGUAGE sql VOLATILE
    AS $$ SELECT ('x' || left(pg_walfile_name(pg_current_wal_lsn()), 8))::bit(32)::integer $$;

-- How many attempt numbers a fence move skips per timeline: more than any one job can have been
-- given by a primary after its last WAL that reached the standby. Each attempt a primary hands
-- out costs at least two commits of the job's row (the claim and the outcome, ~0.5 kB of WAL
-- together), so 100000 attempts of one job are ~50 MB of WAL that never reached the standby;
-- Patroni refuses to promote a replica that lags more than maximum_lag_on_failover (1 MB by
-- default). With integer attempts, a job can be moved ~21000 times.
CREATE OR REPLACE FUNCTION pgq._fence_step() RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT 100000 $$;

-- The slow path of the fence check in pgq.claim, once per session: when the fences were last
-- moved on another timeline (this server was promoted, or restored), moves them now. In one
-- transaction that locks the fence row (so concurrent first claims take turns, and the later
-- ones find the work done), every job that is not done gets attempt_skip raised by
-- _fence_step() per timeline passed: its next claim issues attempt + 1 + attempt_skip, and
-- max_attempts rises by the same amount (the attempts left stay the same), so no number the
-- old primary handed out is issued again. A job running here keeps its attempt: this server's
-- record of it is the claim that handed that number out, once, to the owner that holds it.
-- Done jobs are final and never claimed again; failed and cancelled ones may be retried, so
-- they are moved too. Marks the session as checked (the setting pgq.fence, which a transaction
-- that rolls back also rolls back): a session never outlives a timeline change.
CREATE OR REPLACE FUNCTION pgq._check_timeline() RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    current_timeline integer;
    fenced pgq.fence;
    step bigint;
    moved bigint;
BEGIN
    IF pg_is_in_recovery() THEN
        RAISE EXCEPTION 'pgq: this server is a standby (in recovery): jobs are claimed on the primary'
            USING ERRCODE = 'read_only_sql_transaction',
                  HINT = 'Connect to the primary, e.g. with target_session_attrs=read-write in a multi-host DSN.';
    END IF;
    current_timeline := pgq._timeline();
    SELECT * INTO fenced FROM pgq.fence AS f;
    IF fenced.timeline IS DISTINCT FROM current_timeline THEN
        SELECT * INTO fenced FROM pgq.fence AS f FOR UPDATE;
        IF fenced.timeline IS DISTINCT FROM current_timeline THEN
            -- Timelines only grow along a server's history; a lower one (a dump restored into
            -- another cluster, say) still moves the fences once.
            step := pgq._fence_step()::bigint * greatest(1, current_timeline - fenced.timeline);
            WITH doomed AS (
                SELECT j.id FROM pgq.jobs AS j WHERE j.state <> 'done' ORDER BY j.id FOR NO KEY UPDATE
            ), skipped AS (
                UPDATE pgq.jobs AS j SET attempt_skip = j.attempt_skip + step
                FROM doomed AS d WHERE j.id = d.id
                RETURNING j.id, j.queue, j.attempt, j.state
            ), events AS (
                INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state, note)
                SELECT s.id, s.attempt, NULL, 'fenced', s.state, s.state,
                       format('timeline %s -> %s: the next claim skips %s attempt numbers',
                              fenced.timeline, current_timeline, step)
                FROM skipped AS s JOIN pgq.queues AS q ON q.name = s.queue AND q.audit
            )
            SELECT count(*) INTO moved FROM skipped;
            -- (An upsert: were the row ever deleted, the next session would otherwise move again.)
            INSERT INTO pgq.fence AS f (timeline, moves, moved_at, jobs_moved)
            VALUES (current_timeline, 1, now(), moved)
            ON CONFLICT (one) DO UPDATE
            SET timeline = excluded.timeline, moves = f.moves + 1, moved_at = excluded.moved_at,
                jobs_moved = excluded.jobs_moved;
            RAISE LOG 'pgq: timeline % -> %: fences of % unfinished jobs moved by % attempts',
                fenced.timeline, current_timeline, moved, step;
        END IF;
    END IF;
    PERFORM set_config('pgq.fence', current_timeline::text, false);
END
$$;
REVOKE EXECUTE ON FUNCTION pgq._timeline(), pgq._fence_step(), pgq._check_timeline() FROM PUBLIC;

CREATE OR REPLACE FUNCTION pgq._recover_expired(max_jobs integer)
    RETURNS TABLE (queue text, recovered bigint)
    LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan
    AS $$
BEGIN
    RETURN QUERY
    WITH expired AS (
        SELECT j.id, j.attempt
        FROM pgq.jobs AS j
        WHERE j.state = 'running' AND j.lease_until < pgq._now()
        ORDER BY j.lease_until
        LIMIT _recover_expired.max_jobs
        FOR NO KEY UPDATE SKIP LOCKED
    ), recovered AS (
        UPDATE pgq.jobs AS j
        SET state = CASE WHEN j.attempt >= j.max_attempts THEN 'failed' ELSE 'pending' END::pgq.job_state,
            lease_until = NULL,
            finished_at = CASE WHEN j.attempt >= j.max_attempts THEN pgq._now() END,
            run_at = CASE WHEN j.lease_until >= j.deadline AND j.attempt < j.max_attempts
                          THEN pgq._now() + pgq._backoff(j.attempt - j.attempt_offset, q.backoff_base, q.backoff_cap)
                          ELSE j.run_at END,
            last_event = CASE WHEN j.lease_until >= j.deadline THEN 'timed_out' ELSE 'lease_expired' END,
            last_error = CASE WHEN j.lease_until >= j.deadline
                              THEN format('timed out after %s', j.deadline - j.claimed_at)
                              ELSE format('lease expired at %s (attempt %s, worker %s)',
                                          j.lease_until, j.attempt, j.claimed_by) END
        FROM expired AS e, pgq.queues AS q
        WHERE j.id = e.id AND j.state = 'running' AND j.attempt = e.attempt AND q.name = j.queue
        RETURNING j.id, j.queue, j.attempt, j.claimed_by, j.state, j.last_event, j.last_error, q.audit
    ), events AS (
        INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state, note)
        SELECT r.id, r.attempt, r.claimed_by, r.last_event, 'running', r.state,
               CASE WHEN r.last_event = 'timed_out' THEN r.last_error ELSE 'recovered' END
        FROM recovered AS r
        WHERE r.audit
    )
    SELECT r.queue, count(*) FROM recovered AS r GROUP BY r.queue;
END
$$;

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

    -- The failover fence, checked once per session (a session never outlives a promotion).
    IF coalesce(current_setting('pgq.fence', true), '') = '' THEN
        PERFORM pgq._check_timeline();
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

CREATE OR REPLACE FUNCTION pgq.fail(id bigint, attempt integer, error text, retry_in interval DEFAULT NULL,
                         retryable boolean DEFAULT true)
    RETURNS text
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
DECLARE
    new_state pgq.job_state;
    stored_error text := left(fail.error, 65536);
BEGIN
    IF fail.id IS NULL OR fail.attempt IS NULL THEN  -- a plain expression: no query on the hot path
        PERFORM pgq._check_fence(fail.id, fail.attempt);
    END IF;
    IF fail.error IS NULL THEN
        PERFORM pgq._bad_argument('error', 'must not be NULL', 'Say why the attempt failed.');
    END IF;
    IF fail.retryable IS NULL THEN
        PERFORM pgq._bad_argument('retryable', 'must not be NULL');
    END IF;
    IF fail.retry_in IS NOT NULL THEN
        PERFORM pgq._check_interval('retry_in', fail.retry_in, interval '365 days');
    END IF;

    WITH failed AS (
        UPDATE pgq.jobs AS j
        SET state = CASE WHEN NOT fail.retryable OR j.attempt >= j.max_attempts
                         THEN 'failed' ELSE 'pending' END::pgq.job_state,
            run_at = CASE WHEN NOT fail.retryable OR j.attempt >= j.max_attempts THEN j.run_at
                          ELSE pgq._now() + coalesce(fail.retry_in,
                                   pgq._backoff(j.attempt - j.attempt_offset, q.backoff_base, q.backoff_cap)) END,
            finished_at = CASE WHEN NOT fail.retryable OR j.attempt >= j.max_attempts
                               THEN pgq._now() END,
            last_error = stored_error,
            last_event = 'failed',
            lease_until = NULL
        FROM pgq.queues AS q
        WHERE j.id = fail.id AND j.attempt = fail.attempt AND j.state = 'running'
          AND q.name = j.queue
        RETURNING j.id, j.attempt, j.claimed_by, j.state, q.audit
    ), events AS (
        INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state, note)
        SELECT f.id, f.attempt, f.claimed_by, 'failed', 'running', f.state, left(stored_error, 1000)
        FROM failed AS f WHERE f.audit
    )
    SELECT f.state INTO new_state FROM failed AS f;
    IF FOUND THEN
        RETURN new_state::text;
    END IF;
    -- Idempotent: this attempt already failed (a retry after an ambiguous commit).
    SELECT j.state INTO new_state FROM pgq.jobs AS j
    WHERE j.id = fail.id AND j.attempt = fail.attempt AND j.last_event = 'failed';
    IF FOUND THEN
        RETURN new_state::text;
    END IF;
    PERFORM pgq._reject(fail.id, fail.attempt, 'fail');
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION pgq.version() RETURNS text
    LANGUAGE sql IMMUTABLE
    AS $$ SELECT '7'::text $$;
