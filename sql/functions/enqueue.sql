-- sql/functions/enqueue.sql: pgq.enqueue and pgq.enqueue_many.

-- Validates the enqueue arguments shared by enqueue, enqueue_many and schedule (the payloads and
-- unique_key are checked by each), raising 22004 / 22023 naming the first that is wrong.
CREATE OR REPLACE FUNCTION pgq._check_enqueue(queue text, kind text, run_at timestamptz, priority integer,
                                              max_attempts integer, tenant text, max_run_time interval,
                                              meta jsonb, concurrency_key text)
    RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    PERFORM pgq._check_name('queue', _check_enqueue.queue);
    PERFORM pgq._check_name('kind', _check_enqueue.kind);
    IF _check_enqueue.run_at IS NULL THEN
        PERFORM pgq._bad_argument('run_at', 'must not be NULL', 'Omit it to run now.');
    ELSIF NOT isfinite(_check_enqueue.run_at) THEN
        PERFORM pgq._bad_argument('run_at', format('must be a finite time, got %s', _check_enqueue.run_at));
    END IF;
    IF _check_enqueue.priority IS NULL THEN
        PERFORM pgq._bad_argument('priority', 'must not be NULL', 'Omit it for priority 0.');
    ELSIF _check_enqueue.priority NOT BETWEEN -1000 AND 1000 THEN
        PERFORM pgq._bad_argument('priority',
            format('must be between -1000 and 1000, got %s', _check_enqueue.priority));
    END IF;
    IF _check_enqueue.max_attempts NOT BETWEEN 1 AND 10000 THEN
        PERFORM pgq._bad_argument('max_attempts',
            format('must be between 1 and 10000, got %s', _check_enqueue.max_attempts));
    END IF;
    IF length(_check_enqueue.tenant) NOT BETWEEN 1 AND 256 THEN
        PERFORM pgq._bad_argument('tenant', 'must be 1 to 256 characters long');
    END IF;
    IF _check_enqueue.max_run_time IS NOT NULL THEN
        PERFORM pgq._check_interval('max_run_time', _check_enqueue.max_run_time, interval '365 days');
    END IF;
    IF _check_enqueue.meta IS NOT NULL THEN
        PERFORM pgq._check_payload('meta', _check_enqueue.meta);
    END IF;
    PERFORM pgq._check_concurrency_key('concurrency_key', _check_enqueue.concurrency_key);
END
$$;

-- Validates pgq.enqueue's and pgq.enqueue_many's dependency_mode and notify_finished (22004 / 22023).
CREATE OR REPLACE FUNCTION pgq._check_workflow(dependency_mode text, notify_finished boolean) RETURNS void
    LANGUAGE plpgsql IMMUTABLE
    AS $$
