-- sql/functions/ended.sql: the end of a job, pgq's "a job ended" hub (the trigger jobs_ended, and
-- the completions' own record of their ends).
--
-- A job ends when its state moves into done, failed or cancelled, whichever call moves it
-- (pgq.complete, complete_many and complete_and_claim, fail, cancel and cancel_jobs, resolve, a
-- lease's expiry recovered by a claim or a sweep, a dependency's cascade, a batch's cancellation).
-- Every end sets off the same four things, in the ending transaction:
--
-- 1. The finished counters: one row of pgq.finished_deltas, which pgq._fold_finished folds into
--    pgq.finished_counts (counters.sql; read by pgq.stats and pgq.metrics, observe.sql).
-- 2. The jobs waiting for it (depends_on): released when it is done, cancelled (all_done) or
--    released (all_ended) when it failed or was cancelled, up to the transaction's budget, the
--    rest left to the backlog that every sweep works through (dependencies.sql:
--    pgq._dependency_ended). Whether any wait is looked up in a statement after the one that ends
--    it (a snapshot that sees the links committed before that end).
-- 3. Its batch, when it is a member: the end counted in one of the batch's shards, and, once the
--    batch is sealed and its last member has ended, the batch's one callback job enqueued
--    (batches.sql: pgq._batch_member_ended, pgq._finish_batch).
-- 4. A producer that awaits it (enqueued with notify_finished): NOTIFY pgq_finished, '<id>', and
--    pgq.job_result reads the outcome (observe.sql).
--
-- Two ways in, one for each kind of end:
--
-- * A completion (last_event 'completed': pgq.complete and pgq.complete_many, so complete_and_claim
--   too, owner.sql) records its own ends, the hot path of every worker: its UPDATE writes 1 for all
--   its rows in the same statement and looks up which of them jobs wait for, then one call of
--   pgq._completions_ended does 2, 3 and 4 for them, a statement each for the whole batch (none
--   for plain jobs). (A PL/pgSQL trigger call per completed job, its
--   INSERT and its probe, were about a fifth of the server's work for a job a worker completes.)
-- * Every other end runs the row trigger jobs_ended of pgq.jobs (AFTER UPDATE OF state, WHEN the
--   new state is one of the three and differs from the old, and the row is not a completion that
--   records its own end), which runs pgq._job_ended once per end. Those ends are a job at a time
--   or rare (a failure, a cancel, a recovery).
--
-- Which completions record their own ends, the trigger's WHEN (migration 0024) asks the row:
-- this source's pgq.complete and pgq.complete_many write their transaction's id into
-- jobs.ends_recorded_by in the UPDATE that ends the job. The previous release's completions do
-- not, and leave their ends to the trigger; a call of theirs that read its body just before this
-- source's install committed may run its UPDATE just after it, with the new catalog
-- (tests/sql/test_completion_ends.py holds one there), and the trigger still records it (the row's
-- ends_recorded_by is NULL, or an earlier transaction's). (Its pgq.complete_many counts its batch
-- members itself and marks them in pgq.turns: pgq._batch_counting_mark, which _job_ended still
-- honours.) No caller can write a job's row, and no session setting is read.
--
-- What an end needs comes from the row or from rows of pgq's own tables, never from a session
-- setting a caller can set to change it: an end inside a claim's or a sweep's recovery of expired
-- leases, which must wait for nobody, is the one whose last_event is lease_expired or timed_out
-- (recovery.sql writes nothing else). A call that moves a job to done with last_event 'completed'
-- must set the setting above and record the end itself (the counter row in its statement, then
-- pgq._completions_ended).

-- Whether an end in this statement may have a snapshot older than the statement (REPEATABLE READ
-- or SERIALIZABLE, a later statement of the transaction): it may then miss the links an enqueue
-- made meanwhile, so it goes to pgq._dependency_ended whether it saw any or not, which leaves a
-- check for each. A plain expression, about 0.2 us.
CREATE OR REPLACE FUNCTION pgq._older_snapshot() RETURNS boolean
    LANGUAGE sql STABLE
    AS $$ SELECT current_setting('transaction_isolation') <> 'read committed'
                 AND transaction_timestamp() <> statement_timestamp() $$;

-- What a completion's ends set off but the counters (2, 3 and 4 above), for the jobs `ids` that one
-- statement of pgq.complete or pgq.complete_many has just moved from running to done, in that
-- order: `waited` those of them that jobs wait for (the completing statement's probe of
-- job_dependencies' primary key, in its RETURNING, as the trigger's is in its statement),
-- `members` the batch of each that is a batch's member (once per member), `notified` those
-- enqueued with notify_finished. The completions call it only when one of these is not NULL or
-- pgq._older_snapshot(): a plain job's completion makes no call. Its statements see the ends (they
-- run after the completing statement); each does its part for all the jobs at once.
CREATE OR REPLACE FUNCTION pgq._completions_ended(ids bigint[], waited bigint[], members bigint[],
                                                  notified bigint[])
    RETURNS void
    LANGUAGE plpgsql
    SET enable_seqscan = off
    AS $$
BEGIN
    IF pgq._older_snapshot() THEN
        PERFORM pgq._dependency_ended(e.id, 'running', 'done', e.id = ANY (_completions_ended.waited), false)
        FROM unnest(_completions_ended.ids) WITH ORDINALITY AS e(id, n) ORDER BY e.n;
    ELSIF _completions_ended.waited IS NOT NULL THEN
        PERFORM pgq._dependency_ended(e.id, 'running', 'done', true, false)
        FROM unnest(_completions_ended.waited) WITH ORDINALITY AS e(id, n) ORDER BY e.n;
    END IF;
    IF _completions_ended.members IS NOT NULL THEN  -- one shard update per batch, not one per member
        PERFORM pgq._batch_member_ended(m.batch, 'done', m.n::integer)
        FROM (SELECT b.batch, count(*) AS n FROM unnest(_completions_ended.members) AS b(batch)
              GROUP BY b.batch ORDER BY b.batch) AS m;
    END IF;
    IF _completions_ended.notified IS NOT NULL THEN
        PERFORM pg_notify('pgq_finished', n.id::text)
        FROM unnest(_completions_ended.notified) WITH ORDINALITY AS n(id, k) ORDER BY n.k;
    END IF;
END
$$;
COMMENT ON FUNCTION pgq._completions_ended(bigint[], bigint[], bigint[], bigint[]) IS
    'What the ends of jobs a completion just moved to done set off besides the counters: their '
    'dependants moved on, their batches counted, pgq_finished notified (the trigger jobs_ended '
    'leaves completions to their calls).';

-- The trigger's function, for every end but a completion's.
--
-- Runs as the owner's UPDATE of pgq.jobs (every writer of jobs is a SECURITY DEFINER function of
-- the owner); every name is schema-qualified. Every such end runs it once: one statement records
-- the end and, in the same statement (an index probe in its RETURNING, about 1.3 us), looks up
-- whether jobs wait for this one; only then, or for a job that waited itself, is
-- pgq._dependency_ended called (issue 24: no flag on the row, which an enqueue would have to lock).
-- Its one SET clause (about 0.7 us per end) holds the probe to job_dependencies' primary key
-- whatever the statistics: the plan is cached per session, and a sequential scan chosen while the
-- table was small would read every link on every end once it is large. The isolation test, for an
-- end whose snapshot may be older than its statement, is a plain expression (about 0.2 us); a
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
    IF waited_for OR OLD.state = 'waiting' OR pgq._older_snapshot() THEN
        PERFORM pgq._dependency_ended(NEW.id, OLD.state, NEW.state, waited_for,
                                      NEW.last_event = 'dependency_ended');
    END IF;
    IF NEW.batch_id IS NOT NULL THEN  -- (a plain expression: the query below is for members only)
        IF NOT (NEW.state = 'done' AND NEW.last_event = 'completed'
                AND EXISTS (SELECT FROM pgq.turns AS t WHERE t.name = pgq._batch_counting_mark(pg_trigger_depth()))) THEN
            PERFORM pgq._batch_member_ended(NEW.batch_id, NEW.state, 1,  -- (a previous release's
                                            NEW.last_event IN ('lease_expired', 'timed_out'));  -- complete_many counts its own)
        END IF;
    END IF;
    IF NEW.notify_finished THEN
        PERFORM pg_notify('pgq_finished', NEW.id::text);
    END IF;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION pgq._job_ended() IS
    'Trigger of pgq.jobs (jobs_ended), pgq''s "a job ended" hub for every end but a completion''s: '
    'records one transition into done, failed or cancelled in pgq.finished_deltas, moves the jobs '
    'waiting for it on (pgq._dependency_ended), counts a batch member''s end (pgq._batch_member_ended) and notifies '
    'pgq_finished for a job enqueued with notify_finished.';
