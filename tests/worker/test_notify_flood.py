"""Issue 18: any login can NOTIFY pgq, even one without a pgq role. A flood of notifications naming
a worker's queue must not turn into a flood of empty claims (at most about 100 claims a second
from wake-ups on an empty queue), and must not cost the worker its LISTEN wake-ups: a job enqueued
during or after the flood is still picked up by its NOTIFY, long before any poll."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgq_thin.worker import AsyncWorker, Worker, claimer
from pgq_thin.worker.claimer import WAKE_BURST, WAKE_RATE, WakeLimit

from sqlhelpers import one, wait_for

FLOODER = "pgq_test_flooder"
#: Notifications per round trip, each in a transaction of its own (PostgreSQL folds identical
#: notifications of one transaction into one).
BATCH = "BEGIN; NOTIFY pgq, 'q'; COMMIT; " * 500


@pytest.fixture
def flooder_dsn(dsn: str, conn: psycopg.Connection) -> str:
    """A real login without any pgq role, on the test's database (with pgq.claim's calls counted)."""
    if conn.execute("SELECT FROM pg_roles WHERE rolname = %s", (FLOODER,)).fetchone() is None:
        try:
            conn.execute(f"CREATE ROLE {FLOODER} LOGIN")
        except psycopg.errors.DuplicateObject:
            pass
    conn.execute(f"ALTER DATABASE {conninfo_to_dict(dsn)['dbname']} SET track_functions = 'pl'")
    flooder = make_conninfo(dsn, user=FLOODER)
    with psycopg.connect(flooder, autocommit=True) as c:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            c.execute("SELECT pgq.version()")  # no pgq role at all
    return flooder


def flood(flooder_dsn: str, notifications: int) -> None:
    with psycopg.connect(flooder_dsn, autocommit=True) as c:
        for _ in range(notifications // 500):
            c.execute(BATCH)


class Running:
    """A Worker or an AsyncWorker for queue q, running in a thread: it never polls (poll_interval
    an hour) nor sweeps, so a claim after its first ones is a wake-up's."""

    def __init__(self, runtime: str, dsn: str, tag: str = "") -> None:
        settings: dict[str, Any] = {"queues": ["q"], "concurrency": 2, "poll_interval": 3600.0,
                                    "sweep_interval": 0, "name": f"flooded-{runtime}{tag}"}
        self.worker: Worker | AsyncWorker = Worker(**settings) if runtime == "threads" else AsyncWorker(**settings)
        self.done: list[int] = []
        self.worker.handler("k")(lambda job, ctx: self.done.append(job.id))
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, args=(dsn,), daemon=True)

    def _run(self, dsn: str) -> None:
        try:
            if isinstance(self.worker, AsyncWorker):
                asyncio.run(self.worker.run(dsn, install_signal_handlers=False))
            else:
                self.worker.run(dsn, install_signal_handlers=False)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.errors.append(exc)

    def __enter__(self) -> Running:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.worker.stop()
        self.thread.join(timeout=60)
        assert not self.thread.is_alive() and not self.errors, self.errors


def listening(conn: psycopg.Connection, name: str) -> bool:
    return one(conn, "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND query = 'LISTEN pgq'",
               (f"pgq-listen {name}",)) == 1


def claims(conn: psycopg.Connection, name: str) -> int:
    """pgq.claim's calls in this database so far, once the sessions of worker ``name`` are gone
    (a backend reports its function counts when it exits, at the latest)."""
    wait_for(lambda: one(conn, "SELECT count(*) = 0 FROM pg_stat_activity WHERE application_name LIKE %s",
                         (f"pgq-% {name}",)), "the worker's sessions to end")
    conn.execute("SELECT pg_stat_clear_snapshot()")
    return int(one(conn, "SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions "
                         "WHERE schemaname = 'pgq' AND funcname = 'claim'"))


