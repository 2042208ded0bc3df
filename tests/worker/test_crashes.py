"""Crashes, cut connections, a server restart, missing notifications and a skewed clock, with real
worker processes (tests/apps/steady.py, and steady_async.py: each scenario runs on both runtimes) -
TESTING.md scenarios 12-16 and 27.

Every test checks, from the database, the invariants that matter after a failure: each job
reaches a terminal state, is completed at most once (pgq.job_events), and every extra claim of a
job is explained by an expired lease of the attempt before it.
"""

from __future__ import annotations

import json
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgq_thin import migrate
from pgq_thin.testing import server as embedded

from sqlhelpers import claim, events, job, one, wait_for
from workerprocess import DEADLINE, ROOT, WorkerProcess, spawner

#: The app, on either runtime: every scenario runs against both.
STEADY = {"threads": ROOT / "tests" / "apps" / "steady.py", "asyncio": ROOT / "tests" / "apps" / "steady_async.py"}
LIBFAKETIME = ["/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1", "/usr/lib/faketime/libfaketime.so.1"]


@pytest.fixture(params=sorted(STEADY))
def spawn(request: pytest.FixtureRequest, dsn: str, tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    with spawner(STEADY[request.param], dsn, tmp_path) as start:
        yield start


def enqueue(conn: psycopg.Connection, queue: str = "default", **payload: Any) -> int:
    return int(one(conn, "SELECT pgq.enqueue(%s, 'work', %s::jsonb)", (queue, json.dumps(payload))))


def terminate(control: psycopg.Connection, pids: list[int]) -> None:
    """pg_terminate_backend each pid and wait until they are gone (their transactions ended)."""
    for pid in pids:
        control.execute("SELECT pg_terminate_backend(%s)", (pid,))
    wait_for(lambda: not control.execute("SELECT 1 FROM pg_stat_activity WHERE pid = ANY (%s)",
                                         (pids,)).fetchone(), "the backends to exit", timeout=10)


def client_backends(control: psycopg.Connection, like: str = "%") -> list[int]:
    return [r[0] for r in control.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        " AND backend_type = 'client backend' AND application_name LIKE %s", (like,)).fetchall()]


def assert_done_exactly_once(conn: psycopg.Connection, ids: list[int]) -> None:
    """Every job done, completed once (by the attempt that owns it), and every claim after the
    first explained by the expired lease of the attempt before it."""
    rows = conn.execute(
        "SELECT j.id, j.state::text, j.attempt,"
        " count(*) FILTER (WHERE e.event = 'completed'),"
        " count(*) FILTER (WHERE e.event = 'claimed'),"
        " count(*) FILTER (WHERE e.event IN ('lease_expired', 'released')),"
        " max(e.attempt) FILTER (WHERE e.event = 'completed')"
        " FROM pgq.jobs AS j LEFT JOIN pgq.job_events AS e ON e.job_id = j.id"
        " WHERE j.id = ANY (%s) GROUP BY j.id ORDER BY j.id", (ids,)).fetchall()
    assert [r[0] for r in rows] == sorted(ids)
    bad = [r for r in rows if r[1] != "done" or r[3] != 1 or r[4] != r[5] + 1 or r[6] != r[2]]
    assert not bad, f"(id, state, attempt, completed, claimed, expired/released, completing attempt): {bad[:10]}"


