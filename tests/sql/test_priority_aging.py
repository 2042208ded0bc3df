"""Issue 41, priority aging with a bound: pgq.configure_queue(..., max_wait => ...).

In a queue with max_wait, a due job that has waited longer than max_wait (run_at <= now - max_wait)
is claimed before any job of higher priority, the aged ones lowest priority first, then oldest first,
up to the batch; the usual
pick fills the rest. Not before it has waited that long. A queue without it keeps strict priority,
and its claim has no extra step. The aged jobs are found by a skip scan over the priority levels of
jobs_ready_idx (one probe per level), not by reading the queue. Bad input: 22023 naming max_wait,
nothing written; '0' restores strict priority; a fair, key-limited or rate-limited queue refuses it.
The clock is the test clock (pgq._now() reads pgq_test.clock): no sleeps.
"""

from __future__ import annotations

import threading

import psycopg
import pytest

from clockdb import clock_module_dsn, dsn, set_clock  # noqa: F401  (fixtures)
from plankit import capture, plan_of
from sqlhelpers import one

T0 = "2030-01-01 12:00:00+00"


def move_clock(conn: psycopg.Connection, seconds: int) -> None:
    set_clock(conn, None)
    conn.execute("INSERT INTO pgq_test.clock VALUES (%s::timestamptz + make_interval(secs => %s))", (T0, seconds))


def enqueue(conn: psycopg.Connection, queue: str, priority: int, n: int = 1, kind: str = "k") -> list[int]:
    return [r[0] for r in conn.execute(
        "SELECT pgq.enqueue(%s, %s, priority => %s, run_at => pgq._now()) FROM generate_series(1, %s)",
        (queue, kind, priority, n))]


def claim(conn: psycopg.Connection, queue: str = "q", batch: int = 1, kinds: list[str] | None = None) -> list[int]:
    return [r[0] for r in conn.execute(
        "SELECT id FROM pgq.claim('w', queues => ARRAY[%s], batch => %s, kinds => %s::text[])",
        (queue, batch, kinds))]


@pytest.mark.parametrize("kinds", [None, ["k", "other"]])
def test_an_old_low_priority_job_is_claimed_before_a_newer_high_priority_one_once_it_waited_max_wait(
        conn: psycopg.Connection, kinds: list[str] | None) -> None:
    move_clock(conn, 0)
    conn.execute("SELECT pgq.configure_queue('q', max_wait => '60 seconds')")
    old = enqueue(conn, "q", 0)[0]
    move_clock(conn, 30)
    high = enqueue(conn, "q", 10, 3)
    move_clock(conn, 59)
    assert claim(conn, kinds=kinds) == [high[0]], "not before it has waited max_wait"
    move_clock(conn, 60)
    assert claim(conn, kinds=kinds) == [old]
    assert claim(conn, batch=10, kinds=kinds) == high[1:]


def test_aged_jobs_go_lowest_priority_then_oldest_first_and_the_usual_pick_fills_the_batch(
        conn: psycopg.Connection) -> None:
    move_clock(conn, 0)
    conn.execute("SELECT pgq.configure_queue('q', max_wait => '10 seconds')")
    a = enqueue(conn, "q", -5)[0]
    move_clock(conn, 1)
    b = enqueue(conn, "q", 3)[0]
    move_clock(conn, 2)
    c = enqueue(conn, "q", -5)[0]
    move_clock(conn, 3)
    d = enqueue(conn, "q", 0)[0]
    move_clock(conn, 100)
    high = enqueue(conn, "q", 50, 3)
    # all four aged: the lowest priority first, then the oldest (b, older than c and d, is of a higher
    # priority than they: it goes after them); then the batch's rest by priority
    assert claim(conn, batch=2) == [a, c]
    assert claim(conn, batch=3) == [b, d, high[0]]  # the aged ones returned first (in the total order)
    assert claim(conn, batch=10) == high[1:]


def test_batch_one_takes_aged_jobs_by_priority_then_age_before_the_higher_priority_flood(
        conn: psycopg.Connection) -> None:
    move_clock(conn, 0)
    conn.execute("SELECT pgq.configure_queue('q', max_wait => '10 seconds')")
    jobs = []
    for i, p in enumerate([-1, 7, -3, 2, 0, -3, 7]):
        move_clock(conn, i)
        jobs += [(p, i, enqueue(conn, "q", p)[0])]
    move_clock(conn, 100)
    flood = enqueue(conn, "q", 100, 5)
    assert [claim(conn)[0] for _ in jobs] == [i for _, _, i in sorted(jobs)]
    assert claim(conn, batch=10) == flood


def test_a_queue_without_max_wait_keeps_strict_priority(conn: psycopg.Connection) -> None:
    move_clock(conn, 0)
    old = enqueue(conn, "q", 0)[0]
    move_clock(conn, 10_000)
    high = enqueue(conn, "q", 10, 2)
    assert claim(conn, batch=2) == high
    assert claim(conn) == [old]


def test_max_wait_zero_restores_strict_priority_and_null_leaves_it(conn: psycopg.Connection) -> None:
    assert one(conn, "SELECT max_wait FROM pgq.configure_queue('q', max_wait => '5 minutes')") is not None
    assert str(one(conn, "SELECT max_wait FROM pgq.configure_queue('q', lease => '1 minute')")) == "0:05:00"
    assert one(conn, "SELECT max_wait FROM pgq.configure_queue('q', max_wait => '0')") is None


def test_a_capped_queue_ages_within_its_cap(conn: psycopg.Connection) -> None:
    move_clock(conn, 0)
    conn.execute("SELECT pgq.configure_queue('q', max_wait => '10 seconds', max_running => 2)")
    old = enqueue(conn, "q", 0, 3)
    move_clock(conn, 50)
    enqueue(conn, "q", 9, 3)
    assert claim(conn, batch=10) == old[:2]
    assert claim(conn, batch=10) == []


