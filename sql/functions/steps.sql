-- sql/functions/steps.sql: durable execution's steps: get_step, get_steps, record_step, job_steps,
-- and the durable sleep.
--
-- A handler is a sequence of named steps; a step whose result is recorded never runs again, whatever
-- crashes, and the job's next attempts read what its earlier ones recorded (pgq.steps, one row per
-- job and name, kept across retries, snoozes, sleeps and waits, deleted with the job by pgq.prune).
-- A step is fenced like every owner operation: only the job's current attempt (running, its attempt
-- number), from the login that claimed it (or a member of pgq_admin), reads or records; any other
-- call gets the documented "not yours" answer (false, NULL or no row) and leaves a `rejected` event
-- (pgq._reject), never an exception. The first record of a name wins: a later record of the same
-- name keeps the first and answers true, so a record repeated after an ambiguous commit is
-- answered as the first. record_step holds the job's row FOR SHARE to its commit: a claim or a
-- sweep that would take the job from an attempt whose lease has passed skips it meanwhile (SKIP
-- LOCKED), and a record that comes after such a reclaim finds the new attempt and is rejected. So
-- a step recorded in the caller's own transaction, with the step's own writes, commits with them
-- or not at all, and only while its attempt is the job's (record it last, just before COMMIT: the
-- job's renewals wait for that transaction meanwhile).
--
-- Names: 1 to 256 characters, the handler's to choose. A name used again in one run (a loop) must
-- be told apart by the handler (pgq_thin's convention: the n-th call of a name, n >= 2, is name#n):
-- ('charge', 'charge#2', 'charge#3'). Names beginning with 'signal:' are pgq.await_signal's: it
-- records a wait's outcome under signal:<name of the signal>; record_step refuses them.

-- Validates a step's name: 22004 when NULL, 22023 when empty, longer than 256 characters or (for
-- a name to record, `recording`) one of pgq.await_signal's 'signal:' names.
CREATE OR REPLACE FUNCTION pgq._check_step_name(argument text, name text, recording boolean) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    IF _check_step_name.name IS NULL THEN
        PERFORM pgq._bad_argument(_check_step_name.argument, 'must not be NULL');
    ELSIF length(_check_step_name.name) NOT BETWEEN 1 AND (CASE WHEN recording THEN 256 ELSE 263 END) THEN
        PERFORM pgq._bad_argument(_check_step_name.argument,
            format('must be 1 to 256 characters long, got %s', length(_check_step_name.name)),
            'Tell repeated steps apart by a number: ''charge#2''.');
    ELSIF _check_step_name.recording AND starts_with(_check_step_name.name, 'signal:') THEN
        PERFORM pgq._bad_argument(_check_step_name.argument,
            format('must not begin with ''signal:'', got %s', left(quote_literal(_check_step_name.name), 80)),
            'Names beginning with signal: hold pgq.await_signal''s outcomes.');
    END IF;
END
$$;

-- Validates a step's result: a JSON value (a jsonb null for a step without one), at most 1 MiB.
CREATE OR REPLACE FUNCTION pgq._check_step_result(result jsonb) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    IF _check_step_result.result IS NULL THEN
        PERFORM pgq._bad_argument('result', 'must not be NULL', 'A step without a result records ''null''::jsonb.');
    ELSIF pgq._jsonb_size(_check_step_result.result) > 1048576 THEN
        PERFORM pgq._bad_argument('result',
            format('is %s bytes; the limit is 1048576 (1 MiB)', pgq._jsonb_size(_check_step_result.result)),
            'Store large results in a table of your own (a step with transaction=True writes it with its record).');
    END IF;
END
$$;

-- The row of the caller's running attempt of job `id`, locked FOR SHARE (`share`) or FOR NO KEY
-- UPDATE, or NULL when the attempt is not the caller's (stale, another login's, not running, an
-- unknown id). The fence of every durable owner call that writes.
CREATE OR REPLACE FUNCTION pgq._own_attempt(id bigint, attempt integer, share boolean) RETURNS pgq.jobs
    LANGUAGE plpgsql
    AS $$
