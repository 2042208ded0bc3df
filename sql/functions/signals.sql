-- sql/functions/signals.sql: signals and the jobs that wait for them: pgq.signal, pgq.await_signal,
-- and the sweep's part (timeouts, and the signals' second look).
--
-- A signal is a named event of a queue (a human's approval, a webhook): pgq.signal stores it (the
-- first of a name in a queue wins, pgq.signals) and wakes the queue's jobs parked for it. A job's
-- handler asks for one with pgq.await_signal: 'arrived' with its payload, 'timed_out' once the wait
-- has passed its timeout, or 'waiting': the job is parked (state waiting, wait_signal, wake_at; its
-- attempt ends without using one up, its lease and its worker's slot are given up) until the signal
-- or the timeout, and then runs again from the top with its steps. The outcome is recorded as the
-- job's step signal:<name> (by the call, the signal's wake or the timeout, whichever decides first),
-- so every later call of the job's handler gets the same answer, whatever happens to the signal.
--
-- How a signal and a wait meet, neither waiting for the other's transaction:
--
-- * await_signal takes the job's row first (a transaction id, before anything is read), then reads
--   the signal; finding none, it parks the job. signal inserts the signal, then wakes the parked jobs
--   it sees (SKIP LOCKED: a job another transaction holds is left for later, never waited for).
-- * A wait and a signal in flight at once may not see each other: the wait reads no signal (it has
--   not committed), the signal sees no parked job (the park has not committed). So every signal
--   leaves a check (pgq.signal_checks) that pgq.sweep and pgq.settle_dependencies (which a worker
--   calls about once a second) take once the signal has committed: each look wakes the jobs then
--   parked for it, and the first look stamps the check with a transaction id taken after that
--   (its horizon). Every wait that read no signal because the signal had not committed yet took its
--   transaction id before that read, so before the horizon; once no transaction older than the
--   horizon is running (pg_snapshot_xmin), each such wait has committed (its job parked, visible to
--   the next look) or rolled back, and after that look the check goes. So a signal committed before,
--   during or after a wait wakes it: in its own transaction when the park committed first, by the
--   first look after both committed otherwise; and exactly once (a wake moves a parked job to
--   pending once, on its locked row, and its step's first record wins).
-- * The checks are shared work: one look per check per call, oldest first, the ones kept going to
--   the back. A transaction left open anywhere (any login's) keeps checks from going, not wakes from
--   happening; a producer's open transaction after pgq.signal holds only its own signal's row.
--   Two signals of one name at once take turns on the signal's key: the second waits for the first
--   at most lock_timeout (5 s), then 55P03 (if the first commits, the second would change nothing).
-- * Timeouts: the sweep (and settle) moves the parked jobs whose wake_at has passed to pending,
--   recording timed_out, oldest first, SKIP LOCKED; nothing waits for a worker.
-- No advisory lock, no session setting: the only rows locked are pgq's own (a job's, a check's, the
-- signal's key).

-- Validates a signal's name: 22004 when NULL, 22023 unless 1 to 256 characters.
CREATE OR REPLACE FUNCTION pgq._check_signal_name(name text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    IF _check_signal_name.name IS NULL THEN
        PERFORM pgq._bad_argument('name', 'must not be NULL', 'Name the signal: ''approved:order-42''.');
    ELSIF length(_check_signal_name.name) NOT BETWEEN 1 AND 256 THEN
        PERFORM pgq._bad_argument('name',
            format('must be 1 to 256 characters long, got %s', length(_check_signal_name.name)));
    END IF;
END
$$;

-- Wakes up to max_jobs jobs of `queue` parked for the signal `name` (which carries `payload`), those
-- no other transaction holds (SKIP LOCKED), in id order: each records signal:<name> = {"status":
-- "arrived", "payload": ...} and becomes pending now. The queue is notified. Returns how many.
CREATE OR REPLACE FUNCTION pgq._wake_waiters(queue text, name text, payload jsonb, max_jobs integer)
    RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    woken integer;
BEGIN
    WITH parked AS (
        SELECT j.id, j.attempt FROM pgq.jobs AS j
        WHERE j.queue = _wake_waiters.queue AND j.wait_signal = _wake_waiters.name AND j.state = 'waiting'
        ORDER BY j.id
        LIMIT _wake_waiters.max_jobs
        FOR NO KEY UPDATE SKIP LOCKED
    ), outcomes AS (
        INSERT INTO pgq.steps (job_id, name, attempt, result)
        SELECT p.id, 'signal:' || _wake_waiters.name, p.attempt,
               jsonb_build_object('status', 'arrived', 'payload', _wake_waiters.payload)
        FROM parked AS p
        ON CONFLICT ON CONSTRAINT steps_pkey DO NOTHING
    ), woke AS (
        UPDATE pgq.jobs AS j
        SET state = 'pending', run_at = pgq._now(), wait_signal = NULL, wake_at = NULL, last_event = 'signalled'
        FROM parked AS p
        WHERE j.id = p.id
        RETURNING j.id, j.attempt
    ), events AS (
        INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state, note)
        SELECT w.id, w.attempt, NULL, 'signalled', 'waiting', 'pending',
               format('signal %s arrived', left(quote_literal(_wake_waiters.name), 200))
        FROM woke AS w JOIN pgq.queues AS q ON q.name = _wake_waiters.queue AND q.audit
    )
    SELECT count(*) INTO woken FROM woke;
    IF woken > 0 THEN
        PERFORM pgq._notify(_wake_waiters.queue);
    END IF;
    RETURN woken;
END
$$;

-- Sends signal `name` to `queue` with `payload` (a JSON object, at most 1 MiB): the first of a name
-- in a queue wins, a later one changes nothing (0). In the same transaction it wakes up to 1,000 of
-- the queue's jobs parked for it (pgq._wake_waiters) and leaves a check for the rest and for the
-- waits it overlaps (above); returns how many it woke. The queue must exist (22023). Who may send
-- it: the privilege 'signal' (pgq.grant_queue), open to every producer of a queue without a signal
-- grant (42501 otherwise).
CREATE OR REPLACE FUNCTION pgq.signal(queue text, name text, payload jsonb DEFAULT '{}'::jsonb)
    RETURNS integer
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
DECLARE
    q pgq.queues;
    woken integer;
    prior_timeout text;
    first boolean;
BEGIN
    PERFORM pgq._check_name('queue', signal.queue);
    PERFORM pgq._check_signal_name(signal.name);
    PERFORM pgq._check_payload('payload', signal.payload);
    q := pgq._existing_queue('queue', signal.queue);
    IF q.restricted IS NOT NULL AND NOT pgq._may(q.name, q.restricted, 'signal') THEN
        PERFORM pgq._denied(q.name, 'signal');
    END IF;
    -- The insert waits (the signal's key) for another transaction sending this very signal, and (its
    -- foreign key) for a drop of the queue in flight: at most 5 s, or the caller's shorter
    -- lock_timeout, then 55P03.
    prior_timeout := pgq._bound_lock_timeout(interval '5 seconds');
    BEGIN
        INSERT INTO pgq.signals AS s (queue, name, payload) VALUES (signal.queue, signal.name, signal.payload)
        ON CONFLICT ON CONSTRAINT signals_pkey DO NOTHING;
        first := FOUND;
    EXCEPTION WHEN lock_not_available THEN
        RAISE EXCEPTION 'pgq: signal % of queue % is being sent by a transaction that has not ended (or the '
                        'queue is being dropped); gave up after lock_timeout %', quote_literal(signal.name),
                        quote_literal(signal.queue), current_setting('lock_timeout')
            USING ERRCODE = 'lock_not_available',
                  HINT = 'Try again once it has ended: if it committed, the signal is sent (the first of a name wins).';
    END;
    PERFORM set_config('lock_timeout', prior_timeout, true);
    IF NOT first THEN
        RETURN 0;  -- sent before: the first wins
    END IF;
    woken := pgq._wake_waiters(signal.queue, signal.name, signal.payload, 1000);
    INSERT INTO pgq.signal_checks (queue, name) VALUES (signal.queue, signal.name);
    RETURN woken;
END
$$;
COMMENT ON FUNCTION pgq.signal(text, text, jsonb) IS
    'Sends signal name to queue (the first of a name wins; a later one changes nothing) and wakes the '
    'queue''s jobs waiting for it; returns how many it woke (0 for a later one).';

-- The handler of the caller's running attempt waits for signal `name` of its job's queue:
-- ('arrived', payload) once it is sent; ('timed_out', NULL) once a wait for it has passed its
-- timeout (NULL: no timeout; at most 3650 days); else ('waiting', NULL): the job is parked (the
-- attempt ends without using one up: state waiting, no lease, max_attempts + 1) until the signal or
-- the timeout, and its handler returns without completing. The first answer other than 'waiting'
-- is the job's step signal:<name>, and every later call answers it again. The timeout runs from the
-- call that parked the job. No row when the attempt is not the caller's (and a rejected event); a
-- repeat after an ambiguous commit of the park answers 'waiting' again. 54000 when the job has
-- been given back its attempt too often (pgq._attempt_room).
CREATE OR REPLACE FUNCTION pgq.await_signal(id bigint, attempt integer, name text, timeout interval)
    RETURNS TABLE (status text, payload jsonb)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
#variable_conflict use_column
DECLARE
    job pgq.jobs;
    outcome jsonb;
    sent jsonb;
BEGIN
    PERFORM pgq._check_fence(await_signal.id, await_signal.attempt);
    PERFORM pgq._check_signal_name(await_signal.name);
    IF await_signal.timeout IS NOT NULL THEN
        PERFORM pgq._check_interval('timeout', await_signal.timeout, interval '3650 days');
    END IF;
    -- The job's row first: this transaction's id is taken before the signal is read (see above).
    job := pgq._own_attempt(await_signal.id, await_signal.attempt, false);
    IF job.id IS NULL THEN
        RETURN QUERY SELECT 'waiting'::text, NULL::jsonb FROM pgq.jobs AS j
                     WHERE j.id = await_signal.id AND j.attempt = await_signal.attempt AND j.state = 'waiting'
                       AND j.last_event = 'awaiting_signal' AND j.wait_signal = await_signal.name
                       AND pgq._same_login(j.session_role);
        IF NOT FOUND THEN
            PERFORM pgq._reject(await_signal.id, await_signal.attempt, 'await_signal');
        END IF;
        RETURN;
    END IF;
    SELECT s.result INTO outcome FROM pgq.steps AS s
    WHERE s.job_id = await_signal.id AND s.name = 'signal:' || await_signal.name;
    IF outcome IS NOT NULL THEN
        RETURN QUERY SELECT outcome ->> 'status', outcome -> 'payload';
        RETURN;
    END IF;
    SELECT s.payload INTO sent FROM pgq.signals AS s WHERE s.queue = job.queue AND s.name = await_signal.name;
    IF sent IS NOT NULL THEN
        INSERT INTO pgq.steps (job_id, name, attempt, result)
        VALUES (job.id, 'signal:' || await_signal.name, job.attempt,
                jsonb_build_object('status', 'arrived', 'payload', sent));
        RETURN QUERY SELECT 'arrived'::text, sent;
        RETURN;
    END IF;
    IF job.max_attempts - job.attempt_offset >= pgq._attempt_room() THEN
        PERFORM pgq._no_attempt_room(job.id, 'await_signal');
    END IF;
    WITH parked AS (
        UPDATE pgq.jobs AS j
        SET state = 'waiting', lease_until = NULL, max_attempts = j.max_attempts + 1,
            wait_signal = await_signal.name, wake_at = pgq._now() + await_signal.timeout,
            last_event = 'awaiting_signal', session_role = session_user
        WHERE j.id = job.id
        RETURNING j.id, j.attempt, j.claimed_by, j.wake_at
    )
    INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state, note)
    SELECT p.id, p.attempt, p.claimed_by, 'awaiting_signal', 'running', 'waiting',
           format('signal %s%s', left(quote_literal(await_signal.name), 200),
                  CASE WHEN p.wake_at IS NOT NULL THEN ' until ' || p.wake_at END)
    FROM parked AS p JOIN pgq.queues AS q ON q.name = job.queue AND q.audit;
    RETURN QUERY SELECT 'waiting'::text, NULL::jsonb;
END
$$;
COMMENT ON FUNCTION pgq.await_signal(bigint, integer, text, interval) IS
    'Waits for signal name of the job''s queue: (''arrived'', payload), (''timed_out'', NULL) once the '
    'wait passed its timeout, or (''waiting'', NULL): the job is parked (no attempt used, no lease, no '
    'slot) until then; no row when the attempt is not the caller''s.';

-- The sweep's timeouts: up to max_jobs parked jobs whose wait for a signal has passed its timeout,
-- oldest first, those no other transaction holds: each records signal:<name> = {"status":
-- "timed_out"} and becomes pending now. Returns how many.
CREATE OR REPLACE FUNCTION pgq._fire_wait_timeouts(max_jobs integer) RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    fired integer;
    due_queues text[];
BEGIN
    WITH due AS (
        SELECT j.id, j.attempt, j.wait_signal FROM pgq.jobs AS j
        WHERE j.wake_at <= pgq._now() AND j.wake_at IS NOT NULL AND j.state = 'waiting'
        ORDER BY j.wake_at
        LIMIT _fire_wait_timeouts.max_jobs
        FOR NO KEY UPDATE SKIP LOCKED
    ), outcomes AS (
        INSERT INTO pgq.steps (job_id, name, attempt, result)
        SELECT d.id, 'signal:' || d.wait_signal, d.attempt, jsonb_build_object('status', 'timed_out')
        FROM due AS d
        ON CONFLICT ON CONSTRAINT steps_pkey DO NOTHING
    ), fired AS (
        UPDATE pgq.jobs AS j
        SET state = 'pending', run_at = pgq._now(), wait_signal = NULL, wake_at = NULL, last_event = 'wait_timed_out'
        FROM due AS d
        WHERE j.id = d.id
        RETURNING j.id, j.queue, j.attempt, d.wait_signal
    ), events AS (
        INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state, note)
        SELECT f.id, f.attempt, NULL, 'wait_timed_out', 'waiting', 'pending',
               format('its wait for signal %s timed out', left(quote_literal(f.wait_signal), 200))
        FROM fired AS f JOIN pgq.queues AS q ON q.name = f.queue AND q.audit
    )
    SELECT count(*), array_agg(DISTINCT f.queue) INTO fired, due_queues FROM fired AS f;
    PERFORM pgq._notify(n.queue) FROM unnest(due_queues) AS n(queue);
    RETURN fired;
