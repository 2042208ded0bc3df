-- pgq migration 0013: flow control, part 3: job dependencies (issue 11).
--
-- * pgq.enqueue and pgq.enqueue_many take depends_on bigint[] (their last parameter; dropped and
--   created again, so their grants are given again below): the job waits (state 'waiting', added
--   by 0012) until every one of those jobs is done, then becomes pending in the transaction of the
--   last completion; if one ends failed or cancelled, the job is cancelled, and so is every job
--   waiting down its chain. Waiting jobs hold their unique_key (the index is built again).
-- * pgq.job_dependencies holds the open links; pgq._dependency_ended moves the dependants on,
--   called by 0010's trigger function pgq._count_finished (which every end of a job runs) only
--   for jobs that have dependants (jobs.has_dependants) or wait: queues that do not use
--   dependencies pay for one IF (a trigger of its own cost a plain complete ~8 us in the A/B).
-- * pgq.stats and pgq.metrics count the waiting jobs (a column added last: dropped and created
--   again, grants given again); pgq.retry's message names a waiting holder of a unique_key.
-- sql/schema.sql holds the same definitions (tests/test_schema_matches_migrations.py).

ALTER TABLE pgq.jobs
    ADD COLUMN depends_on bigint[],
    ADD COLUMN dependencies_left integer,
    ADD COLUMN has_dependants boolean NOT NULL DEFAULT false;
COMMENT ON COLUMN pgq.jobs.depends_on IS
    'The jobs this one was enqueued to run after (enqueue''s depends_on: distinct, in id order); '
    'NULL: none.';
COMMENT ON COLUMN pgq.jobs.dependencies_left IS
    'While waiting: how many of depends_on are not done yet (the job becomes pending at 0); NULL '
    'for a job enqueued without depends_on.';
COMMENT ON COLUMN pgq.jobs.has_dependants IS
    'Whether a job was ever enqueued with this one in its depends_on (set by that enqueue, which '
    'locks this row so): only then does this job''s end call pgq._dependency_ended.';

-- The dependencies still open: one row per (dependency, waiting dependant), inserted by the
-- dependant's enqueue for each of its dependencies not done yet, deleted when the dependency ends
-- (done: the dependant counts one fewer; failed or cancelled: the dependant is cancelled) or the
-- dependant ends (cancelled). So it holds only the links of waiting jobs, never the history
-- (jobs.depends_on keeps that). No foreign key: it would put a trigger on every delete of pgq.jobs.
CREATE TABLE pgq.job_dependencies (
    depends_on  bigint NOT NULL,
    job_id      bigint NOT NULL,
    PRIMARY KEY (depends_on, job_id)
);
COMMENT ON TABLE pgq.job_dependencies IS
    'The open dependencies of waiting jobs: job_id waits for depends_on (pgq.enqueue''s depends_on); '
    'a row goes when either job ends.';
REVOKE ALL ON pgq.job_dependencies FROM PUBLIC;

-- A waiting job that ends (pgq.cancel, or cancelled with its dependency) deletes its own links.
CREATE INDEX job_dependencies_job_idx ON pgq.job_dependencies (job_id);

DROP INDEX pgq.jobs_unique_key_idx;
-- Deduplication: one live job per (queue, unique_key), race-free. outcome_unknown counts as live:
-- its effect may have happened, which is exactly when a duplicate would hurt; so does waiting
-- (enqueued with depends_on, it will run).
CREATE UNIQUE INDEX jobs_unique_key_idx ON pgq.jobs (queue, unique_key)
    WHERE unique_key IS NOT NULL AND state IN ('waiting', 'pending', 'running', 'outcome_unknown');

