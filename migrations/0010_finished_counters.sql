-- pgq migration 0010: counters of finished jobs, and pgq.metrics() for exporters (Prometheus).
--
-- A metrics scrape must not count all the finished history (pgq.stats() counts every stored done
-- row), and a finished counter must survive exporter restarts and pgq.prune. So every transition
-- into done, failed or cancelled writes one row into pgq.finished_deltas, in the transaction of
-- the transition (a row trigger on pgq.jobs: no owner function changes). That table is insert-only
-- for the completers, so concurrent completes never wait for each other on a counter row. A fold
-- (pgq._fold_finished, called by pgq.metrics() and pgq.sweep) moves the deltas into the per-queue
-- totals of pgq.finished_counts; a reader adds the deltas not folded yet, so a count is exact at
-- any moment, whether or not a fold ran.
-- The totals start from the finished rows present when this migration runs.
-- pgq.queue_settings() gives pgq_monitor (the dashboard) every queue's settings row.
-- pgq.sweep is 0004's with the fold added at its end; pgq.health is 0006's with two checks read
-- through jobs_list_idx: outcome_unknown per queue (it read every job: 100 ms with 1M finished
-- rows) and unclaimed_kind's finished jobs among the newest 1,000 of each finished state of the
-- queue (it read every job finished since the kind's oldest due job: up to the whole history).
-- pgq.jobs.meta: the producer's metadata (enqueue's and enqueue_many's new last argument, returned
-- by pgq.claim); pgq_thin carries the caller's trace context in it.
-- sql/schema.sql holds the same definitions (tests/test_schema_matches_migrations.py).

-- The seed counts the finished rows already there, once: the jobs table is locked against writes
-- from here to the end of the migration, so every transition is counted by the seed or by the
-- trigger, never by both.
LOCK TABLE pgq.jobs IN SHARE ROW EXCLUSIVE MODE;

CREATE TABLE pgq.finished_counts (
    queue  text          NOT NULL,
    state  pgq.job_state NOT NULL,
    total  bigint        NOT NULL,
    PRIMARY KEY (queue, state)
);
COMMENT ON TABLE pgq.finished_counts IS
    'Jobs that reached done, failed or cancelled, per queue and state: those stored when migration 0010 '
    'ran, and every transition since (pgq.prune does not lower them); pgq.finished_deltas holds '
    'the ones not folded in yet.';

CREATE TABLE pgq.finished_deltas (
    queue  text          NOT NULL,
    state  pgq.job_state NOT NULL
);
COMMENT ON TABLE pgq.finished_deltas IS
    'One row per transition into a terminal state, written by the trigger jobs_count_finished and '
    'folded into pgq.finished_counts (and deleted) by pgq._fold_finished.';
-- It has no key (an index would cost every completion); REPLICA IDENTITY FULL lets the fold delete
-- its rows where a publication FOR ALL TABLES includes it (a table without a replica identity
-- refuses deletes there).
ALTER TABLE pgq.finished_deltas REPLICA IDENTITY FULL;

-- Runs as the owner's UPDATE of pgq.jobs (every writer of jobs is a SECURITY DEFINER function of
-- the owner); no SET clause, so that the hot path pays no configuration switch per row: every name
-- is schema-qualified.
CREATE OR REPLACE FUNCTION pgq._count_finished() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    INSERT INTO pgq.finished_deltas (queue, state) VALUES (NEW.queue, NEW.state);
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION pgq._count_finished() IS
    'Trigger of pgq.jobs: records one transition into done, failed or cancelled in pgq.finished_deltas.';

