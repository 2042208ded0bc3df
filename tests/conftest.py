"""Shared fixtures: one throwaway PostgreSQL per test session, a template database migrated
once, and a fresh database per test made with CREATE DATABASE ... TEMPLATE (milliseconds)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from pgq_thin import migrate
from pgq_thin.testing import server as embedded
from sqlhelpers import fresh_database

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = "pgq_template"


@pytest.fixture(scope="session")
def pg_server() -> Iterator[embedded.ThrowawayPostgres]:
    server = embedded.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def admin_dsn(pg_server: embedded.ThrowawayPostgres) -> str:
    """The superuser's maintenance database, for CREATE/DROP DATABASE."""
    return pg_server.dsn_for("postgres")


@pytest.fixture(scope="session")
def template_db(pg_server: embedded.ThrowawayPostgres, admin_dsn: str) -> str:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {TEMPLATE}")
    migrate(pg_server.dsn_for(TEMPLATE))
    return TEMPLATE


@pytest.fixture
def dsn(pg_server: embedded.ThrowawayPostgres, admin_dsn: str, template_db: str) -> Iterator[str]:
    """A fresh database with pgq installed, as a libpq URL for the superuser."""
    yield from fresh_database(pg_server, admin_dsn, template_db)


@pytest.fixture
def empty_dsn(pg_server: embedded.ThrowawayPostgres, admin_dsn: str) -> Iterator[str]:
    """A fresh database without pgq."""
    yield from fresh_database(pg_server, admin_dsn, "template1")


@pytest.fixture
def conn(dsn: str) -> Iterator[psycopg.Connection]:
    """An autocommit superuser connection to a fresh pgq database."""
    with psycopg.connect(dsn, autocommit=True) as c:
        yield c


@pytest.fixture
def connect(dsn: str) -> Iterator:
    """Opens more connections to the test's database (closed at teardown)."""
    opened: list[psycopg.Connection] = []

    def _connect(autocommit: bool = True, role: str | None = None) -> psycopg.Connection:
        c = psycopg.connect(dsn, autocommit=autocommit)
        if role:
            c.execute(f"SET ROLE {role}")
            if not autocommit:
                c.commit()
        opened.append(c)
        return c

    yield _connect
    for c in opened:
        c.close()
