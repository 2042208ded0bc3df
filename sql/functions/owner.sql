-- sql/functions/owner.sql: the owner operations, fenced by (id, attempt, state = 'running') and
-- the login: renew, complete, complete_many, fail, release, snooze, mark_unknown, progress.

-- Records a rejected write by an owner that no longer owns the job (a stale attempt), so that a
-- duplicate execution can be diagnosed from pgq.job_events. Writes nothing for unknown ids or
-- for queues with audit off. The rejections of one job by one login, of one operation while the
-- job is in one state, are at most two events however many calls and whatever attempts they name
-- (issue 24: keyed on the attempt too, a flood naming attempts 1000 to 4000 wrote 3,001 events):
-- the first names the first attempt named and counts (times) the rejections that named it again;
-- the second names the latest other attempt, and counts all the rejections that named another one.
-- A rejection after the job moved on (say from running to done) starts over, as does one by another
-- login (so one login's flood cannot hide another's forged calls in its count).
-- Rejections of one job by one login take turns, so that two concurrent ones cannot both find no
-- event and both write one: each inserts the row 'reject <job> <login>' of pgq.turns (a row of
-- pgq's own table, which no login but the owner can lock; it was an advisory lock, which any login
-- could hold) and deletes it again, so the next one waits for its commit. Only that login's other
-- rejections of that job ever hold the row, and one waits for them at most lock_timeout (500 ms):
-- a rejected call answers "not yours" at once whatever happens, and a rejection that could not
-- take its turn in time (its login's other call on the job sits in an open transaction) is not
-- recorded. A renewal is never held up by a rejection it has nothing to do with.
CREATE OR REPLACE FUNCTION pgq._reject(job_id bigint, attempt integer, operation text, times integer DEFAULT 1)
    RETURNS void
    LANGUAGE plpgsql
    SET lock_timeout = '500ms'
    AS $$
DECLARE
    job pgq.jobs;
    turn text := format('reject %s %s', _reject.job_id, session_user);
BEGIN
    SELECT j.* INTO job FROM pgq.jobs AS j JOIN pgq.queues AS q ON q.name = j.queue AND q.audit
    WHERE j.id = _reject.job_id;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    BEGIN
        INSERT INTO pgq.turns AS t (name) VALUES (turn) ON CONFLICT DO NOTHING;
        PERFORM FROM pgq.turns AS t WHERE t.name = turn FOR UPDATE;
        PERFORM pgq._record_rejection(job, _reject.attempt, _reject.operation, _reject.times);
        DELETE FROM pgq.turns AS t WHERE t.name = turn;
    EXCEPTION WHEN lock_not_available THEN
        RETURN;  -- not recorded: see above
    END;
END
$$;

-- pgq._reject's record of one rejection of `job` (as read before its turn), under its turn.
CREATE OR REPLACE FUNCTION pgq._record_rejection(job pgq.jobs, attempt integer, operation text, times integer)
    RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    seen bigint[];        -- the events of this key, oldest first: at most two
    first_attempt integer;
    new_note text;
BEGIN
    new_note := format('%s from attempt %s rejected: the job is %s at attempt %s (last claimed by %s%s)',
                   _record_rejection.operation, _record_rejection.attempt, job.state, job.attempt,
                   job.claimed_by,
                   CASE WHEN NOT pgq._same_login(job.session_role) THEN ', login ' || job.session_role END);
    -- The key of "the same rejections": job, operation, the job's state and the login that made the
    -- call (one more condition per column that should tell rejections apart).
    SELECT array_agg(e.id ORDER BY e.id), (array_agg(e.attempt ORDER BY e.id))[1] INTO seen, first_attempt
    FROM (SELECT x.id, x.attempt FROM pgq.job_events AS x
          WHERE x.job_id = job.id AND x.event = 'rejected'
            AND starts_with(x.note, _record_rejection.operation || ' from attempt ') AND x.from_state = job.state
            AND x.session_role IS NOT DISTINCT FROM session_user
          ORDER BY x.id LIMIT 2) AS e;
    IF first_attempt = _record_rejection.attempt THEN
        UPDATE pgq.job_events AS e SET times = e.times + _record_rejection.times
        WHERE e.job_id = job.id AND e.id = seen[1];
    ELSIF cardinality(seen) = 2 THEN
        UPDATE pgq.job_events AS e
        SET times = e.times + _record_rejection.times, attempt = _record_rejection.attempt, note = new_note,
            at = clock_timestamp()
        WHERE e.job_id = job.id AND e.id = seen[2];
    ELSE
        INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state, note, times)
        VALUES (job.id, _record_rejection.attempt, NULL, 'rejected', job.state, NULL, new_note,
                _record_rejection.times);
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION pgq.renew(id bigint, attempt integer, lease interval DEFAULT NULL)
    RETURNS timestamptz
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
DECLARE
    new_lease timestamptz;
