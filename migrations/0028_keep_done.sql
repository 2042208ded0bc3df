-- 0028: ephemeral queues (issue 40). The functions are the function source's (sql/functions/
-- queues.sql: pgq.configure_queue's keep_done; owner.sql: pgq.complete and pgq.complete_many, which
-- delete what they complete in such a queue; dependencies.sql: an enqueue's depends_on holds such a
-- job FOR KEY SHARE); this versions what they read:
--
-- * pgq.queues gains keep_done: false deletes a job of the queue as it completes (its end counted
--   and its dependants moved on first); true, the default and what every queue has after this
--   migration, keeps it for the queue's retention, as before. A column with a constant default: no
--   table rewrite.
--
-- pgq.queues is locked for the ALTER only (ACCESS EXCLUSIVE, an instant, after the transactions
-- that use it; a session that keeps one open makes the migration give up after its lock_timeout,
-- changing nothing: run it again).
SET LOCAL lock_timeout = '5s';

ALTER TABLE pgq.queues ADD COLUMN IF NOT EXISTS keep_done boolean DEFAULT true NOT NULL;
COMMENT ON COLUMN pgq.queues.keep_done IS
    'false: a job of the queue is deleted as it completes (pgq.complete, complete_many, '
    'complete_and_claim), unless something reads it after its end (notify_finished, a batch, a '
    'workflow, a unique_key, dependants); true (the default): kept for the queue''s retention.';
