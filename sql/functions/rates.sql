-- sql/functions/rates.sql: rate limits: GCRA buckets per queue and per key.

-- Rate limits (queues.rate_limit, key_rate_limit) are GCRA buckets of `rate` tokens per
-- `period`: a burst of at most `rate`, then `rate` per `period`. The state is one timestamp, the
-- theoretical arrival time (tat): when the bucket is full again (NULL or past: full now). Taking
-- n tokens at `at` moves it to greatest(tat, at) + n * period / rate, and is allowed while that
-- is at most at + period. So in any window of length W the claims take at most
-- rate + floor(W * rate / period) tokens (the tat advances by period / rate per token and never
-- passes the latest clock reading plus period). The arithmetic is exact (numeric epochs, tat
-- rounded up to the microsecond).

-- The clock of the rate limits: clock_timestamp(), read by pgq.claim once it holds the queue rows
-- it limits. Not pgq._now() (statement_timestamp) or now(): a claim whose statement or
-- transaction started before another claim's took the lock would spend tokens at an earlier
-- moment than they are handed out, and so refill the bucket for the claims after it; read after
-- the lock, the readings of one queue's claims come in the order they hand out their jobs. (A
-- test database may replace this function, like pgq._now().)
CREATE OR REPLACE FUNCTION pgq._rate_clock() RETURNS timestamptz
    LANGUAGE sql VOLATILE PARALLEL SAFE
    AS $$ SELECT clock_timestamp() $$;
COMMENT ON FUNCTION pgq._rate_clock() IS
    'The clock of the rate limits: clock_timestamp(), read once the claim holds its queue rows.';

-- How many tokens a bucket (its tat, rate and period) holds at `at`.
CREATE OR REPLACE FUNCTION pgq._tokens(tat timestamptz, rate integer, period interval, at timestamptz) RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT CASE WHEN $1 IS NULL OR $1 <= $4 THEN $2
                ELSE greatest(floor(extract(epoch FROM $3 - ($1 - $4)) * $2 / extract(epoch FROM $3)), 0)::integer
           END
$$;

-- When a bucket holds a token again; NULL when it holds one at `at` (or has no rate).
CREATE OR REPLACE FUNCTION pgq._next_token_at(tat timestamptz, rate integer, period interval, at timestamptz)
    RETURNS timestamptz
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT CASE WHEN $2 > 0 AND pgq._tokens($1, $2, $3, $4) < 1
                THEN $1 - $3 + ceil(extract(epoch FROM $3) * 1000000 / $2)::float8 * interval '1 microsecond'
           END
$$;

-- A bucket's tat once n tokens are taken at `at` (rounded up to the microsecond: never early).
CREATE OR REPLACE FUNCTION pgq._tat_after(tat timestamptz, rate integer, period interval, at timestamptz, n integer)
    RETURNS timestamptz
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT greatest($1, $4) + ceil($5 * extract(epoch FROM $3) * 1000000 / $2)::float8 * interval '1 microsecond'
$$;

-- A bucket's tat when its rate or period changes (pgq.configure_queue): what it handed out still
-- counts, as the same number of tokens of the new rate (at most a whole bucket: empty).
CREATE OR REPLACE FUNCTION pgq._rescaled_tat(tat timestamptz, old_rate integer, old_period interval, rate integer,
                                  period interval, at timestamptz)
    RETURNS timestamptz
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT CASE WHEN $1 > $6 AND $2 > 0 AND $4 > 0
                THEN $6 + least(($1 - $6) * (extract(epoch FROM $5) * $2 / (extract(epoch FROM $3) * $4))::float8, $5)
           END
$$;

-- Deletes up to max_rows rows of pgq.key_rates whose bucket is full again (pgq.sweep,
-- pgq.prune), queue by queue under the queue's row lock, like the claims that write them (a queue
-- whose row another session holds is skipped): at the clock read after the lock, such a row
-- says what no row says, so no claim after it can tell.
CREATE OR REPLACE FUNCTION pgq._prune_key_rates(max_rows integer) RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    deleted integer := 0;
    r record;