BEGIN
    PERFORM pgq._check_fence(renew.id, renew.attempt);
    IF renew.lease IS NOT NULL THEN
        PERFORM pgq._check_interval('lease', renew.lease, interval '1 day');
    END IF;
    -- Never past the attempt's deadline; at the deadline there is no lease left to give.
    UPDATE pgq.jobs AS j
    SET lease_until = least(pgq._now() + coalesce(renew.lease,
                                                  (SELECT q.lease FROM pgq.queues AS q WHERE q.name = j.queue)),
                            j.deadline)
    WHERE j.id = renew.id AND j.attempt = renew.attempt AND j.state = 'running'
      AND (j.deadline IS NULL OR j.deadline > pgq._now()) AND pgq._owns(j.session_role)
    RETURNING j.lease_until INTO new_lease;
    IF NOT FOUND AND NOT EXISTS (SELECT FROM pgq.jobs AS j
                                 WHERE j.id = renew.id AND j.attempt = renew.attempt
                                   AND j.state = 'running' AND j.deadline <= pgq._now()
                                   AND pgq._owns(j.session_role)) THEN
        PERFORM pgq._reject(renew.id, renew.attempt, 'renew');
    END IF;
    RETURN new_lease;
END
$$;
COMMENT ON FUNCTION pgq.renew(bigint, integer, interval) IS
    'Extends the lease of the caller''s attempt from the database clock, never past its deadline; '
    'NULL when not yours or at the deadline.';

-- Ephemeral queues (pgq.configure_queue's keep_done false): deletes the jobs `ids` that the
-- caller (pgq.complete, pgq.complete_many; so pgq.complete_and_claim) has just completed in such a
-- queue, in the completing transaction and after their end's effects (the trigger jobs_ended ran in
-- the completing statement: the end is counted in the finished counters, its dependants moved on,
-- a batch's count taken), with their events and steps (pgq._delete_jobs, as pgq.prune deletes
-- them). Kept, for the queue's retention, is a done job someone reads after its end: one enqueued
-- with notify_finished (pgq.job_result), a batch member (the batch's status), a job of a durable
-- workflow (its parent's pgq.job_outcomes), one with a unique_key (enqueue's unique_for), one that
-- jobs were enqueued to depend on (their pgq.dependency_results; pgq.job_dependants keeps every
-- such link), and one that an enqueue in flight holds FOR KEY SHARE (it names it in depends_on and
-- reads it not ended: pgq._read_dependencies; its check finds it done and releases the new job).
-- That one is skipped (SKIP LOCKED), never waited for. Returns how many it deleted.
-- The caller completed `ids` in this transaction and holds their rows: no test of their state,
-- which would let the planner read jobs_retention_idx's done jobs (and the dead entries of those
-- deleted before) instead of the primary key. (PL/pgSQL: pgq._delete_jobs comes later, in admin.sql.)
CREATE OR REPLACE FUNCTION pgq._drop_completed(ids bigint[]) RETURNS integer
    LANGUAGE plpgsql
    SET enable_seqscan = off
    SET plan_cache_mode = force_generic_plan  -- (planned once per session: by primary key)
    AS $$