-- When a job ends, its dependants move on, in the same transaction (every path into done, failed
-- or cancelled is an UPDATE of state: complete, complete_many, fail, resolve, cancel, the recovery
-- of expired leases). Done: each waiting dependant counts one dependency fewer, and the one that
-- reaches 0 becomes pending (its queue's workers are notified when it is due). Failed or
-- cancelled: every waiting job down the chain is cancelled, by one statement (a recursive query
-- over pgq.job_dependencies through waiting jobs: a trigger per level would nest as deep as the
-- chain is long), with last_error naming the dependency. The trigger of each job it cancels calls it
-- too, and finds the rest of the chain cancelled already (so it stops at once) but for a job
-- enqueued to depend on it while the statement waited for that enqueue's lock on it.
-- A waiting job that ends (cancelled) deletes its own links.
-- pgq._count_finished (the trigger jobs_count_finished, which every end fires) calls it only for
-- jobs that have dependants (has_dependants, set by their dependants' enqueue) or are waiting:
-- other completions pay for one IF.
-- A dependant's row is updated by each of its dependencies' completions: they wait for each other
-- on that row, so the count is exact (each decrement reads the newest row version), and the
-- completion that takes it to 0 releases the job. Runs as the owner (like pgq._count_finished:
-- no SET clause, every name schema-qualified).
CREATE FUNCTION pgq._dependency_ended(ended_id bigint, old_state pgq.job_state, new_state pgq.job_state,
                                       had_dependants boolean) RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    due_queues text[];
BEGIN
    IF old_state = 'waiting' THEN
        DELETE FROM pgq.job_dependencies AS d WHERE d.job_id = ended_id;
    END IF;
    IF NOT had_dependants THEN
        RETURN;
    END IF;
    IF new_state = 'done' THEN
        WITH released AS (
            UPDATE pgq.jobs AS j
            SET dependencies_left = j.dependencies_left - 1,
                state = CASE WHEN j.dependencies_left = 1 THEN 'pending' ELSE 'waiting' END::pgq.job_state,
                last_event = CASE WHEN j.dependencies_left = 1 THEN 'dependencies_done' ELSE j.last_event END
            FROM pgq.job_dependencies AS d
            WHERE d.depends_on = ended_id AND j.id = d.job_id AND j.state = 'waiting'
            RETURNING j.id, j.queue, j.attempt, j.state, j.run_at
        ), events AS (
            INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state, note)
            SELECT r.id, r.attempt, NULL, 'dependencies_done', 'waiting', 'pending',
                   format('the last of its dependencies, job %s, is done', ended_id)
            FROM released AS r JOIN pgq.queues AS q ON q.name = r.queue AND q.audit
            WHERE r.state = 'pending'
        )
        SELECT array_agg(DISTINCT r.queue) INTO due_queues
        FROM released AS r WHERE r.state = 'pending' AND r.run_at <= pgq._now();
        PERFORM pgq._notify(n.queue) FROM unnest(due_queues) AS n(queue);
    ELSE
        WITH RECURSIVE chain (id, dependency) AS (
            SELECT d.job_id, d.depends_on
            FROM pgq.job_dependencies AS d JOIN pgq.jobs AS w ON w.id = d.job_id AND w.state = 'waiting'
            WHERE d.depends_on = ended_id
            UNION
            SELECT d.job_id, d.depends_on
            FROM chain AS c JOIN pgq.job_dependencies AS d ON d.depends_on = c.id
            JOIN pgq.jobs AS w ON w.id = d.job_id AND w.state = 'waiting'
        ), cancelled AS (
            UPDATE pgq.jobs AS j
            SET state = 'cancelled', finished_at = pgq._now(), last_event = 'dependency_ended',
                last_error = CASE WHEN c.dependency = ended_id
                                  THEN format('pgq: cancelled: its dependency, job %s, ended %s', ended_id, new_state)
                                  ELSE format('pgq: cancelled: its dependency, job %s, was cancelled because job %s, '
                                              'up its chain, ended %s', c.dependency, ended_id, new_state) END
            FROM (SELECT DISTINCT ON (c.id) c.id, c.dependency FROM chain AS c
                  ORDER BY c.id, c.dependency <> ended_id, c.dependency) AS c
            WHERE j.id = c.id AND j.state = 'waiting'
            RETURNING j.id, j.queue, j.attempt, j.last_error
        )
        INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state, note)
        SELECT c.id, c.attempt, NULL, 'dependency_ended', 'waiting', 'cancelled', c.last_error
        FROM cancelled AS c JOIN pgq.queues AS q ON q.name = c.queue AND q.audit;
    END IF;
    DELETE FROM pgq.job_dependencies AS d WHERE d.depends_on = ended_id;
