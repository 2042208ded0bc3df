-- 0016: per-key limits without the queue's row lock, and a claim whose work is bounded however
-- a key-limited queue's jobs fall (issue 25). The functions are the function source's
-- (sql/functions/keys.sql says how the keyed pick works); this versions what they read:
--
-- * pgq.key_slots: a fixed table of 16,384 rows. A claim locks the row of each limited key it
--   takes (slot = a hash of queue and key) with SKIP LOCKED before it counts the key's running
--   jobs, so claims of one key take turns and claims of different keys run side by side. Row
--   locks, not advisory locks: only the schema owner (the claim runs as it) may lock these rows,
--   while any login of the database may take any advisory lock.
-- * jobs_key_ready_idx: each key's claimable jobs in the total order, so that a claim whose
--   head of the queue belongs to keys at their limit takes other keys' first jobs by a few index
--   probes instead of reading past every job of the full keys.
-- * jobs_key_running_idx: each key's running jobs, so that counting them reads those alone.
--
-- Both indexes hold keyed jobs only (concurrency_key IS NOT NULL): queues without keys write
-- nothing more. CREATE INDEX holds SHARE on pgq.jobs while it reads the table (about a second
-- per million rows): workers' writes wait that long. To build them without that wait first,
-- run the two CREATE INDEX CONCURRENTLY IF NOT EXISTS statements of docs/upgrading.md; this
-- migration then finds them (IF NOT EXISTS) and only creates the slots.
SET LOCAL lock_timeout = '5s';

CREATE TABLE pgq.key_slots (
    slot integer PRIMARY KEY,
    CONSTRAINT key_slots_slot_check CHECK (slot BETWEEN 0 AND 16383)
);
INSERT INTO pgq.key_slots (slot) SELECT s FROM generate_series(0, 16383) AS s;
COMMENT ON TABLE pgq.key_slots IS
    'One row per hash slot of (queue, concurrency_key): a claim locks the slot of each limited key '
    'it takes (FOR NO KEY UPDATE SKIP LOCKED) before it counts the key''s running jobs.';
REVOKE ALL ON pgq.key_slots FROM PUBLIC;

CREATE INDEX IF NOT EXISTS jobs_key_ready_idx ON pgq.jobs (queue, concurrency_key, priority DESC, run_at, id)
    WHERE state = 'pending' AND attempt < max_attempts AND concurrency_key IS NOT NULL;
COMMENT ON INDEX pgq.jobs_key_ready_idx IS
    'A key-limited queue''s claim reads the first jobs of keys other than the full ones here '
    '(pgq._keyed_pick), one probe per key, when full keys hold the head of the queue.';

CREATE INDEX IF NOT EXISTS jobs_key_running_idx ON pgq.jobs (queue, concurrency_key)
    WHERE lease_until IS NOT NULL AND concurrency_key IS NOT NULL;
COMMENT ON INDEX pgq.jobs_key_running_idx IS
    'A key-limited queue''s claim counts the running jobs of the keys it takes here.';
