"""pgq's SQL source: every function is written once, in sql/functions/; the migrations after the
landed ones hold only what is versioned; the generated one-file installs (sql/schema.sql,
sql/all_functions.sql) are current; and an apply leaves exactly the functions the source defines,
whatever was there before."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import threading
from pathlib import Path

import psycopg
import pytest

from pgq_thin import migrate
from pgq_thin.sqlsource import SOURCE_FILES, function_source, source_dir

from catalogkit import MIGRATION_SHA256, assert_same_catalog, catalog
from sqlhelpers import one, wait_for

ROOT = Path(__file__).resolve().parents[2]
GENERATED = {ROOT / "sql" / "schema.sql", ROOT / "sql" / "all_functions.sql"}
#: The source in this tree (pgq_thin.sqlsource.source_dir() is the installed package's copy of it).
SOURCE = ROOT / "sql" / "functions"
#: The migrations that landed before the function source existed: databases have them applied,
#: their bytes are pinned, and they hold the function bodies of their day.
LANDED = {ROOT / "migrations" / name for name in MIGRATION_SHA256 if int(name[:4]) <= 13}
DEFINITION = re.compile(r"\bCREATE\s+(?:OR\s+REPLACE\s+)?(?:FUNCTION|PROCEDURE)\s+pgq\.(\w+)\s*\(", re.IGNORECASE)


def _build_sql():
    spec = importlib.util.spec_from_file_location("build_sql", ROOT / "scripts" / "build_sql.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def source_functions() -> dict[str, str]:
    """Each function of the source: its name -> the file that defines it."""
    defined: dict[str, str] = {}
    for name in SOURCE_FILES:
        for function in DEFINITION.findall((source_dir() / name).read_text()):
            assert function not in defined, f"pgq.{function} is defined in {defined[function]} and in {name}"
            defined[function] = name
    return defined


def test_the_function_source_is_the_files_of_sql_functions_in_the_order_applied():
    assert sorted(SOURCE_FILES) == sorted(p.name for p in SOURCE.glob("*.sql"))
    assert all((source_dir() / name).read_text() == (SOURCE / name).read_text() for name in SOURCE_FILES), \
        "the installed function source is not this tree's: reinstall (pip install .)"
    assert len(set(SOURCE_FILES)) == len(SOURCE_FILES)
    assert SOURCE_FILES[-2:] == ("cleanup.sql", "grants.sql")
    assert source_functions()["claim"] == "claim.sql"


def test_each_function_is_written_once_in_the_tree_outside_the_landed_migrations():
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    source = source_functions()
    assert {"claim", "enqueue", "complete", "_job_ended", "version"} <= set(source)
    elsewhere = []
    for relative in files:
        path = ROOT / relative
        if path in LANDED or path in GENERATED or path.parent == SOURCE or not path.is_file():
            continue
        if path.suffix not in {".sql", ".py", ".md", ".in", ".sh", ".mjs", ".txt", ".toml"}:
            continue
        # (A test may replace a function in its own throwaway database: a clock, a body to see the
        # apply restore it, an overload to see it dropped. That is a fixture, not a definition. So is
        # the lab's clock: an experiment's pgq._now() in the database made for it and dropped after.)
        if relative.startswith("tests/"):
            continue
        text = path.read_text(errors="replace")
        elsewhere += [f"{relative}: pgq.{function}" for function in DEFINITION.findall(text)
                      if not (relative.startswith("tools/pgq_tools/lab/") and function == "_now")]
    assert elsewhere == []


def test_no_migration_after_the_landed_ones_holds_a_function_body():
    later = [p for p in (ROOT / "migrations").glob("[0-9]*.sql") if p not in LANDED]
    for path in later:
        text = path.read_text()
        assert not DEFINITION.search(text), f"{path.name} defines a function: it belongs in sql/functions/"
        assert not re.search(r"\bCREATE\s+(?:OR\s+REPLACE\s+)?VIEW\b", text, re.IGNORECASE), \
            f"{path.name} defines a view: it belongs in sql/functions/"
        assert re.search(r"SET\s+LOCAL\s+lock_timeout", text, re.IGNORECASE), \
            f"{path.name} sets no lock_timeout: a migration waits for its locks a bounded time"


def test_the_generated_one_file_installs_are_current(databases, template_db):
    """sql/schema.sql and sql/all_functions.sql are what scripts/build_sql.py makes of the migrations
    and the source (the session's template database was built by pgq_thin.migrate)."""
    build_sql = _build_sql()
    assert (ROOT / "sql" / "all_functions.sql").read_text() == build_sql.all_functions_sql(), \
        "sql/all_functions.sql is stale: run python scripts/build_sql.py"
    assert (ROOT / "sql" / "schema.sql").read_text() == build_sql.schema_sql(databases.dsn_for(template_db)), \
        "sql/schema.sql is stale: run python scripts/build_sql.py"
    assert function_source() in (ROOT / "sql" / "schema.sql").read_text()


def _function_names(conn: psycopg.Connection) -> list[str]:
    return [r[0] for r in conn.execute(
        "SELECT proname FROM pg_proc WHERE pronamespace = 'pgq'::regnamespace ORDER BY 1").fetchall()]


def test_a_migrated_database_holds_exactly_the_functions_the_source_defines(conn):
    assert _function_names(conn) == sorted(source_functions())  # one of each: no overloads


def test_no_pgq_function_reads_or_writes_a_setting_a_caller_can_set(conn):
    """Issue 37: a placeholder setting (pgq.*) is a channel any caller writes in its own session
    (SET pgq.batch_counting, pgq.batch_shard, pgq.key_walk, pgq.fence... once steered pgq's
    functions). No installed function reads or sets one, in its body or its SET clauses."""
    readers = conn.execute(
        "SELECT p.oid::regprocedure::text FROM pg_proc AS p"
        " WHERE p.pronamespace = 'pgq'::regnamespace"
        "   AND (p.prosrc ~* '(current_setting|set_config)\\s*\\(\\s*''pgq[._]'"
        "        OR EXISTS (SELECT FROM unnest(p.proconfig) AS c(setting) WHERE c.setting ~* '^pgq[._]'))"
        " ORDER BY 1").fetchall()
    assert readers == []
    # The check finds one when there is one.
    conn.execute("CREATE FUNCTION pgq._probe_setting() RETURNS text LANGUAGE sql"
                 " AS $$ SELECT current_setting( 'pgq.key_walk', true) $$")
    try:
        assert conn.execute(
            "SELECT count(*) FROM pg_proc AS p WHERE p.pronamespace = 'pgq'::regnamespace"
            " AND p.prosrc ~* '(current_setting|set_config)\\s*\\(\\s*''pgq[._]'").fetchone() == (1,)
    finally:
        conn.execute("DROP FUNCTION pgq._probe_setting()")


def test_an_apply_drops_a_function_the_source_no_longer_defines_and_an_old_overload(conn, dsn):
    conn.execute("CREATE FUNCTION pgq.gone() RETURNS int LANGUAGE sql AS 'SELECT 1'")
    conn.execute("CREATE FUNCTION pgq.stats(older integer) RETURNS int LANGUAGE sql AS 'SELECT 1'")
    before = catalog(dsn)
    assert migrate(dsn) == []
    assert _function_names(conn) == sorted(source_functions())
    after = catalog(dsn)
    stale = {("gone", ""), ("stats", "older integer")}
    assert {r for r in before["functions"] if (r[0], r[1]) not in stale} == set(after["functions"])
    assert {(r[0], r[1]) for r in before["functions"]} >= stale


def test_a_call_in_flight_across_an_apply_finishes_on_the_functions_it_began_with(conn, dsn):
    """An older worker's call that began before an upgrade committed runs its old body to the end,
    and a statement of it that runs after the commit looks its functions up again: the apply drops
    the functions the source no longer defines only once that statement has ended. Here the call
    is pgq._old_caller(), waiting on a table lock the test holds while the apply commits; released,
    it calls pgq._old_helper(), which the apply has dropped from the source."""
    conn.execute("CREATE TABLE gate (x int)")
    conn.execute("CREATE FUNCTION pgq._old_helper() RETURNS int LANGUAGE sql AS 'SELECT 7'")
    conn.execute("CREATE FUNCTION pgq._old_caller() RETURNS int LANGUAGE plpgsql AS $$ BEGIN "
                 "PERFORM count(*) FROM public.gate; RETURN pgq._old_helper(); END $$")
    before = one(conn, "SELECT xmin::text FROM pg_proc WHERE oid = 'pgq.version()'::regprocedure")
    outcome: dict[str, object] = {}

    def call() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True, application_name="in-flight") as c:
                outcome["value"] = one(c, "SELECT pgq._old_caller()")
        except psycopg.Error as e:
            outcome["error"] = e

    def apply() -> None:
        try:
            outcome["applied"] = migrate(dsn)
        except BaseException as e:  # noqa: BLE001  (asserted below)
            outcome["apply error"] = e

    with psycopg.connect(dsn) as locker:
        locker.execute("LOCK TABLE gate IN ACCESS EXCLUSIVE MODE")
        caller = threading.Thread(target=call)
        caller.start()
        wait_for(lambda: one(conn, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'in-flight' "
                                   "AND wait_event_type = 'Lock'") == 1, "the call to wait on the gate")
        applier = threading.Thread(target=apply)
        applier.start()
        wait_for(lambda: one(conn, "SELECT xmin::text FROM pg_proc WHERE oid = 'pgq.version()'::regprocedure")
                 != before, "the apply's new functions to commit")
        assert one(conn, "SELECT to_regprocedure('pgq._old_helper()') IS NOT NULL") is True
        locker.rollback()
    caller.join(30)
    applier.join(90)
    assert not caller.is_alive() and not applier.is_alive()
    assert outcome.get("error") is None and outcome.get("apply error") is None, outcome
    assert outcome["value"] == 7 and outcome["applied"] == []
    assert one(conn, "SELECT to_regprocedure('pgq._old_helper()') IS NULL AND "
                     "to_regprocedure('pgq._old_caller()') IS NULL") is True
    assert _function_names(conn) == sorted(source_functions())
    conn.execute("DROP TABLE gate")


