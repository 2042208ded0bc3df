-- 0019: no lock space shared with the world (issue 37). pgq took advisory locks on fixed keys (the
-- queue's writer lock, the rejection lock, the fold lock): any login of the database may take any
-- advisory key, so any login could hold them. The functions now lock rows of pgq's own tables,
-- which only the schema owner can lock (sql/functions/queues.sql says how an enqueue holds its
-- queue, owner.sql how rejections take turns, batches.sql how a batch is its opener's). This
-- versions what they read:
--
-- * pgq.turns: rows pgq's calls take turns on: 'fold' (one fold of the finished counters at a time,
--   taken with SKIP LOCKED), and one row per job and login while a rejected call of that login on
--   that job records itself (inserted and deleted by the call: the table is empty between calls).
-- * pgq.batches.joiners: the roles, besides the opener's login, whose members may join the batch
--   (NULL: the opener's login alone). A batch id is no capability any more.
-- * pgq.batch_counts.shard is an integer: besides the 16 shards 0..15, a member's add or end that
--   finds all 16 held by other transactions counts into a shard of its own backend (16 + its pid),
--   instead of waiting for one of them.
-- * The trigger of a job's end, pgq's "a job ended" hub, is named for what it does: jobs_ended,
--   running pgq._job_ended (sql/functions/ended.sql); it was jobs_count_finished running
--   pgq._count_finished.
--
-- Nothing on pgq.jobs is rewritten or scanned: the trigger and its function are renamed (ACCESS
-- EXCLUSIVE on pgq.jobs for an instant, after the transactions that use it), batch_counts (16 rows
-- a batch) is rewritten with its new column type.
SET LOCAL lock_timeout = '5s';

CREATE TABLE pgq.turns (
    name text NOT NULL,
    CONSTRAINT turns_pkey PRIMARY KEY (name)
);
COMMENT ON TABLE pgq.turns IS
    'Rows pgq''s calls take turns on, in place of advisory locks (which any login may take): '
    '''fold'' (pgq._fold_finished), and ''reject <job> <login>'' while a rejected call records itself '
    '(pgq._reject; deleted by the same call).';
REVOKE ALL ON pgq.turns FROM PUBLIC;
INSERT INTO pgq.turns (name) VALUES ('fold');

ALTER TABLE pgq.batches ADD COLUMN joiners oid[];
COMMENT ON COLUMN pgq.batches.joiners IS
    'The roles (by oid) whose members may join the batch besides its opener''s login '
    '(pgq.batch_open(..., joiners)); NULL: the opener''s login alone.';

ALTER TABLE pgq.batch_counts DROP CONSTRAINT batch_counts_shard_check;
ALTER TABLE pgq.batch_counts ALTER COLUMN shard TYPE integer;
ALTER TABLE pgq.batch_counts ADD CONSTRAINT batch_counts_shard_check CHECK (shard >= 0);
COMMENT ON TABLE pgq.batch_counts IS
    'A batch''s members added and ended, by state, in 16 shards (0 to 15), and a shard per backend '
    '(16 + its pid) that found all 16 held: their sums are the batch''s counts (no foreign key: a '
    'member''s every end updates a shard, and a key check per update would cost more than the '
    'count; pgq.prune deletes them with their batch). sealed, tail: the batch''s, as the end that '
    'updates the shard reads them in the same statement.';

ALTER FUNCTION pgq._count_finished() RENAME TO _job_ended;
ALTER TRIGGER jobs_count_finished ON pgq.jobs RENAME TO jobs_ended;
COMMENT ON TABLE pgq.finished_deltas IS
    'One row per transition into a terminal state, written by the trigger jobs_ended and '
    'folded into pgq.finished_counts (and deleted) by pgq._fold_finished. It has no key (an '
    'index would cost every completion); REPLICA IDENTITY FULL lets the fold delete its rows '
    'where a publication FOR ALL TABLES includes it.';
