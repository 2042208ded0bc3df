-- sql/functions/rates.sql: rate limits: a queue's tokens in slices, a key's in a GCRA bucket.

-- A rate limit (queues.rate_limit, key_rate_limit) hands out at most `rate` tokens per `period`: a
-- burst of at most `rate`, then `rate` per `period`, each claimed job spending one.
--
-- A queue's rate (rate_limit) is a line of numbered tokens: token n is due at n * period / rate
-- after the epoch (pgq._token_time, rounded up to the microsecond) and good for one period; at
-- `at`, the tokens good are the `rate` newest due (pgq._token_number: the newest), less those
-- taken. So in any window of length W the claims take at most rate + floor(W * rate / period) + 1
-- tokens, one fewer once the first of those claims has taken its own. The tokens are kept in
-- slices of consecutive tokens (pgq.rate_slices, pgq._slice_size tokens each: at most 64 slices
-- per period), each with how many of its first tokens are taken (spent, or passed when they
-- were no longer good). A claim spends the oldest tokens good from the slices it holds: it locks
-- them (pgq._take_tokens, FOR NO KEY UPDATE SKIP LOCKED, never waited for), as few as hold the
-- tokens its picks need, so claimers of one queue spend side by side, and a claim's transaction
-- left open holds back the tokens it spent and fewer than one slice's more (the rest of the last
-- slice it took from): the tokens due after it are other slices'. Slices are made ahead of their
-- time, up to max(period, 10 s) ahead, by the queue's claims and enqueues (pgq._make_slices); a
-- slice may have a few rows (two makers at once: neither waits for the other), the most taken of
-- its rows is its count, and a claim locks all of a slice's rows it sees. No transaction spends
-- from a slice only it has made (another could be making the same slice, unseen): a claim that
-- finds its queue's slices missing (after a quiet time longer than that) makes them, and the
-- next claim spends them.
--
-- A key's rate (key_rate_limit, pgq.key_rates) is a GCRA bucket, one row, spent while the claim
-- holds the key (pgq._hold_keys): one timestamp, the theoretical arrival time (tat), when the
-- bucket is full again (NULL or past: full now). Taking n tokens at `at` moves it to
-- greatest(tat, at) + n * period / rate, allowed while that is at most at + period, the same bound
-- as above. A key held by an open transaction is that key, whole.

-- The clock of the rate limits: clock_timestamp(), read by pgq.claim before its keyed pick (to
-- count the keys' tokens once it holds them), and again once all its locks are held, the rate's
-- slices included, before it hands the jobs out (to count and spend the queue's tokens, and spend
-- the keys'). Not pgq._now() (statement_timestamp) or now(): a claim whose statement or
-- transaction started before another claim's took the lock would spend tokens at an earlier
-- moment than they are handed out; read after the locks, the readings of one slice's (or key's)
-- claims come in the order they hand out their jobs. A key's tokens counted at an earlier reading
-- than the spend are only fewer. (A test database may replace this function, like pgq._now().)
CREATE OR REPLACE FUNCTION pgq._rate_clock() RETURNS timestamptz
    LANGUAGE sql VOLATILE PARALLEL SAFE
    AS $$ SELECT clock_timestamp() $$;
COMMENT ON FUNCTION pgq._rate_clock() IS
    'The clock of the rate limits: clock_timestamp(), read once the claim holds what it spends.';

-- How many tokens a key's bucket (its tat, rate and period) holds at `at`.
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

-- How many stripes a queue's rate of `rate` tokens per `period` has: one per 100 tokens a second,
-- 1 to 16 and at most `rate` (as many as the shards of pgq.rate_buckets, up to version 19), so
-- that claimers at once take the tokens falling due side by side. Token n is of stripe n mod
-- stripes.
CREATE OR REPLACE FUNCTION pgq._stripes(rate integer, period interval) RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT greatest(1, least(16, $1, floor($1 / extract(epoch FROM $2) / 100)))::integer $$;

-- How many tokens a slice of a queue's rate holds: about 16 slices a period per stripe, so that a
-- slice's tokens are few (those of the slices of one block, below, fewer than rate / 16 + stripes).
CREATE OR REPLACE FUNCTION pgq._slice_size(rate integer, period interval) RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT greatest(1, ceil($1 / (16.0 * pgq._stripes($1, $2))))::integer $$;

-- The number of the newest token of a rate of `rate` per `period` due at `at` (token n is due at
-- n * period / rate after the epoch).
CREATE OR REPLACE FUNCTION pgq._token_number(rate integer, period interval, at timestamptz) RETURNS bigint
    LANGUAGE sql STABLE PARALLEL SAFE  -- (as extract: declared IMMUTABLE, it would not be inlined)
    AS $$ SELECT floor(extract(epoch FROM $3) * $1 / extract(epoch FROM $2))::bigint $$;

-- When token n of a rate of `rate` per `period` is due (rounded up to the microsecond: never early).
CREATE OR REPLACE FUNCTION pgq._token_time(n bigint, rate integer, period interval) RETURNS timestamptz
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT timestamptz 'epoch' + ceil($1 * extract(epoch FROM $3) * 1000000 / $2)::float8 * interval '1 microsecond'
$$;

-- The rows of the oldest `most` slices of `queue`'s rate (`rate` per period, `m` stripes of
-- slices of `k` tokens; NULL: all) that hold tokens good when the newest token due is `n`
-- (pgq._token_number) and have a row with tokens not taken (rate_slices_left_idx), all their
-- rows, as this transaction sees them (for pgq._slice_tokens).
CREATE OR REPLACE FUNCTION pgq._window_rows(queue text, rate integer, k integer, m integer, n bigint, most integer)
    RETURNS pgq.rate_slices[]
    LANGUAGE plpgsql STABLE
    SET plan_cache_mode = force_generic_plan
    AS $$
