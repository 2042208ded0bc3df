"""Issue 41, deleting by filter: pgq.delete_jobs deletes at most limit_rows jobs of a queue in one
state (pending, waiting, done, failed, cancelled; never a running one), oldest first, with their
events and steps, as pgq.prune deletes a finished job. What others see stays consistent: a pending
or waiting job is cancelled first, so the jobs waiting for it, its batch and its unique key see it
end. A job another transaction holds is skipped, never waited for. Race: a deleter against workers
claiming and completing: every job is either deleted, never handed out, or handed out and
completed, never deleted under its worker."""

from __future__ import annotations

import threading

import psycopg
import pytest

from sqlhelpers import claim, job, one


def delete(conn: psycopg.Connection, state: str, queue: str = "q", **more: object) -> int:
    args = "".join(f", {k} => %({k})s" for k in more)
    return int(one(conn, f"SELECT pgq.delete_jobs(%(queue)s, %(state)s{args})", {"queue": queue, "state": state,
                                                                              **more}))


def exists(conn: psycopg.Connection, job_id: int) -> bool:
    return conn.execute("SELECT FROM pgq.jobs WHERE id = %s", (job_id,)).fetchone() is not None


def finish(conn: psycopg.Connection, queue: str = "q", n: int = 1) -> list[int]:
    """Claims and completes n jobs of the queue: their ids."""
    done = []
    for c in claim(conn, queues=[queue], batch=n):
        assert one(conn, "SELECT pgq.complete(%s, %s)", (c["id"], c["attempt"])) is True
        done.append(c["id"])
    return done


