-- 0019: no lock space shared with the world (issue 37). pgq took advisory locks on fixed keys (the
-- queue's writer lock, the rejection lock, the fold lock): any login of the database may take any
-- advisory key, so any login could hold them. The functions now lock rows of pgq's own tables,
-- which only the schema owner can lock (sql/functions/queues.sql says how an enqueue holds its
-- queue, owner.sql how rejections take turns, batches.sql how a batch is its opener's). This
-- versions what they read:
--
-- * pgq.turns: rows pgq's calls take turns on: 'fold' (one fold of the finished counters at a time,
--   taken with SKIP LOCKED), and one row per job and login while a rejected call of that login on
--   that job records itself; and the mark by which pgq.complete_many tells the trigger of its
--   UPDATE that it counts the batch members it ends itself (it was the session setting
--   pgq.batch_counting, which any caller could set). The last two are inserted and deleted by the
--   call: only 'fold' stays.
-- * pgq.batch_joiners: the roles, besides the opener's login, whose members may join a batch (none:
--   the opener's login alone). A batch id is no capability any more.
-- * pgq.batch_backend_counts: a batch's counts, like its 16 shards' in pgq.batch_counts, of the
--   adds and ends that found all 16 held by other transactions: each counts into its backend's
--   row (keyed by its pid) instead of waiting for one of them.
-- * The trigger of a job's end, pgq's "a job ended" hub, is named for what it does: jobs_ended,
--   running pgq._job_ended (sql/functions/ended.sql); it was jobs_count_finished running
--   pgq._count_finished.
--
-- Nothing is rewritten or scanned, and no table but pgq.jobs is locked against its readers: the
-- trigger is renamed (ACCESS EXCLUSIVE on pgq.jobs for an instant, after the transactions that
-- use it; a session that keeps one open makes the migration give up after its lock_timeout,
-- changing nothing), the rest is new tables and comments.
SET LOCAL lock_timeout = '5s';

CREATE TABLE pgq.turns (
    name text NOT NULL,
    CONSTRAINT turns_pkey PRIMARY KEY (name)
);
COMMENT ON TABLE pgq.turns IS
    'Rows pgq''s calls take turns on or leave for their own triggers, in place of advisory locks and '
    'session settings (which any login may take or set): ''fold'' (pgq._fold_finished); '
    '''reject <job> <login>'' while a rejected call records itself (pgq._reject); ''count <xid> '
    '<depth>'' while pgq.complete_many''s statement ends batch members it counts itself. The last two '
    'are deleted by the call that inserts them.';
REVOKE ALL ON pgq.turns FROM PUBLIC;
INSERT INTO pgq.turns (name) VALUES ('fold');

CREATE TABLE pgq.batch_joiners (
    batch_id bigint NOT NULL,
    role     oid    NOT NULL,
    CONSTRAINT batch_joiners_pkey PRIMARY KEY (batch_id, role)
);
COMMENT ON TABLE pgq.batch_joiners IS
    'The roles (by oid) whose members may add members to a batch besides its opener''s login '
    '(pgq.batch_open(..., joiners)); deleted by pgq.prune with their batch.';
REVOKE ALL ON pgq.batch_joiners FROM PUBLIC;

CREATE TABLE pgq.batch_backend_counts (
    batch_id   bigint  NOT NULL,
    backend    integer NOT NULL,
    added      bigint  DEFAULT 0 NOT NULL,
    done       bigint  DEFAULT 0 NOT NULL,
    failed     bigint  DEFAULT 0 NOT NULL,
    cancelled  bigint  DEFAULT 0 NOT NULL,
    sealed     boolean DEFAULT false NOT NULL,
    tail       boolean DEFAULT false NOT NULL,
    CONSTRAINT batch_backend_counts_pkey PRIMARY KEY (batch_id, backend)
);
COMMENT ON TABLE pgq.batch_backend_counts IS
    'A batch''s members added and ended, like its shards in pgq.batch_counts, by the transactions '
    'that found all 16 shards held by others: each counts into the row of its backend (its pid), '
    'so no add and no end waits for a shard. Part of the batch''s sums; deleted by pgq.prune with '
    'their batch.';
REVOKE ALL ON pgq.batch_backend_counts FROM PUBLIC;

ALTER FUNCTION pgq._count_finished() RENAME TO _job_ended;
ALTER TRIGGER jobs_count_finished ON pgq.jobs RENAME TO jobs_ended;
COMMENT ON TABLE pgq.finished_deltas IS
    'One row per transition into a terminal state, written by the trigger jobs_ended and '
    'folded into pgq.finished_counts (and deleted) by pgq._fold_finished. It has no key (an '
    'index would cost every completion); REPLICA IDENTITY FULL lets the fold delete its rows '
    'where a publication FOR ALL TABLES includes it.';