BEGIN
    RETURN pgq._delete_jobs(ARRAY(
        SELECT j.id FROM pgq.jobs AS j
        WHERE j.id = ANY (_drop_completed.ids)
          AND NOT j.notify_finished AND j.batch_id IS NULL AND j.workflow_id IS NULL
          AND j.parent_id IS NULL AND j.unique_key IS NULL
          AND NOT EXISTS (SELECT FROM pgq.job_dependants AS d WHERE d.depends_on = j.id)
        ORDER BY j.id
        FOR UPDATE OF j SKIP LOCKED));
END
$$;

CREATE OR REPLACE FUNCTION pgq.complete(id bigint, attempt integer, result jsonb DEFAULT NULL)
    RETURNS boolean
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
DECLARE
    ephemeral boolean;  -- its queue deletes done jobs (keep_done false)
BEGIN
    IF complete.id IS NULL OR complete.attempt IS NULL THEN  -- a plain expression: no query on the hot path
        PERFORM pgq._check_fence(complete.id, complete.attempt);
    END IF;
    IF pgq._jsonb_size(complete.result) > 1048576 THEN
        PERFORM pgq._bad_argument('result',
            format('is %s bytes; the limit is 1048576 (1 MiB)', pgq._jsonb_size(complete.result)),
            'Store large results in a table of your own.');
    END IF;
    WITH completed AS (
        UPDATE pgq.jobs AS j
        SET state = 'done', result = complete.result, lease_until = NULL, finished_at = pgq._now(),
            last_event = 'completed', session_role = session_user
        FROM pgq.queues AS q  -- its queue's audit and keep_done (one probe, which the events' join was)
        WHERE j.id = complete.id AND j.attempt = complete.attempt AND j.state = 'running'
          AND pgq._owns(j.session_role)
          AND q.name = j.queue
        RETURNING j.id, j.attempt, j.claimed_by, q.audit, q.keep_done
    ), events AS (
        INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state)
        SELECT c.id, c.attempt, c.claimed_by, 'completed', 'running', 'done'
        FROM completed AS c WHERE c.audit
    )
    -- (One row at most, by primary key: no aggregate, whose set-up cost a queue that keeps its done
    -- jobs would pay on every call.)
    SELECT NOT c.keep_done INTO ephemeral FROM completed AS c;
    IF FOUND THEN
        IF ephemeral THEN
            PERFORM pgq._drop_completed(ARRAY[complete.id]);
        END IF;
        RETURN true;
    END IF;
    -- Idempotent: the same attempt already completed it (a retry after an ambiguous commit), by
    -- this login. (A job of a keep_done false queue that was deleted as it completed is not found:
    -- the retry is answered false, as for a job that never was.)
    IF EXISTS (SELECT FROM pgq.jobs AS j
               WHERE j.id = complete.id AND j.attempt = complete.attempt AND j.state = 'done'
                 AND j.last_event = 'completed' AND pgq._same_login(j.session_role)) THEN
        RETURN true;
    END IF;
    PERFORM pgq._reject(complete.id, complete.attempt, 'complete');
    RETURN false;
END
$$;
COMMENT ON FUNCTION pgq.complete(bigint, integer, jsonb) IS
    'Marks the caller''s attempt done; false when not yours. Repeating it returns true again (false '
    'once a keep_done false queue has deleted it).';

CREATE OR REPLACE FUNCTION pgq.complete_many(ids bigint[], attempts integer[])
    RETURNS SETOF bigint
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    -- The custom plan of the completing statement cost a re-plan per call (1.6 ms of a 4-job
    -- call here, 0.7 ms with the generic plan, which reads every pair by primary key).
    SET plan_cache_mode = force_generic_plan
    AS $$
DECLARE
    done_ids  bigint[];
    members   bigint[];  -- the batch of each completed job that is a batch's member
    ephemeral bigint[];  -- the completed jobs of queues that delete done jobs (keep_done false)
