-- sql/functions/workflows.sql: a job's children (pgq.spawn), awaited without holding a worker's slot
-- (pgq.await_jobs, pgq.job_outcomes), the tree they make (jobs.workflow_id, pgq.cancel_workflow), a
-- job's lifetime (enqueue's start_by and max_lifetime: pgq._expire_jobs), and the durable part of
-- every sweep and settle (pgq._settle_durable).
--
-- * A spawn is a step (pgq.steps, with child_id): the first call of a name enqueues the child (as
--   pgq.enqueue would, for the caller's login: its queue's enqueue grants apply) and records it; a
--   later call answers the same id. Children carry the root of the tree (workflow_id: the spawning
--   job's, or the spawning job itself when it is the root) and their parent (parent_id).
-- * await_jobs parks the job (state waiting, its attempt ended without using one up) as a
--   dependant of the listed jobs not ended yet, all_ended: the dependencies' machinery
--   (dependencies.sql) makes it pending once each has ended, however, in the end's transaction, or
--   by the next settle when the two overlapped; then it runs again from the top, and its next call
--   answers 'ended'.
-- * cancel_workflow and spawn take turns on the spawning job's row: a spawn holds it FOR SHARE to
--   its commit, the cancellation locks every unfinished member FOR NO KEY UPDATE (waiting at most
--   lock_timeout, 5 s) and looks for members again after each round of locks. A spawn that committed
--   before the cancellation locked its parent is seen by the next round (its child is cancelled);
--   one that comes after finds its parent cancelled (not yours: NULL, nothing enqueued).

-- Validates the ids of pgq.await_jobs and pgq.job_outcomes: 22004 when NULL, 22023 unless a
-- one-dimensional array of 1 to `most` distinct ids without NULL (nor the job itself, `job_id`).
CREATE OR REPLACE FUNCTION pgq._check_job_ids(ids bigint[], job_id bigint, most integer) RETURNS bigint[]
    LANGUAGE plpgsql IMMUTABLE
    AS $$
DECLARE
    distinct_ids bigint[];
BEGIN
    IF _check_job_ids.ids IS NULL THEN
        PERFORM pgq._bad_argument('ids', 'must not be NULL');
    ELSIF array_ndims(_check_job_ids.ids) > 1 THEN
        PERFORM pgq._bad_argument('ids', 'must be a one-dimensional array of job ids');
    ELSIF array_position(_check_job_ids.ids, NULL) IS NOT NULL THEN
        PERFORM pgq._bad_argument('ids', 'must not contain NULL');
    ELSIF _check_job_ids.job_id = ANY (_check_job_ids.ids) THEN
        PERFORM pgq._bad_argument('ids', format('must not name the job itself (%s)', _check_job_ids.job_id),
            'A job that waited for itself would wait for ever.');
    END IF;
    distinct_ids := ARRAY(SELECT DISTINCT i.id FROM unnest(_check_job_ids.ids) AS i(id) ORDER BY i.id);
    IF cardinality(distinct_ids) NOT BETWEEN 1 AND _check_job_ids.most THEN
        PERFORM pgq._bad_argument('ids', format('must name 1 to %s jobs, got %s', _check_job_ids.most,
                                                cardinality(distinct_ids)));
    END IF;
    RETURN distinct_ids;
END
$$;

-- Enqueues the child `name` of the caller's running attempt's job into `queue` (kind, payload: as
-- pgq.enqueue's, with its checks and the queue's enqueue grants for the caller's login) and records
-- it as step `name` ({"job_id": <child>}); returns the child's id. A later call of the name (by any
-- attempt) returns the same id and enqueues nothing; a name recorded by pgq.record_step is refused
-- (22023). NULL when the attempt is not the caller's (and a rejected event): nothing is enqueued.
-- The job's row is held FOR SHARE to the caller's commit (pgq.cancel_workflow waits for it).
CREATE OR REPLACE FUNCTION pgq.spawn(id bigint, attempt integer, name text, queue text, kind text,
                                     payload jsonb DEFAULT '{}'::jsonb)
    RETURNS bigint
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
DECLARE
    job pgq.jobs;
    spawned record;
    child bigint;
BEGIN
    PERFORM pgq._check_fence(spawn.id, spawn.attempt);
    PERFORM pgq._check_step_name('name', spawn.name, true);
    PERFORM pgq._check_name('queue', spawn.queue);
    PERFORM pgq._check_name('kind', spawn.kind);
    PERFORM pgq._check_payload('payload', spawn.payload);
    job := pgq._own_attempt(spawn.id, spawn.attempt, true);
    IF job.id IS NULL THEN
        PERFORM pgq._reject(spawn.id, spawn.attempt, 'spawn');
        RETURN NULL;
    END IF;
    SELECT s.child_id INTO spawned FROM pgq.steps AS s WHERE s.job_id = spawn.id AND s.name = spawn.name;
    IF FOUND THEN
        IF spawned.child_id IS NULL THEN
            PERFORM pgq._bad_argument('name', format('names step %s of job %s, which is no spawn',
                                                     left(quote_literal(spawn.name), 80), spawn.id),
                'Give the child a name of its own.');
        END IF;
        RETURN spawned.child_id;
    END IF;
    child := pgq.enqueue(spawn.queue, spawn.kind, spawn.payload);
    UPDATE pgq.jobs AS j SET workflow_id = coalesce(job.workflow_id, job.id), parent_id = job.id
    WHERE j.id = child;
    INSERT INTO pgq.steps (job_id, name, attempt, result, child_id)
    VALUES (spawn.id, spawn.name, spawn.attempt, jsonb_build_object('job_id', child), child)
    ON CONFLICT ON CONSTRAINT steps_pkey DO NOTHING;
    IF NOT FOUND THEN
        -- Another call of this attempt recorded the name meanwhile (it waited for that one's
        -- commit): its child is the answer, and this one is taken back (nobody has seen it).
        DELETE FROM pgq.jobs AS j WHERE j.id = child;
        RETURN (SELECT s.child_id FROM pgq.steps AS s WHERE s.job_id = spawn.id AND s.name = spawn.name);
    END IF;
    RETURN child;
END
$$;
COMMENT ON FUNCTION pgq.spawn(bigint, integer, text, text, text, jsonb) IS
    'Enqueues the child name of the caller''s running attempt''s job once (a later call returns the '
    'same id); it carries the root''s id (workflow_id). NULL when the attempt is not the caller''s.';

-- The handler of the caller's running attempt waits for the jobs `ids` (1 to 10000, each a job the
-- caller may read: a member of the job's workflow, or of a queue whose read grants admit the login;
-- 22023 naming the first other id, as for an unknown one; in pgq.jobs or, archived, in pgq.archive:
-- pgq._job_anywhere): 'ended' when every one has ended (done,
-- failed or cancelled), else 'waiting': the job is parked (the attempt ends without using one up:
-- state waiting, no lease, max_attempts + 1) until they have, and its handler returns without
-- completing; it runs again from the top, and its next call answers 'ended'. pgq.job_outcomes
-- reads their states and results. NULL when the attempt is not the caller's (and a rejected event);
-- a repeat after an ambiguous commit of the park answers 'waiting' again while it waits.
CREATE OR REPLACE FUNCTION pgq.await_jobs(id bigint, attempt integer, ids bigint[])
    RETURNS text
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET enable_seqscan = off
    SET enable_bitmapscan = off
    AS $$
