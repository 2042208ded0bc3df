-- sql/functions/keys.sql: per-key concurrency limits: the keyed pick and pgq.set_key_limit.

-- The limit in effect for a key: the queue's key_max_running (`queue_limit`) unless pgq.key_limits
-- overrides it for the key (`override`); NULL: none (0 is no limit). The one place this rule is
-- written (inlined where it is used).
CREATE OR REPLACE FUNCTION pgq._key_limit(override integer, queue_limit integer) RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT nullif(coalesce($1, $2), 0) $$;

-- A key-limited queue's pick (queues.key_limited): up to `room` claimable jobs in the total order
-- (or by fair mode's round-robin), of which at most as many per concurrency_key as the key has
-- free places (its limit, pgq._key_limit, less its running jobs); jobs without a key, or of a key
-- without a limit, are not limited. A full key never blocks the keys behind it, and the work of
-- one pick is bounded however the queue's jobs fall:
--   1. the head: the queue's first room + 16 candidates in the total order, whatever their keys
--      (one read of jobs_ready_idx of at most that many rows), of which it takes what the keys
--      allow;
--   2. other keys: when the head was all read and the pick is still short (keys at their limit
--      hold the head: a key's jobs in one run, a hot key), the keys with a claimable job that it
--      has not met yet, one probe of jobs_key_ready_idx each, at most room + 16 of them, walked in
--      key order from the key of the queue's most recently claimed running job (so every key
--      comes round: no state of the session's is read), and their first jobs, the best in the
--      total order first.
-- Race-free without the queue's row lock: before it counts a limited key's running jobs (in a
-- statement whose fresh snapshot sees every earlier claim of that key: a transaction's row locks
-- are released after its commit is visible), the pick holds the key's rows in pgq.key_locks
-- (pgq._hold_keys: the key of that queue, no other). Claims of one key take turns; claims of
-- different keys never meet; a key another claim holds is left out of this call like a full one,
-- never waited for. Only the keys it takes jobs of are held: the head's keys as the candidates
-- need them, the walked keys a turn at a time. The keys that look full at the start (counted
-- before any lock: a hint, never trusted for a free place) are left out at once. Returns the
-- picked ids, locked FOR NO KEY UPDATE.
-- A new limit (pgq.set_key_limit, configure_queue) binds the claims that start after it commits.
-- A queue with key_rate_limit also counts each key's tokens at `at` (the claim's rate clock): a key
-- without one is left out like a full key. A rate-limited queue without a per-key step
-- (pgq.queues.rate_limited only) gets its first `room` jobs, locked, or its fair pick. A fair
-- queue's pick goes one job at a time (pgq._fair_pick, passing the keys left out).
CREATE OR REPLACE FUNCTION pgq._keyed_pick(queue text, room integer, kinds text[], fair boolean,
                                at timestamptz DEFAULT NULL) RETURNS SETOF bigint
    LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan
    -- The plans tests/sql/test_sql_plans.py pins, whatever the statistics: a CI run's plan counted the
    -- running jobs by a bitmap scan instead of jobs_lease_idx.
    SET enable_bitmapscan = off
    AS $$
DECLARE
    default_limit integer;
    key_limited boolean;       -- queues.key_limited
    key_rate  integer;         -- queues.key_rate_limit (0: none), per period
    period    interval;        -- queues.rate_period
    avail    jsonb := '{}';    -- key -> how many more of its jobs this call may pick, for the keys taken
    hint     jsonb;            -- key -> how many more of its jobs may start, for the keys with running jobs
    full_keys text[];          -- the keys left out: full or without a token (a hint), or met already
    newest   text;             -- the key of the queue's most recently claimed running job
    picked   bigint[] := '{}';
    ids      bigint[];         -- candidates, in order,
    keys     text[];           -- their keys
    wanted   text[];           -- the keys the head's candidates need, in the order first met
    head     integer := _keyed_pick.room + 16;  -- how many candidates the head read takes
    seen     integer;          -- how many it read
    taken    integer := 0;     -- how many of walked were taken
    walked   text[];           -- the other keys the second step met
    turn     text[];           -- the keys of one turn of that step
    n        integer;
    sequence text;             -- queues.key_sequence: 'halt', 'continue' or NULL (off)
BEGIN
    SELECT q.key_max_running, q.key_limited, q.key_rate_limit, q.rate_period, q.key_sequence
    INTO default_limit, key_limited, key_rate, period, sequence
    FROM pgq.queues AS q WHERE q.name = _keyed_pick.queue;
    IF sequence IS NOT NULL THEN
        default_limit := 1;  -- (configure_queue and set_key_limit refuse any other limit for it)
    END IF;
    IF NOT key_limited AND key_rate = 0 THEN
        -- A rate-limited queue without a per-key step: its first jobs (its fair pick), locked.
        IF _keyed_pick.fair THEN
            RETURN QUERY SELECT f.id FROM pgq._fair_pick(_keyed_pick.queue, _keyed_pick.room, _keyed_pick.kinds) AS f(id);
        ELSE
            RETURN QUERY
            SELECT j.id FROM pgq.jobs AS j
            WHERE j.queue = _keyed_pick.queue
              AND j.state = 'pending' AND j.attempt < j.max_attempts
              AND j.run_at <= pgq._now()
              AND (_keyed_pick.kinds IS NULL OR j.kind = ANY (_keyed_pick.kinds))
            ORDER BY j.priority DESC, j.run_at, j.id
            LIMIT _keyed_pick.room
            FOR NO KEY UPDATE SKIP LOCKED;
        END IF;
        RETURN;
    END IF;
    -- How many more jobs each key with running jobs may start (a hint: whether a key has a free
    -- place is counted once it is held), and the key of the newest claim, in one read of the
    -- running jobs.
    SELECT coalesce(jsonb_object_agg(c.key, pgq._key_limit(l.max_running, default_limit) - c.n)
                        FILTER (WHERE pgq._key_limit(l.max_running, default_limit) IS NOT NULL), '{}'),
           (array_agg(c.key ORDER BY c.newest DESC, c.key))[1]
    INTO hint, newest
    FROM (SELECT j.concurrency_key AS key, count(*)::integer AS n, max(j.claimed_at) AS newest
          FROM pgq.jobs AS j
          WHERE j.lease_until IS NOT NULL AND j.queue = _keyed_pick.queue AND j.concurrency_key IS NOT NULL
          GROUP BY j.concurrency_key) AS c
    LEFT JOIN pgq.key_limits AS l ON l.queue = _keyed_pick.queue AND l.key = c.key;
    full_keys := ARRAY(SELECT h.key FROM jsonb_each_text(hint) AS h(key, n) WHERE h.n::integer <= 0);
    IF key_rate > 0 THEN
        -- The keys without a token (key_rates_tat_idx: those whose tat is furthest ahead).
        full_keys := full_keys || ARRAY(
            SELECT k.key FROM pgq.key_rates AS k
            WHERE k.queue = _keyed_pick.queue
              AND k.tat > _keyed_pick.at + period - period / key_rate - interval '1 microsecond'
              AND pgq._tokens(k.tat, key_rate, period, _keyed_pick.at) < 1);
    END IF;

    IF _keyed_pick.fair THEN
        -- One job a pass, never of a key left out, while there is one.
        LOOP
            SELECT array_agg(j.id), array_agg(j.concurrency_key) INTO ids, keys
            FROM pgq._fair_pick(_keyed_pick.queue, 1, _keyed_pick.kinds, full_keys, picked) AS f(id)
            JOIN pgq.jobs AS j ON j.id = f.id;
            EXIT WHEN ids IS NULL;
            IF keys[1] IS NOT NULL AND NOT avail ? keys[1] THEN
                avail := avail || pgq._take_keys(_keyed_pick.queue, keys, _keyed_pick.room, default_limit, key_rate,
                                                 period, _keyed_pick.at);
            END IF;
            IF keys[1] IS NULL THEN
                picked := picked || ids[1];
            ELSE
                n := (avail ->> keys[1])::integer;
                IF n > 0 THEN
                    picked := picked || ids[1];
                    avail := avail || jsonb_build_object(keys[1], n - 1);
                END IF;
                IF n <= 1 THEN
                    full_keys := full_keys || keys[1];
                END IF;
            END IF;
            EXIT WHEN cardinality(picked) >= _keyed_pick.room;
        END LOOP;
    ELSE
        -- 1. The head of the queue, whatever its keys, ...
        SELECT array_agg(x.id ORDER BY x.priority DESC, x.run_at, x.id),
               array_agg(x.key ORDER BY x.priority DESC, x.run_at, x.id), count(*)
        INTO ids, keys, seen
        FROM (SELECT j.id, j.concurrency_key AS key, j.priority, j.run_at
              FROM pgq.jobs AS j
              WHERE j.queue = _keyed_pick.queue
                AND j.state = 'pending' AND j.attempt < j.max_attempts
                AND j.run_at <= pgq._now()
                AND (_keyed_pick.kinds IS NULL OR j.kind = ANY (_keyed_pick.kinds))
              ORDER BY j.priority DESC, j.run_at, j.id
              LIMIT head) AS x;
        -- (A sequence queue: of a key's candidates only its head, the key's oldest live job, may
        -- run; the others are left out, and their keys, unless their heads are among the
        -- candidates, are walked in step 2 like the keys not met.)
        IF sequence IS NOT NULL AND ids IS NOT NULL THEN
            SELECT array_agg(c.id ORDER BY c.ord), array_agg(c.key ORDER BY c.ord) INTO ids, keys
            FROM unnest(ids, keys) WITH ORDINALITY AS c(id, key, ord)
            WHERE c.key IS NULL
               OR c.id IN (SELECT h.id FROM pgq._sequence_heads(_keyed_pick.queue, ARRAY[c.key], sequence = 'halt',
                                                                 _keyed_pick.kinds) AS h);
        END IF;
        -- ... of whose candidates the first `room` that the keys allow are taken: each key's first
        -- ones, as many as it has places and tokens (by the hint for a key not taken yet, then
        -- as counted once it is held). The keys of those candidates are taken, a round at a time
        -- (a key another claim holds, or found full, lets the next candidates in): no more keys
        -- are held than the claim can use.
        WHILE ids IS NOT NULL LOOP
            wanted := ARRAY(
                SELECT DISTINCT e.key
                FROM (SELECT e.key, e.ord
                      FROM (SELECT c.key, c.ord, row_number() OVER (PARTITION BY c.key ORDER BY c.ord) AS nth
                            FROM unnest(ids, keys) WITH ORDINALITY AS c(id, key, ord)
                            WHERE c.key IS NULL OR c.key <> ALL (full_keys)) AS e
                      LEFT JOIN pgq.key_limits AS l ON l.queue = _keyed_pick.queue AND l.key = e.key
                      WHERE e.key IS NULL
                         OR e.nth <= CASE WHEN avail ? e.key THEN (avail ->> e.key)::integer
                                          ELSE coalesce(least((hint ->> e.key)::integer,
                                                              pgq._key_limit(l.max_running, default_limit),
                                                              nullif(key_rate, 0)),
                                                        _keyed_pick.room) END
                      ORDER BY e.ord LIMIT _keyed_pick.room) AS e
                WHERE e.key IS NOT NULL AND NOT avail ? e.key);
            EXIT WHEN wanted = '{}';
            avail := avail || pgq._take_keys(_keyed_pick.queue, wanted, _keyed_pick.room, default_limit, key_rate,
                                             period, _keyed_pick.at);
        END LOOP;
        IF ids IS NOT NULL THEN
            picked := ARRAY(
                SELECT c.id
                FROM (SELECT c.id, c.key, c.ord, row_number() OVER (PARTITION BY c.key ORDER BY c.ord) AS nth
                      FROM unnest(ids, keys) WITH ORDINALITY AS c(id, key, ord)
                      WHERE c.key IS NULL OR avail ? c.key) AS c
                WHERE c.key IS NULL OR c.nth <= (avail ->> c.key)::integer
                ORDER BY c.ord LIMIT _keyed_pick.room);
        END IF;
        -- 2. Other keys' first jobs, when the head was all read and is held by keys left out.
        IF cardinality(picked) < _keyed_pick.room AND seen = head THEN
            full_keys := full_keys || ARRAY(SELECT DISTINCT k.key FROM unnest(keys) AS k(key) WHERE k.key IS NOT NULL);
            walked := ARRAY(SELECT w.key FROM pgq._walk_keys(_keyed_pick.queue, coalesce(newest, ''), NULL, full_keys,
                                                             CASE WHEN sequence IS NULL THEN head ELSE 4 * head END)
                            AS w(key));
            IF newest IS NOT NULL AND cardinality(walked) < head THEN  -- round again, from the first key
                walked := walked || ARRAY(SELECT w.key FROM pgq._walk_keys(_keyed_pick.queue, '', newest, full_keys,
                                                                           head - cardinality(walked)) AS w(key));
            END IF;
            IF sequence IS NOT NULL THEN
                -- A sequence queue: only the keys whose head may run now (not running, not
                -- retrying later, not halted), at most `head` of them, before any is taken.
                walked := ARRAY(SELECT h.key FROM pgq._sequence_heads(_keyed_pick.queue, walked, sequence = 'halt',
                                                                      _keyed_pick.kinds) AS h
                                LIMIT head);
            END IF;
            -- In turns of as many keys as jobs are still wanted, each turn's keys taken, then
            -- their first jobs (as many as each key allows), the best in the total order first.
            WHILE cardinality(picked) < _keyed_pick.room AND taken < cardinality(walked) LOOP
                turn := walked[taken + 1 : taken + _keyed_pick.room - cardinality(picked)];
                taken := taken + cardinality(turn);
                avail := pgq._take_keys(_keyed_pick.queue, turn, _keyed_pick.room, default_limit, key_rate, period,
                                        _keyed_pick.at);
                IF sequence IS NOT NULL THEN  -- each taken key's head, read again once the key is held
                    picked := picked || ARRAY(
                        SELECT h.id FROM pgq._sequence_heads(_keyed_pick.queue, turn, sequence = 'halt',
                                                             _keyed_pick.kinds) AS h
                        WHERE (avail ->> h.key)::integer > 0
                        ORDER BY h.priority DESC, h.run_at, h.id
                        LIMIT _keyed_pick.room - cardinality(picked));
                    CONTINUE;
                END IF;
                picked := picked || ARRAY(
                    SELECT h.id
                    FROM unnest(turn) AS w(key)
                    CROSS JOIN LATERAL (
                        SELECT j.id, j.priority, j.run_at
                        FROM pgq.jobs AS j
                        WHERE j.queue = _keyed_pick.queue AND j.concurrency_key = w.key
                          AND j.state = 'pending' AND j.attempt < j.max_attempts
                          AND j.run_at <= pgq._now()
                          AND (_keyed_pick.kinds IS NULL OR j.kind = ANY (_keyed_pick.kinds))
                        ORDER BY j.priority DESC, j.run_at, j.id
                        LIMIT (avail ->> w.key)::integer
                    ) AS h
                    WHERE (avail ->> w.key)::integer > 0
                    ORDER BY h.priority DESC, h.run_at, h.id
                    LIMIT _keyed_pick.room - cardinality(picked));
            END LOOP;
        END IF;
    END IF;
    -- The picks are locked here, re-checked on the newest row version (a job cancelled meanwhile,
    -- or one another session holds, is left out); _fair_pick locked its own.
    RETURN QUERY
    SELECT j.id FROM pgq.jobs AS j
    WHERE j.id = ANY (picked) AND j.state = 'pending' AND j.attempt < j.max_attempts
    ORDER BY j.id
    FOR NO KEY UPDATE SKIP LOCKED;
END
$$;

-- The head of `key` in a sequence queue (queues.key_sequence): its oldest job by id that is
-- waiting, pending, running or outcome_unknown, or with `halt` failed; one probe of
-- jobs_key_sequence_idx (with 'continue' it steps over the key's failed jobs still kept, which
-- retention_failed bounds). The one place that says which jobs hold a key (inlined where used).
CREATE OR REPLACE FUNCTION pgq._sequence_head(queue text, key text, halt boolean)
    RETURNS TABLE (id bigint, state pgq.job_state, attempt integer, max_attempts integer, run_at timestamptz,
                   kind text, priority integer)
    LANGUAGE sql STABLE
    AS $$
    SELECT j.id, j.state, j.attempt, j.max_attempts, j.run_at, j.kind, j.priority
    FROM pgq.jobs AS j
    WHERE j.queue = $1 AND j.concurrency_key = $2 AND j.concurrency_key IS NOT NULL
      AND j.state IN ('waiting', 'pending', 'running', 'outcome_unknown', 'failed')
      AND j.id > 0  -- (jobs_key_sequence_idx's predicate: no other query states it, so none uses it)
      AND ($3 OR j.state <> 'failed')
    ORDER BY j.id
    LIMIT 1
$$;

-- A sequence queue's claimable heads among `keys` (pgq._sequence_head), with their priority and
-- run_at (the pick's order, read in the same probe): a key's head when it is pending, due, has an
-- attempt left and is of `kinds` (NULL: any); a key whose head is anything else (running,
-- retrying later, waiting, halted) has none. In the order of `keys`.
CREATE OR REPLACE FUNCTION pgq._sequence_heads(queue text, keys text[], halt boolean, kinds text[])
    RETURNS TABLE (key text, id bigint, priority integer, run_at timestamptz)
    LANGUAGE sql STABLE
    AS $$
    SELECT k.key, h.id, h.priority, h.run_at
    FROM unnest($2) WITH ORDINALITY AS k(key, ord)
    CROSS JOIN LATERAL pgq._sequence_head($1, k.key, $3) AS h
    WHERE h.state = 'pending' AND h.attempt < h.max_attempts AND h.run_at <= pgq._now()
      AND ($4 IS NULL OR h.kind = ANY ($4))
    ORDER BY k.ord
$$;

-- The keys of `keys` (of `queue`) that this transaction now holds, for a claim of their jobs: each
-- key's rows in pgq.key_locks, locked FOR NO KEY UPDATE SKIP LOCKED. A key is held when at least one
-- of its rows was made by another transaction (committed: rows made by this one are nobody else's
-- to see) and this transaction locked every such row it sees. Those rows are the lock of that key
-- in that queue and of nothing else: no hash, no slot shared with another key or queue, so a
-- transaction that holds many keys holds only those.
-- Why every row: a key can have a few rows (an enqueue makes one when it sees none, and two
-- enqueues of a new key at once both make one, never waiting for each other); the rows two
-- snapshots see are one set and a larger one holding it (a snapshot sees a prefix of the order in
-- which transactions ended), so two claims that each lock all they see always meet on a row.
-- A key with no row at all (its rows were pruned, or made before the queue had key limits) gets
-- one here, and is not held in this call: the next claim, once this one commits, holds it.
CREATE OR REPLACE FUNCTION pgq._hold_keys(queue text, keys text[]) RETURNS text[]
    LANGUAGE plpgsql
    AS $$
DECLARE
    me      xid8 := pg_current_xact_id();
    held    text[];
    missing text[];
BEGIN
    SELECT array_agg(w.key) FILTER (WHERE s.others > 0 AND s.others = coalesce(g.n, 0)),
           array_agg(w.key) FILTER (WHERE s.key IS NULL)
    INTO held, missing
    FROM unnest(_hold_keys.keys) AS w(key)
    LEFT JOIN (SELECT k.key, count(*) FILTER (WHERE k.made_by <> me) AS others
               FROM pgq.key_locks AS k WHERE k.queue = _hold_keys.queue AND k.key = ANY (_hold_keys.keys)
               GROUP BY k.key) AS s ON s.key = w.key
    LEFT JOIN (SELECT x.key, count(*) FILTER (WHERE x.made_by <> me) AS n
               FROM (SELECT k.key, k.made_by FROM pgq.key_locks AS k
                     WHERE k.queue = _hold_keys.queue AND k.key = ANY (_hold_keys.keys)
                     FOR NO KEY UPDATE SKIP LOCKED) AS x
               GROUP BY x.key) AS g ON g.key = w.key;
    IF missing IS NOT NULL THEN
        INSERT INTO pgq.key_locks (queue, key) SELECT _hold_keys.queue, m.key FROM unnest(missing) AS m(key);
    END IF;
    RETURN coalesce(held, '{}');
END
$$;

-- For an enqueue into a queue with key limits or rate limits (`q`), of a job whose concurrency_key
-- is `key`: makes the key's row in pgq.key_locks when this transaction sees none (a plain INSERT:
-- it never waits for another transaction's row of the same key; two such rows are as good as
-- one), and the slices of the queue's rate due soon when there are none (pgq._make_slices), so
-- that the claims of the job need not make them.
CREATE OR REPLACE FUNCTION pgq._ready_limits(q pgq.queues, key text) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF _ready_limits.key IS NOT NULL AND (q.key_limited OR q.key_rate_limit > 0) THEN
        PERFORM pgq._keep_key(q.name, _ready_limits.key);
    END IF;
    IF q.rate_limit > 0 THEN
        PERFORM pgq._make_slices(q.name, q.rate_limit, q.rate_period, pgq._rate_clock());
    END IF;
END
$$;

-- A key's row in pgq.key_locks, made when this transaction sees none (pgq._ready_limits,
-- pgq.set_key_limit).
CREATE OR REPLACE FUNCTION pgq._keep_key(queue text, key text) RETURNS void
    LANGUAGE sql
    AS $$
    INSERT INTO pgq.key_locks (queue, key)
    SELECT $1, $2 WHERE NOT EXISTS (SELECT FROM pgq.key_locks AS k WHERE k.queue = $1 AND k.key = $2)
$$;

-- For a keyed pick (pgq._keyed_pick): how many more jobs of each of `keys` this claim may take
-- (key -> number). A key without a limit (and without key_rate): `room`, not held. A limited key is
-- held first (pgq._hold_keys); then, in the next statement (a fresh snapshot, which sees every
-- claim of the key that committed before its rows were free), its free places (its limit less its
-- running jobs, counted in one read of jobs_lease_idx: the running jobs, which the workers' slots
-- bound) and with key_rate its tokens at `at`; a key this call does not hold: 0.
CREATE OR REPLACE FUNCTION pgq._take_keys(queue text, keys text[], room integer, default_limit integer,
                                          key_rate integer, period interval, at timestamptz)
    RETURNS jsonb
    LANGUAGE plpgsql
    SET enable_bitmapscan = off  -- (as pgq._keyed_pick: its running jobs by jobs_lease_idx)
    AS $$
DECLARE
    held text[];  -- the limited keys this transaction holds now
BEGIN
    held := pgq._hold_keys(_take_keys.queue, ARRAY(
                SELECT k.key FROM unnest(_take_keys.keys) AS k(key)
                LEFT JOIN pgq.key_limits AS l ON l.queue = _take_keys.queue AND l.key = k.key
                WHERE pgq._key_limit(l.max_running, _take_keys.default_limit) IS NOT NULL OR _take_keys.key_rate > 0));
    RETURN (
        SELECT coalesce(jsonb_object_agg(k.key, CASE
                   WHEN pgq._key_limit(l.max_running, _take_keys.default_limit) IS NULL AND _take_keys.key_rate = 0
                       THEN _take_keys.room
                   WHEN k.key <> ALL (held) THEN 0
                   ELSE greatest(coalesce(least(
                       pgq._key_limit(l.max_running, _take_keys.default_limit) - coalesce(c.n, 0),
                       CASE WHEN _take_keys.key_rate > 0
                            THEN pgq._tokens(r.tat, _take_keys.key_rate, _take_keys.period, _take_keys.at) END), 0), 0)
                   END), '{}')
        FROM unnest(_take_keys.keys) AS k(key)
        LEFT JOIN pgq.key_limits AS l ON l.queue = _take_keys.queue AND l.key = k.key
        LEFT JOIN pgq.key_rates AS r ON r.queue = _take_keys.queue AND r.key = k.key AND _take_keys.key_rate > 0
        LEFT JOIN (SELECT j.concurrency_key AS key, count(*)::integer AS n
                   FROM pgq.jobs AS j
                   WHERE j.lease_until IS NOT NULL AND j.queue = _take_keys.queue
                     AND j.concurrency_key = ANY (held)
                   GROUP BY j.concurrency_key) AS c ON c.key = k.key);
END
$$;

-- The keys of `queue` with a claimable job, in key order after `after` (and up to `upto`, when
-- given), leaving out `skip`: at most `m` of them, one probe of jobs_key_ready_idx each (and one
-- per skipped key). The walk stops at the first key past `upto` (a bound in the probe itself would
-- be a filter, and the probe past the last key would read every entry after it).
CREATE OR REPLACE FUNCTION pgq._walk_keys(queue text, after text, upto text, skip text[], m integer)
    RETURNS SETOF text
    LANGUAGE sql STABLE
    AS $$
    WITH RECURSIVE walk(key) AS (
        (SELECT j.concurrency_key FROM pgq.jobs AS j
         WHERE j.queue = $1 AND j.state = 'pending' AND j.attempt < j.max_attempts
           AND j.concurrency_key IS NOT NULL AND j.concurrency_key > $2
         ORDER BY j.concurrency_key LIMIT 1)
        UNION ALL
        SELECT (SELECT j.concurrency_key FROM pgq.jobs AS j
                WHERE j.queue = $1 AND j.state = 'pending' AND j.attempt < j.max_attempts
                  AND j.concurrency_key IS NOT NULL AND j.concurrency_key > w.key
                ORDER BY j.concurrency_key LIMIT 1)
        FROM walk AS w WHERE w.key IS NOT NULL AND ($3 IS NULL OR w.key < $3)
    )
    SELECT w.key FROM walk AS w
    WHERE w.key IS NOT NULL AND ($3 IS NULL OR w.key <= $3) AND w.key <> ALL ($4)
    LIMIT $5
$$;

-- Deletes, oldest first, up to max_rows rows of pgq.key_locks made more than an hour ago (pgq.sweep,
-- pgq.prune), each key's rows only when this transaction locks all it sees (FOR UPDATE SKIP LOCKED:
-- a key a claim holds is left for later): a key with no pending job and whose rate bucket (if it
-- has one) is full again loses its rows; a key with pending jobs keeps one row, made afresh (its
-- rows are read again an hour later, and the oldest rows are always the next to look at). A key
-- whose rows are gone gets one again from its next enqueue (or, once, from a claim: see
-- pgq._hold_keys).
CREATE OR REPLACE FUNCTION pgq._prune_key_locks(max_rows integer) RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    gone integer;
BEGIN
    WITH old AS (
        SELECT DISTINCT o.queue, o.key
        FROM (SELECT k.queue, k.key FROM pgq.key_locks AS k
              WHERE k.made_at < now() - interval '1 hour'
              ORDER BY k.made_at LIMIT _prune_key_locks.max_rows) AS o
    ), copies AS (
        SELECT k.queue, k.key, count(*) AS n FROM pgq.key_locks AS k JOIN old AS o USING (queue, key)
        GROUP BY k.queue, k.key
    ), locked AS (
        SELECT x.queue, x.key, count(*) AS n
        FROM (SELECT k.queue, k.key FROM pgq.key_locks AS k
              WHERE (k.queue, k.key) IN (SELECT o.queue, o.key FROM old AS o)
              FOR UPDATE SKIP LOCKED) AS x
        GROUP BY x.queue, x.key
    ), deleted AS (
        DELETE FROM pgq.key_locks AS k
        USING copies AS c JOIN locked AS l USING (queue, key, n)
        WHERE k.queue = c.queue AND k.key = c.key
        RETURNING k.queue, k.key
    ), kept AS (
        INSERT INTO pgq.key_locks (queue, key)
        SELECT DISTINCT d.queue, d.key FROM deleted AS d
        WHERE EXISTS (SELECT FROM pgq.jobs AS j
                      WHERE j.queue = d.queue AND j.concurrency_key = d.key
                        AND j.state = 'pending' AND j.attempt < j.max_attempts AND j.concurrency_key IS NOT NULL)
           OR EXISTS (SELECT FROM pgq.key_rates AS r WHERE r.queue = d.queue AND r.key = d.key
                      AND r.tat > pgq._rate_clock())
        RETURNING 1
    )
    SELECT count(*) - (SELECT count(*) FROM kept) INTO gone FROM deleted;
    RETURN gone;
