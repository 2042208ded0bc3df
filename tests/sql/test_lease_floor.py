"""The lease floor (issue 40, recovery.sql): a claim's expired-lease probe reads jobs_lease_idx from
the floor up, so a held snapshot (whose dead entries vacuum cannot remove) does not make every claim
read every finished job's old lease; a lease below the floor is recovered by the sweep and, once a
minute, by a claim; nothing a claim should recover is missed while claims raise the floor."""

from __future__ import annotations

import re
import threading
import time

import psycopg

from plankit import capture, plan_of
from sqlfixtures import dsn, module_dsn  # noqa: F401
from sqlhelpers import LOWER_LEASE_FLOOR, claim, one, wait_for


def floor_micros(conn: psycopg.Connection) -> int:
    return int(one(conn, "SELECT last_value FROM pgq.lease_floor"))


def set_floor_seconds_ago(conn: psycopg.Connection, seconds: float, sequence: str = "pgq.lease_floor") -> None:
    conn.execute("SELECT setval(%s, floor(extract(epoch FROM clock_timestamp() - %s * interval '1 second')"
                 " * 1000000)::bigint)", (sequence, seconds))


def probe_buffers(conn: psycopg.Connection) -> tuple[int, str]:
    """The shared buffers one claim's expired-lease probe statement (pgq._claim_queues) read, and its plan."""
    conn.execute("SET auto_explain.log_buffers = on")
    _rows, plans = capture(conn, "SELECT * FROM pgq.claim('w', ARRAY['q'])")
    probe = plan_of(plans, "FROM pgq._claim_queues(")
    hits = re.search(r"Buffers: shared hit=(\d+)", probe.text)
    return int(hits.group(1)) if hits else 0, probe.text


def test_a_held_snapshot_does_not_make_the_probe_read_every_finished_jobs_old_lease(
        conn: psycopg.Connection, dsn: str) -> None:  # noqa: F811
    """3,000 jobs claimed, their leases passed and completed while a REPEATABLE READ snapshot is
    held: their old running versions keep 3,000 entries in jobs_lease_idx below now, which vacuum
    may not remove. The first claim's probe reads them all (the floor starts at 0); it raises the
    floor, and the next claim's probe reads from there: a handful of buffers."""
    conn.execute("SELECT pgq.configure_queue('q')")
    conn.execute("SELECT pgq.enqueue_many('q', 'k', array_fill('{}'::jsonb, ARRAY[3000]))")
    with psycopg.connect(dsn) as holder:
        holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        assert one(holder, "SELECT count(*) FROM pgq.jobs") == 3000  # the snapshot, held from here
        ids = [c["id"] for c in claim(conn, queues=["q"], batch=1000) + claim(conn, queues=["q"], batch=1000)
               + claim(conn, queues=["q"], batch=1000)]
        assert len(ids) == 3000
        conn.execute("UPDATE pgq.jobs SET lease_until = now() - interval '1 minute' WHERE state = 'running'")
        conn.execute("SELECT pgq.complete_many(array_agg(id), array_agg(attempt)) FROM pgq.jobs")
        assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'done'") == 3000
        conn.execute("VACUUM pgq.jobs")  # removes nothing the snapshot may still see
        conn.execute("SELECT pgq.enqueue('q', 'k')")
        conn.execute(LOWER_LEASE_FLOOR)
        conn.execute("LOAD 'auto_explain'")
        before, first_plan = probe_buffers(conn)
        assert before > 100, first_plan  # every old lease's entry, and its row version's page
        assert floor_micros(conn) > 0
        set_floor_seconds_ago(conn, 0)  # (a real floor: the claim above raised one already)
        after, plan = probe_buffers(conn)
        assert "jobs_lease_idx" in plan and after * 10 < before, (before, after, plan)