BEGIN
    IF complete_many.ids IS NULL THEN
        PERFORM pgq._bad_argument('ids', 'must not be NULL');
    ELSIF complete_many.attempts IS NULL THEN
        PERFORM pgq._bad_argument('attempts', 'must not be NULL');
    ELSIF cardinality(complete_many.ids) <> cardinality(complete_many.attempts) THEN
        PERFORM pgq._bad_argument('attempts',
            format('must have as many elements as ids (%s), got %s',
                   cardinality(complete_many.ids), cardinality(complete_many.attempts)));
    ELSIF array_position(complete_many.ids, NULL) IS NOT NULL
          OR array_position(complete_many.attempts, NULL) IS NOT NULL THEN
        PERFORM pgq._bad_argument('ids', 'must not contain NULL (nor may attempts)');
    END IF;

    -- Batch members' ends are counted below, one shard update per batch, not one per job by the
    -- trigger: the statement that completes them leaves its mark for the trigger in pgq.turns
    -- (pgq._batch_counting_mark: this transaction's, and its own trigger depth's, so the ends its
    -- triggers cascade to are counted as usual), taken away right after. A row of pgq's own table:
    -- no caller can write one (a session setting, which it was, any caller could).
    WITH wanted AS MATERIALIZED (
        SELECT w.id, w.attempt FROM unnest(complete_many.ids, complete_many.attempts) AS w(id, attempt)
    ), owned AS (
        -- Lock in id order, so concurrent batches never deadlock.
        SELECT j.id, j.attempt
        FROM pgq.jobs AS j JOIN wanted AS w ON w.id = j.id AND w.attempt = j.attempt
        WHERE j.state = 'running' AND pgq._owns(j.session_role)
        ORDER BY j.id
        FOR NO KEY UPDATE OF j
    ), completed AS (
        -- (The pairs through `owned` only: joined to `wanted` again, the generic plan, which
        -- expects 10 pairs, scanned all of them once per job: 36 s for a call of 20,000. `wanted`
        -- stays MATERIALIZED: inlined into `owned`, a call of 64 cost 10k instructions a job more.)
        UPDATE pgq.jobs AS j
        SET state = 'done', lease_until = NULL, finished_at = pgq._now(), last_event = 'completed',
            session_role = session_user
        FROM owned AS o, pgq.queues AS q  -- (q: audit and keep_done, the probe the events' join was)
        WHERE j.id = o.id AND j.attempt = o.attempt AND j.state = 'running'
          AND pgq._owns(j.session_role)
          AND q.name = j.queue
        RETURNING j.id, j.attempt, j.claimed_by, j.batch_id, q.audit, q.keep_done
    ), events AS (
        INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state)
        SELECT c.id, c.attempt, c.claimed_by, 'completed', 'running', 'done'
        FROM completed AS c WHERE c.audit
    ), mark AS (
        INSERT INTO pgq.turns (name)
        SELECT pgq._batch_counting_mark(pg_trigger_depth() + 1)
        FROM completed AS c WHERE c.batch_id IS NOT NULL LIMIT 1
    )
    SELECT coalesce(array_agg(c.id), '{}'), array_agg(c.batch_id) FILTER (WHERE c.batch_id IS NOT NULL),
           array_agg(c.id) FILTER (WHERE NOT c.keep_done)
    INTO done_ids, members, ephemeral FROM completed AS c;
    IF members IS NOT NULL THEN
        DELETE FROM pgq.turns AS t WHERE t.name = pgq._batch_counting_mark(pg_trigger_depth() + 1);
        PERFORM pgq._batch_member_ended(m.batch, 'done', m.n::integer)
        FROM (SELECT b.batch, count(*) AS n FROM unnest(members) AS b(batch) GROUP BY b.batch ORDER BY b.batch) AS m;
    END IF;
    IF ephemeral IS NOT NULL THEN
        PERFORM pgq._drop_completed(ephemeral);
    END IF;
    -- The common case ends here: every pair was still ours and is done now.
    IF cardinality(done_ids) = cardinality(complete_many.ids) THEN
        RETURN QUERY SELECT unnest(done_ids);
        RETURN;
    END IF;

    -- Some pair was not completed just now. This statement sees the rows completed above, so
    -- a pair counts as ours when its job is done by that same attempt: completed above, or
    -- earlier (idempotent: a retry after an ambiguous commit). The other pairs are stale: they
    -- leave the trace a rejected pgq.complete leaves, so that a duplicate execution can be
    -- diagnosed from pgq.job_events whichever call the worker used; a pair repeated in the call
    -- (or rejected before) is recorded once, with the number of times (pgq._reject).
    PERFORM pgq._reject(r.id, r.attempt, 'complete_many', r.times::integer)
    FROM (SELECT w.id, w.attempt, count(*) AS times
          FROM unnest(complete_many.ids, complete_many.attempts) AS w(id, attempt)
          JOIN pgq.jobs AS j ON j.id = w.id AND j.id = ANY (complete_many.ids)
          JOIN pgq.queues AS q ON q.name = j.queue AND q.audit
          WHERE NOT (j.attempt = w.attempt AND j.state = 'done' AND j.last_event = 'completed'
                     AND pgq._same_login(j.session_role))
          GROUP BY w.id, w.attempt
          ORDER BY w.id, w.attempt) AS r;

    -- The ids drive both statements by primary key (= ANY): a join to the pairs let the generic
    -- plan read every finished job through jobs_finished_idx instead.
    RETURN QUERY
    SELECT unnest(done_ids)
    UNION
    SELECT j.id
    FROM pgq.jobs AS j
    WHERE j.id = ANY (complete_many.ids) AND j.state = 'done' AND j.last_event = 'completed'
      AND pgq._same_login(j.session_role)
      AND (j.id, j.attempt) IN (SELECT w.id, w.attempt
                                FROM unnest(complete_many.ids, complete_many.attempts) AS w(id, attempt));
