"""pgq.health sees the xmin holders outside this database's sessions (issue 40): a real logical
replication slot (its catalog_xmin), a real prepared transaction, each with its age and a hint, and
what a monitor may see of them. A server of its own: wal_level=logical and
max_prepared_transactions, which the session's server does not set (and a slot or a prepared
transaction there would show in every other test's health)."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from pgq_thin.migrate import migrate
from pgq_thin.testing.server import SERVER_SETTINGS, ThrowawayPostgres

from healthkit import findings


@pytest.fixture(scope="module")
def server() -> Iterator[ThrowawayPostgres]:
    pg = ThrowawayPostgres(postgres_args=SERVER_SETTINGS + " -c wal_level=logical -c max_prepared_transactions=4")
    try:
        with psycopg.connect(pg.dsn_for("postgres"), autocommit=True) as conn:
            conn.execute("CREATE DATABASE holders")
        migrate(pg.dsn_for("holders"))
        yield pg
    finally:
        pg.stop()


@pytest.fixture
def conn(server: ThrowawayPostgres) -> Iterator[psycopg.Connection]:
    with psycopg.connect(server.dsn_for("holders"), autocommit=True) as c:
        yield c


def test_nothing_held_is_three_ok_rows(conn: psycopg.Connection) -> None:
    found = findings(conn)
    for check in ("replication_slot", "standby_feedback", "prepared_transaction"):
        assert [sev for sev, _ in found[check]] == ["ok"], found[check]


def test_an_inactive_logical_slot_is_reported_with_its_catalog_xmin_age(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pg_create_logical_replication_slot('forgotten', 'test_decoding')")
    try:
        conn.execute("SELECT pgq.enqueue('q', 'k')")  # transactions pass: the slot's age grows
        [(severity, detail)] = findings(conn)["replication_slot"]
        assert severity == "warning"
        assert "logical replication slot forgotten of database holders (inactive)" in detail
        assert "catalog_xmin age" in detail and "transactions" in detail
        [hint] = [h for _s, c, _d, h in conn.execute("SELECT * FROM pgq.health()") if c == "replication_slot"]
        assert "pg_drop_replication_slot('forgotten')" in hint
        # A monitor sees it too (pgq.health runs as the owner).
        conn.execute("CREATE ROLE watcher LOGIN IN ROLE pgq_monitor")
        try:
            with psycopg.connect(conn.info.dsn, user="watcher", autocommit=True) as monitor:
                assert findings(monitor)["replication_slot"][0][0] == "warning"
        finally:
            conn.execute("DROP ROLE watcher")
    finally:
        conn.execute("SELECT pg_drop_replication_slot('forgotten')")
    assert findings(conn)["replication_slot"][0][0] == "ok"


def test_a_prepared_transaction_is_reported_with_its_age_and_how_to_settle_it(
        server: ThrowawayPostgres, conn: psycopg.Connection) -> None:
    with psycopg.connect(server.dsn_for("holders")) as tm:
        tm.execute("SELECT pgq.configure_queue('tm', notify => false)")  # (a NOTIFY cannot be prepared)
        tm.execute("PREPARE TRANSACTION 'tm-42'")
    try:
        [(severity, detail)] = findings(conn)["prepared_transaction"]
        assert severity == "ok" and "prepared transaction 'tm-42' (owner postgres) has held its snapshot" in detail
        assert "xmin age" in detail
        # Past max_snapshot_age (its age is measured, not waited for: a threshold below it).
        [(severity, _)] = findings(conn, snapshot="1 microsecond")["prepared_transaction"]
        assert severity == "critical"
        [hint] = [h for _s, c, _d, h in conn.execute("SELECT * FROM pgq.health('1 microsecond')")
                  if c == "prepared_transaction"]
        assert "COMMIT PREPARED 'tm-42'" in hint and "ROLLBACK PREPARED 'tm-42'" in hint
    finally:
        conn.execute("ROLLBACK PREPARED 'tm-42'")
    assert findings(conn)["prepared_transaction"][0][0] == "ok"
