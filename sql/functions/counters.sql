-- sql/functions/counters.sql: the finished counters: what the end of a job records (the trigger
-- jobs_ended, sql/functions/ended.sql, writes pgq.finished_deltas) folded into pgq.finished_counts.

-- Moves the deltas into the totals, in one transaction (so a reader sees each finished job once,
-- in one table or the other). One fold at a time: each holds the row 'fold' of pgq.turns to its
-- commit, and a fold that finds it held skips (SKIP LOCKED: it would wait for the other's deleted
-- rows, and two folds' upserts could deadlock). The row is pgq's own, which only the owner can
-- lock (an advisory key, which it was, any login could hold, and every fold skipped). In a
-- read-only transaction (a standby, a read-only login) it skips too. Returns the deltas folded.
CREATE OR REPLACE FUNCTION pgq._fold_finished() RETURNS bigint
    LANGUAGE plpgsql
    SET search_path = pgq, pg_temp
    AS $$
DECLARE
    folded bigint;
BEGIN
    IF current_setting('transaction_read_only')::boolean THEN
        RETURN 0;
    END IF;
    IF NOT EXISTS (SELECT FROM pgq.turns AS t WHERE t.name = 'fold' FOR UPDATE SKIP LOCKED) THEN
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
