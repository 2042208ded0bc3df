"""What the dashboard's tests share: login roles in the pgq roles, jobs in each state, and a real
``pgq-thin dashboard`` process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo
from starlette.testclient import TestClient

from pgq_thin import AsyncClient, Client
from pgq_thin.dashboard.app import create_app

#: A payload and an error that would run as script if the dashboard did not escape them.
SCRIPT = "<script>window.__pwned = 1; alert('pwned')</script>"


@contextmanager
def logins(dsn: str) -> Iterator[dict[str, str]]:
    """A LOGIN role in pgq_monitor and one in pgq_admin (roles are the cluster's: named uniquely and
    dropped afterwards); yields role -> the DSN that logs in as it."""
    suffix = uuid.uuid4().hex[:8]
    names = {"pgq_monitor": f"dash_monitor_{suffix}", "pgq_admin": f"dash_admin_{suffix}"}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for role, name in names.items():
            conn.execute(f"CREATE ROLE {name} LOGIN IN ROLE {role}")
    try:
        yield {role: make_conninfo(dsn, user=name) for role, name in names.items()}
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for name in names.values():
                conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,))
                conn.execute(f"DROP ROLE {name}")


@contextmanager
def dashboard(dsn: str, **options: Any) -> Iterator[TestClient]:
    """The dashboard app (``create_app(connect, **options)``) over an AsyncClient of ``dsn``, in
    Starlette's TestClient (entered: the app's lifespan makes the client, and closes it)."""
    with TestClient(create_app(lambda: AsyncClient(dsn, max_size=2), **options)) as http:
        yield http


def failed_job(client: Client, queue: str = "mail", error: str = "smtp said no") -> int:
    """A job that failed its only attempt."""
    job_id = client.enqueue(queue, "send", {"to": "ada@example.com", "note": SCRIPT}, max_attempts=1)
    [job] = client.claim("test-worker", [queue])
    assert job.id == job_id
    assert client.fail(job.id, job.attempt, error, retryable=False) == "failed"
    return job_id


def unknown_job(client: Client, queue: str = "mail") -> int:
    """A job whose attempt was parked as outcome_unknown."""
    job_id = client.enqueue(queue, "charge", {"amount": 10})
    [job] = client.claim("test-worker", [queue])
    assert client.mark_unknown(job.id, job.attempt, "the card network timed out")
    return job_id


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running_dashboard(dsn: str, token: str | None = None, *options: str, output: list[str] | None = None,
                      pids: list[int] | None = None) -> Iterator[str]:
    """``pgq-thin dashboard`` in its own process (host left to its default unless ``options`` say);
    yields its URL once /healthz answers; its pid goes into ``pids``, what it printed into ``output``
    once it stopped."""
    port = free_port()
    env = {**os.environ, "PGQ_DASHBOARD_TOKEN": token or ""}
    process = subprocess.Popen([sys.executable, "-m", "pgq_thin", "dashboard", "--dsn", dsn, "--port", str(port),
                                *options], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               cwd=tempfile.gettempdir())  # not the checkout: the installed wheel's assets serve
    if pids is not None:
        pids.append(process.pid)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, f"the dashboard exited: {process.stdout.read() if process.stdout else ''}"
            request = urllib.request.Request(f"{url}/healthz", headers={"Authorization": f"Bearer {token}"})
            try:
                with urllib.request.urlopen(request, timeout=5) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError):
                pass
            assert time.monotonic() < deadline, "the dashboard did not answer /healthz within 60 s"
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        try:
            printed, _ = process.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            printed, _ = process.communicate()
        if output is not None:
            output.append(printed)


# Workflows (issue 26): pgq's SQL called directly (the Client's methods for them are not the dashboard's
# business), as the superuser of the test's database unless a DSN of another login is given.

def open_batch(dsn: str, callback_queue: str = "after", callback_kind: str = "report",
               run_when: str = "all_ended") -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pgq.batch_open(callback_queue => %s, callback_kind => %s, run_when => %s)",
                           (callback_queue, callback_kind, run_when)).fetchone()
    assert row is not None
    return int(row[0])


def close_batch(dsn: str, batch_id: int) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pgq.batch_close(id => %s)", (batch_id,)).fetchone()
    assert row is not None
    return bool(row[0])


def enqueue_linked(dsn: str, queue: str = "work", kind: str = "step", *, depends_on: list[int] | None = None,
                   dependency_mode: str | None = None, batch: int | None = None, count: int = 1) -> list[int]:
    """``count`` jobs in one pgq.enqueue_many, with depends_on, dependency_mode and batch when given
    (left to their defaults otherwise)."""
    given = {k: v for k, v in (("depends_on", depends_on), ("dependency_mode", dependency_mode), ("batch", batch))
             if v is not None}
    casts = {"depends_on": "bigint[]", "dependency_mode": "text", "batch": "bigint"}
    extra = "".join(f", {name} => %({name})s::{casts[name]}" for name in given)
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            f"SELECT id FROM pgq.enqueue_many(queue => %(queue)s, kind => %(kind)s, payloads => %(payloads)s::jsonb[]"
            f"{extra}) AS t(id)", {"queue": queue, "kind": kind, "payloads": ["{}"] * count, **given}).fetchall()
    return [int(r[0]) for r in rows]


def finish(client: Client, queue: str, outcomes: list[str]) -> list[int]:
    """Claims one job of ``queue`` per outcome and completes it ("done") or fails it for good ("failed")."""
    finished = []
    for outcome in outcomes:
        [job] = client.claim("test-worker", [queue])
        if outcome == "done":
            assert client.complete(job.id, job.attempt)
        else:
            assert client.fail(job.id, job.attempt, "it broke", retryable=False) == "failed"
        finished.append(job.id)
    return finished