def test_an_apply_replaces_a_changed_body_and_keeps_the_grants(conn, dsn):
    conn.execute("CREATE OR REPLACE FUNCTION pgq.version() RETURNS text LANGUAGE sql IMMUTABLE AS $$ SELECT 'x' $$")
    conn.execute("REVOKE EXECUTE ON FUNCTION pgq.claim(text, text[], integer, interval, text[]) FROM pgq_worker")
    conn.execute("GRANT EXECUTE ON FUNCTION pgq.cancel(bigint) TO pgq_producer")
    migrate(dsn)
    assert one(conn, "SELECT pgq.version()") != "x"
    assert one(conn, "SELECT has_function_privilege('pgq_worker', "
                     "'pgq.claim(text, text[], integer, interval, text[])', 'EXECUTE')") is True
    assert one(conn, "SELECT has_function_privilege('pgq_producer', 'pgq.cancel(bigint)', 'EXECUTE')") is False


@pytest.mark.skipif(shutil.which("psql") is None, reason="needs psql")
def test_the_functions_file_applied_outside_one_transaction_refuses_and_drops_nothing(conn, dsn):
    conn.execute("CREATE FUNCTION pgq.gone() RETURNS int LANGUAGE sql AS 'SELECT 1'")
    out = subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", str(ROOT / "sql" / "all_functions.sql"),
                          dsn], capture_output=True, text=True)
    assert out.returncode != 0
    assert "the function source must be applied in one transaction" in out.stderr
    assert one(conn, "SELECT to_regprocedure('pgq.gone()') IS NOT NULL") is True
    done = subprocess.run(["psql", "-X", "-q", "-1", "-v", "ON_ERROR_STOP=1", "-f",
                           str(ROOT / "sql" / "all_functions.sql"), dsn], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "dropping pgq.gone(), which the function source no longer defines" in done.stderr
    assert _function_names(conn) == sorted(source_functions())


def test_yoyo_apply_with_the_post_apply_hook_builds_what_pgq_thin_migrate_builds(empty_dsn, dsn):
    from yoyo import get_backend, read_migrations

    from pgq_thin.migrate import migrations_dir, yoyo_url

    backend = get_backend(yoyo_url(empty_dsn))
    try:
        with backend.lock():
            backend.apply_migrations(backend.to_apply(read_migrations(str(migrations_dir()))))
    finally:
        backend.connection.close()
    assert_same_catalog(catalog(dsn), catalog(empty_dsn))


def test_a_yoyo_apply_of_some_migrations_installs_no_newer_functions(empty_dsn):
    """yoyo may apply a chosen few migrations: the hook then leaves their functions as they wrote
    them (the newest source may not fit their tables) and only takes PUBLIC's EXECUTE."""
    from yoyo import get_backend, read_migrations

    from pgq_thin.migrate import migrations_dir, yoyo_url

    backend = get_backend(yoyo_url(empty_dsn))
    try:
        with backend.lock():
            wanted = read_migrations(str(migrations_dir())).filter(lambda m: m.id < "0005")
            backend.apply_migrations(backend.to_apply(wanted))
    finally:
        backend.connection.close()
    with psycopg.connect(empty_dsn, autocommit=True) as c:
        assert one(c, "SELECT pgq.version()") == "0.1.0"
        assert one(c, "SELECT count(*) FROM pg_proc AS p, aclexplode(p.proacl) AS a "
                      "WHERE p.pronamespace = 'pgq'::regnamespace AND a.grantee = 0") == 0
        assert one(c, "SELECT count(*) FROM pg_proc WHERE pronamespace = 'pgq'::regnamespace AND proacl IS NULL") == 0


def test_migrate_takes_its_lock_timeout_as_any_duration_pgq_takes(dsn, conn):
    """Issue 42: durations one way everywhere; PostgreSQL's own '1min' still works, a bare number
    (5 ms to PostgreSQL) is refused before anything is sent."""
    from datetime import timedelta

    for value in ("2m", timedelta(seconds=30), 30, "1min"):
        assert migrate(dsn, lock_timeout=value) == []
    for value in ("5", "5s; DROP SCHEMA pgq", "30d", -1):
        with pytest.raises(ValueError, match="lock_timeout must be a duration with its unit"):
            migrate("postgresql://nowhere.invalid/db", lock_timeout=value)


def test_migrate_refuses_a_database_that_a_newer_pgq_migrated(dsn, conn):
    from pgq_thin.migrate import NewerSchema

    conn.execute("INSERT INTO _yoyo_migration (migration_hash, migration_id, applied_at_utc) "
                 "VALUES ('f' || repeat('0', 63), '0999_from_the_future', now())")
    body = one(conn, "SELECT prosrc FROM pg_proc WHERE oid = 'pgq.version()'::regprocedure")
    with pytest.raises(NewerSchema, match="0999_from_the_future"):
        migrate(dsn)
    assert one(conn, "SELECT prosrc FROM pg_proc WHERE oid = 'pgq.version()'::regprocedure") == body