END
$$;
COMMENT ON FUNCTION pgq._dependency_ended(bigint, pgq.job_state, pgq.job_state, boolean) IS
    'Called by pgq._count_finished when a job that has dependants, or waits, ends: releases (done) '
    'or cancels (failed, cancelled) its waiting dependants; a waiting job that ends deletes its links.';

-- jobs_count_finished's function (0010) calls it for a job that has dependants or waits.
CREATE OR REPLACE FUNCTION pgq._count_finished() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    INSERT INTO pgq.finished_deltas (queue, state) VALUES (NEW.queue, NEW.state);
    -- A job that has dependants, or waits itself, moves its dependants on (pgq._dependency_ended).
    -- Here rather than in a trigger of its own: a second trigger's WHEN, evaluated by every claim
    -- and completion, cost a plain queue's complete about 8 us of about 60 (migration 0013's A/B).
    IF OLD.has_dependants OR OLD.state = 'waiting' THEN
        PERFORM pgq._dependency_ended(NEW.id, OLD.state, NEW.state, OLD.has_dependants);
    END IF;
    RETURN NULL;
END
$$;
COMMENT ON FUNCTION pgq._count_finished() IS
    'Trigger of pgq.jobs: records one transition into done, failed or cancelled in pgq.finished_deltas, '
    'and moves the dependants of a job that has them on (pgq._dependency_ended).';

-- The dependencies of a job being enqueued (pgq.enqueue's and pgq.enqueue_many's depends_on),
-- checked and locked. Each row is updated (has_dependants, which arms its trigger) in id order,
-- so a concurrent end of a dependency either committed first (and its state is read here) or
-- waits for this transaction and then sees the new job's link (an end under REPEATABLE READ or
-- SERIALIZABLE fails with 40001 instead: the row was updated). A job of a queue whose read
-- grants do not admit the login counts as absent, like in pgq.get_job. Returns the distinct ids
-- in order, those not done yet (the new job waits for them) and the first that ended failed or
-- cancelled (the new job is then cancelled at once), with its state.
CREATE FUNCTION pgq._lock_dependencies(depends_on bigint[], OUT ids bigint[], OUT open_ids bigint[],
                                       OUT ended_id bigint, OUT ended_state pgq.job_state)
    LANGUAGE plpgsql
    AS $$
DECLARE
    missing bigint;
BEGIN
    IF array_ndims(_lock_dependencies.depends_on) > 1 THEN
        PERFORM pgq._bad_argument('depends_on', 'must be a one-dimensional array of job ids');
    ELSIF array_position(_lock_dependencies.depends_on, NULL) IS NOT NULL THEN
        PERFORM pgq._bad_argument('depends_on', 'must not contain NULL');
    END IF;
    ids := ARRAY(SELECT DISTINCT d.id FROM unnest(_lock_dependencies.depends_on) AS d(id) ORDER BY d.id);
    IF cardinality(ids) > 10000 THEN
        PERFORM pgq._bad_argument('depends_on', format('must name at most 10000 jobs, got %s', cardinality(ids)),
            'A job that waits for more: enqueue it after an intermediate job that waits for the rest.');
    END IF;
    IF cardinality(ids) = 0 THEN
        RETURN;
    END IF;
    -- Locked in id order (so concurrent enqueues never deadlock on them), then updated.
    PERFORM FROM pgq.jobs AS j WHERE j.id = ANY (ids) ORDER BY j.id FOR NO KEY UPDATE;
    WITH locked AS (
        UPDATE pgq.jobs AS j SET has_dependants = true
        WHERE j.id = ANY (ids)
        RETURNING j.id, j.state, j.queue
    ), seen AS (
        SELECT l.id, l.state FROM locked AS l JOIN pgq.queues AS q ON q.name = l.queue
        WHERE q.restricted IS NULL OR pgq._may(q.name, q.restricted, 'read')
    )
    SELECT (SELECT min(i.id) FROM unnest(ids) AS i(id) WHERE i.id NOT IN (SELECT s.id FROM seen AS s)),
           ARRAY(SELECT s.id FROM seen AS s WHERE s.state NOT IN ('done', 'failed', 'cancelled') ORDER BY s.id),
           (SELECT s.id FROM seen AS s WHERE s.state IN ('failed', 'cancelled') ORDER BY s.id LIMIT 1)
    INTO missing, open_ids, ended_id;
    IF missing IS NOT NULL THEN
        PERFORM pgq._bad_argument('depends_on', format('names no job with id %s', missing),
            'A job that never existed, or a finished one that pgq.prune has deleted (after its queue''s '
            'retention), cannot be depended on.');
    END IF;
    IF ended_id IS NOT NULL THEN
        ended_state := (SELECT j.state FROM pgq.jobs AS j WHERE j.id = ended_id);
    END IF;
