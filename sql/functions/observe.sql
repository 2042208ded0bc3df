-- sql/functions/observe.sql: what a monitor reads: stats, metrics, jobs and their history.

-- What pgq.stats and pgq.metrics read of the running jobs, per queue: how many, and how many of
-- them have an expired lease, through jobs_lease_idx (as many as the workers run). Inlined into
-- the caller's query (a plain SQL function).
CREATE OR REPLACE FUNCTION pgq._leased() RETURNS TABLE (queue text, running bigint, expired bigint)
    LANGUAGE sql STABLE
    AS $$
    SELECT j.queue, count(*), count(*) FILTER (WHERE j.lease_until < pgq._now())
    FROM pgq.jobs AS j
    WHERE j.lease_until IS NOT NULL
    GROUP BY j.queue
$$;

-- What pgq.stats and pgq.metrics read of the finished jobs, per queue: the finished counters
-- (pgq.finished_counts plus the deltas not folded yet), never a row of pgq.jobs. Inlined.
CREATE OR REPLACE FUNCTION pgq._finished_totals()
    RETURNS TABLE (queue text, done bigint, failed bigint, cancelled bigint)
    LANGUAGE sql STABLE
    AS $$
    SELECT f.queue,
           coalesce(sum(f.n) FILTER (WHERE f.state = 'done'), 0)::bigint,
           coalesce(sum(f.n) FILTER (WHERE f.state = 'failed'), 0)::bigint,
           coalesce(sum(f.n) FILTER (WHERE f.state = 'cancelled'), 0)::bigint
    FROM (SELECT c.queue, c.state, c.total AS n FROM pgq.finished_counts AS c
          UNION ALL
          SELECT d.queue, d.state, count(*) FROM pgq.finished_deltas AS d GROUP BY d.queue, d.state) AS f
    GROUP BY f.queue
$$;

