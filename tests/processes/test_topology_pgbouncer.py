"""pgq through a real PgBouncer in pool_mode = transaction (pgq_thin.testing.topology.PgBouncer, in
front of a throwaway server): consecutive transactions of one client connection may run on
different server connections, so nothing may rely on session state or server-side prepared
statements. ``pooled=True`` is the one switch; without it the error says so."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from pgq_thin import Client
from pgq_thin.errors import PgqError
from pgq_thin.testing.server import Databases
from pgq_thin.testing.topology import PgBouncer, pgbouncer_program

from sqlhelpers import LOWER_LEASE_FLOOR

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(pgbouncer_program() is None, reason="pgbouncer is not installed "
                                 "(scripts/test.sh installs Debian's package when run as root)")]


@pytest.fixture(scope="module")
def bounced() -> Iterator[tuple[Databases, PgBouncer]]:
    with Databases(prefix="pgb") as dbs:
        assert dbs.server is not None
        with PgBouncer(dbs.server.port, pool_mode="transaction", pool_size=10) as bouncer:
            yield dbs, bouncer


@pytest.fixture
def through(bounced: tuple[Databases, PgBouncer]) -> Iterator[tuple[str, str]]:
    """(the DSN through PgBouncer, the direct DSN) of a fresh pgq database."""
    dbs, bouncer = bounced
    name = dbs.new_name()
    direct = dbs.migrated(name)
    yield bouncer.dsn(name), direct
    dbs.drop(name)


def test_the_client_works_through_transaction_pooling(through: tuple[str, str]) -> None:
    dsn, _ = through
    with Client(dsn, pooled=True, max_size=4) as client:
        assert client.version().isdigit()
        first = client.enqueue("mail", "send", {"n": 0})
        more = client.enqueue_many("mail", "send", [{"n": i} for i in range(1, 6)])
        jobs = client.claim("w1", ["mail"], batch=6)
        assert sorted(j.id for j in jobs) == sorted([first, *more])
        by_id = {j.id: j for j in jobs}
        assert client.renew(first, by_id[first].attempt) is not None
        assert client.complete(first, by_id[first].attempt, {"ok": True})
        assert client.fail(more[0], by_id[more[0]].attempt, "boom", retry_in=3600) == "pending"
        assert client.snooze(more[1], by_id[more[1]].attempt, 3600) is not None
        assert client.release(more[2], by_id[more[2]].attempt)
        assert client.complete_many(more[3:], [by_id[i].attempt for i in more[3:]]) == more[3:]
        assert client.get_job(first).result == {"ok": True}
        assert [e.event for e in client.job_history(first)] == ["claimed", "completed"]
        (stats,) = client.stats()
        assert (stats.queue, stats.done) == ("mail", 3)
        # Many calls, over whichever server connections PgBouncer picks: the released job once.
        claimed = [j.id for _ in range(20) for j in client.claim("w1", ["mail"])]
        assert claimed == [more[2]]


def test_without_pooled_a_prepared_statement_error_names_the_switch(through: tuple[str, str]) -> None:
    """A prepared statement lives on one server connection; the next transaction of the same client
    connection runs on another one (the first is held by someone else), where it does not exist."""
    dsn, _ = through
    for pooled in (False, True):
        with Client(dsn, pooled=pooled, max_size=1) as client:
            client.enqueue("q", "k")                       # prepared on server connection X
            with psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as holder:
                holder.execute("BEGIN")
                holder.execute("SELECT 1")                 # holds X (the only idle one) ...
                if pooled:
                    assert client.enqueue("q", "k") > 0    # ... so this runs on a new one: fine
                else:
                    with pytest.raises(PgqError) as caught:
                        client.enqueue("q", "k")
                    assert "pooled=True" in str(caught.value)
                    assert "transaction-pooling" in str(caught.value)
                    assert caught.value.sqlstate in ("26000", "42P05")
                holder.execute("ROLLBACK")


def test_producers_enqueue_in_their_own_transactions_through_the_pooler(through: tuple[str, str]) -> None:
    dsn, direct = through
    with psycopg.connect(direct, autocommit=True) as admin:
        admin.execute("CREATE TABLE orders (id int PRIMARY KEY)")
    with Client(dsn, pooled=True) as client, \
            psycopg.connect(dsn, prepare_threshold=None) as conn:
        with conn.transaction():
            conn.execute("INSERT INTO orders VALUES (1)")
            kept = client.enqueue("orders", "ship", {"order": 1}, conn=conn)
        with pytest.raises(RuntimeError), conn.transaction():
            conn.execute("INSERT INTO orders VALUES (2)")
            lost = client.enqueue("orders", "ship", {"order": 2}, conn=conn)
            raise RuntimeError("the business transaction fails")
        with psycopg.connect(direct) as check:
            assert check.execute("SELECT array_agg(id) FROM orders").fetchone() == ([1],)
            assert check.execute("SELECT array_agg(id) FROM pgq.jobs").fetchone() == ([kept],)
        assert lost != kept


def test_owner_writes_stay_fenced_through_the_pooler(through: tuple[str, str]) -> None:
    dsn, direct = through
    with Client(dsn, pooled=True) as client:
        job_id = client.enqueue("q", "k")
        (old,) = client.claim("old", ["q"])
        with psycopg.connect(direct, autocommit=True) as admin:  # the old owner's lease runs out
            admin.execute("UPDATE pgq.jobs SET lease_until = now() - interval '1 second' WHERE id = %s", (job_id,))
            admin.execute(LOWER_LEASE_FLOOR)  # by hand the lease lies below the claims' floor
        (new,) = client.claim("new", ["q"])                      # recovered and claimed again
        assert new.id == job_id and new.attempt == old.attempt + 1
        assert client.complete(job_id, old.attempt, {"by": "old"}) is False
        assert client.renew(job_id, old.attempt) is None
        assert client.complete(job_id, new.attempt, {"by": "new"}) is True
        assert client.get_job(job_id).result == {"by": "new"}


@pytest.mark.parametrize("mode", ["session", "statement"])
def test_what_works_in_the_other_pooling_modes(bounced: tuple[Databases, PgBouncer], mode: str) -> None:
    """Session mode: a client keeps its server connection, so everything works, prepared
    statements and LISTEN included. Statement mode: every call of the client works (each is one
    autocommit statement), but a producer's own transaction is refused by PgBouncer."""
    dbs, _ = bounced
    assert dbs.server is not None
    name = dbs.new_name()
    dbs.migrated(name)
    try:
        with PgBouncer(dbs.server.port, pool_mode=mode, pool_size=4) as bouncer:
            dsn = bouncer.dsn(name)
            with Client(dsn, pooled=(mode == "statement")) as client:
                job_id = client.enqueue("q", "k")
                (job,) = client.claim("w", ["q"])
                assert client.complete(job.id, job.attempt) and client.get_job(job_id).state == "done"
            with psycopg.connect(dsn, prepare_threshold=None, autocommit=True) as conn:
                if mode == "session":
                    conn.execute("LISTEN pgq")
                    with Client(dsn) as client:
                        client.enqueue("q", "k")
                    assert [n.payload for n in conn.notifies(timeout=10, stop_after=1)] == ["q"]
                else:
                    with pytest.raises(psycopg.Error, match="transaction blocks not allowed"):
                        with conn.transaction():
                            conn.execute("SELECT pgq.enqueue('q', 'k')")
    finally:
        dbs.drop(name)


