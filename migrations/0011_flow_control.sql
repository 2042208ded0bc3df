-- pgq migration 0011: flow control, part 1: per-key concurrency (issue 11).
--
-- * A job may carry a concurrency_key (pgq.enqueue, pgq.enqueue_many); at most key_max_running
--   jobs of one (queue, concurrency_key) run at once (pgq.configure_queue), overridden per key by
--   pgq.set_key_limit. Jobs without a key are not limited.
-- * Only a key-limited queue (queues.key_limited) takes the extra step in pgq.claim: its row is
--   locked like a capped queue's and its candidates come from pgq._keyed_pick, which counts the
--   keys' running jobs and leaves full keys out. Other queues' claims are unchanged.
-- * enqueue, enqueue_many and configure_queue gain a parameter (dropped and created again, so
--   their grants are given again below); _fair_pick gains two (the keys and jobs to skip).
-- sql/schema.sql holds the same definitions (tests/test_schema_matches_migrations.py).

ALTER TABLE pgq.queues
    ADD COLUMN key_max_running integer NOT NULL DEFAULT 0,
    ADD COLUMN key_limited boolean NOT NULL DEFAULT false,
    ADD CONSTRAINT queues_key_max_running_check CHECK (key_max_running BETWEEN 0 AND 100000);
COMMENT ON COLUMN pgq.queues.key_max_running IS
    'At most this many jobs of one concurrency_key running at once (pgq.set_key_limit overrides it '
    'per key); 0: no limit. Jobs without a concurrency_key are not limited by it.';
COMMENT ON COLUMN pgq.queues.key_limited IS
    'Whether the queue limits its keys (key_max_running > 0 or a pgq.key_limits row), kept by '
    'pgq.configure_queue and pgq.set_key_limit: only such a queue''s claim takes the per-key step.';

ALTER TABLE pgq.jobs ADD COLUMN concurrency_key text;
COMMENT ON COLUMN pgq.jobs.concurrency_key IS
    'The job''s key for per-key concurrency (queues.key_max_running, pgq.key_limits); NULL: none.';

-- Per-key limits that override a queue's key_max_running for one key (pgq.set_key_limit): a
-- bigger customer gets 5 running jobs where the others get 2. max_running 0: this key has no limit.
CREATE TABLE pgq.key_limits (
    queue        text    NOT NULL REFERENCES pgq.queues (name) ON DELETE CASCADE,
    key          text    NOT NULL,
    max_running  integer NOT NULL,
    PRIMARY KEY (queue, key),
    CONSTRAINT key_limits_max_running_check CHECK (max_running BETWEEN 0 AND 100000)
);
COMMENT ON TABLE pgq.key_limits IS
    'Per-key overrides of queues.key_max_running (pgq.set_key_limit); 0: the key has no limit.';
REVOKE ALL ON pgq.key_limits FROM PUBLIC;

CREATE FUNCTION pgq._check_concurrency_key(argument text, value text) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    IF length(_check_concurrency_key.value) NOT BETWEEN 1 AND 256 THEN
        PERFORM pgq._bad_argument(_check_concurrency_key.argument, 'must be 1 to 256 characters long');
    END IF;
END
$$;

DROP FUNCTION pgq.enqueue(text, text, jsonb, timestamptz, integer, integer, text, text, interval, jsonb);
CREATE FUNCTION pgq.enqueue(queue text, kind text, payload jsonb DEFAULT '{}',
                            run_at timestamptz DEFAULT now(), priority integer DEFAULT 0,
                            max_attempts integer DEFAULT NULL, unique_key text DEFAULT NULL,
                            tenant text DEFAULT NULL, max_run_time interval DEFAULT NULL,
                            meta jsonb DEFAULT NULL, concurrency_key text DEFAULT NULL)
    RETURNS bigint
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
#variable_conflict use_column
DECLARE
    q          pgq.queues;
    new_id     bigint;
    job_tenant text := enqueue.tenant;