DECLARE
    job pgq.jobs;
BEGIN
    IF _own_attempt.share THEN
        SELECT * INTO job FROM pgq.jobs AS j
        WHERE j.id = _own_attempt.id AND j.attempt = _own_attempt.attempt AND j.state = 'running'
          AND pgq._owns(j.session_role)
        FOR SHARE;
    ELSE
        SELECT * INTO job FROM pgq.jobs AS j
        WHERE j.id = _own_attempt.id AND j.attempt = _own_attempt.attempt AND j.state = 'running'
          AND pgq._owns(j.session_role)
        FOR NO KEY UPDATE;
    END IF;
    RETURN job;
END
$$;

-- A step's recorded result for the caller's running attempt: found true and the result, found
-- false and NULL while it has none; no row when the attempt is not the caller's (and a rejected
-- event). One statement on the hot path: the fence and the step by their primary keys.
CREATE OR REPLACE FUNCTION pgq.get_step(id bigint, attempt integer, name text)
    RETURNS TABLE (found boolean, result jsonb)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
#variable_conflict use_column
BEGIN
    IF get_step.id IS NULL OR get_step.attempt IS NULL OR get_step.name IS NULL
       OR length(get_step.name) NOT BETWEEN 1 AND 263 THEN
        PERFORM pgq._check_fence(get_step.id, get_step.attempt);
        PERFORM pgq._check_step_name('name', get_step.name, false);
    END IF;
    RETURN QUERY
    SELECT s.result IS NOT NULL, s.result
    FROM pgq.jobs AS j
    LEFT JOIN pgq.steps AS s ON s.job_id = j.id AND s.name = get_step.name
    WHERE j.id = get_step.id AND j.attempt = get_step.attempt AND j.state = 'running'
      AND pgq._owns(j.session_role);
    IF NOT FOUND THEN
        PERFORM pgq._reject(get_step.id, get_step.attempt, 'get_step');
    END IF;
END
$$;
COMMENT ON FUNCTION pgq.get_step(bigint, integer, text) IS
    'The recorded result of the caller''s running attempt''s step name: (true, result), or (false, '
    'NULL) while it has none; no row when the attempt is not the caller''s.';

-- The recorded steps of the caller's running job, in name order after after_name, at most
-- limit_rows (1 to 10000): what a worker reads once per attempt, so that each step of the run
-- then costs one call (its record) or none (already recorded). No row when the attempt is not the
-- caller's (and a rejected event).
CREATE OR REPLACE FUNCTION pgq.get_steps(id bigint, attempt integer, after_name text DEFAULT NULL,
                                         limit_rows integer DEFAULT 1000)
    RETURNS TABLE (name text, result jsonb)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
#variable_conflict use_column
BEGIN
    PERFORM pgq._check_fence(get_steps.id, get_steps.attempt);
    IF get_steps.limit_rows IS NULL OR get_steps.limit_rows NOT BETWEEN 1 AND 10000 THEN
        PERFORM pgq._bad_argument('limit_rows',
            format('must be between 1 and 10000, got %s', coalesce(get_steps.limit_rows::text, 'NULL')),
            'Page with after_name => the last name of the previous page.');
    END IF;
    IF NOT EXISTS (SELECT FROM pgq.jobs AS j
                   WHERE j.id = get_steps.id AND j.attempt = get_steps.attempt AND j.state = 'running'
                     AND pgq._owns(j.session_role)) THEN
        PERFORM pgq._reject(get_steps.id, get_steps.attempt, 'get_steps');
        RETURN;
    END IF;
    RETURN QUERY
    SELECT s.name, s.result FROM pgq.steps AS s
    WHERE s.job_id = get_steps.id AND (get_steps.after_name IS NULL OR s.name > get_steps.after_name)
    ORDER BY s.job_id, s.name
    LIMIT get_steps.limit_rows;
