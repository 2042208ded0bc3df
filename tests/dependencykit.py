"""Helpers of the dependency tests: enqueue with dependencies, read links, states and the backlog."""

from __future__ import annotations

from typing import Any

import psycopg

from sqlhelpers import claim, one


def enqueue(conn: psycopg.Connection, depends_on: list[int] | None = None, queue: str = "q",
            **kwargs: Any) -> int:
    extra = "".join(f", {name} => %({name})s" for name in kwargs)
    return int(one(conn, f"SELECT pgq.enqueue(%(queue)s, 'k', depends_on => %(deps)s::bigint[]{extra})",
                   {"queue": queue, "deps": depends_on, **kwargs}))


def run(conn: psycopg.Connection, job_id: int) -> int:
    """Claims exactly this job (it must be the only claimable one of its queue) and returns its attempt."""
    queue = one(conn, "SELECT queue FROM pgq.jobs WHERE id = %s", (job_id,))
    [claimed] = claim(conn, queues=[queue])
    assert claimed["id"] == job_id
    return int(claimed["attempt"])


def state(conn: psycopg.Connection, job_id: int) -> str:
    return str(one(conn, "SELECT state::text FROM pgq.jobs WHERE id = %s", (job_id,)))


def links(conn: psycopg.Connection) -> int:
    return int(one(conn, "SELECT count(*) FROM pgq.job_dependencies"))


def written(conn: psycopg.Connection) -> tuple[Any, ...]:
    """Everything a refused enqueue must leave as it was."""
    row = conn.execute("SELECT (SELECT count(*) FROM pgq.jobs), (SELECT count(*) FROM pgq.job_dependencies), "
                       "(SELECT count(*) FILTER (WHERE has_dependants) FROM pgq.jobs), "
                       "(SELECT count(*) FROM pgq.job_events)").fetchone()
    assert row is not None
    return tuple(row)


def backlog(conn: psycopg.Connection) -> tuple[int, int]:
    """(checks, backlog rows) waiting for the sweep."""
    row = conn.execute("SELECT (SELECT count(*) FROM pgq.overlap_checks), "
                       "(SELECT count(*) FROM pgq.cascade_backlog)").fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def settle(conn: psycopg.Connection) -> None:
    """Sweeps until no check and no backlog row is left (each sweep moves some on)."""
    for _ in range(1000):
        if backlog(conn) == (0, 0):
            return
        conn.execute("SELECT pgq.sweep()")
    raise AssertionError(f"the sweeps did not empty the checks and the backlog: {backlog(conn)}")
