"""The worker in the registry of live workers (issue 41; pgq_thin/worker/heartbeat.py), on each
runtime, against a real PostgreSQL: listed by pgq.workers() while it runs (its name, queues,
kinds, host and pid), refreshed every heartbeat_interval, gone after a graceful stop; at start it
warns about the kinds of its queues' pending jobs that no running worker handles (issue 42); a
database without the registry is said once and the worker works on."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterator

import psycopg
import pytest

from pgq_thin import Job
from pgq_thin.worker import JobContext

from sqlhelpers import one, wait_for
from workerkit import _current, enqueue, fast_worker, finished, running


@pytest.fixture(autouse=True)
def current_runtime(runtime: str) -> Iterator[str]:
    _current[0] = runtime
    yield runtime
    _current[0] = "threads"


def entries(conn: psycopg.Connection) -> list[tuple]:
    return conn.execute("SELECT worker, queues, kinds, host, pid FROM pgq.workers()").fetchall()


def test_a_running_worker_is_listed_refreshed_and_gone_after_its_stop(dsn: str, conn: psycopg.Connection) -> None:
    worker = fast_worker(name="reg-1", heartbeat_interval=0.2)

    @worker.handler("send")
    def send(job: Job, ctx: JobContext) -> None:
        return None

    with running(worker, dsn, queues=["emails", "sms"]):
        wait_for(lambda: entries(conn) != [], "the worker's first heartbeat")
        assert entries(conn) == [("reg-1", ["emails", "sms"], ["send"], socket.gethostname(), os.getpid())]
        first = one(conn, "SELECT last_seen FROM pgq.workers()")
        wait_for(lambda: one(conn, "SELECT last_seen FROM pgq.workers()") > first, "a later heartbeat")
    assert entries(conn) == []  # the graceful stop's farewell
    assert one(conn, "SELECT count(*) FROM pgq.worker_registry") == 0


def test_the_start_warns_about_a_pending_kind_no_running_worker_handles(
        dsn: str, conn: psycopg.Connection, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="pgq_thin.worker")
    for kind in ("send_welcome", "send_welcom", "report"):
        enqueue(conn, kind, queue="emails")
    # Another live worker (any language) handles "report".
    one(conn, "SELECT pgq.worker_heartbeat('reporter', ARRAY['emails'], ARRAY['report'])")
    worker = fast_worker()

    @worker.handler("send_welcome")
    def send_welcome(job: Job, ctx: JobContext) -> None:
        return None

    with running(worker, dsn, queues=["emails"]):
        wait_for(lambda: one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'done'") == 1, "the handled job")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    about = [m for m in warnings if "which no running worker handles" in m]
    assert about == ["queue emails has pending jobs of kind 'send_welcom', which no running worker handles (this "
                     "one handles 'send_welcome'): they wait until a worker with a handler for it starts"], warnings


def test_a_database_without_the_registry_is_said_once_and_the_worker_works_on(
        dsn: str, conn: psycopg.Connection, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="pgq_thin.worker")
    conn.execute("DROP FUNCTION pgq.worker_heartbeat(text, text[], text[], integer, text, integer, interval, boolean)")
    worker = fast_worker(heartbeat_interval=0.1)

    @worker.handler("k")
    def k(job: Job, ctx: JobContext) -> None:
        return None

    job_id = enqueue(conn, "k")
    with running(worker, dsn):
        wait_for(finished(conn, job_id), "the job")
    said = [r.getMessage() for r in caplog.records if "no registry of workers" in r.getMessage()]
    assert len(said) == 1, said