END
$$;
COMMENT ON FUNCTION pgq.get_steps(bigint, integer, text, integer) IS
    'The recorded steps (name, result) of the caller''s running attempt''s job, in name order after '
    'after_name, at most limit_rows; no row when the attempt is not the caller''s.';

-- Records a step of the caller's running attempt: true (the first record of a name wins; a later
-- one keeps it and answers true as well); false when the attempt is not the caller's (and a
-- rejected event). The job's row is held FOR SHARE to the caller's commit (see above).
CREATE OR REPLACE FUNCTION pgq.record_step(id bigint, attempt integer, name text, result jsonb)
    RETURNS boolean
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
BEGIN
    -- Every argument in one plain expression: only a call that fails it runs the checks that name
    -- the bad one.
    IF NOT coalesce(length(record_step.name) BETWEEN 1 AND 256 AND NOT starts_with(record_step.name, 'signal:')
                    AND pgq._jsonb_size(record_step.result) <= 1048576
                    AND record_step.id IS NOT NULL AND record_step.attempt IS NOT NULL, false) THEN
        PERFORM pgq._check_fence(record_step.id, record_step.attempt);
        PERFORM pgq._check_step_name('name', record_step.name, true);
        PERFORM pgq._check_step_result(record_step.result);
    END IF;
    PERFORM FROM pgq.jobs AS j
    WHERE j.id = record_step.id AND j.attempt = record_step.attempt AND j.state = 'running'
      AND pgq._owns(j.session_role)
    FOR SHARE;
    IF NOT FOUND THEN
        PERFORM pgq._reject(record_step.id, record_step.attempt, 'record_step');
        RETURN false;
    END IF;
    INSERT INTO pgq.steps (job_id, name, attempt, result)
    VALUES (record_step.id, record_step.name, record_step.attempt, record_step.result)
    ON CONFLICT ON CONSTRAINT steps_pkey DO NOTHING;
    RETURN true;
END
$$;
COMMENT ON FUNCTION pgq.record_step(bigint, integer, text, jsonb) IS
    'Records step name of the caller''s running attempt with its result (the first record of a name '
    'wins; a later one keeps it: true); false when the attempt is not the caller''s.';

