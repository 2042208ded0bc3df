-- 0029: priority aging with a bound (issue 41). The functions are the function source's
-- (sql/functions/queues.sql: pgq.configure_queue's max_wait; sql/functions/claim.sql: how a claim
-- serves the jobs that waited longer than it first); this versions what they read:
--
-- * pgq.queues.max_wait: how long a due job of the queue may wait before it is served ahead of any
--   job of higher priority; NULL: never (strict priority).
--
-- A nullable column without a default: a catalog change only (no rewrite of pgq.queues). The
-- function source of the previous version, in place until the new one is applied (they commit
-- apart), does not read it: a max_wait set meanwhile binds from then on.
SET LOCAL lock_timeout = '5s';

ALTER TABLE pgq.queues ADD COLUMN max_wait interval;
COMMENT ON COLUMN pgq.queues.max_wait IS
    'A due job that has waited longer than this is claimed before any job of higher priority '
    '(the lowest priority, then the oldest, first); NULL: strict priority.';
