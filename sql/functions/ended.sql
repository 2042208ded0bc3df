-- sql/functions/ended.sql: the end of a job, pgq's "a job ended" hub (the trigger jobs_ended).
--
-- A job ends when its state moves into done, failed or cancelled, whichever call moves it
-- (pgq.complete, complete_many and complete_and_claim, fail, cancel and cancel_jobs, resolve, a
-- lease's expiry recovered by a claim or a sweep, a dependency's cascade, a batch's cancellation).
-- The row trigger jobs_ended of pgq.jobs (AFTER UPDATE OF state, WHEN the new state is one of the
-- three and differs from the old) runs pgq._job_ended once per end, in the ending transaction, and
-- that is all an end sets off:
--
-- 1. The finished counters: one row of pgq.finished_deltas, which pgq._fold_finished folds into
--    pgq.finished_counts (counters.sql; read by pgq.stats and pgq.metrics, observe.sql).
-- 2. The jobs waiting for it (depends_on): released when it is done, cancelled (all_done) or
--    released (all_ended) when it failed or was cancelled, up to the transaction's budget, the
--    rest left to the backlog that every sweep works through (dependencies.sql:
--    pgq._dependency_ended). Whether any wait is looked up in the statement that writes 1.
-- 3. Its batch, when it is a member: the end counted in one of the batch's shards, and, once the
--    batch is sealed and its last member has ended, the batch's one callback job enqueued
--    (batches.sql: pgq._batch_member_ended, pgq._finish_batch).
-- 4. A producer that awaits it (enqueued with notify_finished): NOTIFY pgq_finished, '<id>', and
--    pgq.job_result reads the outcome (observe.sql).
--
-- What the end needs comes from the row or from rows of pgq's own tables, never from a session
-- setting (a caller can set those): an end inside a claim's or a sweep's recovery of expired
-- leases, which must wait for nobody, is the one whose last_event is lease_expired or timed_out
-- (recovery.sql writes nothing else); the members pgq.complete_many completes, which it counts
-- itself once per batch, are marked by its row of pgq.turns (pgq._batch_counting_mark).
--
-- Runs as the owner's UPDATE of pgq.jobs (every writer of jobs is a SECURITY DEFINER function of
-- the owner); every name is schema-qualified. Every end of a job runs it once, so it is the hot
-- path: one statement records the end and, in the same statement (an index probe in its RETURNING,
-- about 1.3 us), looks up whether jobs wait for this one; only then, or for a job that waited
-- itself, is pgq._dependency_ended called (issue 24: no flag on the row, which an enqueue would have
-- to lock). Its one SET clause (about 0.7 us per end) holds the probe to job_dependencies' primary
-- key whatever the statistics: the plan is cached per session, and a sequential scan chosen while
-- the table was small would read every link on every end once it is large. The isolation test, for
-- an end whose snapshot may be older than its statement, is a plain expression (about 0.2 us); a
-- batch member and a job someone awaits are two tests of the row for every other job.
CREATE OR REPLACE FUNCTION pgq._job_ended() RETURNS trigger
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
    IF NEW.batch_id IS NOT NULL THEN  -- (a plain expression: the query below is for members only)
        IF NOT (NEW.state = 'done' AND NEW.last_event = 'completed'
                AND EXISTS (SELECT FROM pgq.turns AS t WHERE t.name = pgq._batch_counting_mark(pg_trigger_depth()))) THEN
            PERFORM pgq._batch_member_ended(NEW.batch_id, NEW.state, 1,  -- (pgq.complete_many counts its own)
                                            NEW.last_event IN ('lease_expired', 'timed_out'));
        END IF;
    END IF;
    IF NEW.notify_finished THEN
        PERFORM pg_notify('pgq_finished', NEW.id::text);
    END IF;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION pgq._job_ended() IS
    'Trigger of pgq.jobs (jobs_ended), pgq''s "a job ended" hub: records one transition into done, '
    'failed or cancelled in pgq.finished_deltas, moves the jobs waiting for it on '
    '(pgq._dependency_ended), counts a batch member''s end (pgq._batch_member_ended) and notifies '
    'pgq_finished for a job enqueued with notify_finished.';
