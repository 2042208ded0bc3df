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
-- * pgq.rate_slices: a rate-limited queue's tokens, due one every rate_period / rate_limit, in
--   slices of a few tokens each (of 1 to 16 stripes, as the shards were, so that claimers at once
--   spend side by side), each with how many of its tokens are taken. They replace the shards of
--   pgq.rate_buckets, each a GCRA bucket that refilled while a claim held it: a worker's open
--   transaction held every shard it had spent from, and so the rest of the queue's rate. A slice
--   holds a fixed set of tokens, so a claim that holds one holds back those tokens only; a slice
--   is made ahead of its time by the claims and enqueues of the queue (a few may be made at once:
--   the same rule as pgq.key_locks), and no transaction spends from a slice only it made.
--   Made here for the current window of today's rate-limited queues, with what their shards
--   handed out and have not regained taken from the oldest tokens.
-- * pgq.claim_room: one eligible queue of a claim (its room, fair mode, per-key step, rate), the
--   row the claim's steps pass along instead of four parallel arrays.
-- * pgq.key_slots and pgq.rate_buckets are emptied, not dropped: a claim of the old function
--   source that runs between this migration and the new source (they commit apart) finds no slot
--   and no shard, so it holds no key and spends no token, and takes no job of a limited key or of a
--   rate-limited queue. Emptied under an EXCLUSIVE lock, which waits (lock_timeout) for the claims
--   that hold a slot or a shard now (and not for readers), so none of them is in flight once the
--   new source counts a key's running jobs or a rate's tokens. A later migration drops both
--   tables.
SET LOCAL lock_timeout = '5s';

CREATE TYPE pgq.claim_room AS (
    queue text,
    room  integer,
    fair  boolean,
    keyed boolean,
    rated boolean
);
COMMENT ON TYPE pgq.claim_room IS
    'One eligible queue of a claim: how many of its jobs the claim may start (room), whether it is '
    'fair, whether it takes the per-key step (key or rate limits) and whether it has a rate_limit.';

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

CREATE TABLE pgq.rate_slices (
    queue   text    NOT NULL,
    slice   bigint  NOT NULL,
    tokens  integer NOT NULL,
    taken   integer NOT NULL DEFAULT 0,
    made_by xid8    NOT NULL DEFAULT pg_current_xact_id(),
    CONSTRAINT rate_slices_pkey PRIMARY KEY (queue, slice, made_by),
    CONSTRAINT rate_slices_queue_fkey FOREIGN KEY (queue) REFERENCES pgq.queues (name) ON DELETE CASCADE,
    CONSTRAINT rate_slices_taken_check CHECK (taken BETWEEN 0 AND tokens)
);
CREATE INDEX rate_slices_left_idx ON pgq.rate_slices (queue, slice) WHERE taken < tokens;
COMMENT ON TABLE pgq.rate_slices IS
    'A rate-limited queue''s tokens in slices (token n is due at n * rate_period / rate_limit after the '
    'epoch and good for one rate_period; slice s holds `tokens` of them, those of one stripe of a '
    'block: see pgq._slices): taken, how many of the slice''s first tokens are spent or passed. A slice '
    'may have a few rows (made_by: the transaction that made it), all locked by a claim that spends '
    'from it.';
COMMENT ON INDEX pgq.rate_slices_left_idx IS
    'The slices with tokens not taken: a claim reads those of the current window (pgq._slices).';
REVOKE ALL ON pgq.rate_slices FROM PUBLIC;

-- The slices of the current window of each rate-limited queue, and of the next max(period, 10 s),
-- with the debt of its shards (the tokens they handed out and have not regained) taken from the
-- window's oldest tokens. (pgq._stripes, pgq._slice_size, pgq._token_number and
-- pgq._set_rate_buckets, written out: the function source is installed after the migrations.)
INSERT INTO pgq.rate_slices (queue, slice, tokens, taken)
SELECT q.name, g.slice, w.k,
       least(greatest(floor((w.n - q.rate_limit + least(w.debt, q.rate_limit)
                             - ((g.slice / w.m) * w.m * w.k + g.slice % w.m))::numeric / w.m) + 1, 0), w.k)
FROM pgq.queues AS q
CROSS JOIN LATERAL (SELECT greatest(1, least(16, q.rate_limit,
                                             floor(q.rate_limit / extract(epoch FROM q.rate_period) / 100)))::integer
                           AS m) AS s
CROSS JOIN LATERAL (
    SELECT s.m, greatest(1, ceil(q.rate_limit / (16.0 * s.m)))::integer AS k,
           floor(extract(epoch FROM clock_timestamp()) * q.rate_limit / extract(epoch FROM q.rate_period))::bigint AS n,
           floor(extract(epoch FROM clock_timestamp() + greatest(q.rate_period, interval '10 seconds'))
                 * q.rate_limit / extract(epoch FROM q.rate_period))::bigint AS last,
           coalesce((SELECT ceil(sum(extract(epoch FROM b.tat - clock_timestamp()) * b.rate
                                     / extract(epoch FROM q.rate_period)))
                     FROM pgq.rate_buckets AS b WHERE b.queue = q.name AND b.tat > clock_timestamp()), 0)::bigint
               AS debt) AS w
CROSS JOIN LATERAL generate_series((w.n - q.rate_limit + 1) / (w.m * w.k) * w.m,
                                   w.last / (w.m * w.k) * w.m + w.m - 1) AS g(slice)
WHERE q.rate_limit > 0;

-- (EXCLUSIVE: it waits for the claims that hold a slot or a shard, and lets readers of the
-- tables be.)
LOCK TABLE pgq.key_slots, pgq.rate_buckets IN EXCLUSIVE MODE;
DELETE FROM pgq.key_slots;
DELETE FROM pgq.rate_buckets;
COMMENT ON TABLE pgq.key_slots IS
    'Empty since 0020 (pgq.key_locks holds the keys): kept so that a claim of the old function source '
    'during the upgrade finds no slot; a later migration drops it.';
COMMENT ON TABLE pgq.rate_buckets IS
    'Empty since 0020 (pgq.rate_slices holds the rates'' tokens): kept so that a claim of the old '
    'function source during the upgrade finds no shard; a later migration drops it.';