-- One row per queue, at a cost that does not grow with the history (what the dashboard's overview
-- and pgq-thin stats read every few seconds): the pending jobs through jobs_ready_idx (its predicate,
-- as pgq.metrics: the index holds run_at, so no heap page is read for a job on an all-visible page;
-- through jobs_list_idx each pending job's page was read, one per job when the backlog is spread
-- over the history's pages: bench/README.md), outcome_unknown and waiting through jobs_list_idx,
-- the running ones through jobs_lease_idx (as many as the workers run), and the finished ones from the finished counters (pgq.finished_counts plus the
-- deltas not folded yet: done, failed and cancelled count the jobs that finished since the
-- counters began, migration 0010, as pgq.metrics' *_total; retention and pgq.prune do not lower
-- them). No finished row of pgq.jobs is read. It writes nothing (it does not fold: STABLE, it
-- runs on a standby); sequential scans are off so that stale statistics cannot make the planner
-- read the table, and JIT with them (the cost of a disabled scan, 1e10, would make every call
-- compile its plan: half a second).
CREATE OR REPLACE FUNCTION pgq.stats()
    RETURNS TABLE (queue text, paused boolean, pending bigint, scheduled bigint, running bigint,
                   expired bigint, done bigint, failed bigint, cancelled bigint,
                   outcome_unknown bigint, oldest_ready_age interval, waiting bigint)
    LANGUAGE sql STABLE
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET enable_seqscan = off
    SET jit = off
    AS $$
    SELECT q.name, q.paused, p.due, p.later, coalesce(l.running, 0), coalesce(l.expired, 0),
           coalesce(f.done, 0), coalesce(f.failed, 0), coalesce(f.cancelled, 0),
           u.n, pgq._now() - p.oldest, w.n
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
    LEFT JOIN pgq._leased() AS l ON l.queue = q.name
    LEFT JOIN pgq._finished_totals() AS f ON f.queue = q.name
    ORDER BY q.name
$$;
COMMENT ON FUNCTION pgq.stats() IS
    'One row per queue, without reading finished jobs: jobs by state (pending = due now, scheduled = '
    'due later or sleeping, waiting = for their dependencies, a signal or the jobs they await), expired '
    'leases, the age of the oldest due job, and the jobs finished as done, failed and cancelled since '
    'the finished counters began (retention and pgq.prune do not lower them).';

-- What an exporter scrapes, one row per queue, at a bounded cost: the claimable pending jobs
-- through jobs_ready_idx, outcome_unknown through jobs_list_idx, the running ones through
-- jobs_lease_idx (all of them: as many as the workers run), the finished counters from
-- pgq.finished_counts plus the deltas not folded yet (folded first, when it can). No finished row
-- of pgq.jobs is read, whatever the statistics say (sequential scans off: with statistics taken
-- before a history arrived, the planner read the whole table for the pending counts).
CREATE OR REPLACE FUNCTION pgq.metrics()
    RETURNS TABLE (queue text, paused boolean, pending bigint, scheduled bigint, running bigint,
                   expired bigint, outcome_unknown bigint, oldest_ready_age interval,
                   done_total bigint, failed_total bigint, cancelled_total bigint, waiting bigint)
    LANGUAGE plpgsql
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET enable_seqscan = off
    SET jit = off
    AS $$
BEGIN
    PERFORM pgq._fold_finished();
    RETURN QUERY
    SELECT q.name, q.paused, p.due, p.later, coalesce(l.running, 0), coalesce(l.expired, 0), u.n,
           pgq._now() - p.oldest,
           coalesce(f.done, 0), coalesce(f.failed, 0), coalesce(f.cancelled, 0), w.n
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
    LEFT JOIN pgq._leased() AS l ON l.queue = q.name
    LEFT JOIN pgq._finished_totals() AS f ON f.queue = q.name
    ORDER BY q.name;
END
$$;
COMMENT ON FUNCTION pgq.metrics() IS
    'One row per queue for exporters, without reading finished jobs: pending (due now) and scheduled '
    'jobs, running, expired leases, outcome_unknown, the oldest due job''s age, the jobs finished '
    'as done, failed and cancelled (counters, from the finished rows stored at migration 0010 on: '
    'pgq.prune does not lower them), and the jobs waiting for their dependencies.';

-- One job, as stored (in pgq.jobs or, archived, in pgq.archive): what an operator needs before
-- cancel, retry or resolve. P0002 when unknown.
CREATE OR REPLACE FUNCTION pgq.get_job(id bigint)
    RETURNS pgq.jobs
    LANGUAGE plpgsql STABLE
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
DECLARE
    job pgq.jobs;
BEGIN
    IF get_job.id IS NULL THEN
        PERFORM pgq._bad_argument('id', 'must not be NULL');
    END IF;
    SELECT * INTO job FROM pgq.jobs AS j WHERE j.id = get_job.id;
    IF NOT FOUND THEN
        job := pgq._archived_job(get_job.id);  -- archived (archive.sql), or NULLs
    END IF;
    -- A job of a queue the login may not read is answered as if there were none.
    IF job.id IS NULL OR NOT pgq._may_read(job.queue) THEN
        RAISE EXCEPTION 'pgq: no job with id %', get_job.id
            USING ERRCODE = 'no_data_found', HINT = 'It may have been pruned.';
    END IF;
    -- Whether jobs wait for it now (the column is no longer written: an enqueue would lock this row).
    job.has_dependants := job.has_dependants
                          OR EXISTS (SELECT FROM pgq.job_dependencies AS d WHERE d.depends_on = get_job.id);
    RETURN job;
END
$$;
COMMENT ON FUNCTION pgq.get_job(bigint) IS 'The job row; P0002 when there is no such job.';

-- Who reads a job's outcome, the one rule of every result read (pgq.job_result, and through the
-- producer that named it pgq.dependency_results), decided at the time of the read: whether the
-- login `who` may read the outcome of a job of `queue` (whose queues.restricted is `restricted`)
-- that `enqueued_by` enqueued. It enqueued it; or it is a member of pgq_admin; or it reads the
-- queue: on a queue without read grants, as a member of pgq_monitor; on one with them, as a member
-- of a role granted read or claim there. A login that no longer exists reads nothing.
CREATE OR REPLACE FUNCTION pgq._reads_result(who text, queue text, restricted text[], enqueued_by text)
    RETURNS boolean
    LANGUAGE sql STABLE
    AS $$
    SELECT coalesce(_reads_result.enqueued_by = _reads_result.who, false)
        OR coalesce((SELECT pg_has_role(r.oid, 'pgq_admin', 'MEMBER')
                            OR CASE WHEN 'read' = ANY (coalesce(_reads_result.restricted, '{}'))
                                    THEN EXISTS (SELECT FROM pgq.grants AS g
                                                 WHERE g.queue = _reads_result.queue AND g.privilege IN ('read', 'claim')
                                                   AND pg_has_role(r.oid, g.role, 'MEMBER'))
                                    ELSE pg_has_role(r.oid, 'pgq_monitor', 'MEMBER') END
                     FROM pg_catalog.pg_roles AS r WHERE r.rolname = _reads_result.who), false)
