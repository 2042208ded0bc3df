-- 0018: power tools (issue 27): enqueue's on_conflict 'replace' (and debounce), bulk retry and
-- cancel by filter, a running job's cancellation told to its worker at once. The functions are
-- the function source's (sql/functions/enqueue.sql says how a replacement behind a running holder
-- works, admin.sql the bulk calls); this versions what they read:
--
-- * pgq.unique_successors: one row per (queue, unique_key) whose live holder had started (running
--   or outcome_unknown) when pgq.enqueue(..., on_conflict => 'replace') came: job_id is the job
--   that call enqueued to run after the holder (it waits for it), which later replace calls of
--   that key update while it has not started. The row is also what serialises replace calls of
--   one key (each locks it till commit); workers never read it. Deleted when the key needs no
--   successor any more, and by pgq.prune once its job is no longer live.
--
-- Nothing on pgq.jobs changes: no lock on it, no index built.
SET LOCAL lock_timeout = '5s';

CREATE TABLE pgq.unique_successors (
    queue      text   NOT NULL,
    unique_key text   NOT NULL,
    job_id     bigint,
    CONSTRAINT unique_successors_pkey PRIMARY KEY (queue, unique_key)
);
COMMENT ON TABLE pgq.unique_successors IS
    'For pgq.enqueue(..., on_conflict => ''replace''): the job enqueued to run after a key''s holder '
    'that had started (job_id), which later replace calls update until it starts; each replace call '
    'of the key locks its row till commit. Deleted by pgq.prune once the job is no longer live.';
REVOKE ALL ON pgq.unique_successors FROM PUBLIC;
