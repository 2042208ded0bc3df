"""Fixtures and helpers shared by the tests/sql/ modules (this module holds no tests).

``dsn`` here replaces conftest's per-test database in the modules that import it: each such
module gets one database made from the migrated template, and every test starts with it emptied
(other sessions ended, pgq's tables truncated, identities restarted). A test sees exactly what a
fresh database would show, for a few milliseconds instead of a CREATE/DROP DATABASE.
Modules that change more than pgq's rows (new roles' objects, ANALYZE statistics) keep
conftest's fresh database per test.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from sqlhelpers import claim, fresh_database, one


@pytest.fixture(scope="module")
def module_dsn(databases, template_db: str) -> Iterator[str]:
    yield from fresh_database(databases, template_db)


@pytest.fixture
def dsn(module_dsn: str) -> Iterator[str]:
    """The module's pgq database, emptied for this test."""
    with psycopg.connect(module_dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                     "WHERE datname = current_database() AND pid <> pg_backend_pid()")
        conn.execute("SET lock_timeout = '10s'")
        conn.execute("TRUNCATE pgq.jobs, pgq.job_events, pgq.queues, pgq.grants, pgq.key_limits, pgq.key_rates, "
                     "pgq.rate_buckets, pgq.rate_slices, pgq.key_locks, pgq.job_dependants, pgq.batches, "
                     "pgq.batch_counts, pgq.batch_members, pgq.unique_successors, pgq.replace_slots, pgq.schedules, "
                     "pgq.steps, pgq.signals, pgq.signal_checks, pgq.signal_grants, pgq.finished_counts, "
                     "pgq.finished_deltas RESTART IDENTITY")
        conn.execute("SELECT setval('pgq.lease_floor', 0), setval('pgq.lease_floor_checked', 0)")
    yield module_dsn


def running_job(conn: psycopg.Connection, queue: str = "q", **kwargs: Any) -> tuple[int, int]:
    """Enqueues one job (keyword arguments go to pgq.enqueue) and claims it: (id, attempt)."""
    args = "".join(f", {k} => %({k})s" for k in kwargs)
    job_id = one(conn, f"SELECT pgq.enqueue(%(queue)s, 'k'{args})", {"queue": queue, **kwargs})
    (c,) = claim(conn, queues=[queue])
    assert c["id"] == job_id
    return job_id, c["attempt"]


def make_due(conn: psycopg.Connection, job_id: int) -> None:
    conn.execute("UPDATE pgq.jobs SET run_at = now() - interval '1 second' WHERE id = %s", (job_id,))


def sqlstate_of(conn: psycopg.Connection, sql: str, params: Any = None) -> str | None:
    """The SQLSTATE the statement fails with, or None when it succeeds."""
    try:
        conn.execute(sql, params)
    except psycopg.Error as e:
        return e.sqlstate
    return None


def row_counts(conn: psycopg.Connection) -> tuple[int, int, int]:
    """(jobs, queues, job_events): to show a rejected call wrote nothing."""
    row = conn.execute("SELECT (SELECT count(*) FROM pgq.jobs), (SELECT count(*) FROM pgq.queues), "
                       "(SELECT count(*) FROM pgq.job_events)").fetchone()
    assert row is not None
    return row


def wait_until_blocked(observer: psycopg.Connection, pid: int, timeout: float = 10.0) -> list[int]:
    """Waits until backend `pid` waits on a lock; returns the pids blocking it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        blockers = one(observer, "SELECT pg_blocking_pids(%s)", (pid,))
        if blockers:
            return blockers
        time.sleep(0.01)
    raise AssertionError(f"backend {pid} never blocked")