def _ledger(direct: str, lease: str = "2 seconds") -> None:
    from pgq_tools import soak

    with psycopg.connect(direct, autocommit=True) as conn:
        conn.execute(soak._LEDGER_DDL)
        conn.execute("SELECT pgq.configure_queue(%s, lease => %s::interval, backoff_base => '100 ms')",
                     (soak.QUEUE, lease))


def test_worker_processes_drain_through_the_pooler_and_a_killed_workers_job_is_recovered(
        through: tuple[str, str], tmp_path) -> None:
    """Real `pgq-thin worker --pooled` processes through PgBouncer in transaction mode: they drain
    the queue; one is killed with -9 while it runs a job, whose lease then expires and another
    worker runs it; every job is done once, no attempt executed twice, and the killed attempt's
    late write would be refused."""
    from pgq_thin.testing.topology import wait_for
    from pgq_tools.fleet import Fleet, worker_command
    from pgq_tools.soak import QUEUE

    dsn, direct = through
    _ledger(direct)
    with psycopg.connect(direct, autocommit=True) as conn:
        long_job = conn.execute("SELECT pgq.enqueue(%s, 'soak.work', '{\"ms\": 3000}', priority => 1)",
                                (QUEUE,)).fetchone()[0]  # type: ignore[index]
        conn.execute("SELECT pgq.enqueue_many(%s, 'soak.work', array_fill('{\"ms\": 5}'::jsonb, ARRAY[200]))",
                     (QUEUE,))
    fleet = Fleet(tmp_path)
    try:
        def start(name: str) -> None:
            fleet.start(name, worker_command("pgq_tools.soak_app:worker", dsn) + ["--pooled"],
                        env={"PGQ_SOAK_WORKER": name, "PGQ_SOAK_LEASE": "2"})

        start("victim")
        with psycopg.connect(direct, autocommit=True) as conn:
            victim = wait_for(lambda: conn.execute(
                "SELECT attempt FROM pgq.jobs WHERE id = %s AND state = 'running' AND claimed_by = 'victim'",
                (long_job,)).fetchone(), "the victim to run the long job", timeout=60)[0]
            wait_for(lambda: conn.execute("SELECT count(*) FROM pgq_soak.effects WHERE job_id = %s",
                                          (long_job,)).fetchone()[0], "its effect")  # type: ignore[index]
            fleet["victim"].kill()                                   # kill -9 mid-job
            start("w1")
            start("w2")
            wait_for(lambda: conn.execute("SELECT count(*) = 0 FROM pgq.jobs WHERE state <> 'done'").fetchone()[0],
                     "every job done", timeout=120)  # type: ignore[index]
            events = [r[0] for r in conn.execute(
                "SELECT event FROM pgq.job_events WHERE job_id = %s AND attempt = %s ORDER BY id", (long_job, victim))]
            assert events[:2] == ["claimed", "lease_expired"], events
            assert conn.execute("SELECT pgq.complete(%s, %s)", (long_job, victim)).fetchone() == (False,)
            assert conn.execute("SELECT count(*) FROM pgq.jobs").fetchone() == (201,)
            twice = conn.execute("SELECT count(*) FROM (SELECT job_id, attempt FROM pgq_soak.effects"
                                 " GROUP BY 1, 2 HAVING count(*) > 1) AS x").fetchone()
            assert twice == (0,)
            completed_twice = conn.execute("SELECT count(*) FROM (SELECT job_id FROM pgq.job_events"
                                           " WHERE event = 'completed' GROUP BY 1 HAVING count(*) > 1) AS x").fetchone()
            assert completed_twice == (0,)
    finally:
        fleet.stop()


