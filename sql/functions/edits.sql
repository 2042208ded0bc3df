-- sql/functions/edits.sql: a queued job edited (pgq.update_job).
--
-- "Not started" is what pgq._lock_unstarted (enqueue.sql) says it is for a replace: the job is
-- pending or waiting and this transaction could lock its row FOR NO KEY UPDATE without waiting
-- (SKIP LOCKED), as a claim locks it. A claim in flight holds the row from the moment it locks it
-- to its commit, so a job a claim holds counts as started (the edit answers false), and an edit
-- that holds the row makes claims skip the job until the edit's transaction ends. Whichever locks
-- the row first wins; the other never waits (a waiting job's row, which only a short cascade,
-- sweep or settle holds, is tried again for up to 50 ms). So a claim hands out either the job as
-- it was before an edit that then answers false, or the job as edited: never the old payload of
-- a job whose edit answered true.

-- Validates pgq.update_job's arguments (22004 / 22023), naming the first that is wrong.
CREATE OR REPLACE FUNCTION pgq._check_update_job(id bigint, payload jsonb, priority integer, run_at timestamptz,
                                                 meta jsonb)
    RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    IF _check_update_job.id IS NULL THEN
        PERFORM pgq._bad_argument('id', 'must not be NULL');
    END IF;
    IF _check_update_job.payload IS NULL AND _check_update_job.priority IS NULL
       AND _check_update_job.run_at IS NULL AND _check_update_job.meta IS NULL THEN
        PERFORM pgq._bad_argument('payload', 'is NULL, and so are priority, run_at and meta: nothing to change',
            'Give at least one of payload, priority, run_at and meta (NULL keeps the job''s own).');
    END IF;
    IF _check_update_job.payload IS NOT NULL THEN
        PERFORM pgq._check_payload('payload', _check_update_job.payload);
    END IF;
    IF _check_update_job.priority NOT BETWEEN -1000 AND 1000 THEN
        PERFORM pgq._bad_argument('priority',
            format('must be between -1000 and 1000, got %s', _check_update_job.priority));
    END IF;
    IF NOT isfinite(_check_update_job.run_at) THEN
        PERFORM pgq._bad_argument('run_at', format('must be a finite time, got %s', _check_update_job.run_at));
    END IF;
    IF _check_update_job.meta IS NOT NULL THEN
        PERFORM pgq._check_payload('meta', _check_update_job.meta);
    END IF;
END
$$;

-- Gives a job that has not started (above) the payload, priority, run_at and meta the call names
-- (NULL: the job's own stays) and returns true; false, changing nothing, when the job has started
-- (a claim holds it, or it is running or outcome_unknown) or has ended (archived jobs too). For admins and the login
-- that enqueued it (in a queue whose enqueue grants still admit that login: 42501 otherwise);
-- anyone else gets P0002, as for an unknown id. meta is replaced whole. A run_at not before the
-- job's start_by is refused (22023): the job could only expire. Its kind, tenant, keys,
-- dependencies, batch and attempts stay its own. An audited queue records the event `updated`
-- (its note names the fields given). Never waits for a worker; the only wait is the bounded retry
-- of a waiting job's row (pgq._lock_unstarted).
CREATE OR REPLACE FUNCTION pgq.update_job(id bigint, payload jsonb DEFAULT NULL, priority integer DEFAULT NULL,
                                          run_at timestamptz DEFAULT NULL, meta jsonb DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
#variable_conflict use_column
DECLARE
    job    pgq.jobs;
    locked record;
    restricted text[];
BEGIN
    PERFORM pgq._check_update_job(update_job.id, update_job.payload, update_job.priority, update_job.run_at,
                                  update_job.meta);
    -- Read, not locked (enqueued_by never changes); an archived job (archive.sql) has ended.
    SELECT * INTO job FROM pgq._job_anywhere(update_job.id);
    IF NOT FOUND OR NOT pgq._enqueued_it(job.enqueued_by) THEN
        RAISE EXCEPTION 'pgq: no job with id %', update_job.id
            USING ERRCODE = 'no_data_found',
                  HINT = 'A job is updated by admins and by the login that enqueued it.';
    END IF;
    SELECT q.restricted INTO restricted FROM pgq.queues AS q WHERE q.name = job.queue;
    IF restricted IS NOT NULL AND NOT pgq._may(job.queue, restricted, 'enqueue') THEN
        PERFORM pgq._denied(job.queue, 'enqueue');
    END IF;
    IF job.state NOT IN ('pending', 'waiting') THEN
        RETURN false;  -- started or ended: nothing locked, nothing waited for
    END IF;
    SELECT l.id, l.state INTO locked FROM pgq._lock_unstarted(job.id) AS l;
    IF locked.id IS NULL OR locked.state NOT IN ('pending', 'waiting') THEN
        RETURN false;  -- a claim (or another transaction) holds it, or it has started since it was read
    END IF;
    SELECT * INTO job FROM pgq.jobs AS j WHERE j.id = update_job.id;  -- as locked
    IF update_job.run_at >= job.start_by THEN
        PERFORM pgq._bad_argument('run_at',
            format('must be earlier than the job''s start_by (%s), got %s', job.start_by, update_job.run_at),
            'A job is claimed at run_at at the earliest, and one not claimed by start_by is cancelled.');
    END IF;
    UPDATE pgq.jobs AS j
    SET payload = coalesce(update_job.payload, j.payload), priority = coalesce(update_job.priority, j.priority),
        run_at = coalesce(update_job.run_at, j.run_at), meta = coalesce(update_job.meta, j.meta)
    WHERE j.id = job.id;
    PERFORM pgq._admin_event(job, 'updated', job.state,
        concat_ws(', ', CASE WHEN update_job.payload IS NOT NULL THEN 'payload' END,
                  CASE WHEN update_job.priority IS NOT NULL THEN 'priority' END,
                  CASE WHEN update_job.run_at IS NOT NULL THEN 'run_at' END,
                  CASE WHEN update_job.meta IS NOT NULL THEN 'meta' END));
    IF job.state = 'pending' AND coalesce(update_job.run_at, job.run_at) <= pgq._now() THEN
        PERFORM pgq._notify(job.queue);
    END IF;
    RETURN true;
END
$$;
COMMENT ON FUNCTION pgq.update_job(bigint, jsonb, integer, timestamptz, jsonb) IS
    'Gives a pending or waiting job that no claim holds the payload, priority, run_at and meta named '
    '(NULL keeps its own); true when changed, false when it had started or ended. For admins and the '
    'login that enqueued it (P0002 for anyone else, as for an unknown id). Never waits for a worker.';
