-- sql/functions/keys.sql: per-key concurrency limits: the keyed pick and pgq.set_key_limit.

-- A key-limited queue's pick (queues.key_limited): up to `room` claimable jobs in the total order
-- (or by fair mode's round-robin), of which at most as many per concurrency_key as the key has
-- free slots (its limit, pgq.key_limits or the queue's key_max_running, less its running jobs);
-- jobs without a key, or of a key without a limit, are not limited. A full key never blocks the
-- keys behind it, and the work of one pick is bounded however the queue's jobs fall:
--   1. the head: the queue's first room + 16 candidates in the total order, whatever their keys
--      (one read of jobs_ready_idx of at most that many rows), of which it takes what the keys
--      allow;
--   2. other keys: when the head was all read and the pick is still short (keys at their limit
--      hold the head: a key's jobs in one run, a hot key), the keys with a claimable job that it
--      has not met yet, one probe of jobs_key_ready_idx each, at most room + 16 of them (the full
--      keys it passes are at most the running jobs), walked in key order from where this
--      session's last walk stopped (so every key comes round), and their first jobs, the best
--      in the total order first.
-- Race-free without the queue's row lock: before it counts a limited key's running jobs (in a
-- statement whose fresh snapshot sees every earlier claim of that key: a transaction's row locks
-- are released after its commit is visible), the pick locks the key's slot (pgq.key_slots, a hash
-- of queue and key) FOR NO KEY UPDATE SKIP LOCKED. Claims of one key take turns; claims of
-- different keys run side by side (two keys whose slots meet take turns too); a key whose slot
-- another claim holds is left out of this call like a full one, never waited for. The keys that
-- look full at the start (counted before any lock: a hint, never trusted for a free slot) are
-- left out at once. Returns the picked ids, locked FOR NO KEY UPDATE.
-- A new limit (pgq.set_key_limit, configure_queue) binds the claims that start after it commits.
-- A queue with key_rate_limit also counts each key's tokens at `at` (the claim's rate clock; its
-- queue row is held, as for every rate-limited queue): a key without one is left out like a full
-- key. A rate-limited queue without a per-key step (pgq.queues.rate_limited only) gets its first
-- `room` jobs, locked, or its fair pick. A fair queue's pick goes one job at a time
-- (pgq._fair_pick, passing the keys left out).
CREATE OR REPLACE FUNCTION pgq._keyed_pick(queue text, room integer, kinds text[], fair boolean,
                                at timestamptz DEFAULT NULL) RETURNS SETOF bigint
    LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan
    -- The plans tests/test_sql_plans.py pins, whatever the statistics: a CI run's plan counted the
    -- running jobs by a bitmap scan instead of jobs_lease_idx.
    SET enable_bitmapscan = off
    AS $$
DECLARE
    default_limit integer;
    key_limited boolean;       -- queues.key_limited
    key_rate  integer;         -- queues.key_rate_limit (0: none), per period
    period    interval;        -- queues.rate_period
    avail    jsonb := '{}';    -- key -> how many more of its jobs this call may pick, for the keys met
    full_keys text[];          -- the keys left out: full, without a token, or held by another claim
    picked   bigint[] := '{}';
    ids      bigint[];         -- candidates, in order,
    keys     text[];           -- their keys
    head     integer := _keyed_pick.room + 16;  -- how many candidates the head read takes
    seen     integer;          -- how many it read
    order_keys text[];         -- the candidates' keys not left out, in the order first met
    taken    integer := 0;     -- how many of those (then: of walked) were taken
    walked   text[];           -- the other keys the second step met
    turn     text[];           -- the keys of one turn of that step
    cursor   text;             -- where this session's last walk of this queue's keys stopped
    n        integer;
BEGIN
    SELECT q.key_max_running, q.key_limited, q.key_rate_limit, q.rate_period
    INTO default_limit, key_limited, key_rate, period
    FROM pgq.queues AS q WHERE q.name = _keyed_pick.queue;
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
    -- The keys that look full now (a hint: whether a key has a free slot is counted once it is held).
    full_keys := ARRAY(
        SELECT c.key
        FROM (SELECT j.concurrency_key AS key, count(*)::integer AS n
              FROM pgq.jobs AS j
              WHERE j.lease_until IS NOT NULL AND j.queue = _keyed_pick.queue AND j.concurrency_key IS NOT NULL
              GROUP BY j.concurrency_key) AS c
        LEFT JOIN pgq.key_limits AS l ON l.queue = _keyed_pick.queue AND l.key = c.key
        WHERE coalesce(l.max_running, default_limit) > 0 AND c.n >= coalesce(l.max_running, default_limit));
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
        -- 1. The head of the queue, whatever its keys.
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
        IF ids IS NOT NULL THEN
            -- Each key is taken (pgq._take_keys) when the walk of the candidates first meets it,
            -- with the next keys not met yet, as many as the jobs still wanted: no more keys are
            -- held than the claim could use.
            order_keys := ARRAY(SELECT k.key FROM unnest(keys) WITH ORDINALITY AS k(key, i)
                                WHERE k.key IS NOT NULL AND k.key <> ALL (full_keys)
                                GROUP BY k.key ORDER BY min(k.i));
            FOR i IN 1..cardinality(ids) LOOP
                EXIT WHEN cardinality(picked) >= _keyed_pick.room;
                IF keys[i] IS NULL THEN
                    picked := picked || ids[i];
                ELSIF keys[i] <> ALL (full_keys) THEN
                    IF NOT avail ? keys[i] THEN
                        avail := avail || pgq._take_keys(_keyed_pick.queue,
                                     order_keys[taken + 1 : taken + _keyed_pick.room - cardinality(picked)],
                                     _keyed_pick.room, default_limit, key_rate, period, _keyed_pick.at);
                        taken := taken + _keyed_pick.room - cardinality(picked);
                    END IF;
                    n := (avail ->> keys[i])::integer;
                    IF n > 0 THEN
                        picked := picked || ids[i];
                        avail := avail || jsonb_build_object(keys[i], n - 1);
                    END IF;
                    IF n <= 1 THEN
                        full_keys := full_keys || keys[i];
                    END IF;
                END IF;
            END LOOP;
        END IF;
        -- 2. Other keys' first jobs, when the head was all read and is held by keys left out.
        IF cardinality(picked) < _keyed_pick.room AND seen = head THEN
            cursor := current_setting('pgq.key_walk', true);
            cursor := CASE WHEN split_part(cursor, chr(31), 1) = _keyed_pick.queue THEN split_part(cursor, chr(31), 2) END;
            full_keys := full_keys || ARRAY(SELECT jsonb_object_keys(avail));  -- met already
            taken := 0;
            walked := ARRAY(SELECT w.key FROM pgq._walk_keys(_keyed_pick.queue, coalesce(cursor, ''), NULL, full_keys, head) AS w(key));
            IF cursor IS NOT NULL AND cardinality(walked) < head THEN  -- round again, from the first key
                walked := walked || ARRAY(SELECT w.key FROM pgq._walk_keys(_keyed_pick.queue, '', cursor, full_keys,
                                                                           head - cardinality(walked)) AS w(key));
            END IF;
            -- In turns of as many keys as jobs are still wanted, each turn's keys taken, then
            -- their first jobs (as many as each key allows), the best in the total order first.
            WHILE cardinality(picked) < _keyed_pick.room AND taken < cardinality(walked) LOOP
                turn := walked[taken + 1 : taken + _keyed_pick.room - cardinality(picked)];
                taken := taken + cardinality(turn);
                avail := pgq._take_keys(_keyed_pick.queue, turn, _keyed_pick.room, default_limit, key_rate, period,
                                        _keyed_pick.at);
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
            IF taken > 0 THEN  -- the next walk of this session starts after the last key taken
                PERFORM set_config('pgq.key_walk', _keyed_pick.queue || chr(31) || walked[taken], false);
            END IF;
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

-- The slot of a key (pgq.key_slots): a hash of queue and key, 0 to 16383.
CREATE OR REPLACE FUNCTION pgq._key_slot(queue text, key text) RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT (hashtextextended($1 || chr(31) || $2, 0) & 16383)::integer $$;

-- For a keyed pick (pgq._keyed_pick): how many more jobs of each of `keys` this claim may take
-- (key -> number). A key without a limit (and without key_rate): `room`, unlocked. A limited key:
-- its slot is locked FOR NO KEY UPDATE SKIP LOCKED first; then, in the next statement (a fresh
-- snapshot, which sees every claim of the key that committed before the lock was free), its
-- free slots (its limit less its running jobs, counted in one read of jobs_lease_idx: the running
-- jobs, which the workers' slots bound) and with key_rate
-- its tokens at `at`; a key whose slot another transaction holds: 0.
CREATE OR REPLACE FUNCTION pgq._take_keys(queue text, keys text[], room integer, default_limit integer,
                                          key_rate integer, period interval, at timestamptz)
    RETURNS jsonb
    LANGUAGE plpgsql
    SET enable_bitmapscan = off  -- (as pgq._keyed_pick: its running jobs by jobs_lease_idx)
    AS $$
DECLARE
    wanted integer[];  -- the slots of the limited keys
    held   integer[] := '{}';  -- those this transaction holds now
BEGIN
    wanted := ARRAY(SELECT pgq._key_slot(_take_keys.queue, k.key)
                    FROM unnest(_take_keys.keys) AS k(key)
                    LEFT JOIN pgq.key_limits AS l ON l.queue = _take_keys.queue AND l.key = k.key
                    WHERE coalesce(l.max_running, _take_keys.default_limit) > 0 OR _take_keys.key_rate > 0);
    IF wanted <> '{}' THEN
        held := ARRAY(SELECT s.slot FROM pgq.key_slots AS s WHERE s.slot = ANY (wanted)
                      FOR NO KEY UPDATE SKIP LOCKED);
    END IF;
    RETURN (
        SELECT coalesce(jsonb_object_agg(k.key, CASE
                   WHEN coalesce(l.max_running, _take_keys.default_limit) = 0 AND _take_keys.key_rate = 0
                       THEN _take_keys.room
                   WHEN pgq._key_slot(_take_keys.queue, k.key) <> ALL (held) THEN 0
                   ELSE greatest(coalesce(least(
                       CASE WHEN coalesce(l.max_running, _take_keys.default_limit) > 0
                            THEN coalesce(l.max_running, _take_keys.default_limit) - coalesce(c.n, 0) END,
                       CASE WHEN _take_keys.key_rate > 0
                            THEN pgq._tokens(r.tat, _take_keys.key_rate, _take_keys.period, _take_keys.at) END), 0), 0)
                   END), '{}')
        FROM unnest(_take_keys.keys) AS k(key)
        LEFT JOIN pgq.key_limits AS l ON l.queue = _take_keys.queue AND l.key = k.key
        LEFT JOIN pgq.key_rates AS r ON r.queue = _take_keys.queue AND r.key = k.key AND _take_keys.key_rate > 0
        LEFT JOIN (SELECT j.concurrency_key AS key, count(*)::integer AS n
                   FROM pgq.jobs AS j
                   WHERE j.lease_until IS NOT NULL AND j.queue = _take_keys.queue
                     AND j.concurrency_key = ANY (_take_keys.keys)
                   GROUP BY j.concurrency_key) AS c ON c.key = k.key);
END
$$;

-- The keys of `queue` with a claimable job, in key order after `after` (and up to `upto`, when
-- given), leaving out `skip`: at most `m` of them, one probe of jobs_key_ready_idx each (and one
-- per skipped key). For pgq._keyed_pick's second step.
CREATE OR REPLACE FUNCTION pgq._walk_keys(queue text, after text, upto text, skip text[], m integer)
    RETURNS SETOF text
    LANGUAGE sql STABLE
    AS $$
    WITH RECURSIVE walk(key) AS (
        (SELECT j.concurrency_key FROM pgq.jobs AS j
         WHERE j.queue = $1 AND j.state = 'pending' AND j.attempt < j.max_attempts
           AND j.concurrency_key IS NOT NULL AND j.concurrency_key > $2 AND ($3 IS NULL OR j.concurrency_key <= $3)
         ORDER BY j.concurrency_key LIMIT 1)
        UNION ALL
        SELECT (SELECT j.concurrency_key FROM pgq.jobs AS j
                WHERE j.queue = $1 AND j.state = 'pending' AND j.attempt < j.max_attempts
                  AND j.concurrency_key IS NOT NULL AND j.concurrency_key > w.key
                  AND ($3 IS NULL OR j.concurrency_key <= $3)
                ORDER BY j.concurrency_key LIMIT 1)
        FROM walk AS w WHERE w.key IS NOT NULL
    )
    SELECT w.key FROM walk AS w WHERE w.key IS NOT NULL AND w.key <> ALL ($4) LIMIT $5
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
    WHERE s.name = set_key_limit.queue;
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
               sum(greatest(d.n - greatest(coalesce(l.max_running, q.key_max_running) - coalesce(r.n, 0), 0), 0))
                   FILTER (WHERE coalesce(l.max_running, q.key_max_running) > 0) AS held_by_key_limit,
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