END
$$;
COMMENT ON FUNCTION pgq.complete_many(bigint[], integer[]) IS
    'Completes each (id, attempt) pair the caller still owns; returns the ids completed (a repeat '
    'leaves out those a keep_done false queue has deleted).';

CREATE OR REPLACE FUNCTION pgq.fail(id bigint, attempt integer, error text, retry_in interval DEFAULT NULL,
                         retryable boolean DEFAULT true)
    RETURNS text
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
DECLARE
    new_state pgq.job_state;
    stored_error text := left(fail.error, 65536);
BEGIN
    IF fail.id IS NULL OR fail.attempt IS NULL THEN  -- a plain expression: no query on the hot path
        PERFORM pgq._check_fence(fail.id, fail.attempt);
    END IF;
    IF fail.error IS NULL THEN
        PERFORM pgq._bad_argument('error', 'must not be NULL', 'Say why the attempt failed.');
    END IF;
    IF fail.retryable IS NULL THEN
        PERFORM pgq._bad_argument('retryable', 'must not be NULL');
    END IF;
    IF fail.retry_in IS NOT NULL THEN
        PERFORM pgq._check_interval('retry_in', fail.retry_in, interval '365 days');
    END IF;

    WITH failed AS (
        UPDATE pgq.jobs AS j
        SET state = CASE WHEN NOT fail.retryable OR j.attempt >= j.max_attempts
                         THEN 'failed' ELSE 'pending' END::pgq.job_state,
            run_at = CASE WHEN NOT fail.retryable OR j.attempt >= j.max_attempts THEN j.run_at
                          ELSE pgq._now() + coalesce(fail.retry_in,
                                   pgq._backoff(j.attempt - j.attempt_offset, q.backoff_base, q.backoff_cap)) END,
            finished_at = CASE WHEN NOT fail.retryable OR j.attempt >= j.max_attempts
                               THEN pgq._now() END,
            last_error = stored_error,
            last_event = 'failed',
            session_role = session_user,
            lease_until = NULL
        FROM pgq.queues AS q
        WHERE j.id = fail.id AND j.attempt = fail.attempt AND j.state = 'running'
          AND pgq._owns(j.session_role)
          AND q.name = j.queue
        RETURNING j.id, j.attempt, j.claimed_by, j.state, q.audit
    ), events AS (
        INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state, note)
        SELECT f.id, f.attempt, f.claimed_by, 'failed', 'running', f.state, left(stored_error, 1000)
        FROM failed AS f WHERE f.audit
    )
    SELECT f.state INTO new_state FROM failed AS f;
    IF FOUND THEN
        RETURN new_state::text;
    END IF;
    -- Idempotent: this attempt already failed (a retry after an ambiguous commit).
    SELECT j.state INTO new_state FROM pgq.jobs AS j
    WHERE j.id = fail.id AND j.attempt = fail.attempt AND j.last_event = 'failed'
      AND pgq._same_login(j.session_role);
    IF FOUND THEN
        RETURN new_state::text;
    END IF;
    PERFORM pgq._reject(fail.id, fail.attempt, 'fail');
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION pgq.fail(bigint, integer, text, interval, boolean) IS
    'Records a failed attempt: pending again after a backoff, or failed when attempts are '
    'exhausted or retryable is false. Returns the new state, NULL when not yours.';