BEGIN
    -- Every argument checked in one plain expression (no query, no nested call); only a call that
    -- fails it runs the checks that name the bad argument and raise. (The nested checks cost about
    -- a quarter of an enqueue.)
    IF NOT coalesce(pgq._is_name(enqueue.queue)
                    AND pgq._is_name(enqueue.kind)
                    AND isfinite(enqueue.run_at)
                    AND enqueue.priority BETWEEN -1000 AND 1000
                    AND coalesce(enqueue.max_attempts BETWEEN 1 AND 10000, true)
                    AND coalesce(length(enqueue.tenant) BETWEEN 1 AND 256, true)
                    AND jsonb_typeof(enqueue.payload) = 'object'
                    AND pgq._jsonb_size(enqueue.payload) <= 1048576
                    AND coalesce(octet_length(enqueue.unique_key) BETWEEN 1 AND 1024, true)
                    AND coalesce(enqueue.max_run_time > interval '0'
                                 AND enqueue.max_run_time <= interval '365 days'
                                 AND pgq._is_span(enqueue.max_run_time), true)
                    AND (enqueue.meta IS NULL OR jsonb_typeof(enqueue.meta) = 'object'
                         AND pgq._jsonb_size(enqueue.meta) <= 1048576)
                    AND coalesce(length(enqueue.concurrency_key) BETWEEN 1 AND 256, true), false) THEN
        PERFORM pgq._check_enqueue(enqueue.queue, enqueue.kind, enqueue.run_at, enqueue.priority,
                                   enqueue.max_attempts, enqueue.tenant);
        PERFORM pgq._check_concurrency_key('concurrency_key', enqueue.concurrency_key);
        PERFORM pgq._check_payload('payload', enqueue.payload);
        PERFORM pgq._check_unique_key(enqueue.unique_key);
        IF enqueue.max_run_time IS NOT NULL THEN
            PERFORM pgq._check_interval('max_run_time', enqueue.max_run_time, interval '365 days');
        END IF;
        IF enqueue.meta IS NOT NULL THEN
            PERFORM pgq._check_payload('meta', enqueue.meta);
        END IF;
    END IF;
    -- The queue's writer lock, shared (see pgq.drop_queue), before its settings are read.
    PERFORM pg_advisory_xact_lock_shared(1885827329, hashtext(enqueue.queue));
    SELECT * INTO q FROM pgq.queues AS s WHERE s.name = enqueue.queue;
    IF NOT FOUND THEN
        q := pgq._queue(enqueue.queue);  -- first use: created with the defaults
    END IF;
    IF q.restricted IS NOT NULL AND NOT pgq._may(q.name, q.restricted, 'enqueue') THEN
        PERFORM pgq._denied(q.name, 'enqueue');
    END IF;
    IF q.fair THEN
        job_tenant := pgq._fair_tenant(q.name, job_tenant);
    END IF;

    IF enqueue.unique_key IS NULL THEN
        -- A plain INSERT: ON CONFLICT would make it a speculative insertion even without a key.
        INSERT INTO pgq.jobs AS j (queue, kind, payload, priority, run_at, max_attempts, tenant,
                                   max_run_time, meta, concurrency_key)
        VALUES (enqueue.queue, enqueue.kind, enqueue.payload, enqueue.priority, enqueue.run_at,
                coalesce(enqueue.max_attempts, q.max_attempts), job_tenant, enqueue.max_run_time,
                enqueue.meta, enqueue.concurrency_key)
        RETURNING j.id INTO new_id;
    ELSE
        LOOP
            INSERT INTO pgq.jobs AS j (queue, kind, payload, priority, run_at, max_attempts,
                                       unique_key, tenant, max_run_time, meta, concurrency_key)
            VALUES (enqueue.queue, enqueue.kind, enqueue.payload, enqueue.priority, enqueue.run_at,
                    coalesce(enqueue.max_attempts, q.max_attempts), enqueue.unique_key, job_tenant,
                    enqueue.max_run_time, enqueue.meta, enqueue.concurrency_key)
            ON CONFLICT (queue, unique_key)
                WHERE unique_key IS NOT NULL AND state IN ('pending', 'running', 'outcome_unknown')
                DO NOTHING
            RETURNING j.id INTO new_id;
            EXIT WHEN FOUND;
            -- A live job holds this unique_key: hand back its id. If it finished in the meantime,
            -- the key is free again and the INSERT is tried once more.
            SELECT j.id INTO new_id
            FROM pgq.jobs AS j
            WHERE j.queue = enqueue.queue AND j.unique_key = enqueue.unique_key
              AND j.unique_key IS NOT NULL AND j.state IN ('pending', 'running', 'outcome_unknown');
            IF FOUND THEN
                RETURN new_id;
            END IF;
        END LOOP;
    END IF;

    IF q.notify AND enqueue.run_at <= pgq._now() THEN
        PERFORM pg_notify('pgq', enqueue.queue);
    END IF;
    RETURN new_id;
END
$$;
COMMENT ON FUNCTION pgq.enqueue(text, text, jsonb, timestamptz, integer, integer, text, text, interval, jsonb, text) IS
    'Adds one job and returns its id; with unique_key, returns the id of the live job that holds it. '
    'meta: a JSON object (or NULL) kept with the job and returned by pgq.claim.';

DROP FUNCTION pgq.enqueue_many(text, text, jsonb[], timestamptz, integer, integer, text, interval, jsonb);
CREATE FUNCTION pgq.enqueue_many(queue text, kind text, payloads jsonb[],
                                 run_at timestamptz DEFAULT now(), priority integer DEFAULT 0,
                                 max_attempts integer DEFAULT NULL, tenant text DEFAULT NULL,
                                 max_run_time interval DEFAULT NULL, meta jsonb DEFAULT NULL,
                                 concurrency_key text DEFAULT NULL)
    RETURNS SETOF bigint
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
DECLARE
    q   pgq.queues;
    bad record;
    job_tenant text := enqueue_many.tenant;
