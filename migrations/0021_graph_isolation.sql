-- 0021: no login's graph or replace reaches another's (issue 37). The functions are the function
-- source's (sql/functions/dependencies.sql says how a cascade keeps its bounds, enqueue.sql how a
-- replace takes only the caller's own job); this versions what they keep:
--
-- * pgq.cascade_budgets: the state a transaction's cascades carry from one end to the next (how
--   many dependants its ends may still move on, until when they may wait for a dependant's row,
--   whether its ends are a recovery's), one row per transaction that needed one, keyed by its id.
--   It replaces the session settings pgq.dependency_budget and pgq.dependency_patience, which any
--   caller could set in its own session: only the owner writes this table. Rows of transactions
--   that have ended are deleted by pgq.sweep and pgq.settle_dependencies.
-- * dependency_checks.login and dependency_backlog.login: whose work each row is (the login whose
--   enqueue left the check; the login that enqueued a backlog row's next dependant), so that the
--   sweep and pgq.settle_dependencies share their work fairly among logins, each login's oldest
--   first (an index on (login, id) each). Rows already there are nobody's ('').
-- * unique_successors.enqueued_by: a replace's successor slot is its login's own (the primary key
--   gains the login): a replace call takes turns only with the same login's calls of its key. The
--   rows already there take their job's login; those whose job is gone go (they are needed no more).
--
-- New table; columns with constant defaults (no rewrite) and indexes on the three small tables of
-- pending graph work and successors, which no worker's claim or end of a job without dependants
-- touches. Nothing on pgq.jobs changes.
SET LOCAL lock_timeout = '5s';

CREATE TABLE pgq.cascade_budgets (
    xid        xid8        NOT NULL,
    budget     integer     NOT NULL,
    patience   timestamptz,
    recovering boolean     DEFAULT false NOT NULL,
    CONSTRAINT cascade_budgets_pkey PRIMARY KEY (xid)
);
COMMENT ON TABLE pgq.cascade_budgets IS
    'A transaction''s cascade state (pgq._cascade_state), one row per transaction whose ends moved '
    'dependants on, waited for one or recovered leases: written only by pgq''s functions, so no '
    'caller''s setting or temporary table changes it. Rows of ended transactions are deleted by the sweep.';
COMMENT ON COLUMN pgq.cascade_budgets.xid IS 'The transaction (pg_current_xact_id()).';
COMMENT ON COLUMN pgq.cascade_budgets.budget IS 'How many dependants its ends may still move on (the rest: the backlog).';
COMMENT ON COLUMN pgq.cascade_budgets.patience IS
    'Until when its ends may still wait for a dependant''s row another transaction holds (NULL: none waited yet).';
COMMENT ON COLUMN pgq.cascade_budgets.recovering IS
    'True while it recovers expired leases: its ends then move no dependant on and wait for no batch.';
REVOKE ALL ON pgq.cascade_budgets FROM PUBLIC;

ALTER TABLE pgq.dependency_checks ADD COLUMN login text DEFAULT '' NOT NULL;
COMMENT ON COLUMN pgq.dependency_checks.login IS
    'The login whose enqueue (or end) left the check: the checks are settled fairly among logins.';
CREATE INDEX dependency_checks_login_idx ON pgq.dependency_checks (login, id);
COMMENT ON INDEX pgq.dependency_checks_login_idx IS 'Each login''s checks, oldest first (its share of a settle).';

ALTER TABLE pgq.dependency_backlog ADD COLUMN login text DEFAULT '' NOT NULL;
COMMENT ON COLUMN pgq.dependency_backlog.login IS
    'The login whose work the row is (that enqueued its next dependant, or whose check found the end): '
    'the backlog is worked fairly among logins.';
CREATE INDEX dependency_backlog_login_idx ON pgq.dependency_backlog (login, id);
COMMENT ON INDEX pgq.dependency_backlog_login_idx IS 'Each login''s backlog rows, oldest first (its share of a sweep).';

ALTER TABLE pgq.unique_successors ADD COLUMN enqueued_by text;
UPDATE pgq.unique_successors AS s SET enqueued_by = j.enqueued_by FROM pgq.jobs AS j WHERE j.id = s.job_id;
DELETE FROM pgq.unique_successors AS s WHERE s.enqueued_by IS NULL;
ALTER TABLE pgq.unique_successors
    ALTER COLUMN enqueued_by SET DEFAULT SESSION_USER,
    ALTER COLUMN enqueued_by SET NOT NULL,
    DROP CONSTRAINT unique_successors_pkey,
    ADD CONSTRAINT unique_successors_pkey PRIMARY KEY (queue, unique_key, enqueued_by);
COMMENT ON COLUMN pgq.unique_successors.enqueued_by IS
    'The login whose replace calls of the key this row serves (and whose job job_id is).';
COMMENT ON TABLE pgq.unique_successors IS
    'For pgq.enqueue(..., on_conflict => ''replace''): per login, the job it enqueued to run after a '
    'key''s holder that had started (job_id), which its later replace calls update until it starts; '
    'each replace call of the key locks its login''s row till commit. Deleted by pgq.prune once the '
    'job is no longer live.';