END
$$;
COMMENT ON FUNCTION pgq._lock_dependencies(bigint[]) IS
    'For pgq.enqueue''s depends_on: checks and locks the dependencies; returns them, those not done '
    'yet and the first that ended failed or cancelled.';

-- Cancels a waiting job whose dependency `dependency` has ended `ended` (failed or cancelled):
-- for pgq.enqueue and pgq.enqueue_many, when a dependency had ended before the job was enqueued
-- (pgq._dependency_ended cancels the jobs already waiting).
CREATE FUNCTION pgq._cancel_for_dependency(ids bigint[], dependency bigint, ended pgq.job_state)
    RETURNS void
    LANGUAGE sql
    AS $$
    WITH cancelled AS (
        UPDATE pgq.jobs AS j
        SET state = 'cancelled', finished_at = pgq._now(), last_event = 'dependency_ended',
            last_error = format('pgq: cancelled: its dependency, job %s, ended %s', dependency, ended)
        WHERE j.id = ANY (ids) AND j.state = 'waiting'
        RETURNING j.id, j.queue, j.attempt, j.last_error
    )
    INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state, note)
    SELECT c.id, c.attempt, NULL, 'dependency_ended', 'waiting', 'cancelled', c.last_error
    FROM cancelled AS c JOIN pgq.queues AS q ON q.name = c.queue AND q.audit
$$;
COMMENT ON FUNCTION pgq._cancel_for_dependency(bigint[], bigint, pgq.job_state) IS
    'Cancels waiting jobs whose dependency has ended failed or cancelled, with last_error naming it.';

DROP FUNCTION pgq.enqueue(text, text, jsonb, timestamptz, integer, integer, text, text, interval, jsonb, text);
CREATE FUNCTION pgq.enqueue(queue text, kind text, payload jsonb DEFAULT '{}',
                            run_at timestamptz DEFAULT now(), priority integer DEFAULT 0,
                            max_attempts integer DEFAULT NULL, unique_key text DEFAULT NULL,
                            tenant text DEFAULT NULL, max_run_time interval DEFAULT NULL,
                            meta jsonb DEFAULT NULL, concurrency_key text DEFAULT NULL,
                            depends_on bigint[] DEFAULT NULL)
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
    -- With dependencies: waiting for those not done yet (locked by pgq._lock_dependencies until
    -- this transaction ends, so none of them ends unseen), or cancelled at once (below) when one
    -- has ended failed or cancelled. An empty array is no dependency. A live job that holds the
    -- unique_key is answered first, so that a deduplicated call writes nothing here either.
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
        deps := pgq._lock_dependencies(enqueue.depends_on);
        IF cardinality(deps.ids) > 0 THEN
            dep_ids := deps.ids;
            left_count := cardinality(deps.open_ids);
            IF left_count > 0 OR deps.ended_id IS NOT NULL THEN
                new_state := 'waiting';
            END IF;
        END IF;
    END IF;

    IF enqueue.unique_key IS NULL THEN
        -- A plain INSERT: ON CONFLICT would make it a speculative insertion even without a key.
        INSERT INTO pgq.jobs AS j (queue, kind, payload, priority, run_at, max_attempts, tenant,
                                   max_run_time, meta, concurrency_key, state, depends_on,
                                   dependencies_left)
        VALUES (enqueue.queue, enqueue.kind, enqueue.payload, enqueue.priority, enqueue.run_at,
                coalesce(enqueue.max_attempts, q.max_attempts), job_tenant, enqueue.max_run_time,
                enqueue.meta, enqueue.concurrency_key, new_state, dep_ids, left_count)
        RETURNING j.id INTO new_id;
    ELSE
        LOOP
            INSERT INTO pgq.jobs AS j (queue, kind, payload, priority, run_at, max_attempts,
                                       unique_key, tenant, max_run_time, meta, concurrency_key,
                                       state, depends_on, dependencies_left)
            VALUES (enqueue.queue, enqueue.kind, enqueue.payload, enqueue.priority, enqueue.run_at,
                    coalesce(enqueue.max_attempts, q.max_attempts), enqueue.unique_key, job_tenant,
                    enqueue.max_run_time, enqueue.meta, enqueue.concurrency_key, new_state, dep_ids,
                    left_count)
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

    IF new_state = 'waiting' THEN
        IF deps.ended_id IS NOT NULL THEN
            -- A dependency has ended failed or cancelled: the job ends as if it had been waiting then.
            PERFORM pgq._cancel_for_dependency(ARRAY[new_id], deps.ended_id, deps.ended_state);
        ELSE
            INSERT INTO pgq.job_dependencies (depends_on, job_id)
            SELECT d.id, new_id FROM unnest(deps.open_ids) AS d(id);
        END IF;
        RETURN new_id;
    END IF;
    IF q.notify AND enqueue.run_at <= pgq._now() THEN
        PERFORM pg_notify('pgq', enqueue.queue);
    END IF;
    RETURN new_id;
