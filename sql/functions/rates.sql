-- sql/functions/rates.sql: rate limits: GCRA buckets per queue and per key.

-- Rate limits (queues.rate_limit, key_rate_limit) are GCRA buckets of `rate` tokens per
-- `period`: a burst of at most `rate`, then `rate` per `period`. The state is one timestamp, the
-- theoretical arrival time (tat): when the bucket is full again (NULL or past: full now). Taking
-- n tokens at `at` moves it to greatest(tat, at) + n * period / rate, and is allowed while that
-- is at most at + period. So in any window of length W the claims take at most
-- rate + floor(W * rate / period) tokens (the tat advances by period / rate per token and never
-- passes the latest clock reading plus period). The arithmetic is exact (numeric epochs, tat
-- rounded up to the microsecond).
--
-- A queue's bucket (rate_limit) is split into shards (pgq.rate_buckets, pgq._rate_shards of them),
-- each a GCRA bucket of its part of the rate: their sum is the queue's rate, and so is the sum of
-- the bounds above, so together they never hand out more than the one bucket would. A claim locks
-- only the shards it spends (pgq._claim_rooms: from a random one on, FOR NO KEY UPDATE SKIP LOCKED,
-- never waited for), so claimers of one queue spend side by side instead of taking turns on one row. A key's bucket
-- (key_rate_limit, pgq.key_rates) is one row, spent while the claim holds the key (pgq._hold_keys).

-- The clock of the rate limits: clock_timestamp(), read by pgq.claim once it holds the shards it
-- may spend (to count their tokens), and again once all its locks are held, keys' slots included,
-- before it hands the jobs out (to spend them). Not pgq._now() (statement_timestamp) or now(): a claim whose statement or
-- transaction started before another claim's took the lock would spend tokens at an earlier
-- moment than they are handed out, and so refill the bucket for the claims after it; read after
-- the locks, the readings of one bucket's claims come in the order they hand out their jobs. A
-- count at an earlier reading than the spend only finds fewer tokens. (A test database may replace
-- this function, like pgq._now().)
CREATE OR REPLACE FUNCTION pgq._rate_clock() RETURNS timestamptz
    LANGUAGE sql VOLATILE PARALLEL SAFE
    AS $$ SELECT clock_timestamp() $$;
COMMENT ON FUNCTION pgq._rate_clock() IS
    'The clock of the rate limits: clock_timestamp(), read once the claim holds its queue rows.';

-- How many shards a queue's bucket of `rate` tokens per `period` has: one per 100 tokens a second,
-- 1 to 16 and at most `rate`, so that each shard still gains a token at least every 10 ms. (Written
-- out in migration 0016, which made the first buckets.)
CREATE OR REPLACE FUNCTION pgq._rate_shards(rate integer, period interval) RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT greatest(1, least(16, $1, floor($1 / extract(epoch FROM $2) / 100)))::integer $$;

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

-- Makes a queue's shards (pgq.rate_buckets) for a new rate or period (pgq.configure_queue, which
-- holds the queue's row): every shard is locked first (waiting for the claims that hold one, as
-- admin calls wait), then what the old shards handed out and have not regained (their debt, in
-- tokens) is kept as as many tokens of the new rate (at most a whole bucket: empty), shared by
-- the new shards in proportion (each as full as the bucket). Rate 0: no shard.
CREATE OR REPLACE FUNCTION pgq._set_rate_buckets(queue text, old_period interval, rate integer, period interval,
                                                 at timestamptz) RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    debt  float8;        -- tokens handed out and not regained yet
    tat   timestamptz;   -- the new shards' tat
    n     integer;
BEGIN
    PERFORM FROM pgq.rate_buckets AS b WHERE b.queue = _set_rate_buckets.queue ORDER BY b.shard FOR UPDATE;
    SELECT coalesce(sum(extract(epoch FROM b.tat - _set_rate_buckets.at) * b.rate
                        / extract(epoch FROM _set_rate_buckets.old_period)), 0)
    INTO debt
    FROM pgq.rate_buckets AS b WHERE b.queue = _set_rate_buckets.queue AND b.tat > _set_rate_buckets.at;
    DELETE FROM pgq.rate_buckets AS b WHERE b.queue = _set_rate_buckets.queue;
    IF _set_rate_buckets.rate = 0 THEN
        RETURN;
    END IF;
    IF debt > 0 THEN
        tat := _set_rate_buckets.at + least(debt / _set_rate_buckets.rate, 1) * _set_rate_buckets.period;
    END IF;
    n := pgq._rate_shards(_set_rate_buckets.rate, _set_rate_buckets.period);
    INSERT INTO pgq.rate_buckets (queue, shard, rate, tat)
    SELECT _set_rate_buckets.queue, s.shard, _set_rate_buckets.rate / n + (s.shard < _set_rate_buckets.rate % n)::integer,
           tat
    FROM generate_series(0, n - 1) AS s(shard);
