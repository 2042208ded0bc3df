-- 0020: limits no login can hold beyond what it took (issue 37). The functions are the function
-- source's (sql/functions/keys.sql says how a claim holds a key, rates.sql how it spends a rate);
-- this versions what they read:
--
-- * pgq.key_locks: the rows a claim locks to take a key's jobs, one (or, briefly, a few) per key
--   of a queue with key limits or key rate limits, made by the key's enqueues. They replace
--   pgq.key_slots, whose 16,384 rows were a hash of queue and key: a key of any queue could share
--   a slot with another queue's key (any login could find one in one SELECT), so a claim held
--   keys it never took, and one transaction holding every slot held every key of every queue.
--   A row is made by a plain INSERT when the enqueue sees none (no unique key: an enqueue never
--   waits for another's uncommitted row of the same key), so a key may have a few rows; a claim
--   locks all it sees (pgq._hold_keys), and old rows are pruned (pgq._prune_key_locks).
--   Backfilled here for the keys of the unfinished jobs and of the rate buckets of today's
--   limited queues (a key missed meanwhile gets its row from its first claim, which then leaves
--   it for the next one).
-- * pgq.key_slots is emptied, not dropped: a claim of the old function source that runs between
--   this migration and the new source (they commit apart) finds no slot, so it holds no key and
--   takes none of a limited key's jobs; the TRUNCATE waits (lock_timeout) for the claims that
--   hold a slot now, so none of them is in flight once the new source counts a key's running
--   jobs. A later migration drops the table.
SET LOCAL lock_timeout = '5s';

CREATE TABLE pgq.key_locks (
    queue   text        NOT NULL,
    key     text        NOT NULL,
    made_by xid8        NOT NULL DEFAULT pg_current_xact_id(),
    made_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT key_locks_pkey PRIMARY KEY (queue, key, made_by),
    CONSTRAINT key_locks_queue_fkey FOREIGN KEY (queue) REFERENCES pgq.queues (name) ON DELETE CASCADE
);
CREATE INDEX key_locks_made_at_idx ON pgq.key_locks (made_at);
COMMENT ON TABLE pgq.key_locks IS
    'A concurrency key''s rows (one, or a few made at once) in a queue with key limits or key rate '
    'limits: a claim locks all of a key''s rows (FOR NO KEY UPDATE SKIP LOCKED) before it counts the '
    'key''s running jobs or spends its tokens. made_by: the transaction that made the row.';
COMMENT ON INDEX pgq.key_locks_made_at_idx IS
    'pgq.sweep and pgq.prune look at the oldest rows first (pgq._prune_key_locks).';
REVOKE ALL ON pgq.key_locks FROM PUBLIC;

INSERT INTO pgq.key_locks (queue, key)
SELECT j.queue, j.concurrency_key
FROM pgq.jobs AS j
JOIN pgq.queues AS q ON q.name = j.queue
WHERE j.concurrency_key IS NOT NULL AND j.state IN ('waiting', 'pending', 'running', 'outcome_unknown')
  AND (q.key_limited OR q.key_rate_limit > 0)
UNION
SELECT r.queue, r.key FROM pgq.key_rates AS r;

TRUNCATE pgq.key_slots;
COMMENT ON TABLE pgq.key_slots IS
    'Empty since 0020 (pgq.key_locks holds the keys): kept so that a claim of the old function source '
    'during the upgrade finds no slot; a later migration drops it.';