$$;

-- The outcome of one job, for the login that enqueued it, admins, and logins whose read grants
-- admit its queue (monitors, for a queue without read grants): pgq._reads_result. P0002 for anyone
-- else, as for an unknown id. Not finished yet: its state, and NULLs.
CREATE OR REPLACE FUNCTION pgq.job_result(id bigint)
    RETURNS TABLE (state text, result jsonb, last_error text, finished_at timestamptz)
    LANGUAGE plpgsql STABLE
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
#variable_conflict use_column
DECLARE
    job pgq.jobs;
    restricted text[];
BEGIN
    IF job_result.id IS NULL THEN
        PERFORM pgq._bad_argument('id', 'must not be NULL');
    END IF;
    SELECT * INTO job FROM pgq.jobs AS j WHERE j.id = job_result.id;
    IF NOT FOUND THEN
        job := pgq._archived_job(job_result.id);  -- archived (archive.sql), or NULLs
    END IF;
    IF job.id IS NOT NULL THEN
        restricted := (SELECT q.restricted FROM pgq.queues AS q WHERE q.name = job.queue);
    END IF;
    IF job.id IS NULL OR NOT pgq._reads_result(session_user, job.queue, restricted, job.enqueued_by) THEN
        RAISE EXCEPTION 'pgq: no job with id %', job_result.id
            USING ERRCODE = 'no_data_found',
                  HINT = 'A job''s result is read by the login that enqueued it, by admins and by readers of its queue.';
    END IF;
    RETURN QUERY SELECT job.state::text, CASE WHEN job.state = 'done' THEN job.result END,
                        CASE WHEN job.state IN ('done', 'failed', 'cancelled') THEN job.last_error END,
                        job.finished_at;
END
$$;
COMMENT ON FUNCTION pgq.job_result(bigint) IS
    'A job''s state, result, last_error and finished_at, for the login that enqueued it, admins and '
    'readers of its queue; P0002 for anyone else.';