END
$$;

-- Overrides a queue's key_max_running for one concurrency key (max_running 0: no limit for this
-- key; NULL: the override is removed). Returns the limit now in effect for the key (0: none).
-- Under the queue row's lock, so that claims see the override and queues.key_limited together.
-- A queue that does not exist is refused (22023), as by pause, grant_queue and drop_queue: a typo
-- creates nothing (it used to create the queue).
CREATE OR REPLACE FUNCTION pgq.set_key_limit(queue text, key text, max_running integer)
    RETURNS integer
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET lock_timeout = '5s'
    AS $$
DECLARE
    q pgq.queues;
BEGIN
    PERFORM pgq._check_name('queue', set_key_limit.queue);
    IF set_key_limit.key IS NULL THEN
        PERFORM pgq._bad_argument('key', 'must not be NULL');
    END IF;
    PERFORM pgq._check_concurrency_key('key', set_key_limit.key);
    IF set_key_limit.max_running NOT BETWEEN 0 AND 100000 THEN
        PERFORM pgq._bad_argument('max_running',
            format('must be between 0 (no limit for this key) and 100000, or NULL (remove the override), got %s',
                   set_key_limit.max_running));
    END IF;
    q := pgq._existing_queue('queue', set_key_limit.queue);
    q := pgq._lock_queue(set_key_limit.queue);
    IF q.name IS NULL THEN
        PERFORM pgq._existing_queue('queue', set_key_limit.queue);  -- dropped meanwhile: 22023
    END IF;
    IF q.key_sequence IS NOT NULL THEN
        PERFORM pgq._bad_argument('queue', format('is a sequence queue (key_sequence %s): its keys run one job '
                                                  'at a time, and take no limit of their own', q.key_sequence),
            'pgq.configure_queue(queue, key_sequence => ''off'') ends the sequences first.');
    END IF;
    IF set_key_limit.max_running IS NULL THEN
        DELETE FROM pgq.key_limits AS l WHERE l.queue = set_key_limit.queue AND l.key = set_key_limit.key;
    ELSE
        INSERT INTO pgq.key_limits AS l (queue, key, max_running)
        VALUES (set_key_limit.queue, set_key_limit.key, set_key_limit.max_running)
        ON CONFLICT ON CONSTRAINT key_limits_pkey DO UPDATE SET max_running = excluded.max_running;
    END IF;
    UPDATE pgq.queues AS s
    SET key_limited = s.key_max_running > 0
                      OR EXISTS (SELECT FROM pgq.key_limits AS l WHERE l.queue = set_key_limit.queue)
                      OR s.key_sequence IS NOT NULL
    WHERE s.name = set_key_limit.queue;
    PERFORM pgq._keep_key(set_key_limit.queue, set_key_limit.key);  -- its claims hold it from the first
    RETURN coalesce(set_key_limit.max_running, q.key_max_running);
