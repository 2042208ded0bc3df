-- 0023: retention per state, applied by the sweep (issue 40). The functions are the function
-- source's (sql/functions/admin.sql: pgq._retire_finished, which pgq.prune and pgq.sweep call;
-- queues.sql: pgq.configure_queue's retention_failed and retention_cancelled); this versions what
-- they read:
--
-- * pgq.queues gains retention_failed and retention_cancelled: how long failed and cancelled jobs
--   are kept; NULL (the default, what every queue has after this migration) follows the queue's
--   retention, as before. Checked as retention is: a span of 0 to 3650 days.
-- * pgq.jobs' index of finished jobs becomes (queue, state, finished_at) instead of (finished_at),
--   over the same rows (done, failed, cancelled): each queue's and state's jobs past their
--   retention are one range of it, so a prune or a sweep reads the jobs it deletes and no job it
--   keeps (by finished_at alone, the failed jobs a queue keeps for 30 days lay before the done jobs
--   of a day ago, and each call read them again). One entry per finished job, as before.
--
-- CREATE INDEX holds SHARE on pgq.jobs while it reads the table (about a second per million rows,
-- finished jobs included): workers' writes wait that long. To build it without that wait, run the
-- CREATE INDEX CONCURRENTLY IF NOT EXISTS statement of docs/upgrading.md first; this migration then
-- finds it (IF NOT EXISTS). The DROP of the old index takes ACCESS EXCLUSIVE on pgq.jobs for an
-- instant, after the transactions that use it; a session that keeps one open makes the migration
-- give up after its lock_timeout, changing nothing: run it again.
SET LOCAL lock_timeout = '5s';

ALTER TABLE pgq.queues
    ADD COLUMN IF NOT EXISTS retention_failed interval
        CONSTRAINT queues_retention_failed_check
        CHECK (retention_failed >= '0' AND retention_failed <= '3650 days' AND pgq._is_span(retention_failed)),
    ADD COLUMN IF NOT EXISTS retention_cancelled interval
        CONSTRAINT queues_retention_cancelled_check
        CHECK (retention_cancelled >= '0' AND retention_cancelled <= '3650 days'
               AND pgq._is_span(retention_cancelled));
COMMENT ON COLUMN pgq.queues.retention_failed IS
    'How long failed jobs are kept after they finished (pgq.sweep and pgq.prune delete them after '
    'it); NULL: the queue''s retention.';
COMMENT ON COLUMN pgq.queues.retention_cancelled IS
    'How long cancelled jobs are kept after they finished (pgq.sweep and pgq.prune delete them '
    'after it); NULL: the queue''s retention.';

CREATE INDEX IF NOT EXISTS jobs_retention_idx ON pgq.jobs (queue, state, finished_at)
    WHERE state IN ('done', 'failed', 'cancelled');
COMMENT ON INDEX pgq.jobs_retention_idx IS
    'Retention (pgq.sweep, pgq.prune) finds each queue''s and state''s finished jobs by age: the '
    'jobs past their retention are one range, read without the jobs kept.';
DROP INDEX IF EXISTS pgq.jobs_finished_idx;
