"""pgq.complete_and_claim (issue 25): a worker's completions and its next claim in one call and
one transaction. It is pgq.complete_many then pgq.claim, with their checks and fences: the claim
sees the completions (a key or a capped queue's place they freed is claimable by the same call), a
stale pair is not completed and does not stop the claim, a bad argument of either part changes
nothing, and many workers completing and claiming this way never run a job twice nor pass a
limit."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import psycopg
import pytest

from sqlhelpers import claim, expire_lease, job, one

COLUMNS = "completed, id, attempt, queue"


def complete_and_claim(conn: psycopg.Connection, ids: list[int], attempts: list[int], worker: str = "w1",
                       queues: list[str] | None = None, batch: int = 1) -> list[dict[str, Any]]:
    cur = conn.execute(f"SELECT {COLUMNS} FROM pgq.complete_and_claim(%s::bigint[], %s::integer[], %s,"
                       " %s::text[], %s)", (ids, attempts, worker, queues, batch))
    return [dict(zip(["completed", "id", "attempt", "queue"], r)) for r in cur.fetchall()]


def test_it_completes_then_claims_and_every_row_carries_the_completed_ids(conn: psycopg.Connection) -> None:
    ids = [one(conn, "SELECT pgq.enqueue('q', 'k')") for _ in range(4)]
    first = claim(conn, queues=["q"], batch=2)
    rows = complete_and_claim(conn, [r["id"] for r in first], [r["attempt"] for r in first], queues=["q"], batch=5)
    assert [r["id"] for r in rows] == ids[2:]
    assert all(sorted(r["completed"]) == ids[:2] for r in rows)
    assert [job(conn, i)["state"] for i in ids] == ["done", "done", "running", "running"]
    assert [job(conn, i)["attempt"] for i in ids[2:]] == [1, 1]


def test_a_call_that_claims_nothing_returns_one_row_with_the_completed_ids(conn: psycopg.Connection) -> None:
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k')")
    [c] = claim(conn, queues=["q"])
    assert complete_and_claim(conn, [job_id], [c["attempt"]], queues=["q"]) == [
        {"completed": [job_id], "id": None, "attempt": None, "queue": None}]
    assert complete_and_claim(conn, [], [], queues=["q"]) == [
        {"completed": [], "id": None, "attempt": None, "queue": None}]


def test_a_stale_pair_is_not_completed_and_the_claim_still_happens(conn: psycopg.Connection) -> None:
    old = one(conn, "SELECT pgq.enqueue('q', 'k')")
    [c] = claim(conn, queues=["q"], worker="a")
    expire_lease(conn, old)
    [again] = claim(conn, queues=["q"], worker="b")  # attempt 2 is b's now
    other = one(conn, "SELECT pgq.enqueue('q', 'k')")
    rows = complete_and_claim(conn, [old], [c["attempt"]], worker="a", queues=["q"])
    assert rows == [{"completed": [], "id": other, "attempt": 1, "queue": "q"}]
    assert job(conn, old)["state"] == "running" and job(conn, old)["attempt"] == again["attempt"] == 2
    assert one(conn, "SELECT count(*) FROM pgq.job_events WHERE job_id = %s AND event = 'rejected'", (old,)) == 1


def test_the_claim_sees_the_key_its_own_completion_freed(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('keyed', key_max_running => 1)")
    conn.execute("SELECT pgq.enqueue_many('keyed', 'k', array_fill('{}'::jsonb, ARRAY[3]), concurrency_key => 'a')")
    [c] = claim(conn, queues=["keyed"], batch=3)  # key a is full now
    assert claim(conn, queues=["keyed"], batch=3) == []
    [row] = complete_and_claim(conn, [c["id"]], [c["attempt"]], queues=["keyed"], batch=3)
    assert row["completed"] == [c["id"]] and row["id"] == c["id"] + 1
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'running'") == 1


def test_the_claim_sees_the_capped_place_its_own_completion_freed(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('capped', max_running => 2)")
    conn.execute("SELECT pgq.enqueue_many('capped', 'k', array_fill('{}'::jsonb, ARRAY[5]))")
    running = claim(conn, queues=["capped"], batch=5)
    assert len(running) == 2
    rows = complete_and_claim(conn, [running[0]["id"]], [running[0]["attempt"]], queues=["capped"], batch=5)
    assert len(rows) == 1 and rows[0]["id"] is not None
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'running'") == 2


@pytest.mark.parametrize("bad, sqlstate", [
    ("batch => 0", "22023"),                 # the claim's check, after the completion ran: rolled back
    ("queues => ARRAY['x;--']", "22023"),
])
def test_a_bad_claim_argument_rolls_back_the_completion_too(conn: psycopg.Connection, bad: str, sqlstate: str) -> None:
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k')")
    [c] = claim(conn, queues=["q"])
    with pytest.raises(psycopg.Error) as err:
        conn.execute(f"SELECT * FROM pgq.complete_and_claim(%s::bigint[], %s::integer[], 'w1', {bad})",
                     ([job_id], [c["attempt"]]))
    assert err.value.sqlstate == sqlstate
    assert job(conn, job_id)["state"] == "running"
    assert one(conn, "SELECT count(*) FROM pgq.job_events WHERE job_id = %s AND event = 'completed'", (job_id,)) == 0


@pytest.mark.slow
def test_many_workers_completing_and_claiming_run_each_job_once_and_hold_a_key_limit(dsn: str,
                                                                                   conn: psycopg.Connection) -> None:
    """8 workers loop on complete_and_claim (batch 5) over 1,000 jobs of 20 keys at most 2 running
    each, while a sampler counts each key's running jobs: every job is done exactly once (one
    completed event each, attempt 1), and no sample sees a key over its limit."""
    conn.execute("SELECT pgq.configure_queue('keyed', key_max_running => 2)")
    conn.execute("SELECT pgq.enqueue('keyed', 'k', concurrency_key => 'key-' || g % 20) "
                 "FROM generate_series(1, 1000) AS g")
    stop = threading.Event()
    errors: list[BaseException] = []
    over: list[int] = []

    def worker(i: int) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                held: list[tuple[int, int]] = []
                while not stop.is_set():
                    rows = c.execute("SELECT id, attempt FROM pgq.complete_and_claim(%s::bigint[], %s::integer[],"
                                     " %s, '{keyed}', 5)", ([h[0] for h in held], [h[1] for h in held],
                                                             f"w{i}")).fetchall()
                    held = [(r[0], r[1]) for r in rows if r[0] is not None]
                    if not held and not one(c, "SELECT count(*) FROM pgq.jobs WHERE state <> 'done'"):
                        return
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    def sampler() -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            while not stop.is_set():
                most = one(c, "SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM pgq.jobs"
                              " WHERE state = 'running' GROUP BY concurrency_key) AS s")
                if most > 2:
                    over.append(most)
                stop.wait(0.001)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    watch = threading.Thread(target=sampler)
    watch.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    stop.set()  # (a worker still looping after 300 s stops here; the counts below then fail)
    watch.join(timeout=30)
    assert not errors, errors
    assert not over, over
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'done' AND attempt = 1") == 1000
    completed = Counter(r[0] for r in conn.execute(
        "SELECT job_id FROM pgq.job_events WHERE event = 'completed'").fetchall())
    assert len(completed) == 1000 and set(completed.values()) == {1}
