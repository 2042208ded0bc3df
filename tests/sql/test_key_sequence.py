"""Issue 41, sequences: pgq.configure_queue(..., key_sequence => 'halt' | 'continue').

In such a queue the jobs of one concurrency_key run one at a time in id order; a job being retried
keeps its place (its key's later jobs wait for it); with 'halt' a job that fails for good holds its
key's later jobs until an operator retries (pgq.retry, retry_jobs) or deletes it (pgq.delete_jobs),
and pgq.health names the halted key; with 'continue' they go on. Keys never hold each other back;
jobs without a key run as usual. 'off' ends it. Bad input: 22023 naming key_sequence, nothing
written.
"""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict

import psycopg
import pytest

from plankit import capture
from sqlfixtures import sqlstate_of
from sqlhelpers import one, wait_for


def enqueue(conn: psycopg.Connection, key: str | None, n: int = 1, queue: str = "s", **kw: object) -> list[int]:
    extra = "".join(f", {k} => %({k})s" for k in kw)
    return [conn.execute(f"SELECT pgq.enqueue(%(queue)s, 'k', concurrency_key => %(key)s{extra})",
                         {"queue": queue, "key": key, **kw}).fetchone()[0] for _ in range(n)]


def claim(conn: psycopg.Connection, batch: int = 10, queue: str = "s") -> list[tuple[int, int]]:
    return [(r[0], r[1]) for r in conn.execute(
        "SELECT id, attempt FROM pgq.claim('w', ARRAY[%s], batch => %s)", (queue, batch))]


def ids(claimed: list[tuple[int, int]]) -> list[int]:
    return sorted(i for i, _ in claimed)


def complete(conn: psycopg.Connection, job: tuple[int, int]) -> None:
    assert one(conn, "SELECT pgq.complete(%s, %s)", job)


def fail(conn: psycopg.Connection, job: tuple[int, int], retry: bool = True) -> str:
    return one(conn, "SELECT pgq.fail(%s, %s, 'boom', retry_in => '1 hour', retryable => %s)", (*job, retry))


def make_due(conn: psycopg.Connection, job_id: int) -> None:
    conn.execute("UPDATE pgq.jobs SET run_at = now() WHERE id = %s", (job_id,))


@pytest.mark.parametrize("mode", ["halt", "continue"])
def test_a_keys_jobs_run_one_at_a_time_in_order_and_keys_do_not_hold_each_other(
        conn: psycopg.Connection, mode: str) -> None:
    conn.execute("SELECT pgq.configure_queue('s', key_sequence => %s)", (mode,))
    a = enqueue(conn, "a", 3)
    b = enqueue(conn, "b", 2)
    u = enqueue(conn, None, 2)
    first = claim(conn)
    assert ids(first) == [a[0], b[0], *u], "each key's oldest job, and the jobs without a key"
    assert claim(conn) == [], "a key's later jobs wait while its head runs"
    complete(conn, next(j for j in first if j[0] == a[0]))
    assert ids(claim(conn)) == [a[1]], "the next of key a once a[0] is done; b still runs"


