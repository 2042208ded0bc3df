"""Ephemeral queues (issue 40): pgq.configure_queue(..., keep_done => false) deletes a job as it
completes (pgq.complete, complete_many, complete_and_claim), in the completing transaction and
after its end's effects (the finished counters count it done, its dependants move on). A job that
someone reads after its end is kept: one enqueued with notify_finished, a batch member, a job of a
durable workflow, one with a unique_key (unique_for reads it) and one that other jobs depend on.
Failures and cancellations are kept by their retention. Stale completes are answered as today."""

from __future__ import annotations

import threading

import psycopg
import pytest

from sqlfixtures import dsn, module_dsn, running_job, wait_until_blocked  # noqa: F401  (one database per module)
from sqlhelpers import claim, one


def exists(conn: psycopg.Connection, job_id: int) -> bool:
    return bool(one(conn, "SELECT count(*) FROM pgq.jobs WHERE id = %s", (job_id,)))


def done_count(conn: psycopg.Connection, queue: str = "q") -> int:
    return one(conn, "SELECT done FROM pgq.stats() WHERE queue = %s", (queue,))


def test_keep_done_defaults_to_true_and_null_leaves_it_as_it_is(conn: psycopg.Connection) -> None:
    assert one(conn, "SELECT keep_done FROM pgq.configure_queue('q')") is True
    assert one(conn, "SELECT keep_done FROM pgq.configure_queue('q', keep_done => false)") is False
    assert one(conn, "SELECT keep_done FROM pgq.configure_queue('q', max_attempts => 3)") is False
    assert one(conn, "SELECT keep_done FROM pgq.configure_queue('q', keep_done => true)") is True


@pytest.mark.parametrize("call", ["complete", "complete_many", "complete_and_claim"])
def test_a_completed_job_of_an_ephemeral_queue_is_gone_with_its_events_and_counted_done(
        conn: psycopg.Connection, call: str) -> None:
    conn.execute("SELECT pgq.configure_queue('q', keep_done => false, audit => true)")
    job_id, attempt = running_job(conn)
    if call == "complete":
        assert one(conn, "SELECT pgq.complete(%s, %s, '{\"r\": 1}')", (job_id, attempt)) is True
    elif call == "complete_many":
        assert one(conn, "SELECT array_agg(x) FROM pgq.complete_many(%s, %s) AS x",
                   ([job_id], [attempt])) == [job_id]
    else:
        assert one(conn, "SELECT completed FROM pgq.complete_and_claim(%s, %s, 'w')",
                   ([job_id], [attempt])) == [job_id]
    assert not exists(conn, job_id)
    assert one(conn, "SELECT count(*) FROM pgq.job_events WHERE job_id = %s", (job_id,)) == 0
    assert done_count(conn) == 1
    assert one(conn, "SELECT done_total FROM pgq.metrics() WHERE queue = 'q'") == 1


def test_a_queue_that_keeps_done_jobs_keeps_them(conn: psycopg.Connection) -> None:
    job_id, attempt = running_job(conn)
    assert one(conn, "SELECT pgq.complete(%s, %s)", (job_id, attempt)) is True
    assert one(conn, "SELECT state::text FROM pgq.jobs WHERE id = %s", (job_id,)) == "done"