-- Gives back a job the worker has not started (e.g. at shutdown): pending again now, without
-- using up an attempt (max_attempts is raised by one, since the attempt number never decreases).
CREATE OR REPLACE FUNCTION pgq.release(id bigint, attempt integer)
    RETURNS boolean
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
DECLARE
    changed integer;
BEGIN
    PERFORM pgq._check_fence(release.id, release.attempt);
    WITH released AS (
        UPDATE pgq.jobs AS j
        SET state = 'pending', lease_until = NULL, run_at = pgq._now(),
            max_attempts = j.max_attempts + 1, last_event = 'released', session_role = session_user
        WHERE j.id = release.id AND j.attempt = release.attempt AND j.state = 'running'
          AND pgq._owns(j.session_role)
          AND j.max_attempts - j.attempt_offset < pgq._attempt_room()
        RETURNING j.id, j.queue, j.attempt, j.claimed_by
    ), events AS (
        INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state)
        SELECT r.id, r.attempt, r.claimed_by, 'released', 'running', 'pending'
        FROM released AS r JOIN pgq.queues AS q ON q.name = r.queue AND q.audit
    )
    SELECT count(*) INTO changed FROM released;
    IF changed > 0 THEN
        PERFORM pgq._notify(j.queue) FROM pgq.jobs AS j WHERE j.id = release.id;
        RETURN true;
    END IF;
    IF EXISTS (SELECT FROM pgq.jobs AS j
               WHERE j.id = release.id AND j.attempt = release.attempt AND j.last_event = 'released'
                 AND pgq._same_login(j.session_role)) THEN
        RETURN true;
    END IF;
    -- Ours, but out of attempt room (pgq._attempt_room): refused, the job is left as it is.
    IF EXISTS (SELECT FROM pgq.jobs AS j
               WHERE j.id = release.id AND j.attempt = release.attempt AND j.state = 'running'
                 AND pgq._owns(j.session_role)) THEN
        PERFORM pgq._no_attempt_room(release.id, 'release');
    END IF;
    PERFORM pgq._reject(release.id, release.attempt, 'release');
    RETURN false;
END
$$;
COMMENT ON FUNCTION pgq.release(bigint, integer) IS
    'Gives an unstarted job back (pending now, the attempt not counted); false when not yours.';

-- Puts a job back to sleep for `delay`; the snooze does not use up an attempt.
CREATE OR REPLACE FUNCTION pgq.snooze(id bigint, attempt integer, delay interval)
    RETURNS timestamptz
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
DECLARE
    new_run_at timestamptz;
