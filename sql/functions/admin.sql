-- sql/functions/admin.sql: the admin calls on a job: cancel, retry, resolve; and prune.

-- Every admin call runs with lock_timeout 5 s (its SET clause, whatever the session's): a lock
-- another session holds (an idle transaction that claimed from a capped queue holds that queue's
-- row; one that claimed a job holds the job's row) is waited for at most that long, then the call
-- fails with 55P03, with a hint when it was a queue row (pgq._lock_queue).

-- The job row for an admin call, locked; raises P0002 for an unknown id. A job in the archive
-- (archive.sql) is finished: its row is returned, unlocked (cancel answers false, resolve
-- refuses); with `restore` (pgq.retry) an archived failed or cancelled job is first moved back
-- into pgq.jobs (pgq._unarchive) and returned locked. A job that a sweep is moving meanwhile is
-- waited for (its row lock), then found in the archive.
CREATE OR REPLACE FUNCTION pgq._admin_job(id bigint, restore boolean DEFAULT false) RETURNS pgq.jobs
    LANGUAGE plpgsql
    AS $$
DECLARE
    job pgq.jobs;
BEGIN
    IF _admin_job.id IS NULL THEN
        PERFORM pgq._bad_argument('id', 'must not be NULL');
    END IF;
    SELECT * INTO job FROM pgq.jobs AS j WHERE j.id = _admin_job.id FOR NO KEY UPDATE;
    IF FOUND THEN
        RETURN job;
    END IF;
    IF _admin_job.restore AND pgq._unarchive(_admin_job.id) THEN
        SELECT * INTO job FROM pgq.jobs AS j WHERE j.id = _admin_job.id FOR NO KEY UPDATE;
    ELSE
        job := pgq._archived_job(_admin_job.id);
    END IF;
    IF job.id IS NULL THEN
        RAISE EXCEPTION 'pgq: no job with id %', _admin_job.id
            USING ERRCODE = 'no_data_found', HINT = 'It may have been pruned.';
    END IF;
    RETURN job;
END
$$;

CREATE OR REPLACE FUNCTION pgq._admin_event(job pgq.jobs, event text, to_state pgq.job_state, note text DEFAULT NULL)
    RETURNS void
    LANGUAGE sql
    AS $$
    INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state, note)
    SELECT (job).id, (job).attempt, NULL, event, (job).state, to_state, note
    FROM pgq.queues AS q WHERE q.name = (job).queue AND q.audit
$$;

-- Cancels a job that has not finished, its row locked by the caller (pgq.cancel, pgq.cancel_jobs):
-- its state, its event, and for a running job a notification on channel pgq_cancel with
-- '<id>:<attempt>', sent when this transaction commits, which tells its worker at once (a worker
-- that does not listen learns it at its next renew or complete, answered "not yours").
CREATE OR REPLACE FUNCTION pgq._cancel_job(job pgq.jobs) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    UPDATE pgq.jobs AS j
    SET state = 'cancelled', lease_until = NULL, finished_at = pgq._now(), last_event = 'cancelled'
    WHERE j.id = (_cancel_job.job).id;
    PERFORM pgq._admin_event(_cancel_job.job, 'cancelled', 'cancelled');
    IF (_cancel_job.job).state = 'running' THEN
        PERFORM pg_notify('pgq_cancel', (_cancel_job.job).id || ':' || (_cancel_job.job).attempt);
    END IF;
END
$$;

-- Cancels a waiting, pending, running or outcome_unknown job (and the jobs waiting for it:
-- pgq._dependency_ended); a running job's worker is told at once (pgq._cancel_job). Returns false,
-- changing nothing, when the job had already finished.
CREATE OR REPLACE FUNCTION pgq.cancel(id bigint)
    RETURNS boolean
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET lock_timeout = '5s'
    AS $$
DECLARE
    job pgq.jobs := pgq._admin_job(cancel.id);
BEGIN
    IF job.state IN ('done', 'failed', 'cancelled') THEN
        RETURN false;
    END IF;
    PERFORM pgq._cancel_job(job);
    RETURN true;
END
$$;
COMMENT ON FUNCTION pgq.cancel(bigint) IS
    'Cancels a job that has not finished; false when it had already finished; P0002 when unknown.';

-- Makes a failed or cancelled job, its row locked by the caller (pgq.retry, pgq.retry_jobs),
-- pending again, now; 55000 when its unique_key is held or it has no attempt left to give.
CREATE OR REPLACE FUNCTION pgq._retry_job(job pgq.jobs) RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    job_id bigint := (_retry_job.job).id;
BEGIN
    IF greatest(job.max_attempts, job.attempt + 1) - job.attempt_offset > pgq._attempt_room() THEN
        PERFORM pgq._no_attempt_room(job_id, 'retry');
    END IF;
    BEGIN
        UPDATE pgq.jobs AS j
        SET state = 'pending', run_at = pgq._now(), finished_at = NULL,
            max_attempts = greatest(j.max_attempts, j.attempt + 1), last_event = 'retried'
        WHERE j.id = job_id;
    EXCEPTION WHEN unique_violation THEN
        RAISE EXCEPTION 'pgq: job % cannot be retried: job % holds its unique_key %', job_id,
            (SELECT j.id FROM pgq.jobs AS j
             WHERE j.queue = job.queue AND j.unique_key = job.unique_key
               AND j.unique_key IS NOT NULL AND j.state IN ('waiting', 'pending', 'running', 'outcome_unknown')),
            quote_literal(job.unique_key)
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Wait for that job to finish, or cancel it first.';
    END;
    PERFORM pgq._admin_event(job, 'retried', 'pending');
    IF job.batch_id IS NOT NULL THEN
        -- Its end is taken back: its next one counts (pgq._batch_member_ended).
        PERFORM pgq._batch_member_ended(job.batch_id, job.state, -1);
    END IF;
END
$$;

-- Runs a failed or cancelled job again, now. The attempt number is kept (it never decreases);
-- max_attempts is raised so that at least one more attempt is allowed. An archived failed or
-- cancelled job (a queue with archive on) comes back into pgq.jobs first, with its history.
CREATE OR REPLACE FUNCTION pgq.retry(id bigint)
    RETURNS boolean
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET lock_timeout = '5s'
    AS $$
DECLARE
    job pgq.jobs := pgq._admin_job(retry.id, true);
BEGIN
    IF job.state NOT IN ('failed', 'cancelled') THEN
        RAISE EXCEPTION 'pgq: job % is %, only failed or cancelled jobs can be retried', retry.id, job.state
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Use pgq.resolve for outcome_unknown jobs.';
    END IF;
    PERFORM pgq._retry_job(job);
    PERFORM pgq._notify(job.queue);
    RETURN true;
END
$$;

-- Validates the filter of pgq.retry_jobs and pgq.cancel_jobs (22004 / 22023): queue, state (one
-- of allowed), kind (NULL: any), limit_rows (1 to 10000) and tags (NULL: any; pgq._check_tags).
CREATE OR REPLACE FUNCTION pgq._check_bulk(queue text, state text, allowed text[], kind text, limit_rows integer,
                                           tags text[] DEFAULT NULL)
    RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    PERFORM pgq._check_name('queue', _check_bulk.queue);
    IF _check_bulk.state IS NULL THEN
        PERFORM pgq._bad_argument('state', 'must not be NULL', format('One of %s.', array_to_string(allowed, ', ')));
    ELSIF _check_bulk.state <> ALL (_check_bulk.allowed) THEN
        PERFORM pgq._bad_argument('state',
            format('must be one of %s, got %s', array_to_string(allowed, ', '), left(quote_literal(_check_bulk.state), 40)));
    END IF;
    IF _check_bulk.kind IS NOT NULL THEN
        PERFORM pgq._check_name('kind', _check_bulk.kind);
    END IF;
    IF _check_bulk.limit_rows IS NULL THEN
        PERFORM pgq._bad_argument('limit_rows', 'must not be NULL', 'Omit it for 1000.');
    ELSIF _check_bulk.limit_rows NOT BETWEEN 1 AND 10000 THEN
        PERFORM pgq._bad_argument('limit_rows',
            format('must be between 1 and 10000, got %s', _check_bulk.limit_rows), 'Call again for the rest.');
    END IF;
    PERFORM pgq._check_tags('tags', _check_bulk.tags, true);
END
$$;

-- A bulk call's tags filter reads the tagged jobs through jobs_tags_idx (GIN, `tags @> filter`),
-- which only a bitmap scan reads, and sorts what it found by id: the calls that run with those
-- off (their plans without a tags filter stay index scans in id order) turn them on, for the rest
-- of the call only (their SET clauses restore them at its end), before their tagged read.
CREATE OR REPLACE FUNCTION pgq._tagged_reads() RETURNS void
    LANGUAGE sql
    AS $$
    SELECT set_config('enable_bitmapscan', 'on', true), set_config('enable_sort', 'on', true);
$$;

-- pgq.retry_jobs' retry of one job: 1, or 0 when pgq.retry would refuse it (its key is held, or
-- no attempt is left: 55000), which then stays as it was.
CREATE OR REPLACE FUNCTION pgq._retry_quietly(job pgq.jobs) RETURNS integer
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM pgq._retry_job(job);
    RETURN 1;
