-- sql/functions/archive.sql: history that is dropped, not deleted (queues with archive on).
--
-- A queue configured with archive => true keeps its finished jobs in pgq.archive instead of
-- pgq.jobs: the sweep moves them there in bounded steps (nothing at completion: a completion of
-- such a queue costs what it costs in any other), into one partition per day of finished_at (UTC,
-- pgq.archive_YYYYMMDD, with the jobs' events in pgq.archive_events_YYYYMMDD), and retention
-- drops a day's partitions whole once every job in them is past its retention: no DELETE of
-- single rows, no dead tuples in pgq.jobs from retention, no vacuum of the history. The reads
-- (pgq.get_job, job_result, job_history, job_links and the jobs it links to, job_steps, list_jobs,
-- a handler's await_jobs and job_outcomes) look in pgq.jobs, then in the archive, in one snapshot
-- (a job is in one of them, whenever the move commits); the bulk writes (retry_jobs, cancel_jobs,
-- delete_jobs, prune) act on pgq.jobs only; update_job and cancel_workflow answer an archived job
-- as one that finished in pgq.jobs (false, 0). A job's
-- id is unique across both: the move and pgq.retry's way back each delete the row they insert
-- elsewhere, in one statement's transaction.
--
-- Kept in pgq.jobs (passed over by the move, retired there by retention as before) is a finished
-- job something reads there: one jobs depend on (pgq.job_dependants; and one that an enqueue in
-- flight holds FOR KEY SHARE: skipped, never waited for), a batch member, a job of a workflow or
-- spawned by one (parent_id), one with a unique_key (enqueue's unique_for reads the done holder)
-- and one with recorded steps (pgq.job_steps). That is the rule of pgq._drop_completed, except
-- for notify_finished: pgq.job_result reads the archive too.
--
-- Partitions are created and dropped by owner code only (the sweep, SECURITY DEFINER); no role
-- has a privilege on the tables, as on pgq.jobs (docs/security.md).

-- The archived row of job `id` (as a pgq.jobs row), or NULLs: what a read of one job (get_job,
-- job_result, job_history, job_links, job_steps; _admin_job) looks at when pgq.jobs has no such
-- row, in the caller's snapshot (STABLE: a move that commits meanwhile is seen entirely or not at
-- all). One index probe per day partition.
CREATE OR REPLACE FUNCTION pgq._archived_job(id bigint) RETURNS pgq.jobs
    LANGUAGE plpgsql STABLE
    AS $$
DECLARE
    job pgq.jobs;
BEGIN
    SELECT a.* INTO job FROM pgq.archive AS a WHERE a.id = _archived_job.id LIMIT 1;
    RETURN job;
END
$$;

-- Job `id` wherever it is: its row in pgq.jobs, else its archived row (no row when neither has it:
-- pruned), in the caller's snapshot (STABLE: a move that commits meanwhile is seen entirely or not
-- at all). For the reads without a pgq.jobs row of their own in hand: update_job, cancel_workflow,
-- and the joins that read jobs by id (job_links' links, await_jobs, job_outcomes). (The reads of
-- one job read pgq.jobs themselves, then pgq._archived_job, likewise: one function call less.)
-- PL/pgSQL, two statements, not an SQL function the planner would inline: a statement that names
-- the archive locks its day partitions for the rest of the caller's transaction, even where it reads
-- none of them, and the sweep's creation and drop of a partition wait at most 100 ms for that lock,
-- then leave the move to the next sweep (pgq._sweep_archive). So the archive is read, and locked,
-- only for a job pgq.jobs lacks. One probe of jobs_pkey, else one per day partition.
CREATE OR REPLACE FUNCTION pgq._job_anywhere(id bigint) RETURNS SETOF pgq.jobs
    LANGUAGE plpgsql STABLE STRICT  -- (no row for a NULL id: job_links' parent_id)
    ROWS 1
    AS $$
BEGIN
    RETURN QUERY SELECT j.* FROM pgq.jobs AS j WHERE j.id = _job_anywhere.id;
    IF NOT FOUND THEN
        RETURN QUERY SELECT a.* FROM pgq.archive AS a WHERE a.id = _job_anywhere.id LIMIT 1;
    END IF;
END
$$;

-- The day partitions of `day` (UTC) for the archive and its events, created when missing. A
-- concurrent sweep that created them first is fine (its partition is used).
CREATE OR REPLACE FUNCTION pgq._archive_partition(day date) RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    lo timestamptz := _archive_partition.day::timestamp AT TIME ZONE 'UTC';
    hi timestamptz := (_archive_partition.day + 1)::timestamp AT TIME ZONE 'UTC';
    suffix text := to_char(_archive_partition.day, 'YYYYMMDD');
BEGIN
    IF to_regclass('pgq.archive_' || suffix) IS NULL THEN
        BEGIN
            EXECUTE format('CREATE TABLE pgq.%I PARTITION OF pgq.archive FOR VALUES FROM (%L) TO (%L)',
                           'archive_' || suffix, lo, hi);
        EXCEPTION WHEN duplicate_table THEN
            NULL;
        END;
    END IF;
    IF to_regclass('pgq.archive_events_' || suffix) IS NULL THEN
        BEGIN
            EXECUTE format('CREATE TABLE pgq.%I PARTITION OF pgq.archive_events FOR VALUES FROM (%L) TO (%L)',
                           'archive_events_' || suffix, lo, hi);
        EXCEPTION WHEN duplicate_table THEN
            NULL;
        END;
    END IF;
END
$$;

-- Moves the finished jobs `ids` (candidates: each is locked here, FOR UPDATE SKIP LOCKED, and
-- re-checked on its newest row version) with their events into the archive, creating the day
-- partitions they need; the rest of what is theirs (steps, their own links) goes as
-- pgq._delete_jobs deletes it. Returns how many it moved.
CREATE OR REPLACE FUNCTION pgq._archive_jobs(ids bigint[]) RETURNS integer
    LANGUAGE plpgsql
    SET plan_cache_mode = force_generic_plan
    AS $$
DECLARE
    locked bigint[];
    day date;
BEGIN
    locked := ARRAY(
        SELECT j.id FROM pgq.jobs AS j
        WHERE j.id = ANY (_archive_jobs.ids) AND j.state IN ('done', 'failed', 'cancelled')
          AND j.finished_at IS NOT NULL
          AND j.batch_id IS NULL AND j.workflow_id IS NULL AND j.parent_id IS NULL AND j.unique_key IS NULL
          AND NOT EXISTS (SELECT FROM pgq.job_dependants AS d WHERE d.depends_on = j.id)
          AND NOT EXISTS (SELECT FROM pgq.steps AS s WHERE s.job_id = j.id)
        ORDER BY j.id
        FOR UPDATE OF j SKIP LOCKED);
    IF cardinality(locked) = 0 THEN
        RETURN 0;
    END IF;
    FOR day IN SELECT DISTINCT (j.finished_at AT TIME ZONE 'UTC')::date FROM pgq.jobs AS j WHERE j.id = ANY (locked) LOOP
        PERFORM pgq._archive_partition(day);
    END LOOP;
    INSERT INTO pgq.archive_events
    SELECT e.*, j.finished_at FROM pgq.jobs AS j JOIN pgq.job_events AS e ON e.job_id = j.id
    WHERE j.id = ANY (locked);
    INSERT INTO pgq.archive SELECT j.* FROM pgq.jobs AS j WHERE j.id = ANY (locked);
    RETURN pgq._delete_jobs(locked);
END
$$;

-- The sweep's move: per queue with archive on and finished state (name order), the next jobs
-- after that queue and state's cursor (pgq.archive_cursors), oldest first, through
-- jobs_retention_idx, up to max_jobs read in all; each is moved (pgq._archive_jobs) or, when
-- something reads it in pgq.jobs, passed over, and the cursor moves past it, so a kept job is read
-- once. Only jobs that finished a minute ago or more: a completion whose transaction commits
-- after the cursor passed its finished_at (a transaction open for longer than that) is not
-- archived; it stays in pgq.jobs and its retention deletes it there. Returns how many it moved.
CREATE OR REPLACE FUNCTION pgq._archive_finished(max_jobs integer) RETURNS integer
    LANGUAGE plpgsql
    SET enable_seqscan = off
    SET jit = off
    AS $$
DECLARE
    settled timestamptz := pgq._now() - interval '1 minute';
    seen integer := 0;
    moved integer := 0;
    r record;
    n integer;
    last_at timestamptz;
    last_id bigint;
    ids bigint[];
BEGIN
    FOR r IN
        SELECT q.name AS queue, s.state, coalesce(c.finished_at, '-infinity') AS after_at, coalesce(c.id, 0) AS after_id
        FROM pgq.queues AS q
        CROSS JOIN unnest('{done,failed,cancelled}'::pgq.job_state[]) AS s(state)
        LEFT JOIN pgq.archive_cursors AS c ON c.queue = q.name AND c.state = s.state
        WHERE q.archive
        ORDER BY q.name, s.state
    LOOP
        EXIT WHEN seen >= _archive_finished.max_jobs;
        SELECT count(*), array_agg(x.id ORDER BY x.finished_at, x.id),
               (array_agg(x.finished_at ORDER BY x.finished_at DESC, x.id DESC))[1],
               (array_agg(x.id ORDER BY x.finished_at DESC, x.id DESC))[1]
        INTO n, ids, last_at, last_id
        FROM (SELECT j.id, j.finished_at
              FROM pgq.jobs AS j
              WHERE j.queue = r.queue AND j.state = r.state AND j.state IN ('done', 'failed', 'cancelled')
                AND j.finished_at >= r.after_at AND j.finished_at < settled
                AND (j.finished_at, j.id) > (r.after_at, r.after_id)
              ORDER BY j.finished_at, j.id
              LIMIT _archive_finished.max_jobs - seen) AS x;
        CONTINUE WHEN n = 0;
        seen := seen + n;
        INSERT INTO pgq.archive_cursors AS k (queue, state, finished_at, id)
        VALUES (r.queue, r.state, last_at, last_id)
        ON CONFLICT (queue, state) DO UPDATE SET finished_at = excluded.finished_at, id = excluded.id;
        moved := moved + pgq._archive_jobs(ids);
    END LOOP;
    RETURN moved;
END
$$;

-- The archive's horizon: a day's partitions go once their day ended before now minus the longest
-- retention (of any finished state) of the queues with archive on (of all queues when none has
-- it on; 7 days, the default retention, when there is no queue).
CREATE OR REPLACE FUNCTION pgq._archive_horizon() RETURNS timestamptz
    LANGUAGE sql STABLE
    AS $$
    SELECT pgq._now() - coalesce(
        (SELECT max(greatest(q.retention, q.retention_failed, q.retention_cancelled)) FROM pgq.queues AS q WHERE q.archive),
        (SELECT max(greatest(q.retention, q.retention_failed, q.retention_cancelled)) FROM pgq.queues AS q),
        interval '7 days')
$$;

-- Retention of the archive: DROP TABLE of up to max_partitions day partitions (oldest first, with
-- their events' partitions) whose day ended before pgq._archive_horizon(). Returns how many days
-- it dropped.
CREATE OR REPLACE FUNCTION pgq._drop_archive(max_partitions integer) RETURNS integer
    LANGUAGE plpgsql
    AS $$
DECLARE
    horizon timestamptz := pgq._archive_horizon();
    part record;
    dropped integer := 0;
BEGIN
    FOR part IN
        SELECT c.relname, to_date(right(c.relname, 8), 'YYYYMMDD') AS day
        FROM pg_catalog.pg_inherits AS i JOIN pg_catalog.pg_class AS c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'pgq.archive'::regclass AND c.relname ~ '^archive_[0-9]{8}$'
        ORDER BY c.relname
    LOOP
        EXIT WHEN dropped >= _drop_archive.max_partitions
               OR ((part.day + 1)::timestamp AT TIME ZONE 'UTC') > horizon;
        EXECUTE format('DROP TABLE pgq.%I', part.relname);
        EXECUTE format('DROP TABLE IF EXISTS pgq.%I', 'archive_events_' || right(part.relname, 8));
        dropped := dropped + 1;
    END LOOP;
    RETURN dropped;
END
$$;

-- Mixed retentions: a day's partition stays until the longest retention of the archiving queues
-- has passed; the jobs in it of a queue and state whose own retention is shorter are deleted from
-- the archive once past it (never from pgq.jobs), up to max_jobs, through archive_list_idx in the
-- partitions old enough (the rest are pruned). A queue and state with the longest retention has
-- nothing to do here: its jobs go with their partitions. Returns how many jobs it deleted.
CREATE OR REPLACE FUNCTION pgq._expire_archived(max_jobs integer) RETURNS integer
    LANGUAGE plpgsql
    SET enable_seqscan = off
    AS $$
DECLARE
    longest timestamptz := pgq._archive_horizon();
    deleted integer := 0;
    r record;
    ids bigint[];
BEGIN
    FOR r IN
        SELECT q.name AS queue, s.state,
               pgq._now() - CASE s.state WHEN 'failed' THEN coalesce(q.retention_failed, q.retention)
                                         WHEN 'cancelled' THEN coalesce(q.retention_cancelled, q.retention)
                                         ELSE q.retention END AS horizon
        FROM pgq.queues AS q CROSS JOIN unnest('{done,failed,cancelled}'::pgq.job_state[]) AS s(state)
        WHERE q.archive
        ORDER BY q.name, s.state
    LOOP
        EXIT WHEN deleted >= _expire_archived.max_jobs;
        CONTINUE WHEN r.horizon <= longest;
        ids := ARRAY(SELECT a.id FROM pgq.archive AS a
                     WHERE a.queue = r.queue AND a.state = r.state AND a.finished_at < r.horizon
                     LIMIT _expire_archived.max_jobs - deleted);
        CONTINUE WHEN cardinality(ids) = 0;
        DELETE FROM pgq.archive_events AS e WHERE e.job_id = ANY (ids) AND e.finished_at < r.horizon;
        DELETE FROM pgq.archive AS a WHERE a.id = ANY (ids) AND a.finished_at < r.horizon;
        deleted := deleted + cardinality(ids);
    END LOOP;
    RETURN deleted;
END
$$;

-- pgq.sweep's archive step: the day partitions of today and tomorrow (UTC) made ahead; the move
-- of up to max_jobs finished jobs of queues with archive on; up to two days dropped; up to
-- max_jobs archived jobs past a shorter retention deleted. Each part in a subtransaction that waits
-- at most 100 ms for a lock (a reader of the archive in a long transaction holds off a DROP; a
-- job another transaction holds is skipped): one that gives up is undone and done by the next
-- sweep. Nothing to do (no queue has archive on, the archive has no partition): two probes.
-- Returns how many jobs it moved.
CREATE OR REPLACE FUNCTION pgq._sweep_archive(max_jobs integer) RETURNS integer
    LANGUAGE plpgsql
    SET lock_timeout = '100ms'
    AS $$
DECLARE
    moved integer := 0;
    today date := (pgq._now() AT TIME ZONE 'UTC')::date;
BEGIN
    IF current_setting('transaction_read_only')::boolean THEN
        RETURN 0;
    END IF;
    IF EXISTS (SELECT FROM pgq.queues AS q WHERE q.archive) THEN
        BEGIN
            PERFORM pgq._archive_partition(today);
            PERFORM pgq._archive_partition(today + 1);
            moved := pgq._archive_finished(_sweep_archive.max_jobs);
        EXCEPTION WHEN lock_not_available THEN
            moved := 0;
        END;
    END IF;
    IF EXISTS (SELECT FROM pg_catalog.pg_inherits AS i WHERE i.inhparent = 'pgq.archive'::regclass) THEN
        BEGIN
            PERFORM pgq._drop_archive(2);
        EXCEPTION WHEN lock_not_available THEN
            NULL;
        END;
        BEGIN
            PERFORM pgq._expire_archived(_sweep_archive.max_jobs);
        EXCEPTION WHEN lock_not_available THEN
            NULL;
        END;
    END IF;
    RETURN moved;
END
$$;

-- pgq.retry's way back for an archived failed or cancelled job: its row and events moved from
-- the archive into pgq.jobs and pgq.job_events (ids kept), in this transaction; the caller then
-- locks and retries it as any failed job. A done job stays archived (it cannot be retried).
-- Returns whether it moved one. A concurrent retry of the same job waits for this one's DELETE
-- and then finds nothing to move (and the job pending).
CREATE OR REPLACE FUNCTION pgq._unarchive(id bigint) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
DECLARE
    n integer;
BEGIN
    WITH back AS (
        DELETE FROM pgq.archive AS a
        WHERE a.id = _unarchive.id AND a.state IN ('failed', 'cancelled')
        RETURNING a.*
    ), events AS (
        DELETE FROM pgq.archive_events AS e
        USING back AS b
        WHERE e.job_id = b.id AND e.finished_at = b.finished_at
        RETURNING e.id, e.job_id, e.attempt, e.worker, e.event, e.from_state, e.to_state, e.at, e.note,
                  e.session_role, e.times
    ), restored AS (
        INSERT INTO pgq.job_events OVERRIDING SYSTEM VALUE SELECT * FROM events
    ), jobs AS (
        INSERT INTO pgq.jobs OVERRIDING SYSTEM VALUE SELECT b.* FROM back AS b RETURNING 1
    )
    SELECT count(*)::integer INTO n FROM jobs;
    RETURN n > 0;
END
$$;
