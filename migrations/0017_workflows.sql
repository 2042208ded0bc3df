-- 0017: workflows and results (issue 26): dependencies that release their job whatever the outcome,
-- batches with one callback, and a producer that reads and awaits its job's result. The functions
-- are the function source's (sql/functions/batches.sql says how a batch is counted,
-- dependencies.sql how 'all_ended' releases); this versions what they read:
--
-- * pgq.jobs gains dependency_mode (the rule a job with depends_on waits by), batch_id (the batch
--   it is a member of), notify_finished (its end notifies channel pgq_finished) and enqueued_by
--   (the login that enqueued it; pgq.job_result answers that login). Constant defaults and NULLs:
--   no table rewrite. enqueued_by is added without a default first, so that the jobs already there
--   keep NULL (nobody enqueued them under this rule) rather than the migrating login's name.
-- * pgq.job_dependants: every link a dependant was enqueued with, kept after it is released
--   (pgq.job_dependencies holds only the links a job still waits on), for pgq.job_links; deleted
--   with the dependant by pgq.prune. The jobs already there get theirs from jobs.depends_on.
-- * pgq.batches and pgq.batch_counts: a batch, and its member counts in 16 shards. A member's
--   enqueue or end updates one shard row (the first one no other transaction holds), so members
--   of one batch end side by side; the sum of 16 rows says when the last one has ended.
-- * pgq.batch_members: a batch's members in id order (pgq.cancel_batch's bounded steps), written
--   for members only.
--
-- The columns are added by one ALTER TABLE: it holds ACCESS EXCLUSIVE on pgq.jobs for an instant
-- (no rewrite, no scan: NULLs and a constant default), after waiting for the transactions that use
-- the table (workers' are short; a session that keeps one open makes the migration give up after
-- its lock_timeout, changing nothing: run it again). No index is built on pgq.jobs.
SET LOCAL lock_timeout = '5s';

ALTER TABLE pgq.jobs
    ADD COLUMN dependency_mode text,
    ADD COLUMN batch_id bigint,
    ADD COLUMN notify_finished boolean DEFAULT false NOT NULL,
    ADD COLUMN enqueued_by text;
ALTER TABLE pgq.jobs ALTER COLUMN enqueued_by SET DEFAULT SESSION_USER;
COMMENT ON COLUMN pgq.jobs.dependency_mode IS
    'A job enqueued with depends_on: all_done (released when every dependency is done, cancelled when '
    'one fails or is cancelled) or all_ended (released when every dependency has ended, however); NULL otherwise.';
COMMENT ON COLUMN pgq.jobs.batch_id IS 'The batch (pgq.batches) the job is a member of; NULL: none.';
COMMENT ON COLUMN pgq.jobs.notify_finished IS
    'When true, the job''s end (done, failed, cancelled) notifies channel pgq_finished with its id.';
COMMENT ON COLUMN pgq.jobs.enqueued_by IS
    'The login that enqueued the job (pgq.job_result answers it); NULL for jobs enqueued before 0017.';

CREATE TABLE pgq.job_dependants (
    depends_on bigint NOT NULL,
    job_id     bigint NOT NULL,
    CONSTRAINT job_dependants_pkey PRIMARY KEY (depends_on, job_id)
);
COMMENT ON TABLE pgq.job_dependants IS
    'Every dependency link a job was enqueued with, kept after it is released (pgq.job_links); '
    'deleted when pgq.prune deletes the dependant.';
REVOKE ALL ON pgq.job_dependants FROM PUBLIC;
INSERT INTO pgq.job_dependants (depends_on, job_id)
SELECT DISTINCT d.id, j.id FROM pgq.jobs AS j CROSS JOIN LATERAL unnest(j.depends_on) AS d(id)
WHERE j.depends_on IS NOT NULL;

CREATE TABLE pgq.batches (
    id               bigint GENERATED ALWAYS AS IDENTITY,
    opened_by        text        NOT NULL,
    callback_queue   text        NOT NULL,
    callback_kind    text        NOT NULL,
    callback_payload jsonb       NOT NULL,
    run_when         text        NOT NULL,
    created_at       timestamptz DEFAULT now() NOT NULL,
    sealed_at        timestamptz,
    cancelled_at     timestamptz,
    cancel_after     bigint,
    callback_job_id  bigint,
    finished_at      timestamptz,
    CONSTRAINT batches_pkey PRIMARY KEY (id),
    CONSTRAINT batches_run_when_check CHECK (run_when IN ('all_done', 'all_ended'))
);
COMMENT ON TABLE pgq.batches IS
    'Batches (pgq.batch_open): a callback job enqueued once, when the batch is sealed (sealed_at) and '
    'its last member has ended. cancel_after: where pgq.cancel_batch''s next step starts (NULL: none left).';
REVOKE ALL ON pgq.batches FROM PUBLIC;
CREATE INDEX batches_unsettled_idx ON pgq.batches (id) WHERE sealed_at IS NOT NULL AND callback_job_id IS NULL;
CREATE INDEX batches_cancelling_idx ON pgq.batches (id) WHERE cancel_after IS NOT NULL;
CREATE INDEX batches_finished_idx ON pgq.batches (finished_at) WHERE finished_at IS NOT NULL;

CREATE TABLE pgq.batch_counts (
    batch_id  bigint   NOT NULL,
    shard     smallint NOT NULL,
    added     bigint   DEFAULT 0 NOT NULL,
    done      bigint   DEFAULT 0 NOT NULL,
    failed    bigint   DEFAULT 0 NOT NULL,
    cancelled bigint   DEFAULT 0 NOT NULL,
    CONSTRAINT batch_counts_pkey PRIMARY KEY (batch_id, shard),
    CONSTRAINT batch_counts_shard_check CHECK (shard BETWEEN 0 AND 15)
);
COMMENT ON TABLE pgq.batch_counts IS
    'A batch''s members added and ended, by state, in 16 shards: their sums are the batch''s counts '
    '(no foreign key: a member''s every end updates a shard, and a key check per update would cost '
    'more than the count; pgq.prune deletes them with their batch).';
REVOKE ALL ON pgq.batch_counts FROM PUBLIC;

CREATE TABLE pgq.batch_members (
    batch_id bigint NOT NULL,
    job_id   bigint NOT NULL,
    CONSTRAINT batch_members_pkey PRIMARY KEY (batch_id, job_id)
);
COMMENT ON TABLE pgq.batch_members IS
    'The members of each batch, in id order (pgq.cancel_batch); deleted with the member by pgq.prune.';
REVOKE ALL ON pgq.batch_members FROM PUBLIC;
