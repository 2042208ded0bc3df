"""The claim floors (issue 40, claim.sql, migration 0034): while a snapshot is held, every claimed
job's pending version keeps its entry at the head of jobs_ready_idx (jobs_kind_ready_idx), dead to
every claim but not removable, and a pick that reads the order from its start reads them all again.
A pick that read 5,000 entries more than it picked records, for its own server process, where it
stopped; for a second that process's picks start there (the priority levels above the floor's
always from their start), a floor read that comes back short reads the whole order, and after the
second the whole order is read again, which records new floors or ends them.

A claim counts what its pick reads once a second (the one that raises the lease floor) and, while
some process has floors, every time; these tests set the lease floor back before each claim, so
that each one counts. The entries a pick reads are counted by PostgreSQL itself (pg_stat_get_xact_tuples_returned of the
two ready indexes, read around each claim in its transaction)."""

from __future__ import annotations

import re
import threading

import psycopg
import pytest

from plankit import capture, plan_of
from sqlfixtures import dsn, module_dsn  # noqa: F401
from sqlhelpers import LOWER_LEASE_FLOOR, one

READS = ("SELECT pg_stat_get_xact_tuples_returned('pgq.jobs_ready_idx'::regclass)"
         " + pg_stat_get_xact_tuples_returned('pgq.jobs_kind_ready_idx'::regclass)")
KINDS = pytest.mark.parametrize("kinds", [None, ["k"]], ids=["any-kind", "kinds"])


FRESH = "UPDATE pgq.claim_floors SET set_at = statement_timestamp() WHERE pid = pg_backend_pid()"


def claim_counted(conn: psycopg.Connection, batch: int, kinds: list[str] | None,
                  queue: str = "q", fresh: bool = False) -> tuple[list[tuple[int, int, int]], int]:
    """One claim in a transaction of its own: its (id, attempt, priority) rows, and how many entries
    of the ready indexes it read. The lease floor is set back first, so that this claim raises it
    and counts what its pick reads (what one claim a second does). ``fresh``: this process's floors
    are made a moment old first (a loaded machine may take longer than their second between the
    claims of a test: the claims then read the whole order, which these tests do not state)."""
    with conn.transaction():
        conn.execute(LOWER_LEASE_FLOOR)
        if fresh:
            conn.execute(FRESH)
        before = one(conn, READS)
        rows = conn.execute("SELECT id, attempt, priority FROM pgq.claim('w', ARRAY[%s], %s, kinds => %s)",
                            (queue, batch, kinds)).fetchall()
        read = one(conn, READS) - before
    return [(r[0], r[1], r[2]) for r in rows], read


def complete(conn: psycopg.Connection, rows: list[tuple[int, int, int]]) -> None:
    conn.execute("SELECT pgq.complete_many(%s, %s)", ([r[0] for r in rows], [r[1] for r in rows]))


def has_floors(conn: psycopg.Connection) -> bool:
    return bool(one(conn, "SELECT EXISTS (SELECT FROM pgq.claim_floors WHERE pid = pg_backend_pid())"))


def held_snapshot(dsn: str) -> psycopg.Connection:  # noqa: F811
    holder = psycopg.connect(dsn)
    holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    holder.execute("SELECT count(*) FROM pgq.jobs").fetchone()  # the snapshot, held from here
    return holder


def engage(conn: psycopg.Connection, kinds: list[str] | None, batch: int = 1000) -> tuple[set[int], list[int]]:
    """Claim and complete batches until this process has floors: the ids handed out and what each
    claim read."""
    seen: set[int] = set()
    reads: list[int] = []
    while not has_floors(conn):
        rows, read = claim_counted(conn, batch, kinds)
        assert rows, "the backlog ran out before any pick read 5,000 dead entries"
        assert not seen & {r[0] for r in rows}
        seen |= {r[0] for r in rows}
        reads.append(read)
        complete(conn, rows)
    return seen, reads