BEGIN
    -- (PL/pgSQL, not SQL: its plan is kept for the session; an SQL function's is made at each call.)
    RETURN ARRAY(
        SELECT s FROM (SELECT DISTINCT l.slice FROM pgq.rate_slices AS l
                       WHERE l.queue = _window_rows.queue AND l.taken < l.tokens
                         AND l.slice BETWEEN (_window_rows.n - _window_rows.rate + 1) / (_window_rows.m * _window_rows.k)
                                             * _window_rows.m
                                         AND _window_rows.n / (_window_rows.m * _window_rows.k) * _window_rows.m
                                             + _window_rows.m - 1
                       ORDER BY l.slice LIMIT _window_rows.most) AS w
        JOIN pgq.rate_slices AS s ON s.queue = _window_rows.queue AND s.slice = w.slice);
END
$$;

-- The arithmetic of a slice of a queue's rate (`rate` per period, `m` stripes of slices of `k`
-- tokens), when the newest token due is `n`: the tokens come in blocks of m * k, and slice s holds
-- tokens base + j * m (j from 0 to k - 1; base = (s / m) * m * k + s % m), the j-th of stripe
-- s % m in block s / m. Of a slice whose first `taken` tokens are taken: how many of its first
-- tokens are taken or no longer good (skip: up to its oldest token good), and how many after
-- those are due, good and not taken (left). The one place it is written (inlined where used).
CREATE OR REPLACE FUNCTION pgq._slice_skip(slice bigint, taken integer, rate integer, k integer, m integer, n bigint)
    RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT greatest($2::bigint, floor(($6 - $3 - (($1 / $5) * $5 * $4 + $1 % $5))::numeric / $5)::bigint + 1)::integer $$;

CREATE OR REPLACE FUNCTION pgq._slice_left(slice bigint, taken integer, rate integer, k integer, m integer, n bigint)
    RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT greatest(least($4 - 1, floor(($6 - (($1 / $5) * $5 * $4 + $1 % $5))::numeric / $5)::bigint)
                    - pgq._slice_skip($1, $2, $3, $4, $5, $6) + 1, 0)::integer
$$;