def test_the_pooled_switch_of_the_worker() -> None:
    from pgq_thin.worker import POOLED_POLL_INTERVAL, Worker

    pooled = Worker(["q"], pooled=True)
    assert (pooled.pooled, pooled.listen, pooled.poll_interval) == (True, False, POOLED_POLL_INTERVAL)
    assert Worker(["q"], pooled=True, poll_interval=2.0).poll_interval == 2.0
    plain = Worker(["q"])
    assert (plain.pooled, plain.listen, plain.poll_interval) == (False, True, 1.0)


def test_a_pooled_worker_drains_through_transaction_pooling_in_process(through: tuple[str, str], runtime: str) -> None:
    """Worker(pooled=True) and AsyncWorker(pooled=True), run in-process by the test kit's drain,
    through PgBouncer in transaction mode: every job done, by polling (no LISTEN)."""
    import asyncio

    from pgq_thin import AsyncWorker, Worker
    from pgq_thin.testing import adrain, drain

    dsn, direct = through
    cls = Worker if runtime == "threads" else AsyncWorker
    worker = cls(["q"], concurrency=2, pooled=True, prefetch=0)
    assert (worker.listen, worker.pooled) == (False, True)
    seen: list[int] = []

    @worker.handler("k")
    def handle(job, ctx):  # type: ignore[no-untyped-def]
        seen.append(job.payload["n"])
        return {"n": job.payload["n"]} if job.payload["n"] % 2 else None

    with psycopg.connect(direct, autocommit=True) as conn:
        ids = [r[0] for r in conn.execute(
            "SELECT id FROM pgq.enqueue_many('q', 'k', ARRAY(SELECT jsonb_build_object('n', n)"
            " FROM generate_series(1, 30) AS n)) AS t(id)")]
    result = drain(worker, dsn) if runtime == "threads" else asyncio.run(adrain(worker, dsn))
    assert result.outcomes == {i: "done" for i in ids}
    assert sorted(seen) == list(range(1, 31))


