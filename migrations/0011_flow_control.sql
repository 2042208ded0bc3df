-- pgq migration 0011: flow control: per-key concurrency and rate limits (issue 11).
--
-- * A job may carry a concurrency_key (pgq.enqueue, pgq.enqueue_many); at most key_max_running
--   jobs of one (queue, concurrency_key) run at once (pgq.configure_queue), overridden per key by
--   pgq.set_key_limit. Jobs without a key are not limited.
-- * Only a key-limited queue (queues.key_limited) takes the extra step in pgq.claim: its row is
--   locked like a capped queue's and its candidates come from pgq._keyed_pick, which counts the
--   keys' running jobs and leaves full keys out. Other queues' claims are unchanged.
-- * Rate limits (part 2): at most rate_limit jobs of a queue claimed per rate_period, and at most
--   key_rate_limit of one concurrency_key (pgq.configure_queue), as GCRA buckets (a burst of at
--   most the limit, then the limit per period) whose state (queues.rate_tat, pgq.key_rates) a
--   claim reads and writes under the queue's row lock, at pgq._rate_clock(). A rate-limited
--   queue (queues.rate_limited) takes the capped queues' locked path and pgq._keyed_pick, so the
--   tokens spent are those of the jobs handed out. pgq.queue_limits shows what each limit holds
--   back; pgq.rate_limit_wait tells a worker when the next token is due. pgq.sweep and pgq.prune
--   delete the per-key buckets that are full again.
-- * enqueue, enqueue_many and configure_queue gain a parameter (dropped and created again, so
--   their grants are given again below); _fair_pick gains two (the keys and jobs to skip).
-- sql/schema.sql holds the same definitions (tests/test_schema_matches_migrations.py).

ALTER TABLE pgq.queues
    ADD COLUMN key_max_running integer NOT NULL DEFAULT 0,
    ADD COLUMN key_limited boolean NOT NULL DEFAULT false,
    ADD COLUMN rate_limit integer NOT NULL DEFAULT 0,
    ADD COLUMN rate_period interval NOT NULL DEFAULT '1 second',
    ADD COLUMN key_rate_limit integer NOT NULL DEFAULT 0,
    ADD COLUMN rate_limited boolean NOT NULL DEFAULT false,
    ADD COLUMN rate_tat timestamptz,
    ADD CONSTRAINT queues_rate_check CHECK (rate_limit BETWEEN 0 AND 1000000 AND key_rate_limit BETWEEN 0 AND 1000000
                                            AND rate_period > '0' AND rate_period <= '1 day'
                                            AND pgq._is_span(rate_period)),
    ADD CONSTRAINT queues_key_max_running_check CHECK (key_max_running BETWEEN 0 AND 100000);
COMMENT ON COLUMN pgq.queues.key_max_running IS
    'At most this many jobs of one concurrency_key running at once (pgq.set_key_limit overrides it '
    'per key); 0: no limit. Jobs without a concurrency_key are not limited by it.';
COMMENT ON COLUMN pgq.queues.key_limited IS
    'Whether the queue limits its keys (key_max_running > 0 or a pgq.key_limits row), kept by '
    'pgq.configure_queue and pgq.set_key_limit: only such a queue''s claim takes the per-key step.';
COMMENT ON COLUMN pgq.queues.rate_limit IS
    'At most this many jobs of the queue claimed per rate_period (a burst of at most rate_limit, '
    'then rate_limit per rate_period); 0: no limit.';
COMMENT ON COLUMN pgq.queues.rate_period IS
    'The period of rate_limit and key_rate_limit.';
COMMENT ON COLUMN pgq.queues.key_rate_limit IS
    'At most this many jobs of one concurrency_key claimed per rate_period; 0: no limit. Jobs '
    'without a concurrency_key are not limited by it.';
COMMENT ON COLUMN pgq.queues.rate_limited IS
    'Whether the queue has a rate limit (rate_limit > 0 or key_rate_limit > 0), kept by '
    'pgq.configure_queue: only such a queue''s claim takes the rate step.';
COMMENT ON COLUMN pgq.queues.rate_tat IS
    'The rate limit''s state (GCRA): the moment its bucket is full again (NULL or past: full now). '
    'Written by pgq.claim under the queue''s row lock.';

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

