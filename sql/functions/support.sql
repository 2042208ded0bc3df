-- sql/functions/support.sql: the clock, notifications, backoff, attempt room, pgq.version.

-- The database's notion of "now" for leases and run_at. Every pgq function reads time through this
-- one inlinable function, so a test database can move time (only the schema owner can replace it).
CREATE OR REPLACE FUNCTION pgq._now() RETURNS timestamptz
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$ SELECT statement_timestamp() $$;
COMMENT ON FUNCTION pgq._now() IS
    'The clock of every lease and run_at decision: the start of the current statement, so that a '
    'claim inside a long transaction still gets its whole lease.';

-- Microseconds since the epoch of `t`: the lease floor's unit (recovery.sql). Inlined where it is used.
CREATE OR REPLACE FUNCTION pgq._micros(t timestamptz) RETURNS bigint
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$ SELECT floor(extract(epoch FROM $1) * 1000000)::bigint $$;

-- The lease floor (recovery.sql) as a time: 1970 before it was ever set. Inlined into the claim's
-- expression (a function call, not a statement; VOLATILE as the sequence it reads: a STABLE
-- function around a volatile call would be called, not inlined).
CREATE OR REPLACE FUNCTION pgq._lease_floor() RETURNS timestamptz
    LANGUAGE sql VOLATILE
    AS $$ SELECT timestamptz 'epoch' + coalesce(pg_sequence_last_value('pgq.lease_floor'), 0) * interval '1 microsecond' $$;

-- Wakes listening workers (LISTEN pgq) for a queue that has a job due now, if the queue notifies.
-- PostgreSQL folds identical notifications of one transaction into one.
CREATE OR REPLACE FUNCTION pgq._notify(queue text) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF (SELECT q.notify FROM pgq.queues AS q WHERE q.name = _notify.queue) THEN
        PERFORM pg_notify('pgq', _notify.queue);
    END IF;
END
$$;

-- Retry delay after a failed attempt: exponential from base, capped, with jitter in the upper
-- half. Always within [base, cap], for any attempt. The growth is computed in float8 seconds with
-- a clamped exponent: multiplying the interval itself overflows ("interval out of range") as soon
-- as base * 2^(attempt-1) passes the interval range, e.g. base 1 hour at attempt 41 or base
-- 365 days at attempt 25, which would make pgq.fail raise instead of scheduling the retry.
CREATE OR REPLACE FUNCTION pgq._backoff(attempt integer, base interval, cap interval) RETURNS interval
    LANGUAGE sql VOLATILE PARALLEL SAFE
    AS $$
    SELECT least(_backoff.cap,
                 greatest(_backoff.base, make_interval(secs => d.ceiling_secs * (0.5 + random() * 0.5))))
    FROM (SELECT least(extract(epoch FROM _backoff.cap)::float8,
                       extract(epoch FROM _backoff.base)::float8
                       * power(2::float8, least(greatest(_backoff.attempt, 1) - 1, 62)))
                 AS ceiling_secs) AS d
$$;
COMMENT ON FUNCTION pgq._backoff(integer, interval, interval) IS
    'min(cap, base * 2^(attempt-1)) scaled by a random factor in [0.5, 1], never below base.';

-- How far a job's max_attempts may pass its attempts so far: a job can be released or snoozed
-- (each gives one attempt back) until max_attempts - attempt_offset reaches this, never past it,
-- so no counter can overflow: with 1,000,000 here and the failover fence's 100,000 attempt numbers
-- per timeline change (pgq._fence_step), a job's counters stay below 2^31 - 1 through
-- (2147483647 - 1000000) / 100000 = 21,464 timeline changes.
CREATE OR REPLACE FUNCTION pgq._attempt_room() RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT 1000000 $$;

-- Raises 54000 for a job that would pass its attempt room (pgq._attempt_room) by one more attempt.
CREATE OR REPLACE FUNCTION pgq._no_attempt_room(id bigint, operation text) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    RAISE EXCEPTION 'pgq: % of job % refused: the job has been given % attempts (releases and snoozes '
        'count), its limit', operation, id, pgq._attempt_room()
        USING ERRCODE = 'program_limit_exceeded',
              HINT = 'Fail or cancel the job: it cannot be given an attempt back again.';
END
$$;

-- Bounds the waits of the rest of this transaction's statements to `longest` (SET LOCAL
-- lock_timeout), unless the caller's lock_timeout is shorter already; returns the caller's value,
-- which the caller of this function sets back (set_config(..., true)) once its bounded statement is
-- done. For a statement that may wait for another login's open transaction and must not wait
-- forever (pgq.enqueue's insert of a new holder of a unique_key).
CREATE OR REPLACE FUNCTION pgq._bound_lock_timeout(longest interval) RETURNS text
    LANGUAGE plpgsql
    AS $$
DECLARE
    prior text := current_setting('lock_timeout');
BEGIN
    IF prior = '0' OR prior::interval > _bound_lock_timeout.longest THEN
        PERFORM set_config('lock_timeout', (extract(epoch FROM _bound_lock_timeout.longest) * 1000)::bigint || 'ms',
                           true);
    END IF;
    RETURN prior;
END
$$;

-- The schema version: the number of the newest migration. Every migration redefines it (and
-- tests/sql/test_schema_matches_migrations.py checks that it names the newest migration file).
CREATE OR REPLACE FUNCTION pgq.version() RETURNS text
    LANGUAGE sql IMMUTABLE
    AS $$ SELECT '34'::text $$;
COMMENT ON FUNCTION pgq.version() IS
    'The version of the installed pgq schema: the number of the newest migration applied.';