BEGIN
    PERFORM pgq._check_enqueue(enqueue_many.queue, enqueue_many.kind, enqueue_many.run_at,
                               enqueue_many.priority, enqueue_many.max_attempts, enqueue_many.tenant);
    IF enqueue_many.max_run_time IS NOT NULL THEN
        PERFORM pgq._check_interval('max_run_time', enqueue_many.max_run_time, interval '365 days');
    END IF;
    IF enqueue_many.meta IS NOT NULL THEN
        PERFORM pgq._check_payload('meta', enqueue_many.meta);
    END IF;
    PERFORM pgq._check_concurrency_key('concurrency_key', enqueue_many.concurrency_key);
    IF enqueue_many.payloads IS NULL THEN
        PERFORM pgq._bad_argument('payloads', 'must not be NULL');
    END IF;
    SELECT p.value, p.n INTO bad
    FROM unnest(enqueue_many.payloads) WITH ORDINALITY AS p(value, n)
    WHERE p.value IS NULL OR jsonb_typeof(p.value) <> 'object' OR pgq._jsonb_size(p.value) > 1048576
    LIMIT 1;
    IF FOUND THEN
        PERFORM pgq._check_payload(format('payloads[%s]', bad.n), bad.value);
    END IF;
    -- The queue's writer lock, shared (see pgq.drop_queue), before its settings are read.
    PERFORM pg_advisory_xact_lock_shared(1885827329, hashtext(enqueue_many.queue));
    q := pgq._queue(enqueue_many.queue);
    IF q.restricted IS NOT NULL AND NOT pgq._may(q.name, q.restricted, 'enqueue') THEN
        PERFORM pgq._denied(q.name, 'enqueue');
    END IF;
    IF q.fair THEN
        job_tenant := pgq._fair_tenant(q.name, job_tenant);
    END IF;

    -- Identity values are drawn in the order the rows are inserted, so ordering by id returns
    -- the ids in payload order.
    RETURN QUERY
    WITH inserted AS (
        INSERT INTO pgq.jobs (queue, kind, payload, priority, run_at, max_attempts, tenant, max_run_time,
                              meta, concurrency_key)
        SELECT enqueue_many.queue, enqueue_many.kind, p.value, enqueue_many.priority,
               enqueue_many.run_at, coalesce(enqueue_many.max_attempts, q.max_attempts),
               job_tenant, enqueue_many.max_run_time, enqueue_many.meta, enqueue_many.concurrency_key
        FROM unnest(enqueue_many.payloads) WITH ORDINALITY AS p(value, n)
        ORDER BY p.n
        RETURNING jobs.id
    )
    SELECT i.id FROM inserted AS i ORDER BY i.id;

    IF q.notify AND enqueue_many.run_at <= pgq._now() AND cardinality(enqueue_many.payloads) > 0 THEN
        PERFORM pg_notify('pgq', enqueue_many.queue);
    END IF;
END
$$;
COMMENT ON FUNCTION pgq.enqueue_many(text, text, jsonb[], timestamptz, integer, integer, text, interval, jsonb, text) IS
    'Adds one job per payload in one INSERT and returns their ids in payload order; each job '
    'gets the same meta.';

DROP FUNCTION pgq.configure_queue(text, interval, integer, interval, interval, interval, boolean, boolean, boolean, integer, interval);
CREATE FUNCTION pgq.configure_queue(queue text, lease interval DEFAULT NULL,
                                    max_attempts integer DEFAULT NULL,
                                    backoff_base interval DEFAULT NULL,
                                    backoff_cap interval DEFAULT NULL,
                                    retention interval DEFAULT NULL,
                                    notify boolean DEFAULT NULL, audit boolean DEFAULT NULL,
                                    fair boolean DEFAULT NULL, max_running integer DEFAULT NULL,
                                    max_run_time interval DEFAULT NULL,
                                    key_max_running integer DEFAULT NULL)
    RETURNS pgq.queues
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET lock_timeout = '5s'
    AS $$
DECLARE
    q pgq.queues := pgq._queue(configure_queue.queue);
BEGIN
    q := pgq._lock_queue(configure_queue.queue);
    IF configure_queue.lease IS NOT NULL THEN
        PERFORM pgq._check_interval('lease', configure_queue.lease, interval '1 day');
    END IF;
    IF configure_queue.max_attempts NOT BETWEEN 1 AND 10000 THEN
        PERFORM pgq._bad_argument('max_attempts',
            format('must be between 1 and 10000, got %s', configure_queue.max_attempts));
    END IF;
    IF configure_queue.backoff_base IS NOT NULL THEN
        PERFORM pgq._check_interval('backoff_base', configure_queue.backoff_base, interval '365 days');
    END IF;
    IF configure_queue.backoff_cap IS NOT NULL THEN
        PERFORM pgq._check_interval('backoff_cap', configure_queue.backoff_cap, interval '365 days');
    END IF;
    IF coalesce(configure_queue.backoff_cap, q.backoff_cap)
       < coalesce(configure_queue.backoff_base, q.backoff_base) THEN
        PERFORM pgq._bad_argument('backoff_cap', 'must not be less than backoff_base');
    END IF;
    PERFORM pgq._check_span('retention', configure_queue.retention);
    IF configure_queue.retention < interval '0' OR configure_queue.retention > interval '3650 days' THEN
        PERFORM pgq._bad_argument('retention', 'must be between 0 and 3650 days');
    END IF;
    IF configure_queue.max_running NOT BETWEEN 0 AND 100000 THEN
        PERFORM pgq._bad_argument('max_running',
            format('must be between 0 (no cap) and 100000, got %s', configure_queue.max_running));
    END IF;
    IF configure_queue.key_max_running NOT BETWEEN 0 AND 100000 THEN
        PERFORM pgq._bad_argument('key_max_running',
            format('must be between 0 (no limit) and 100000, got %s', configure_queue.key_max_running));
    END IF;
    PERFORM pgq._check_span('max_run_time', configure_queue.max_run_time);
    IF configure_queue.max_run_time < interval '0' OR configure_queue.max_run_time > interval '365 days' THEN
        PERFORM pgq._bad_argument('max_run_time',
            format('must be between 0 (no limit) and 365 days, got %s', configure_queue.max_run_time));
    END IF;
    IF configure_queue.fair AND NOT q.fair THEN
        -- Jobs already in the queue join fair mode: those without a tenant get the tenant '',
        -- and every tenant gets its row. (Switch a queue to fair mode before producers use it:
        -- an enqueue that read the queue's settings before this commits stores no tenant, and
        -- fair claims do not see such a job until it is given one.)
        UPDATE pgq.jobs AS j SET tenant = ''
        WHERE j.queue = configure_queue.queue AND j.tenant IS NULL AND j.state <> 'done';
        INSERT INTO pgq.tenants AS t (queue, tenant)
        SELECT DISTINCT j.queue, j.tenant FROM pgq.jobs AS j
        WHERE j.queue = configure_queue.queue AND j.tenant IS NOT NULL AND j.state <> 'done'
        ON CONFLICT DO NOTHING;
    END IF;
    UPDATE pgq.queues AS s
    SET lease = coalesce(configure_queue.lease, s.lease),
        max_attempts = coalesce(configure_queue.max_attempts, s.max_attempts),
        backoff_base = coalesce(configure_queue.backoff_base, s.backoff_base),
        backoff_cap = coalesce(configure_queue.backoff_cap, s.backoff_cap),
        retention = coalesce(configure_queue.retention, s.retention),
        notify = coalesce(configure_queue.notify, s.notify),
        audit = coalesce(configure_queue.audit, s.audit),
        fair = coalesce(configure_queue.fair, s.fair),
        max_running = coalesce(configure_queue.max_running, s.max_running),
        max_run_time = CASE WHEN configure_queue.max_run_time IS NULL THEN s.max_run_time
                            WHEN configure_queue.max_run_time = interval '0' THEN NULL
                            ELSE configure_queue.max_run_time END,
        key_max_running = coalesce(configure_queue.key_max_running, s.key_max_running),
        key_limited = coalesce(configure_queue.key_max_running, s.key_max_running) > 0
                      OR EXISTS (SELECT FROM pgq.key_limits AS l WHERE l.queue = configure_queue.queue)
    WHERE s.name = configure_queue.queue
    RETURNING * INTO q;
    RETURN q;
