-- pgq migration 0002: pgq.complete_many completes its pairs in one pass.
--
-- The completing statement locked the owned rows (FOR NO KEY UPDATE, in id order) and then updated
-- them: two writes per row. It now updates them directly, driven by the pairs sorted by id, so
-- the rows are still locked in id order. Same arguments, results, errors and events.
-- sql/schema.sql holds the same definition (tests/test_schema_matches_migrations.py).

CREATE OR REPLACE FUNCTION pgq.complete_many(ids bigint[], attempts integer[])
    RETURNS SETOF bigint
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    -- The custom plan of the completing statement cost a re-plan per call (1.6 ms of a 4-job
    -- call here, 0.7 ms with the generic plan, which reads every pair by primary key).
    SET plan_cache_mode = force_generic_plan
    AS $$
DECLARE
    done_ids bigint[];
BEGIN
    IF complete_many.ids IS NULL THEN
        PERFORM pgq._bad_argument('ids', 'must not be NULL');
    ELSIF complete_many.attempts IS NULL THEN
        PERFORM pgq._bad_argument('attempts', 'must not be NULL');
    ELSIF cardinality(complete_many.ids) <> cardinality(complete_many.attempts) THEN
        PERFORM pgq._bad_argument('attempts',
            format('must have as many elements as ids (%s), got %s',
                   cardinality(complete_many.ids), cardinality(complete_many.attempts)));
    ELSIF array_position(complete_many.ids, NULL) IS NOT NULL
          OR array_position(complete_many.attempts, NULL) IS NOT NULL THEN
        PERFORM pgq._bad_argument('ids', 'must not contain NULL (nor may attempts)');
    END IF;

    WITH completed AS (
        -- One pass: the pairs in id order, each job read by primary key and updated (so
        -- concurrent batches lock their rows in the same order and never deadlock). Locking the
        -- rows first (FOR NO KEY UPDATE, then UPDATE) wrote a lock record per row: 9% more WAL
        -- and 12% fewer calls per second (pgbench, one client, batches of 10).
        UPDATE pgq.jobs AS j
        SET state = 'done', lease_until = NULL, finished_at = pgq._now(), last_event = 'completed'
        FROM (SELECT w.id, w.attempt
              FROM unnest(complete_many.ids, complete_many.attempts) AS w(id, attempt)
              ORDER BY w.id) AS w
        WHERE j.id = w.id AND j.attempt = w.attempt AND j.state = 'running'
        RETURNING j.id, j.queue, j.attempt, j.claimed_by
    ), events AS (
        INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state)
        SELECT c.id, c.attempt, c.claimed_by, 'completed', 'running', 'done'
        FROM completed AS c JOIN pgq.queues AS q ON q.name = c.queue AND q.audit
    )
    SELECT coalesce(array_agg(c.id), '{}') INTO done_ids FROM completed AS c;
    -- The common case ends here: every pair was still ours and is done now.
    IF cardinality(done_ids) = cardinality(complete_many.ids) THEN
        RETURN QUERY SELECT unnest(done_ids);
        RETURN;
    END IF;

    -- Some pair was not completed just now. This statement sees the rows completed above, so
    -- a pair counts as ours when its job is done by that same attempt: completed above, or
    -- earlier (idempotent: a retry after an ambiguous commit). The other pairs are stale: they
    -- leave the trace a rejected pgq.complete leaves, so that a duplicate execution can be
    -- diagnosed from pgq.job_events whichever call the worker used.
    INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state, note)
    SELECT j.id, w.attempt, NULL, 'rejected', j.state, NULL,
           format('complete_many from attempt %s rejected: the job is %s at attempt %s (last claimed by %s)',
                  w.attempt, j.state, j.attempt, j.claimed_by)
    FROM unnest(complete_many.ids, complete_many.attempts) AS w(id, attempt)
    JOIN pgq.jobs AS j ON j.id = w.id AND j.id = ANY (complete_many.ids)
    JOIN pgq.queues AS q ON q.name = j.queue AND q.audit
    WHERE NOT (j.attempt = w.attempt AND j.state = 'done' AND j.last_event = 'completed');

    -- The ids drive both statements by primary key (= ANY): a join to the pairs let the generic
    -- plan read every finished job through jobs_finished_idx instead.
    RETURN QUERY
    SELECT unnest(done_ids)
    UNION
    SELECT j.id
    FROM pgq.jobs AS j
    WHERE j.id = ANY (complete_many.ids) AND j.state = 'done' AND j.last_event = 'completed'
      AND (j.id, j.attempt) IN (SELECT w.id, w.attempt
                                FROM unnest(complete_many.ids, complete_many.attempts) AS w(id, attempt));
END
$$;
