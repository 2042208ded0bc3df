-- 0030: sequences (issue 41). The functions are the function source's (sql/functions/queues.sql:
-- pgq.configure_queue's key_sequence; sql/functions/keys.sql: the keyed pick, which claims a key's
-- jobs one at a time in id order in such a queue; health.sql: halted keys); this versions what
-- they read:
--
-- * pgq.queues.key_sequence: 'halt' or 'continue' (NULL: off). In such a queue the jobs of one
--   concurrency_key run one at a time, oldest first; with 'halt' a job that failed for good holds
--   its key's later jobs until an operator acts.
-- * jobs_key_sequence_idx: each key's live and failed jobs in id order, so that a claim finds a
--   key's first job (its head) in one probe. Jobs without a concurrency_key are not in it (a queue
--   without keys pays nothing for it); a keyed job is, while it is waiting, pending, running,
--   outcome_unknown or failed.
--
-- A nullable column without a default: a catalog change only (no rewrite of pgq.queues). The index
-- is built under a SHARE lock on pgq.jobs (enqueues and claims wait for it; an upgrade of a large
-- queue table builds it for as long as a scan of the table takes). The function source of the
-- previous version, in place until the new one is applied (they commit apart), does not read
-- either: a key_sequence set meanwhile binds from then on.
SET LOCAL lock_timeout = '5s';

ALTER TABLE pgq.queues ADD COLUMN key_sequence text;
ALTER TABLE pgq.queues ADD CONSTRAINT queues_key_sequence_check
    CHECK (key_sequence IN ('halt', 'continue'));
COMMENT ON COLUMN pgq.queues.key_sequence IS
    'halt or continue: the jobs of one concurrency_key run one at a time in id order (halt: a job '
    'that failed for good holds the key''s later jobs until it is retried or deleted); NULL: off.';

-- `id > 0` (true of every job) is in the predicate so that only a query that states it, the
-- head's (pgq._sequence_head), can use the index: without it PostgreSQL 18 chose it for a keyed
-- queue's per-key pick (pending jobs of a key by priority), read all of a key's jobs and sorted
-- them, where jobs_key_ready_idx reads the first ones in order.
CREATE INDEX IF NOT EXISTS jobs_key_sequence_idx ON pgq.jobs (queue, concurrency_key, id)
    WHERE concurrency_key IS NOT NULL
      AND state IN ('waiting', 'pending', 'running', 'outcome_unknown', 'failed')
      AND id > 0;
COMMENT ON INDEX pgq.jobs_key_sequence_idx IS
    'Each key''s live and failed jobs in id order: the head of a key in a queue with key_sequence.';