CREATE TRIGGER jobs_count_finished
    AFTER UPDATE OF state ON pgq.jobs
    FOR EACH ROW
    WHEN (NEW.state IN ('done', 'failed', 'cancelled') AND OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION pgq._count_finished();

INSERT INTO pgq.finished_counts (queue, state, total)
SELECT j.queue, j.state, count(*) FROM pgq.jobs AS j
WHERE j.state IN ('done', 'failed', 'cancelled')
GROUP BY j.queue, j.state;

-- Moves the deltas into the totals, in one transaction (so a reader sees each finished job once,
-- in one table or the other). One fold at a time: a fold that finds another one running skips
-- (it would wait for the other's deleted rows, and two folds' upserts could deadlock); in a
-- read-only transaction (a standby, a read-only login) it skips too. Returns the deltas folded.
CREATE OR REPLACE FUNCTION pgq._fold_finished() RETURNS bigint
    LANGUAGE plpgsql
    SET search_path = pgq, pg_temp
    AS $$
DECLARE
    folded bigint;
BEGIN
    IF current_setting('transaction_read_only')::boolean
       OR NOT pg_try_advisory_xact_lock('pgq.finished_counts'::regclass::oid::integer, 0) THEN
        RETURN 0;
    END IF;
    -- All of them, by one sequential scan. (A fold bounded by ctid = ANY (ARRAY(SELECT ctid ...
    -- LIMIT n)) ran its cached plan, made while the table was empty, as a filter of a sequential
    -- scan: n x n comparisons, half a second for 10,000 rows. Sweeps and scrapes fold every few
    -- seconds, so the backlog is what finished since the last one.)
    WITH gone AS (
        DELETE FROM pgq.finished_deltas RETURNING queue, state
    ), sums AS (
        SELECT g.queue, g.state, count(*) AS n FROM gone AS g GROUP BY g.queue, g.state
    ), added AS (
        INSERT INTO pgq.finished_counts AS c (queue, state, total)
        SELECT s.queue, s.state, s.n FROM sums AS s ORDER BY s.queue, s.state
        ON CONFLICT (queue, state) DO UPDATE SET total = c.total + excluded.total
    )
    SELECT coalesce(sum(s.n), 0) INTO folded FROM sums AS s;
    RETURN folded;
END
$$;
COMMENT ON FUNCTION pgq._fold_finished() IS
    'Folds pgq.finished_deltas into pgq.finished_counts; skips (returns 0) while another fold runs '
    'or in a read-only transaction.';

-- What an exporter scrapes, one row per queue, at a bounded cost: the claimable pending jobs
-- through jobs_ready_idx, outcome_unknown through jobs_list_idx, the running ones through
-- jobs_lease_idx (all of them: as many as the workers run), the finished counters from
-- pgq.finished_counts plus the deltas not folded yet (folded first, when it can). No finished row
-- of pgq.jobs is read.
CREATE OR REPLACE FUNCTION pgq.metrics()
    RETURNS TABLE (queue text, paused boolean, pending bigint, scheduled bigint, running bigint,
                   expired bigint, outcome_unknown bigint, oldest_ready_age interval,
                   done_total bigint, failed_total bigint, cancelled_total bigint)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
BEGIN
    PERFORM pgq._fold_finished();
    RETURN QUERY
    WITH leased AS (
        SELECT j.queue, count(*) AS running, count(*) FILTER (WHERE j.lease_until < pgq._now()) AS expired
        FROM pgq.jobs AS j
        WHERE j.lease_until IS NOT NULL
        GROUP BY j.queue
    ), finished AS (
        SELECT f.queue,
               sum(f.n) FILTER (WHERE f.state = 'done') AS done,
               sum(f.n) FILTER (WHERE f.state = 'failed') AS failed,
               sum(f.n) FILTER (WHERE f.state = 'cancelled') AS cancelled
        FROM (SELECT c.queue, c.state, c.total AS n FROM pgq.finished_counts AS c
              UNION ALL
              SELECT d.queue, d.state, count(*) FROM pgq.finished_deltas AS d GROUP BY d.queue, d.state) AS f
        GROUP BY f.queue
    )
    SELECT q.name, q.paused, p.due, p.later, coalesce(l.running, 0), coalesce(l.expired, 0), u.n,
           pgq._now() - p.oldest,
           coalesce(f.done, 0)::bigint, coalesce(f.failed, 0)::bigint, coalesce(f.cancelled, 0)::bigint
    FROM pgq.queues AS q
    CROSS JOIN LATERAL (
        SELECT count(*) FILTER (WHERE j.run_at <= pgq._now()) AS due,
               count(*) FILTER (WHERE j.run_at > pgq._now()) AS later,
               min(j.run_at) FILTER (WHERE j.run_at <= pgq._now()) AS oldest
        FROM pgq.jobs AS j
        WHERE j.queue = q.name AND j.state = 'pending' AND j.attempt < j.max_attempts) AS p
    CROSS JOIN LATERAL (
        SELECT count(*) AS n FROM pgq.jobs AS j WHERE j.queue = q.name AND j.state = 'outcome_unknown') AS u
    LEFT JOIN leased AS l ON l.queue = q.name
    LEFT JOIN finished AS f ON f.queue = q.name
    ORDER BY q.name;
END
$$;
COMMENT ON FUNCTION pgq.metrics() IS
    'One row per queue for exporters, without reading finished jobs: pending (due now) and scheduled '
    'jobs, running, expired leases, outcome_unknown, the oldest due job''s age, and the jobs finished '
    'as done, failed and cancelled (counters, from the finished rows stored at migration 0010 on: '
    'pgq.prune does not lower them).';

CREATE OR REPLACE FUNCTION pgq.sweep(max_jobs integer DEFAULT 1000)
    RETURNS integer
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET jit = off
    AS $$
DECLARE
    total integer := 0;
    r record;
BEGIN
    IF sweep.max_jobs IS NULL THEN
        PERFORM pgq._bad_argument('max_jobs', 'must not be NULL');
    ELSIF sweep.max_jobs NOT BETWEEN 1 AND 100000 THEN
        PERFORM pgq._bad_argument('max_jobs', format('must be between 1 and 100000, got %s', sweep.max_jobs));
    END IF;
    FOR r IN SELECT x.queue, x.recovered FROM pgq._recover_expired(sweep.max_jobs) AS x LOOP
        total := total + r.recovered;
        IF (SELECT q.notify FROM pgq.queues AS q WHERE q.name = r.queue) THEN
            PERFORM pg_notify('pgq', r.queue);
        END IF;
    END LOOP;
    IF EXISTS (SELECT FROM pgq.schedules AS s WHERE s.enabled AND s.next_run_at <= pgq._now()) THEN
        PERFORM pgq._fire_schedules(sweep.max_jobs);
    END IF;
    -- Keeps pgq.finished_deltas short where no exporter calls pgq.metrics().
    PERFORM pgq._fold_finished();
    RETURN total;
END
$$;

-- 0006's health, with its outcome_unknown check read per queue (it read every job), and the
-- unclaimed_kind check's finished jobs read among the newest of the queue (it read every job
-- finished since the oldest due job of the kind).
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
          -- The finished jobs are looked for among the newest 1,000 of each finished state of the
          -- queue (jobs_list_idx): a bounded read, where all jobs finished since d.oldest could be
          -- the whole history of a queue stuck for hours (a job claimed after d.oldest finished
          -- after it).
          AND (EXISTS (SELECT FROM pgq.jobs AS w
                       WHERE w.lease_until IS NOT NULL AND w.queue = d.queue AND w.kind <> d.kind
                         AND w.claimed_at > d.oldest)
               OR EXISTS (SELECT FROM (SELECT w.kind, w.claimed_at FROM pgq.jobs AS w
                                       WHERE w.queue = d.queue AND w.state = 'done' ORDER BY -w.id LIMIT 1000) AS w
                          WHERE w.kind <> d.kind AND w.claimed_at > d.oldest)
               OR EXISTS (SELECT FROM (SELECT w.kind, w.claimed_at FROM pgq.jobs AS w
                                       WHERE w.queue = d.queue AND w.state = 'failed' ORDER BY -w.id LIMIT 1000) AS w
                          WHERE w.kind <> d.kind AND w.claimed_at > d.oldest)
               OR EXISTS (SELECT FROM (SELECT w.kind, w.claimed_at FROM pgq.jobs AS w
                                       WHERE w.queue = d.queue AND w.state = 'cancelled' ORDER BY -w.id LIMIT 1000) AS w
                          WHERE w.kind <> d.kind AND w.claimed_at > d.oldest))
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
    -- Per queue, through jobs_list_idx: a count over all jobs would read the finished history.
    SELECT coalesce(sum(u.n), 0) AS n, min(u.oldest) AS oldest INTO r
    FROM pgq.queues AS q
    CROSS JOIN LATERAL (SELECT count(*) AS n, min(j.claimed_at) AS oldest FROM pgq.jobs AS j
                        WHERE j.queue = q.name AND j.state = 'outcome_unknown') AS u;
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
        SELECT a.pid, a.usename, pg_blocking_pids(a.pid) AS blockers,
               clock_timestamp() - a.query_start AS waited,
               CASE WHEN pgq._may_see_query(a.usesysid) THEN left(a.query, 80)
                    ELSE '(query not shown: another role''s session)' END AS query
        FROM pg_stat_activity AS a
        WHERE a.datname = current_database() AND cardinality(pg_blocking_pids(a.pid)) > 0
        ORDER BY a.query_start
    LOOP
        found_any := true;
        RETURN QUERY SELECT
            CASE WHEN r.waited > health.max_snapshot_age THEN 'critical' ELSE 'warning' END,
            'blocked_sessions',
            format('pid %s has waited %s for pid(s) %s (role %s): %s', r.pid, date_trunc('second', r.waited),
                   array_to_string(r.blockers, ', '), r.usename, r.query),
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
               age(a.backend_xmin) AS xmin_age,
               CASE WHEN pgq._may_see_query(a.usesysid) THEN left(a.query, 80)
                    ELSE '(query not shown: another role''s session)' END AS query
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
REVOKE ALL ON pgq.finished_counts, pgq.finished_deltas FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgq._count_finished(), pgq._fold_finished(), pgq.metrics() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgq.metrics() TO pgq_monitor;