-- Per slice of `queue` among `rows` (rows of slices, all the rows of each, of any queues; the
-- queue's rate is `rate` per period, in `m` stripes of slices of `k` tokens), when the newest token
-- due is `n`: skip and tokens_left of pgq._slice_left, the most taken of its rows counting, and
-- whether a transaction other than this one made one of its rows (only then may this one spend
-- from it: see pgq._take_tokens). (Inlined where it is called with no sub-select among its
-- arguments.)
CREATE OR REPLACE FUNCTION pgq._slice_tokens(rows pgq.rate_slices[], queue text, rate integer, k integer, m integer,
                                             n bigint)
    RETURNS TABLE (slice bigint, skip integer, tokens_left integer, spendable boolean)
    LANGUAGE sql STABLE
    AS $$
    SELECT y.slice, pgq._slice_skip(y.slice, y.taken, $3, $4, $5, $6), pgq._slice_left(y.slice, y.taken, $3, $4, $5, $6),
           y.spendable
    FROM (SELECT r.slice, max(r.taken) AS taken,
                 bool_or(r.made_by IS DISTINCT FROM pg_current_xact_id_if_assigned()) AS spendable
          FROM unnest($1) AS r WHERE r.queue = $2 GROUP BY r.slice) AS y
$$;

-- Makes the slices of `queue`'s rate ahead of their time (pgq.claim's rooms, pgq.enqueue): when
-- this transaction sees none for the tokens due within max(period, 10 s) / 2 of `at`, every slice
-- from the first of the window at `at` (or after the newest made) to those of the block of the
-- tokens due within max(period, 10 s), never waiting for anyone (plain rows: two makers at once
-- make two). And as many expired slices as it makes are deleted (those another transaction holds
-- are left).
CREATE OR REPLACE FUNCTION pgq._make_slices(queue text, rate integer, period interval, at timestamptz)
    RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    ahead  interval := greatest(_make_slices.period, interval '10 seconds');
    k      integer := pgq._slice_size(_make_slices.rate, _make_slices.period);
    m      integer := pgq._stripes(_make_slices.rate, _make_slices.period);
    first  bigint := (pgq._token_number(_make_slices.rate, _make_slices.period, _make_slices.at)
                      - _make_slices.rate + 1) / (m * k) * m;
    last   bigint;
    newest bigint;
BEGIN
    SELECT max(s.slice) INTO newest FROM pgq.rate_slices AS s WHERE s.queue = _make_slices.queue;
    IF newest >= pgq._token_number(_make_slices.rate, _make_slices.period, _make_slices.at + ahead / 2) / (m * k) * m THEN
        RETURN;
    END IF;
    last := pgq._token_number(_make_slices.rate, _make_slices.period, _make_slices.at + ahead) / (m * k) * m + m - 1;
    INSERT INTO pgq.rate_slices (queue, slice, tokens)
    SELECT _make_slices.queue, g.slice, k FROM generate_series(greatest(newest + 1, first), last) AS g(slice);
    DELETE FROM pgq.rate_slices AS s
    WHERE s.ctid = ANY (ARRAY(SELECT x.ctid FROM pgq.rate_slices AS x
                              WHERE x.queue = _make_slices.queue AND x.slice < first
                              LIMIT last - greatest(newest + 1, first) + 1
                              FOR UPDATE SKIP LOCKED));
END
$$;

-- For pgq.claim: the tokens of its rate-limited queues (`rooms` whose rated is set) for their picks
-- among `picks` (locked, pending). Per queue, the oldest slices with a token due, good and not
-- taken are locked as the index is read (rate_slices_left_idx, FOR NO KEY UPDATE SKIP LOCKED: a
-- slice another claim holds is passed, never waited for), about as few as hold the tokens its
-- picks need, in rounds while they hold fewer (at most four); a slice counts as held when this
-- transaction locked each of its rows it sees, one of them made by another transaction (as
-- pgq._hold_keys holds a key). The tokens are counted at the rate clock read once they are held
-- (`at`: they are spent at it too, pgq._spend_tokens). A queue's picks beyond its tokens are left
-- out, the last in the total order first (they stay locked, not handed out). Returns the picks
-- kept (`ids`), the slices' rows held (`slices`) and `at`.
CREATE OR REPLACE FUNCTION pgq._take_tokens(picks bigint[], rooms pgq.claim_room[], OUT ids bigint[],
                                            OUT slices pgq.rate_slices[], OUT at timestamptz)
    LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan
    AS $$
DECLARE
    r      record;
    me     xid8 := pg_current_xact_id();
    n      bigint;    -- the newest token due at a reading of the rate clock
    held   pgq.rate_slices[];  -- the rows of this queue's slices held
    rows   pgq.rate_slices[];  -- those locked in a round
    single boolean;            -- whether each of those is its slice's one row, made by another
    more   integer;            -- and then the tokens they hold
    got    integer;            -- the tokens they hold by the last reading
    queues integer := 0;       -- how many rate-limited queues have picks
