"""pgq.claim: the total order, batches, what is never claimed, recovery of expired leases, and
what two sessions claiming at once can and cannot see."""

from __future__ import annotations

import itertools
from datetime import timedelta

import psycopg
import pytest

from sqlfixtures import dsn, module_dsn  # noqa: F401  (one database per module, emptied per test)
from sqlhelpers import claim, events, expire_lease, job, one


def enqueue(conn: psycopg.Connection, queue: str = "q", priority: int = 0, age: str = "0 seconds",
            **extra) -> int:
    """Enqueues a job that became due `age` ago."""
    args = ", ".join(f"{k} => %({k})s" for k in extra)
    return one(conn, f"SELECT pgq.enqueue(%(queue)s, 'k', priority => %(priority)s, "
                     f"run_at => now() - %(age)s::interval{', ' + args if args else ''})",
               {"queue": queue, "priority": priority, "age": age, **extra})


def test_claim_hands_out_jobs_in_total_order_priority_desc_then_run_at_then_id(conn):
    def at(priority: int, run_at: str) -> int:
        return one(conn, "SELECT pgq.enqueue('q', 'k', priority => %s, run_at => %s::timestamptz)",
                   (priority, run_at))

    tie_b = at(0, "2000-01-01 00:00:05+00")
    low_old = at(0, "2000-01-01 00:00:01+00")
    high_new = at(5, "2000-01-01 00:00:09+00")
    tie_a_later_id = at(0, "2000-01-01 00:00:05+00")
    high_old = at(5, "2000-01-01 00:00:02+00")
    negative = at(-3, "1999-01-01 00:00:00+00")
    expected = [high_old, high_new, low_old, tie_b, tie_a_later_id, negative]

    one_by_one = [claim(conn)[0]["id"] for _ in expected]
    assert one_by_one == expected


def test_a_batch_claim_returns_the_best_jobs_in_total_order(conn):
    ids = [enqueue(conn, priority=p, age=f"{10 - i} seconds") for i, p in enumerate([0, 2, 1, 2, 0])]
    got = claim(conn, batch=3)
    assert [g["id"] for g in got] == [ids[1], ids[3], ids[2]]
    assert [g["id"] for g in claim(conn, batch=10)] == [ids[0], ids[4]]
    assert claim(conn, batch=10) == []


def test_claim_returns_every_documented_field(conn):
    job_id = one(conn, "SELECT pgq.enqueue('q', 'kind.x', '{\"p\": 1}', priority => 3, "
                       "max_attempts => 4, tenant => 't')")
    (c,) = claim(conn, worker="worker-1")
    row = job(conn, job_id)
    assert c == {"id": job_id, "queue": "q", "kind": "kind.x", "payload": {"p": 1}, "priority": 3,
                 "attempt": 1, "max_attempts": 4, "run_at": row["run_at"],
                 "created_at": row["created_at"], "lease_until": row["lease_until"], "tenant": "t",
                 "progress": None, "deadline": None, "meta": None}


def test_claim_marks_running_increments_attempt_and_leases_by_the_database_clock(conn):
    job_id = enqueue(conn)
    attempt, now = conn.execute(
        "SELECT c.attempt, statement_timestamp() FROM pgq.claim('w7') AS c").fetchone()
    row = job(conn, job_id)
    assert row["state"] == "running"
    assert row["attempt"] == attempt == 1
    assert row["claimed_by"] == "w7"
    assert row["claimed_at"] == now
    assert row["lease_until"] == now + timedelta(seconds=30)  # the queue's default lease
    assert row["last_event"] == "claimed"
    assert events(conn, job_id) == [("claimed", 1, "pending", "running")]


def test_claim_lease_argument_overrides_the_queue_lease(conn):
    conn.execute("SELECT pgq.configure_queue('q', lease => '2 minutes')")
    enqueue(conn)
    enqueue(conn)
    a, a_now = conn.execute("SELECT c.lease_until, statement_timestamp() FROM pgq.claim('w1') AS c").fetchone()
    b, b_now = conn.execute("SELECT c.lease_until, statement_timestamp() "
                            "FROM pgq.claim('w1', lease => '5 seconds') AS c").fetchone()
    assert a == a_now + timedelta(minutes=2)
    assert b == b_now + timedelta(seconds=5)


def test_claim_skips_jobs_that_are_not_yet_due(conn):
    enqueue(conn, age="-1 hour", priority=100)
    due = enqueue(conn, priority=0)
    assert [c["id"] for c in claim(conn, batch=5)] == [due]
    assert claim(conn) == []


def test_paused_queues_are_never_claimed_and_do_not_use_batch_slots(conn):
    paused = [enqueue(conn, queue="paused", priority=100) for _ in range(3)]
    conn.execute("SELECT pgq.pause('paused')")
    open_ids = [enqueue(conn, queue="open") for _ in range(2)]
    assert sorted(c["id"] for c in claim(conn, batch=2)) == open_ids
    assert claim(conn, queues=["paused"], batch=5) == []
    assert {job(conn, i)["state"] for i in paused} == {"pending"}
    conn.execute("SELECT pgq.resume('paused')")
    assert sorted(c["id"] for c in claim(conn, queues=["paused"], batch=5)) == paused


def test_exhausted_jobs_are_never_claimed_and_do_not_use_batch_slots(conn):
    exhausted = [enqueue(conn, priority=100, max_attempts=2) for _ in range(3)]
    conn.execute("UPDATE pgq.jobs SET attempt = max_attempts WHERE id = ANY(%s)", (exhausted,))
    fine = [enqueue(conn) for _ in range(2)]
    assert sorted(c["id"] for c in claim(conn, batch=2)) == fine
    assert claim(conn, batch=10) == []
    assert {job(conn, i)["state"] for i in exhausted} == {"pending"}
    assert {job(conn, i)["attempt"] for i in exhausted} == {2}


