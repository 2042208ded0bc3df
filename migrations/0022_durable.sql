-- 0022: durable execution (issue 39): steps that run once, sleeps and signal waits that give up
-- the worker's slot, children awaited without holding one, workflows cancelled as a tree, and a
-- job's lifetime. The functions are the function source's (sql/functions/steps.sql says how a
-- step is fenced, signals.sql how a signal and a wait meet without waiting for each other,
-- workflows.sql how children are spawned, awaited and cancelled); this versions what they read:
--
-- * pgq.jobs gains workflow_id (the root of the tree a spawned job belongs to), parent_id (the job
--   that spawned it), start_by (enqueue's: cancelled when not claimed by then), expires_at
--   (created_at + enqueue's max_lifetime: failed when still alive then), wait_signal and wake_at
--   (while the job is parked by pgq.await_signal: the signal it waits for, and when the wait times
--   out). NULLs: no table rewrite, and a job that uses none of it has no entry in the new indexes.
-- * Four partial indexes on pgq.jobs, each over the jobs that use one of these only: a workflow's
--   members (pgq.cancel_workflow), the jobs parked for a signal, by queue and name (pgq.signal) and
--   by when their wait times out (the sweep), and the unfinished jobs with a start_by or an
--   expires_at, by the earlier of the two (the sweep). CREATE INDEX holds SHARE on pgq.jobs while it
--   reads the table (about a second per million rows): workers' writes wait that long. To build them
--   without that wait first, add the columns and run the CREATE INDEX CONCURRENTLY IF NOT EXISTS
--   statements of docs/upgrading.md; this migration then finds both (IF NOT EXISTS).
-- * pgq.steps: the recorded steps of each job (pgq.record_step, pgq.spawn, pgq.await_signal's
--   outcomes), kept across attempts, deleted with the job by pgq.prune.
-- * pgq.signals: the signals sent to each queue (pgq.signal; the first of a name wins), deleted by
--   pgq.prune after the queue's retention.
-- * pgq.signal_checks: the signals whose waiters are still to be looked at once more (a wait that
--   overlapped the signal, a waiter another transaction held, more waiters than one call wakes):
--   pgq.sweep and pgq.settle_dependencies work through them.
-- * pgq.signal_grants: the per-queue grants of the privilege 'signal' (pgq.grant_queue(queue, role,
--   'signal')). A table of its own: a new privilege in pgq.grants would change its CHECK
--   constraint, which takes ACCESS EXCLUSIVE on pgq.grants and so waits for every reader of it.
--
-- Only pgq.jobs is locked against its readers (ACCESS EXCLUSIVE for the ALTER, an instant, after
-- the transactions that use it; a session that keeps one open makes the migration give up after its
-- lock_timeout, changing nothing: run it again). The new tables' foreign keys take SHARE ROW
-- EXCLUSIVE on pgq.queues, which waits for writers of it (not readers).
SET LOCAL lock_timeout = '5s';

ALTER TABLE pgq.jobs
    ADD COLUMN IF NOT EXISTS workflow_id bigint,
    ADD COLUMN IF NOT EXISTS parent_id bigint,
    ADD COLUMN IF NOT EXISTS start_by timestamptz,
    ADD COLUMN IF NOT EXISTS expires_at timestamptz,
    ADD COLUMN IF NOT EXISTS wait_signal text,
    ADD COLUMN IF NOT EXISTS wake_at timestamptz;
COMMENT ON COLUMN pgq.jobs.workflow_id IS
    'A job enqueued by pgq.spawn: the root of its tree (the job that spawned the first of its '
    'ancestors); NULL otherwise, the root included. pgq.cancel_workflow cancels the tree.';
COMMENT ON COLUMN pgq.jobs.parent_id IS 'A job enqueued by pgq.spawn: the job that spawned it; NULL otherwise.';
COMMENT ON COLUMN pgq.jobs.start_by IS
    'Enqueue''s start_by: a job not claimed by then (its attempt still 0) is cancelled, never handed '
    'out; NULL: no such limit.';
COMMENT ON COLUMN pgq.jobs.expires_at IS
    'created_at + enqueue''s max_lifetime: a job alive then (waiting, pending, sleeping or running) '
    'fails, and no attempt runs past it; NULL: no such limit.';
COMMENT ON COLUMN pgq.jobs.wait_signal IS
    'While parked by pgq.await_signal (state waiting): the name of the signal of its queue it waits '
    'for.';
COMMENT ON COLUMN pgq.jobs.wake_at IS
    'While parked by pgq.await_signal: when its wait times out (NULL: never).';

CREATE INDEX IF NOT EXISTS jobs_workflow_idx ON pgq.jobs (workflow_id) WHERE workflow_id IS NOT NULL;
COMMENT ON INDEX pgq.jobs_workflow_idx IS
    'The members of each workflow (pgq.cancel_workflow, the dashboard): spawned jobs only.';
CREATE INDEX IF NOT EXISTS jobs_signal_wait_idx ON pgq.jobs (queue, wait_signal)
    WHERE wait_signal IS NOT NULL AND state = 'waiting';
COMMENT ON INDEX pgq.jobs_signal_wait_idx IS
    'The jobs parked for a signal, by queue and signal name: pgq.signal wakes them from here. A '
    'job leaves it when it leaves the state waiting, whoever moves it.';
CREATE INDEX IF NOT EXISTS jobs_wake_idx ON pgq.jobs (wake_at) WHERE wake_at IS NOT NULL AND state = 'waiting';
COMMENT ON INDEX pgq.jobs_wake_idx IS 'The signal waits with a timeout, by when it passes: the sweep fires them.';
CREATE INDEX IF NOT EXISTS jobs_expiry_idx ON pgq.jobs ((least(CASE WHEN attempt = 0 THEN start_by END, expires_at)))
    WHERE (start_by IS NOT NULL OR expires_at IS NOT NULL) AND state IN ('waiting', 'pending');
COMMENT ON INDEX pgq.jobs_expiry_idx IS
    'The jobs not running nor ended that have a start_by (while never claimed) or an expires_at, by '
    'the earlier: the sweep ends those whose time has come.';

CREATE TABLE pgq.steps (
    job_id      bigint      NOT NULL,
    name        text        NOT NULL,
    attempt     integer     NOT NULL,
    result      jsonb       NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    child_id    bigint,
    CONSTRAINT steps_pkey PRIMARY KEY (job_id, name)
);
COMMENT ON TABLE pgq.steps IS
    'The recorded steps of each job, one per name (the first record wins): pgq.record_step''s, '
    'pgq.spawn''s (child_id) and pgq.await_signal''s outcomes (named signal:<name>). Kept across '
    'attempts; deleted with the job by pgq.prune. No foreign key: it would put a trigger on every '
    'delete of pgq.jobs.';
COMMENT ON COLUMN pgq.steps.attempt IS 'The attempt that recorded it.';
COMMENT ON COLUMN pgq.steps.child_id IS 'A spawn: the job it enqueued (NULL: another step).';
REVOKE ALL ON pgq.steps FROM PUBLIC;

CREATE TABLE pgq.signals (
    queue   text        NOT NULL,
    name    text        NOT NULL,
    payload jsonb       NOT NULL,
    sent_at timestamptz NOT NULL DEFAULT now(),
    sent_by text        NOT NULL DEFAULT SESSION_USER,
    CONSTRAINT signals_pkey PRIMARY KEY (queue, name),
    CONSTRAINT signals_queue_fkey FOREIGN KEY (queue) REFERENCES pgq.queues (name) ON DELETE CASCADE
);
COMMENT ON TABLE pgq.signals IS
    'The signals sent to each queue (pgq.signal): the first of a name wins. Deleted by pgq.prune '
    'after the queue''s retention.';
COMMENT ON COLUMN pgq.signals.sent_by IS 'The login that sent it.';
REVOKE ALL ON pgq.signals FROM PUBLIC;
CREATE INDEX signals_sent_idx ON pgq.signals (sent_at);
COMMENT ON INDEX pgq.signals_sent_idx IS 'pgq.prune finds old signals here.';

CREATE TABLE pgq.signal_checks (
    id      bigint GENERATED ALWAYS AS IDENTITY,
    queue   text   NOT NULL,
    name    text   NOT NULL,
    horizon xid8,
    CONSTRAINT signal_checks_pkey PRIMARY KEY (id)
);
COMMENT ON TABLE pgq.signal_checks IS
    'Signals whose waiters are looked at again by pgq.sweep and pgq.settle_dependencies: every '
    'signal leaves one, for the waits that overlapped it (they read no signal and parked after it '
    'had looked), the waiters another transaction held, and those past what one call wakes.';
COMMENT ON COLUMN pgq.signal_checks.horizon IS
    'A transaction id taken after the signal had committed (NULL: not yet): once no transaction '
    'older than it is running, every wait that overlapped the signal has committed, and the check '
    'goes after one more look.';
REVOKE ALL ON pgq.signal_checks FROM PUBLIC;

CREATE TABLE pgq.signal_grants (
    queue      text        NOT NULL,
    role       oid         NOT NULL,
    granted_at timestamptz NOT NULL DEFAULT now(),
    granted_by text        NOT NULL DEFAULT SESSION_USER,
    CONSTRAINT signal_grants_pkey PRIMARY KEY (queue, role),
    CONSTRAINT signal_grants_queue_fkey FOREIGN KEY (queue) REFERENCES pgq.queues (name) ON DELETE CASCADE
);
COMMENT ON TABLE pgq.signal_grants IS
    'Per-queue grants of the privilege signal (pgq.grant_queue(queue, role, ''signal'')): once a '
    'queue has one, only members of the granted roles and of pgq_admin may send its signals.';
REVOKE ALL ON pgq.signal_grants FROM PUBLIC;