def test_it_deletes_the_jobs_of_a_queue_in_a_state_oldest_first_bounded_per_call(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('q', audit => true)")
    a = [one(conn, "SELECT pgq.enqueue('q', 'a')") for _ in range(5)]
    b = one(conn, "SELECT pgq.enqueue('q', 'b')")
    other = one(conn, "SELECT pgq.enqueue('other', 'a')")
    finish(conn, n=6)
    finish(conn, "other")
    pending = one(conn, "SELECT pgq.enqueue('q', 'a')")
    assert delete(conn, "done", kind="a", limit_rows=2) == 2
    assert [exists(conn, i) for i in a] == [False, False, True, True, True]
    assert one(conn, "SELECT count(*) FROM pgq.job_events WHERE job_id = ANY (%s)", (a[:2],)) == 0
    assert delete(conn, "done", kind="a") == 3
    assert delete(conn, "done", kind="a") == 0
    assert exists(conn, b) and exists(conn, other) and exists(conn, pending)
    assert delete(conn, "done") == 1 and not exists(conn, b)


def test_before_is_when_a_job_was_created_or_when_it_finished(conn: psycopg.Connection) -> None:
    old = one(conn, "SELECT pgq.enqueue('q', 'k')")
    (done,) = finish(conn)
    middle = one(conn, "SELECT clock_timestamp()")
    new = one(conn, "SELECT pgq.enqueue('q', 'k')")
    assert delete(conn, "pending", before=middle) == 0
    assert delete(conn, "done", before=middle) == 1 and not exists(conn, done)
    assert old == done
    assert delete(conn, "pending", before=one(conn, "SELECT clock_timestamp()")) == 1 and not exists(conn, new)


@pytest.mark.parametrize("state", ["running", "outcome_unknown"])
def test_a_started_job_is_never_deleted(conn: psycopg.Connection, state: str) -> None:
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k')")
    (c,) = claim(conn)
    if state == "outcome_unknown":
        conn.execute("SELECT pgq.mark_unknown(%s, %s, 'n')", (job_id, c["attempt"]))
    with pytest.raises(psycopg.errors.InvalidParameterValue, match='argument "state"'):
        delete(conn, state)
    assert job(conn, job_id)["state"] == state


@pytest.mark.parametrize("mode,after", [("all_done", "cancelled"), ("all_ended", "pending")])
def test_the_jobs_waiting_for_a_deleted_job_see_it_cancelled(conn: psycopg.Connection, mode: str, after: str) -> None:
    dependency = one(conn, "SELECT pgq.enqueue('q', 'k')")
    dependant = one(conn, "SELECT pgq.enqueue('other', 'k', depends_on => ARRAY[%s]::bigint[], dependency_mode => %s)",
                    (dependency, mode))
    below = one(conn, "SELECT pgq.enqueue('other', 'k', depends_on => ARRAY[%s]::bigint[])", (dependant,))
    assert delete(conn, "pending") == 1 and not exists(conn, dependency)
    assert job(conn, dependant)["state"] == after
    assert job(conn, below)["state"] == ("cancelled" if after == "cancelled" else "waiting")


def test_a_deleted_waiting_job_is_gone_for_its_dependency_s_end(conn: psycopg.Connection) -> None:
    dependency = one(conn, "SELECT pgq.enqueue('q', 'k')")
    waiting = one(conn, "SELECT pgq.enqueue('q', 'k', depends_on => ARRAY[%s]::bigint[])", (dependency,))
    assert delete(conn, "waiting") == 1 and not exists(conn, waiting)
    assert finish(conn) == [dependency]
    assert one(conn, "SELECT pgq.settle_dependencies()") == 0
    assert claim(conn) == []
    assert one(conn, "SELECT count(*) FROM pgq.jobs") == 1


def test_a_batch_whose_pending_members_are_deleted_fires_its_callback(conn: psycopg.Connection) -> None:
    batch = one(conn, "SELECT pgq.batch_open('q', 'callback')")
    members = [one(conn, "SELECT pgq.enqueue('members', 'k', batch => %s)", (batch,)) for _ in range(2)]
    conn.execute("SELECT pgq.batch_close(%s)", (batch,))
    assert delete(conn, "pending", queue="members") == 2
    assert not any(exists(conn, i) for i in members)
    (callback,) = claim(conn, queues=["q"])
    assert callback["kind"] == "callback"
    assert callback["meta"]["batch"]["cancelled"] == 2


def test_a_deleted_holder_frees_its_unique_key(conn: psycopg.Connection) -> None:
    holder = one(conn, "SELECT pgq.enqueue('q', 'k', unique_key => 'u')")
    assert one(conn, "SELECT pgq.enqueue('q', 'k', unique_key => 'u')") == holder
    assert delete(conn, "pending") == 1
    assert one(conn, "SELECT pgq.enqueue('q', 'k', unique_key => 'u')") != holder


def test_a_job_another_transaction_holds_is_skipped_not_waited_for(conn: psycopg.Connection, dsn: str) -> None:
    held, free = one(conn, "SELECT pgq.enqueue('q', 'k')"), one(conn, "SELECT pgq.enqueue('q', 'k')")
    finish(conn, n=2)
    with psycopg.connect(dsn) as holder:  # a foreign key's lock: KEY SHARE, which a DELETE's lock conflicts with
        holder.execute("SELECT FROM pgq.jobs WHERE id = %s FOR KEY SHARE", (held,))
        conn.execute("SET lock_timeout = '100ms'")  # (the call's own 5 s would apply; it never waits)
        assert delete(conn, "done") == 1
        assert exists(conn, held) and not exists(conn, free)
        holder.rollback()
    assert delete(conn, "done") == 1 and not exists(conn, held)


def test_a_finished_job_whose_end_is_still_to_be_checked_is_left_for_a_later_call(conn: psycopg.Connection) -> None:
    one(conn, "SELECT pgq.enqueue('q', 'k')")
    (done,) = finish(conn)
    conn.execute("INSERT INTO pgq.overlap_checks (job_id, login) VALUES (%s, current_user)", (done,))
    assert delete(conn, "done") == 0 and exists(conn, done)
    conn.execute("SELECT pgq.settle_dependencies()")  # settles the check
    assert one(conn, "SELECT count(*) FROM pgq.overlap_checks WHERE job_id = %s", (done,)) == 0
    assert delete(conn, "done") == 1 and not exists(conn, done)


def test_a_deleter_racing_workers_never_deletes_a_job_under_its_worker(conn: psycopg.Connection, dsn: str) -> None:
    n = 600
    ids = [r[0] for r in conn.execute(
        "SELECT pgq.enqueue_many('q', 'k', array_agg('{}'::jsonb)) FROM generate_series(1, %s)", (n,)).fetchall()]
    handed: list[int] = []
    deleted = 0
    errors: list[BaseException] = []
    lock = threading.Lock()
    started = threading.Barrier(3)

    def worker(name: str) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                started.wait(timeout=60)
                while True:
                    rows = c.execute("SELECT id, attempt FROM pgq.claim(%s, ARRAY['q'], 5)", (name,)).fetchall()
                    if not rows and c.execute("SELECT FROM pgq.jobs WHERE state = 'pending'").fetchone() is None:
                        return
                    for job_id, attempt in rows:
                        assert c.execute("SELECT pgq.complete(%s, %s)", (job_id, attempt)).fetchone() == (True,)
                    with lock:
                        handed.extend(r[0] for r in rows)
        except BaseException as exc:  # noqa: BLE001 (reported by the test)
            errors.append(exc)

    def deleter() -> None:
        nonlocal deleted
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                started.wait(timeout=60)
                while (got := delete(c, "pending", limit_rows=20)) > 0:
                    deleted += got
        except BaseException as exc:  # noqa: BLE001 (reported by the test)
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(2)] + [threading.Thread(target=deleter)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert not [t for t in threads if t.is_alive()]
    left = {r[0]: r[1] for r in conn.execute("SELECT id, state FROM pgq.jobs").fetchall()}
    # Each job handed out once and done; each other job deleted; none both.
    assert len(handed) == len(set(handed))
    assert left == dict.fromkeys(handed, "done")
    assert deleted == n - len(handed) and sorted(set(ids) - set(handed)) == sorted(set(ids) - set(left))
    assert deleted > 0 and handed  # both sides ran (they start together)