# 12 -----------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_job_whose_worker_was_killed_mid_job_is_reclaimed_after_its_lease_with_a_new_attempt_and_completes_once(
        spawn, conn: psycopg.Connection) -> None:
    # The job runs 4 s: the victim is surely still at it when the kill comes, however late the test
    # sees its log line on a loaded machine.
    job_id = enqueue(conn, seconds=4)
    victim = spawn(STEADY_LEASE="2")
    wait_for(lambda: victim.logged(f"working on job {job_id} attempt 1"), "the handler to start")
    victim.process.send_signal(signal.SIGKILL)
    assert victim.process.wait(DEADLINE) == -signal.SIGKILL
    assert job(conn, job_id)["state"] == "running"

    # The victim's 2-second lease is the one under test. The rescuer's is long so that its own
    # attempt cannot lose its lease to a renewal delayed by a loaded machine (its own sweeper
    # would then recover the job, and the history below would have one more claim).
    rescuer = spawn(STEADY_LEASE="30")
    wait_for(lambda: job(conn, job_id)["state"] == "done", "the job to be recovered and done")
    row = job(conn, job_id)
    assert (row["attempt"], row["result"]) == (2, {"pid": rescuer.pid, "attempt": 2})
    assert [(e[0], e[1]) for e in events(conn, job_id)] == [
        ("claimed", 1), ("lease_expired", 1), ("claimed", 2), ("completed", 2)]
    assert rescuer.stop() == 0


# 13 -----------------------------------------------------------------------------------------------

def test_a_claim_whose_connection_dropped_right_after_commit_is_recovered_by_its_lease(
        spawn, dsn: str, conn: psycopg.Connection) -> None:
    job_id = enqueue(conn)
    lost = psycopg.connect(dsn, autocommit=True)
    lost.execute("BEGIN")
    (claimed,) = claim(lost, worker="lost", lease="1 second")
    lost.execute("COMMIT")
    terminate(conn, [lost.info.backend_pid])  # the answer to COMMIT is all the worker ever saw
    with pytest.raises(psycopg.OperationalError):
        lost.execute("SELECT 1")
    lost.close()
    assert (job(conn, job_id)["state"], job(conn, job_id)["attempt"]) == ("running", 1)

    rescuer = spawn(STEADY_LEASE="2")
    wait_for(lambda: job(conn, job_id)["state"] == "done", "the claim to be recovered and the job done")
    assert rescuer.stop() == 0
    assert [(e[0], e[1]) for e in events(conn, job_id)] == [
        ("claimed", 1), ("lease_expired", 1), ("claimed", 2), ("completed", 2)]
    # The lost worker comes back with its attempt: not yours.
    with psycopg.connect(dsn, autocommit=True) as back:
        assert one(back, "SELECT pgq.complete(%s, %s)", (job_id, claimed["attempt"])) is False
    assert job(conn, job_id)["attempt"] == 2


@pytest.mark.parametrize("operation, call, answer", [
    ("complete", "SELECT pgq.complete(%s, %s, '{\"ok\": 1}')", True),
    ("fail", "SELECT pgq.fail(%s, %s, 'boom', retryable => false)", "failed"),
    ("fail_retryable", "SELECT pgq.fail(%s, %s, 'boom', retry_in => '1 hour')", "pending"),
], ids=["complete", "fail", "fail_retryable"])
def test_an_owner_call_repeated_after_its_connection_dropped_right_after_commit_answers_the_same_and_changes_nothing(
        dsn: str, conn: psycopg.Connection, operation: str, call: str, answer: Any) -> None:
    job_id = enqueue(conn)
    worker = psycopg.connect(dsn, autocommit=True)
    (claimed,) = claim(worker, worker="w")
    worker.execute("BEGIN")
    assert one(worker, call, (job_id, claimed["attempt"])) == answer
    worker.execute("COMMIT")
    terminate(conn, [worker.info.backend_pid])
    worker.close()
    before_row, before_events = job(conn, job_id), events(conn, job_id)

    with psycopg.connect(dsn, autocommit=True) as again:  # the worker reconnects and repeats it
        assert one(again, call, (job_id, claimed["attempt"])) == answer
        assert one(again, call, (job_id, claimed["attempt"])) == answer
    assert job(conn, job_id) == before_row
    assert events(conn, job_id) == before_events


# 14 -----------------------------------------------------------------------------------------------

