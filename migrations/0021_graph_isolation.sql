-- 0021: no login's graph or replace reaches another's (issue 37). The functions are the function
-- source's (sql/functions/dependencies.sql says how a cascade keeps its bounds and shares the
-- backlog among logins, enqueue.sql how a replace takes only the caller's own job); this versions
-- what they keep:
--
-- * pgq.cascade_budgets: the state a transaction's cascades carry from one end to the next (how
--   many dependants its ends may still move on, until when they may wait for a dependant's row,
--   whether its ends are a recovery's), one row per transaction that needed one, keyed by its id.
--   It replaces the session settings pgq.dependency_budget and pgq.dependency_patience, which any
--   caller could set in its own session: only the owner writes this table. The rows of ended
--   transactions are deleted by pgq.sweep and pgq.settle_dependencies.
-- * pgq.overlap_checks and pgq.cascade_backlog: pgq.dependency_checks and pgq.dependency_backlog
--   with the login whose work each row is (the login whose enqueue left the check; the one that
--   enqueued a backlog row's next dependant), so that the sweep and pgq.settle_dependencies share
--   their work fairly among logins, each login's oldest first (an index on (login, id) each).
-- * pgq.replace_slots: pgq.unique_successors with the login in its key: a replace call takes turns
--   only with the same login's calls of its key.
--
-- Adding the columns to the old tables would take ACCESS EXCLUSIVE on them, which waits for any
-- session reading them (tests/test_upgrade_under_workers.py holds that no migration does but on
-- pgq.jobs). So the new tables take their rows over: those no transaction holds move here, as
-- nobody's ('') work (a successor slot as its job's login's; one whose job is gone, or was enqueued
-- before 0017, goes). What is left in the old tables (held now, or written by the previous
-- release's functions until the function source of this one is installed) is moved by
-- pgq.settle_dependencies and pgq.sweep; nothing writes them after that, and a later migration
-- drops them. New tables, a delete and a comment on the old ones (ROW EXCLUSIVE and SHARE UPDATE
-- EXCLUSIVE: no wait for their readers); nothing on pgq.jobs.
SET LOCAL lock_timeout = '5s';

CREATE TABLE pgq.cascade_budgets (
    xid        xid8        NOT NULL,
    budget     integer     NOT NULL,
    patience   timestamptz,
    recovering boolean     DEFAULT false NOT NULL,
    CONSTRAINT cascade_budgets_pkey PRIMARY KEY (xid)
);
COMMENT ON TABLE pgq.cascade_budgets IS
    'A transaction''s cascade state, one row per transaction whose ends moved dependants on, waited '
    'for one, or that recovered leases: written only by pgq''s functions, so no caller''s setting or '
    'temporary table changes it. The rows of ended transactions are deleted by the sweep.';
COMMENT ON COLUMN pgq.cascade_budgets.xid IS 'The transaction (pg_current_xact_id()).';
COMMENT ON COLUMN pgq.cascade_budgets.budget IS 'How many dependants its ends may still move on (the rest: the backlog).';
COMMENT ON COLUMN pgq.cascade_budgets.patience IS
    'Until when its ends may still wait for a dependant''s row another transaction holds (NULL: none waited yet).';
COMMENT ON COLUMN pgq.cascade_budgets.recovering IS
    'True while it recovers expired leases: its ends then move no dependant on and wait for no batch.';
REVOKE ALL ON pgq.cascade_budgets FROM PUBLIC;

CREATE TABLE pgq.overlap_checks (
    id      bigint GENERATED ALWAYS AS IDENTITY,
    job_id  bigint NOT NULL,
    login   text   NOT NULL,
    CONSTRAINT overlap_checks_pkey PRIMARY KEY (id)
);
COMMENT ON TABLE pgq.overlap_checks IS
    'Dependencies whose end may not have seen the links an enqueue in flight wrote to them (or that '
    'ended under an older snapshot): pgq.settle_dependencies and the sweep settle them, fairly among logins.';
COMMENT ON COLUMN pgq.overlap_checks.job_id IS 'The job named in depends_on (or the job that ended).';
COMMENT ON COLUMN pgq.overlap_checks.login IS 'The login whose enqueue (or end) left the check ('''': before 0021).';
REVOKE ALL ON pgq.overlap_checks FROM PUBLIC;
CREATE INDEX overlap_checks_login_idx ON pgq.overlap_checks (login, id);
COMMENT ON INDEX pgq.overlap_checks_login_idx IS 'Each login''s checks, oldest first (its share of a settle).';

CREATE TABLE pgq.cascade_backlog (
    id          bigint        GENERATED ALWAYS AS IDENTITY,
    job_id      bigint        NOT NULL,
    ended       pgq.job_state NOT NULL,
    from_id     bigint        NOT NULL,
    below_id    bigint        NOT NULL,
    root_id     bigint        NOT NULL,
    root_state  pgq.job_state NOT NULL,
    login       text          NOT NULL,
    CONSTRAINT cascade_backlog_pkey PRIMARY KEY (id),
    CONSTRAINT cascade_backlog_ended_check CHECK (ended IN ('done', 'failed', 'cancelled')
                                                  AND root_state IN ('done', 'failed', 'cancelled'))
);
COMMENT ON TABLE pgq.cascade_backlog IS
    'Ended jobs whose waiting dependants are still to move on (released, or cancelled down the chain): '
    'pgq.settle_dependencies and the sweep move them in bounded steps, fairly among logins, each '
    'login''s oldest row first.';
COMMENT ON COLUMN pgq.cascade_backlog.job_id IS 'The job that ended.';
COMMENT ON COLUMN pgq.cascade_backlog.ended IS 'How it ended: done releases its dependants, failed or cancelled cancels them.';
COMMENT ON COLUMN pgq.cascade_backlog.from_id IS
    'The dependants this row moves on have ids from this one (those below are an earlier end''s, before '
    'a pgq.retry of the job)...';
COMMENT ON COLUMN pgq.cascade_backlog.below_id IS
    '... and below this one: they were enqueued before it ended (one enqueued after a pgq.retry of it '
    'waits for its next end instead).';
COMMENT ON COLUMN pgq.cascade_backlog.root_id IS
    'The job whose end cancelled it (itself, when it ended on its own): named in its dependants'' last_error.';
COMMENT ON COLUMN pgq.cascade_backlog.root_state IS 'How the root job ended.';
COMMENT ON COLUMN pgq.cascade_backlog.login IS
    'The login whose work the row is: that enqueued its next dependant when it was written ('''': before 0021).';
REVOKE ALL ON pgq.cascade_backlog FROM PUBLIC;
CREATE INDEX cascade_backlog_job_idx ON pgq.cascade_backlog (job_id);
COMMENT ON INDEX pgq.cascade_backlog_job_idx IS
    'An end of a job that pgq.retry brought back leaves the dependants of its earlier end to that '
    'end''s rows: it finds them here.';
CREATE INDEX cascade_backlog_login_idx ON pgq.cascade_backlog (login, id);
COMMENT ON INDEX pgq.cascade_backlog_login_idx IS 'Each login''s rows, oldest first (its share of a settle).';

CREATE TABLE pgq.replace_slots (
    queue       text   NOT NULL,
    unique_key  text   NOT NULL,
    enqueued_by text   NOT NULL,
    job_id      bigint,
    CONSTRAINT replace_slots_pkey PRIMARY KEY (queue, unique_key, enqueued_by)
);
COMMENT ON TABLE pgq.replace_slots IS
    'For pgq.enqueue(..., on_conflict => ''replace''): per login and key, the job the login enqueued to '
    'run after the key''s holder that had started (job_id), which its later replace calls update until it '
    'starts; each replace call locks its login''s row of the key till commit. Deleted by pgq.prune once '
    'the job is no longer live.';
COMMENT ON COLUMN pgq.replace_slots.enqueued_by IS 'The login whose replace calls the row serves (and whose job job_id is).';
REVOKE ALL ON pgq.replace_slots FROM PUBLIC;

-- The rows no transaction holds move over, in order.
WITH gone AS (
    DELETE FROM pgq.dependency_checks AS c
    WHERE c.id IN (SELECT x.id FROM pgq.dependency_checks AS x FOR UPDATE SKIP LOCKED)
    RETURNING c.id, c.job_id
)
INSERT INTO pgq.overlap_checks (job_id, login) SELECT g.job_id, '' FROM gone AS g ORDER BY g.id;
WITH gone AS (
    DELETE FROM pgq.dependency_backlog AS b
    WHERE b.id IN (SELECT x.id FROM pgq.dependency_backlog AS x FOR UPDATE SKIP LOCKED)
    RETURNING b.*
)
INSERT INTO pgq.cascade_backlog (job_id, ended, from_id, below_id, root_id, root_state, login)
SELECT g.job_id, g.ended, g.from_id, g.below_id, g.root_id, g.root_state, '' FROM gone AS g ORDER BY g.id;
WITH gone AS (
    DELETE FROM pgq.unique_successors AS s
    WHERE (s.queue, s.unique_key) IN (SELECT x.queue, x.unique_key FROM pgq.unique_successors AS x
                                      FOR UPDATE SKIP LOCKED)
    RETURNING s.queue, s.unique_key, s.job_id
)
INSERT INTO pgq.replace_slots (queue, unique_key, enqueued_by, job_id)
SELECT g.queue, g.unique_key, j.enqueued_by, g.job_id
FROM gone AS g JOIN pgq.jobs AS j ON j.id = g.job_id
WHERE j.enqueued_by IS NOT NULL
ON CONFLICT ON CONSTRAINT replace_slots_pkey DO NOTHING;

COMMENT ON TABLE pgq.dependency_checks IS
    'Until 0021 (now pgq.overlap_checks): no longer written; the sweep moves what is left here. A later migration drops it.';
COMMENT ON TABLE pgq.dependency_backlog IS
    'Until 0021 (now pgq.cascade_backlog): no longer written; the sweep moves what is left here. A later migration drops it.';
COMMENT ON TABLE pgq.unique_successors IS
    'Until 0021 (now pgq.replace_slots): no longer written; the sweep moves what is left here. A later migration drops it.';