END
$$;
COMMENT ON FUNCTION pgq.enqueue(text, text, jsonb, timestamptz, integer, integer, text, text, interval, jsonb, text, bigint[]) IS
    'Adds one job and returns its id; with unique_key, returns the id of the live job that holds it. '
    'meta: a JSON object (or NULL) kept with the job and returned by pgq.claim. depends_on: the job '
    'waits until those jobs are done (cancelled if one fails or is cancelled).';

DROP FUNCTION pgq.enqueue_many(text, text, jsonb[], timestamptz, integer, integer, text, interval, jsonb, text);
CREATE FUNCTION pgq.enqueue_many(queue text, kind text, payloads jsonb[],
                                 run_at timestamptz DEFAULT now(), priority integer DEFAULT 0,
                                 max_attempts integer DEFAULT NULL, tenant text DEFAULT NULL,
                                 max_run_time interval DEFAULT NULL, meta jsonb DEFAULT NULL,
                                 concurrency_key text DEFAULT NULL, depends_on bigint[] DEFAULT NULL)
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
    -- The same dependencies for every job, as in pgq.enqueue.
    IF enqueue_many.depends_on IS NOT NULL THEN
        deps := pgq._lock_dependencies(enqueue_many.depends_on);
        IF cardinality(deps.ids) > 0 THEN
            dep_ids := deps.ids;
            left_count := cardinality(deps.open_ids);
            IF left_count > 0 OR deps.ended_id IS NOT NULL THEN
                new_state := 'waiting';
            END IF;
        END IF;
    END IF;

    IF new_state = 'pending' THEN
        -- Identity values are drawn in the order the rows are inserted, so ordering by id returns
        -- the ids in payload order.
        RETURN QUERY
        WITH inserted AS (
            INSERT INTO pgq.jobs (queue, kind, payload, priority, run_at, max_attempts, tenant, max_run_time,
                                  meta, concurrency_key, depends_on, dependencies_left)
            SELECT enqueue_many.queue, enqueue_many.kind, p.value, enqueue_many.priority,
                   enqueue_many.run_at, coalesce(enqueue_many.max_attempts, q.max_attempts),
                   job_tenant, enqueue_many.max_run_time, enqueue_many.meta, enqueue_many.concurrency_key,
                   dep_ids, left_count
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
                              meta, concurrency_key, state, depends_on, dependencies_left)
        SELECT enqueue_many.queue, enqueue_many.kind, p.value, enqueue_many.priority,
               enqueue_many.run_at, coalesce(enqueue_many.max_attempts, q.max_attempts),
               job_tenant, enqueue_many.max_run_time, enqueue_many.meta, enqueue_many.concurrency_key,
               'waiting', dep_ids, left_count
        FROM unnest(enqueue_many.payloads) WITH ORDINALITY AS p(value, n)
        ORDER BY p.n
        RETURNING jobs.id
    )
    SELECT coalesce(array_agg(i.id ORDER BY i.id), '{}') INTO new_ids FROM inserted AS i;
    IF deps.ended_id IS NOT NULL THEN
        PERFORM pgq._cancel_for_dependency(new_ids, deps.ended_id, deps.ended_state);
    ELSE
        INSERT INTO pgq.job_dependencies (depends_on, job_id)
        SELECT d.id, n.id FROM unnest(deps.open_ids) AS d(id) CROSS JOIN unnest(new_ids) AS n(id);
    END IF;
    RETURN QUERY SELECT unnest(new_ids);