BEGIN
    IF _check_workflow.dependency_mode IS NULL THEN
        PERFORM pgq._bad_argument('dependency_mode', 'must not be NULL', 'Omit it for ''all_done''.');
    ELSIF _check_workflow.dependency_mode NOT IN ('all_done', 'all_ended') THEN
        PERFORM pgq._bad_argument('dependency_mode',
            format('must be ''all_done'' or ''all_ended'', got %s', quote_literal(_check_workflow.dependency_mode)),
            'all_done: released when every dependency is done; all_ended: when every one has ended, however.');
    END IF;
    IF _check_workflow.notify_finished IS NULL THEN
        PERFORM pgq._bad_argument('notify_finished', 'must not be NULL', 'Omit it for false.');
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION pgq.enqueue(queue text, kind text, payload jsonb DEFAULT '{}',
                            run_at timestamptz DEFAULT now(), priority integer DEFAULT 0,
                            max_attempts integer DEFAULT NULL, unique_key text DEFAULT NULL,
                            tenant text DEFAULT NULL, max_run_time interval DEFAULT NULL,
                            meta jsonb DEFAULT NULL, concurrency_key text DEFAULT NULL,
                            depends_on bigint[] DEFAULT NULL, dependency_mode text DEFAULT 'all_done',
                            batch bigint DEFAULT NULL, notify_finished boolean DEFAULT false)
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
    deps       record;
    new_state  pgq.job_state := 'pending';
    dep_ids    bigint[];
    left_count integer;
    mode       text;
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
                    AND coalesce(length(enqueue.concurrency_key) BETWEEN 1 AND 256, true)
                    AND enqueue.dependency_mode IN ('all_done', 'all_ended')
                    AND enqueue.notify_finished IS NOT NULL, false) THEN
        PERFORM pgq._check_enqueue(enqueue.queue, enqueue.kind, enqueue.run_at, enqueue.priority,
                                   enqueue.max_attempts, enqueue.tenant, enqueue.max_run_time, enqueue.meta,
                                   enqueue.concurrency_key);
        PERFORM pgq._check_payload('payload', enqueue.payload);
        PERFORM pgq._check_unique_key(enqueue.unique_key);
        PERFORM pgq._check_workflow(enqueue.dependency_mode, enqueue.notify_finished);
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
    IF enqueue.batch IS NOT NULL THEN
        PERFORM pgq._join_batch(enqueue.batch);
    END IF;
    -- With dependencies: waiting for those not done yet (read, not locked: an end of one in flight
    -- now is settled by the check pgq._wait_for_dependencies leaves), or cancelled at once (below)
    -- when one has ended failed or cancelled. An empty array is no dependency. A live job that
    -- holds the unique_key is answered first, so that a deduplicated call writes nothing here either.
    IF enqueue.depends_on IS NOT NULL THEN
        IF enqueue.unique_key IS NOT NULL THEN
            SELECT j.id INTO new_id
            FROM pgq.jobs AS j
            WHERE j.queue = enqueue.queue AND j.unique_key = enqueue.unique_key
              AND j.unique_key IS NOT NULL AND j.state IN ('waiting', 'pending', 'running', 'outcome_unknown');
            IF FOUND THEN
                RETURN new_id;
            END IF;
        END IF;
        deps := pgq._read_dependencies(enqueue.depends_on, enqueue.dependency_mode);
        IF cardinality(deps.ids) > 0 THEN
            dep_ids := deps.ids;
            left_count := cardinality(deps.open_ids);
            mode := enqueue.dependency_mode;
            IF left_count > 0 OR deps.ended_id IS NOT NULL THEN
                new_state := 'waiting';
            END IF;
        END IF;
    END IF;

    IF enqueue.unique_key IS NULL THEN
        -- A plain INSERT: ON CONFLICT would make it a speculative insertion even without a key.
        INSERT INTO pgq.jobs AS j (queue, kind, payload, priority, run_at, max_attempts, tenant,
                                   max_run_time, meta, concurrency_key, state, depends_on,
                                   dependencies_left, dependency_mode, batch_id, notify_finished)
        VALUES (enqueue.queue, enqueue.kind, enqueue.payload, enqueue.priority, enqueue.run_at,
                coalesce(enqueue.max_attempts, q.max_attempts), job_tenant, enqueue.max_run_time,
                enqueue.meta, enqueue.concurrency_key, new_state, dep_ids, left_count, mode,
                enqueue.batch, enqueue.notify_finished)
        RETURNING j.id INTO new_id;
    ELSE
        LOOP
            INSERT INTO pgq.jobs AS j (queue, kind, payload, priority, run_at, max_attempts,
                                       unique_key, tenant, max_run_time, meta, concurrency_key,
                                       state, depends_on, dependencies_left, dependency_mode, batch_id,
                                       notify_finished)
            VALUES (enqueue.queue, enqueue.kind, enqueue.payload, enqueue.priority, enqueue.run_at,
                    coalesce(enqueue.max_attempts, q.max_attempts), enqueue.unique_key, job_tenant,
                    enqueue.max_run_time, enqueue.meta, enqueue.concurrency_key, new_state, dep_ids,
                    left_count, mode, enqueue.batch, enqueue.notify_finished)
            ON CONFLICT (queue, unique_key)
                WHERE unique_key IS NOT NULL AND state IN ('waiting', 'pending', 'running', 'outcome_unknown')
                DO NOTHING
            RETURNING j.id INTO new_id;
            EXIT WHEN FOUND;
            -- A live job holds this unique_key: hand back its id. If it finished in the meantime,
            -- the key is free again and the INSERT is tried once more.
            SELECT j.id INTO new_id
            FROM pgq.jobs AS j
            WHERE j.queue = enqueue.queue AND j.unique_key = enqueue.unique_key
              AND j.unique_key IS NOT NULL AND j.state IN ('waiting', 'pending', 'running', 'outcome_unknown');
            IF FOUND THEN
                RETURN new_id;
            END IF;
        END LOOP;
    END IF;

    IF enqueue.batch IS NOT NULL THEN
        PERFORM pgq._batch_added(enqueue.batch, ARRAY[new_id]);
    END IF;
    IF dep_ids IS NOT NULL THEN
        INSERT INTO pgq.job_dependants (depends_on, job_id) SELECT d.id, new_id FROM unnest(dep_ids) AS d(id);
    END IF;
    IF new_state = 'waiting' THEN
        PERFORM pgq._wait_for_dependencies(ARRAY[new_id], deps.open_ids, deps.ended_id, deps.ended_state);
        RETURN new_id;
    END IF;
    IF q.notify AND enqueue.run_at <= pgq._now() THEN
        PERFORM pg_notify('pgq', enqueue.queue);
    END IF;
    RETURN new_id;