def test_a_claims_recovery_reads_from_the_floor_too(conn: psycopg.Connection, dsn: str) -> None:  # noqa: F811
    """As above, 3,000 finished jobs' old leases lie below the floor under a held snapshot; then a
    worker's lease passes above it (a crash). The claim's probe finds it, and the claim's recovery
    (pgq._recover_expired) reads from the floor up too, not the 3,000 entries below: it recovers
    that job (lease_expired) and the claim takes it again."""
    conn.execute("SELECT pgq.configure_queue('q')")
    conn.execute("SELECT pgq.enqueue_many('q', 'k', array_fill('{}'::jsonb, ARRAY[3000]))")
    with psycopg.connect(dsn) as holder:
        holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        assert one(holder, "SELECT count(*) FROM pgq.jobs") == 3000  # the snapshot, held from here
        for _ in range(3):
            claim(conn, queues=["q"], batch=1000)
        conn.execute("UPDATE pgq.jobs SET lease_until = now() - interval '1 minute' WHERE state = 'running'")
        conn.execute("SELECT pgq.complete_many(array_agg(id), array_agg(attempt)) FROM pgq.jobs")
        conn.execute("VACUUM pgq.jobs")  # removes nothing the snapshot may still see
        set_floor_seconds_ago(conn, 0)
        crashed = one(conn, "SELECT pgq.enqueue('q', 'k')")
        (taken,) = claim(conn, queues=["q"], lease="100 milliseconds")
        assert taken["id"] == crashed
        wait_for(lambda: one(conn, "SELECT clock_timestamp() > lease_until FROM pgq.jobs WHERE id = %s", (crashed,)),
                 "the crashed worker's lease to pass")
        conn.execute("LOAD 'auto_explain'")
        conn.execute("SET auto_explain.log_buffers = on")
        rows, plans = capture(conn, "SELECT id, attempt FROM pgq.claim('w', ARRAY['q'])")
        assert rows == [(crashed, 2)]
        recovery = plan_of(plans, "WITH expired AS")
        hits = re.search(r"Buffers: shared hit=(\d+)", recovery.text)
        # (22 shared buffers in all, its UPDATE and event included; 141 when it read from the bottom)
        assert hits and int(hits.group(1)) < 60, recovery.text
    assert one(conn, "SELECT count(*) FROM pgq.job_events WHERE job_id = %s AND event = 'lease_expired'",
               (crashed,)) == 1