-- For the dashboard's overview: the queues' settings, for pgq_monitor.
-- Every queue's settings (or one queue's: 22023 when there is no such queue), for dashboards and
-- operators: what pgq.configure_queue set, whether it is paused, and which privileges have
-- per-queue grants (restricted). A row of pgq.queues, so a setting a later migration adds is in
-- it too.
CREATE FUNCTION pgq.queue_settings(queue text DEFAULT NULL)
    RETURNS SETOF pgq.queues
    LANGUAGE sql STABLE
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
    SELECT pgq._existing_queue('queue', queue_settings.queue) WHERE queue_settings.queue IS NOT NULL;
    SELECT q.* FROM pgq.queues AS q
    WHERE queue_settings.queue IS NULL OR q.name = queue_settings.queue
    ORDER BY q.name;
$$;
COMMENT ON FUNCTION pgq.queue_settings(text) IS
    'The settings of every queue (or of one): a row of pgq.queues each, by name.';
REVOKE EXECUTE ON FUNCTION pgq.queue_settings(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgq.queue_settings(text) TO pgq_monitor;

-- The producer's metadata (as River's metadata, Oban's meta): pgq.jobs.meta, a JSON object or
-- NULL, set by enqueue's and enqueue_many's last argument (checked as a payload is: 22023 naming
-- meta), kept across retries and returned by pgq.claim. pgq_thin's client stores the caller's W3C
-- trace context under meta->'otel', and its worker links each attempt's span to it. A job without
-- meta costs enqueue one NULL test and claim one more column.
ALTER TABLE pgq.jobs ADD COLUMN meta jsonb;
COMMENT ON COLUMN pgq.jobs.meta IS
    'The producer''s metadata (enqueue''s meta; NULL: none): a JSON object kept across retries and '
    'handed to every attempt by pgq.claim. pgq_thin puts the W3C trace context under "otel".';
ALTER TYPE pgq.claimed_job ADD ATTRIBUTE meta jsonb;
COMMENT ON TYPE pgq.claimed_job IS
    'What pgq.claim hands a worker: the job, its fencing token (attempt), the checkpoint an '
    'earlier attempt recorded (progress), the attempt''s deadline (NULL: no limit) and the '
    'producer''s metadata (meta).';

DROP FUNCTION pgq.enqueue(text, text, jsonb, timestamptz, integer, integer, text, text, interval);
DROP FUNCTION pgq.enqueue_many(text, text, jsonb[], timestamptz, integer, integer, text, interval);

CREATE FUNCTION pgq.enqueue(queue text, kind text, payload jsonb DEFAULT '{}',
                            run_at timestamptz DEFAULT now(), priority integer DEFAULT 0,
                            max_attempts integer DEFAULT NULL, unique_key text DEFAULT NULL,
                            tenant text DEFAULT NULL, max_run_time interval DEFAULT NULL,
                            meta jsonb DEFAULT NULL)
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
                                 AND pgq._is_span(enqueue.max_run_time), true)
                    AND (enqueue.meta IS NULL OR jsonb_typeof(enqueue.meta) = 'object'
                         AND pgq._jsonb_size(enqueue.meta) <= 1048576), false) THEN
        PERFORM pgq._check_enqueue(enqueue.queue, enqueue.kind, enqueue.run_at, enqueue.priority,
                                   enqueue.max_attempts, enqueue.tenant);
        PERFORM pgq._check_payload('payload', enqueue.payload);
        PERFORM pgq._check_unique_key(enqueue.unique_key);
        IF enqueue.max_run_time IS NOT NULL THEN
            PERFORM pgq._check_interval('max_run_time', enqueue.max_run_time, interval '365 days');
        END IF;
        IF enqueue.meta IS NOT NULL THEN
            PERFORM pgq._check_payload('meta', enqueue.meta);
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
                                   max_run_time, meta)
        VALUES (enqueue.queue, enqueue.kind, enqueue.payload, enqueue.priority, enqueue.run_at,
                coalesce(enqueue.max_attempts, q.max_attempts), job_tenant, enqueue.max_run_time,
                enqueue.meta)
        RETURNING j.id INTO new_id;
    ELSE
        LOOP
            INSERT INTO pgq.jobs AS j (queue, kind, payload, priority, run_at, max_attempts,
                                       unique_key, tenant, max_run_time, meta)
            VALUES (enqueue.queue, enqueue.kind, enqueue.payload, enqueue.priority, enqueue.run_at,
                    coalesce(enqueue.max_attempts, q.max_attempts), enqueue.unique_key, job_tenant,
                    enqueue.max_run_time, enqueue.meta)
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
COMMENT ON FUNCTION pgq.enqueue(text, text, jsonb, timestamptz, integer, integer, text, text, interval, jsonb) IS
    'Adds one job and returns its id; with unique_key, returns the id of the live job that holds it. '
    'meta: a JSON object (or NULL) kept with the job and returned by pgq.claim.';