END
$$;
COMMENT ON FUNCTION pgq.enqueue_many(text, text, jsonb[], timestamptz, integer, integer, text, interval, jsonb, text, bigint[]) IS
    'Adds one job per payload in one INSERT and returns their ids in payload order; each job '
    'gets the same meta and the same depends_on.';

CREATE OR REPLACE FUNCTION pgq.retry(id bigint)
    RETURNS boolean
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET lock_timeout = '5s'
    AS $$
DECLARE
    job pgq.jobs := pgq._admin_job(retry.id);
BEGIN
    IF job.state NOT IN ('failed', 'cancelled') THEN
        RAISE EXCEPTION 'pgq: job % is %, only failed or cancelled jobs can be retried', retry.id, job.state
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Use pgq.resolve for outcome_unknown jobs.';
    END IF;
    IF greatest(job.max_attempts, job.attempt + 1) - job.attempt_offset > pgq._attempt_room() THEN
        PERFORM pgq._no_attempt_room(retry.id, 'retry');
    END IF;
    BEGIN
        UPDATE pgq.jobs AS j
        SET state = 'pending', run_at = pgq._now(), finished_at = NULL,
            max_attempts = greatest(j.max_attempts, j.attempt + 1), last_event = 'retried'
        WHERE j.id = retry.id;
    EXCEPTION WHEN unique_violation THEN
        RAISE EXCEPTION 'pgq: job % cannot be retried: job % holds its unique_key %', retry.id,
            (SELECT j.id FROM pgq.jobs AS j
             WHERE j.queue = job.queue AND j.unique_key = job.unique_key
               AND j.unique_key IS NOT NULL AND j.state IN ('waiting', 'pending', 'running', 'outcome_unknown')),
            quote_literal(job.unique_key)
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Wait for that job to finish, or cancel it first.';
    END;
    PERFORM pgq._admin_event(job, 'retried', 'pending');
    PERFORM pgq._notify(job.queue);
    RETURN true;
END
$$;

DROP FUNCTION pgq.stats();
CREATE FUNCTION pgq.stats()
    RETURNS TABLE (queue text, paused boolean, pending bigint, scheduled bigint, running bigint,
                   expired bigint, done bigint, failed bigint, cancelled bigint,
                   outcome_unknown bigint, oldest_ready_age interval, waiting bigint)
    LANGUAGE sql STABLE
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
    SELECT q.name, q.paused,
           count(*) FILTER (WHERE j.state = 'pending' AND j.run_at <= pgq._now()),
           count(*) FILTER (WHERE j.state = 'pending' AND j.run_at > pgq._now()),
           count(*) FILTER (WHERE j.state = 'running'),
           count(*) FILTER (WHERE j.state = 'running' AND j.lease_until < pgq._now()),
           count(*) FILTER (WHERE j.state = 'done'),
           count(*) FILTER (WHERE j.state = 'failed'),
           count(*) FILTER (WHERE j.state = 'cancelled'),
           count(*) FILTER (WHERE j.state = 'outcome_unknown'),
           pgq._now() - min(j.run_at) FILTER (WHERE j.state = 'pending' AND j.run_at <= pgq._now()),
           count(*) FILTER (WHERE j.state = 'waiting')
    FROM pgq.queues AS q
    LEFT JOIN pgq.jobs AS j ON j.queue = q.name
    GROUP BY q.name, q.paused
    ORDER BY q.name
$$;
COMMENT ON FUNCTION pgq.stats() IS
    'One row per queue: jobs by state (pending = due now, scheduled = due later, waiting = for their '
    'dependencies), expired leases, and the age of the oldest due job.';

