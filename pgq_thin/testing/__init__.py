"""pgq's test kit: run a worker's due jobs in-process and tell what happened, so that a test can
enqueue, drain and assert without sleeping.

    from pgq_thin.testing import drain

    def test_welcome_mail(pgq_client):              # pgq_client, pgq_dsn: the pytest plugin
        job_id = pgq_client.enqueue("mail", "welcome", {"to": "ada@example.com"})
        result = drain(app.worker)                   # runs until nothing of its queues is due
        assert result.outcomes == {job_id: "done"}

``drain(worker)`` runs a copy of ``worker`` (same settings, same handlers, middleware and hooks: a
Worker runs once, and a test may drain the app's worker many times) in a thread, on the test's
database, until none of the worker's queues has a job of the worker's kinds that is due, nor one
running (a worker claims only the kinds it has handlers for: a job of another kind is left for
another worker), then stops it and reads what became of every job it claimed from the database
(pgq.get_job). ``await adrain(worker)`` does the same for an ``AsyncWorker`` on the running event
loop. The rules of the queue (what is due, backoff, caps) are pgq's own: the kit only counts what
is due and running.

The pytest plugin (``pgq_thin.testing.plugin``, on whenever pgq-thin is installed) provides the
fixtures ``pgq_dsn`` and ``pgq_client``; ``pgq_thin.testing.server`` is the throwaway PostgreSQL
they run on.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from pgq_thin import queries
from pgq_thin.calls import Interval, seconds
from pgq_thin.client import Client
from pgq_thin.models import JobRecord

__all__ = ["DrainResult", "DrainTimeout", "DrainedJob", "adrain", "current_dsn", "drain"]

#: What a drain did with a job, by the job's state and last event afterwards.
OUTCOMES = {
    ("done", "completed"): "done",
    ("failed", "failed"): "failed",
    ("pending", "failed"): "retried",
    ("pending", "snoozed"): "snoozed",
    ("pending", "released"): "released",
    ("outcome_unknown", "marked_unknown"): "unknown",
    ("cancelled", "cancelled"): "cancelled",
}

#: The database of the test that is running (set by the plugin's pgq_dsn fixture).
_current_dsn: str | None = None


def current_dsn() -> str | None:
    """The running test's ``pgq_dsn`` (None outside such a test)."""
    return _current_dsn


@dataclass(frozen=True)
class DrainedJob:
    """A job the drain claimed, as it was when the drain ended."""

    id: int
    kind: str
    outcome: str  # done, failed, retried, snoozed, unknown, released, cancelled (or the state)
    attempt: int
    error: str | None
    result: Any
    record: JobRecord


@dataclass(frozen=True)
class DrainResult:
    """What a drain did: every job it claimed, by id."""

    jobs: dict[int, DrainedJob] = field(default_factory=dict)

    @property
    def outcomes(self) -> dict[int, str]:
        """Job id -> outcome."""
        return {job_id: job.outcome for job_id, job in self.jobs.items()}

    def ids(self, outcome: str) -> list[int]:
        return [job_id for job_id, job in self.jobs.items() if job.outcome == outcome]

    @property
    def done(self) -> list[int]:
        return self.ids("done")

    @property
    def failed(self) -> list[int]:
        return self.ids("failed")

    @property
    def retried(self) -> list[int]:
        return self.ids("retried")

    def __getitem__(self, job_id: int) -> DrainedJob:
        return self.jobs[job_id]

    def __len__(self) -> int:
        return len(self.jobs)

    def __iter__(self) -> Iterator[DrainedJob]:
        return iter(self.jobs.values())


class DrainTimeout(AssertionError):
    """The worker's queues still had due or running jobs when the drain's time was up."""


def _resolve(dsn: str | None) -> str:
    found = dsn or _current_dsn
    if not found:
        raise ValueError("drain needs a database: pass dsn=, or use it in a test with the pgq_dsn fixture")
    return found


def _fresh_copy(worker: Any) -> Any:
    """A new worker of the same class with the same settings, handlers, middleware and hooks (each
    drain is a run: its on_start and on_stop hooks run once): a worker object runs once, and a test
    drains the application's worker (a module global) as often as it likes."""
    handlers: dict[str, Callable[..., Any]] = worker.handlers
    copy = type(worker)(queues=worker.queues, concurrency=worker.concurrency, name=worker.name,
                        lease=worker.lease, poll_interval=worker.poll_interval, listen=worker.listen,
                        sweep_interval=worker.sweep_interval, heartbeat_interval=worker.heartbeat_interval,
                        shutdown_timeout=worker.shutdown_timeout,
                        prefetch=worker.prefetch,
                        **({"pooled": True} if getattr(worker, "pooled", False) else {}))
    for kind, function in handlers.items():
        copy.handler(kind)(function)
    for register, functions in ((copy.middleware, worker._middleware), (copy.on_start, worker._on_start),
                                (copy.on_stop, worker._on_stop)):
        for function in functions:
            register(function)
    return copy


Busy = list[tuple[str, int, int]]  # (queue, due jobs of the worker's kinds, running jobs)