-- The per-key rate limits' state (queues.key_rate_limit): one row per (queue, key) whose bucket
-- is not full, written by pgq.claim under the queue's row lock (upserted); rows whose bucket is
-- full again are deleted by pgq.sweep and pgq.prune (pgq._prune_key_rates), so the table holds
-- the keys claimed in about the last rate_period.
CREATE TABLE pgq.key_rates (
    queue text        NOT NULL REFERENCES pgq.queues (name) ON DELETE CASCADE,
    key   text        NOT NULL,
    tat   timestamptz NOT NULL,
    PRIMARY KEY (queue, key)
);
COMMENT ON TABLE pgq.key_rates IS
    'Per-key rate limit state (GCRA): tat is when the key''s bucket is full again.';
REVOKE ALL ON pgq.key_rates FROM PUBLIC;
-- The keys without a token now (tat furthest ahead), read by each claim of a key-rate-limited queue.
CREATE INDEX key_rates_tat_idx ON pgq.key_rates (queue, tat);

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
CREATE FUNCTION pgq._rate_clock() RETURNS timestamptz
    LANGUAGE sql VOLATILE PARALLEL SAFE
    AS $$ SELECT clock_timestamp() $$;
COMMENT ON FUNCTION pgq._rate_clock() IS
    'The clock of the rate limits: clock_timestamp(), read once the claim holds its queue rows.';

-- How many tokens a bucket (its tat, rate and period) holds at `at`.
CREATE FUNCTION pgq._tokens(tat timestamptz, rate integer, period interval, at timestamptz) RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT CASE WHEN $1 IS NULL OR $1 <= $4 THEN $2
                ELSE greatest(floor(extract(epoch FROM $3 - ($1 - $4)) * $2 / extract(epoch FROM $3)), 0)::integer
           END
$$;

-- When a bucket holds a token again; NULL when it holds one at `at` (or has no rate).
CREATE FUNCTION pgq._next_token_at(tat timestamptz, rate integer, period interval, at timestamptz)
    RETURNS timestamptz
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT CASE WHEN $2 > 0 AND pgq._tokens($1, $2, $3, $4) < 1
                THEN $1 - $3 + ceil(extract(epoch FROM $3) * 1000000 / $2)::float8 * interval '1 microsecond'
           END
$$;

-- A bucket's tat once n tokens are taken at `at` (rounded up to the microsecond: never early).
CREATE FUNCTION pgq._tat_after(tat timestamptz, rate integer, period interval, at timestamptz, n integer)
    RETURNS timestamptz
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT greatest($1, $4) + ceil($5 * extract(epoch FROM $3) * 1000000 / $2)::float8 * interval '1 microsecond'
$$;

-- A bucket's tat when its rate or period changes (pgq.configure_queue): what it handed out still
-- counts, as the same number of tokens of the new rate (at most a whole bucket: empty).
CREATE FUNCTION pgq._rescaled_tat(tat timestamptz, old_rate integer, old_period interval, rate integer,
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
CREATE FUNCTION pgq._prune_key_rates(max_rows integer) RETURNS integer
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
                                    key_max_running integer DEFAULT NULL,
                                    rate_limit integer DEFAULT NULL,
                                    rate_period interval DEFAULT NULL,
                                    key_rate_limit integer DEFAULT NULL)
    RETURNS pgq.queues
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET lock_timeout = '5s'
    AS $$
DECLARE
    q pgq.queues := pgq._queue(configure_queue.queue);
    rate_now     timestamptz;
    new_rate     integer;
    new_period   interval;
    new_key_rate integer;
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
    IF configure_queue.rate_limit NOT BETWEEN 0 AND 1000000 THEN
        PERFORM pgq._bad_argument('rate_limit',
            format('must be between 0 (no limit) and 1000000, got %s', configure_queue.rate_limit));
    END IF;
    IF configure_queue.rate_period IS NOT NULL THEN
        PERFORM pgq._check_interval('rate_period', configure_queue.rate_period, interval '1 day');
    END IF;
    IF configure_queue.key_rate_limit NOT BETWEEN 0 AND 1000000 THEN
        PERFORM pgq._bad_argument('key_rate_limit',
            format('must be between 0 (no limit) and 1000000, got %s', configure_queue.key_rate_limit));
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
    -- A new rate or period keeps what the buckets handed out: their debt is rescaled to as many
    -- tokens of the new rate (pgq._rescaled_tat); a rate set to 0 forgets it. (Read after the
    -- queue's row lock, like a claim's.)
    rate_now := pgq._rate_clock();
    new_rate := coalesce(configure_queue.rate_limit, q.rate_limit);
    new_period := coalesce(configure_queue.rate_period, q.rate_period);
    new_key_rate := coalesce(configure_queue.key_rate_limit, q.key_rate_limit);
    IF new_key_rate = 0 THEN
        DELETE FROM pgq.key_rates AS k WHERE k.queue = configure_queue.queue;
    ELSIF new_key_rate <> q.key_rate_limit OR new_period <> q.rate_period THEN
        UPDATE pgq.key_rates AS k
        SET tat = pgq._rescaled_tat(k.tat, q.key_rate_limit, q.rate_period, new_key_rate, new_period, rate_now)
        WHERE k.queue = configure_queue.queue AND k.tat > rate_now;
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
                      OR EXISTS (SELECT FROM pgq.key_limits AS l WHERE l.queue = configure_queue.queue),
        rate_limit = new_rate,
        rate_period = new_period,
        key_rate_limit = new_key_rate,
        rate_limited = new_rate > 0 OR new_key_rate > 0,
        rate_tat = CASE WHEN new_rate = 0 THEN NULL
                        WHEN new_rate = s.rate_limit AND new_period = s.rate_period THEN s.rate_tat
                        ELSE pgq._rescaled_tat(s.rate_tat, s.rate_limit, s.rate_period, new_rate, new_period, rate_now)
                   END
    WHERE s.name = configure_queue.queue
    RETURNING * INTO q;
    RETURN q;