BEGIN
    ids := picks;
    slices := '{}';
    FOR r IN
        SELECT q.name, q.rate_limit, q.rate_period, pgq._slice_size(q.rate_limit, q.rate_period) AS k,
               pgq._stripes(q.rate_limit, q.rate_period) AS m, count(j.id)::integer AS need
        FROM unnest(_take_tokens.rooms) AS e
        JOIN pgq.queues AS q ON q.name = e.queue
        JOIN pgq.jobs AS j ON j.id = ANY (_take_tokens.picks) AND j.queue = e.queue
        WHERE e.rated AND q.rate_limit > 0
        GROUP BY q.name, q.rate_limit, q.rate_period
    LOOP
        held := '{}';
        got := 0;
        FOR round IN 1..4 LOOP
            n := pgq._token_number(r.rate_limit, r.rate_period, pgq._rate_clock());
            -- (With, for each row, how many rows of its slice this transaction sees.)
            SELECT coalesce(array_agg(x.row), '{}'), coalesce(bool_and(x.rows = 1 AND x.others), true),
                   coalesce(sum(pgq._slice_left((x.row).slice, (x.row).taken, r.rate_limit, r.k, r.m, n)), 0)
            INTO rows, single, more
            FROM (SELECT s AS row, s.made_by <> me AS others,
                         (SELECT count(*) FROM pgq.rate_slices AS c WHERE c.queue = s.queue AND c.slice = s.slice) AS rows
                  FROM pgq.rate_slices AS s
                  WHERE s.queue = r.name AND s.taken < s.tokens
                    AND s.slice BETWEEN (n - r.rate_limit + 1) / (r.m * r.k) * r.m AND n / (r.m * r.k) * r.m + r.m - 1
                    AND s.slice <> ALL (ARRAY(SELECT h.slice FROM unnest(held) AS h))
                    AND pgq._slice_left(s.slice, s.taken, r.rate_limit, r.k, r.m, n) > 0
                  ORDER BY s.slice, s.made_by
                  LIMIT greatest(1, ceil((r.need - got)::numeric / r.k))::integer
                  FOR NO KEY UPDATE OF s SKIP LOCKED) AS x;
            EXIT WHEN rows = '{}';
            IF single THEN  -- (the usual case: one row a slice, made by another transaction)
                held := held || rows;
                got := got + more;
            ELSE
                -- Of those slices, the ones wholly held: each of their rows this transaction sees
                -- locked (the other rows of a slice locked too), one of them another's.
                held := held || ARRAY(
                    SELECT c::pgq.rate_slices
                    FROM (SELECT DISTINCT x.slice FROM unnest(rows) AS x) AS w
                    CROSS JOIN LATERAL (SELECT count(*) FILTER (WHERE s.made_by <> me) AS others, count(*) AS n
                                        FROM pgq.rate_slices AS s WHERE s.queue = r.name AND s.slice = w.slice) AS v
                    CROSS JOIN LATERAL (SELECT array_agg(x) AS rows
                                        FROM (SELECT s FROM pgq.rate_slices AS s
                                              WHERE s.queue = r.name AND s.slice = w.slice
                                              FOR NO KEY UPDATE SKIP LOCKED) AS x(x)) AS g
                    CROSS JOIN LATERAL unnest(g.rows) AS c
                    WHERE v.others > 0 AND cardinality(g.rows) = v.n);
                got := (SELECT coalesce(sum(t.tokens_left), 0)
                        FROM pgq._slice_tokens(held, r.name, r.rate_limit, r.k, r.m, n) AS t);
            END IF;
            EXIT WHEN got >= r.need;
        END LOOP;
        slices := slices || held;
        queues := queues + 1;
    END LOOP;
    at := pgq._rate_clock();
    IF queues = 0 OR queues = 1 AND got >= r.need AND pgq._token_number(r.rate_limit, r.rate_period, at) = n THEN
        RETURN;  -- (the tokens good at `at` are those of the last count, which held enough: all picks kept)
    END IF;
    -- Each rate-limited queue's picks past the tokens its slices hold at `at`: left out.
    ids := ARRAY(
        SELECT j.id
        FROM (SELECT j.id, j.queue,
                     row_number() OVER (PARTITION BY j.queue ORDER BY j.priority DESC, j.run_at, j.id) AS nth
              FROM pgq.jobs AS j WHERE j.id = ANY (_take_tokens.picks)) AS j
        LEFT JOIN (SELECT q.name,
                          (SELECT coalesce(sum(t.tokens_left), 0)
                           FROM pgq._slice_tokens(slices, q.name, q.rate_limit, pgq._slice_size(q.rate_limit, q.rate_period),
                                                  pgq._stripes(q.rate_limit, q.rate_period),
                                                  pgq._token_number(q.rate_limit, q.rate_period, at)) AS t) AS tokens
                   FROM pgq.queues AS q
                   WHERE q.name = ANY (ARRAY(SELECT e.queue FROM unnest(_take_tokens.rooms) AS e WHERE e.rated))
                     AND q.rate_limit > 0) AS t ON t.name = j.queue
        WHERE t.name IS NULL OR j.nth <= t.tokens);
