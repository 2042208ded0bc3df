-- 0031: history that is dropped, not deleted (issue 40). The functions are the function source's
-- (sql/functions/archive.sql: the sweep's move of a queue's finished jobs into the archive, the
-- archive's daily partitions and their drop; observe.sql: the reads that find a job there too;
-- admin.sql: pgq.retry, which takes an archived failed or cancelled job back; queues.sql:
-- pgq.configure_queue's archive); this versions what they read:
--
-- * pgq.queues.archive: true moves the queue's finished jobs, in the sweep, from pgq.jobs into
--   pgq.archive; false, the default and what every queue has after this migration: they stay in
--   pgq.jobs until their retention, as before. A constant default: no rewrite of pgq.queues.
-- * pgq.archive: finished jobs, the columns of pgq.jobs in their order (a migration that adds a
--   column to pgq.jobs adds it here too: tests/sql/test_archive.py checks it), partitioned by
--   finished_at into days (UTC), pgq.archive_YYYYMMDD, which the sweep creates (owner code only)
--   and drops whole when its every job is past its retention. Indexed by id (the reads) and by
--   (queue, state, id) (pgq.list_jobs' pages).
-- * pgq.archive_events: the archived jobs' events (pgq.job_events' columns, then the job's
--   finished_at, which partitions them into the same days), dropped with them.
-- * pgq.archive_cursors: per queue and finished state, the last job the sweep looked at (its
--   finished_at and id), so that a job it must keep in pgq.jobs (one that something reads there:
--   dependants, a unique_key, a batch, a workflow) is read once, not at every sweep.
--
-- New tables and a new column: no existing row is written, no job moves until a queue is
-- configured with archive => true. pgq.queues is locked for the ALTER only (ACCESS EXCLUSIVE, an
-- instant, after the transactions that use it; a session that keeps one open makes the migration
-- give up after its lock_timeout, changing nothing: run it again).
SET LOCAL lock_timeout = '5s';

ALTER TABLE pgq.queues ADD COLUMN archive boolean DEFAULT false NOT NULL;
COMMENT ON COLUMN pgq.queues.archive IS
    'true: the sweep moves the queue''s finished jobs into pgq.archive (partitioned by day, '
    'dropped whole past retention); false (the default): they stay in pgq.jobs until retention.';

-- (The columns written out, not LIKE pgq.jobs: LIKE would copy the names of pgq.jobs' NOT NULL
-- constraints on PostgreSQL 18, which a fresh install from sql/schema.sql names after pgq.archive.)
CREATE TABLE pgq.archive (
    id                 bigint NOT NULL,
    queue              text NOT NULL,
    kind               text NOT NULL,
    payload            jsonb NOT NULL,
    priority           integer NOT NULL,
    state              pgq.job_state NOT NULL,
    run_at             timestamp with time zone NOT NULL,
    created_at         timestamp with time zone NOT NULL,
    attempt            integer NOT NULL,
    max_attempts       integer NOT NULL,
    lease_until        timestamp with time zone,
    claimed_by         text,
    claimed_at         timestamp with time zone,
    last_error         text,
    result             jsonb,
    finished_at        timestamp with time zone NOT NULL,
    unique_key         text,
    tenant             text,
    last_event         text NOT NULL,
    max_run_time       interval,
    deadline           timestamp with time zone,
    progress           jsonb,
    schedule           text,
    attempt_skip       integer NOT NULL,
    attempt_offset     integer NOT NULL,
    session_role       text,
    meta               jsonb,
    concurrency_key    text,
    depends_on         bigint[],
    dependencies_left  integer,
    has_dependants     boolean NOT NULL,
    dependency_mode    text,
    batch_id           bigint,
    notify_finished    boolean NOT NULL,
    enqueued_by        text,
    workflow_id        bigint,
    parent_id          bigint,
    start_by           timestamp with time zone,
    expires_at         timestamp with time zone,
    wait_signal        text,
    wake_at            timestamp with time zone,
    tags               text[]
) PARTITION BY RANGE (finished_at);
CREATE INDEX archive_id_idx ON pgq.archive (id);
CREATE INDEX archive_list_idx ON pgq.archive (queue, state, id);
COMMENT ON TABLE pgq.archive IS
    'Finished jobs of queues with archive on, moved out of pgq.jobs by the sweep; one partition '
    'per day of finished_at (UTC), dropped whole past the archiving queues'' longest retention.';

CREATE TABLE pgq.archive_events (
    id            bigint NOT NULL,
    job_id        bigint NOT NULL,
    attempt       integer NOT NULL,
    worker        text,
    event         text NOT NULL,
    from_state    pgq.job_state,
    to_state      pgq.job_state,
    at            timestamp with time zone NOT NULL,
    note          text,
    session_role  text,
    times         integer NOT NULL,
    finished_at   timestamp with time zone NOT NULL
) PARTITION BY RANGE (finished_at);
CREATE INDEX archive_events_job_idx ON pgq.archive_events (job_id, id);
COMMENT ON TABLE pgq.archive_events IS
    'The events of the jobs in pgq.archive, partitioned by their job''s finished_at (the same days).';

CREATE TABLE pgq.archive_cursors (
    queue       text NOT NULL,
    state       pgq.job_state NOT NULL,
    finished_at timestamptz NOT NULL,
    id          bigint NOT NULL,
    PRIMARY KEY (queue, state)
);
COMMENT ON TABLE pgq.archive_cursors IS
    'Per queue and finished state, the last job (finished_at, id) the sweep''s archive step read.';