DECLARE
    job pgq.jobs;
    wanted bigint[];
    root bigint;
    missing bigint;
    open_ids bigint[];
BEGIN
    PERFORM pgq._check_fence(await_jobs.id, await_jobs.attempt);
    wanted := pgq._check_job_ids(await_jobs.ids, await_jobs.id, 10000);
    job := pgq._own_attempt(await_jobs.id, await_jobs.attempt, false);
    IF job.id IS NULL THEN
        IF EXISTS (SELECT FROM pgq.jobs AS j
                   WHERE j.id = await_jobs.id AND j.attempt = await_jobs.attempt AND j.state = 'waiting'
                     AND j.last_event = 'awaiting_jobs' AND pgq._same_login(j.session_role)) THEN
            RETURN 'waiting';
        END IF;
        PERFORM pgq._reject(await_jobs.id, await_jobs.attempt, 'await_jobs');
        RETURN NULL;
    END IF;
    root := coalesce(job.workflow_id, job.id);
    WITH seen AS (
        SELECT j.id, j.state
        FROM unnest(wanted) AS w(id)
        CROSS JOIN LATERAL pgq._job_anywhere(w.id) AS j
        JOIN pgq.queues AS q ON q.name = j.queue
        WHERE j.workflow_id = root OR j.id = root OR q.restricted IS NULL
           OR pgq._may(q.name, q.restricted, 'read')
    )
    SELECT (SELECT min(i.id) FROM unnest(wanted) AS i(id) WHERE i.id NOT IN (SELECT s.id FROM seen AS s)),
           ARRAY(SELECT s.id FROM seen AS s WHERE s.state NOT IN ('done', 'failed', 'cancelled') ORDER BY s.id)
    INTO missing, open_ids;
    IF missing IS NOT NULL THEN
        PERFORM pgq._bad_argument('ids', format('names no job with id %s', missing),
            'A job that never existed, or a finished one that pgq.prune has deleted, cannot be awaited.');
    END IF;
    IF cardinality(open_ids) = 0 THEN
        RETURN 'ended';
    END IF;
    IF job.max_attempts - job.attempt_offset >= pgq._attempt_room() THEN
        PERFORM pgq._no_attempt_room(job.id, 'await_jobs');
    END IF;
    WITH parked AS (
        UPDATE pgq.jobs AS j
        SET state = 'waiting', lease_until = NULL, max_attempts = j.max_attempts + 1,
            dependency_mode = 'all_ended', dependencies_left = cardinality(open_ids),
            last_event = 'awaiting_jobs', session_role = session_user
        WHERE j.id = job.id
        RETURNING j.id, j.attempt, j.claimed_by
    )
    INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state, note)
    SELECT p.id, p.attempt, p.claimed_by, 'awaiting_jobs', 'running', 'waiting',
           format('%s of %s jobs not ended yet', cardinality(open_ids), cardinality(wanted))
    FROM parked AS p JOIN pgq.queues AS q ON q.name = job.queue AND q.audit;
    -- Linked to each open one, with a check each (an end in flight now cannot see the links).
    PERFORM pgq._wait_for_dependencies(ARRAY[job.id], open_ids, NULL, NULL);
    RETURN 'waiting';