EXCEPTION WHEN object_not_in_prerequisite_state THEN
    RETURN 0;
END
$$;

-- Retries the failed (or cancelled) jobs of a queue that match the filter, at most limit_rows of
-- them, oldest id first, as pgq.retry retries one, and returns how many it retried. A job another
-- transaction holds is skipped (SKIP LOCKED), and so is one pgq.retry would refuse (its unique_key
-- is held by a live job, or it has no attempt left to give: 55000 there): each stays as it was,
-- uncounted. Call it again until it returns 0 (pgq-thin retry --all does). The jobs are read in
-- jobs_list_idx (queue, state, id) order; kind and finished_before filter what that reads.
CREATE OR REPLACE FUNCTION pgq.retry_jobs(queue text, state text, kind text DEFAULT NULL,
                                          finished_before timestamptz DEFAULT NULL,
                                          limit_rows integer DEFAULT 1000, tags text[] DEFAULT NULL)
    RETURNS integer
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET lock_timeout = '5s'
    SET enable_seqscan = off
    SET enable_bitmapscan = off
    SET enable_sort = off
    AS $$
DECLARE
    job     pgq.jobs;
    retried integer := 0;
BEGIN
    PERFORM pgq._check_bulk(retry_jobs.queue, retry_jobs.state, '{failed,cancelled}', retry_jobs.kind,
                            retry_jobs.limit_rows, retry_jobs.tags);
    IF retry_jobs.tags IS NOT NULL THEN
        PERFORM pgq._tagged_reads();
        FOR job IN
            SELECT j.* FROM pgq.jobs AS j
            WHERE j.tags @> retry_jobs.tags AND j.tags IS NOT NULL
              AND j.queue = retry_jobs.queue AND j.state = retry_jobs.state::pgq.job_state
              AND (retry_jobs.kind IS NULL OR j.kind = retry_jobs.kind)
              AND (retry_jobs.finished_before IS NULL OR j.finished_at < retry_jobs.finished_before)
            ORDER BY j.id
            LIMIT retry_jobs.limit_rows
            FOR NO KEY UPDATE OF j SKIP LOCKED
        LOOP
            retried := retried + pgq._retry_quietly(job);
        END LOOP;
    ELSE FOR job IN
        SELECT j.* FROM pgq.jobs AS j
        WHERE j.queue = retry_jobs.queue AND j.state = retry_jobs.state::pgq.job_state AND j.state <> 'running'
          AND (retry_jobs.kind IS NULL OR j.kind = retry_jobs.kind)
          AND (retry_jobs.finished_before IS NULL OR j.finished_at < retry_jobs.finished_before)
        ORDER BY (- j.id) DESC
        LIMIT retry_jobs.limit_rows
        FOR NO KEY UPDATE OF j SKIP LOCKED
    LOOP
        retried := retried + pgq._retry_quietly(job);
    END LOOP;
    END IF;
    IF retried > 0 THEN
        PERFORM pgq._notify(retry_jobs.queue);
    END IF;
    RETURN retried;