END
$$;

-- How many tokens a queue's shards hold at `at` (its rate_period: `period`); 0 without shards.
CREATE OR REPLACE FUNCTION pgq._bucket_tokens(queue text, period interval, at timestamptz) RETURNS integer
    LANGUAGE sql STABLE
    AS $$
    SELECT coalesce(sum(pgq._tokens(b.tat, b.rate, $2, $3)), 0)::integer FROM pgq.rate_buckets AS b WHERE b.queue = $1
$$;

-- When a queue's bucket is full again: the latest tat of its shards (NULL: full, or no limit).
-- pgq.configure_queue and pgq.queue_settings show it as queues.rate_tat.
CREATE OR REPLACE FUNCTION pgq._bucket_full_at(queue text) RETURNS timestamptz
    LANGUAGE sql STABLE
    AS $$ SELECT max(b.tat) FROM pgq.rate_buckets AS b WHERE b.queue = $1 $$;

-- When a queue's bucket holds a token again: NULL when one of its shards holds one at `at` (or it
-- has none), else the earliest next token of a shard.
CREATE OR REPLACE FUNCTION pgq._bucket_next_token_at(queue text, period interval, at timestamptz)
    RETURNS timestamptz
    LANGUAGE sql STABLE
    AS $$
    SELECT CASE WHEN bool_or(pgq._tokens(b.tat, b.rate, $2, $3) >= 1) THEN NULL
                ELSE min(pgq._next_token_at(b.tat, b.rate, $2, $3)) END
    FROM pgq.rate_buckets AS b WHERE b.queue = $1
$$;

-- Deletes up to max_rows rows of pgq.key_rates whose bucket is full again (pgq.sweep,
-- pgq.prune), each while this transaction holds its key (pgq._hold_keys), like the claims that
-- write them (a key another session holds is skipped): at the clock read after the lock, such a
-- row says what no row says, so no claim after it can tell.
CREATE OR REPLACE FUNCTION pgq._prune_key_rates(max_rows integer) RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    deleted integer := 0;
    held    text[];
    n       integer;
    r       record;
BEGIN
    FOR r IN
        SELECT k.queue, array_agg(k.key) AS keys
        FROM (SELECT k.queue, k.key FROM pgq.key_rates AS k WHERE k.tat <= pgq._rate_clock()
              LIMIT _prune_key_rates.max_rows) AS k
        GROUP BY k.queue
    LOOP
        held := pgq._hold_keys(r.queue, r.keys);
        DELETE FROM pgq.key_rates AS k WHERE k.queue = r.queue AND k.key = ANY (held) AND k.tat <= pgq._rate_clock();
        GET DIAGNOSTICS n = ROW_COUNT;
        deleted := deleted + n;
    END LOOP;
    RETURN deleted;
END
$$;

-- For pgq.claim: spends the tokens of the rate-limited queues (from the shards it holds,
-- `buckets`, the fullest first) and of their keys (whose slots it holds) for those of `ids` (its
-- picks) that it handed out, at the rate clock's reading `at` (read once all its locks were held,
-- and so no earlier than the reading it counted the tokens at: they hold at least what it takes).
CREATE OR REPLACE FUNCTION pgq._spend_tokens(ids bigint[], buckets pgq.rate_buckets[], at timestamptz) RETURNS void
    LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan
    AS $$
BEGIN
    IF buckets <> '{}' THEN
        UPDATE pgq.rate_buckets AS b
        SET tat = pgq._tat_after(b.tat, b.rate, s.period, _spend_tokens.at, least(s.tokens, c.n - (s.upto - s.tokens)))
        FROM (SELECT h.queue, h.shard, q.rate_period AS period,
                     pgq._tokens(h.tat, h.rate, q.rate_period, _spend_tokens.at) AS tokens,
                     sum(pgq._tokens(h.tat, h.rate, q.rate_period, _spend_tokens.at))
                         OVER (PARTITION BY h.queue ORDER BY h.tat NULLS FIRST, h.shard)::integer AS upto
              FROM unnest(_spend_tokens.buckets) AS h
              JOIN pgq.queues AS q ON q.name = h.queue) AS s,
             (SELECT j.queue, count(*)::integer AS n FROM pgq.jobs AS j
              WHERE j.id = ANY (_spend_tokens.ids) AND j.state = 'running'
              GROUP BY j.queue) AS c
        WHERE c.queue = s.queue AND b.queue = s.queue AND b.shard = s.shard AND c.n > s.upto - s.tokens;
    END IF;
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
-- a shard of its bucket holds a token and none of its keys is out of tokens; otherwise until the queue's
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
           greatest(coalesce(pgq._bucket_next_token_at(q.name, q.rate_period, c.at),
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