def flooded(runtime: str, dsn: str, conn: psycopg.Connection, flooder_dsn: str, notifications: int,
            tag: str) -> tuple[int, float]:
    """How many claims a worker made while ``notifications`` flooded it, and over how long (from
    the flood's start until the worker stopped)."""
    before = claims(conn, "-")
    with Running(runtime, dsn, tag) as running:
        name = running.worker.name
        wait_for(lambda: listening(conn, name), "the worker to LISTEN")
        began = time.monotonic()
        flood(flooder_dsn, notifications)
        # A job enqueued after the flood, to see the worker still working; it stops once the job is
        # done, and every claim until then counts, over the whole time.
        job_id = one(conn, "SELECT pgq.enqueue('q', 'k')")
        wait_for(lambda: job_id in running.done, "the job enqueued after the flood")
    elapsed = time.monotonic() - began
    return claims(conn, name) - before, elapsed


def test_a_notify_flood_from_a_login_without_pgq_roles_makes_at_most_about_100_claims_a_second(
        dsn: str, conn: psycopg.Connection, flooder_dsn: str, runtime: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The same flood twice: without a limit (the reference, measured in the same run), then with
    # the limit, at 10 a second here rather than WAKE_RATE's 100: an empty claim takes milliseconds,
    # and on a loaded machine an unlimited worker makes not many more than 100 a second.
    rate, notifications, startup = 10.0, 20_000, 5  # startup: the first claim, LISTEN's, the job's
    monkeypatch.setattr(claimer, "WAKE_RATE", 1e9)
    unlimited, unlimited_elapsed = flooded(runtime, dsn, conn, flooder_dsn, notifications, "unlimited")
    monkeypatch.setattr(claimer, "WAKE_RATE", rate)
    limited, elapsed = flooded(runtime, dsn, conn, flooder_dsn, notifications, "limited")
    assert limited <= rate * elapsed + WAKE_BURST + startup, f"{limited} claims in {elapsed:.1f}s"
    # Without the limit the same flood made more (else this test would show nothing).
    assert unlimited > rate * unlimited_elapsed + WAKE_BURST + startup, \
        f"unlimited: {unlimited} claims in {unlimited_elapsed:.1f}s"
    assert WAKE_RATE == 100.0  # what production uses (the module's value, restored after the test)


def test_a_job_enqueued_during_and_after_a_flood_is_picked_up_by_its_notify(
        dsn: str, conn: psycopg.Connection, flooder_dsn: str, runtime: str) -> None:
    with Running(runtime, dsn) as running:
        wait_for(lambda: listening(conn, running.worker.name), "the worker to LISTEN")
        flooding = threading.Thread(target=flood, args=(flooder_dsn, 20_000))
        flooding.start()
        during = one(conn, "SELECT pgq.enqueue('q', 'k')")
        flooding.join(timeout=120)
        after = one(conn, "SELECT pgq.enqueue('q', 'k')")
        # The worker never polls (every hour) nor sweeps: only a wake-up can start these claims,
        # and this wait is far shorter than a poll interval.
        wait_for(lambda: {during, after} <= set(running.done), "both jobs' handlers to run", timeout=60)
        # (The handler has run before its completion commits: wait for that too, not just read.)
        wait_for(lambda: one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'done'") == 2,
                 "both jobs to be done", timeout=60)


def test_the_wake_limit_lets_a_burst_through_then_one_claim_per_1_over_rate() -> None:
    now = [0.0]
    limit = WakeLimit(rate=100.0, burst=10, clock=lambda: now[0])
    assert [limit.held() for _ in range(10)] == [0.0] * 10  # a burst of wake-ups: at once
    assert limit.held() == pytest.approx(0.01)  # then each waits for its token
    now[0] += 0.01  # it waited
    assert limit.held() == pytest.approx(0.01)
    now[0] += 0.01
    # 100 wake-ups a second go through as they come; a quiet second refills the burst (no more).
    for _ in range(100):
        now[0] += 0.01
        assert limit.held() == pytest.approx(0.0, abs=1e-9)
    now[0] += 60.0
    assert [limit.held() for _ in range(10)] == [0.0] * 10 and limit.held() > 0