END
$$;
COMMENT ON FUNCTION pgq.retry_jobs(text, text, text, timestamptz, integer, text[]) IS
    'Retries up to limit_rows failed or cancelled jobs of a queue (of kind, finished before '
    'finished_before, holding all of tags), oldest first, as pgq.retry does; returns how many. Call '
    'again until 0.';

-- Cancels the jobs of a queue in one state that match the filter, at most limit_rows of them,
-- oldest id first, as pgq.cancel cancels one (a running one's worker is told at once), and returns
-- how many. A job another transaction holds is skipped (SKIP LOCKED): call again until it returns
-- 0 (pgq-thin cancel --all does). Waiting, pending and outcome_unknown jobs are read in
-- jobs_list_idx order; running ones (which that index leaves out) through jobs_lease_idx: there
-- are as many as workers run.
CREATE OR REPLACE FUNCTION pgq.cancel_jobs(queue text, state text, kind text DEFAULT NULL,
                                           created_before timestamptz DEFAULT NULL,
                                           limit_rows integer DEFAULT 1000, tags text[] DEFAULT NULL)
    RETURNS integer
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET lock_timeout = '5s'
    SET enable_seqscan = off
    SET enable_bitmapscan = off
    AS $$
DECLARE
    job       pgq.jobs;
    cancelled integer := 0;
BEGIN
    PERFORM pgq._check_bulk(cancel_jobs.queue, cancel_jobs.state, '{waiting,pending,running,outcome_unknown}',
                            cancel_jobs.kind, cancel_jobs.limit_rows, cancel_jobs.tags);
    IF cancel_jobs.tags IS NOT NULL THEN
        PERFORM pgq._tagged_reads();
        FOR job IN
            SELECT j.* FROM pgq.jobs AS j
            WHERE j.tags @> cancel_jobs.tags AND j.tags IS NOT NULL
              AND j.queue = cancel_jobs.queue AND j.state = cancel_jobs.state::pgq.job_state
              AND (cancel_jobs.kind IS NULL OR j.kind = cancel_jobs.kind)
              AND (cancel_jobs.created_before IS NULL OR j.created_at < cancel_jobs.created_before)
            ORDER BY j.id
            LIMIT cancel_jobs.limit_rows
            FOR NO KEY UPDATE OF j SKIP LOCKED
        LOOP
            PERFORM pgq._cancel_job(job);
            cancelled := cancelled + 1;
        END LOOP;
        RETURN cancelled;
    END IF;
    IF cancel_jobs.state = 'running' THEN
        FOR job IN
            SELECT j.* FROM pgq.jobs AS j
            WHERE j.lease_until IS NOT NULL AND j.queue = cancel_jobs.queue AND j.state = 'running'
              AND (cancel_jobs.kind IS NULL OR j.kind = cancel_jobs.kind)
              AND (cancel_jobs.created_before IS NULL OR j.created_at < cancel_jobs.created_before)
            ORDER BY j.id
            LIMIT cancel_jobs.limit_rows
            FOR NO KEY UPDATE OF j SKIP LOCKED
        LOOP
            PERFORM pgq._cancel_job(job);
            cancelled := cancelled + 1;
        END LOOP;
        RETURN cancelled;
    END IF;
    FOR job IN
        SELECT j.* FROM pgq.jobs AS j
        WHERE j.queue = cancel_jobs.queue AND j.state = cancel_jobs.state::pgq.job_state AND j.state <> 'running'
          AND (cancel_jobs.kind IS NULL OR j.kind = cancel_jobs.kind)
          AND (cancel_jobs.created_before IS NULL OR j.created_at < cancel_jobs.created_before)
        ORDER BY (- j.id) DESC
        LIMIT cancel_jobs.limit_rows
        FOR NO KEY UPDATE OF j SKIP LOCKED
    LOOP
        PERFORM pgq._cancel_job(job);
        cancelled := cancelled + 1;
    END LOOP;
    RETURN cancelled;
END
$$;
COMMENT ON FUNCTION pgq.cancel_jobs(text, text, text, timestamptz, integer, text[]) IS
    'Cancels up to limit_rows jobs of a queue in one unfinished state (of kind, created before '
    'created_before, holding all of tags), oldest first, as pgq.cancel does; returns how many. Call '
    'again until 0.';
-- pgq.delete_jobs' first step for one job it deletes: a pending or waiting one is cancelled (its
-- end reaches its dependants, batch and metrics). Returns its id.
CREATE OR REPLACE FUNCTION pgq._doom(job pgq.jobs) RETURNS bigint
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF job.state IN ('pending', 'waiting') THEN
        PERFORM pgq._cancel_job(job);
    END IF;
    RETURN job.id;
