-- sql/functions/counters.sql: the trigger of pgq.jobs and the finished counters it feeds.

-- Runs as the owner's UPDATE of pgq.jobs (every writer of jobs is a SECURITY DEFINER function of
-- the owner); every name is schema-qualified. Every end of a job runs it once, so it is the hot
-- path: one statement records the end and, in the same statement (an index probe in its RETURNING,
-- about 1.3 us), looks up whether jobs wait for this one; only then, or for a job that waited
-- itself, is pgq._dependency_ended called (issue 24: no flag on the row, which an enqueue would have
-- to lock). Its one SET clause (about 0.7 us per end) holds the probe to job_dependencies' primary
-- key whatever the statistics: the plan is cached per session, and a sequential scan chosen while
-- the table was small would read every link on every end once it is large. The isolation test, for
-- an end whose snapshot may be older than its statement, is a plain expression (about 0.2 us).
CREATE OR REPLACE FUNCTION pgq._count_finished() RETURNS trigger
    LANGUAGE plpgsql
    SET enable_seqscan = off
    AS $$
DECLARE
    waited_for boolean;
BEGIN
    INSERT INTO pgq.finished_deltas (queue, state) VALUES (NEW.queue, NEW.state)
    RETURNING EXISTS (SELECT FROM pgq.job_dependencies AS d WHERE d.depends_on = NEW.id) INTO waited_for;
    IF waited_for OR OLD.state = 'waiting'
       OR (current_setting('transaction_isolation') <> 'read committed'
           AND transaction_timestamp() <> statement_timestamp()) THEN
        PERFORM pgq._dependency_ended(NEW.id, OLD.state, NEW.state, waited_for,
                                      NEW.last_event = 'dependency_ended');
    END IF;
    -- A batch's member (pgq._batch_member_ended), a job someone awaits (pgq.job_result): two
    -- tests of the row for every other job.
    IF NEW.batch_id IS NOT NULL
       AND NOT (NEW.state = 'done' AND current_setting('pgq.batch_counting', true) IS NOT DISTINCT FROM 'caller') THEN
        PERFORM pgq._batch_member_ended(NEW.batch_id, NEW.state);  -- (pgq.complete_many counts its own)
    END IF;
    IF NEW.notify_finished THEN
        PERFORM pg_notify('pgq_finished', NEW.id::text);
    END IF;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION pgq._count_finished() IS
    'Trigger of pgq.jobs: records one transition into done, failed or cancelled in pgq.finished_deltas, '
    'moves the jobs waiting for it on (pgq._dependency_ended), counts a batch member''s end and '
    'notifies pgq_finished for a job enqueued with notify_finished.';

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