END
$$;
COMMENT ON FUNCTION pgq.configure_queue(text, interval, integer, interval, interval, interval, boolean, boolean, boolean, integer, interval, integer) IS
    'Changes a queue''s settings (NULL leaves one unchanged; max_run_time ''0'' removes the limit) '
    'and returns them; creates the queue if new.';

CREATE FUNCTION pgq.set_key_limit(queue text, key text, max_running integer)
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
    q := pgq._queue(set_key_limit.queue);
    q := pgq._lock_queue(set_key_limit.queue);
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
    'returns the limit now in effect for the key (0: none).';

DROP FUNCTION pgq._fair_pick(text, integer, text[]);
CREATE FUNCTION pgq._fair_pick(queue text, room integer, kinds text[] DEFAULT NULL,
                               skip_keys text[] DEFAULT NULL, skip_ids bigint[] DEFAULT NULL)
    RETURNS SETOF bigint
    LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan
    AS $$
DECLARE
    busiest double precision;
    picked bigint[];
    served text[];
BEGIN
    IF NOT EXISTS (SELECT FROM pgq.jobs AS j
                   WHERE j.queue = _fair_pick.queue AND j.state = 'pending' AND j.attempt < j.max_attempts
                     AND j.run_at <= pgq._now()
                     AND (_fair_pick.kinds IS NULL OR j.kind = ANY (_fair_pick.kinds))
                     AND (_fair_pick.skip_keys IS NULL OR j.concurrency_key IS NULL
                          OR j.concurrency_key <> ALL (_fair_pick.skip_keys))
                     AND (_fair_pick.skip_ids IS NULL OR j.id <> ALL (_fair_pick.skip_ids))) THEN
        RETURN;  -- no claimable job: no tenant needs to be read
    END IF;
    SELECT t.vtime INTO busiest
    FROM pgq.tenants AS t
    WHERE t.queue = _fair_pick.queue
    ORDER BY t.vtime DESC
    LIMIT 1;
    IF NOT FOUND THEN
        RETURN;  -- no tenant
    END IF;

    picked := ARRAY(
        WITH ranked AS (
            SELECT t.tenant, t.weight, greatest(t.vtime, busiest - 1) AS vstart
            FROM pgq.tenants AS t
            WHERE t.queue = _fair_pick.queue
              AND EXISTS (SELECT FROM pgq.jobs AS j
                          WHERE j.queue = t.queue AND j.tenant = t.tenant
                            AND j.state = 'pending' AND j.attempt < j.max_attempts AND j.tenant IS NOT NULL
                            AND j.run_at <= pgq._now()
                            AND (_fair_pick.kinds IS NULL OR j.kind = ANY (_fair_pick.kinds))
                            AND (_fair_pick.skip_keys IS NULL OR j.concurrency_key IS NULL
                                 OR j.concurrency_key <> ALL (_fair_pick.skip_keys))
                            AND (_fair_pick.skip_ids IS NULL OR j.id <> ALL (_fair_pick.skip_ids)))
            ORDER BY t.vtime, t.tenant
            LIMIT _fair_pick.room
        )
        SELECT c.id
        FROM ranked AS r
        CROSS JOIN LATERAL (
            SELECT x.id, x.priority, x.run_at,
                   row_number() OVER (ORDER BY x.priority DESC, x.run_at, x.id) AS k
            FROM (
                SELECT j.id, j.priority, j.run_at
                FROM pgq.jobs AS j
                WHERE j.queue = _fair_pick.queue AND j.tenant = r.tenant
                  AND j.state = 'pending' AND j.attempt < j.max_attempts AND j.tenant IS NOT NULL
                  AND j.run_at <= pgq._now()
                  AND (_fair_pick.kinds IS NULL OR j.kind = ANY (_fair_pick.kinds))
                  AND (_fair_pick.skip_keys IS NULL OR j.concurrency_key IS NULL
                       OR j.concurrency_key <> ALL (_fair_pick.skip_keys))
                  AND (_fair_pick.skip_ids IS NULL OR j.id <> ALL (_fair_pick.skip_ids))
                ORDER BY j.priority DESC, j.run_at, j.id
                LIMIT _fair_pick.room
                FOR NO KEY UPDATE SKIP LOCKED
            ) AS x
        ) AS c
        ORDER BY r.vstart + c.k::float8 / r.weight, c.priority DESC, c.run_at, c.id
        LIMIT _fair_pick.room);

    -- (The tenants as arrays, so that both statements read them by primary key: joined, the
    -- generic plan read every tenant of the queue.)
    served := ARRAY(SELECT t.tenant FROM pgq.tenants AS t
                    WHERE t.queue = _fair_pick.queue
                      AND t.tenant = ANY (ARRAY(SELECT j.tenant FROM pgq.jobs AS j WHERE j.id = ANY (picked)))
                    FOR NO KEY UPDATE SKIP LOCKED);
    picked := ARRAY(SELECT j.id FROM pgq.jobs AS j WHERE j.id = ANY (picked) AND j.tenant = ANY (served));
    UPDATE pgq.tenants AS t
    SET vtime = greatest(t.vtime, busiest - 1) + s.n::float8 / t.weight
    FROM (SELECT j.tenant, count(*) AS n FROM pgq.jobs AS j WHERE j.id = ANY (picked) GROUP BY j.tenant) AS s
    WHERE t.queue = _fair_pick.queue AND t.tenant = ANY (served) AND t.tenant = s.tenant;

    RETURN QUERY SELECT unnest(picked);