END
$$;
COMMENT ON FUNCTION pgq.configure_queue(text, interval, integer, interval, interval, interval, boolean, boolean, boolean, integer, interval, integer, integer, interval, integer) IS
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

CREATE FUNCTION pgq._keyed_pick(queue text, room integer, kinds text[], fair boolean,
                                at timestamptz DEFAULT NULL) RETURNS SETOF bigint
    LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan
    AS $$
DECLARE
    default_limit integer;
    key_limited boolean;       -- queues.key_limited
    key_rate  integer;         -- queues.key_rate_limit (0: none), per period
    period    interval;        -- queues.rate_period
    slots    jsonb;            -- key -> free slots, for the limited keys with running jobs
    avail    jsonb := '{}';    -- key -> how many more of its jobs this call may pick, for the keys met
    full_keys text[];          -- the keys without a free slot (or, with key_rate, without a token)
    picked   bigint[] := '{}';
    filled   boolean;          -- whether this pass filled a key
    before   integer;          -- how many were picked before this pass
    r        record;
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
    SELECT coalesce(jsonb_object_agg(c.key, coalesce(l.max_running, default_limit) - c.n), '{}')
    INTO slots
    FROM (SELECT j.concurrency_key AS key, count(*)::integer AS n
          FROM pgq.jobs AS j
          WHERE j.lease_until IS NOT NULL AND j.queue = _keyed_pick.queue AND j.concurrency_key IS NOT NULL
          GROUP BY j.concurrency_key) AS c
    LEFT JOIN pgq.key_limits AS l ON l.queue = _keyed_pick.queue AND l.key = c.key
    WHERE coalesce(l.max_running, default_limit) > 0;
    full_keys := ARRAY(SELECT e.key FROM jsonb_each(slots) AS e(key, value) WHERE e.value::integer <= 0);
    IF key_rate > 0 THEN
        -- The keys without a token (key_rates_tat_idx: those whose tat is furthest ahead), so that
        -- each key a pass meets has at least one.
        full_keys := full_keys || ARRAY(
            SELECT k.key FROM pgq.key_rates AS k
            WHERE k.queue = _keyed_pick.queue
              AND k.tat > _keyed_pick.at + period - period / key_rate - interval '1 microsecond'
              AND pgq._tokens(k.tat, key_rate, period, _keyed_pick.at) < 1);
        -- The others' tokens are read as their keys come (the passes' tat column).
    END IF;
    LOOP
        filled := false;
        before := cardinality(picked);
        FOR r IN
            SELECT x.id, x.key, coalesce(l.max_running, default_limit) AS max_running, k.tat
            FROM pgq._fair_pick(_keyed_pick.queue, 1, _keyed_pick.kinds, full_keys, picked) AS f(id)
            JOIN LATERAL (SELECT j.id, j.concurrency_key AS key FROM pgq.jobs AS j WHERE j.id = f.id) AS x ON true
            LEFT JOIN pgq.key_limits AS l ON l.queue = _keyed_pick.queue AND l.key = x.key
            LEFT JOIN pgq.key_rates AS k ON k.queue = _keyed_pick.queue AND k.key = x.key AND key_rate > 0
            WHERE _keyed_pick.fair
            UNION ALL
            SELECT x.id, x.key, coalesce(l.max_running, default_limit), k.tat
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
            LEFT JOIN pgq.key_rates AS k ON k.queue = _keyed_pick.queue AND k.key = x.key AND key_rate > 0
            WHERE NOT _keyed_pick.fair
        LOOP
            IF r.key IS NULL OR (r.max_running = 0 AND key_rate = 0) THEN
                picked := picked || r.id;
            ELSIF r.key <> ALL (full_keys) THEN  -- (a key this pass filled: its later jobs wait)
                n := (avail ->> r.key)::integer;
                IF n IS NULL THEN  -- the key's first job in this call: its free slots, its tokens
                    n := least(CASE WHEN r.max_running > 0 THEN coalesce((slots ->> r.key)::integer, r.max_running) END,
                               CASE WHEN key_rate > 0 THEN pgq._tokens(r.tat, key_rate, period, _keyed_pick.at) END);
                END IF;
                IF n > 0 THEN
                    picked := picked || r.id;
                    n := n - 1;
                END IF;
                avail := avail || jsonb_build_object(r.key, n);
                IF n <= 0 THEN
                    full_keys := full_keys || r.key;
                    filled := true;
                END IF;
            END IF;
        END LOOP;
        -- A plain pass that filled no key took every job it read: all there are, or enough. A fair
        -- pass reads one job (never of a full key): it goes on while there was one.
        EXIT WHEN cardinality(picked) >= _keyed_pick.room
                  OR CASE WHEN _keyed_pick.fair THEN cardinality(picked) = before AND NOT filled ELSE NOT filled END;
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

