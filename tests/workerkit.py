"""Helpers of the worker tests: enqueue and wait for states, a fast worker, both runtimes."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from pgq_thin.worker import AsyncWorker, Worker

from sqlhelpers import job, one

# Generous deadlines that only keep a broken test from hanging; nothing here measures speed.
DEADLINE = 20.0


#: The runtimes every test here runs against; fast_worker() makes the one of the current test.
RUNTIMES = {"threads": Worker, "asyncio": AsyncWorker}


_current = ["threads"]


AnyWorker = Worker | AsyncWorker


@contextmanager
def running(worker: AnyWorker, dsn: str, **run_options: Any) -> Iterator[AnyWorker]:
    """Run ``worker`` in a thread (an AsyncWorker in an event loop of that thread); on exit stop
    it gracefully and require that run() returned without raising."""
    failure: list[BaseException] = []

    def target() -> None:
        try:
            if isinstance(worker, AsyncWorker):
                asyncio.run(worker.run(dsn, install_signal_handlers=False, **run_options))
            else:
                worker.run(dsn, install_signal_handlers=False, **run_options)
        except BaseException as exc:  # noqa: BLE001 - reported to the test below
            failure.append(exc)

    thread = threading.Thread(target=target, name="test-worker", daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(timeout=DEADLINE)
    assert not thread.is_alive(), f"{type(worker).__name__}.run did not return after stop()"
    assert not failure, f"{type(worker).__name__}.run raised {failure[0]!r}"


def state_counts(conn: psycopg.Connection) -> dict[str, int]:
    return dict(conn.execute("SELECT state::text, count(*) FROM pgq.jobs GROUP BY state").fetchall())


def enqueue(conn: psycopg.Connection, kind: str, payload: str = "{}", queue: str = "default", **more: Any) -> int:
    extra = "".join(f", {name} => %({name})s" for name in more)
    return int(one(conn, f"SELECT pgq.enqueue(%(queue)s, %(kind)s, %(payload)s::jsonb{extra})",
                   {"queue": queue, "kind": kind, "payload": payload, **more}))


def fast_worker(**settings: Any) -> AnyWorker:
    """A worker of the current test's runtime with short intervals, for tests."""
    defaults: dict[str, Any] = {"concurrency": 2, "poll_interval": 0.1, "sweep_interval": 1.0,
                                "shutdown_timeout": 10.0}
    return RUNTIMES[_current[0]](["default"], **{**defaults, **settings})


def finished(conn: psycopg.Connection, job_id: int) -> Callable[[], bool]:
    return lambda: job(conn, job_id)["state"] not in ("pending", "running")






def run_in_thread(worker: Worker | AsyncWorker, dsn: str) -> tuple[threading.Thread, list[BaseException]]:
    failure: list[BaseException] = []

    def target() -> None:
        try:
            if isinstance(worker, AsyncWorker):
                asyncio.run(worker.run(dsn, install_signal_handlers=False))
            else:
                worker.run(dsn, install_signal_handlers=False)
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            failure.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, failure


def stop(worker: Worker | AsyncWorker, thread: threading.Thread, failure: list[BaseException]) -> None:
    worker.stop()
    thread.join(DEADLINE)
    assert not thread.is_alive() and not failure, failure