END
$$;

-- Makes a queue's slices (pgq.rate_slices) for a new rate or period (pgq.configure_queue, which
-- holds the queue's row, reads its old rate from it): every slice's rows are locked first (waiting
-- for the claims that hold one, as admin calls wait), then what the old rate handed out in its
-- window and has not regained (its debt, in tokens: the rate less the tokens good and not taken,
-- a slice not made yet counting as whole) is kept as as many tokens of the new rate (at most a
-- whole bucket: empty), taken from the oldest of the new window's. Rate 0: no slice.
CREATE OR REPLACE FUNCTION pgq._set_rate_buckets(queue text, old_period interval, rate integer, period interval,
                                                 at timestamptz) RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    old_rate integer;
    debt     bigint := 0;   -- tokens handed out and not regained yet
    k        integer;       -- the new rate's slices' size,
    m        integer;       -- stripes
    n        bigint;        -- and newest token due
BEGIN
    SELECT q.rate_limit INTO old_rate FROM pgq.queues AS q WHERE q.name = _set_rate_buckets.queue;
    PERFORM FROM pgq.rate_slices AS s WHERE s.queue = _set_rate_buckets.queue ORDER BY s.slice, s.made_by FOR UPDATE;
    IF old_rate > 0 THEN
        debt := old_rate - pgq._bucket_tokens(_set_rate_buckets.queue, _set_rate_buckets.old_period, _set_rate_buckets.at);
    END IF;
    DELETE FROM pgq.rate_slices AS s WHERE s.queue = _set_rate_buckets.queue;
    IF _set_rate_buckets.rate = 0 THEN
        RETURN;
    END IF;
    k := pgq._slice_size(_set_rate_buckets.rate, _set_rate_buckets.period);
    m := pgq._stripes(_set_rate_buckets.rate, _set_rate_buckets.period);
    n := pgq._token_number(_set_rate_buckets.rate, _set_rate_buckets.period, _set_rate_buckets.at);
    -- The tokens up to n - rate + debt are taken: in slice s, those below base + j * m for the
    -- first j past that.
    INSERT INTO pgq.rate_slices (queue, slice, tokens, taken)
    SELECT _set_rate_buckets.queue, g.slice, k,
           least(greatest(floor((n - _set_rate_buckets.rate + least(debt, _set_rate_buckets.rate)
                                 - ((g.slice / m) * m * k + g.slice % m))::numeric / m) + 1, 0), k)
    FROM generate_series((n - _set_rate_buckets.rate + 1) / (m * k) * m,
                         pgq._token_number(_set_rate_buckets.rate, _set_rate_buckets.period,
                                           _set_rate_buckets.at + greatest(_set_rate_buckets.period, interval '10 seconds'))
                             / (m * k) * m + m - 1) AS g(slice);
END
$$;

-- How many tokens a queue's rate (its rate_period: `period`) holds at `at`: the good ones not
-- taken, those of slices not made yet (past the newest made: its next claim makes them) counting
-- as not taken; 0 without a rate.
CREATE OR REPLACE FUNCTION pgq._bucket_tokens(queue text, period interval, at timestamptz) RETURNS integer
    LANGUAGE sql STABLE
    AS $$
    SELECT coalesce((
        SELECT coalesce((SELECT sum(s.tokens_left)
                         FROM pgq._slice_tokens(pgq._window_rows(q.name, q.rate_limit, w.k, w.m, w.n, NULL),
                                                q.name, q.rate_limit, w.k, w.m, w.n) AS s), 0)
               + greatest(w.n - greatest(w.n - q.rate_limit + 1,
                                         (coalesce((SELECT max(x.slice) FROM pgq.rate_slices AS x WHERE x.queue = q.name)
                                                   / w.m, -1) + 1) * w.m * w.k) + 1, 0)
        FROM pgq.queues AS q
        CROSS JOIN LATERAL (SELECT pgq._token_number(q.rate_limit, $2, $3) AS n, pgq._slice_size(q.rate_limit, $2) AS k,
                                   pgq._stripes(q.rate_limit, $2) AS m) AS w
        WHERE q.name = $1 AND q.rate_limit > 0), 0)::integer