-- For pgq.claim, which holds the queues' rows: spends the tokens of the rate-limited queues (and
-- keys) for those of `ids` (its picks) that it handed out, at the rate clock's reading `at`.
CREATE FUNCTION pgq._spend_tokens(ids bigint[], at timestamptz) RETURNS void
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
    keyeds   boolean[];  -- whether each takes the per-key step (queues.key_limited or rate_limited)
    fair_ids bigint[] := '{}';
    keyed_ids bigint[] := '{}';
    capped   boolean;    -- whether any of them has max_running, key limits or rate limits
    rated    boolean;    -- then: whether any of those it holds has a rate limit
    rate_now timestamptz;  -- then: the rate limits' clock, read once they are held
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
               coalesce(bool_or(q.max_running > 0 OR q.key_limited OR q.rate_limited), false),
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
            RAISE EXCEPTION 'pgq: a claim of a queue with max_running, key limits or rate limits must run at READ COMMITTED, not %',
                upper(current_setting('transaction_isolation'))
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      HINT = 'Claim in autocommit mode, or in a READ COMMITTED transaction.';
        END IF;
        locked := ARRAY(SELECT q.name FROM pgq.queues AS q
                        WHERE (q.max_running > 0 OR q.key_limited OR q.rate_limited) AND NOT q.paused
                          AND q.name = ANY (names)
                        FOR NO KEY UPDATE SKIP LOCKED);
        -- The rate limits' clock, read once their queues are held (see pgq._rate_clock).
        rate_now := pgq._rate_clock();

        -- A rate-limited queue's room is at most the tokens its bucket holds now; it takes the
        -- per-key step (pgq._keyed_pick), whose picks are known before the claim, so that the
        -- tokens spent are those of the jobs handed out (counted after it).
        SELECT array_agg(e.name ORDER BY e.name), array_agg(e.room ORDER BY e.name),
               array_agg(e.fair ORDER BY e.name), array_agg(e.keyed ORDER BY e.name),
               coalesce(bool_or(e.rate_limited), false)
        INTO names, rooms, fairs, keyeds, rated
        FROM (
            SELECT q.name, q.fair, q.key_limited OR q.rate_limited AS keyed, q.rate_limited,
                   least(CASE WHEN q.max_running = 0 THEN claim.batch
                              ELSE least(claim.batch, q.max_running - (
                                       SELECT count(*) FROM pgq.jobs AS j
                                       WHERE j.lease_until IS NOT NULL AND j.queue = q.name)::integer)
                         END,
                         CASE WHEN q.rate_limit > 0 THEN pgq._tokens(q.rate_tat, q.rate_limit, q.rate_period, rate_now) END)
                   AS room
            FROM pgq.queues AS q
            WHERE NOT q.paused AND q.name = ANY (names)
              AND ((q.max_running = 0 AND NOT q.key_limited AND NOT q.rate_limited) OR q.name = ANY (locked))
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
                           CROSS JOIN LATERAL pgq._keyed_pick(e.name, e.room, claim.kinds, e.fair, rate_now) AS f(id)
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

    -- The rate-limited queues' tokens, spent for the jobs this claim handed out: its picks
    -- (locked by it, pending until its UPDATE) that are running now.
    IF rated THEN
        PERFORM pgq._spend_tokens(keyed_ids, rate_now);
    END IF;
END
$$;
COMMENT ON FUNCTION pgq.claim(text, text[], integer, interval, text[]) IS
    'Claims up to batch due jobs (of kinds, when given) for worker, in order priority DESC, run_at, '
    'id. The returned '
    'attempt is the fencing token for renew, complete, fail, release, snooze and mark_unknown.';

-- pgq.sweep and pgq.prune forget the per-key rate limits' buckets that are full again.
CREATE OR REPLACE FUNCTION pgq.sweep(max_jobs integer DEFAULT 1000)
    RETURNS integer
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET jit = off
    AS $$
DECLARE
    total integer := 0;
    r record;
BEGIN
    IF sweep.max_jobs IS NULL THEN
        PERFORM pgq._bad_argument('max_jobs', 'must not be NULL');
    ELSIF sweep.max_jobs NOT BETWEEN 1 AND 100000 THEN
        PERFORM pgq._bad_argument('max_jobs', format('must be between 1 and 100000, got %s', sweep.max_jobs));
    END IF;
    FOR r IN SELECT x.queue, x.recovered FROM pgq._recover_expired(sweep.max_jobs) AS x LOOP
        total := total + r.recovered;
        IF (SELECT q.notify FROM pgq.queues AS q WHERE q.name = r.queue) THEN
            PERFORM pg_notify('pgq', r.queue);
        END IF;
    END LOOP;
    IF EXISTS (SELECT FROM pgq.schedules AS s WHERE s.enabled AND s.next_run_at <= pgq._now()) THEN
        PERFORM pgq._fire_schedules(sweep.max_jobs);
    END IF;
    -- Keeps pgq.finished_deltas short where no exporter calls pgq.metrics().
    PERFORM pgq._fold_finished();
    -- Forgets the per-key rate limits' buckets that are full again.
    IF EXISTS (SELECT FROM pgq.key_rates) THEN
        PERFORM pgq._prune_key_rates(sweep.max_jobs);
    END IF;
    RETURN total;
END
$$;

CREATE OR REPLACE FUNCTION pgq.prune(older_than interval DEFAULT NULL, max_jobs integer DEFAULT 10000)
    RETURNS integer
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET lock_timeout = '5s'
    AS $$
DECLARE
    deleted integer;
    tenants_left integer;
    r record;
BEGIN
    -- Bounded like queues.retention: a huge interval would make now() - older_than leave the
    -- timestamp range and fail with an unrelated 22008.
    PERFORM pgq._check_span('older_than', prune.older_than);
    IF prune.older_than < interval '0' OR prune.older_than > interval '3650 days' THEN
        PERFORM pgq._bad_argument('older_than',
            format('must be between 0 and 3650 days, got %s', prune.older_than));
    END IF;
    IF prune.max_jobs IS NULL THEN
        PERFORM pgq._bad_argument('max_jobs', 'must not be NULL');
    ELSIF prune.max_jobs NOT BETWEEN 1 AND 1000000 THEN
        PERFORM pgq._bad_argument('max_jobs', format('must be between 1 and 1000000, got %s', prune.max_jobs));
    END IF;
    WITH doomed AS (
        SELECT j.id
        FROM pgq.jobs AS j JOIN pgq.queues AS q ON q.name = j.queue
        WHERE j.state IN ('done', 'failed', 'cancelled')
          AND j.finished_at < pgq._now() - coalesce(prune.older_than, q.retention)
        ORDER BY j.finished_at
        LIMIT prune.max_jobs
        FOR UPDATE OF j SKIP LOCKED
    ), gone AS (
        DELETE FROM pgq.jobs AS j USING doomed AS d WHERE j.id = d.id RETURNING j.id
    ), events AS (
        DELETE FROM pgq.job_events AS e USING gone AS g WHERE e.job_id = g.id
    )
    SELECT count(*) INTO deleted FROM gone;

    -- Idle tenants, queue by queue under the queue's writer lock, taken without waiting and held
    -- (a session lock) only while they are deleted: an enqueue that read a tenant's row before
    -- has committed its job (or holds the lock still, and the queue is skipped); one that comes
    -- after inserts the row again, waiting for this transaction's deletion to commit.
    tenants_left := prune.max_jobs;
    FOR r IN
        SELECT DISTINCT t.queue FROM pgq.tenants AS t
        WHERE t.weight = 1
          AND NOT EXISTS (SELECT FROM pgq.jobs AS j WHERE j.queue = t.queue AND j.tenant = t.tenant)
    LOOP
        EXIT WHEN tenants_left <= 0;
        CONTINUE WHEN NOT pg_try_advisory_lock(1885827329, hashtext(r.queue));
        BEGIN
            WITH gone AS (
                DELETE FROM pgq.tenants AS t
                WHERE (t.queue, t.tenant) IN (
                    SELECT x.queue, x.tenant FROM pgq.tenants AS x
                    WHERE x.queue = r.queue AND x.weight = 1
                      AND NOT EXISTS (SELECT FROM pgq.jobs AS j WHERE j.queue = x.queue AND j.tenant = x.tenant)
                    LIMIT tenants_left
                    FOR UPDATE SKIP LOCKED)
                RETURNING 1
            )
            SELECT tenants_left - count(*) INTO tenants_left FROM gone;
        EXCEPTION WHEN OTHERS THEN
            PERFORM pg_advisory_unlock(1885827329, hashtext(r.queue));
            RAISE;
        END;
        PERFORM pg_advisory_unlock(1885827329, hashtext(r.queue));
    END LOOP;
    -- And the per-key rate limits' buckets that are full again.
    IF EXISTS (SELECT FROM pgq.key_rates) THEN
        PERFORM pgq._prune_key_rates(prune.max_jobs);
    END IF;
    RETURN deleted;
END
$$;

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
CREATE FUNCTION pgq.queue_limits(queue text DEFAULT NULL)
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

-- For a worker after a claim that came back short: each rate-limited queue of `queues` (NULL:
-- every one), with how long until a claim may get a job its rate limits hold back now: 0 while
-- its bucket holds a token and none of its keys is out of tokens; otherwise until the queue's
-- next token, or the earliest next token of a key out of tokens (whether or not that key has due
-- jobs: an index range, never a read of the jobs). A worker calls it only for queues it knows are
-- rate-limited (this function's last answer), so other queues pay nothing.
CREATE FUNCTION pgq.rate_limit_wait(queues text[] DEFAULT NULL)
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

CREATE OR REPLACE FUNCTION pgq.version() RETURNS text
    LANGUAGE sql IMMUTABLE
    AS $$ SELECT '11'::text $$;

REVOKE EXECUTE ON FUNCTION
    pgq._check_concurrency_key(text, text),
    pgq.enqueue(text, text, jsonb, timestamptz, integer, integer, text, text, interval, jsonb, text),
    pgq.enqueue_many(text, text, jsonb[], timestamptz, integer, integer, text, interval, jsonb, text),
    pgq.configure_queue(text, interval, integer, interval, interval, interval, boolean, boolean, boolean, integer, interval, integer, integer, interval, integer),
    pgq.set_key_limit(text, text, integer),
    pgq._fair_pick(text, integer, text[], text[], bigint[]),
    pgq._keyed_pick(text, integer, text[], boolean, timestamptz),
    pgq._rate_clock(),
    pgq._tokens(timestamptz, integer, interval, timestamptz),
    pgq._next_token_at(timestamptz, integer, interval, timestamptz),
    pgq._tat_after(timestamptz, integer, interval, timestamptz, integer),
    pgq._rescaled_tat(timestamptz, integer, interval, integer, interval, timestamptz),
    pgq._prune_key_rates(integer),
    pgq._spend_tokens(bigint[], timestamptz),
    pgq.queue_limits(text),
    pgq.rate_limit_wait(text[])
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    pgq.enqueue(text, text, jsonb, timestamptz, integer, integer, text, text, interval, jsonb, text),
    pgq.enqueue_many(text, text, jsonb[], timestamptz, integer, integer, text, interval, jsonb, text)
    TO pgq_producer;
GRANT EXECUTE ON FUNCTION
    pgq.configure_queue(text, interval, integer, interval, interval, interval, boolean, boolean, boolean, integer, interval, integer, integer, interval, integer),
    pgq.set_key_limit(text, text, integer)
    TO pgq_admin;
GRANT EXECUTE ON FUNCTION pgq.rate_limit_wait(text[]) TO pgq_worker, pgq_monitor;
GRANT EXECUTE ON FUNCTION pgq.queue_limits(text) TO pgq_monitor;
