-- sql/functions/keys.sql: per-key concurrency limits: the keyed pick and pgq.set_key_limit.

-- A key-limited queue's pick (queues.key_limited): up to `room` claimable jobs in the total order
-- (or by fair mode's round-robin), of which at most as many per concurrency_key as the key has
-- free slots (its limit, pgq.key_limits or the queue's key_max_running, less its running jobs);
-- jobs without a key, or of a key without a limit, are not limited. A full key is left out of the
-- scan, so it never blocks the keys behind it.
-- Race-free without the queue's row lock: the claim takes each limited key it meets (a
-- transaction-level advisory lock on (1885827435, hashtext(queue || chr(31) || key)), tried, never
-- waited for) before it counts the key's running jobs, in a statement whose fresh snapshot sees
-- every earlier claim of that key (a transaction's locks are released after its commit is
-- visible). A key another claim holds is left out of this call like a full one, so claims of
-- different keys run side by side, and a claim never waits for another. The keys that look full
-- at the start (a snapshot taken before any lock: a hint, never trusted for a free slot) are left
-- out of the scan at once. Each pass reads the next candidates past the full keys; a pass that
-- fills (or cannot take) a key reads again without it, so at most `room` passes plus one (for a
-- fair queue, one job per _fair_pick call). Returns the picked ids, locked FOR NO KEY UPDATE.
-- A new limit (pgq.set_key_limit, configure_queue) binds the claims that start after it commits.
-- A queue with key_rate_limit also counts each key's tokens at `at` (the claim's rate clock; its
-- queue row is held, as for every rate-limited queue): a key without one is left out like a full
-- key. A rate-limited queue without a per-key step (pgq.queues.rate_limited only) gets its first
-- `room` jobs, locked, or its fair pick.
CREATE OR REPLACE FUNCTION pgq._keyed_pick(queue text, room integer, kinds text[], fair boolean,
                                at timestamptz DEFAULT NULL) RETURNS SETOF bigint
    LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan
    AS $$