class Producer(threading.Thread):
    """Enqueues jobs n = 0, 1, ... at a steady pace through its own connection. When the connection
    breaks it reconnects and enqueues n again only if job n is not in the table: an enqueue whose
    COMMIT succeeded but whose answer was lost is not repeated. ``ids`` are the committed jobs."""

    def __init__(self, dsn: str, count: int, interval: float, seconds: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.dsn, self.count, self.interval, self.seconds = dsn, count, interval, seconds
        self.ids: list[int] = []
        self.reconnects = 0
        self.error: BaseException | None = None

    def _connect(self) -> psycopg.Connection:
        deadline = time.monotonic() + DEADLINE
        while True:
            try:
                return psycopg.connect(self.dsn, autocommit=True, connect_timeout=2,
                                       application_name="test-producer")
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def run(self) -> None:
        try:
            conn = self._connect()
            n = 0
            while n < self.count:
                try:
                    existing = conn.execute("SELECT id FROM pgq.jobs WHERE payload @> jsonb_build_object('n', %s)",
                                            (n,)).fetchone()
                    if existing is None:
                        existing = conn.execute("SELECT pgq.enqueue('default', 'work', jsonb_build_object("
                                                "'n', %s, 'seconds', %s))", (n, self.seconds)).fetchone()
                    assert existing is not None
                    self.ids.append(existing[0])
                    n += 1
                    time.sleep(self.interval)
                except psycopg.OperationalError:
                    self.reconnects += 1
                    conn.close()
                    conn = self._connect()
            conn.close()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


@pytest.mark.slow
def test_workers_survive_every_client_backend_terminated_twice_under_load_and_do_every_job_once(
        spawn, dsn: str, conn: psycopg.Connection) -> None:
    workers = [spawn(STEADY_LEASE="2", STEADY_CONCURRENCY="3", STEADY_POLL="0.5") for _ in range(3)]
    wait_for(lambda: len(client_backends(conn, "pgq-listen%")) == 3, "every worker to LISTEN")
    producer = Producer(dsn, count=150, interval=0.04)
    producer.start()
    killed = 0
    for _ in range(2):
        # Under load: some jobs done since the last round (waited for, not slept for).
        at_least = min(one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'done'") + 5, 150)
        wait_for(lambda n=at_least: one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'done'") >= n,
                 "the workers to complete jobs between the rounds")
        # Every worker's LISTEN connection is up (again) before it is killed: the second round
        # kills the restored ones, however long a loaded machine took to reconnect.
        wait_for(lambda: len(client_backends(conn, "pgq-listen%")) == 3, "every worker to LISTEN")
        victims = client_backends(conn)
        assert len(victims) >= 4  # the listeners, the pools' connections, the producer
        terminate(conn, victims)
        killed += len(victims)
    producer.join(DEADLINE)
    assert producer.error is None and len(producer.ids) == 150 and producer.reconnects >= 1
    ids = producer.ids
    wait_for(lambda: one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'done' AND id = ANY (%s)",
                         (ids,)) == len(ids), "every job to be done")
    # Re-LISTENed: each worker has a listener again, and NOTIFY still wakes it at once.
    wait_for(lambda: len(client_backends(conn, "pgq-listen%")) == 3, "every worker to LISTEN again")
    assert all(w.process.poll() is None for w in workers)
    # The backend shows up at connect, the log line only after its LISTEN: wait for the line.
    wait_for(lambda: all(w.logged("LISTEN restored") for w in workers), "every worker to log LISTEN restored")
    assert_done_exactly_once(conn, ids)
    assert one(conn, "SELECT count(*) FROM pgq.jobs") == len(ids)
    for w in workers:
        assert w.stop() == 0


# 15 -----------------------------------------------------------------------------------------------

@pytest.fixture
def own_server() -> Iterator[embedded.ThrowawayPostgres]:
    """A throwaway server of this test's own: it is crashed and restarted."""
    server = embedded.start()
    try:
        yield server
    finally:
        server.stop()


def restart(server: embedded.ThrowawayPostgres) -> None:
    """Start the server again on the same data directory and port (crash recovery runs first)."""
    assert server.child_process is None, "crash() it first"
    server.start()


@pytest.mark.slow
def test_committed_enqueues_and_completions_survive_an_immediate_shutdown_of_postgres(
        own_server: embedded.ThrowawayPostgres, spawn) -> None:
    with psycopg.connect(own_server.dsn_for("postgres"), autocommit=True) as admin:
        admin.execute("CREATE DATABASE crashme")
    dsn = own_server.dsn_for("crashme")
    migrate(dsn)
    workers = [spawn(dsn, STEADY_LEASE="2", STEADY_CONCURRENCY="3") for _ in range(2)]
    # Long enough (about 12 s of enqueues) to be still producing when the crash comes.
    producer = Producer(dsn, count=400, interval=0.03)
    producer.start()
    with psycopg.connect(dsn, autocommit=True) as before:
        wait_for(lambda: one(before, "SELECT count(*) FROM pgq.jobs WHERE state = 'done'") >= 20,
                 "the workers to complete some jobs")
        done_before = dict(before.execute(
            "SELECT id, attempt FROM pgq.jobs WHERE state = 'done'").fetchall())
    committed_before = len(producer.ids)
    own_server.crash()  # SIGQUIT: immediate shutdown, no checkpoint
    time.sleep(1.0)
    restart(own_server)
    producer.join(DEADLINE * 2)
    assert producer.error is None and len(producer.ids) == 400 and producer.reconnects >= 1
    assert len(done_before) >= 20 and committed_before < 400

    with psycopg.connect(dsn, autocommit=True) as conn:
        ids = producer.ids
        wait_for(lambda: one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'done' AND id = ANY (%s)",
                             (ids,)) == len(ids), "every committed job to be done after the restart")
        # Completions committed before the crash are kept, by the same attempt.
        after = dict(conn.execute("SELECT id, attempt FROM pgq.jobs WHERE id = ANY (%s)",
                                  (list(done_before),)).fetchall())
        assert after == done_before
        assert_done_exactly_once(conn, ids)
        assert one(conn, "SELECT count(*) FROM pgq.jobs") == len(ids)
    assert all(w.process.poll() is None for w in workers)
    for w in workers:
        assert w.stop() == 0


