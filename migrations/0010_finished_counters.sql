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

CREATE OR REPLACE FUNCTION pgq.version() RETURNS text
    LANGUAGE sql IMMUTABLE
    AS $$ SELECT '10'::text $$;