def test_a_multi_queue_claim_merges_the_queues_in_total_order(conn):
    a1 = enqueue(conn, queue="a", priority=1, age="3 seconds")
    b1 = enqueue(conn, queue="b", priority=2, age="1 second")
    a2 = enqueue(conn, queue="a", priority=2, age="2 seconds")
    b2 = enqueue(conn, queue="b", priority=0, age="9 seconds")
    enqueue(conn, queue="c", priority=50)
    got = claim(conn, queues=["a", "b"], batch=3)
    assert [g["id"] for g in got] == [a2, b1, a1]
    assert [g["id"] for g in claim(conn, queues=["b", "a"], batch=3)] == [b2]


def test_claim_with_null_queues_claims_from_every_unpaused_queue(conn):
    ids = {enqueue(conn, queue=q) for q in ("x", "y", "z")}
    assert {c["id"] for c in claim(conn, queues=None, batch=10)} == ids


def test_claim_ignores_queues_it_was_not_asked_for(conn):
    enqueue(conn, queue="other")
    assert claim(conn, queues=["mine"]) == []
    assert claim(conn, queues=["other"]) != []


def test_each_claim_increments_the_attempt(conn):
    job_id = enqueue(conn, max_attempts=5)
    attempts = []
    for _ in range(3):
        (c,) = claim(conn)
        attempts.append(c["attempt"])
        assert one(conn, "SELECT pgq.release(%s, %s)", (job_id, c["attempt"])) is True
    assert attempts == [1, 2, 3]


def test_an_expired_lease_is_reclaimed_by_claim_without_a_sweep(conn):
    job_id = enqueue(conn)
    (first,) = claim(conn, worker="crashed")
    expire_lease(conn, job_id)
    (second,) = claim(conn, worker="rescuer")
    assert second["id"] == job_id and second["attempt"] == first["attempt"] + 1
    row = job(conn, job_id)
    assert row["claimed_by"] == "rescuer" and row["state"] == "running"
    assert "lease expired" in row["last_error"]
    assert events(conn, job_id) == [("claimed", 1, "pending", "running"),
                                    ("lease_expired", 1, "running", "pending"),
                                    ("claimed", 2, "pending", "running")]


def test_an_expired_lease_on_the_last_attempt_fails_the_job_instead_of_reclaiming_it(conn):
    job_id = enqueue(conn, max_attempts=1)
    claim(conn)
    expire_lease(conn, job_id)
    assert claim(conn) == []
    row = job(conn, job_id)
    assert row["state"] == "failed" and row["attempt"] == 1
    assert "lease expired" in row["last_error"] and row["finished_at"] is not None


def test_claim_does_not_take_a_running_job_whose_lease_is_still_valid(conn):
    enqueue(conn)
    claim(conn)
    assert claim(conn) == []


# Two sessions -------------------------------------------------------------------------------------

STEPS = ["a_claim", "b_claim", "a_commit", "b_commit"]
PERMUTATIONS = [p for p in itertools.permutations(STEPS)
                if p.index("a_claim") < p.index("a_commit") and p.index("b_claim") < p.index("b_commit")]


@pytest.mark.parametrize("order", PERMUTATIONS, ids=["-".join(p) for p in PERMUTATIONS])
def test_two_sessions_claiming_never_get_the_same_job(connect, order):
    setup = connect()
    for _ in range(3):
        enqueue(setup)
    sessions = {"a": connect(autocommit=False), "b": connect(autocommit=False)}
    got: dict[str, list[int]] = {}
    for step in order:
        name, action = step.split("_")
        if action == "claim":
            got[name] = [c["id"] for c in claim(sessions[name], worker=name)]
        else:
            sessions[name].commit()
    assert len(got["a"]) == 1 and len(got["b"]) == 1
    assert got["a"] != got["b"]
    running = setup.execute("SELECT id, claimed_by FROM pgq.jobs WHERE state = 'running' ORDER BY id").fetchall()
    assert sorted(running) == sorted([(got["a"][0], "a"), (got["b"][0], "b")])


def test_a_job_locked_by_an_uncommitted_claim_is_skipped_not_waited_for(connect):
    setup = connect()
    first, second = enqueue(setup, priority=1), enqueue(setup)
    a = connect(autocommit=False)
    assert [c["id"] for c in claim(a)] == [first]
    b = connect()
    b.execute("SET lock_timeout = '2s'")
    assert [c["id"] for c in claim(b)] == [second]
    a.rollback()
    assert [c["id"] for c in claim(b)] == [first]


def test_a_key_share_lock_on_a_job_does_not_hide_it_from_claim(connect):
    setup = connect()
    job_id = enqueue(setup)
    holder = connect(autocommit=False)
    # What a foreign key from another table to pgq.jobs takes while the referencing row is written.
    holder.execute("SELECT 1 FROM pgq.jobs WHERE id = %s FOR KEY SHARE", (job_id,))
    worker = connect()
    worker.execute("SET lock_timeout = '2s'")
    assert [c["id"] for c in claim(worker)] == [job_id]
    assert one(worker, "SELECT pgq.complete(%s, 1)", (job_id,)) is True
    holder.rollback()


def test_a_job_cancelled_by_another_session_before_the_claim_is_not_returned(connect):
    setup = connect()
    job_id = enqueue(setup)
    admin = connect(autocommit=False)
    assert one(admin, "SELECT pgq.cancel(%s)", (job_id,)) is True
    worker = connect()
    assert claim(worker) == []  # locked by the cancelling transaction: skipped
    admin.commit()
    assert claim(worker) == []  # cancelled: never claimable
    assert job(setup, job_id)["state"] == "cancelled"
