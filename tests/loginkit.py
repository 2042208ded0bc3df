"""Logins of every pgq role (cluster-wide roles, made once per server) and the login fixture."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

ALICE, MALLORY, BOSS, WATCH, PROD, PROD2 = ("pgq_t_alice", "pgq_t_mallory", "pgq_t_boss", "pgq_t_watch",
                                            "pgq_t_prod", "pgq_t_prod2")


STATS_WATCH = "pgq_t_statswatch"


WRITERS, READERS, CLAIMERS = "pgq_t_writers", "pgq_t_readers", "pgq_t_claimers"  # NOLOGIN groups


LOGINS = {ALICE: ["pgq_worker"], MALLORY: ["pgq_worker"], BOSS: ["pgq_admin"], WATCH: ["pgq_monitor"],
          PROD: ["pgq_producer"], PROD2: ["pgq_producer", WRITERS], STATS_WATCH: ["pgq_monitor", "pg_read_all_stats"]}


Login = Callable[..., psycopg.Connection]


def _ensure_role(su: psycopg.Connection, name: str, login: bool, member_of: list[str]) -> None:
    if su.execute("SELECT FROM pg_roles WHERE rolname = %s", (name,)).fetchone() is None:
        try:
            su.execute(f"CREATE ROLE {name} {'LOGIN' if login else 'NOLOGIN'}")
        except (psycopg.errors.DuplicateObject, psycopg.errors.UniqueViolation):
            pass  # another database of the session's server made it meanwhile
    for role in member_of:
        su.execute(f"GRANT {role} TO {name}")


@pytest.fixture
def login(conn: psycopg.Connection, dsn: str) -> Iterator[Login]:
    """login(name) opens an autocommit connection as that LOGIN role (roles are cluster-wide:
    created once per server)."""
    for group in (WRITERS, READERS, CLAIMERS):
        _ensure_role(conn, group, False, [])
    for name, member_of in LOGINS.items():
        _ensure_role(conn, name, True, member_of)
    opened: list[psycopg.Connection] = []

    def _login(name: str, autocommit: bool = True) -> psycopg.Connection:
        c = psycopg.connect(make_conninfo(dsn, user=name), autocommit=autocommit)
        opened.append(c)
        return c

    yield _login
    for c in opened:
        c.close()