END
$$;
COMMENT ON FUNCTION pgq.enqueue(text, text, jsonb, timestamptz, integer, integer, text, text, interval, jsonb, text, bigint[], text, bigint, boolean) IS
    'Adds one job and returns its id; with unique_key, returns the id of the live job that holds it. '
    'meta: a JSON object (or NULL) kept with the job and returned by pgq.claim. depends_on: the job '
    'waits until those jobs are done (dependency_mode all_done: cancelled if one fails or is cancelled) '
    'or have ended however (all_ended). batch: joins that open batch. notify_finished: its end '
    'notifies channel pgq_finished.';

CREATE OR REPLACE FUNCTION pgq.enqueue_many(queue text, kind text, payloads jsonb[],
                                 run_at timestamptz DEFAULT now(), priority integer DEFAULT 0,
                                 max_attempts integer DEFAULT NULL, tenant text DEFAULT NULL,
                                 max_run_time interval DEFAULT NULL, meta jsonb DEFAULT NULL,
                                 concurrency_key text DEFAULT NULL, depends_on bigint[] DEFAULT NULL,
                                 dependency_mode text DEFAULT 'all_done', batch bigint DEFAULT NULL,
                                 notify_finished boolean DEFAULT false)
    RETURNS SETOF bigint
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
DECLARE
    q   pgq.queues;
    bad record;
    job_tenant text := enqueue_many.tenant;
    deps       record;
    new_state  pgq.job_state := 'pending';
    dep_ids    bigint[];
    left_count integer;
    new_ids    bigint[];
    mode       text;