END
$$;

-- Deletes the jobs of a queue in one state that match the filter, at most limit_rows of them, oldest
-- id first, and returns how many. Never a running or outcome_unknown job. What others see stays as
-- after an end: a pending or waiting job is cancelled first (pgq._cancel_job, in this transaction),
-- so its end reaches its dependants (cancelled down an all_done chain, released for all_ended),
-- its batch (counted, the callback fired when it was the last) and the metrics, as a cancelled job's
-- does; then it is deleted as pgq.prune deletes a finished job (pgq._delete_jobs), and its
-- unique_key is free. A job another transaction holds is skipped (SKIP LOCKED, with a DELETE's lock:
-- a foreign key's KEY SHARE holder too), and so is a finished job whose end a settle call has yet
-- to check against an enqueue in flight (pgq.overlap_checks: a gone dependency counts as
-- cancelled there): call again until it returns 0 (pgq-thin delete --all does). `before`: jobs
-- created before it (pending, waiting) or finished before it (done, failed, cancelled). The jobs
-- are read in jobs_list_idx (queue, state, id) order; kind and before filter what that reads.
CREATE OR REPLACE FUNCTION pgq.delete_jobs(queue text, state text, kind text DEFAULT NULL,
                                           before timestamptz DEFAULT NULL, limit_rows integer DEFAULT 1000,
                                           tags text[] DEFAULT NULL)
    RETURNS integer
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET lock_timeout = '5s'
    SET enable_seqscan = off
    SET enable_bitmapscan = off
    SET enable_sort = off
    AS $$
DECLARE
    job     pgq.jobs;
    doomed  bigint[] := '{}';
    checked bigint[];
BEGIN
    PERFORM pgq._check_bulk(delete_jobs.queue, delete_jobs.state, '{pending,waiting,done,failed,cancelled}',
                            delete_jobs.kind, delete_jobs.limit_rows, delete_jobs.tags);
    IF delete_jobs.tags IS NOT NULL THEN
        PERFORM pgq._tagged_reads();
        FOR job IN
            SELECT j.* FROM pgq.jobs AS j
            WHERE j.tags @> delete_jobs.tags AND j.tags IS NOT NULL
              AND j.queue = delete_jobs.queue AND j.state = delete_jobs.state::pgq.job_state
              AND (delete_jobs.kind IS NULL OR j.kind = delete_jobs.kind)
              AND (delete_jobs.before IS NULL
                   OR CASE WHEN j.state IN ('pending', 'waiting') THEN j.created_at ELSE j.finished_at END
                      < delete_jobs.before)
            ORDER BY j.id
            LIMIT delete_jobs.limit_rows
            FOR UPDATE OF j SKIP LOCKED
        LOOP
            doomed := doomed || pgq._doom(job);
        END LOOP;
    ELSE FOR job IN
        SELECT j.* FROM pgq.jobs AS j
        WHERE j.queue = delete_jobs.queue AND j.state = delete_jobs.state::pgq.job_state AND j.state <> 'running'
          AND (delete_jobs.kind IS NULL OR j.kind = delete_jobs.kind)
          AND (delete_jobs.before IS NULL
               OR CASE WHEN j.state IN ('pending', 'waiting') THEN j.created_at ELSE j.finished_at END
                  < delete_jobs.before)
        ORDER BY (- j.id) DESC
        LIMIT delete_jobs.limit_rows
        FOR UPDATE OF j SKIP LOCKED
    LOOP
        doomed := doomed || pgq._doom(job);
    END LOOP;
    END IF;
    IF delete_jobs.state IN ('done', 'failed', 'cancelled') AND cardinality(doomed) > 0 THEN
        -- One read of the checks not yet settled (a handful: every settle call takes them).
        checked := ARRAY(SELECT DISTINCT c.job_id FROM pgq.overlap_checks AS c WHERE c.job_id = ANY (doomed));
        IF cardinality(checked) > 0 THEN
            doomed := ARRAY(SELECT d.id FROM unnest(doomed) AS d(id) WHERE d.id <> ALL (checked));
        END IF;
    END IF;
    RETURN pgq._delete_jobs(doomed);
END
$$;
COMMENT ON FUNCTION pgq.delete_jobs(text, text, text, timestamptz, integer, text[]) IS
    'Deletes up to limit_rows jobs of a queue in one state (pending, waiting, done, failed or '
    'cancelled; of kind, created or finished before before, holding all of tags), oldest first, a pending or waiting one '
    'cancelled first (its dependants and batch see it end); returns how many. Call again until 0.';
COMMENT ON FUNCTION pgq.retry(bigint) IS
    'Makes a failed or cancelled job pending again; 55000 for other states; P0002 when unknown.';

-- Settles an outcome_unknown job once the outside effect's fate is known: done (it happened),
-- failed or cancelled (give up), or pending (it did not happen: run it again).
CREATE OR REPLACE FUNCTION pgq.resolve(id bigint, state text)
    RETURNS boolean
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET lock_timeout = '5s'
    AS $$
DECLARE
    job pgq.jobs;
BEGIN
    IF resolve.state IS NULL THEN
        PERFORM pgq._bad_argument('state', 'must not be NULL');
    ELSIF resolve.state NOT IN ('done', 'failed', 'cancelled', 'pending') THEN
        PERFORM pgq._bad_argument('state',
            format('must be done, failed, cancelled or pending, got %s', left(quote_literal(resolve.state), 40)));
    END IF;
    job := pgq._admin_job(resolve.id);
    IF job.state <> 'outcome_unknown' THEN
        RAISE EXCEPTION 'pgq: job % is %, only outcome_unknown jobs can be resolved', resolve.id, job.state
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    IF resolve.state = 'pending'
       AND greatest(job.max_attempts, job.attempt + 1) - job.attempt_offset > pgq._attempt_room() THEN
        PERFORM pgq._no_attempt_room(resolve.id, 'resolve');
    END IF;
    UPDATE pgq.jobs AS j
    SET state = resolve.state::pgq.job_state,
        finished_at = CASE WHEN resolve.state = 'pending' THEN NULL ELSE pgq._now() END,
        run_at = CASE WHEN resolve.state = 'pending' THEN pgq._now() ELSE j.run_at END,
        max_attempts = CASE WHEN resolve.state = 'pending' THEN greatest(j.max_attempts, j.attempt + 1)
                            ELSE j.max_attempts END,
        last_event = 'resolved'
    WHERE j.id = resolve.id;
    PERFORM pgq._admin_event(job, 'resolved', resolve.state::pgq.job_state);
    IF resolve.state = 'pending' THEN
        PERFORM pgq._notify(job.queue);
    END IF;
    RETURN true;
END
$$;
COMMENT ON FUNCTION pgq.resolve(bigint, text) IS
    'Settles an outcome_unknown job as done, failed, cancelled or pending (run again).';

-- Deletes the finished jobs `ids` (locked FOR UPDATE by the caller: a DELETE's lock, so that a
-- foreign key's KEY SHARE holder is skipped, never waited for) with what is theirs: their events,
-- their steps, their own dependency links (pgq.job_links of them) and their batch membership. The
-- links to them of other jobs stay (they are those jobs' record). Returns how many it deleted.
-- (pgq.prune, pgq.delete_jobs.)
-- (PL/pgSQL with the generic plan, so that its statement is planned once per session: a SQL
-- function's body, and a custom plan, are planned at every call (1.4 M instructions, measured),
-- which an ephemeral queue's completions, one call each, would pay. The generic plan reads every
-- table by the ids, through their indexes.)
CREATE OR REPLACE FUNCTION pgq._delete_jobs(ids bigint[]) RETURNS integer
    LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan
    AS $$
DECLARE
    n integer;
BEGIN
    WITH gone AS (
        DELETE FROM pgq.jobs AS j WHERE j.id = ANY (_delete_jobs.ids) RETURNING j.id, j.depends_on, j.batch_id
    ), events AS (
        DELETE FROM pgq.job_events AS e USING gone AS g WHERE e.job_id = g.id
    ), links AS (
        DELETE FROM pgq.job_dependants AS l
        USING (SELECT x.dep, g.id FROM gone AS g CROSS JOIN LATERAL unnest(g.depends_on) AS x(dep)
               WHERE g.depends_on IS NOT NULL) AS k
        WHERE l.depends_on = k.dep AND l.job_id = k.id
    ), members AS (
        DELETE FROM pgq.batch_members AS m USING gone AS g
        WHERE g.batch_id IS NOT NULL AND m.batch_id = g.batch_id AND m.job_id = g.id
    ), steps AS (
        DELETE FROM pgq.steps AS s USING gone AS g WHERE s.job_id = g.id
    )
    SELECT count(*)::integer INTO n FROM gone;
    RETURN n;
END
$$;

-- Retention (pgq.prune, pgq.sweep): deletes up to max_jobs finished jobs (pgq._delete_jobs: with
-- their events, links, batch memberships and steps): those that finished before now - older_than or, when
-- older_than is NULL, before now - their state's retention in their queue (done: retention;
-- failed: retention_failed; cancelled: retention_cancelled; NULL: retention). Queue by queue (name
-- order) and state by state, oldest first within each, through jobs_retention_idx (queue, state,
-- finished_at): a range per queue and state holding only the jobs past it, so a call reads the
-- jobs it deletes and one index probe per queue and state, whatever the history it keeps. A job
-- another transaction holds (a retry, a late write of its old owner) is skipped (SKIP LOCKED) and
-- its state re-checked when it changed meanwhile (FOR UPDATE re-evaluates the WHERE clause on the
-- newest row version): a job retried to pending is never deleted. Returns how many it deleted.
CREATE OR REPLACE FUNCTION pgq._retire_finished(older_than interval, max_jobs integer) RETURNS integer
    LANGUAGE plpgsql
    SET enable_seqscan = off
    SET jit = off
    AS $$
DECLARE
    deleted integer := 0;
    n integer;
    r record;
BEGIN
    FOR r IN
        SELECT q.name AS queue, s.state,
               pgq._now() - coalesce(_retire_finished.older_than,
                                     CASE s.state WHEN 'failed' THEN coalesce(q.retention_failed, q.retention)
                                                  WHEN 'cancelled' THEN coalesce(q.retention_cancelled, q.retention)
                                                  ELSE q.retention END) AS horizon
        FROM pgq.queues AS q CROSS JOIN unnest('{done,failed,cancelled}'::pgq.job_state[]) AS s(state)
        ORDER BY q.name, s.state
    LOOP
        EXIT WHEN deleted >= _retire_finished.max_jobs;
        -- (state IN (...) as well: a generic plan proves jobs_retention_idx's predicate from it,
        -- not from the parameter r.state.)
        n := pgq._delete_jobs(ARRAY(
            SELECT j.id
            FROM pgq.jobs AS j
            WHERE j.queue = r.queue AND j.state = r.state AND j.state IN ('done', 'failed', 'cancelled')
              AND j.finished_at < r.horizon
            ORDER BY j.finished_at
            LIMIT _retire_finished.max_jobs - deleted
            FOR UPDATE SKIP LOCKED));
        deleted := deleted + n;
    END LOOP;
    RETURN deleted;
END
$$;

-- Deletes finished (done, failed, cancelled) jobs, with their events and steps, older than
-- older_than, or, when older_than is NULL, than their state's retention in their queue (retention,
-- retention_failed, retention_cancelled: pgq._retire_finished). At most max_jobs per call:
-- call it again until it returns 0. Then up to max_jobs signals sent before the same horizon, and
-- up to max_jobs tenants of fair queues that have no job left and
-- the default weight 1 (a weight set with pgq.set_tenant_weight is kept; a tenant removed comes
-- back with its next job, one round behind the busiest as after any idle time). A queue whose
-- writer lock an enqueue holds is left for the next call: its new job may be one of those tenants'.
CREATE OR REPLACE FUNCTION pgq.prune(older_than interval DEFAULT NULL, max_jobs integer DEFAULT 10000)
    RETURNS integer
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET lock_timeout = '5s'
    AS $$
DECLARE
    deleted integer;
    tenants_left integer;
    r record;
BEGIN
    -- Bounded like queues.retention: a huge interval would make now() - older_than leave the
    -- timestamp range and fail with an unrelated 22008.
    PERFORM pgq._check_span('older_than', prune.older_than);
    IF prune.older_than < interval '0' OR prune.older_than > interval '3650 days' THEN
        PERFORM pgq._bad_argument('older_than',
            format('must be between 0 and 3650 days, got %s', prune.older_than));
    END IF;
    IF prune.max_jobs IS NULL THEN
        PERFORM pgq._bad_argument('max_jobs', 'must not be NULL');
    ELSIF prune.max_jobs NOT BETWEEN 1 AND 1000000 THEN
        PERFORM pgq._bad_argument('max_jobs', format('must be between 1 and 1000000, got %s', prune.max_jobs));
    END IF;
    deleted := pgq._retire_finished(prune.older_than, prune.max_jobs);
    -- Batches whose callback was enqueued before the same horizon and whose members are all
    -- deleted, with their counts and joiners.
    WITH gone AS (
        DELETE FROM pgq.batches AS b
        WHERE b.id IN (SELECT x.id FROM pgq.batches AS x
                       WHERE x.finished_at < pgq._now() - coalesce(prune.older_than, interval '7 days')
                         AND NOT EXISTS (SELECT FROM pgq.batch_members AS m WHERE m.batch_id = x.id)
                       ORDER BY x.finished_at LIMIT prune.max_jobs FOR UPDATE SKIP LOCKED)
        RETURNING b.id
    )
    , counts AS (
        DELETE FROM pgq.batch_counts AS c USING gone AS g WHERE c.batch_id = g.id
    ), backends AS (
        DELETE FROM pgq.batch_backend_counts AS c USING gone AS g WHERE c.batch_id = g.id
    )
    DELETE FROM pgq.batch_joiners AS j USING gone AS g WHERE j.batch_id = g.id;
    -- Replace calls' successors (pgq._replace_key) that are no longer live: their key needs none.
    DELETE FROM pgq.replace_slots AS s
    WHERE (s.queue, s.unique_key, s.enqueued_by) IN (
        SELECT x.queue, x.unique_key, x.enqueued_by FROM pgq.replace_slots AS x
        WHERE NOT EXISTS (SELECT FROM pgq.jobs AS j
                          WHERE j.id = x.job_id AND j.state IN ('waiting', 'pending', 'running', 'outcome_unknown'))
        LIMIT prune.max_jobs FOR UPDATE SKIP LOCKED);
    -- Signals sent before the same horizon (each job they woke has its own record of it: the step
    -- signal:<name>); a job that waits for one later waits for it to be sent again.
    DELETE FROM pgq.signals AS s
    WHERE (s.queue, s.name) IN (
        SELECT x.queue, x.name FROM pgq.signals AS x JOIN pgq.queues AS q ON q.name = x.queue
        WHERE x.sent_at < pgq._now() - coalesce(prune.older_than, q.retention)
        ORDER BY x.sent_at LIMIT prune.max_jobs FOR UPDATE OF x SKIP LOCKED);

    -- Idle tenants, queue by queue, each under its queue's row taken FOR UPDATE without waiting
    -- (the queue's writer lock, which every enqueue holds FOR KEY SHARE: pgq._queue_to_write) and
    -- held to commit: an enqueue that read a tenant's row before has committed its job (or holds
    -- the row still, and the queue is left for a later prune); one that comes after waits for this
    -- transaction (at most its 5 s), then inserts the row again.
    tenants_left := prune.max_jobs;
    FOR r IN
        SELECT DISTINCT t.queue FROM pgq.tenants AS t
        WHERE t.weight = 1
          AND NOT EXISTS (SELECT FROM pgq.jobs AS j WHERE j.queue = t.queue AND j.tenant = t.tenant)
    LOOP
        EXIT WHEN tenants_left <= 0;
        CONTINUE WHEN NOT EXISTS (SELECT FROM pgq.queues AS u WHERE u.name = r.queue FOR UPDATE SKIP LOCKED);
        WITH gone AS (
            DELETE FROM pgq.tenants AS t
            WHERE (t.queue, t.tenant) IN (
                SELECT x.queue, x.tenant FROM pgq.tenants AS x
                WHERE x.queue = r.queue AND x.weight = 1
                  AND NOT EXISTS (SELECT FROM pgq.jobs AS j WHERE j.queue = x.queue AND j.tenant = x.tenant)
                LIMIT tenants_left
                FOR UPDATE SKIP LOCKED)
            RETURNING 1
        )
        SELECT tenants_left - count(*) INTO tenants_left FROM gone;
    END LOOP;
    -- And the per-key rate limits' buckets that are full again, and old keys' rows (keys.sql).
    IF EXISTS (SELECT FROM pgq.key_rates) THEN
        PERFORM pgq._prune_key_rates(prune.max_jobs);
    END IF;
    PERFORM pgq._prune_key_locks(prune.max_jobs);
    RETURN deleted;
END
$$;
COMMENT ON FUNCTION pgq.prune(interval, integer) IS
    'Deletes up to max_jobs finished jobs (and their events) older than older_than or the queue''s retention.';
