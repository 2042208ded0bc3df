"""Issue 41, tags and uniqueness for a period.

Tags: pgq.enqueue(..., tags) and pgq.enqueue_many(..., tags) store a job's tags (each once, sorted);
the tags filter of pgq.list_jobs, retry_jobs, cancel_jobs and delete_jobs finds the jobs holding all
of its tags, through the partial GIN index jobs_tags_idx (a job without tags has no entry in it).

unique_for: with a unique_key, a job of the key (same queue) that ended done within unique_for of
now holds the key as a live one does: the call answers its id and enqueues nothing. Failed and
cancelled jobs never hold it (River's and Oban's default unique states leave those out too). Race:
many enqueuers of one key while a worker claims and completes its jobs at once: one job only, ever."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import psycopg
import pytest

from pgq_tools.lab.harness import Harness

from plankit import capture, plan_of
from sqlhelpers import GATE_KEY, claim, install_gated_clock, job, one


def enqueue(conn: psycopg.Connection, queue: str = "q", kind: str = "k", **more: object) -> int:
    args = "".join(f", {k} => %({k})s" for k in more)
    return int(one(conn, f"SELECT pgq.enqueue(%(queue)s, %(kind)s{args})", {"queue": queue, "kind": kind, **more}))


def ids(conn: psycopg.Connection, sql: str, params: object = None) -> list[int]:
    return [r[0] for r in conn.execute(sql, params).fetchall()]


def finish(conn: psycopg.Connection, job_id: int, how: str = "complete") -> None:
    (c,) = claim(conn, queues=[job(conn, job_id)["queue"]])
    assert c["id"] == job_id
    if how == "complete":
        assert one(conn, "SELECT pgq.complete(%s, %s)", (job_id, c["attempt"])) is True
    elif how == "fail":
        assert one(conn, "SELECT pgq.fail(%s, %s, 'boom', retryable => false)", (job_id, c["attempt"])) is not None
    else:
        assert one(conn, "SELECT pgq.cancel(%s)", (job_id,)) is True


# --- tags ---------------------------------------------------------------------------------------

def test_a_jobs_tags_are_stored_each_once_sorted_and_an_empty_list_is_none(conn: psycopg.Connection) -> None:
    tagged = enqueue(conn, tags=["vip", "eu", "vip"])
    assert job(conn, tagged)["tags"] == ["eu", "vip"]
    assert job(conn, enqueue(conn, tags=[]))["tags"] is None
    assert job(conn, enqueue(conn))["tags"] is None
    many = ids(conn, "SELECT pgq.enqueue_many('q', 'k', ARRAY['{}', '{}']::jsonb[], tags => '{b,a}')")
    keyed = ids(conn, "SELECT pgq.enqueue_many('q', 'k', ARRAY['{}', '{}']::jsonb[], unique_keys => '{u1,NULL}',"
                      " tags => '{c}')")
    assert [job(conn, i)["tags"] for i in many + keyed] == [["a", "b"], ["a", "b"], ["c"], ["c"]]
    assert one(conn, "SELECT (pgq.get_job(%s)).tags", (tagged,)) == ["eu", "vip"]


def test_only_tagged_jobs_have_entries_in_the_partial_tags_index(conn: psycopg.Connection) -> None:
    pred = one(conn, "SELECT pg_get_expr(indpred, indrelid) FROM pg_index"
                     " WHERE indexrelid = 'pgq.jobs_tags_idx'::regclass")
    assert pred == "(tags IS NOT NULL)"
    assert one(conn, "SELECT amname FROM pg_class c JOIN pg_am a ON a.oid = c.relam"
                     " WHERE c.oid = 'pgq.jobs_tags_idx'::regclass") == "gin"


def test_list_jobs_with_tags_lists_the_jobs_holding_all_of_them_newest_first(conn: psycopg.Connection) -> None:
    both = [enqueue(conn, tags=["a", "b"]) for _ in range(3)]
    only_a = enqueue(conn, tags=["a"])
    enqueue(conn)
    other_queue = enqueue(conn, "q2", tags=["a", "b", "c"])
    other_kind = enqueue(conn, kind="k2", tags=["b", "a"])
    finish(conn, both[0])
    listed = ids(conn, "SELECT id FROM pgq.list_jobs(tags => '{a,b}')")
    assert listed == sorted([*both, other_queue, other_kind], reverse=True)
    assert ids(conn, "SELECT id FROM pgq.list_jobs(tags => '{a}')") == sorted(
        [*both, only_a, other_queue, other_kind], reverse=True)
    assert ids(conn, "SELECT id FROM pgq.list_jobs('q', tags => '{a,b}')") == sorted([*both, other_kind], reverse=True)
    assert ids(conn, "SELECT id FROM pgq.list_jobs('q', 'pending', 'k', tags => '{b}')") == [both[2], both[1]]
    assert ids(conn, "SELECT id FROM pgq.list_jobs('q', 'done', tags => '{b}')") == [both[0]]
    assert ids(conn, "SELECT id FROM pgq.list_jobs(tags => '{a,b}', limit_rows => 2, before_id => %s)",
               (other_queue,)) == [both[2], both[1]]
    assert ids(conn, "SELECT id FROM pgq.list_jobs(tags => '{nobody}')") == []


def test_bulk_calls_act_only_on_the_jobs_holding_all_the_tags(conn: psycopg.Connection) -> None:
    tagged = [enqueue(conn, tags=["t", "x"]) for _ in range(4)]
    half = enqueue(conn, tags=["t"])
    plain = enqueue(conn)
    assert one(conn, "SELECT pgq.cancel_jobs('q', 'pending', tags => '{t,x}', limit_rows => 3)") == 3
    assert one(conn, "SELECT pgq.cancel_jobs('q', 'pending', tags => '{t,x}')") == 1
    assert [job(conn, i)["state"] for i in [*tagged, half, plain]] == ["cancelled"] * 4 + ["pending"] * 2
    assert one(conn, "SELECT pgq.retry_jobs('q', 'cancelled', tags => '{x}', limit_rows => 2)") == 2
    assert [job(conn, i)["state"] for i in tagged] == ["pending", "pending", "cancelled", "cancelled"]
    assert one(conn, "SELECT pgq.delete_jobs('q', 'cancelled', tags => '{t}')") == 2
    assert one(conn, "SELECT pgq.delete_jobs('q', 'pending', tags => '{t,x}')") == 2
    assert ids(conn, "SELECT id FROM pgq.jobs ORDER BY id") == [half, plain]
    assert one(conn, "SELECT pgq.cancel_jobs('q', 'pending', tags => '{nobody}')") == 0


def test_the_tags_filter_reads_the_tagged_jobs_through_jobs_tags_idx(conn: psycopg.Connection) -> None:
    conn.execute("INSERT INTO pgq.queues (name) VALUES ('q')")
    conn.execute("INSERT INTO pgq.jobs (queue, kind, state, attempt, max_attempts, finished_at, last_event)"
                 " SELECT 'q', 'k', 'failed', 1, 1, now(), 'failed' FROM generate_series(1, 20000)")
    tagged = [enqueue(conn, tags=["rare"]) for _ in range(5)]
    conn.execute("VACUUM ANALYZE pgq.jobs")
    conn.execute("LOAD 'auto_explain'")
    for sql, marker in [("SELECT id FROM pgq.list_jobs(tags => '{rare}')", "t.tags @> _list_tagged.tags"),
                        ("SELECT pgq.cancel_jobs('q', 'pending', tags => '{rare}', limit_rows => 3)",
                         "j.tags @> cancel_jobs.tags"),
                        ("SELECT pgq.retry_jobs('q', 'failed', tags => '{rare}')", "j.tags @> retry_jobs.tags"),
                        ("SELECT pgq.delete_jobs('q', 'failed', tags => '{rare}')", "j.tags @> delete_jobs.tags")]:
        conn.execute("BEGIN")
        try:
            rows, plans = capture(conn, sql)
        finally:
            conn.execute("ROLLBACK")
        page = plan_of(plans, marker)
        assert "Bitmap Index Scan on jobs_tags_idx" in page.text, page.text
        assert "Seq Scan" not in page.text, page.text
        if sql.startswith("SELECT id"):
            assert [r[0] for r in rows] == tagged[::-1]


# --- unique_for ---------------------------------------------------------------------------------

def test_a_job_of_the_key_done_within_unique_for_is_the_answer_and_nothing_is_enqueued(
        conn: psycopg.Connection) -> None:
    first = enqueue(conn, unique_key="u")
    finish(conn, first)
    assert enqueue(conn, unique_key="u", unique_for="1 hour") == first
    assert enqueue(conn, unique_key="u", unique_for="1 hour", batch=None, depends_on=[first]) == first
    assert one(conn, "SELECT count(*) FROM pgq.jobs") == 1
    # The period is the caller's: one that has passed since the end frees the key.
    conn.execute("UPDATE pgq.jobs SET finished_at = now() - interval '2 hours' WHERE id = %s", (first,))
    assert enqueue(conn, unique_key="u", unique_for="3 hours") == first
    second = enqueue(conn, unique_key="u", unique_for="1 hour")
    assert second != first and job(conn, second)["state"] == "pending"
    # Another queue's job of the key never holds it.
    assert enqueue(conn, "q2", unique_key="u", unique_for="1 hour") not in (first, second)


def test_without_unique_for_a_done_job_holds_no_key(conn: psycopg.Connection) -> None:
    first = enqueue(conn, unique_key="u")
    finish(conn, first)
    assert enqueue(conn, unique_key="u") != first


def test_failed_and_cancelled_jobs_never_hold_a_key(conn: psycopg.Connection) -> None:
    failed = enqueue(conn, unique_key="f")
    finish(conn, failed, "fail")
    assert job(conn, failed)["state"] == "failed"
    assert enqueue(conn, unique_key="f", unique_for="1 hour") != failed
    cancelled = enqueue(conn, unique_key="c")
    assert one(conn, "SELECT pgq.cancel(%s)", (cancelled,)) is True
    assert enqueue(conn, unique_key="c", unique_for="1 hour") != cancelled


def test_every_enqueue_path_answers_with_the_done_holder(conn: psycopg.Connection) -> None:
    first = enqueue(conn, unique_key="u")
    finish(conn, first)
    batch = one(conn, "SELECT pgq.batch_open('q', 'cb')")
    assert enqueue(conn, unique_key="u", unique_for="1 hour", batch=batch) == first
    assert enqueue(conn, unique_key="u", unique_for="1 hour", on_conflict="replace") == first
    assert ids(conn, "SELECT pgq.enqueue_many('q', 'k', ARRAY['{}', '{}']::jsonb[], unique_keys => '{u,v}',"
                     " unique_for => '1 hour')")[0] == first
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE unique_key = 'u'") == 1


@pytest.fixture
def h(dsn: str) -> Iterator[Harness]:
    harness = Harness(dsn)
    try:
        yield harness
    finally:
        harness.close()


def test_a_job_of_the_key_enqueued_and_done_while_a_call_reads_is_its_answer(
        h: Harness, conn: psycopg.Connection) -> None:
    """The narrow interleaving, made to happen: a call reads the key (no job of it, in its snapshot)
    and stops there (the gated clock); meanwhile another producer enqueues the key and a worker
    claims and completes that job; then the call goes on. Its insert meets no live job, but its
    read once more after the insert finds the job done within unique_for: that is its answer, and
    its own row goes."""
    # A job of the key done long ago: the read's filter on finished_at (the gated clock) stops the
    # call after its snapshot, in that read.
    old = enqueue(conn, unique_key="u")
    finish(conn, old)
    conn.execute("UPDATE pgq.jobs SET finished_at = now() - interval '1 day' WHERE id = %s", (old,))
    install_gated_clock(conn)
    late, other, gate = h.session("late"), h.session("other"), h.session("gate")
    h.step(gate, "gate_close", "SELECT pg_advisory_lock(%s)", (GATE_KEY,))
    h.step(late, "l_gate_on", "SET pgq_test.gate = 'on'")
    call = h.step(late, "l_enqueue", "SELECT pgq.enqueue('q', 'k', unique_key => 'u', unique_for => '1 hour')")
    assert call.blocked and call.blocked_by == ["gate"], call.outcome
    first = h.step(other, "o_enqueue", "SELECT pgq.enqueue('q', 'k', unique_key => 'u')")
    assert first.ok and not first.blocked, first.outcome
    (c,) = claim(conn, queues=["q"])
    assert c["id"] == first.value and one(conn, "SELECT pgq.complete(%s, %s)", (c["id"], c["attempt"])) is True
    h.step(gate, "gate_open", "SELECT pg_advisory_unlock(%s)", (GATE_KEY,))
    h.wait(call)
    assert call.ok and call.value == first.value, call.outcome
    assert ids(conn, "SELECT id FROM pgq.jobs WHERE unique_key = 'u' ORDER BY id") == [old, first.value]


def test_many_enqueuers_of_a_key_whose_jobs_end_at_once_enqueue_it_once(dsn: str, conn: psycopg.Connection) -> None:
    """Eight enqueuers call pgq.enqueue(unique_key 'hot', unique_for 1 hour) in a loop while a
    worker claims and completes each job of the queue as soon as it appears: whichever of live or
    done the first job is when a call reads, and however the calls and the end interleave, the key
    has one job, and every call answered its id."""
    conn.execute("SELECT pgq.configure_queue('q')")
    answers: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    stop = threading.Event()
    start = threading.Barrier(9)

    def enqueuer() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                start.wait()
                for _ in range(40):
                    got = enqueue(c, unique_key="hot", unique_for="1 hour")
                    with lock:
                        answers.append(got)
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    def worker() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                start.wait()
                while not stop.is_set():
                    for j in claim(c, queues=["q"], batch=10):
                        assert one(c, "SELECT pgq.complete(%s, %s)", (j["id"], j["attempt"])) is True
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=enqueuer) for _ in range(8)]
    w = threading.Thread(target=worker)
    for t in [*threads, w]:
        t.start()
    for t in threads:
        t.join(120)
    stop.set()
    w.join(60)
    assert not errors, errors
    keyed = ids(conn, "SELECT id FROM pgq.jobs WHERE unique_key = 'hot'")
    assert len(keyed) == 1, keyed
    assert len(answers) == 320 and set(answers) == set(keyed)
    assert job(conn, keyed[0])["state"] in ("pending", "running", "done")