def test_a_higher_priority_later_job_of_a_key_still_waits_for_the_older_one(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('s', key_sequence => 'halt')")
    old = enqueue(conn, "a")[0]
    enqueue(conn, "a", priority=10)
    assert ids(claim(conn, batch=1)) == [old]


def test_a_job_being_retried_keeps_its_place(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('s', key_sequence => 'continue')")
    a = enqueue(conn, "a", 2)
    [job] = claim(conn)
    assert fail(conn, job) == "pending"
    assert claim(conn) == [], "a[1] waits for a[0]'s retry (due in an hour)"
    make_due(conn, a[0])
    again = claim(conn)
    assert again == [(a[0], 2)]
    complete(conn, again[0])
    assert ids(claim(conn)) == [a[1]]


def test_a_later_run_at_holds_the_keys_later_jobs(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('s', key_sequence => 'halt')")
    enqueue(conn, "a", run_at="2999-01-01")
    enqueue(conn, "a")
    b = enqueue(conn, "b")
    assert ids(claim(conn)) == b


def test_halt_holds_the_key_after_a_failure_for_good_until_an_operator_retries_it(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('s', key_sequence => 'halt')")
    a = enqueue(conn, "a", 2)
    b = enqueue(conn, "b", 2)
    first = claim(conn)
    assert fail(conn, first[0], retry=False) == "failed"
    complete(conn, first[1])
    assert ids(claim(conn)) == [b[1]], "key a is halted, key b goes on"
    health = conn.execute("SELECT severity, detail FROM pgq.health() WHERE \"check\" = 'halted_keys'").fetchall()
    assert health[0][0] == "warning" and "queue s key 'a'" in health[0][1] and str(a[0]) in health[0][1]
    assert one(conn, "SELECT pgq.retry(%s)", (a[0],))
    again = claim(conn)
    assert ids(again) == [a[0]], "the retried job runs first, a[1] still waits"
    complete(conn, again[0])
    assert ids(claim(conn)) == [a[1]]
    assert one(conn, "SELECT severity FROM pgq.health() WHERE \"check\" = 'halted_keys'") == "ok"


def test_halt_lets_the_key_go_on_when_the_failed_job_is_deleted(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('s', key_sequence => 'halt')")
    a = enqueue(conn, "a", 2)
    [job] = claim(conn)
    fail(conn, job, retry=False)
    assert claim(conn) == []
    assert one(conn, "SELECT pgq.delete_jobs('s', 'failed')") == 1
    assert ids(claim(conn)) == [a[1]]


def test_continue_goes_on_after_a_failure_for_good(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('s', key_sequence => 'continue')")
    a = enqueue(conn, "a", 2)
    [job] = claim(conn)
    fail(conn, job, retry=False)
    assert ids(claim(conn)) == [a[1]]
    assert one(conn, "SELECT severity FROM pgq.health() WHERE \"check\" = 'halted_keys'") == "ok"


def test_cancelling_a_held_job_or_the_head_moves_the_key_on_in_order(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('s', key_sequence => 'halt')")
    a = enqueue(conn, "a", 4)
    [head] = claim(conn)
    assert one(conn, "SELECT pgq.cancel(%s)", (a[1],)), "a held (pending) job can be cancelled"
    complete(conn, head)
    assert ids(claim(conn, batch=1)) == [a[2]], "the cancelled job is stepped over"
    assert one(conn, "SELECT pgq.cancel(%s)", (a[2],)), "so can the running head"
    assert ids(claim(conn)) == [a[3]]


def test_off_ends_the_sequence_and_jobs_already_there_are_never_stranded(conn: psycopg.Connection) -> None:
    enqueue(conn, "a", 3)  # before the queue is a sequence queue: they join it
    conn.execute("SELECT pgq.configure_queue('s', key_sequence => 'halt')")
    # (The key has no row to hold yet: the first claim makes it and takes nothing, as a queue given
    # key_max_running after its jobs were enqueued; the next one holds it.)
    [job] = claim(conn) or claim(conn)
    fail(conn, job, retry=False)
    assert claim(conn) == []
    q = conn.execute("SELECT key_sequence, key_limited FROM pgq.configure_queue('s', key_sequence => 'off')").fetchone()
    assert q == (None, False)
    assert len(claim(conn)) == 2, "without the sequence, the key's jobs run side by side"
    assert one(conn, "SELECT key_sequence FROM pgq.configure_queue('s', key_sequence => NULL)") is None


@pytest.mark.parametrize(("sql", "argument"), [
    ("SELECT pgq.configure_queue('s', key_sequence => 'stop')", "key_sequence"),
    ("SELECT pgq.configure_queue('s', key_sequence => '')", "key_sequence"),
    ("SELECT pgq.configure_queue('s', key_sequence => 'halt', fair => true)", "key_sequence"),
    ("SELECT pgq.configure_queue('s', key_sequence => 'halt', key_max_running => 2)", "key_sequence"),
    ("SELECT pgq.configure_queue('s', key_sequence => 'halt', max_wait => '1 minute')", "max_wait"),
])
def test_bad_key_sequence_is_refused_naming_the_argument_and_nothing_is_written(
        conn: psycopg.Connection, sql: str, argument: str) -> None:
    with pytest.raises(psycopg.Error) as err:
        conn.execute(sql)
    assert err.value.sqlstate == "22023"
    assert argument in str(err.value)
    assert one(conn, "SELECT count(*) FROM pgq.queues") == 0


def test_a_sequence_queue_refuses_per_key_limits_and_a_queue_with_them_refuses_a_sequence(
        conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('s', key_sequence => 'halt')")
    assert sqlstate_of(conn, "SELECT pgq.set_key_limit('s', 'a', 2)") == "22023"
    assert sqlstate_of(conn, "SELECT pgq.configure_queue('s', max_wait => '1 minute')") == "22023"
    for sql, argument in [("SELECT pgq.configure_queue('s', key_max_running => 2)", "key_max_running"),
                          ("SELECT pgq.configure_queue('s', fair => true)", "fair")]:
        with pytest.raises(psycopg.Error) as err:
            conn.execute(sql)
        assert err.value.sqlstate == "22023" and f'"{argument}"' in str(err.value), str(err.value)
    assert conn.execute("SELECT key_max_running, fair FROM pgq.queues WHERE name = 's'").fetchone() == (0, False)
    conn.execute("SELECT pgq.configure_queue('k')")
    conn.execute("SELECT pgq.set_key_limit('k', 'a', 2)")
    assert sqlstate_of(conn, "SELECT pgq.configure_queue('k', key_sequence => 'continue')") == "22023"
    assert one(conn, "SELECT key_sequence FROM pgq.queues WHERE name = 'k'") is None


def test_many_claimers_never_run_two_of_a_key_and_keep_each_keys_order_across_retries(
        dsn: str, conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('s', key_sequence => 'halt', audit => false)")
    per_key = 25
    keys = ["a", "b", "c", "d", "e"]
    expected: dict[str, list[int]] = {k: [] for k in keys}
    for _ in range(per_key):
        for k in keys:
            expected[k].extend(enqueue(conn, k))
    unkeyed = enqueue(conn, None, 20)
    total = per_key * len(keys) + len(unkeyed)
    stop = threading.Event()
    errors: list[BaseException] = []
    over: list[dict[str, int]] = []
    samples: list[int] = []
    started: dict[str, list[int]] = defaultdict(list)  # per key, the ids in the order their attempts began
    lock = threading.Lock()
    key_of = {i: k for k, v in expected.items() for i in v}

    def claimer(seed: int) -> None:
        rng = random.Random(seed)
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                while not stop.is_set():
                    rows = c.execute("SELECT id, attempt FROM pgq.claim('w', '{s}', batch => 3)").fetchall()
                    if not rows:
                        time.sleep(0.002)
                    for job_id, attempt in rows:
                        if job_id in key_of:
                            with lock:
                                started[key_of[job_id]].append(job_id)
                        time.sleep(rng.random() * 0.003)
                        if attempt == 1 and rng.random() < 0.3:  # a retry, due at once: it keeps its place
                            c.execute("SELECT pgq.fail(%s, %s, 'flaky', retry_in => '1 microsecond')",
                                      (job_id, attempt))
                        else:
                            c.execute("SELECT pgq.complete(%s, %s)", (job_id, attempt))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    def sampler() -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            while not stop.is_set():
                rows = c.execute("SELECT concurrency_key, count(*) FROM pgq.jobs WHERE queue = 's' "
                                 "AND state = 'running' AND concurrency_key IS NOT NULL GROUP BY 1").fetchall()
                samples.append(1)
                if any(n > 1 for _, n in rows):
                    over.append(dict(rows))

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(6)] + [threading.Thread(target=sampler)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'done'") == total
                 and len(samples) > 50, f"all {total} jobs done and 50 samples taken", timeout=180)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    assert not errors, errors
    assert not over, f"two jobs of a key running at once: {over[:5]}"
    retried = one(conn, "SELECT count(*) FROM pgq.jobs WHERE queue = 's' AND attempt > 1")
    assert retried > 0, "some jobs were retried"
    for k in keys:
        # Attempts of one key begin in id order; a retried job's second attempt comes right after
        # its first (nothing of its key in between).
        order = [i for n, i in enumerate(started[k]) if n == 0 or started[k][n - 1] != i]
        assert order == expected[k], f"key {k} ran out of order: {started[k]}"


def test_claimers_at_once_behind_a_barrier_take_one_job_of_a_key(dsn: str, conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('s', key_sequence => 'continue')")
    a = enqueue(conn, "a", 10)
    barrier = threading.Barrier(6)
    got: list[int] = []
    errors: list[BaseException] = []

    def first_claim() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                barrier.wait(timeout=30)
                got.extend(i for i, _ in claim(c, batch=5))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=first_claim) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert got == [a[0]]


def test_a_claim_reads_each_keys_head_by_one_probe_however_long_the_keys_backlog(conn: psycopg.Connection) -> None:
    """A hot key's 300 waiting jobs fill the head of the queue: the claim still finds the other
    keys' heads (walked, one probe of jobs_key_sequence_idx each), reads no more than a bounded
    number of rows, and the sequence's statements scan no table."""
    conn.execute("SELECT pgq.configure_queue('s', key_sequence => 'continue')")
    conn.execute("SELECT pgq.enqueue_many('s', 'k', array_fill('{}'::jsonb, ARRAY[300]), concurrency_key => 'hot')")
    others = [enqueue(conn, f"k{i}")[0] for i in range(5)]
    conn.execute("ANALYZE pgq.jobs")
    claim(conn, batch=1)  # the hot key's head
    conn.execute("LOAD 'auto_explain'")
    rows, plans = capture(conn, "SELECT id FROM pgq.claim('w', ARRAY['s'], batch => 5)")
    assert sorted(r[0] for r in rows) == others
    sequence_plans = [p for p in plans if "_sequence_heads(" in p.query]
    assert sequence_plans and not [p.query for p in sequence_plans if "Seq Scan on pgq.jobs" in p.text]
    heads = [s for p in plans for s in p.job_scans if s.index == "jobs_key_sequence_idx"]
    assert heads, [p.query[:80] for p in plans]
    assert sum(s.rows for p in plans for s in p.job_scans) < 400, [str(s) for p in plans for s in p.job_scans]


def test_enqueues_of_a_key_committing_out_of_id_order_still_run_one_at_a_time(
        conn: psycopg.Connection, connect) -> None:  # type: ignore[no-untyped-def]
    """Two producers enqueue into one key at once and the later id commits first: the claim sees
    only it and runs it; the earlier one, once visible, waits for it (the key holds one running job)
    and runs next. Neither enqueue waited for the other."""
    conn.execute("SELECT pgq.configure_queue('s', key_sequence => 'halt')")
    enqueue(conn, "a")  # the key's row exists: the first claim of it holds it
    [first] = claim(conn)
    complete(conn, first)
    early, late = connect(autocommit=False), connect(autocommit=False)
    early_id = one(early, "SELECT pgq.enqueue('s', 'k', concurrency_key => 'a')")
    late_id = one(late, "SELECT pgq.enqueue('s', 'k', concurrency_key => 'a')")
    assert early_id < late_id
    late.commit()
    got = claim(conn)
    assert ids(got) == [late_id]
    early.commit()
    assert claim(conn) == [], "the earlier job waits while the later one runs"
    complete(conn, got[0])
    assert ids(claim(conn)) == [early_id]