def test_a_pooled_worker_sends_its_completions_with_its_claims_through_the_pooler(
        through: tuple[str, str]) -> None:
    """pgq.complete_and_claim is one statement: a pooled worker's claims carry its completions
    through PgBouncer too. One key at one running job: each claim after the first comes back
    short, so the next carries the completion that frees the key (a job finished by the very
    statement that claimed the next: the same statement timestamp)."""
    import threading

    from pgq_thin.testing.topology import wait_for
    from pgq_thin.worker import Worker

    dsn, direct = through
    with psycopg.connect(direct, autocommit=True) as conn:
        conn.execute("SELECT pgq.configure_queue('q', key_max_running => 1)")
        conn.execute("SELECT pgq.enqueue_many('q', 'k', array_fill('{}'::jsonb, ARRAY[20]), concurrency_key => 'a')")
        worker = Worker(["q"], concurrency=2, pooled=True, sweep_interval=0, name="pooled-carry")
        worker.handler("k")(lambda job, ctx: None)
        errors: list[BaseException] = []

        def run() -> None:
            try:
                worker.run(dsn, install_signal_handlers=False)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        try:
            wait_for(lambda: conn.execute("SELECT count(*) = 20 FROM pgq.jobs WHERE state = 'done'").fetchone()[0]
                     or errors, "every job done", timeout=60)  # type: ignore[index]
        finally:
            worker.stop()
            thread.join(timeout=30)
        assert not errors, errors
        carried = conn.execute("SELECT count(*) FROM pgq.jobs AS a JOIN pgq.jobs AS b"
                               " ON b.claimed_at = a.finished_at AND b.id <> a.id").fetchone()[0]  # type: ignore[index]
        assert carried >= 10, carried
        assert conn.execute("SELECT count(*) FROM pgq.job_events WHERE event = 'completed'").fetchone() == (20,)


def test_a_cancel_reaches_a_pooled_workers_handler_at_its_next_renewal(through: tuple[str, str], runtime: str) -> None:
    """Behind PgBouncer in transaction mode there is no LISTEN, so pgq_cancel reaches nobody: the
    job's next renewal (a third of its 3 s lease) is refused and tells the handler by lease_lost;
    the job stays cancelled and the handler's late outcome is discarded."""
    import threading
    import time

    from pgq_thin import AsyncWorker, Worker

    from sqlhelpers import run_worker, wait_for

    dsn, direct = through
    cls = Worker if runtime == "threads" else AsyncWorker
    worker = cls(["q"], concurrency=1, pooled=True, prefetch=0, lease=3)
    started, saw = threading.Event(), {}

    @worker.handler("long")
    def handle(job, ctx):  # type: ignore[no-untyped-def]
        started.set()
        deadline = time.monotonic() + 60
        while not ctx.should_stop and time.monotonic() < deadline:
            ctx.lease_lost.wait(0.05)
        saw.update(lost=ctx.lease_lost.is_set(), cancelled=ctx.cancelled)
        return {"late": True}

    with psycopg.connect(direct, autocommit=True) as conn:
        job_id = conn.execute("SELECT pgq.enqueue('q', 'long')").fetchone()[0]  # type: ignore[index]
        errors: list[BaseException] = []
        thread = run_worker(worker, dsn, errors)
        try:
            assert started.wait(60), "the handler did not start"
            assert conn.execute("SELECT pgq.cancel(%s)", (job_id,)).fetchone()[0] is True  # type: ignore[index]
            wait_for(lambda: "lost" in saw, "the handler to be told at the next renewal", timeout=30)
        finally:
            worker.stop()
            thread.join(60)
        assert not errors, errors
        assert saw == {"lost": True, "cancelled": False}
        assert conn.execute("SELECT state::text, result FROM pgq.jobs WHERE id = %s",  # type: ignore[index]
                            (job_id,)).fetchone() == ("cancelled", None)