END
$$;

-- The sweep's (and settle's) look at the signals' checks (above): up to max_checks, oldest first,
-- those no other call holds; for each, its signal's parked jobs woken (at most max_jobs in all),
-- then the check goes once its horizon has passed and none is left parked, or moves to the back
-- (stamped with this call's transaction id when it had no horizon, if this call took its id after
-- reading the checks: one taken earlier may be older than the signal's commit). Runs at READ
-- COMMITTED only (each statement must see what committed before it). Returns how many it woke.
CREATE OR REPLACE FUNCTION pgq._settle_signals(max_checks integer, max_jobs integer) RETURNS integer
    LANGUAGE plpgsql
    SET enable_seqscan = off
    AS $$
DECLARE
    fresh  boolean := pg_current_xact_id_if_assigned() IS NULL;
    taken  pgq.signal_checks[];
    c      pgq.signal_checks;
    stamp  xid8;
    passed boolean;
    sent   jsonb;
    woken  integer := 0;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RETURN 0;
    END IF;
    -- Locking them takes this transaction's id, if it had none: after they were read, so after
    -- their signals committed.
    taken := ARRAY(SELECT x FROM pgq.signal_checks AS x ORDER BY x.id LIMIT _settle_signals.max_checks
                   FOR UPDATE SKIP LOCKED);
    IF cardinality(taken) = 0 THEN
        RETURN 0;
    END IF;
    IF fresh THEN
        stamp := pg_current_xact_id();
    END IF;
    FOREACH c IN ARRAY taken LOOP
        -- First whether the horizon has passed, then (a later statement, a later snapshot) the look.
        passed := c.horizon IS NOT NULL AND pg_snapshot_xmin(pg_current_snapshot()) >= c.horizon;
        SELECT s.payload INTO sent FROM pgq.signals AS s WHERE s.queue = c.queue AND s.name = c.name;
        IF sent IS NOT NULL AND woken < _settle_signals.max_jobs THEN
            woken := woken + pgq._wake_waiters(c.queue, c.name, sent, _settle_signals.max_jobs - woken);
        END IF;
        DELETE FROM pgq.signal_checks AS x WHERE x.id = c.id;
        IF sent IS NOT NULL
           AND (NOT passed OR EXISTS (SELECT FROM pgq.jobs AS j
                                      WHERE j.queue = c.queue AND j.wait_signal = c.name AND j.state = 'waiting')) THEN
            INSERT INTO pgq.signal_checks (queue, name, horizon) VALUES (c.queue, c.name, coalesce(c.horizon, stamp));
        END IF;
    END LOOP;
    RETURN woken;
END
$$;
