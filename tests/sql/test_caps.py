"""Per-queue concurrency caps: never more than max_running jobs of a queue running at once."""

from __future__ import annotations

import random
import threading
import time

import psycopg
import pytest

from sqlhelpers import claim, expire_lease, one, wait_for


def test_many_concurrent_claimers_never_pass_the_cap(dsn: str, conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('capped', max_running => 3, audit => false)")
    conn.execute("SELECT pgq.enqueue_many('capped', 'k', array_fill('{}'::jsonb, ARRAY[300]))")
    stop = threading.Event()
    errors: list[BaseException] = []
    observed: list[int] = []

    def claimer(seed: int) -> None:
        rng = random.Random(seed)
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                while not stop.is_set():
                    rows = c.execute("SELECT id, attempt FROM pgq.claim('w', '{capped}', batch => 2)").fetchall()
                    if not rows:
                        time.sleep(0.002)
                    for job_id, attempt in rows:
                        time.sleep(rng.random() * 0.004)
                        c.execute("SELECT pgq.complete(%s, %s)", (job_id, attempt))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    def monitor() -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            while not stop.is_set():
                observed.append(one(c, "SELECT count(*) FROM pgq.jobs WHERE queue = 'capped' AND state = 'running'"))

    # First, all eight claim at once behind a barrier and hold what they got: together they must
    # get at most the cap, whatever the interleaving — no sampling involved. (A claim that finds
    # the queue's row held by another claim skips the queue for that call, so they may get less;
    # one more claim, alone, then reaches the cap exactly.)
    barrier = threading.Barrier(8)
    held: list[list[tuple[int, int]]] = [[] for _ in range(8)]

    def first_claim(i: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            barrier.wait(30)
            held[i] = c.execute("SELECT id, attempt FROM pgq.claim('w', '{capped}', batch => 2)").fetchall()

    starters = [threading.Thread(target=first_claim, args=(i,)) for i in range(8)]
    for t in starters:
        t.start()
    for t in starters:
        t.join(timeout=60)
    assert 1 <= sum(len(h) for h in held) <= 3, held
    held.append(conn.execute("SELECT id, attempt FROM pgq.claim('w', '{capped}', batch => 3)").fetchall())
    assert sum(len(h) for h in held) == 3, held
    for job_id, attempt in (pair for h in held for pair in h):
        conn.execute("SELECT pgq.complete(%s, %s)", (job_id, attempt))

    # Then they churn through the rest while a sampler watches: no sample may exceed the cap.
    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(8)] + [threading.Thread(target=monitor)]
    for t in threads:
        t.start()
    wait_for(lambda: one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'done'") == 300 and len(observed) > 50,
             "all 300 jobs done and 50 samples taken", timeout=120)
    stop.set()
    for t in threads:
        t.join(timeout=30)
    assert not errors, errors
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'done'") == 300
    assert max(observed) <= 3, f"running counts seen: max {max(observed)}"


def test_a_cap_of_one_makes_the_queue_serial(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('serial', max_running => 1)")
    conn.execute("SELECT pgq.enqueue_many('serial', 'k', array_fill('{}'::jsonb, ARRAY[5]))")
    first = claim(conn, queues=["serial"], batch=5)
    assert len(first) == 1
    assert claim(conn, queues=["serial"], batch=5) == []
    conn.execute("SELECT pgq.complete(%s, %s)", (first[0]["id"], first[0]["attempt"]))
    assert len(claim(conn, queues=["serial"], batch=5)) == 1


def test_an_expired_lease_frees_its_slot_only_by_being_recovered(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('serial', max_running => 1)")
    conn.execute("SELECT pgq.enqueue_many('serial', 'k', array_fill('{}'::jsonb, ARRAY[2]))")
    [held] = claim(conn, queues=["serial"])
    expire_lease(conn, held["id"])
    [again] = claim(conn, queues=["serial"])  # the claim recovers the expired job first...
    assert again["id"] == held["id"] and again["attempt"] == 2  # ...and it is the one taken again
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'running'") == 1


def test_a_capped_queue_at_its_cap_does_not_hold_up_other_queues(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('capped', max_running => 1)")
    conn.execute("SELECT pgq.enqueue_many('capped', 'k', array_fill('{}'::jsonb, ARRAY[3]))")
    conn.execute("SELECT pgq.enqueue_many('free', 'k', array_fill('{}'::jsonb, ARRAY[3]))")
    claimed = claim(conn, queues=["capped", "free"], batch=10)
    assert sorted(c["queue"] for c in claimed) == ["capped", "free", "free", "free"]


def test_max_running_zero_removes_the_cap(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('q', max_running => 1)")
    conn.execute("SELECT pgq.configure_queue('q', max_running => 0)")
    conn.execute("SELECT pgq.enqueue_many('q', 'k', array_fill('{}'::jsonb, ARRAY[4]))")
    assert len(claim(conn, queues=["q"], batch=4)) == 4


@pytest.mark.parametrize("value, sqlstate", [(-1, "22023"), (100001, "22023")])
def test_bad_max_running_is_refused(conn: psycopg.Connection, value: int, sqlstate: str) -> None:
    with pytest.raises(psycopg.Error) as err:
        conn.execute("SELECT pgq.configure_queue('q', max_running => %s)", (value,))
    assert err.value.sqlstate == sqlstate and '"max_running"' in err.value.diag.message_primary
    assert one(conn, "SELECT count(*) FROM pgq.queues") == 0


def test_a_capped_claim_outside_read_committed_is_refused(dsn: str, conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('capped', max_running => 2)")
    conn.execute("SELECT pgq.enqueue('capped', 'k')")
    with psycopg.connect(dsn) as tx:
        tx.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        with pytest.raises(psycopg.Error) as err:
            tx.execute("SELECT * FROM pgq.claim('w', '{capped}')")
        assert err.value.sqlstate == "55000" and "READ COMMITTED" in err.value.diag.message_primary
        tx.rollback()
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'running'") == 0