def _settled(busy: Busy) -> bool:
    """Nothing the worker would claim is due, and nothing of its queues is running."""
    return all(due == 0 and running == 0 for _, due, running in busy)


class _Observer:
    """The drain's view of the database: what is due and running while the worker runs, then
    pgq.get_job for each job the worker claimed (pgq.jobs.claimed_by names it, claimed_at is after
    the drain began)."""

    def __init__(self, dsn: str, pooled: bool = False) -> None:
        # pooled: the drained worker's switch (a transaction-pooling proxy), the observer's too.
        self.client = Client(dsn, min_size=1, max_size=1, pooled=pooled)
        try:
            with self.client.pool.connection() as conn:
                row = conn.execute(queries.CLOCK).fetchone()
                assert row is not None
                self.started = row[0]
        except BaseException:
            self.client.close()
            raise

    def busy(self, queues: Sequence[str] | None, kinds: Sequence[str]) -> Busy:
        with self.client.pool.connection() as conn:
            params = {"queues": None if queues is None else list(queues), "kinds": list(kinds)}
            return [(str(q), int(due), int(running))
                    for q, due, running in conn.execute(queries.DRAIN_BUSY, params).fetchall()]

    def result(self, worker_name: str) -> DrainResult:
        with self.client.pool.connection() as conn:
            ids = [row[0] for row in conn.execute(
                queries.DRAIN_CLAIMED, {"worker": worker_name, "since": self.started}).fetchall()]
        return DrainResult({job_id: _drained_job(self.client.get_job(job_id)) for job_id in ids})

    def close(self) -> None:
        self.client.close()


def _drained_job(record: JobRecord) -> DrainedJob:
    outcome = OUTCOMES.get((record.state, record.last_event), record.state)
    return DrainedJob(id=record.id, kind=record.kind, outcome=outcome, attempt=record.attempt,
                      error=record.last_error, result=record.result, record=record)


def _timeout_message(timeout: float, busy: Busy) -> str:
    left = [f"{queue}: {due} due, {running} running" for queue, due, running in busy if due or running]
    return f"drain: jobs were still due or running after {timeout:g}s ({'; '.join(left)})"


def drain(worker: Any, dsn: str | None = None, timeout: Interval = 30.0) -> DrainResult:
    """Run ``worker``'s due jobs in this process until none of its queues has a job that is due or
    running, and return what became of each job it claimed. ``dsn``: the test's ``pgq_dsn`` when
    None. Raises DrainTimeout (an AssertionError) when jobs are still due or running after
    ``timeout`` (seconds, a timedelta or a duration such as ``"2m"``), and re-raises what ended the
    worker early (e.g. a missing privilege).

    Jobs scheduled for later, and retries waiting for their backoff, are not due: the drain ends
    and reports such a job as ``retried`` (a later drain runs it once it is due)."""
    timeout = seconds("timeout", timeout)
    dsn = _resolve(dsn)
    runner = _fresh_copy(worker)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            runner.run(dsn, install_signal_handlers=False)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            failure.append(exc)

    observer = _Observer(dsn, getattr(worker, "pooled", False))
    try:
        thread = threading.Thread(target=run, name="pgq-drain", daemon=True)
        thread.start()
        deadline = time.monotonic() + timeout
        try:
            while True:
                busy = observer.busy(runner.queues, runner.kinds)
                if _settled(busy) or not thread.is_alive():
                    break
                if time.monotonic() > deadline:
                    raise DrainTimeout(_timeout_message(timeout, busy))
                time.sleep(0.02)
        finally:
            runner.stop()
            thread.join(timeout=runner.shutdown_timeout + 10)
        if failure:
            raise failure[0]
        return observer.result(runner.name)
    finally:
        observer.close()


async def adrain(worker: Any, dsn: str | None = None, timeout: Interval = 30.0) -> DrainResult:
    """``drain`` for an ``AsyncWorker``: runs ``await worker.run(dsn, install_signal_handlers=False)``
    (on a copy of it) as a task of the running loop, watches the database until none of its queues has
    a job that is due or running, stops it and returns what became of each job it claimed."""
    timeout = seconds("timeout", timeout)
    dsn = _resolve(dsn)
    runner = _fresh_copy(worker)
    observer = await asyncio.to_thread(_Observer, dsn, getattr(worker, "pooled", False))
    try:
        task = asyncio.ensure_future(runner.run(dsn, install_signal_handlers=False))
        deadline = time.monotonic() + timeout
        try:
            while True:
                busy = await asyncio.to_thread(observer.busy, runner.queues, runner.kinds)
                if _settled(busy) or task.done():
                    break
                if time.monotonic() > deadline:
                    raise DrainTimeout(_timeout_message(timeout, busy))
                await asyncio.sleep(0.02)
        finally:
            runner.stop()
            await asyncio.wait_for(asyncio.shield(task), timeout=runner.shutdown_timeout + 10)
        return await asyncio.to_thread(observer.result, runner.name)
    finally:
        await asyncio.to_thread(observer.close)