BEGIN
    PERFORM pgq._check_enqueue(enqueue_many.queue, enqueue_many.kind, enqueue_many.run_at,
                               enqueue_many.priority, enqueue_many.max_attempts, enqueue_many.tenant,
                               enqueue_many.max_run_time, enqueue_many.meta, enqueue_many.concurrency_key);
    PERFORM pgq._check_workflow(enqueue_many.dependency_mode, enqueue_many.notify_finished);
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
    IF enqueue_many.batch IS NOT NULL THEN
        PERFORM pgq._join_batch(enqueue_many.batch);
    END IF;
    -- The same dependencies for every job, as in pgq.enqueue. One call writes at most 10000 links
    -- (the product of the payloads and the jobs named, whatever their states: the same call is
    -- accepted or refused whenever it is made), as many as one pgq.enqueue naming 10000 jobs.
    IF enqueue_many.depends_on IS NOT NULL THEN
        deps := pgq._read_dependencies(enqueue_many.depends_on, enqueue_many.dependency_mode);
        IF cardinality(deps.ids)::bigint * cardinality(enqueue_many.payloads) > 10000 THEN
            PERFORM pgq._bad_argument('depends_on',
                format('names %s jobs for %s payloads: %s links, and one call writes at most 10000 '
                       '(payloads x jobs named)', cardinality(deps.ids), cardinality(enqueue_many.payloads),
                       cardinality(deps.ids)::bigint * cardinality(enqueue_many.payloads)),
                'Split the payloads over several calls, or make them depend on one job that depends on the others.');
        END IF;
        IF cardinality(deps.ids) > 0 THEN
            dep_ids := deps.ids;
            left_count := cardinality(deps.open_ids);
            mode := enqueue_many.dependency_mode;
            IF left_count > 0 OR deps.ended_id IS NOT NULL THEN
                new_state := 'waiting';
            END IF;
        END IF;
    END IF;

    IF new_state = 'pending' AND dep_ids IS NULL AND enqueue_many.batch IS NULL THEN
        -- Identity values are drawn in the order the rows are inserted, so ordering by id returns
        -- the ids in payload order.
        RETURN QUERY
        WITH inserted AS (
            INSERT INTO pgq.jobs (queue, kind, payload, priority, run_at, max_attempts, tenant, max_run_time,
                                  meta, concurrency_key, batch_id, notify_finished)
            SELECT enqueue_many.queue, enqueue_many.kind, p.value, enqueue_many.priority,
                   enqueue_many.run_at, coalesce(enqueue_many.max_attempts, q.max_attempts),
                   job_tenant, enqueue_many.max_run_time, enqueue_many.meta, enqueue_many.concurrency_key,
                   enqueue_many.batch, enqueue_many.notify_finished
            FROM unnest(enqueue_many.payloads) WITH ORDINALITY AS p(value, n)
            ORDER BY p.n
            RETURNING jobs.id
        )
        SELECT i.id FROM inserted AS i ORDER BY i.id;

        IF q.notify AND enqueue_many.run_at <= pgq._now() AND cardinality(enqueue_many.payloads) > 0 THEN
            PERFORM pg_notify('pgq', enqueue_many.queue);
        END IF;
        RETURN;
    END IF;

    WITH inserted AS (
        INSERT INTO pgq.jobs (queue, kind, payload, priority, run_at, max_attempts, tenant, max_run_time,
                              meta, concurrency_key, state, depends_on, dependencies_left, dependency_mode,
                              batch_id, notify_finished)
        SELECT enqueue_many.queue, enqueue_many.kind, p.value, enqueue_many.priority,
               enqueue_many.run_at, coalesce(enqueue_many.max_attempts, q.max_attempts),
               job_tenant, enqueue_many.max_run_time, enqueue_many.meta, enqueue_many.concurrency_key,
               new_state, dep_ids, left_count, mode, enqueue_many.batch, enqueue_many.notify_finished
        FROM unnest(enqueue_many.payloads) WITH ORDINALITY AS p(value, n)
        ORDER BY p.n
        RETURNING jobs.id
    )
    SELECT coalesce(array_agg(i.id ORDER BY i.id), '{}') INTO new_ids FROM inserted AS i;
    IF enqueue_many.batch IS NOT NULL AND cardinality(new_ids) > 0 THEN
        PERFORM pgq._batch_added(enqueue_many.batch, new_ids);
    END IF;
    INSERT INTO pgq.job_dependants (depends_on, job_id)
    SELECT d.id, n.id FROM unnest(dep_ids) AS d(id) CROSS JOIN unnest(new_ids) AS n(id);
    IF new_state = 'waiting' THEN
        PERFORM pgq._wait_for_dependencies(new_ids, deps.open_ids, deps.ended_id, deps.ended_state);
    ELSIF q.notify AND enqueue_many.run_at <= pgq._now() AND cardinality(new_ids) > 0 THEN
        PERFORM pg_notify('pgq', enqueue_many.queue);
    END IF;
    RETURN QUERY SELECT unnest(new_ids);
END
$$;
COMMENT ON FUNCTION pgq.enqueue_many(text, text, jsonb[], timestamptz, integer, integer, text, interval, jsonb, text, bigint[], text, bigint, boolean) IS
    'Adds one job per payload in one INSERT and returns their ids in payload order; each job '
    'gets the same meta, depends_on, dependency_mode, batch and notify_finished.';
