-- 0016: per-key and rate limits without the queue's row lock, and a claim whose work is bounded
-- however a key-limited queue's jobs fall (issue 25). The functions are the function source's
-- (sql/functions/keys.sql says how the keyed pick works, rates.sql how the buckets are shared);
-- this versions what they read:
--
-- * pgq.key_slots: a fixed table of 16,384 rows. A claim locks the row of each limited key it
--   takes (slot = a hash of queue and key) with SKIP LOCKED before it counts the key's running
--   jobs, so claims of one key take turns and claims of different keys run side by side. Row
--   locks, not advisory locks: only the schema owner (the claim runs as it) may lock these rows,
--   while any login of the database may take any advisory lock.
-- * jobs_key_ready_idx: each key's claimable jobs in the total order, so that a claim whose
--   head of the queue belongs to keys at their limit takes other keys' first jobs by a few index
--   probes instead of reading past every job of the full keys.
-- * pgq.rate_buckets: a rate-limited queue's GCRA bucket as 1 to 16 shards (queues.rate_tat was
--   its one state, so every claim of the queue held the queue's row to its commit and the others
--   got nothing meanwhile). Each shard has its part of the rate; a claim locks the shards it
--   spends (SKIP LOCKED), so claimers of one queue spend side by side and
--   together never above the rate. The buckets of today's rate-limited queues are made here from
--   their rate_tat (each shard as full as the bucket was); queues.rate_tat is no longer used.
--
-- The index holds keyed jobs only (concurrency_key IS NOT NULL): queues without keys write no
-- entry in it. CREATE INDEX holds SHARE on pgq.jobs while it reads the table (about a second per
-- million rows): workers' writes wait that long. To build it without that wait first, run the
-- CREATE INDEX CONCURRENTLY IF NOT EXISTS statement of docs/upgrading.md; this migration then
-- finds it (IF NOT EXISTS).
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

CREATE TABLE pgq.rate_buckets (
    queue  text     NOT NULL,
    shard  smallint NOT NULL,
    rate   integer  NOT NULL,
    tat    timestamptz,
    CONSTRAINT rate_buckets_pkey PRIMARY KEY (queue, shard),
    CONSTRAINT rate_buckets_queue_fkey FOREIGN KEY (queue) REFERENCES pgq.queues (name) ON DELETE CASCADE,
    CONSTRAINT rate_buckets_shard_check CHECK (shard BETWEEN 0 AND 15),
    CONSTRAINT rate_buckets_rate_check CHECK (rate > 0)
);
COMMENT ON TABLE pgq.rate_buckets IS
    'A rate-limited queue''s GCRA bucket in shards (pgq._rate_shards of them): each holds rate tokens '
    'per queues.rate_period; tat is when the shard is full again (NULL or past: full).';
REVOKE ALL ON pgq.rate_buckets FROM PUBLIC;
-- (The shard count is pgq._rate_shards(rate_limit, rate_period), written out: the function
-- source is installed after the migrations.)
INSERT INTO pgq.rate_buckets (queue, shard, rate, tat)
SELECT q.name, s.shard, q.rate_limit / n.n + (s.shard < q.rate_limit % n.n)::integer, q.rate_tat
FROM pgq.queues AS q
CROSS JOIN LATERAL (SELECT greatest(1, least(16, q.rate_limit,
                                             floor(q.rate_limit / extract(epoch FROM q.rate_period) / 100)))::integer
                    AS n) AS n
CROSS JOIN LATERAL generate_series(0, n.n - 1) AS s(shard)
WHERE q.rate_limit > 0;
COMMENT ON COLUMN pgq.queues.rate_tat IS
    'Not read nor written since 0016 (the queue''s bucket is pgq.rate_buckets); pgq.queue_settings '
    'shows the buckets'' latest tat here.';

CREATE INDEX IF NOT EXISTS jobs_key_ready_idx ON pgq.jobs (queue, concurrency_key, priority DESC, run_at, id)
    WHERE state = 'pending' AND attempt < max_attempts AND concurrency_key IS NOT NULL;
COMMENT ON INDEX pgq.jobs_key_ready_idx IS
    'A key-limited queue''s claim reads the first jobs of keys other than the full ones here '
    '(pgq._keyed_pick), one probe per key, when full keys hold the head of the queue.';
