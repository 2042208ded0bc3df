-- 0027: pausing one kind of a queue (issue 41). The functions are the function source's
-- (sql/functions/queues.sql: pgq.pause and pgq.resume with `kind`; sql/functions/claim.sql: how a
-- claim skips a paused kind without reading its jobs); this versions what they read:
--
-- * pgq.queues.paused_kinds: the queue's paused kinds, in name order, without repeats; NULL when
--   none is (never an empty array). A claim of a queue with paused kinds takes its jobs per kind
--   (jobs_kind_ready_idx), of the kinds it may claim less the paused ones.
--
-- A nullable column without a default: a catalog change only (no rewrite of pgq.queues). The
-- function source of the previous version, in place until the new one is applied (they commit
-- apart), does not read it: a kind paused meanwhile is skipped from then on.
SET LOCAL lock_timeout = '5s';

ALTER TABLE pgq.queues ADD COLUMN paused_kinds text[];
COMMENT ON COLUMN pgq.queues.paused_kinds IS
    'The kinds claims skip (pgq.pause(queue, kind => ...)), in name order; NULL: none.';