END
$$;
COMMENT ON FUNCTION pgq.await_jobs(bigint, integer, bigint[]) IS
    '''ended'' when every listed job has ended, else ''waiting'': the caller''s job is parked (no attempt '
    'used, no lease, no slot) until they have. NULL when the attempt is not the caller''s.';

-- The states, results, last errors and end times of the jobs `ids` (1 to 1000), in id order, for the
-- owner of the caller's running attempt (a handler after pgq.await_jobs): a member of the job's
-- workflow is answered, and so is a job whose result the login may read (pgq.job_result's rule),
-- in pgq.jobs or, archived, in pgq.archive; any other id, and one pruned since, has NULL columns. No row when the attempt is not the caller's
-- (and a rejected event).
CREATE OR REPLACE FUNCTION pgq.job_outcomes(id bigint, attempt integer, ids bigint[])
    RETURNS TABLE (job_id bigint, state text, result jsonb, last_error text, finished_at timestamptz)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET enable_seqscan = off
    SET enable_bitmapscan = off
    AS $$
#variable_conflict use_column
DECLARE
    root bigint;
    wanted bigint[];
BEGIN
    PERFORM pgq._check_fence(job_outcomes.id, job_outcomes.attempt);
    wanted := pgq._check_job_ids(job_outcomes.ids, NULL, 1000);
    SELECT coalesce(j.workflow_id, j.id) INTO root FROM pgq.jobs AS j
    WHERE j.id = job_outcomes.id AND j.attempt = job_outcomes.attempt AND j.state = 'running'
      AND pgq._owns(j.session_role);
    IF root IS NULL THEN
        PERFORM pgq._reject(job_outcomes.id, job_outcomes.attempt, 'job_outcomes');
        RETURN;
    END IF;
    RETURN QUERY
    SELECT w.id, y.state::text, CASE WHEN y.state = 'done' THEN y.result END,
           CASE WHEN y.state IN ('done', 'failed', 'cancelled') THEN y.last_error END, y.finished_at
    FROM unnest(wanted) AS w(id)
    LEFT JOIN LATERAL (
        SELECT x.state, x.result, x.last_error, x.finished_at
        FROM pgq._job_anywhere(w.id) AS x  -- in pgq.jobs or archived
        WHERE (x.workflow_id = root OR x.id = root
               OR pgq._reads_result(session_user, x.queue,
                                    (SELECT q.restricted FROM pgq.queues AS q WHERE q.name = x.queue),
                                    x.enqueued_by))
    ) AS y ON true
    ORDER BY w.id;
END
$$;
COMMENT ON FUNCTION pgq.job_outcomes(bigint, integer, bigint[]) IS
    'The state, result, last_error and finished_at of jobs ids for the owner of the caller''s running '
    'attempt (its workflow''s members, and jobs whose result it may read; NULLs otherwise).';

-- Cancels the unfinished jobs of the workflow of job `id` (its root, and every job spawned under it),
-- as pgq.cancel cancels one (a running one's worker is told at once), parents before children, and
-- returns how many: at most 10,000 per call (a NOTICE says when more may be left: call it again
-- until it returns 0). For admins and the login that enqueued the root; P0002 for anyone else, as
-- for an unknown id. Waits for a member another transaction holds at most lock_timeout (5 s), then
-- 55P03 and nothing is cancelled.
CREATE OR REPLACE FUNCTION pgq.cancel_workflow(id bigint)
    RETURNS integer
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET lock_timeout = '5s'
    SET enable_seqscan = off
    AS $$
DECLARE
    root pgq.jobs;
    member pgq.jobs;
    cancelled integer := 0;
    round integer;
BEGIN
    IF cancel_workflow.id IS NULL THEN
        PERFORM pgq._bad_argument('id', 'must not be NULL');
    END IF;
    -- The root, wherever it is: an archived job (archive.sql) is one that ended outside any workflow.
    SELECT r.* INTO root FROM pgq._job_anywhere(cancel_workflow.id) AS j
    CROSS JOIN LATERAL pgq._job_anywhere(coalesce(j.workflow_id, j.id)) AS r;
    IF root.id IS NULL
       OR NOT (root.enqueued_by = session_user OR pg_has_role(session_user, 'pgq_admin', 'MEMBER')) THEN
        RAISE EXCEPTION 'pgq: no job with id %', cancel_workflow.id
            USING ERRCODE = 'no_data_found',
                  HINT = 'A workflow is cancelled by admins and by the login that enqueued its root.';
    END IF;
    -- Round after round: each locks the members it sees (waiting for a spawn in flight from one of
    -- them) and cancels them; the next sees the children those spawns committed.
    LOOP
        round := 0;
        FOR member IN
            SELECT j.* FROM pgq.jobs AS j
            WHERE (j.id = root.id OR j.workflow_id = root.id) AND j.state NOT IN ('done', 'failed', 'cancelled')
            ORDER BY j.id
            LIMIT 10000 - cancelled
            FOR NO KEY UPDATE
        LOOP
            PERFORM pgq._cancel_job(member);
            round := round + 1;
        END LOOP;
        cancelled := cancelled + round;
        EXIT WHEN round = 0;
        IF cancelled >= 10000 THEN
            RAISE NOTICE 'pgq: cancelled 10000 jobs of workflow %; call again for the rest', root.id;
            EXIT;
        END IF;
    END LOOP;
    RETURN cancelled;
END
$$;
COMMENT ON FUNCTION pgq.cancel_workflow(bigint) IS
    'Cancels every unfinished job of the workflow of job id (its root and all spawned under it), at most '
    '10000 per call; returns how many. For admins and the login that enqueued the root.';

-- The sweep's lifetime step: up to max_jobs waiting or pending jobs whose start_by has passed while
-- they were never claimed (cancelled) or whose expires_at has passed (failed), earliest first, those
-- no other transaction holds; last_error says which. (A running attempt never runs past expires_at:
-- its claim's deadline; the recovery ends it then.) Returns how many.
CREATE OR REPLACE FUNCTION pgq._expire_jobs(max_jobs integer) RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    ended integer;
BEGIN
    WITH due AS (
        SELECT j.id, j.state FROM pgq.jobs AS j
        WHERE least(CASE WHEN j.attempt = 0 THEN j.start_by END, j.expires_at) <= pgq._now()
          AND (j.start_by IS NOT NULL OR j.expires_at IS NOT NULL) AND j.state IN ('waiting', 'pending')
        ORDER BY least(CASE WHEN j.attempt = 0 THEN j.start_by END, j.expires_at)
        LIMIT _expire_jobs.max_jobs
        FOR NO KEY UPDATE SKIP LOCKED
    ), gone AS (
        UPDATE pgq.jobs AS j
        SET state = CASE WHEN j.expires_at <= pgq._now() THEN 'failed' ELSE 'cancelled' END::pgq.job_state,
            finished_at = pgq._now(), last_event = 'expired',
            last_error = CASE WHEN j.expires_at <= pgq._now()
                              THEN format('pgq: expired: alive longer than its max_lifetime (until %s)',
                                          j.expires_at)
                              ELSE format('pgq: expired: not claimed by its start_by (%s)', j.start_by) END
        FROM due AS d
        WHERE j.id = d.id
        RETURNING j.id, j.queue, j.attempt, d.state AS from_state, j.state, j.last_error
    ), events AS (
        INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state, note)
        SELECT g.id, g.attempt, NULL, 'expired', g.from_state, g.state, g.last_error
        FROM gone AS g JOIN pgq.queues AS q ON q.name = g.queue AND q.audit
    )
    SELECT count(*) INTO ended FROM gone;
    RETURN ended;
END
$$;

-- The durable part of pgq.sweep and pgq.settle_dependencies, each step only when it has work (one
-- index probe each): the signals' checks first (pgq._settle_signals: before the call takes a
-- transaction id of its own), the signal waits' timeouts, the lifetimes. Bounded by max_jobs each,
-- never waiting. Returns how many jobs it moved on.
CREATE OR REPLACE FUNCTION pgq._settle_durable(max_jobs integer) RETURNS integer
    LANGUAGE plpgsql
    SET enable_seqscan = off
    AS $$
DECLARE
    moved integer := 0;
BEGIN
    IF EXISTS (SELECT FROM pgq.signal_checks) THEN
        moved := moved + pgq._settle_signals(_settle_durable.max_jobs, _settle_durable.max_jobs);
    END IF;
    IF EXISTS (SELECT FROM pgq.jobs AS j WHERE j.wake_at <= pgq._now() AND j.wake_at IS NOT NULL AND j.state = 'waiting') THEN
        moved := moved + pgq._fire_wait_timeouts(_settle_durable.max_jobs);
    END IF;
    IF EXISTS (SELECT FROM pgq.jobs AS j
               WHERE least(CASE WHEN j.attempt = 0 THEN j.start_by END, j.expires_at) <= pgq._now()
                 AND (j.start_by IS NOT NULL OR j.expires_at IS NOT NULL) AND j.state IN ('waiting', 'pending')) THEN
        moved := moved + pgq._expire_jobs(_settle_durable.max_jobs);
    END IF;
    RETURN moved;
END
$$;