-- A job's recorded steps: name, the attempt that recorded it, result and when, in name order after
-- after_name, at most limit_rows (1 to 10000), for whoever may read the job's result
-- (pgq._reads_result, pgq.job_result's rule); P0002 for anyone else, as for an unknown id. An
-- archived job (archive.sql) has none: a job with steps stays in pgq.jobs.
CREATE OR REPLACE FUNCTION pgq.job_steps(id bigint, limit_rows integer DEFAULT 1000, after_name text DEFAULT NULL)
    RETURNS TABLE (name text, attempt integer, result jsonb, recorded_at timestamptz)
    LANGUAGE plpgsql STABLE
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
#variable_conflict use_column
DECLARE
    job pgq.jobs;
BEGIN
    IF job_steps.id IS NULL THEN
        PERFORM pgq._bad_argument('id', 'must not be NULL');
    ELSIF job_steps.limit_rows IS NULL OR job_steps.limit_rows NOT BETWEEN 1 AND 10000 THEN
        PERFORM pgq._bad_argument('limit_rows',
            format('must be between 1 and 10000, got %s', coalesce(job_steps.limit_rows::text, 'NULL')),
            'Page with after_name => the last name of the previous page.');
    END IF;
    SELECT * INTO job FROM pgq.jobs AS j WHERE j.id = job_steps.id;
    IF NOT FOUND THEN
        job := pgq._archived_job(job_steps.id);  -- archived (archive.sql), or NULLs
    END IF;
    IF job.id IS NULL OR NOT pgq._reads_result(session_user, job.queue,
                                          (SELECT q.restricted FROM pgq.queues AS q WHERE q.name = job.queue),
                                          job.enqueued_by) THEN
        RAISE EXCEPTION 'pgq: no job with id %', job_steps.id
            USING ERRCODE = 'no_data_found',
                  HINT = 'A job''s steps are read by whoever may read its result (pgq.job_result).';
    END IF;
    RETURN QUERY
    SELECT s.name, s.attempt, s.result, s.recorded_at FROM pgq.steps AS s
    WHERE s.job_id = job_steps.id AND (job_steps.after_name IS NULL OR s.name > job_steps.after_name)
    ORDER BY s.job_id, s.name
    LIMIT job_steps.limit_rows;
END
$$;
COMMENT ON FUNCTION pgq.job_steps(bigint, integer, text) IS
    'A job''s recorded steps (name, attempt, result, recorded_at) in name order, for whoever may read '
    'its result (pgq.job_result''s rule); P0002 for anyone else.';

-- The durable sleep: step `name` records the wake time, now + delay, once (a later call of the same
-- step reads it back: a job that runs again sleeps until the first call's time, not longer). While
-- that time is ahead, the attempt ends as pgq.snooze ends it (pending again at that time, no
-- attempt used, the lease and the worker's slot given up): ('sleeping', the wake time); the handler
-- returns without completing, and the job's next attempt runs from the top with its steps. Once it
-- has passed: ('awake', the wake time), and the handler goes on. No row when the attempt is not the
-- caller's (a repeat after an ambiguous commit of the snooze answers 'sleeping' again). The same as
-- pgq.record_step(id, attempt, name, jsonb_build_object('until', now() + delay)), then
-- pgq.get_step's until and, while it is ahead, pgq.snooze(id, attempt, until - now()), in one call.
CREATE OR REPLACE FUNCTION pgq.sleep(id bigint, attempt integer, name text, delay interval)
    RETURNS TABLE (status text, wake_at timestamptz)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
#variable_conflict use_column
DECLARE
    job pgq.jobs;
    recorded jsonb;
    until timestamptz;
BEGIN
    PERFORM pgq._check_fence(sleep.id, sleep.attempt);
    PERFORM pgq._check_step_name('name', sleep.name, true);
    PERFORM pgq._check_interval('delay', sleep.delay, interval '365 days');
    job := pgq._own_attempt(sleep.id, sleep.attempt, false);
    IF job.id IS NULL THEN
        -- A repeat after an ambiguous commit: this attempt's sleep, by this login.
        RETURN QUERY SELECT 'sleeping'::text, j.run_at FROM pgq.jobs AS j
                     WHERE j.id = sleep.id AND j.attempt = sleep.attempt AND j.state = 'pending'
                       AND j.last_event = 'snoozed' AND pgq._same_login(j.session_role);
        IF NOT FOUND THEN
            PERFORM pgq._reject(sleep.id, sleep.attempt, 'sleep');
        END IF;
        RETURN;
    END IF;
    INSERT INTO pgq.steps (job_id, name, attempt, result)
    VALUES (sleep.id, sleep.name, sleep.attempt, jsonb_build_object('until', pgq._now() + sleep.delay))
    ON CONFLICT ON CONSTRAINT steps_pkey DO NOTHING;
    SELECT s.result INTO recorded FROM pgq.steps AS s WHERE s.job_id = sleep.id AND s.name = sleep.name;
    IF jsonb_typeof(recorded -> 'until') IS DISTINCT FROM 'string' THEN
        PERFORM pgq._bad_argument('name', format('names step %s of job %s, which is no sleep',
                                                 left(quote_literal(sleep.name), 80), sleep.id),
            'A sleep records {"until": <time>}; give it a name of its own.');
    END IF;
    until := (recorded ->> 'until')::timestamptz;
    IF until <= pgq._now() THEN
        RETURN QUERY SELECT 'awake'::text, until;
        RETURN;
    END IF;
    RETURN QUERY SELECT 'sleeping'::text, pgq.snooze(sleep.id, sleep.attempt, until - pgq._now());
END
$$;
COMMENT ON FUNCTION pgq.sleep(bigint, integer, text, interval) IS
    'A durable sleep: step name records now + delay once; while it is ahead the attempt ends as '
    'pgq.snooze ends it (''sleeping'', the wake time), after it (''awake'', the wake time); no row when '
    'the attempt is not the caller''s.';