@KINDS
def test_under_a_held_snapshot_the_pick_stops_reading_the_dead_head(conn: psycopg.Connection, dsn: str,  # noqa: F811
                                                                     kinds: list[str] | None) -> None:
    """12,000 jobs claimed 1,000 at a time and completed while a snapshot is held: each claim reads
    the dead entries of every job claimed before it, until one has read 5,000 more than it picked;
    the claims after it read from where that one stopped: the jobs claimed since and what they pick,
    not the 6,000 before (the one that reads the whole order again, a second later, aside). Every
    job is handed out once."""
    conn.execute("SELECT pgq.enqueue_many('q', 'k', array_fill('{}'::jsonb, ARRAY[12000]))")
    with held_snapshot(dsn):
        seen, reads = engage(conn, kinds)
        assert reads[-1] >= 5000 + 1000 and all(r < 6000 for r in reads[:-1]), reads
        after: list[int] = []
        while True:
            rows, read = claim_counted(conn, 1000, kinds, fresh=True)
            if not rows:
                break
            assert not seen & {r[0] for r in rows}
            seen |= {r[0] for r in rows}
            after.append(read)
            complete(conn, rows)
    assert len(seen) == 12000
    # Without floors the n-th claim after would read 6,000 + 1,000 n entries.
    assert len(after) == 6 and all(r <= 1000 * n + 100 for n, r in enumerate(after, 1)), after


@KINDS
def test_a_job_of_a_higher_priority_is_never_behind_a_floor(conn: psycopg.Connection, dsn: str,  # noqa: F811
                                                             kinds: list[str] | None) -> None:
    conn.execute("SELECT pgq.enqueue_many('q', 'k', array_fill('{}'::jsonb, ARRAY[12000]))")
    with held_snapshot(dsn):
        engage(conn, kinds)
        urgent = one(conn, "SELECT pgq.enqueue('q', 'k', priority => 5, run_at => now() - interval '1 day')")
        rows, _read = claim_counted(conn, 10, kinds, fresh=True)
        assert has_floors(conn)
        assert rows[0][0] == urgent and rows[0][2] == 5
        assert all(r[2] == 0 for r in rows[1:]) and len(rows) == 10


@KINDS
def test_a_job_due_below_a_floor_is_picked_when_a_floor_read_comes_back_short(
        conn: psycopg.Connection, dsn: str, kinds: list[str] | None) -> None:  # noqa: F811
    """A job of the floor's priority that becomes due below it (its run_at in the past) while the
    backlog above the floor lasts may wait for the floors' second; the pick that finds fewer above
    the floor than it wants reads the whole order, takes it first and ends the floors."""
    conn.execute("SELECT pgq.enqueue_many('q', 'k', array_fill('{}'::jsonb, ARRAY[6600]))")
    with held_snapshot(dsn):
        seen, _reads = engage(conn, kinds)
        late = one(conn, "SELECT pgq.enqueue('q', 'k', run_at => now() - interval '1 day')")
        rest = 6600 - len(seen)
        # A floor read short of its room: the whole order, the late job first (its run_at is the oldest).
        rows, _read = claim_counted(conn, rest + 1, kinds, fresh=True)
        assert rows[0][0] == late and len(rows) == rest + 1
        assert not has_floors(conn)
        assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'pending'") == 0


def test_floors_are_not_used_after_their_second_nor_recorded_when_picks_read_little(
        conn: psycopg.Connection, dsn: str) -> None:  # noqa: F811
    conn.execute("SELECT pgq.enqueue_many('q', 'k', array_fill('{}'::jsonb, ARRAY[9000]))")
    with held_snapshot(dsn):
        engage(conn, None)
    # The snapshot is gone; once the floors are a second old the next picks read the whole order,
    # find the dead head removable (vacuumed here) and record no new floors.
    conn.execute("VACUUM pgq.jobs")
    conn.execute("UPDATE pgq.claim_floors SET set_at = set_at - interval '2 seconds' WHERE pid = pg_backend_pid()")
    old = one(conn, "SELECT set_at FROM pgq.claim_floors WHERE pid = pg_backend_pid()")
    for _ in range(3):
        rows, read = claim_counted(conn, 10, None)
        assert len(rows) == 10 and read < 100
    assert one(conn, "SELECT set_at FROM pgq.claim_floors WHERE pid = pg_backend_pid()") == old


