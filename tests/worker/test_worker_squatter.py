"""TESTING items 38 and 40 with real Workers of both runtimes (pgq_thin.worker as it is): a login
with CONNECT only (no pgq role) holds every advisory key pgq took before issue 37 for these jobs,
this queue and this worker's login. A worker loses one of its two jobs to another claimer; its
renewal of the lost one is rejected, which took the rejection lock the squatter holds: the renewer
thread hung there, the other job's lease ran out and another worker ran that job again while the
first still ran it. Now the rejection waits for nobody: the other job keeps its lease, and no job
runs twice (every handler records its interval)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from pgq_thin import Job
from pgq_thin.worker import JobContext

from loginkit import ALICE, MALLORY
from sqlhelpers import hold_every_key, job, one, squatter_session, steal, wait_for
from workerkit import DEADLINE, RUNTIMES, running

LEASE = 2.0
QUEUE = "squatted"


@pytest.fixture
def squatter(conn: psycopg.Connection, login: Callable[..., psycopg.Connection]) -> psycopg.Connection:  # noqa: F811
    return squatter_session(conn, login)


@pytest.fixture(params=sorted(RUNTIMES))
def runtime(request: pytest.FixtureRequest) -> Iterator[str]:
    yield request.param


def make_worker(runtime: str, name: str, runs: list[tuple[Any, ...]], release: threading.Event) -> Any:
    worker = RUNTIMES[runtime]([QUEUE], concurrency=2, name=name, lease=LEASE, poll_interval=0.1,
                               sweep_interval=3600.0, shutdown_timeout=10.0)

    def hold(job: Job, ctx: JobContext) -> None:
        start = time.monotonic()
        while not release.is_set() and not ctx.should_stop:  # until the test lets go, or the job is lost
            release.wait(0.05)
        runs.append((job.id, job.attempt, name, start, time.monotonic()))

    for kind in ("x", "y"):
        worker.handler(kind)(hold)
    return worker


def test_a_squatter_on_the_rejection_key_makes_no_job_run_twice(
        conn: psycopg.Connection, dsn: str, login: Callable[..., psycopg.Connection],  # noqa: F811
        squatter: psycopg.Connection, runtime: str) -> None:  # noqa: F811
    login(ALICE)  # (creates the logins)
    x = one(conn, "SELECT pgq.enqueue(%s, 'x')", (QUEUE,))
    y = one(conn, "SELECT pgq.enqueue(%s, 'y')", (QUEUE,))
    hold_every_key(squatter, [QUEUE], range(x, y + 1), [ALICE])
    runs: list[tuple[Any, ...]] = []
    release = threading.Event()
    first, second = make_worker(runtime, "first", runs, release), make_worker(runtime, "second", runs, release)
    with running(first, make_conninfo(dsn, user=ALICE)):
        try:
            wait_for(lambda: all(job(conn, j)["state"] == "running" for j in (x, y)), "the first worker to run both")
            with running(second, make_conninfo(dsn, user=MALLORY)):
                steal(conn, x, "x")  # x's lease ran out and another claimer took it
                stolen_at = one(conn, "SELECT clock_timestamp()")
                # Either y is taken from the first worker (its renewals stopped), or they went on for
                # three leases past the steal and the first worker's renewal of x was rejected.
                wait_for(lambda: job(conn, y)["attempt"] > 1 or (
                    one(conn, "SELECT lease_until > %s + 3 * %s * interval '1 second' FROM pgq.jobs WHERE id = %s",
                        (stolen_at, LEASE, y))
                    and one(conn, "SELECT count(*) FROM pgq.job_events WHERE job_id = %s AND event = 'rejected'"
                                  " AND session_role = %s AND note LIKE 'renew from attempt 1 %%'", (x, ALICE))),
                         "y to be renewed for three leases or taken", timeout=DEADLINE)
                release.set()
        finally:
            release.set()
            squatter.execute("SELECT pg_advisory_unlock_all()")  # so that a hung renewer lets the worker stop
    ys = sorted(r for r in runs if r[0] == y)
    assert [(r[1], r[2]) for r in ys] == [(1, "first")], ys  # y ran once, by the worker that claimed it
    for job_id in (x, y):
        spans = sorted((r[3], r[4]) for r in runs if r[0] == job_id)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), f"job {job_id} ran twice at once: {spans}"
    assert job(conn, y)["state"] == "done"