$$;

-- When a queue's rate is whole again: one period after its newest token taken (NULL: none taken
-- in its window, or no rate). pgq.configure_queue and pgq.queue_settings show it as
-- queues.rate_tat.
CREATE OR REPLACE FUNCTION pgq._bucket_full_at(queue text) RETURNS timestamptz
    LANGUAGE sql STABLE
    AS $$
    SELECT pgq._token_time(max((s.slice / w.m) * w.m * w.k + s.slice % w.m + (s.taken - 1) * w.m),
                           q.rate_limit, q.rate_period) + q.rate_period
    FROM pgq.queues AS q
    CROSS JOIN LATERAL (SELECT pgq._token_number(q.rate_limit, q.rate_period, pgq._rate_clock()) AS n,
                               pgq._slice_size(q.rate_limit, q.rate_period) AS k,
                               pgq._stripes(q.rate_limit, q.rate_period) AS m) AS w
    JOIN pgq.rate_slices AS s ON s.queue = q.name AND s.taken > 0
    WHERE q.name = $1 AND q.rate_limit > 0
    GROUP BY q.rate_limit, q.rate_period, w.n
    HAVING max((s.slice / w.m) * w.m * w.k + s.slice % w.m + (s.taken - 1) * w.m) > w.n - q.rate_limit
$$;

-- When a queue's rate holds a token again: NULL when it holds one at `at` (or has no rate), else
-- when the next token is due.
CREATE OR REPLACE FUNCTION pgq._bucket_next_token_at(queue text, period interval, at timestamptz)
    RETURNS timestamptz
    LANGUAGE sql STABLE
    AS $$
    SELECT CASE WHEN pgq._bucket_tokens(q.name, $2, $3) < 1
                THEN pgq._token_time(pgq._token_number(q.rate_limit, $2, $3) + 1, q.rate_limit, $2) END
    FROM pgq.queues AS q WHERE q.name = $1 AND q.rate_limit > 0
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

-- For pgq.claim: spends the tokens of the rate-limited queues for those of `ids` (its picks) that
-- it handed out (running now), from the slices' rows it holds (`slices`, pgq._take_tokens), the
-- oldest tokens first, at `at` (the reading they were counted at); and of their keys (whose rows it
-- holds), in their buckets (pgq.key_rates).
CREATE OR REPLACE FUNCTION pgq._spend_tokens(ids bigint[], slices pgq.rate_slices[], at timestamptz) RETURNS void
    LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan
    AS $$
BEGIN
    IF slices <> '{}' THEN
        UPDATE pgq.rate_slices AS s
        SET taken = x.skip + x.take
        FROM (SELECT t.queue, t.slice, t.skip,
                     least(t.tokens_left, greatest(t.n - (sum(t.tokens_left) OVER (PARTITION BY t.queue ORDER BY t.slice)
                                                          - t.tokens_left), 0)) AS take
              FROM (SELECT q.name AS queue, c.n, h.*
                    FROM pgq.queues AS q
                    JOIN (SELECT j.queue, count(*)::integer AS n FROM pgq.jobs AS j
                          WHERE j.id = ANY (_spend_tokens.ids) AND j.state = 'running'
                          GROUP BY j.queue) AS c ON c.queue = q.name
                    CROSS JOIN LATERAL pgq._slice_tokens(
                        _spend_tokens.slices, q.name, q.rate_limit, pgq._slice_size(q.rate_limit, q.rate_period),
                        pgq._stripes(q.rate_limit, q.rate_period),
                        pgq._token_number(q.rate_limit, q.rate_period, _spend_tokens.at)) AS h
                    WHERE q.rate_limit > 0) AS t) AS x,
             unnest(_spend_tokens.slices) AS h
        WHERE x.take > 0 AND h.queue = x.queue AND h.slice = x.slice
          AND s.queue = h.queue AND s.slice = h.slice AND s.made_by = h.made_by;
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
-- its rate holds a token (pgq._bucket_tokens) and none of its keys is out of tokens; otherwise
-- until the queue's next token, or the earliest next token of a key out of tokens (whether or not that key has due
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