def test_floors_are_the_processes_own(conn: psycopg.Connection, dsn: str) -> None:  # noqa: F811
    """Another process's claims neither read nor write this one's floors; no role may read or write
    the table (only the claim does, as pgq's owner)."""
    conn.execute("SELECT pgq.enqueue_many('q', 'k', array_fill('{}'::jsonb, ARRAY[12000]))")
    with held_snapshot(dsn), psycopg.connect(dsn, autocommit=True) as other:
        engage(conn, None)
        mine = conn.execute("SELECT keys, ids FROM pgq.claim_floors WHERE pid = pg_backend_pid()").fetchone()
        rows, read = claim_counted(other, 1000, None)
        assert len(rows) == 1000 and read > 5000  # from the start of the order: no floors of its own yet
        assert has_floors(other)
        assert conn.execute("SELECT keys, ids FROM pgq.claim_floors WHERE pid = pg_backend_pid()").fetchone() == mine
    for role in ("pgq_producer", "pgq_worker", "pgq_monitor", "pgq_admin"):
        assert not one(conn, "SELECT has_table_privilege(%s, 'pgq.claim_floors', 'SELECT, INSERT, UPDATE, DELETE')",
                       (role,))


def test_claimers_with_floors_hand_out_every_job_once(conn: psycopg.Connection, dsn: str) -> None:  # noqa: F811
    """Four processes claim 300 at a time from 16,000 jobs under a held snapshot (each records
    floors of its own as its picks read far) while a producer adds 2,000 more, half of them due in
    the past (below any floor), half of those of a higher priority. Every job is handed out exactly
    once (to one claimer, at attempt 1) and none is left pending."""
    conn.execute("SELECT pgq.enqueue_many('q', 'k', array_fill('{}'::jsonb, ARRAY[16000]))")
    handed: list[list[int]] = [[] for _ in range(4)]
    floors_seen = [False] * 4
    errors: list[BaseException] = []
    producing = threading.Event()

    def claimer(n: int) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                idle = 0
                while idle < 3 or producing.is_set():
                    rows, _read = claim_counted(c, 300, None)
                    floors_seen[n] = floors_seen[n] or has_floors(c)
                    handed[n].extend(r[0] for r in rows)
                    if rows:
                        complete(c, rows)
                        idle = 0
                    else:
                        idle += 1
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    def producer() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                for i in range(20):
                    c.execute("SELECT pgq.enqueue_many('q', 'k', array_fill('{}'::jsonb, ARRAY[50]),"
                              " run_at => now() - interval '1 hour', priority => %s)", (i % 2,))
                    c.execute("SELECT pgq.enqueue_many('q', 'k', array_fill('{}'::jsonb, ARRAY[50]))")
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            producing.clear()

    with held_snapshot(dsn):
        producing.set()
        threads = [threading.Thread(target=claimer, args=(n,)) for n in range(4)] + [threading.Thread(target=producer)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors
    every = [i for h in handed for i in h]
    assert len(every) == len(set(every)) == 18000
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE state <> 'done' OR attempt <> 1") == 0
    assert any(floors_seen), "no claimer read far enough to record floors: the test tested nothing"


@KINDS
def test_a_floor_read_starts_at_its_key_in_the_index(conn: psycopg.Connection, dsn: str,  # noqa: F811
                                                     kinds: list[str] | None) -> None:
    """The read from a floor is a range of the ready index (the row comparison is an index
    condition), not a walk from the index's start with a filter."""
    conn.execute("SELECT pgq.enqueue_many('q', 'k', array_fill('{}'::jsonb, ARRAY[8000]))")
    # As many jobs of another kind, and statistics that say so: with one kind in the queue the
    # kind's index narrows nothing, and the planner may read jobs_ready_idx and filter the kind
    # instead, the same work there (PostgreSQL 18 did in one clean-clone run of 9b717af).
    conn.execute("SELECT pgq.enqueue_many('q', 'other', array_fill('{}'::jsonb, ARRAY[8000]))")
    conn.execute("ANALYZE pgq.jobs")
    with held_snapshot(dsn):
        engage(conn, kinds)
        conn.execute("LOAD 'auto_explain'")
        with conn.transaction():
            conn.execute(FRESH)
            rows, plans = capture(conn, "SELECT * FROM pgq.claim('w', ARRAY['q'], 100, kinds => %s)", (kinds,))
    assert len(rows) == 100
    read = plan_of(plans, "AND (j.run_at, j.id) > (_floor_rows.run_at, _floor_rows.id)")
    index = "jobs_ready_idx" if kinds is None else "jobs_kind_ready_idx"
    assert f"Index Scan using {index}" in read.text, read.text
    assert re.search(r"Index Cond: .*ROW\(j\.run_at, j\.id\) > ROW\(", read.text), read.text
    assert [s.rows for s in read.job_scans] == [100], read.text
