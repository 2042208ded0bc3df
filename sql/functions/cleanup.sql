-- sql/functions/cleanup.sql: the apply's last step but the grants: what the source no longer
-- defines goes.

-- The step of every apply after the functions and before the grants: the functions of schema pgq
-- that this transaction did not define are not in the source any more (a function the source
-- dropped, or the old overload of one whose argument types changed), and go, so that after an
-- apply the schema holds exactly the functions the source defines. A function is this
-- transaction's when its catalog row is (its xmin: CREATE OR REPLACE always writes a new row
-- version; so do the grants, which is why they come after this). In the transaction of the
-- creates, an old overload and its replacement change places at once: no caller finds neither.
--
-- Applied outside one transaction (psql -f without -1, each statement committing on its own), or
-- inside a savepoint, nothing here could tell the source's functions from the others: it refuses,
-- dropping nothing.
-- A call that began before the apply commits goes on with the bodies it began with, and a statement
-- of those that runs after the commit looks its functions up again: one that calls a function
-- dropped here fails (42883; an older worker's claim in flight during an upgrade). So when the
-- applying session has made a temporary table pgq_stale_functions (pgq_thin.migrate does), the
-- stale functions are listed there instead, and that session drops them once the statements
-- running at the commit have ended. Only that session's own table is read: nobody else can
-- choose what an apply does.
-- (A function whose return type or parameter names change cannot be replaced in place: its DROP
-- is a versioned migration's, before the source is applied.) A stale function that something
-- depends on (a trigger, a constraint) is not dropped by force: the apply fails, naming it.
DO $cleanup$
DECLARE
    stale regprocedure;
    later boolean := to_regclass('pg_temp.pgq_stale_functions') IS NOT NULL;  -- dropped by the caller
BEGIN
    IF (SELECT p.xmin FROM pg_catalog.pg_proc AS p WHERE p.oid = 'pgq.version()'::regprocedure)
       IS DISTINCT FROM pg_catalog.pg_current_xact_id()::xid THEN
        RAISE EXCEPTION 'pgq: the function source must be applied in one transaction'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'psql -1 -f sql/all_functions.sql (or your migration tool''s transaction per file).';
    END IF;
    FOR stale IN
        SELECT p.oid::regprocedure FROM pg_catalog.pg_proc AS p
        WHERE p.pronamespace = 'pgq'::regnamespace AND p.xmin IS DISTINCT FROM pg_catalog.pg_current_xact_id()::xid
        ORDER BY p.oid::regprocedure::text
    LOOP
        IF later THEN
            EXECUTE 'INSERT INTO pg_temp.pgq_stale_functions VALUES ($1)' USING stale;
            CONTINUE;
        END IF;
        RAISE NOTICE 'pgq: dropping %, which the function source no longer defines', stale;
        EXECUTE format('DROP FUNCTION %s', stale);
    END LOOP;
END
$cleanup$;
