-- pgq migration 0005: pgq.version() tells the schema version: the number of the newest migration
-- applied ('5'), no longer the Python package's version (which changes without the schema).
--
-- Every later migration redefines pgq.version() to return its own number (and sql/schema.sql the
-- same): tests/test_schema_matches_migrations.py checks it against the newest migration file, and
-- pgq_thin's client warns when a database's schema is older than the migrations it ships.
-- 0003 and 0004 may be absent in a checkout that has this one: yoyo applies what it finds, in order.

CREATE OR REPLACE FUNCTION pgq.version() RETURNS text
    LANGUAGE sql IMMUTABLE
    AS $$ SELECT '5'::text $$;
COMMENT ON FUNCTION pgq.version() IS
    'The version of the installed pgq schema: the number of the newest migration applied.';

GRANT EXECUTE ON FUNCTION pgq.version() TO pgq_producer, pgq_worker, pgq_monitor;