DECLARE
    default_limit integer;
    key_limited boolean;       -- queues.key_limited
    key_rate  integer;         -- queues.key_rate_limit (0: none), per period
    period    interval;        -- queues.rate_period
    avail    jsonb := '{}';    -- key -> how many more of its jobs this call may pick, for the keys it holds
    full_keys text[];          -- the keys left out: full, without a token, or held by another claim
    picked   bigint[] := '{}';
    ids      bigint[];         -- a pass's candidates, in order,
    keys     text[];           -- their keys,
    limited  boolean[];        -- and whether their key has a limit (or the queue key_rate_limit)
    held     text[];           -- the limited keys of a pass that this call took now
    met      text[];           -- and all those the pass met for the first time
    filled   boolean;          -- whether this pass filled (or could not take) a key
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
        -- The keys without a token (key_rates_tat_idx: those whose tat is furthest ahead), so that
        -- each key a pass meets has at least one.
        full_keys := full_keys || ARRAY(
            SELECT k.key FROM pgq.key_rates AS k
            WHERE k.queue = _keyed_pick.queue
              AND k.tat > _keyed_pick.at + period - period / key_rate - interval '1 microsecond'
              AND pgq._tokens(k.tat, key_rate, period, _keyed_pick.at) < 1);
    END IF;
    LOOP
        IF _keyed_pick.fair THEN
            SELECT array_agg(j.id), array_agg(j.concurrency_key),
                   array_agg(coalesce(l.max_running, default_limit) > 0 OR key_rate > 0)
            INTO ids, keys, limited
            FROM pgq._fair_pick(_keyed_pick.queue, 1, _keyed_pick.kinds, full_keys, picked) AS f(id)
            JOIN pgq.jobs AS j ON j.id = f.id
            LEFT JOIN pgq.key_limits AS l ON l.queue = _keyed_pick.queue AND l.key = j.concurrency_key;
        ELSE
            SELECT array_agg(x.id ORDER BY x.priority DESC, x.run_at, x.id),
                   array_agg(x.key ORDER BY x.priority DESC, x.run_at, x.id),
                   array_agg(coalesce(l.max_running, default_limit) > 0 OR key_rate > 0
                             ORDER BY x.priority DESC, x.run_at, x.id)
            INTO ids, keys, limited
            FROM (SELECT j.id, j.concurrency_key AS key, j.priority, j.run_at
                  FROM pgq.jobs AS j
                  WHERE j.queue = _keyed_pick.queue
                    AND j.state = 'pending' AND j.attempt < j.max_attempts
                    AND j.run_at <= pgq._now()
                    AND (_keyed_pick.kinds IS NULL OR j.kind = ANY (_keyed_pick.kinds))
                    AND (j.concurrency_key IS NULL OR j.concurrency_key <> ALL (full_keys))
                    AND j.id <> ALL (picked)
                  ORDER BY j.priority DESC, j.run_at, j.id
                  LIMIT _keyed_pick.room - cardinality(picked)) AS x
            LEFT JOIN pgq.key_limits AS l ON l.queue = _keyed_pick.queue AND l.key = x.key;
        END IF;
        EXIT WHEN ids IS NULL;  -- no candidate left
        -- The limited keys met for the first time: each is taken now, or left out for this call.
        met := ARRAY(SELECT DISTINCT c.key FROM unnest(keys, limited) AS c(key, limited)
                     WHERE c.limited AND c.key IS NOT NULL AND NOT avail ? c.key);
        IF met <> '{}' THEN
            held := ARRAY(SELECT m.key FROM unnest(met) AS m(key)
                          WHERE pg_try_advisory_xact_lock(1885827435, hashtext(_keyed_pick.queue || chr(31) || m.key)));
            -- Their free slots (and tokens), in this statement's snapshot, taken after the locks.
            SELECT avail || coalesce(jsonb_object_agg(m.key, coalesce(least(
                       CASE WHEN coalesce(l.max_running, default_limit) > 0
                            THEN coalesce(l.max_running, default_limit) - coalesce(r.n, 0) END,
                       CASE WHEN key_rate > 0 THEN pgq._tokens(k.tat, key_rate, period, _keyed_pick.at) END), 0)), '{}')
            INTO avail
            FROM unnest(met) AS m(key)
            LEFT JOIN (SELECT j.concurrency_key AS key, count(*)::integer AS n
                       FROM pgq.jobs AS j
                       WHERE j.lease_until IS NOT NULL AND j.queue = _keyed_pick.queue
                         AND j.concurrency_key = ANY (held)
                       GROUP BY j.concurrency_key) AS r ON r.key = m.key
            LEFT JOIN pgq.key_limits AS l ON l.queue = _keyed_pick.queue AND l.key = m.key
            LEFT JOIN pgq.key_rates AS k ON k.queue = _keyed_pick.queue AND k.key = m.key AND key_rate > 0
            WHERE m.key = ANY (held);
            -- A key another claim holds: none of its jobs this call.
            avail := avail || coalesce((SELECT jsonb_object_agg(m.key, 0) FROM unnest(met) AS m(key)
                                        WHERE m.key <> ALL (held)), '{}');
        END IF;
        filled := false;
        FOR i IN 1..cardinality(ids) LOOP
            IF keys[i] IS NULL OR NOT limited[i] THEN
                picked := picked || ids[i];
            ELSIF keys[i] <> ALL (full_keys) THEN  -- (a key this pass filled: its later jobs wait)
                n := (avail ->> keys[i])::integer;
                IF n > 0 THEN
                    picked := picked || ids[i];
                    n := n - 1;
                    avail := avail || jsonb_build_object(keys[i], n);
                END IF;
                IF n <= 0 THEN
                    full_keys := full_keys || keys[i];
                    filled := true;
                END IF;
            END IF;
        END LOOP;
        -- A plain pass that filled no key took every job it read: all there are, or enough. A fair
        -- pass reads one job (never of a full key), and goes on while there is one.
        EXIT WHEN cardinality(picked) >= _keyed_pick.room OR (NOT _keyed_pick.fair AND NOT filled);
    END LOOP;
    -- The picks of the plain pass are locked here, re-checked on the newest row version (a job
    -- cancelled meanwhile, or one another session holds, is left out); _fair_pick locked its own.
    RETURN QUERY
    SELECT j.id FROM pgq.jobs AS j
    WHERE j.id = ANY (picked) AND j.state = 'pending' AND j.attempt < j.max_attempts
    ORDER BY j.id
    FOR NO KEY UPDATE SKIP LOCKED;
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
                THEN greatest(t.ready - pgq._tokens(q.rate_tat, q.rate_limit, q.rate_period, c.at), 0) ELSE 0 END,
           coalesce(k.held_by_key_rate_limit, 0)::bigint,
           pgq._next_token_at(q.rate_tat, q.rate_limit, q.rate_period, c.at),
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
