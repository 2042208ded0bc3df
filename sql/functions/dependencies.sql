-- sql/functions/dependencies.sql: jobs that wait for others: their links, their release, their
-- cancellation.

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
CREATE OR REPLACE FUNCTION pgq._dependency_ended(ended_id bigint, old_state pgq.job_state, new_state pgq.job_state,
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

-- The dependencies of a job being enqueued (pgq.enqueue's and pgq.enqueue_many's depends_on),
-- checked and locked. Each row is updated (has_dependants, which arms its trigger) in id order,
-- so a concurrent end of a dependency either committed first (and its state is read here) or
-- waits for this transaction and then sees the new job's link (an end under REPEATABLE READ or
-- SERIALIZABLE fails with 40001 instead: the row was updated). A job of a queue whose read
-- grants do not admit the login counts as absent, like in pgq.get_job. Returns the distinct ids
-- in order, those not done yet (the new job waits for them) and the first that ended failed or
-- cancelled (the new job is then cancelled at once), with its state.
CREATE OR REPLACE FUNCTION pgq._lock_dependencies(depends_on bigint[], OUT ids bigint[], OUT open_ids bigint[],
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

-- The jobs `ids`, just enqueued waiting, with pgq._lock_dependencies' answer for their
-- dependencies: linked to the open ones (pgq.job_dependencies) or, when one had ended failed or
-- cancelled (ended_id), cancelled at once, as if they had been waiting then. For pgq.enqueue and
-- pgq.enqueue_many.
CREATE OR REPLACE FUNCTION pgq._wait_for_dependencies(ids bigint[], open_ids bigint[], ended_id bigint,
                                                      ended_state pgq.job_state)
    RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF _wait_for_dependencies.ended_id IS NOT NULL THEN
        PERFORM pgq._cancel_for_dependency(_wait_for_dependencies.ids, _wait_for_dependencies.ended_id,
                                           _wait_for_dependencies.ended_state);
    ELSE
        INSERT INTO pgq.job_dependencies (depends_on, job_id)
        SELECT d.id, n.id
        FROM unnest(_wait_for_dependencies.open_ids) AS d(id) CROSS JOIN unnest(_wait_for_dependencies.ids) AS n(id);
    END IF;
END
$$;

-- Cancels a waiting job whose dependency `dependency` has ended `ended` (failed or cancelled):
-- for pgq.enqueue and pgq.enqueue_many, when a dependency had ended before the job was enqueued
-- (pgq._dependency_ended cancels the jobs already waiting).
CREATE OR REPLACE FUNCTION pgq._cancel_for_dependency(ids bigint[], dependency bigint, ended pgq.job_state)
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