END
$$;

CREATE FUNCTION pgq._keyed_pick(queue text, room integer, kinds text[], fair boolean) RETURNS SETOF bigint
    LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan
    AS $$
DECLARE
    default_limit integer;
    slots    jsonb;            -- key -> free slots, for the limited keys seen so far
    full_keys text[];          -- the keys without a free slot
    picked   bigint[] := '{}';
    filled   boolean;          -- whether this pass filled a key
    before   integer;          -- how many were picked before this pass
    r        record;
    n        integer;
BEGIN
    SELECT q.key_max_running INTO default_limit FROM pgq.queues AS q WHERE q.name = _keyed_pick.queue;
    SELECT coalesce(jsonb_object_agg(c.key, coalesce(l.max_running, default_limit) - c.n), '{}')
    INTO slots
    FROM (SELECT j.concurrency_key AS key, count(*)::integer AS n
          FROM pgq.jobs AS j
          WHERE j.lease_until IS NOT NULL AND j.queue = _keyed_pick.queue AND j.concurrency_key IS NOT NULL
          GROUP BY j.concurrency_key) AS c
    LEFT JOIN pgq.key_limits AS l ON l.queue = _keyed_pick.queue AND l.key = c.key
    WHERE coalesce(l.max_running, default_limit) > 0;
    full_keys := ARRAY(SELECT e.key FROM jsonb_each(slots) AS e(key, value) WHERE e.value::integer <= 0);
    LOOP
        filled := false;
        before := cardinality(picked);
        FOR r IN
            SELECT x.id, x.key, coalesce(l.max_running, default_limit) AS max_running
            FROM pgq._fair_pick(_keyed_pick.queue, 1, _keyed_pick.kinds, full_keys, picked) AS f(id)
            JOIN LATERAL (SELECT j.id, j.concurrency_key AS key FROM pgq.jobs AS j WHERE j.id = f.id) AS x ON true
            LEFT JOIN pgq.key_limits AS l ON l.queue = _keyed_pick.queue AND l.key = x.key
            WHERE _keyed_pick.fair
            UNION ALL
            SELECT x.id, x.key, coalesce(l.max_running, default_limit)
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
            LEFT JOIN pgq.key_limits AS l ON l.queue = _keyed_pick.queue AND l.key = x.key
            WHERE NOT _keyed_pick.fair
        LOOP
            IF r.key IS NULL OR r.max_running = 0 THEN
                picked := picked || r.id;
            ELSIF r.key <> ALL (full_keys) THEN  -- (a key this pass filled: its later jobs wait)
                n := coalesce((slots ->> r.key)::integer, r.max_running) - 1;
                slots := slots || jsonb_build_object(r.key, n);
                picked := picked || r.id;
                IF n <= 0 THEN
                    full_keys := full_keys || r.key;
                    filled := true;
                END IF;
            END IF;
        END LOOP;
        -- A plain pass that filled no key took every job it read: all there are, or enough. A fair
        -- pass reads one job (never of a full key): it goes on while there was one.
        EXIT WHEN cardinality(picked) >= _keyed_pick.room
                  OR CASE WHEN _keyed_pick.fair THEN cardinality(picked) = before ELSE NOT filled END;
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

CREATE OR REPLACE FUNCTION pgq.claim(worker text, queues text[] DEFAULT NULL, batch integer DEFAULT 1,
                          lease interval DEFAULT NULL, kinds text[] DEFAULT NULL)
    RETURNS SETOF pgq.claimed_job
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET plan_cache_mode = force_generic_plan
    -- A generic plan's cost can pass jit_above_cost on stale statistics (after a plain VACUUM,
    -- say), and compiling it then costs ~25 ms per claim: never worth it for a handful of rows.
    SET jit = off
    AS $$