DROP FUNCTION pgq.metrics();
CREATE FUNCTION pgq.metrics()
    RETURNS TABLE (queue text, paused boolean, pending bigint, scheduled bigint, running bigint,
                   expired bigint, outcome_unknown bigint, oldest_ready_age interval,
                   done_total bigint, failed_total bigint, cancelled_total bigint, waiting bigint)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
BEGIN
    PERFORM pgq._fold_finished();
    RETURN QUERY
    WITH leased AS (
        SELECT j.queue, count(*) AS running, count(*) FILTER (WHERE j.lease_until < pgq._now()) AS expired
        FROM pgq.jobs AS j
        WHERE j.lease_until IS NOT NULL
        GROUP BY j.queue
    ), finished AS (
        SELECT f.queue,
               sum(f.n) FILTER (WHERE f.state = 'done') AS done,
               sum(f.n) FILTER (WHERE f.state = 'failed') AS failed,
               sum(f.n) FILTER (WHERE f.state = 'cancelled') AS cancelled
        FROM (SELECT c.queue, c.state, c.total AS n FROM pgq.finished_counts AS c
              UNION ALL
              SELECT d.queue, d.state, count(*) FROM pgq.finished_deltas AS d GROUP BY d.queue, d.state) AS f
        GROUP BY f.queue
    )
    SELECT q.name, q.paused, p.due, p.later, coalesce(l.running, 0), coalesce(l.expired, 0), u.n,
           pgq._now() - p.oldest,
           coalesce(f.done, 0)::bigint, coalesce(f.failed, 0)::bigint, coalesce(f.cancelled, 0)::bigint, w.n
    FROM pgq.queues AS q
    CROSS JOIN LATERAL (
        SELECT count(*) FILTER (WHERE j.run_at <= pgq._now()) AS due,
               count(*) FILTER (WHERE j.run_at > pgq._now()) AS later,
               min(j.run_at) FILTER (WHERE j.run_at <= pgq._now()) AS oldest
        FROM pgq.jobs AS j
        WHERE j.queue = q.name AND j.state = 'pending' AND j.attempt < j.max_attempts) AS p
    CROSS JOIN LATERAL (
        SELECT count(*) AS n FROM pgq.jobs AS j WHERE j.queue = q.name AND j.state = 'outcome_unknown') AS u
    CROSS JOIN LATERAL (
        SELECT count(*) AS n FROM pgq.jobs AS j WHERE j.queue = q.name AND j.state = 'waiting') AS w
    LEFT JOIN leased AS l ON l.queue = q.name
    LEFT JOIN finished AS f ON f.queue = q.name
    ORDER BY q.name;
END
$$;
COMMENT ON FUNCTION pgq.metrics() IS
    'One row per queue for exporters, without reading finished jobs: pending (due now) and scheduled '
    'jobs, running, expired leases, outcome_unknown, the oldest due job''s age, the jobs finished '
    'as done, failed and cancelled (counters, from the finished rows stored at migration 0010 on: '
    'pgq.prune does not lower them), and the jobs waiting for their dependencies.';

CREATE OR REPLACE FUNCTION pgq.version() RETURNS text
    LANGUAGE sql IMMUTABLE
    AS $$ SELECT '13'::text $$;

REVOKE EXECUTE ON FUNCTION
    pgq._dependency_ended(bigint, pgq.job_state, pgq.job_state, boolean),
    pgq._lock_dependencies(bigint[]),
    pgq._cancel_for_dependency(bigint[], bigint, pgq.job_state),
    pgq.enqueue(text, text, jsonb, timestamptz, integer, integer, text, text, interval, jsonb, text, bigint[]),
    pgq.enqueue_many(text, text, jsonb[], timestamptz, integer, integer, text, interval, jsonb, text, bigint[]),
    pgq.stats(),
    pgq.metrics()
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    pgq.enqueue(text, text, jsonb, timestamptz, integer, integer, text, text, interval, jsonb, text, bigint[]),
    pgq.enqueue_many(text, text, jsonb[], timestamptz, integer, integer, text, interval, jsonb, text, bigint[])
    TO pgq_producer;
GRANT EXECUTE ON FUNCTION pgq.stats(), pgq.metrics() TO pgq_monitor;