def test_the_first_claims_raise_the_floor_at_most_once_a_second_and_never_under_repeatable_read(
        conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('q')")
    assert floor_micros(conn) == 0
    claim(conn, queues=["q"])
    raised = floor_micros(conn)
    now = one(conn, "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint")
    assert now - 60_000_000 < raised <= now
    claim(conn, queues=["q"])
    assert floor_micros(conn) == raised  # less than a second later: left as it is
    set_floor_seconds_ago(conn, 5)
    five = floor_micros(conn)
    conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    claim(conn, queues=["q"])
    conn.execute("COMMIT")
    assert floor_micros(conn) == five  # an older snapshot may miss a lease committed since
    claim(conn, queues=["q"])
    assert floor_micros(conn) > five


def test_a_floor_ahead_of_the_clock_is_set_back_by_the_next_claim(conn: psycopg.Connection) -> None:
    """The clock went back (or a failover to a server behind): the floor lies ahead of it. The next
    claim sets it to its own clock, so claims go on raising it as the clock moves."""
    conn.execute("SELECT pgq.configure_queue('q')")
    set_floor_seconds_ago(conn, -3600)
    claim(conn, queues=["q"])
    now = one(conn, "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint")
    assert now - 60_000_000 < floor_micros(conn) <= now


def test_a_lease_below_the_floor_is_left_to_the_sweep_and_to_the_claim_of_the_next_minute(
        conn: psycopg.Connection) -> None:
    """A lease moved into the past by hand lies below the floor: the next claim does not see it (as
    documented); pgq.sweep recovers it, and so does the claim that raises the floor once the
    minute since the last such look has passed."""
    conn.execute("SELECT pgq.enqueue_many('q', 'k', array_fill('{}'::jsonb, ARRAY[2]))")
    first, second = claim(conn, queues=["q"], batch=2)
    claim(conn, queues=["other"])  # raises the floor and takes the minute's look: nothing expired
    conn.execute("UPDATE pgq.jobs SET lease_until = now() - interval '10 minutes' WHERE state = 'running'")
    set_floor_seconds_ago(conn, 2)  # due to be raised again
    claim(conn, queues=["other"])
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'running'") == 2
    set_floor_seconds_ago(conn, 2)
    set_floor_seconds_ago(conn, 61, "pgq.lease_floor_checked")
    claim(conn, queues=["other"])
    states = dict(conn.execute("SELECT id, last_event FROM pgq.jobs").fetchall())
    assert states == {first["id"]: "lease_expired", second["id"]: "lease_expired"}
    again = claim(conn, queues=["q"], batch=2)
    conn.execute("UPDATE pgq.jobs SET lease_until = now() - interval '10 minutes' WHERE state = 'running'")
    assert len(again) == 2 and one(conn, "SELECT pgq.sweep()") == 2


def test_a_claim_that_commits_after_its_own_lease_passed_is_recovered_by_the_sweep(
        conn: psycopg.Connection, dsn: str) -> None:  # noqa: F811
    """The one way a lease lies below the floor without a hand: a claim transaction kept open past
    its lease while another claim raised the floor. Claims leave it (they read from the floor);
    the sweep, which reads every expired lease, recovers it."""
    conn.execute("SELECT pgq.enqueue('q', 'k')")
    with psycopg.connect(dsn) as slow:
        (held,) = claim(slow, queues=["q"], lease="100 milliseconds")
        lease_end = one(slow, "SELECT lease_until FROM pgq.jobs WHERE id = %s", (held["id"],))
        wait_for(lambda: one(conn, "SELECT clock_timestamp() > %s + interval '50 milliseconds'", (lease_end,)),
                 "the held claim's lease to pass")
        set_floor_seconds_ago(conn, 2)
        claim(conn, queues=["other"])  # raises the floor past the uncommitted lease
        assert floor_micros(conn) > one(conn, "SELECT floor(extract(epoch FROM %s::timestamptz) * 1000000)::bigint",
                                        (lease_end,))
        slow.commit()
    assert claim(conn, queues=["q"]) == []
    assert one(conn, "SELECT state::text FROM pgq.jobs WHERE id = %s", (held["id"],)) == "running"
    assert one(conn, "SELECT pgq.sweep()") == 1
    assert one(conn, "SELECT last_event FROM pgq.jobs WHERE id = %s", (held["id"],)) == "lease_expired"


def test_claimers_raising_the_floor_recover_every_abandoned_lease_without_a_sweep(
        conn: psycopg.Connection, dsn: str) -> None:  # noqa: F811
    """A crashing worker claims 40 jobs with 200 ms leases and abandons them, while four claimers,
    each raising the floor as it goes, drain the queue: no sweep runs, and every job still ends done,
    each abandoned one recovered by a claim (lease_expired) and completed by another worker."""
    conn.execute("SELECT pgq.configure_queue('q', audit => true)")
    conn.execute("SELECT pgq.enqueue_many('q', 'k', array_fill('{}'::jsonb, ARRAY[600]))")
    abandoned: list[int] = []
    stop = threading.Event()
    errors: list[BaseException] = []

    def crasher() -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            while not stop.is_set() and len(abandoned) < 40:
                abandoned.extend(j["id"] for j in claim(c, "crasher", ["q"], batch=2, lease="200 milliseconds"))
                time.sleep(0.01)

    def worker(name: str) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                while not stop.is_set():
                    got = claim(c, name, ["q"], batch=5)
                    for j in got:
                        c.execute("SELECT pgq.complete(%s, %s)", (j["id"], j["attempt"]))
                    if not got:
                        time.sleep(0.02)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=crasher)] + [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(4)]
    threads[0].start()
    try:
        wait_for(lambda: len(abandoned) >= 40, "the crashing worker to abandon 40 jobs")
        for t in threads[1:]:
            t.start()
        wait_for(lambda: one(conn, "SELECT count(*) = 600 FROM pgq.jobs WHERE state = 'done'"),
                 "every job done, the abandoned ones recovered by claims", timeout=60)
    finally:
        stop.set()
        for t in threads:
            if t.is_alive():
                t.join()
    assert not errors
    assert len(abandoned) >= 40
    recovered = {r[0] for r in conn.execute("SELECT job_id FROM pgq.job_events WHERE event = 'lease_expired'")}
    assert set(abandoned) <= recovered