-- A job's links: its dependencies (its depends_on, id order) then its dependants (the jobs whose
-- depends_on names it, id order: pgq.job_dependants), then, for durable execution, the job that
-- spawned it (parent), the jobs it spawned (child: its spawns' steps, by name) and, while
-- pgq.await_jobs parks it, the jobs it still awaits (awaiting, id order), at most limit_rows of
-- each, with their queue, kind and state (NULL for a job pruned since), each read in pgq.jobs or,
-- archived, in pgq.archive (pgq._job_anywhere). Jobs of queues
-- the login may not read, archived ones too, are left out; the job itself must be readable (P0002
-- otherwise, as for an unknown id).
CREATE OR REPLACE FUNCTION pgq.job_links(id bigint, limit_rows integer DEFAULT 100)
    RETURNS TABLE (relation text, job_id bigint, queue text, kind text, state text)
    LANGUAGE plpgsql STABLE
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET enable_seqscan = off
    SET enable_bitmapscan = off
    AS $$
#variable_conflict use_column
DECLARE
    job pgq.jobs;
BEGIN
    IF job_links.id IS NULL THEN
        PERFORM pgq._bad_argument('id', 'must not be NULL');
    ELSIF job_links.limit_rows IS NULL OR job_links.limit_rows NOT BETWEEN 1 AND 1000 THEN
        PERFORM pgq._bad_argument('limit_rows',
            format('must be between 1 and 1000, got %s', coalesce(job_links.limit_rows::text, 'NULL')));
    END IF;
    SELECT * INTO job FROM pgq.jobs AS j WHERE j.id = job_links.id;
    IF NOT FOUND THEN
        job := pgq._archived_job(job_links.id);  -- archived (archive.sql), or NULLs
    END IF;
    IF job.id IS NULL OR NOT pgq._may_read(job.queue) THEN
        RAISE EXCEPTION 'pgq: no job with id %', job_links.id
            USING ERRCODE = 'no_data_found', HINT = 'It may have been pruned.';
    END IF;
    RETURN QUERY
    SELECT 'dependency'::text, d.id, j.queue, j.kind, j.state::text
    FROM (SELECT x.id FROM unnest(job.depends_on) AS x(id) ORDER BY x.id LIMIT job_links.limit_rows) AS d
    LEFT JOIN LATERAL pgq._job_anywhere(d.id) AS j ON true
    WHERE j.queue IS NULL OR pgq._may_read(j.queue)
    ORDER BY d.id;
    RETURN QUERY
    SELECT 'dependant'::text, e.job_id, j.queue, j.kind, j.state::text
    FROM (SELECT x.job_id FROM pgq.job_dependants AS x WHERE x.depends_on = job_links.id
          ORDER BY x.depends_on, x.job_id LIMIT job_links.limit_rows) AS e
    LEFT JOIN LATERAL pgq._job_anywhere(e.job_id) AS j ON true
    WHERE j.queue IS NULL OR pgq._may_read(j.queue)
    ORDER BY e.job_id;
    RETURN QUERY
    SELECT 'parent'::text, p.id, p.queue, p.kind, p.state::text
    FROM pgq._job_anywhere(job.parent_id) AS p WHERE pgq._may_read(p.queue);
    RETURN QUERY
    SELECT 'child'::text, c.child_id, j.queue, j.kind, j.state::text
    FROM (SELECT s.name, s.child_id FROM pgq.steps AS s WHERE s.job_id = job_links.id AND s.child_id IS NOT NULL
          ORDER BY s.job_id, s.name LIMIT job_links.limit_rows) AS c
    LEFT JOIN LATERAL pgq._job_anywhere(c.child_id) AS j ON true
    WHERE j.queue IS NULL OR pgq._may_read(j.queue)
    ORDER BY c.name;
    IF job.state = 'waiting' AND job.last_event = 'awaiting_jobs' THEN
        RETURN QUERY
        SELECT 'awaiting'::text, a.depends_on, j.queue, j.kind, j.state::text
        FROM (SELECT d.depends_on FROM pgq.job_dependencies AS d WHERE d.job_id = job_links.id
              ORDER BY d.depends_on LIMIT job_links.limit_rows) AS a
        LEFT JOIN LATERAL pgq._job_anywhere(a.depends_on) AS j ON true
        WHERE j.queue IS NULL OR pgq._may_read(j.queue)
        ORDER BY a.depends_on;
    END IF;
END
$$;
COMMENT ON FUNCTION pgq.job_links(bigint, integer) IS
    'A job''s dependencies, dependants, parent, children and the jobs it awaits (relation, job_id, queue, '
    'kind, state), at most limit_rows of each.';

-- A job's attempt history, oldest first (empty when its queue has audit off, or it was pruned):
-- pgq.job_events, or for an archived job pgq.archive_events (one snapshot: a job's events are in
-- one of them).
CREATE OR REPLACE FUNCTION pgq.job_history(id bigint)
    RETURNS SETOF pgq.job_events
    LANGUAGE plpgsql STABLE
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
BEGIN
    IF job_history.id IS NULL THEN
        PERFORM pgq._bad_argument('id', 'must not be NULL');
    END IF;
    IF NOT pgq._may_read(coalesce((SELECT j.queue FROM pgq.jobs AS j WHERE j.id = job_history.id),
                                  (pgq._archived_job(job_history.id)).queue)) THEN
        RETURN;  -- a job of a queue the login may not read has no history it can see
    END IF;
    RETURN QUERY SELECT * FROM pgq.job_events AS e WHERE e.job_id = job_history.id ORDER BY e.id;
    IF NOT FOUND THEN
        RETURN QUERY
        SELECT e.id, e.job_id, e.attempt, e.worker, e.event, e.from_state, e.to_state, e.at, e.note,
               e.session_role, e.times
        FROM pgq.archive_events AS e WHERE e.job_id = job_history.id ORDER BY e.id;
    END IF;
END
$$;
COMMENT ON FUNCTION pgq.job_history(bigint) IS
    'The events of one job (claims, transitions, rejected stale writes), oldest first.';

-- The page of pgq.list_jobs without a filter, for a login that may read every queue: the newest
-- limit_rows jobs with an id below `below`, of every queue and state, in pgq.jobs and in the
-- archive. A backward walk of jobs_pkey and of each archive day partition's archive_id_idx, merged
-- by id (Merge Append): it reads limit_rows rows, and one more per stream it stops early, however
-- many queues, states and finished jobs there are. The planner settings hold that plan whatever the
-- statistics say: a generic plan counts on a LIMIT it does not know to take a tenth of the rows,
-- for which a sort of a sequential scan can look cheaper than the walk. The rows and their order
-- are those of list_jobs' read per (queue, state), but for the archived jobs of a dropped queue
-- (pgq.drop_queue leaves the archive as it is): listed here, as pgq.get_job reads them (filtering
-- them out would read past all of them).
CREATE OR REPLACE FUNCTION pgq._list_newest(below bigint, limit_rows integer)
    RETURNS SETOF pgq.jobs
    LANGUAGE plpgsql STABLE
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
    SET enable_bitmapscan = off
    SET enable_sort = off
    AS $$
BEGIN
    RETURN QUERY
    SELECT p.*
    FROM (SELECT j.* FROM pgq.jobs AS j UNION ALL SELECT x.* FROM pgq.archive AS x) AS p
    WHERE p.id < _list_newest.below  -- here, not in the branches: so they are merged, not sorted
    ORDER BY p.id DESC
    LIMIT _list_newest.limit_rows;
END
$$;

-- pgq.list_jobs' page of the jobs holding all of `tags`: every such job through jobs_tags_idx and
-- each day partition's archive_tags_idx (GIN, bitmap scans), then the newest limit_rows of those
-- that match the rest. The GIN reads are the only plan: the generic plan cannot know how many jobs
-- hold the tags, and on its guess the planner sometimes walked a day partition's archive_id_idx
-- backwards instead, reading every untagged job of the day for a handful of tagged ones (3,000 in
-- tests/sql/test_archive.py).
CREATE OR REPLACE FUNCTION pgq._list_tagged(tags text[], states pgq.job_state[], queue text, kind text,
                                            hidden text[], below bigint, limit_rows integer)
    RETURNS SETOF pgq.jobs
    LANGUAGE plpgsql STABLE
    SET plan_cache_mode = force_generic_plan
    SET enable_seqscan = off
    SET enable_indexscan = off
    AS $$
BEGIN
    RETURN QUERY
    SELECT t.*
    FROM (SELECT j.* FROM pgq.jobs AS j UNION ALL SELECT x.* FROM pgq.archive AS x) AS t
    -- (the planner applies these to each branch: each reads its GIN index)
    WHERE t.tags @> _list_tagged.tags AND t.tags IS NOT NULL AND t.id < _list_tagged.below
      AND t.state = ANY (_list_tagged.states)
      AND (_list_tagged.queue IS NULL OR t.queue = _list_tagged.queue)
      AND (_list_tagged.kind IS NULL OR t.kind = _list_tagged.kind)
      AND t.queue <> ALL (_list_tagged.hidden)
    ORDER BY t.id DESC
    LIMIT _list_tagged.limit_rows;
END
$$;

-- Operators find jobs here: newest first (by id), keyset-paged (pass the last id of a page as
-- before_id for the next), filtered by queue, state and kind. Without any filter, for a login that
-- may read every queue, a page reads about limit_rows rows through jobs_pkey and archive_id_idx
-- (pgq._list_newest), however many queues and states hold jobs. With a filter, or for a login some
-- queue's grants hide from (a walk by id that skipped a hidden queue's newest million jobs would
-- read them all), a page reads at most limit_rows rows
-- per (queue, state) through jobs_list_idx (keyed by -id), and the running jobs through
-- jobs_lease_idx, however much finished history the table holds; kind is a filter within those
-- (a rare kind among many jobs of its queue and state reads past the others). An unknown queue or state
-- is refused (22023), like a malformed kind. A tags filter (the jobs holding all of its tags) reads
-- the tagged jobs instead (pgq._list_tagged), through jobs_tags_idx (GIN: a bitmap scan of the jobs holding them, in
-- every queue and state, then the newest limit_rows of those that match the rest), and in the
-- archive through each day partition's archive_tags_idx. Archived jobs (queues with archive on:
-- archive.sql) are listed with the others of their state, at most limit_rows per (queue, state)
-- and day partition through archive_list_idx (queue, state, id).
CREATE OR REPLACE FUNCTION pgq.list_jobs(queue text DEFAULT NULL, state text DEFAULT NULL, kind text DEFAULT NULL,
                              limit_rows integer DEFAULT 50, before_id bigint DEFAULT NULL,
                              tags text[] DEFAULT NULL)
    RETURNS SETOF pgq.jobs
    LANGUAGE plpgsql STABLE
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET plan_cache_mode = force_generic_plan
    SET jit = off
    AS $$