END
$$;
COMMENT ON FUNCTION pgq.set_key_limit(text, text, integer) IS
    'Overrides the queue''s key_max_running for one concurrency key (NULL removes the override); '
    'returns the limit now in effect for the key (0: none); 22023 when there is no such queue.';

-- Every queue with a limit (max_running, key limits or rate limits; or the named one, 22023 when
-- there is no such queue): its due jobs, its running ones, its limits, and how many of the due
-- jobs each limit holds back now, so that a rate-limited queue can be told from one without
-- workers. Each held_by_* counts the due jobs that limit alone holds back (a job may be held by
-- several): beyond the queue's free places (max_running), beyond their key's free places (key
-- limits), beyond the tokens the queue's bucket holds now (rate_limit), beyond their key's tokens
-- (key_rate_limit). next_token_at: when the queue's bucket holds a token again (NULL: it holds
-- one, or has no rate limit); next_key_token_at: the earliest such moment of a key with held
-- jobs. Its cost: each listed queue's due jobs (jobs_ready_idx) and running jobs (jobs_lease_idx)
-- are read once, and its keys' rows; no finished job is read.
CREATE OR REPLACE FUNCTION pgq.queue_limits(queue text DEFAULT NULL)
    RETURNS TABLE (queue text, paused boolean, ready bigint, running bigint, max_running integer,
                   key_max_running integer, rate_limit integer, rate_period interval,
                   key_rate_limit integer, held_by_max_running bigint, held_by_key_limit bigint,
                   held_by_rate_limit bigint, held_by_key_rate_limit bigint,
                   next_token_at timestamptz, next_key_token_at timestamptz)
    LANGUAGE sql STABLE
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET jit = off
    AS $$
    SELECT pgq._existing_queue('queue', queue_limits.queue) WHERE queue_limits.queue IS NOT NULL;
    WITH clock AS MATERIALIZED (
        SELECT pgq._rate_clock() AS at
    ), listed AS MATERIALIZED (
        SELECT q.* FROM pgq.queues AS q
        WHERE CASE WHEN queue_limits.queue IS NULL THEN q.max_running > 0 OR q.key_limited OR q.rate_limited
                   ELSE q.name = queue_limits.queue END
    ), due AS (
        SELECT j.queue, j.concurrency_key AS key, count(*) AS n
        FROM listed AS q
        JOIN pgq.jobs AS j ON j.queue = q.name AND j.state = 'pending' AND j.attempt < j.max_attempts
                          AND j.run_at <= pgq._now()
        GROUP BY j.queue, j.concurrency_key
    ), leased AS (
        SELECT j.queue, j.concurrency_key AS key, count(*) AS n
        FROM pgq.jobs AS j
        WHERE j.lease_until IS NOT NULL AND j.queue IN (SELECT l.name FROM listed AS l)
        GROUP BY j.queue, j.concurrency_key
    ), keys AS (
        SELECT d.queue,
               sum(greatest(d.n - greatest(pgq._key_limit(l.max_running, q.key_max_running) - coalesce(r.n, 0), 0), 0))
                   AS held_by_key_limit,
               sum(greatest(d.n - pgq._tokens(k.tat, q.key_rate_limit, q.rate_period, c.at), 0))
                   FILTER (WHERE q.key_rate_limit > 0) AS held_by_key_rate_limit,
               min(pgq._next_token_at(k.tat, q.key_rate_limit, q.rate_period, c.at)) AS next_key_token_at
        FROM due AS d
        JOIN listed AS q ON q.name = d.queue
        CROSS JOIN clock AS c
        LEFT JOIN pgq.key_limits AS l ON l.queue = d.queue AND l.key = d.key
        LEFT JOIN leased AS r ON r.queue = d.queue AND r.key = d.key
        LEFT JOIN pgq.key_rates AS k ON k.queue = d.queue AND k.key = d.key
        WHERE d.key IS NOT NULL AND (q.key_limited OR q.key_rate_limit > 0)
        GROUP BY d.queue
    ), totals AS (
        SELECT q.name,
               coalesce((SELECT sum(d.n) FROM due AS d WHERE d.queue = q.name), 0)::bigint AS ready,
               coalesce((SELECT sum(r.n) FROM leased AS r WHERE r.queue = q.name), 0)::bigint AS running
        FROM listed AS q
    )
    SELECT q.name, q.paused, t.ready, t.running, q.max_running, q.key_max_running, q.rate_limit,
           q.rate_period, q.key_rate_limit,
           CASE WHEN q.max_running > 0 THEN greatest(t.ready - greatest(q.max_running - t.running, 0), 0) ELSE 0 END,
           coalesce(k.held_by_key_limit, 0)::bigint,
           CASE WHEN q.rate_limit > 0
                THEN greatest(t.ready - pgq._bucket_tokens(q.name, q.rate_period, c.at), 0) ELSE 0 END,
           coalesce(k.held_by_key_rate_limit, 0)::bigint,
           pgq._bucket_next_token_at(q.name, q.rate_period, c.at),
           CASE WHEN k.held_by_key_rate_limit > 0 THEN k.next_key_token_at END
    FROM listed AS q
    CROSS JOIN clock AS c
    JOIN totals AS t ON t.name = q.name
    LEFT JOIN keys AS k ON k.queue = q.name
    ORDER BY q.name;
$$;
COMMENT ON FUNCTION pgq.queue_limits(text) IS
    'Every queue with a limit (or one): due and running jobs, its limits, how many due jobs each '
    'limit holds back now (held_by_*), and when its next token is due.';