# 16 -----------------------------------------------------------------------------------------------

# A job is picked up by polling when notifications do not work. Each test waits for the condition
# (the job done) and shows that no notification can have woken the worker; how long a job waits
# for a poll is the benchmark's "polling only" row, not a timed test.
POLL = 0.5


@pytest.mark.slow
@pytest.mark.parametrize("how", ["listen_off", "notify_off", "listener_killed_again_and_again"])
def test_workers_pick_up_jobs_by_polling_without_notifications(
        spawn, conn: psycopg.Connection, how: str) -> None:
    settings = {"STEADY_POLL": str(POLL), "STEADY_LEASE": "5"}
    if how == "listen_off":
        settings["STEADY_LISTEN"] = "0"
    if how == "notify_off":
        conn.execute("SELECT pgq.configure_queue('default', notify => false)")
    worker = spawn(**settings)
    first = enqueue(conn)
    wait_for(lambda: job(conn, first)["state"] == "done", "the worker to start")
    stop = threading.Event()
    kills = [0]
    killer = None
    if how == "listener_killed_again_and_again":
        assert wait_for(lambda: client_backends(conn, "pgq-listen%"), "the listener")

        def kill_listeners() -> None:
            with psycopg.connect(conn.info.dsn, autocommit=True) as control:
                while not stop.is_set():
                    for pid in client_backends(control, "pgq-listen%"):
                        if control.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()[0]:
                            kills[0] += 1
                    time.sleep(0.02)

        killer = threading.Thread(target=kill_listeners, daemon=True)
        killer.start()
        wait_for(lambda: kills[0] > 0, "the killer to kill the listener")
    with psycopg.connect(conn.info.dsn, autocommit=True) as ear:
        ear.execute("LISTEN pgq")  # what pgq sends, seen from outside
        try:
            heard = []
            for _ in range(4):
                time.sleep(random.uniform(0.1, 0.6))  # enqueue at a random point of the poll period
                job_id = enqueue(conn)
                wait_for(lambda job_id=job_id: job(conn, job_id)["state"] == "done", f"job {job_id} to be done")
                heard += [n.payload for n in ear.notifies(timeout=0.01)]
                if how == "listen_off":
                    assert client_backends(conn, "pgq-listen%") == [], "a LISTEN connection exists"
        finally:
            stop.set()
            if killer is not None:
                killer.join(5)
    if how == "notify_off":
        assert heard == [], f"notifications were sent: {heard}"
    if how == "listener_killed_again_and_again":
        assert kills[0] > 0
    assert worker.stop() == 0