DECLARE
    states pgq.job_state[] := enum_range(NULL::pgq.job_state);
    below  bigint := coalesce(list_jobs.before_id, 9223372036854775807);
    hidden text[];  -- the queues whose jobs this login may not read
    named  pgq.queues;
BEGIN
    IF list_jobs.state IS NOT NULL THEN
        IF NOT list_jobs.state = ANY (states::text[]) THEN
            PERFORM pgq._bad_argument('state', format('must be one of %s, got %s',
                array_to_string(states, ', '), left(quote_literal(list_jobs.state), 40)));
        END IF;
        states := ARRAY[list_jobs.state::pgq.job_state];
    END IF;
    IF list_jobs.queue IS NOT NULL THEN
        named := pgq._existing_queue('queue', list_jobs.queue);
        IF NOT pgq._may(named.name, named.restricted, 'read') THEN
            PERFORM pgq._denied(named.name, 'read');
        END IF;
    END IF;
    hidden := ARRAY(SELECT h.name FROM pgq.queues AS h
                    WHERE h.restricted IS NOT NULL AND NOT pgq._may(h.name, h.restricted, 'read'));
    IF list_jobs.kind IS NOT NULL THEN
        PERFORM pgq._check_name('kind', list_jobs.kind);
    END IF;
    IF list_jobs.limit_rows IS NULL THEN
        PERFORM pgq._bad_argument('limit_rows', 'must not be NULL');
    ELSIF list_jobs.limit_rows NOT BETWEEN 1 AND 1000 THEN
        PERFORM pgq._bad_argument('limit_rows', format('must be between 1 and 1000, got %s', list_jobs.limit_rows));
    END IF;
    IF list_jobs.tags IS NOT NULL THEN
        PERFORM pgq._check_tags('tags', list_jobs.tags, true);
        RETURN QUERY SELECT * FROM pgq._list_tagged(list_jobs.tags, states, list_jobs.queue, list_jobs.kind,
                                                     hidden, below, list_jobs.limit_rows);
        RETURN;
    END IF;
    IF list_jobs.queue IS NULL AND list_jobs.state IS NULL AND list_jobs.kind IS NULL
       AND cardinality(hidden) = 0 THEN
        RETURN QUERY SELECT * FROM pgq._list_newest(below, list_jobs.limit_rows);
        RETURN;
    END IF;

    RETURN QUERY
    SELECT p.*
    FROM (
        SELECT c.*
        FROM pgq.queues AS q
        CROSS JOIN unnest(states) AS s(state)
        CROSS JOIN LATERAL (
            SELECT j.*
            FROM pgq.jobs AS j
            WHERE j.queue = q.name AND j.state = s.state AND j.state <> 'running' AND -j.id > -below
              AND (list_jobs.kind IS NULL OR j.kind = list_jobs.kind)
            ORDER BY -j.id
            LIMIT list_jobs.limit_rows
        ) AS c
        WHERE (list_jobs.queue IS NULL OR q.name = list_jobs.queue) AND s.state <> 'running'
          AND q.name <> ALL (hidden)
        UNION ALL
        SELECT a.*
        FROM pgq.queues AS q
        CROSS JOIN unnest(states) AS s(state)
        CROSS JOIN LATERAL (
            SELECT x.*
            FROM pgq.archive AS x
            WHERE x.queue = q.name AND x.state = s.state AND x.id < below
              AND (list_jobs.kind IS NULL OR x.kind = list_jobs.kind)
            ORDER BY x.id DESC
            LIMIT list_jobs.limit_rows
        ) AS a
        WHERE (list_jobs.queue IS NULL OR q.name = list_jobs.queue) AND s.state IN ('done', 'failed', 'cancelled')
          AND q.name <> ALL (hidden)
        UNION ALL
        SELECT j.*
        FROM pgq.jobs AS j
        WHERE j.lease_until IS NOT NULL AND j.state = 'running' AND 'running' = ANY (states)
          AND j.id < below
          AND (list_jobs.queue IS NULL OR j.queue = list_jobs.queue)
          AND (list_jobs.kind IS NULL OR j.kind = list_jobs.kind)
          AND j.queue <> ALL (hidden)
    ) AS p
    ORDER BY p.id DESC
    LIMIT list_jobs.limit_rows;
