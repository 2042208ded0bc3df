-- 0015: dependencies that lock nobody's job, and their cascades in bounded steps (issue 24). The
-- functions are the function source's (sql/functions/dependencies.sql says how it all works);
-- this versions the two tables they keep their pending work in, and what jobs.has_dependants
-- means now. The function source of this release defines pgq.version() as '15'.
--
-- * pgq.dependency_checks: an enqueue with depends_on no longer locks (and flags) the jobs it
--   names, so an end of one of them in flight at the same time cannot see the new links and the
--   enqueue cannot see the end: each such enqueue leaves one row per dependency not done yet, and
--   the sweep settles it (the dependants move on then, or the dependency's end is sure to see
--   them). An end at REPEATABLE READ or SERIALIZABLE whose snapshot is older than its statement
--   leaves one too.
-- * pgq.dependency_backlog: the dependants of an ended job that one call does not move on (more
--   than its share of pgq._dependency_step(), an end inside a claim's or a sweep's recovery of
--   expired leases), moved on by the sweep in bounded steps, oldest first.
-- New tables, and a comment on a column (SHARE UPDATE EXCLUSIVE on pgq.jobs, which conflicts
-- with neither the workers' writes nor anyone's reads): no lock that waits for the workers.
SET LOCAL lock_timeout = '5s';

CREATE TABLE pgq.dependency_checks (
    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id  bigint NOT NULL
);
COMMENT ON TABLE pgq.dependency_checks IS
    'Dependencies whose end may not have seen the links an enqueue in flight wrote to them (or that '
    'ended under an older snapshot): the sweep settles each, oldest first.';
COMMENT ON COLUMN pgq.dependency_checks.job_id IS 'The job named in depends_on (or the job that ended).';
REVOKE ALL ON pgq.dependency_checks FROM PUBLIC;

CREATE TABLE pgq.dependency_backlog (
    id          bigint        GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id      bigint        NOT NULL,
    ended       pgq.job_state NOT NULL,
    from_id     bigint        NOT NULL,
    below_id    bigint        NOT NULL,
    root_id     bigint        NOT NULL,
    root_state  pgq.job_state NOT NULL,
    CONSTRAINT dependency_backlog_ended_check CHECK (ended IN ('done', 'failed', 'cancelled')
                                                     AND root_state IN ('done', 'failed', 'cancelled'))
);
COMMENT ON TABLE pgq.dependency_backlog IS
    'Ended jobs whose waiting dependants are still to move on (released, or cancelled down the chain): '
    'the sweep moves them in bounded steps, oldest row first.';
COMMENT ON COLUMN pgq.dependency_backlog.job_id IS 'The job that ended.';
COMMENT ON COLUMN pgq.dependency_backlog.ended IS 'How it ended: done releases its dependants, failed or cancelled cancels them.';
COMMENT ON COLUMN pgq.dependency_backlog.from_id IS
    'The dependants this row moves on have ids from this one (those below are an earlier end''s, before '
    'a pgq.retry of the job)...';
COMMENT ON COLUMN pgq.dependency_backlog.below_id IS
    '... and below this one: they were enqueued before it ended (one enqueued after a pgq.retry of it '
    'waits for its next end instead).';
COMMENT ON COLUMN pgq.dependency_backlog.root_id IS
    'The job whose end cancelled it (itself, when it ended on its own): named in its dependants'' last_error.';
COMMENT ON COLUMN pgq.dependency_backlog.root_state IS 'How the root job ended.';
REVOKE ALL ON pgq.dependency_backlog FROM PUBLIC;
CREATE INDEX dependency_backlog_job_idx ON pgq.dependency_backlog (job_id);
COMMENT ON INDEX pgq.dependency_backlog_job_idx IS
    'An end of a job that pgq.retry brought back leaves the dependants of its earlier end to that '
    'end''s rows: it finds them here.';

COMMENT ON COLUMN pgq.jobs.has_dependants IS
    'Set by enqueues of releases before 15 (which locked this row to do so); no longer written: '
    'pgq.get_job reports whether jobs wait for this one.';
