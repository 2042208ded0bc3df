-- sql/functions/fairness.sql: fair queues: tenants served by weighted round-robin.

-- The tenant a job of a fair queue is stored under ('' for none), registered in pgq.tenants. A
-- tenant's first job inserts its row, which waits (the primary key) for another transaction that
-- inserted it and has not ended (another producer's open transaction that enqueued the tenant's
-- first job): a producer's enqueue (`patient`) at most 5 s (or its shorter lock_timeout), then
-- 55P03 naming the tenant; a claim's or a sweep's firing of a schedule and a batch's callback in a
-- worker's end at most 1 ms, then NULL: the caller leaves the job to a later call. A registered
-- tenant (the usual case) is read, not inserted: no wait at all.
CREATE OR REPLACE FUNCTION pgq._fair_tenant(queue text, tenant text, patient boolean DEFAULT true) RETURNS text
    LANGUAGE plpgsql
    AS $$
DECLARE
    stored text := coalesce(_fair_tenant.tenant, '');
    prior  text;
BEGIN
    IF EXISTS (SELECT FROM pgq.tenants AS t WHERE t.queue = _fair_tenant.queue AND t.tenant = stored) THEN
        RETURN stored;
    END IF;
    prior := pgq._bound_lock_timeout(CASE WHEN _fair_tenant.patient THEN interval '5 seconds'
                                          ELSE interval '1 millisecond' END);
    BEGIN
        INSERT INTO pgq.tenants AS t (queue, tenant) VALUES (_fair_tenant.queue, stored)
        ON CONFLICT DO NOTHING;
    EXCEPTION WHEN lock_not_available THEN
        PERFORM set_config('lock_timeout', prior, true);
        IF NOT _fair_tenant.patient THEN
            RETURN NULL;
        END IF;
        RAISE EXCEPTION 'pgq: tenant % of queue % is being registered by another transaction that has not ended '
                        '(its first job); gave up after lock_timeout %', quote_literal(stored), _fair_tenant.queue,
                        current_setting('lock_timeout')
            USING ERRCODE = 'lock_not_available',
                  HINT = 'Try again once it has committed or rolled back.';
    END;
    PERFORM set_config('lock_timeout', prior, true);
    RETURN stored;
END
$$;

-- Fair mode's pick for one queue: up to `room` claimable jobs, locked FOR NO KEY UPDATE SKIP
-- LOCKED, chosen across the queue's tenants by weighted round-robin. Tenants with a due job are
-- ranked by virtual time (jobs started / weight); the k-th job of a tenant counts as finishing at
-- vtime + k/weight, and the earliest finishers win (ties: the total order). The winners' tenants
-- then advance their virtual time. A tenant that was idle restarts no further behind the busiest
-- one (the largest virtual time of the queue's tenants) than one round, so it gets its share, not
-- a burst. With `kinds`, only jobs of those kinds count (a filter within each tenant's jobs).
-- The cost is bounded by the tenants served, not the tenants waiting: one probe says whether the
-- queue has a claimable job at all, one reads the busiest tenant (the top of tenants_vtime_idx),
-- and the `room` least-served tenants with a claimable job are walked from the bottom, each
-- checked by one probe (so tenants without one that are passed over cost a probe each: pgq.prune
-- removes tenants without jobs). Tenants behind the busiest by more than a round all start at
-- busiest - 1 and are served in virtual-time order, then by name.
-- The ranked tenants' rows are locked as they are read, with SKIP LOCKED: a tenant another
-- claimer holds (an idle transaction that claimed from this queue, say) is passed over for this
-- call, and the next one ranked instead, never waited for; so no claimer waits for another or
-- deadlocks, and a held tenant does not stop a one-job pick (a key-limited queue's) short.
-- A key-limited queue's pick (pgq._keyed_pick) passes the keys that are full (skip_keys) and the
-- jobs it already holds (skip_ids); NULL for the others.
CREATE OR REPLACE FUNCTION pgq._fair_pick(queue text, room integer, kinds text[] DEFAULT NULL,
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
            FOR NO KEY UPDATE SKIP LOCKED
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

-- Weights a tenant of a fair queue: it gets `weight` jobs started for every one of a weight-1
-- tenant's while both have work. Returns the tenant's row (created if new).
CREATE OR REPLACE FUNCTION pgq.set_tenant_weight(queue text, tenant text, weight integer)
    RETURNS pgq.tenants
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET lock_timeout = '5s'
    AS $$
DECLARE
    q pgq.queues;
    result_row pgq.tenants;
BEGIN
    PERFORM pgq._check_name('queue', set_tenant_weight.queue);
    IF set_tenant_weight.tenant IS NULL THEN
        PERFORM pgq._bad_argument('tenant', 'must not be NULL', 'The jobs without a tenant are the tenant ''''.');
    ELSIF length(set_tenant_weight.tenant) > 256 THEN
        PERFORM pgq._bad_argument('tenant', 'must be at most 256 characters long');
    END IF;
    IF set_tenant_weight.weight IS NULL THEN
        PERFORM pgq._bad_argument('weight', 'must not be NULL');
    ELSIF set_tenant_weight.weight NOT BETWEEN 1 AND 1000 THEN
        PERFORM pgq._bad_argument('weight', format('must be between 1 and 1000, got %s', set_tenant_weight.weight));
    END IF;
    q := pgq._queue(set_tenant_weight.queue);
    INSERT INTO pgq.tenants AS t (queue, tenant, weight)
    VALUES (set_tenant_weight.queue, set_tenant_weight.tenant, set_tenant_weight.weight)
    ON CONFLICT ON CONSTRAINT tenants_pkey DO UPDATE SET weight = excluded.weight
    RETURNING * INTO result_row;
    RETURN result_row;
END
$$;
COMMENT ON FUNCTION pgq.set_tenant_weight(text, text, integer) IS
    'Sets the weight (1 to 1000, default 1) of a tenant of a fair queue and returns its row.';