BEGIN
    FOR r IN SELECT DISTINCT k.queue FROM pgq.key_rates AS k WHERE k.tat <= pgq._rate_clock() LOOP
        EXIT WHEN deleted >= _prune_key_rates.max_rows;
        PERFORM FROM pgq.queues AS q WHERE q.name = r.queue FOR NO KEY UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        WITH gone AS (
            DELETE FROM pgq.key_rates AS k
            WHERE k.queue = r.queue AND k.key IN (
                SELECT x.key FROM pgq.key_rates AS x
                WHERE x.queue = r.queue AND x.tat <= pgq._rate_clock()
                LIMIT _prune_key_rates.max_rows - deleted)
            RETURNING 1
        )
        SELECT deleted + count(*) INTO deleted FROM gone;
    END LOOP;
    RETURN deleted;
END
$$;

-- For pgq.claim, which holds the queues' rows: spends the tokens of the rate-limited queues (and
-- keys) for those of `ids` (its picks) that it handed out, at the rate clock's reading `at`.
CREATE OR REPLACE FUNCTION pgq._spend_tokens(ids bigint[], at timestamptz) RETURNS void
    LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan
    AS $$
BEGIN
    UPDATE pgq.queues AS q
    SET rate_tat = pgq._tat_after(q.rate_tat, q.rate_limit, q.rate_period, _spend_tokens.at, c.n)
    FROM (SELECT j.queue, count(*)::integer AS n FROM pgq.jobs AS j
          WHERE j.id = ANY (_spend_tokens.ids) AND j.state = 'running'
          GROUP BY j.queue) AS c
    WHERE q.name = c.queue AND q.rate_limit > 0;
    INSERT INTO pgq.key_rates AS k (queue, key, tat)
    SELECT c.queue, c.key, pgq._tat_after(NULL, q.key_rate_limit, q.rate_period, _spend_tokens.at, c.n)
    FROM (SELECT j.queue, j.concurrency_key AS key, count(*)::integer AS n FROM pgq.jobs AS j
          WHERE j.id = ANY (_spend_tokens.ids) AND j.state = 'running' AND j.concurrency_key IS NOT NULL
          GROUP BY j.queue, j.concurrency_key) AS c
    JOIN pgq.queues AS q ON q.name = c.queue
    WHERE q.key_rate_limit > 0
    -- (excluded.tat is at + n * period / rate: greatest(k.tat, at) + the same.)
    ON CONFLICT ON CONSTRAINT key_rates_pkey
        DO UPDATE SET tat = excluded.tat + greatest(k.tat - _spend_tokens.at, interval '0');
END
$$;

-- For a worker after a claim that came back short: each rate-limited queue of `queues` (NULL:
-- every one), with how long until a claim may get a job its rate limits hold back now: 0 while
-- its bucket holds a token and none of its keys is out of tokens; otherwise until the queue's
-- next token, or the earliest next token of a key out of tokens (whether or not that key has due
-- jobs: an index range, never a read of the jobs). A worker calls it only for queues it knows are
-- rate-limited (this function's last answer), so other queues pay nothing.
CREATE OR REPLACE FUNCTION pgq.rate_limit_wait(queues text[] DEFAULT NULL)
    RETURNS TABLE (queue text, wait interval)
    LANGUAGE sql STABLE
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET jit = off
    AS $$
    SELECT q.name,
           greatest(coalesce(pgq._next_token_at(q.rate_tat, q.rate_limit, q.rate_period, c.at),
                             (SELECT min(pgq._next_token_at(k.tat, q.key_rate_limit, q.rate_period, c.at))
                              FROM pgq.key_rates AS k
                              WHERE q.key_rate_limit > 0 AND k.queue = q.name
                                AND k.tat > c.at + q.rate_period - q.rate_period / nullif(q.key_rate_limit, 0)
                                            - interval '1 microsecond'),
                             c.at) - c.at, interval '0')
    FROM pgq.queues AS q
    CROSS JOIN (SELECT pgq._rate_clock() AS at) AS c
    WHERE q.rate_limited AND NOT q.paused
      AND (rate_limit_wait.queues IS NULL OR q.name = ANY (rate_limit_wait.queues))
    ORDER BY q.name;
$$;
COMMENT ON FUNCTION pgq.rate_limit_wait(text[]) IS
    'Each rate-limited queue of queues (NULL: all) and how long until its rate limits let a claim '
    'take a job they hold back now (0: they hold none back).';