END
$$;
COMMENT ON FUNCTION pgq.list_jobs(text, text, text, integer, bigint, text[]) IS
    'Jobs newest first (by id), filtered by queue, state, kind and tags (holding all of them); at '
    'most limit_rows, all older than before_id when given (keyset paging).';

-- A batch's members, newest first (by id), keyset-paged like pgq.list_jobs (pass a page's last id
-- as before_id), optionally of one state: for the login that opened the batch and for members of
-- pgq_monitor and pgq_admin (P0002 for anyone else, as for an unknown id). A page reads the batch's
-- members through batch_members' primary key (batch_id, job_id), backwards from before_id, and each
-- member's row by its id; state is a filter within those (a rare state among many members reads
-- past the others, as list_jobs' kind does).
CREATE OR REPLACE FUNCTION pgq.batch_jobs(id bigint, state text DEFAULT NULL, limit_rows integer DEFAULT 50,
                                          before_id bigint DEFAULT NULL)
    RETURNS SETOF pgq.jobs
    LANGUAGE plpgsql STABLE
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    SET jit = off
    -- The primary key's order, whatever the statistics say (a young batch looks small).
    SET enable_seqscan = off
    SET enable_sort = off
    SET enable_hashjoin = off
    AS $$
DECLARE
    member bigint;
    job    pgq.jobs;
    shown  integer := 0;