# 27 -----------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_worker_whose_clock_is_skewed_by_minutes_behaves_exactly_like_one_whose_clock_is_right(
        spawn, conn: psycopg.Connection) -> None:
    """Leases are measured by the database clock only. Each worker takes a job that runs 2.5 times
    its queue's 4-second lease: it must renew in time by the database's clock, so a worker that
    trusted its own (10 minutes off) would renew far too late (-10 min) or keep too short a lease.
    (4 s, not 2 s: renewing at a third of the lease, a 2 s lease left 1.3 s for a renewal that a
    loaded machine schedules late; the 10-minute skew dwarfs either.)"""
    libfaketime = next((p for p in LIBFAKETIME if Path(p).exists()), None)
    skews = {"right": 0, "behind": -600, "ahead": 600}
    for queue in skews:
        conn.execute("SELECT pgq.configure_queue(%s, lease => '4 seconds')", (queue,))
    workers = {}
    for queue, skew in skews.items():
        settings = {"STEADY_QUEUES": queue, "STEADY_POLL": "0.2", "STEADY_SWEEP": "0.5"}
        if skew and libfaketime:
            # The whole process (Python, libpq) sees a wall clock that is off. Only the wall clock
            # is wrong on such a machine; with a faked monotonic clock too, libfaketime makes
            # Python's timed waits hang.
            settings.update(LD_PRELOAD=libfaketime, FAKETIME=f"{skew:+d}s", FAKETIME_DONT_FAKE_MONOTONIC="1")
        elif skew:
            settings.update(STEADY_SKEW=str(skew))  # time.time() patched in the app
        workers[queue] = spawn(**settings)
    jobs = {queue: [enqueue(conn, queue, seconds=10), enqueue(conn, queue, seconds=0)] for queue in skews}
    for queue, ids in jobs.items():
        for job_id in ids:
            # Done, or claimed a second time (its lease ran out): the histories below tell which.
            wait_for(lambda job_id=job_id: job(conn, job_id)["state"] == "done" or job(conn, job_id)["attempt"] > 1,
                     f"job {job_id} of {queue} to be done")
    histories = {queue: [[(e[0], e[1]) for e in events(conn, i)] for i in ids] for queue, ids in jobs.items()}
    assert histories["behind"] == histories["ahead"] == histories["right"] == [
        [("claimed", 1), ("completed", 1)], [("claimed", 1), ("completed", 1)]]
    # The skew was real: the skewed workers logged their own (wrong) wall-clock time.
    stamps = {queue: w.log.read_text()[:19] for queue, w in workers.items()}
    for queue, skew in skews.items():
        logged = datetime.strptime(stamps[queue], "%Y-%m-%d %H:%M:%S")
        right = datetime.strptime(stamps["right"], "%Y-%m-%d %H:%M:%S")
        assert abs((logged - right).total_seconds() - skew) < 60, stamps
    for w in workers.values():
        assert w.stop() == 0
