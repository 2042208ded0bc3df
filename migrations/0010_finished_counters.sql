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
-- pgq.sweep is 0004's with the fold added at its end.
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

-- Runs as the owner's UPDATE of pgq.jobs (every writer of jobs is a SECURITY DEFINER function of
-- the owner); no SET clause, so that the hot path pays no configuration switch per row: every name
-- is schema-qualified.
CREATE FUNCTION pgq._count_finished() RETURNS trigger
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
CREATE FUNCTION pgq._fold_finished() RETURNS bigint
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
CREATE FUNCTION pgq.metrics()
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

REVOKE ALL ON pgq.finished_counts, pgq.finished_deltas FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgq._count_finished(), pgq._fold_finished(), pgq.metrics() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pgq.metrics() TO pgq_monitor;

CREATE OR REPLACE FUNCTION pgq.version() RETURNS text
    LANGUAGE sql IMMUTABLE
    AS $$ SELECT '10'::text $$;