DECLARE
    names    text[];     -- the eligible queues, in name order
    rooms    integer[];  -- how many jobs each may start now
    fairs    boolean[];  -- whether each is in fair mode
    keyeds   boolean[];  -- whether each limits its concurrency keys (queues.key_limited)
    fair_ids bigint[] := '{}';
    keyed_ids bigint[] := '{}';
    capped   boolean;    -- whether any of them has max_running or key limits
    locked   text[];     -- then: the capped ones this call holds (the others are skipped)
    expired  boolean;    -- whether any lease has expired
    due      boolean;    -- whether one of them has a schedule due
    due_queues text[];   -- then: the eligible queues, whose due schedules fire
BEGIN
    IF claim.worker IS NULL THEN
        PERFORM pgq._bad_argument('worker', 'must not be NULL');
    ELSIF length(claim.worker) NOT BETWEEN 1 AND 256 THEN
        PERFORM pgq._bad_argument('worker', 'must be 1 to 256 characters long');
    END IF;
    IF claim.batch IS NULL THEN
        PERFORM pgq._bad_argument('batch', 'must not be NULL');
    ELSIF claim.batch NOT BETWEEN 1 AND 1000 THEN
        PERFORM pgq._bad_argument('batch', format('must be between 1 and 1000, got %s', claim.batch));
    END IF;
    IF claim.lease IS NOT NULL THEN
        PERFORM pgq._check_interval('lease', claim.lease, interval '1 day');
    END IF;
    IF claim.queues IS NOT NULL AND (cardinality(claim.queues) = 0 OR array_position(claim.queues, NULL) IS NOT NULL) THEN
        PERFORM pgq._bad_argument('queues', 'must be NULL (all queues) or a non-empty array without NULLs');
    END IF;
    -- A malformed name can never match a queue: say so instead of claiming nothing forever.
    -- Names cannot contain a comma, so one match of the joined names (pgq._is_name's pattern,
    -- repeated) checks them all in a plain expression (no query), and so does the length (no
    -- run of 129 characters without a comma; a joined list of 128 or fewer cannot hold one, and
    -- skips that match); the joined names hold exactly one comma fewer than there are names (a
    -- name 'a,b' would otherwise pass as two). Only a bad name pays for the per-name check that
    -- names it.
    IF claim.queues IS NOT NULL AND NOT coalesce(
           array_to_string(claim.queues, ',')
               ~ '^[A-Za-z0-9_][A-Za-z0-9_.:/-]*(,[A-Za-z0-9_][A-Za-z0-9_.:/-]*)*$'
           AND length(array_to_string(claim.queues, ',')) - length(replace(array_to_string(claim.queues, ','), ',', ''))
               = cardinality(claim.queues) - 1
           AND (length(array_to_string(claim.queues, ',')) <= 128
                OR array_to_string(claim.queues, ',') !~ '[^,]{129}'), false) THEN
        PERFORM pgq._check_name(format('queues[%s]', q.n), q.name)
        FROM unnest(claim.queues) WITH ORDINALITY AS q(name, n);
    END IF;
    -- The kinds are checked the same way, and only when given.
    IF claim.kinds IS NOT NULL THEN
        IF cardinality(claim.kinds) NOT BETWEEN 1 AND 1000 OR array_position(claim.kinds, NULL) IS NOT NULL THEN
            PERFORM pgq._bad_argument('kinds',
                'must be NULL (any kind) or an array of 1 to 1000 kinds without NULLs');
        END IF;
        IF NOT coalesce(
               array_to_string(claim.kinds, ',')
                   ~ '^[A-Za-z0-9_][A-Za-z0-9_.:/-]*(,[A-Za-z0-9_][A-Za-z0-9_.:/-]*)*$'
               AND length(array_to_string(claim.kinds, ',')) - length(replace(array_to_string(claim.kinds, ','), ',', ''))
                   = cardinality(claim.kinds) - 1
               AND (length(array_to_string(claim.kinds, ',')) <= 128
                    OR array_to_string(claim.kinds, ',') !~ '[^,]{129}'), false) THEN
            PERFORM pgq._check_name(format('kinds[%s]', k.n), k.name)
            FROM unnest(claim.kinds) WITH ORDINALITY AS k(name, n);
        END IF;
    END IF;

    -- The failover fence, checked once per session (a session never outlives a promotion).
    IF coalesce(current_setting('pgq.fence', true), '') = '' THEN
        PERFORM pgq._check_timeline();
    END IF;

    -- One statement reads the eligible queues (and whether one of them has a schedule due: a
    -- column of the rows read anyway, and bool_or, which allocates nothing, unlike array_agg) and
    -- probes for expired leases (one index probe). With queues => NULL the candidates are the
    -- queues that have a pending job, found by a skip scan of jobs_ready_idx (the next queue name
    -- after the last, one index probe each: queues without jobs are never read), and those with a
    -- due schedule (queues_schedule_due_idx).
    FOR pass IN 1..2 LOOP
        SELECT array_agg(q.name ORDER BY q.name), array_agg(q.fair ORDER BY q.name),
               coalesce(bool_or(q.max_running > 0 OR q.key_limited), false),
               EXISTS (SELECT FROM pgq.jobs AS j WHERE j.state = 'running' AND j.lease_until < pgq._now()),
               coalesce(bool_or(q.next_schedule_at <= pgq._now()), false)
        INTO names, fairs, capped, expired, due
        FROM pgq.queues AS q
        WHERE NOT q.paused
          AND q.name = ANY (coalesce(claim.queues, ARRAY(
                  WITH RECURSIVE pending(name) AS (
                      (SELECT j.queue FROM pgq.jobs AS j
                       WHERE j.state = 'pending' AND j.attempt < j.max_attempts
                       ORDER BY j.queue LIMIT 1)
                      UNION ALL
                      SELECT (SELECT j.queue FROM pgq.jobs AS j
                              WHERE j.queue > p.name AND j.state = 'pending' AND j.attempt < j.max_attempts
                              ORDER BY j.queue LIMIT 1)
                      FROM pending AS p WHERE p.name IS NOT NULL
                  )
                  SELECT p.name FROM pending AS p WHERE p.name IS NOT NULL
                  UNION ALL
                  SELECT u.name FROM pgq.queues AS u WHERE u.next_schedule_at <= pgq._now())))
          -- A queue with grants admits only some logins (a named one raises 42501 for the others).
          AND (q.restricted IS NULL OR pgq._may_claim(q.name, q.restricted, claim.queues IS NOT NULL));

        -- Expired leases are recovered first, so their jobs are claimable by this very claim
        -- (with queues => NULL, their queues are candidates only once recovered: read again).
        EXIT WHEN pass = 2 OR NOT expired;
        PERFORM pgq._recover_expired(100);
        EXIT WHEN claim.queues IS NOT NULL;
    END LOOP;
    IF names IS NULL THEN
        RETURN;  -- no eligible queue
    END IF;
    IF due THEN
        due_queues := names;  -- before the capped queues' rooms narrow names down
    END IF;

    IF NOT capped THEN
        rooms := array_fill(claim.batch, ARRAY[cardinality(names)]);
        keyeds := array_fill(false, ARRAY[cardinality(names)]);
    ELSE
        -- Capped queues are locked before their running jobs are counted by the next statement,
        -- whose fresh snapshot sees every earlier claim; one that another transaction holds is
        -- skipped (this call claims none of its jobs), never waited for. (Under REPEATABLE READ or
        -- SERIALIZABLE that count would come from an older snapshot and could pass the cap: such
        -- a claim of a capped queue is refused.)
        IF current_setting('transaction_isolation') <> 'read committed' THEN
            RAISE EXCEPTION 'pgq: a claim of a queue with max_running or key limits must run at READ COMMITTED, not %',
                upper(current_setting('transaction_isolation'))
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      HINT = 'Claim in autocommit mode, or in a READ COMMITTED transaction.';
        END IF;
        locked := ARRAY(SELECT q.name FROM pgq.queues AS q
                        WHERE (q.max_running > 0 OR q.key_limited) AND NOT q.paused AND q.name = ANY (names)
                        FOR NO KEY UPDATE SKIP LOCKED);

        SELECT array_agg(e.name ORDER BY e.name), array_agg(e.room ORDER BY e.name),
               array_agg(e.fair ORDER BY e.name), array_agg(e.key_limited ORDER BY e.name)
        INTO names, rooms, fairs, keyeds
        FROM (
            SELECT q.name, q.fair, q.key_limited,
                   CASE WHEN q.max_running = 0 THEN claim.batch
                        ELSE least(claim.batch, q.max_running - (
                                 SELECT count(*) FROM pgq.jobs AS j
                                 WHERE j.lease_until IS NOT NULL AND j.queue = q.name)::integer)
                   END AS room
            FROM pgq.queues AS q
            WHERE NOT q.paused AND q.name = ANY (names)
              AND ((q.max_running = 0 AND NOT q.key_limited) OR q.name = ANY (locked))
        ) AS e
        WHERE e.room > 0;
    END IF;

    -- Then the due schedules of these queues fire (at most 10 per claim; a sweep fires the rest),
    -- after the capped queues are locked: the firing only ever skips locked queue rows, so a
    -- claim waits for queue locks in name order alone. Under REPEATABLE READ a claim leaves them
    -- to READ COMMITTED claims and sweeps: its snapshot could make a concurrent firing a
    -- serialization failure of the claim.
    IF due AND current_setting('transaction_isolation') = 'read committed' THEN
        PERFORM pgq._fire_schedules(10, due_queues);
    END IF;

    IF true = ANY (fairs) THEN
        fair_ids := ARRAY(SELECT f.id
                          FROM unnest(names, rooms, fairs, keyeds) AS e(name, room, fair, keyed)
                          CROSS JOIN LATERAL pgq._fair_pick(e.name, e.room, claim.kinds) AS f(id)
                          WHERE e.fair AND NOT e.keyed);
    END IF;
    IF true = ANY (keyeds) THEN
        keyed_ids := ARRAY(SELECT f.id
                           FROM unnest(names, rooms, fairs, keyeds) AS e(name, room, fair, keyed)
                           CROSS JOIN LATERAL pgq._keyed_pick(e.name, e.room, claim.kinds, e.fair) AS f(id)
                           WHERE e.keyed);
    END IF;

    RETURN QUERY
    WITH picked AS (
        -- For each eligible queue, its first claimable jobs in index order (up to its room);
        -- with the fair queues' picks, the best `batch` of those across queues.
        SELECT c.id
        FROM (
            SELECT c.id, c.priority, c.run_at
            FROM unnest(names, rooms, fairs, keyeds) AS e(queue, room, fair, keyed)
            CROSS JOIN LATERAL (
                SELECT j.id, j.priority, j.run_at
                FROM pgq.jobs AS j
                WHERE j.queue = e.queue
                  AND j.state = 'pending' AND j.attempt < j.max_attempts
                  AND j.run_at <= pgq._now()
                ORDER BY j.priority DESC, j.run_at, j.id
                LIMIT e.room
                FOR NO KEY UPDATE SKIP LOCKED
            ) AS c
            WHERE NOT e.fair AND NOT e.keyed AND claim.kinds IS NULL
            UNION ALL
            -- The same per (queue, kind) when the worker named its kinds (each kind once; no
            -- rows for NULL). Inside this one statement: a query of its own would cost a claim
            -- more than the per-kind picks do.
            SELECT c.id, c.priority, c.run_at
            FROM unnest(names, rooms, fairs, keyeds) AS e(queue, room, fair, keyed)
            CROSS JOIN (SELECT DISTINCT w.kind FROM unnest(claim.kinds) AS w(kind)) AS k
            CROSS JOIN LATERAL (
                SELECT j.id, j.priority, j.run_at
                FROM pgq.jobs AS j
                WHERE j.queue = e.queue AND j.kind = k.kind
                  AND j.state = 'pending' AND j.attempt < j.max_attempts
                  AND j.run_at <= pgq._now()
                ORDER BY j.priority DESC, j.run_at, j.id
                LIMIT e.room
                FOR NO KEY UPDATE SKIP LOCKED
            ) AS c
            WHERE NOT e.fair AND NOT e.keyed
            UNION ALL
            -- The fair and the key-limited queues' picks (pgq._fair_pick, pgq._keyed_pick).
            SELECT j.id, j.priority, j.run_at FROM pgq.jobs AS j WHERE j.id = ANY (fair_ids || keyed_ids)
        ) AS c
        ORDER BY c.priority DESC, c.run_at, c.id
        LIMIT claim.batch
    ), claimed AS (
        UPDATE pgq.jobs AS j
        SET state = 'running',
            -- The next number, past any a fence move skipped (attempt_skip is 0 but after a promotion).
            attempt = j.attempt + 1 + j.attempt_skip,
            max_attempts = j.max_attempts + j.attempt_skip,
            attempt_offset = j.attempt_offset + j.attempt_skip,
            attempt_skip = 0,
            lease_until = least(pgq._now() + coalesce(claim.lease, q.lease),
                                pgq._now() + coalesce(j.max_run_time, q.max_run_time)),
            deadline = pgq._now() + coalesce(j.max_run_time, q.max_run_time),
            claimed_by = claim.worker,
            claimed_at = pgq._now(),
            session_role = session_user,
            last_event = 'claimed'
        FROM pgq.queues AS q
        -- The picked ids as an array: the generic plan then reads them by primary key. Joined
        -- to the CTE instead, it hashed the CTE and read the whole table (every row ever
        -- enqueued and not yet pruned) on every claim.
        WHERE j.id = ANY (ARRAY(SELECT p.id FROM picked AS p)) AND q.name = j.queue
        RETURNING j.id, j.queue, j.kind, j.payload, j.priority, j.attempt, j.max_attempts,
                  j.run_at, j.created_at, j.lease_until, j.tenant, j.progress, j.deadline, j.meta,
                  q.audit
    ), events AS (
        INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state)
        SELECT c.id, c.attempt, claim.worker, 'claimed', 'pending', 'running'
        FROM claimed AS c WHERE c.audit
    )
    SELECT c.id, c.queue, c.kind, c.payload, c.priority, c.attempt, c.max_attempts,
           c.run_at, c.created_at, c.lease_until, c.tenant, c.progress, c.deadline, c.meta
    FROM claimed AS c
    ORDER BY c.priority DESC, c.run_at, c.id;
