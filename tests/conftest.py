"""Shared fixtures: one throwaway PostgreSQL per test session, a template database migrated
once, and a fresh database per test made with CREATE DATABASE ... TEMPLATE (milliseconds)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from pgq_thin.testing.server import Databases, ThrowawayPostgres

from clientkit import KINDS
from durablekit import login_as  # noqa: F401  (a fixture: the durable tests' logins)
from loginkit import login  # noqa: F401  (a fixture: a connection as any of the tests' logins)
from sqlhelpers import fresh_database

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def databases() -> Iterator[Databases]:
    """The session's throwaway server and the databases made on it."""
    with Databases(prefix="t") as made:
        yield made


@pytest.fixture(scope="session")
def pg_server(databases: Databases) -> ThrowawayPostgres:
    assert databases.server is not None
    return databases.server


@pytest.fixture(scope="session")
def admin_dsn(databases: Databases) -> str:
    """The superuser's maintenance database, for CREATE/DROP DATABASE."""
    return databases.admin_dsn


@pytest.fixture(scope="session")
def template_db(databases: Databases) -> str:
    """The database migrated once, that every test's database copies."""
    return databases.migrated_template()


@pytest.fixture
def dsn(databases: Databases) -> Iterator[str]:
    """A fresh database with pgq installed, as a libpq URL for the superuser."""
    yield from fresh_database(databases, databases.migrated_template())


@pytest.fixture
def empty_dsn(databases: Databases) -> Iterator[str]:
    """A fresh database without pgq."""
    yield from fresh_database(databases, "template1")


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


@pytest.fixture(params=KINDS)
def client_kind(request: pytest.FixtureRequest) -> str:
    """The test runs over each client, "Client" and "AsyncClient" (clientkit.clients opens one)."""
    return str(request.param)


#: The worker runtimes every behaviour of a worker runs on (the runtime fixture).
RUNTIMES = ("threads", "asyncio")


@pytest.fixture(params=RUNTIMES)
def runtime(request: pytest.FixtureRequest) -> str:
    """The test runs on each worker runtime: "threads" (Worker) and "asyncio" (AsyncWorker)."""
    return str(request.param)
