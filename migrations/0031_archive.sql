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

CREATE TABLE pgq.archive (LIKE pgq.jobs) PARTITION BY RANGE (finished_at);
ALTER TABLE pgq.archive ALTER COLUMN finished_at SET NOT NULL;
CREATE INDEX archive_id_idx ON pgq.archive (id);
CREATE INDEX archive_list_idx ON pgq.archive (queue, state, id);
COMMENT ON TABLE pgq.archive IS
    'Finished jobs of queues with archive on, moved out of pgq.jobs by the sweep; one partition '
    'per day of finished_at (UTC), dropped whole past the archiving queues'' longest retention.';

CREATE TABLE pgq.archive_events (LIKE pgq.job_events, finished_at timestamptz NOT NULL)
    PARTITION BY RANGE (finished_at);
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