BEGIN
    PERFORM pgq._check_fence(snooze.id, snooze.attempt);
    PERFORM pgq._check_interval('delay', snooze.delay, interval '365 days');
    WITH snoozed AS (
        UPDATE pgq.jobs AS j
        SET state = 'pending', lease_until = NULL, run_at = pgq._now() + snooze.delay,
            max_attempts = j.max_attempts + 1, last_event = 'snoozed', session_role = session_user
        WHERE j.id = snooze.id AND j.attempt = snooze.attempt AND j.state = 'running'
          AND pgq._owns(j.session_role)
          AND j.max_attempts - j.attempt_offset < pgq._attempt_room()
        RETURNING j.id, j.queue, j.attempt, j.claimed_by, j.run_at
    ), events AS (
        INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state, note)
        SELECT s.id, s.attempt, s.claimed_by, 'snoozed', 'running', 'pending',
               format('until %s', s.run_at)
        FROM snoozed AS s JOIN pgq.queues AS q ON q.name = s.queue AND q.audit
    )
    SELECT s.run_at INTO new_run_at FROM snoozed AS s;
    IF FOUND THEN
        RETURN new_run_at;
    END IF;
    SELECT j.run_at INTO new_run_at FROM pgq.jobs AS j
    WHERE j.id = snooze.id AND j.attempt = snooze.attempt AND j.last_event = 'snoozed'
      AND pgq._same_login(j.session_role);
    IF FOUND THEN
        RETURN new_run_at;
    END IF;
    -- Ours, but out of attempt room (pgq._attempt_room): refused, the job is left as it is.
    IF EXISTS (SELECT FROM pgq.jobs AS j
               WHERE j.id = snooze.id AND j.attempt = snooze.attempt AND j.state = 'running'
                 AND pgq._owns(j.session_role)) THEN
        PERFORM pgq._no_attempt_room(snooze.id, 'snooze');
    END IF;
    PERFORM pgq._reject(snooze.id, snooze.attempt, 'snooze');
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION pgq.snooze(bigint, integer, interval) IS
    'Pending again after delay without using an attempt; returns the new run_at, NULL when not yours.';

-- The outside effect's outcome is unknown (a timeout after the request was sent, say): park the
-- job instead of retrying blindly. pgq.resolve settles it once someone knows.
CREATE OR REPLACE FUNCTION pgq.mark_unknown(id bigint, attempt integer, note text)
    RETURNS boolean
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
DECLARE
    changed integer;
BEGIN
    PERFORM pgq._check_fence(mark_unknown.id, mark_unknown.attempt);
    IF mark_unknown.note IS NULL THEN
        PERFORM pgq._bad_argument('note', 'must not be NULL', 'Say what is unknown and how to find out.');
    END IF;
    WITH marked AS (
        UPDATE pgq.jobs AS j
        SET state = 'outcome_unknown', lease_until = NULL, last_error = left(mark_unknown.note, 65536),
            last_event = 'marked_unknown', session_role = session_user
        WHERE j.id = mark_unknown.id AND j.attempt = mark_unknown.attempt AND j.state = 'running'
          AND pgq._owns(j.session_role)
        RETURNING j.id, j.queue, j.attempt, j.claimed_by
    ), events AS (
        INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state, note)
        SELECT m.id, m.attempt, m.claimed_by, 'marked_unknown', 'running', 'outcome_unknown',
               left(mark_unknown.note, 1000)
        FROM marked AS m JOIN pgq.queues AS q ON q.name = m.queue AND q.audit
    )
    SELECT count(*) INTO changed FROM marked;
    IF changed > 0 THEN
        RETURN true;
    END IF;
    IF EXISTS (SELECT FROM pgq.jobs AS j
               WHERE j.id = mark_unknown.id AND j.attempt = mark_unknown.attempt
                 AND j.last_event = 'marked_unknown' AND pgq._same_login(j.session_role)) THEN
        RETURN true;
    END IF;
    PERFORM pgq._reject(mark_unknown.id, mark_unknown.attempt, 'mark_unknown');
    RETURN false;
END
$$;
COMMENT ON FUNCTION pgq.mark_unknown(bigint, integer, text) IS
    'Parks the caller''s attempt as outcome_unknown; false when not yours.';

