-- pgq migration 0012: flow control, part 2: the job state 'waiting' (issue 11, dependencies).
--
-- A job enqueued with depends_on waits in this state until its dependencies are done (migration
-- 0013 does the rest). A value added to an enum cannot be used by the transaction that adds it,
-- and yoyo runs each migration in one transaction: so the value comes alone, here, and everything
-- that names it (function bodies, the unique_key index's predicate) comes in 0013.
--
-- 'waiting' sorts before 'pending' (the life cycle's order: enum_range, and so pgq.list_jobs's
-- state list and its error message, name it first). Nothing compares states by their order.
-- sql/schema.sql holds the same definitions (tests/test_schema_matches_migrations.py).

ALTER TYPE pgq.job_state ADD VALUE IF NOT EXISTS 'waiting' BEFORE 'pending';
COMMENT ON TYPE pgq.job_state IS
    'The life cycle of a job. done, failed and cancelled are terminal; waiting: enqueued with '
    'depends_on, until its dependencies are done.';

CREATE OR REPLACE FUNCTION pgq.version() RETURNS text
    LANGUAGE sql IMMUTABLE
    AS $$ SELECT '12'::text $$;
