"""Worker processes that get signals or are killed: real subprocesses running tests/apps/sleepy.py
(one kind, ``sleep``, that sleeps payload["seconds"] without cooperating with shutdown), or the
same app on an AsyncWorker (tests/apps/sleepy_async.py): each scenario runs against both."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from pgq_thin import Job
from pgq_thin.worker import JobContext, Worker

from sqlhelpers import events, job, one, wait_for
from workerkit import enqueue, finished, running
from workerprocess import ROOT, WorkerProcess, spawner

SLEEPY = {"threads": ROOT / "tests" / "apps" / "sleepy.py", "asyncio": ROOT / "tests" / "apps" / "sleepy_async.py"}


@pytest.fixture(params=sorted(SLEEPY))
def spawn(request: pytest.FixtureRequest, dsn: str, tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    with spawner(SLEEPY[request.param], dsn, tmp_path) as start:
        yield start


def is_running(conn: psycopg.Connection, job_id: int) -> bool:
    return job(conn, job_id)["state"] == "running"


GRACEFUL = "shutting down gracefully"


def test_sigterm_stops_claiming_and_lets_the_running_job_finish(spawn, conn: psycopg.Connection) -> None:
    job_id = enqueue(conn, "sleep", '{"seconds": 2}')
    worker = spawn(SLEEPY_SHUTDOWN_TIMEOUT="30")
    wait_for(lambda: worker.logged(f"sleeping 2s for job {job_id}"), "the handler to start")

    worker.signal(signal.SIGTERM)
    wait_for(lambda: worker.logged(GRACEFUL), "the worker to begin its shutdown")
    late = enqueue(conn, "sleep", '{"seconds": 0}')
    assert worker.wait_exit() == 0

    row = job(conn, job_id)
    assert (row["state"], row["attempt"], row["result"]["slept"]) == ("done", 1, 2)
    assert [e[0] for e in events(conn, job_id)] == ["claimed", "completed"]
    # Enqueued after the signal: never claimed.
    assert (job(conn, late)["state"], job(conn, late)["attempt"]) == ("pending", 0)


def test_a_job_still_running_after_shutdown_timeout_is_released(spawn, conn: psycopg.Connection) -> None:
    job_id = enqueue(conn, "sleep", '{"seconds": 60}', max_attempts=5)
    worker = spawn(SLEEPY_SHUTDOWN_TIMEOUT="1")
    wait_for(lambda: worker.logged(f"sleeping 60s for job {job_id}"), "the handler to start")

    worker.signal(signal.SIGTERM)
    assert worker.wait_exit() == 0

    row = job(conn, job_id)
    # Pending again at once; the attempt number is kept (it never decreases) and one more attempt
    # is allowed, so the released attempt does not count against the job.
    assert (row["state"], row["attempt"], row["max_attempts"]) == ("pending", 1, 6)
    assert row["lease_until"] is None
    assert [e[0] for e in events(conn, job_id)] == ["claimed", "released"]


def test_a_second_sigterm_exits_at_once_and_leaves_the_job_to_its_lease(spawn, conn: psycopg.Connection) -> None:
    job_id = enqueue(conn, "sleep", '{"seconds": 60}')
    worker = spawn(SLEEPY_SHUTDOWN_TIMEOUT="60")
    wait_for(lambda: worker.logged(f"sleeping 60s for job {job_id}"), "the handler to start")

    worker.signal(signal.SIGTERM)
    wait_for(lambda: worker.logged(GRACEFUL), "the worker to begin its shutdown")
    worker.signal(signal.SIGTERM)
    # Far below the 60 s the first signal would have waited; non-zero: jobs were left to their leases.
    assert worker.wait_exit(timeout=15) == 1
    assert worker.logged("stopping at once")

    row = job(conn, job_id)
    assert (row["state"], row["attempt"]) == ("running", 1)  # nobody released it: the lease covers it
    assert [e[0] for e in events(conn, job_id)] == ["claimed"]


def test_a_job_whose_worker_was_killed_is_reclaimed_after_its_lease_and_completes_once(
        spawn, dsn: str, conn: psycopg.Connection) -> None:
    job_id = enqueue(conn, "sleep", '{"seconds": 60}')
    victim = spawn(SLEEPY_LEASE="2")
    wait_for(lambda: victim.logged(f"sleeping 60s for job {job_id}"), "the handler to start")
    victim.signal(signal.SIGKILL)
    assert victim.wait_exit() == -signal.SIGKILL

    rescuer = Worker(["default"], concurrency=1, name="rescuer", poll_interval=0.2, sweep_interval=1.0)

    @rescuer.handler("sleep")
    def quick(job: Job, ctx: JobContext) -> str:
        return f"rescued attempt {job.attempt}"

    with running(rescuer, dsn):
        wait_for(finished(conn, job_id), "the job to be recovered and done")

    row = job(conn, job_id)
    assert (row["state"], row["attempt"], row["claimed_by"], row["result"]) == (
        "done", 2, "rescuer", "rescued attempt 2")
    assert [(e[0], e[1]) for e in events(conn, job_id)] == [
        ("claimed", 1), ("lease_expired", 1), ("claimed", 2), ("completed", 2)]
    assert one(conn, "SELECT count(*) FROM pgq.job_events WHERE job_id = %s AND event = 'completed'",
               (job_id,)) == 1


# A signal handler runs in the main thread between two bytecodes: possibly while that thread holds
# a lock that stopping needs (the lock of an Event the claimer waits on and clears). Stopping from
# the handler would then wait for the main thread itself, forever. The script holds such a lock
# while the signals arrive; the stop must still happen once it lets go.
SIGNAL_WHILE_LOCKED = """
import os, signal, sys, threading
from pgq_thin.worker.signals import Signals
lock = threading.Lock()  # what the claimer's wake-up Event holds for a moment in every sleep
asked, both = [], threading.Event()
def stop(graceful):
    with lock:
        asked.append(graceful)
        if len(asked) == 2:
            both.set()
signals = Signals(stop, lambda: bool(asked), "w")
assert signals.install()
with lock:
    os.kill(os.getpid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGTERM)
    for _ in range(1000):  # bytecodes: the handlers run here, in this thread
        pass
ok = both.wait(10) and sorted(asked) == [False, True]  # two threads: either order
for thread in threading.enumerate():  # each logs its line after its stop(): wait for the lines
    if thread.name == "pgq-signal":
        thread.join(10)
sys.exit(0 if ok else 3)
"""


def test_signals_that_arrive_while_the_main_thread_holds_an_event_lock_still_stop_the_worker() -> None:
    proc = subprocess.run([sys.executable, "-c", SIGNAL_WHILE_LOCKED], cwd=ROOT, capture_output=True,
                          text=True, timeout=20)
    assert proc.returncode == 0, proc.stderr
    # Two signals: the first asks for a graceful stop, the second for an immediate one.
    assert "shutting down gracefully" in proc.stderr and "stopping at once" in proc.stderr
