-- sql/functions/counters.sql: the trigger of pgq.jobs and the finished counters it feeds.

-- Runs as the owner's UPDATE of pgq.jobs (every writer of jobs is a SECURITY DEFINER function of
-- the owner); no SET clause, so that the hot path pays no configuration switch per row: every name
-- is schema-qualified.
CREATE OR REPLACE FUNCTION pgq._count_finished() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    INSERT INTO pgq.finished_deltas (queue, state) VALUES (NEW.queue, NEW.state);
    -- A job that has dependants, or waits itself, moves its dependants on (pgq._dependency_ended).
    -- Here rather than in a trigger of its own: a second trigger's WHEN, evaluated by every claim
    -- and completion, cost a plain queue's complete about 8 us of about 60 (migration 0013's A/B).
    IF OLD.has_dependants OR OLD.state = 'waiting' THEN
        PERFORM pgq._dependency_ended(NEW.id, OLD.state, NEW.state, OLD.has_dependants);
    END IF;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION pgq._count_finished() IS
    'Trigger of pgq.jobs: records one transition into done, failed or cancelled in pgq.finished_deltas, '
    'and moves the dependants of a job that has them on (pgq._dependency_ended).';

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