def test_failures_and_cancellations_are_kept(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('q', keep_done => false, max_attempts => 1)")
    job_id, attempt = running_job(conn)
    assert one(conn, "SELECT pgq.fail(%s, %s, 'boom')", (job_id, attempt)) == "failed"
    other = one(conn, "SELECT pgq.enqueue('q', 'k')")
    conn.execute("SELECT pgq.cancel(%s)", (other,))
    assert one(conn, "SELECT array_agg(state::text ORDER BY id) FROM pgq.jobs") == ["failed", "cancelled"]


def test_a_stale_complete_of_a_deleted_job_is_rejected_as_today(conn: psycopg.Connection) -> None:
    """The same attempt's second complete after the deletion: false (a job that is gone cannot be
    told from one that never was; with keep_done it is true). An earlier attempt's: false, as ever,
    and both write nothing."""
    conn.execute("SELECT pgq.configure_queue('q', keep_done => false, audit => true)")
    job_id, attempt = running_job(conn)
    assert one(conn, "SELECT pgq.complete(%s, %s)", (job_id, attempt)) is True
    assert one(conn, "SELECT pgq.complete(%s, %s)", (job_id, attempt)) is False
    assert one(conn, "SELECT pgq.complete(%s, %s)", (job_id, attempt - 1)) is False
    assert one(conn, "SELECT count(*) FROM pgq.complete_many(%s, %s)", ([job_id], [attempt])) == 0
    assert one(conn, "SELECT pgq.fail(%s, %s, 'late')", (job_id, attempt)) is None
    assert one(conn, "SELECT count(*) FROM pgq.jobs") == 0
    assert one(conn, "SELECT count(*) FROM pgq.job_events") == 0
    assert done_count(conn) == 1


def test_a_dependant_of_an_ephemeral_job_is_released_and_reads_its_result(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('q', keep_done => false)")
    dep_id, attempt = running_job(conn)
    child = one(conn, "SELECT pgq.enqueue('other', 'k', depends_on => ARRAY[%s]::bigint[])", (dep_id,))
    assert one(conn, "SELECT pgq.complete(%s, %s, '{\"out\": 7}')", (dep_id, attempt)) is True
    assert one(conn, "SELECT state::text FROM pgq.jobs WHERE id = %s", (child,)) == "pending"
    assert exists(conn, dep_id)  # kept: its dependant reads it
    (c,) = claim(conn, queues=["other"])
    assert one(conn, "SELECT result FROM pgq.dependency_results(%s, %s)", (c["id"], c["attempt"])) == {"out": 7}
    assert one(conn, "SELECT pgq.complete(%s, %s)", (c["id"], c["attempt"])) is True


def test_the_dependant_itself_is_deleted_when_it_completes(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('q', keep_done => false)")
    dep_id, attempt = running_job(conn)
    child = one(conn, "SELECT pgq.enqueue('q', 'k', depends_on => ARRAY[%s]::bigint[])", (dep_id,))
    assert one(conn, "SELECT pgq.complete(%s, %s)", (dep_id, attempt)) is True
    (c,) = claim(conn, queues=["q"])
    assert c["id"] == child
    assert one(conn, "SELECT pgq.complete(%s, %s)", (child, c["attempt"])) is True
    assert not exists(conn, child) and exists(conn, dep_id)
    assert one(conn, "SELECT count(*) FROM pgq.job_dependants WHERE job_id = %s", (child,)) == 0


def test_a_dependency_enqueued_while_its_job_completes_is_never_cancelled(
        dsn: str, conn: psycopg.Connection) -> None:  # noqa: F811
    """The enqueue reads the ephemeral job running and commits after the completion: the job is kept
    (the enqueue holds it FOR KEY SHARE) and the dependant is released by the next settle."""
    conn.execute("SELECT pgq.configure_queue('q', keep_done => false)")
    dep_id, attempt = running_job(conn)
    with psycopg.connect(dsn) as producer:
        child = one(producer, "SELECT pgq.enqueue('other', 'k', depends_on => ARRAY[%s]::bigint[])", (dep_id,))
        assert one(conn, "SELECT pgq.complete(%s, %s)", (dep_id, attempt)) is True  # does not wait
        producer.commit()
    assert exists(conn, dep_id)
    conn.execute("SELECT pgq.settle_dependencies()")
    assert one(conn, "SELECT state::text FROM pgq.jobs WHERE id = %s", (child,)) == "pending"


def test_an_enqueue_that_meets_a_completion_deleting_its_dependency_is_refused_after_it(
        dsn: str, conn: psycopg.Connection) -> None:  # noqa: F811
    """The completion has deleted the job and not committed: the enqueue waits for it (its lock
    conflicts with the delete only), then is refused as for a pruned job: 22023, nothing written."""
    conn.execute("SELECT pgq.configure_queue('q', keep_done => false)")
    dep_id, attempt = running_job(conn)
    errors: list[BaseException] = []
    with psycopg.connect(dsn) as worker, psycopg.connect(dsn, autocommit=True) as producer:
        assert one(worker, "SELECT pgq.complete(%s, %s)", (dep_id, attempt)) is True
        pid = one(producer, "SELECT pg_backend_pid()")

        def enqueue() -> None:
            try:
                producer.execute("SELECT pgq.enqueue('other', 'k', depends_on => ARRAY[%s]::bigint[])", (dep_id,))
            except BaseException as exc:  # noqa: BLE001 - checked below
                errors.append(exc)

        t = threading.Thread(target=enqueue)
        t.start()
        wait_until_blocked(conn, pid)
        worker.commit()
        t.join(timeout=30)
    assert len(errors) == 1 and isinstance(errors[0], psycopg.errors.InvalidParameterValue), errors
    assert "depends_on" in str(errors[0])
    assert one(conn, "SELECT count(*) FROM pgq.jobs") == 0


def test_a_dependency_on_a_deleted_job_is_refused_as_on_a_pruned_one(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('q', keep_done => false)")
    dep_id, attempt = running_job(conn)
    assert one(conn, "SELECT pgq.complete(%s, %s)", (dep_id, attempt)) is True
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="depends_on"):
        conn.execute("SELECT pgq.enqueue('other', 'k', depends_on => ARRAY[%s]::bigint[])", (dep_id,))


@pytest.mark.parametrize("kwargs", [{"notify_finished": True}, {"unique_key": "u"}])
def test_a_job_someone_reads_after_its_end_is_kept(conn: psycopg.Connection, kwargs: dict) -> None:
    conn.execute("SELECT pgq.configure_queue('q', keep_done => false)")
    job_id, attempt = running_job(conn, **kwargs)
    assert one(conn, "SELECT pgq.complete(%s, %s, '{\"r\": 1}')", (job_id, attempt)) is True
    assert one(conn, "SELECT result FROM pgq.job_result(%s)", (job_id,)) == {"r": 1}


def test_a_batch_member_is_kept_and_counted(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('q', keep_done => false)")
    batch = one(conn, "SELECT pgq.batch_open('cb', 'callback')")
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k', batch => %s)", (batch,))
    conn.execute("SELECT pgq.batch_close(%s)", (batch,))
    (c,) = claim(conn, queues=["q"])
    assert c["id"] == job_id
    assert one(conn, "SELECT array_agg(x) FROM pgq.complete_many(%s, %s) AS x", ([job_id], [c["attempt"]])) == [job_id]
    assert exists(conn, job_id)
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE kind = 'callback'") == 1


def test_keep_done_takes_a_boolean_only(conn: psycopg.Connection) -> None:
    """keep_done is a boolean: NULL leaves it as it is, and there is no other bad value."""
    with pytest.raises(psycopg.errors.UndefinedFunction):
        conn.execute("SELECT pgq.configure_queue('q', keep_done => 'maybe'::text)")
    assert one(conn, "SELECT count(*) FROM pgq.queues") == 0


@pytest.mark.slow
def test_many_workers_completing_in_an_ephemeral_queue_each_job_once(
        dsn: str, conn: psycopg.Connection) -> None:  # noqa: F811
    """6 workers loop on complete_and_claim (batch 5) and complete over 600 jobs while a sampler
    watches: every job is completed exactly once, none is left, the done counter is 600."""
    conn.execute("SELECT pgq.configure_queue('q', keep_done => false)")
    conn.execute("SELECT pgq.enqueue('q', 'k') FROM generate_series(1, 600)")
    stop = threading.Event()
    errors: list[BaseException] = []
    completed: list[int] = []
    seen_done: list[int] = []

    def worker(i: int) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                held: list[tuple[int, int]] = []
                while not stop.is_set():
                    if i % 2 and held:
                        for h in held:
                            assert one(c, "SELECT pgq.complete(%s, %s)", h) is True
                            completed.append(h[0])
                        rows = c.execute("SELECT id, attempt FROM pgq.claim(%s, '{q}', 5)", (f"w{i}",)).fetchall()
                    else:
                        rows = c.execute("SELECT completed, id, attempt FROM pgq.complete_and_claim("
                                         "%s::bigint[], %s::integer[], %s, '{q}', 5)",
                                         ([h[0] for h in held], [h[1] for h in held], f"w{i}")).fetchall()
                        assert sorted(rows[0][0]) == sorted(h[0] for h in held)
                        completed.extend(rows[0][0])
                        rows = [(r[1], r[2]) for r in rows]
                    held = [(r[0], r[1]) for r in rows if r[0] is not None]
                    if not held and not one(c, "SELECT count(*) FROM pgq.jobs"):
                        return
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    def sampler() -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            while not stop.is_set():
                seen_done.append(one(c, "SELECT count(*) FROM pgq.jobs WHERE state = 'done'"))
                stop.wait(0.001)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    watch = threading.Thread(target=sampler)
    watch.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    stop.set()
    watch.join(timeout=30)
    assert not errors, errors
    assert sorted(completed) == list(range(1, 601))
    assert one(conn, "SELECT count(*) FROM pgq.jobs") == 0
    assert set(seen_done) <= {0}  # no committed done row is ever seen
    assert done_count(conn) == 600
