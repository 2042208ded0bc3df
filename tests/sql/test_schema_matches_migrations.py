"""sql/schema.sql (what a reader opens) and migrations/ (how users get there) build the same catalog.

One database is built with ``psql -f sql/schema.sql``, another with ``pgq_thin.migrate``; the
pgq schema's catalog (functions, columns, indexes, constraints, storage parameters, types, ACLs,
comments) must be identical. Role names that differ only because a different role owns the
objects are normalized to ``<owner>``.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from pgq_thin import migrate

from catalogkit import MIGRATION_SHA256, MIGRATIONS, ROOT, assert_same_catalog, catalog

SCHEMA_SQL = ROOT / "sql" / "schema.sql"


def apply_schema_sql(dsn: str) -> None:
    psql = shutil.which("psql")
    if psql is not None:
        subprocess.run([psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-1", "-f", str(SCHEMA_SQL), dsn],
                       check=True, capture_output=True)
    else:  # the same file through the simple query protocol, in one transaction
        with psycopg.connect(dsn) as conn:
            conn.execute(SCHEMA_SQL.read_text())


@pytest.fixture
def schema_sql_catalog(empty_dsn: str) -> dict[str, list[tuple]]:
    apply_schema_sql(empty_dsn)
    return catalog(empty_dsn)


@pytest.fixture
def owner_dsn(pg_server, admin_dsn: str) -> Iterator[str]:
    """A database owned by pgq_owner, a LOGIN role with CREATEROLE but not a superuser."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        if conn.execute("SELECT FROM pg_roles WHERE rolname = 'pgq_owner'").fetchone() is None:
            conn.execute("CREATE ROLE pgq_owner LOGIN CREATEROLE NOSUPERUSER")
        conn.execute("CREATE DATABASE pgq_owned OWNER pgq_owner")
    try:
        yield make_conninfo(pg_server.dsn_for("pgq_owned"), user="pgq_owner")
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute("DROP DATABASE IF EXISTS pgq_owned WITH (FORCE)")


ALL_MIGRATIONS = [name.removesuffix(".sql") for name in sorted(MIGRATION_SHA256)]


def test_migrations_are_never_edited_once_written():
    files = {f.name: f for f in MIGRATIONS.glob("[0-9]*.sql")}
    assert sorted(files) == sorted(MIGRATION_SHA256), "a migration was added or removed: update MIGRATION_SHA256"
    for name, sha256 in MIGRATION_SHA256.items():
        assert hashlib.sha256(files[name].read_bytes()).hexdigest() == sha256, f"{name} was edited"


def test_schema_sql_and_migrations_build_the_same_catalog(schema_sql_catalog, dsn):
    assert_same_catalog(schema_sql_catalog, catalog(dsn))
    # The comparison saw the whole API, not an empty schema.
    names = {row[0] for row in schema_sql_catalog["functions"]}
    assert {"enqueue", "claim", "complete", "sweep", "stats"} <= names
    assert {row[0] for row in schema_sql_catalog["indexes"]} >= {"jobs_ready_idx", "jobs_lease_idx"}


def test_pgq_version_is_the_number_of_the_newest_migration_file(schema_sql_catalog, empty_dsn, dsn):
    """Every migration redefines pgq.version() to return its own number, and sql/schema.sql says the
    same: a new migration that forgets it fails here (and the client would not know the schema)."""
    newest = max(int(f.name.split("_", 1)[0]) for f in MIGRATIONS.glob("[0-9]*.sql"))
    for database in (empty_dsn, dsn):  # empty_dsn: built from sql/schema.sql by the fixture
        with psycopg.connect(database, autocommit=True) as conn:
            assert conn.execute("SELECT pgq.version()").fetchone() == (str(newest),), database


def test_migrations_applied_twice_are_a_no_op(dsn):
    before = catalog(dsn)
    assert migrate(dsn) == []
    assert catalog(dsn) == before


def test_migrations_work_in_a_second_database_where_the_roles_already_exist(empty_dsn, dsn):
    # The session's template database already created the cluster-wide pgq_* roles.
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        roles = conn.execute("SELECT count(*) FROM pg_roles WHERE rolname LIKE 'pgq\\_%'").fetchone()
        assert roles is not None and roles[0] >= 4
    assert migrate(empty_dsn) == ALL_MIGRATIONS
    assert_same_catalog(catalog(dsn), catalog(empty_dsn))


def test_migrations_applied_by_a_non_superuser_owner_match_schema_sql(schema_sql_catalog, owner_dsn):
    with psycopg.connect(owner_dsn, autocommit=True) as conn:
        row = conn.execute("SELECT current_user, rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
        assert row == ("pgq_owner", False)
    assert migrate(owner_dsn) == ALL_MIGRATIONS
    with psycopg.connect(owner_dsn, autocommit=True) as conn:
        owner = conn.execute("SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = 'pgq'").fetchone()
        assert owner == ("pgq_owner",)
    assert_same_catalog(schema_sql_catalog, catalog(owner_dsn))