END
$$;
COMMENT ON FUNCTION pgq.claim(text, text[], integer, interval, text[]) IS
    'Claims up to batch due jobs (of kinds, when given) for worker, in order priority DESC, run_at, '
    'id. The returned '
    'attempt is the fencing token for renew, complete, fail, release, snooze and mark_unknown.';

CREATE OR REPLACE FUNCTION pgq.version() RETURNS text
    LANGUAGE sql IMMUTABLE
    AS $$ SELECT '11'::text $$;

REVOKE EXECUTE ON FUNCTION
    pgq._check_concurrency_key(text, text),
    pgq.enqueue(text, text, jsonb, timestamptz, integer, integer, text, text, interval, jsonb, text),
    pgq.enqueue_many(text, text, jsonb[], timestamptz, integer, integer, text, interval, jsonb, text),
    pgq.configure_queue(text, interval, integer, interval, interval, interval, boolean, boolean, boolean, integer, interval, integer),
    pgq.set_key_limit(text, text, integer),
    pgq._fair_pick(text, integer, text[], text[], bigint[]),
    pgq._keyed_pick(text, integer, text[], boolean)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    pgq.enqueue(text, text, jsonb, timestamptz, integer, integer, text, text, interval, jsonb, text),
    pgq.enqueue_many(text, text, jsonb[], timestamptz, integer, integer, text, interval, jsonb, text)
    TO pgq_producer;
GRANT EXECUTE ON FUNCTION
    pgq.configure_queue(text, interval, integer, interval, interval, interval, boolean, boolean, boolean, integer, interval, integer),
    pgq.set_key_limit(text, text, integer)
    TO pgq_admin;