BEGIN
    IF batch_jobs.state IS NOT NULL AND NOT batch_jobs.state = ANY (enum_range(NULL::pgq.job_state)::text[]) THEN
        PERFORM pgq._bad_argument('state', format('must be one of %s, got %s',
            array_to_string(enum_range(NULL::pgq.job_state), ', '), left(quote_literal(batch_jobs.state), 40)));
    END IF;
    IF batch_jobs.limit_rows IS NULL THEN
        PERFORM pgq._bad_argument('limit_rows', 'must not be NULL');
    ELSIF batch_jobs.limit_rows NOT BETWEEN 1 AND 1000 THEN
        PERFORM pgq._bad_argument('limit_rows', format('must be between 1 and 1000, got %s', batch_jobs.limit_rows));
    END IF;
    PERFORM pgq._visible_batch(batch_jobs.id);  -- 22004 for a NULL id, P0002 for a batch not the caller's
    -- Member by member (a join could be planned as a walk of every job by id, probing each for
    -- membership), each job read by its primary key.
    FOR member IN
        SELECT m.job_id FROM pgq.batch_members AS m
        WHERE m.batch_id = batch_jobs.id AND m.job_id < coalesce(batch_jobs.before_id, 9223372036854775807)
        ORDER BY m.job_id DESC
    LOOP
        SELECT j.* INTO job FROM pgq.jobs AS j WHERE j.id = member;
        CONTINUE WHEN NOT FOUND OR (batch_jobs.state IS NOT NULL AND job.state <> batch_jobs.state::pgq.job_state);
        RETURN NEXT job;
        shown := shown + 1;
        EXIT WHEN shown >= batch_jobs.limit_rows;
    END LOOP;