CREATE FUNCTION pgq.enqueue_many(queue text, kind text, payloads jsonb[],
                                 run_at timestamptz DEFAULT now(), priority integer DEFAULT 0,
                                 max_attempts integer DEFAULT NULL, tenant text DEFAULT NULL,
                                 max_run_time interval DEFAULT NULL, meta jsonb DEFAULT NULL)
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
    IF enqueue_many.meta IS NOT NULL THEN
        PERFORM pgq._check_payload('meta', enqueue_many.meta);
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
        INSERT INTO pgq.jobs (queue, kind, payload, priority, run_at, max_attempts, tenant, max_run_time,
                              meta)
        SELECT enqueue_many.queue, enqueue_many.kind, p.value, enqueue_many.priority,
               enqueue_many.run_at, coalesce(enqueue_many.max_attempts, q.max_attempts),
               job_tenant, enqueue_many.max_run_time, enqueue_many.meta
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
COMMENT ON FUNCTION pgq.enqueue_many(text, text, jsonb[], timestamptz, integer, integer, text, interval, jsonb) IS
    'Adds one job per payload in one INSERT and returns their ids in payload order; each job '
    'gets the same meta.';
REVOKE EXECUTE ON FUNCTION
    pgq.enqueue(text, text, jsonb, timestamptz, integer, integer, text, text, interval, jsonb),
    pgq.enqueue_many(text, text, jsonb[], timestamptz, integer, integer, text, interval, jsonb)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    pgq.enqueue(text, text, jsonb, timestamptz, integer, integer, text, text, interval, jsonb),
    pgq.enqueue_many(text, text, jsonb[], timestamptz, integer, integer, text, interval, jsonb)
    TO pgq_producer;

-- pgq.claim is 0009's with meta in what it returns.
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
                  j.run_at, j.created_at, j.lease_until, j.tenant, j.progress, j.deadline, j.meta,
                  q.audit
    ), events AS (
        INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state)
        SELECT c.id, c.attempt, claim.worker, 'claimed', 'pending', 'running'
        FROM claimed AS c WHERE c.audit
    )
    SELECT c.id, c.queue, c.kind, c.payload, c.priority, c.attempt, c.max_attempts,
           c.run_at, c.created_at, c.lease_until, c.tenant, c.progress, c.deadline, c.meta
    FROM claimed AS c
    ORDER BY c.priority DESC, c.run_at, c.id;
END
$$;


CREATE OR REPLACE FUNCTION pgq.version() RETURNS text
    LANGUAGE sql IMMUTABLE
    AS $$ SELECT '10'::text $$;