@pytest.mark.parametrize("value, problem", [
    ("-1 second", "between 0"), ("400 days", "between 0"), ("1 month", "months"), ("1 day -1 hour", "mix")])
def test_bad_max_wait_is_refused_naming_it_and_writes_nothing(conn: psycopg.Connection, value: str,
                                                             problem: str) -> None:
    conn.execute("SELECT pgq.configure_queue('q', lease => '1 minute')")
    with pytest.raises(psycopg.Error) as e:
        conn.execute("SELECT pgq.configure_queue('q', lease => '2 minutes', max_wait => %s::interval)", (value,))
    assert e.value.sqlstate == "22023" and '"max_wait"' in str(e.value) and problem in str(e.value)
    assert one(conn, "SELECT lease FROM pgq.queues WHERE name = 'q'").total_seconds() == 60
    assert one(conn, "SELECT max_wait FROM pgq.queues WHERE name = 'q'") is None


@pytest.mark.parametrize("other", ["fair => true", "key_max_running => 1", "rate_limit => 5", "key_rate_limit => 5"])
def test_max_wait_is_refused_on_a_fair_keyed_or_rated_queue(conn: psycopg.Connection, other: str) -> None:
    for first, second in ((other, "max_wait => '1 minute'"), ("max_wait => '1 minute'", other)):
        conn.execute("SELECT pgq.drop_queue('q')") if one(conn, "SELECT count(*) FROM pgq.queues") else None
        conn.execute(f"SELECT pgq.configure_queue('q', {first})")
        with pytest.raises(psycopg.Error) as e:
            conn.execute(f"SELECT pgq.configure_queue('q', {second})")
        assert e.value.sqlstate == "22023" and '"max_wait"' in str(e.value)
    conn.execute("SELECT pgq.configure_queue('q', max_wait => '0')")
    conn.execute(f"SELECT pgq.configure_queue('q', {other})")


def test_the_aged_step_probes_the_index_per_level_and_a_queue_without_max_wait_has_none(
        conn: psycopg.Connection) -> None:
    move_clock(conn, 0)
    for p in range(-20, 21):  # 41 levels, 50 jobs each
        enqueue(conn, "q", p, 50)
        enqueue(conn, "plain", p, 50)
    conn.execute("ANALYZE pgq.jobs")
    conn.execute("LOAD 'auto_explain'")
    conn.execute("SELECT pgq.configure_queue('q', max_wait => '10 seconds')")
    move_clock(conn, 100)
    rows, plans = capture(conn, "SELECT id FROM pgq.claim('w', queues => '{q}', batch => 5)")
    assert len(rows) == 5
    aged = [p for p in plans if "WITH RECURSIVE levels" in p.query]
    assert aged, [p.query[:80] for p in plans]
    scans = [s for p in aged for s in p.job_scans]
    assert all(s.index in ("jobs_ready_idx", "pgq_jobs_pkey", "jobs_pkey") for s in scans), [str(s) for s in scans]
    read = sum(s.rows for s in scans)
    assert read < 41 * 2 + 5 * 5 + 10, [str(s) for s in scans]

    rows, plans = capture(conn, "SELECT id FROM pgq.claim('w', queues => '{plain}', batch => 5)")
    assert len(rows) == 5
    assert not [p.query for p in plans if "FROM pgq._aged_rooms(" in p.query or "WITH RECURSIVE levels" in p.query
                or "FROM pgq._kinds_rooms(" in p.query]
    assert "jobs_ready_idx" in plan_of(plans, "WITH picked AS").text


def test_concurrent_claimers_of_a_capped_aging_queue_keep_the_cap_and_serve_the_aged_first(
        conn: psycopg.Connection, connect) -> None:  # type: ignore[no-untyped-def]
    move_clock(conn, 0)
    conn.execute("SELECT pgq.configure_queue('q', max_wait => '10 seconds', max_running => 4)")
    old = set(enqueue(conn, "q", 0, 20))
    move_clock(conn, 100)
    new = set(enqueue(conn, "q", 9, 20))
    claimers = [connect() for _ in range(6)]
    seen: list[int] = []
    rounds: list[set[int]] = []
    for r in range(40):
        barrier = threading.Barrier(len(claimers))
        got: list[list[tuple[int, int]]] = [[] for _ in claimers]

        def run(i: int, c: psycopg.Connection, barrier: threading.Barrier = barrier,
                got: list[list[tuple[int, int]]] = got) -> None:
            barrier.wait()
            got[i] = [(row[0], row[1]) for row in c.execute(
                "SELECT id, attempt FROM pgq.claim(%s, queues => '{q}', batch => 3)", (f"w{i}",))]

        threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(claimers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        ids = [i for g in got for i, _ in g]
        assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'running'") <= 4, (r, got)
        seen += ids
        rounds.append(set(ids))
        conn.execute("SELECT pgq.complete_many(%s::bigint[], %s::integer[])",
                     ([i for g in got for i, _ in g], [a for g in got for _, a in g]))
        if len(seen) >= 40:
            break
    # Claimers of a capped queue take turns (its row, locked SKIP LOCKED): each round, one of them.
    assert len(seen) == len(set(seen)) == 40 and set(seen) == old | new
    # Every aged job before any of the priority-9 flood: by the end of the first round that claimed
    # one of the flood, every aged job had been claimed. (Not seen[:20]: a round lists its claimers'
    # jobs by claimer, not in the order their claims ran, and two claims of one round may both take
    # jobs: the first the last aged ones, the second a flood job.)
    first_new = next(r for r, ids in enumerate(rounds) if ids & new)
    assert old <= set().union(*rounds[:first_new + 1]), rounds