END
$$;
COMMENT ON FUNCTION pgq.batch_jobs(bigint, text, integer, bigint) IS
    'A batch''s members newest first (by id), of one state when given; at most limit_rows, all older '
    'than before_id when given. For the login that opened it, pgq_monitor and pgq_admin.';

-- For a worker at start: whether each of its queues exists and is paused (a worker may not read
-- pgq.stats).
CREATE OR REPLACE FUNCTION pgq.queue_status(queues text[])
    RETURNS TABLE (queue text, known boolean, paused boolean)
    LANGUAGE sql STABLE
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
    SELECT n.name, q.name IS NOT NULL, coalesce(q.paused, false)
    FROM unnest(queue_status.queues) WITH ORDINALITY AS n(name, i)
    LEFT JOIN pgq.queues AS q ON q.name = n.name
    ORDER BY n.i
$$;
COMMENT ON FUNCTION pgq.queue_status(text[]) IS
    'For each named queue, in order: whether it exists and whether it is paused.';

-- Every queue's settings (or one queue's: 22023 when there is no such queue), for dashboards and
-- operators: what pgq.configure_queue set, whether it is paused, and which privileges have
-- per-queue grants (restricted). A row of pgq.queues, so a setting a later migration adds is in
-- it too.
CREATE OR REPLACE FUNCTION pgq.queue_settings(queue text DEFAULT NULL)
    RETURNS SETOF pgq.queues
    LANGUAGE sql STABLE
    SECURITY DEFINER
    SET search_path = pgq, pg_temp
    AS $$
    SELECT pgq._existing_queue('queue', queue_settings.queue) WHERE queue_settings.queue IS NOT NULL;
    -- (rate_tat: when the queue's rate is whole again, from its slices, pgq.rate_slices, which
    -- hold its state since migration 0020: pgq._bucket_full_at.)
    SELECT (jsonb_populate_record(q, jsonb_build_object('rate_tat', pgq._bucket_full_at(q.name)))).*
    FROM pgq.queues AS q
    WHERE queue_settings.queue IS NULL OR q.name = queue_settings.queue
    ORDER BY q.name;
$$;
COMMENT ON FUNCTION pgq.queue_settings(text) IS
    'The settings of every queue (or of one): a row of pgq.queues each, by name.';
