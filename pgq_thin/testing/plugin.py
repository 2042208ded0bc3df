"""pgq's pytest plugin (entry point ``pytest11``: on whenever pgq-thin is installed; it starts
nothing until a test asks for one of its fixtures).

- ``pgq_dsn``: the URL of a database with pgq's migrations applied, new for each test: a copy of a
  template migrated once per session, on a throwaway PostgreSQL server started on first use (as
  root too: the server runs as an unprivileged account) and stopped at the end of the session.
  With ``$PGQ_TEST_DSN`` set, the copies are made on that server instead (its role needs CREATEDB),
  and no server is started.
- ``pgq_client``: a ``pgq_thin.Client`` on ``pgq_dsn``.

The fixtures need the ``testing`` extra (``pip install 'pgq-thin[testing]'``: testing.postgresql,
which starts the throwaway server). The plugin imports it only when a test asks for a fixture, so
that pytest runs as before in a project without it, and such a test fails saying what to install.

``pgq_thin.testing.drain(worker)`` then runs the due jobs on the test's database.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from pgq_thin import testing
from pgq_thin.client import Client

if TYPE_CHECKING:
    from pgq_thin.testing.server import Databases

__all__ = ["INSTALL", "pgq_client", "pgq_dsn", "pgq_databases"]

#: What a test that uses a fixture is told when the testing extra is missing.
INSTALL = ("pgq's fixtures (pgq_dsn, pgq_client) need the testing extra, for testing.postgresql: "
           "pip install 'pgq-thin[testing]'")


@pytest.fixture(scope="session")
def pgq_databases() -> Iterator[Databases]:
    """Where the test databases are made: a throwaway server, or the one $PGQ_TEST_DSN names."""
    try:
        from pgq_thin.testing.server import Databases
    except ImportError as exc:
        if not (exc.name or "").startswith(("testing", "pg8000")):
            raise
        pytest.fail(f"{INSTALL} (missing: {exc.name})", pytrace=False)
    databases = Databases(os.environ.get("PGQ_TEST_DSN") or None, prefix="pgq_test")
    try:
        yield databases
    finally:
        databases.close()


@pytest.fixture
def pgq_dsn(pgq_databases: Databases) -> Iterator[str]:
    """A fresh database with pgq installed, for this test only (dropped afterwards)."""
    name = pgq_databases.new_name()
    dsn = pgq_databases.migrated(name)
    previous, testing._current_dsn = testing._current_dsn, dsn
    try:
        yield dsn
    finally:
        testing._current_dsn = previous
        pgq_databases.drop(name)


@pytest.fixture
def pgq_client(pgq_dsn: str) -> Iterator[Client]:
    """A pgq_thin.Client on the test's database."""
    with Client(pgq_dsn) as client:
        yield client