-- Records a checkpoint of the caller's attempt: a JSON object (at most 1 MiB) that replaces the
-- previous one and survives retries (pgq.claim hands it to the next attempt). Fenced like
-- pgq.complete; writes no event (a job may record progress often).
CREATE OR REPLACE FUNCTION pgq.progress(id bigint, attempt integer, progress jsonb)
    RETURNS boolean
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
BEGIN
    PERFORM pgq._check_fence(progress.id, progress.attempt);
    PERFORM pgq._check_payload('progress', progress.progress);
    UPDATE pgq.jobs AS j
    SET progress = progress.progress
    WHERE j.id = progress.id AND j.attempt = progress.attempt AND j.state = 'running'
      AND pgq._owns(j.session_role);
    IF FOUND THEN
        RETURN true;
    END IF;
    PERFORM pgq._reject(progress.id, progress.attempt, 'progress');
    RETURN false;
END
$$;
COMMENT ON FUNCTION pgq.progress(bigint, integer, jsonb) IS
    'Stores the caller''s attempt''s checkpoint on the job (kept across retries); false when not yours.';

-- The results of the caller's own running job's dependencies (its inputs), in dependency id order,
-- those with ids above after_id, at most limit_rows: paged by the last dependency_id. Fenced like
-- pgq.progress (the attempt, the login); a caller that does not own the attempt gets 55000. Each
-- dependency is read by the rule of pgq.job_result at the time of the read (pgq._reads_result):
-- one that job_result answers the caller, or answers the job's producer (the login that named it)
-- while the caller's read grants admit its queue; any other answers as one pruned since, with a
-- NULL state (issue 37: the grants were checked at the enqueue only).
CREATE OR REPLACE FUNCTION pgq.dependency_results(id bigint, attempt integer, limit_rows integer DEFAULT 100,
                                                  after_id bigint DEFAULT NULL)
    RETURNS TABLE (dependency_id bigint, state text, result jsonb, last_error text, finished_at timestamptz)
    LANGUAGE plpgsql STABLE
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET enable_seqscan = off
    AS $$
#variable_conflict use_column
DECLARE
    deps     bigint[];
    producer text;
BEGIN
    PERFORM pgq._check_fence(dependency_results.id, dependency_results.attempt);
    IF dependency_results.limit_rows IS NULL OR dependency_results.limit_rows NOT BETWEEN 1 AND 1000 THEN
        PERFORM pgq._bad_argument('limit_rows',
            format('must be between 1 and 1000, got %s', coalesce(dependency_results.limit_rows::text, 'NULL')),
            'Page with after_id => the last dependency_id of the previous page.');
    END IF;
    SELECT j.depends_on, j.enqueued_by INTO deps, producer FROM pgq.jobs AS j
    WHERE j.id = dependency_results.id AND j.attempt = dependency_results.attempt AND j.state = 'running'
      AND pgq._owns(j.session_role);
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgq: job % attempt % is not running as this login''s', dependency_results.id,
            dependency_results.attempt
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'A job''s dependency results are read by the owner of its running attempt.';
    END IF;
    RETURN QUERY
    SELECT d.id, j.state::text, j.result, j.last_error, j.finished_at
    FROM (SELECT x.id FROM unnest(deps) AS x(id)
          WHERE x.id > coalesce(dependency_results.after_id, 0)
          ORDER BY x.id LIMIT dependency_results.limit_rows) AS d
    LEFT JOIN LATERAL (SELECT y.state, y.result, y.last_error, y.finished_at
                       FROM pgq.jobs AS y JOIN pgq.queues AS q ON q.name = y.queue
                       WHERE y.id = d.id
                         AND (pgq._reads_result(session_user, y.queue, q.restricted, y.enqueued_by)
                              OR pgq._may(y.queue, q.restricted, 'read')
                                 AND pgq._reads_result(producer, y.queue, q.restricted, y.enqueued_by))) AS j ON true
    ORDER BY d.id;
END
$$;
COMMENT ON FUNCTION pgq.dependency_results(bigint, integer, integer, bigint) IS
    'The state, result, last_error and finished_at of the caller''s running job''s dependencies, in id '
    'order after after_id, at most limit_rows; 55000 when the attempt is not the caller''s.';
