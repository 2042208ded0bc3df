"""A completion records its own end (sql/functions/ended.sql, migration 0024): pgq.complete,
pgq.complete_many and pgq.complete_and_claim set off what every end sets off (a counter row, the
jobs waiting for it, its batch, pgq_finished) once per job, as the trigger jobs_ended did and
still does for every other end; and an upgrade loses or doubles none of it while the migration and
the function source are installed one after the other."""

from __future__ import annotations

import select
import threading
from typing import Any

import psycopg
import pytest

from pgq_thin import migrate
from pgq_tools.bench import _migrate_to

from catalogkit import MIGRATIONS
from sqlhelpers import fresh_database, one

#: The newest migration's number: this source's pgq.version().
NEWEST_MIGRATION = max(p.stem for p in MIGRATIONS.glob("[0-9]*.sql"))
NEWEST = str(int(NEWEST_MIGRATION[:4]))

#: main before migration 0024 (its newest migration 0024): completions that left their ends to the trigger.
BEFORE_0024 = "90f552faa7bf1057923563b8bd3cf951e542f06d"


def _claim(conn: psycopg.Connection[Any], queue: str, n: int = 1) -> list[tuple[int, int]]:
    return [(r[0], r[1]) for r in conn.execute(
        "SELECT id, attempt FROM pgq.claim('w', ARRAY[%s], %s)", (queue, n)).fetchall()]


def _deltas(conn: psycopg.Connection[Any], queue: str) -> dict[str, int]:
    return dict(conn.execute("SELECT state::text, count(*) FROM pgq.finished_deltas WHERE queue = %s GROUP BY 1",
                             (queue,)).fetchall())


def _notified(listener: psycopg.Connection[Any], expected: int) -> list[str]:
    got: list[str] = []
    while len(got) < expected:
        if not select.select([listener.fileno()], [], [], 10)[0]:
            break
        listener.execute("SELECT 1")
        got += [n.payload for n in listener.notifies(timeout=0)]
    return got


def test_each_completion_sets_off_what_an_end_sets_off_once(conn: psycopg.Connection, dsn: str) -> None:
    batch = one(conn, "SELECT pgq.batch_open('callbacks', 'cb')")
    members = [one(conn, "SELECT pgq.enqueue('ends', 'k', batch => %s)", (batch,)) for _ in range(3)]
    conn.execute("SELECT pgq.batch_close(%s)", (batch,))
    watched = [one(conn, "SELECT pgq.enqueue('ends', 'k', notify_finished => true)") for _ in range(2)]
    parents = [one(conn, "SELECT pgq.enqueue('ends', 'k')") for _ in range(3)]
    children = [one(conn, "SELECT pgq.enqueue('children', 'k', depends_on => ARRAY[%s])", (p,)) for p in parents]
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN pgq_finished")
        held = dict(_claim(conn, "ends", 20))
        assert sorted(held) == sorted(members + watched + parents)
        # One member, one watched job and one parent by each call.
        many = [members[0], members[1], watched[0], parents[0]]
        assert sorted(r[0] for r in conn.execute("SELECT * FROM pgq.complete_many(%s, %s)",
                                                 (many, [held[i] for i in many]))) == sorted(many)
        for job_id in (members[2], parents[1]):
            assert one(conn, "SELECT pgq.complete(%s, %s)", (job_id, held[job_id])) is True
        rows = conn.execute("SELECT completed FROM pgq.complete_and_claim(%s, %s, 'w', ARRAY['nothing'])",
                            ([watched[1], parents[2]], [held[watched[1]], held[parents[2]]])).fetchall()
        assert sorted(rows[0][0]) == sorted([watched[1], parents[2]])
        assert sorted(_notified(listener, 2)) == sorted(str(i) for i in watched)
    assert _deltas(conn, "ends") == {"done": 8}
    assert one(conn, "SELECT count(*) FROM pgq.job_events WHERE event = 'completed'") == 8
    assert [one(conn, "SELECT state::text FROM pgq.jobs WHERE id = %s", (c,)) for c in children] == ["pending"] * 3
    status = conn.execute("SELECT state, unfinished, done, callback_job_id IS NOT NULL FROM pgq.batch_status(%s)",
                          (batch,)).fetchone()
    assert status == ("finished", 0, 3, True)
    # A completion repeated (an ambiguous commit's retry) answers true again and records nothing more.
    assert one(conn, "SELECT pgq.complete(%s, %s)", (members[2], held[members[2]])) is True
    assert [r[0] for r in conn.execute("SELECT * FROM pgq.complete_many(%s, %s)",
                                       ([many[0]], [held[many[0]]]))] == [many[0]]
    assert _deltas(conn, "ends") == {"done": 8}
    assert one(conn, "SELECT count(*) FROM pgq.job_events WHERE event = 'completed'") == 8
    assert one(conn, "SELECT done FROM pgq.batch_status(%s)", (batch,)) == 3


@pytest.mark.parametrize("setting", [None, "on", "off"])
def test_every_other_end_is_the_triggers_and_counted_once(conn: psycopg.Connection, setting: str | None) -> None:
    """Whatever a caller sets (here the setting an earlier draft of 0024 used as its marker: no
    call reads a session setting), each end is counted once."""
    if setting is not None:
        conn.execute("SELECT set_config('pgq.completion_records_ends', %s, false)", (setting,))
    failed, cancelled, done = (one(conn, "SELECT pgq.enqueue('others', 'k')") for _ in range(3))
    held = dict(_claim(conn, "others", 3))
    assert one(conn, "SELECT pgq.fail(%s, %s, 'boom', retryable => false)", (failed, held[failed])) == "failed"
    assert one(conn, "SELECT pgq.cancel(%s)", (cancelled,)) is True
    assert one(conn, "SELECT pgq.complete(%s, %s)", (done, held[done])) is True
    assert _deltas(conn, "others") == {"failed": 1, "cancelled": 1, "done": 1}


def test_a_completion_under_an_older_snapshot_leaves_the_checks_an_end_leaves(dsn: str,
                                                                            conn: psycopg.Connection) -> None:
    """In a REPEATABLE READ transaction whose snapshot is older than the completing statement, an
    end may not see the links an enqueue made meanwhile: each leaves a check (pgq.overlap_checks),
    whichever call ended it, as the trigger's ends always did."""
    ids = [one(conn, "SELECT pgq.enqueue('older', 'k')") for _ in range(3)]
    held = dict(_claim(conn, "older", 3))
    with psycopg.connect(dsn) as tx:
        tx.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        tx.execute("SELECT 1")  # the transaction's snapshot, before the completing statements
        assert len(tx.execute("SELECT * FROM pgq.complete_many(%s, %s)",
                              (ids[:2], [held[i] for i in ids[:2]])).fetchall()) == 2
        assert tx.execute("SELECT pgq.complete(%s, %s)", (ids[2], held[ids[2]])).fetchone() == (True,)
        tx.commit()
    checks = [r[0] for r in conn.execute("SELECT job_id FROM pgq.overlap_checks ORDER BY id")]
    assert sorted(checks) == sorted(ids)


@pytest.mark.slow
def test_completions_between_migration_0024_and_the_function_source_are_recorded_once(databases) -> None:
    for dsn in fresh_database(databases, "template1"):
        _migrate_to(dsn, f"git:{BEFORE_0024}")  # the previous release: its schema and its functions
        _migrate_to(dsn, NEWEST_MIGRATION)  # the migrations (0024 and any later), not yet this source
        with psycopg.connect(dsn, autocommit=True) as conn:
            assert one(conn, "SELECT pgq.version()") == "23"
            parents = [one(conn, "SELECT pgq.enqueue('window', 'k')") for _ in range(4)]
            children = [one(conn, "SELECT pgq.enqueue('kids', 'k', depends_on => ARRAY[%s])", (p,))
                        for p in parents]
            held = dict(_claim(conn, "window", 4))
            # The previous release's completions, under the new trigger: the trigger records them,
            # whatever a caller sets (the setting an earlier draft used as the marker, here).
            conn.execute("SET pgq.completion_records_ends = 'on'")
            assert len(conn.execute("SELECT * FROM pgq.complete_many(%s, %s)",
                                    (parents[:1], [held[parents[0]]])).fetchall()) == 1
            assert one(conn, "SELECT pgq.complete(%s, %s)", (parents[1], held[parents[1]])) is True
            assert _deltas(conn, "window") == {"done": 2}
            migrate(dsn)
            assert one(conn, "SELECT pgq.version()") == NEWEST
            # This release's: they record themselves, the trigger leaves them.
            assert len(conn.execute("SELECT * FROM pgq.complete_many(%s, %s)",
                                    (parents[2:3], [held[parents[2]]])).fetchall()) == 1
            assert one(conn, "SELECT pgq.complete(%s, %s)", (parents[3], held[parents[3]])) is True
            assert _deltas(conn, "window") == {"done": 4}
            assert [one(conn, "SELECT state::text FROM pgq.jobs WHERE id = %s", (c,)) for c in children] \
                == ["pending"] * 4


def _blocked_on_a_lock(conn: psycopg.Connection[Any], pid: int) -> bool:
    return bool(one(conn, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'", (pid,)))


@pytest.mark.slow
def test_a_previous_release_completion_in_flight_at_the_source_install_is_recorded_once(databases) -> None:
    """The previous release's pgq.complete_many reads its body, then its completing statement
    waits for a lock (pgq.turns, which its statement writes and the install does not; in real life
    a few microseconds of planning between the call and the statement's first lock) while this
    source's install commits: the statement then plans and runs with the new catalog,
    pgq.version() '24' included. The completion must still go through and be recorded once: its
    counter row, its dependant released, its batch counted. (pgq.complete's window, between its
    call and its UPDATE's first lock on pgq.jobs, cannot be held open from outside: the install
    locks pgq.jobs too, to check its SQL functions. The same rule covers it: the trigger leaves
    only the ends of calls that say they record them.)"""
    for dsn in fresh_database(databases, "template1"):
        _migrate_to(dsn, f"git:{BEFORE_0024}")
        _migrate_to(dsn, NEWEST_MIGRATION)  # the migrations (0024 and any later), not yet this source
        with psycopg.connect(dsn, autocommit=True) as conn, \
                psycopg.connect(dsn, autocommit=True) as worker, psycopg.connect(dsn) as locker:
            batch = one(conn, "SELECT pgq.batch_open('callbacks', 'cb')")
            parent = one(conn, "SELECT pgq.enqueue('inflight', 'k', batch => %s, notify_finished => true)", (batch,))
            conn.execute("SELECT pgq.batch_close(%s)", (batch,))
            child = one(conn, "SELECT pgq.enqueue('kids', 'k', depends_on => ARRAY[%s])", (parent,))
            [(job_id, attempt)] = _claim(worker, "inflight")
            locker.execute("LOCK TABLE pgq.turns IN SHARE MODE")
            answer: list[Any] = []
            thread = threading.Thread(target=_call_or_error, args=(
                worker, "SELECT array_agg(i) FROM pgq.complete_many(ARRAY[%s], ARRAY[%s]) AS i", (job_id, attempt),
                answer))
            with psycopg.connect(dsn, autocommit=True) as listener:
                listener.execute("LISTEN pgq_finished")
                thread.start()
                while not _blocked_on_a_lock(conn, worker.info.backend_pid):
                    thread.join(0.01)
                migrate(dsn)  # this source, while the call waits with the previous release's body
                assert one(conn, "SELECT pgq.version()") == NEWEST
                locker.commit()
                thread.join(30)
                assert answer == [[job_id]]
                assert _notified(listener, 1) == [str(job_id)]
            assert _deltas(conn, "inflight") == {"done": 1}
            assert one(conn, "SELECT state::text FROM pgq.jobs WHERE id = %s", (child,)) == "pending"
            assert conn.execute("SELECT state, done FROM pgq.batch_status(%s)", (batch,)).fetchone() == ("finished", 1)


def _call_or_error(conn: psycopg.Connection[Any], sql: str, params: tuple[Any, ...], answer: list[Any]) -> None:
    try:
        answer.append(one(conn, sql, params))
    except psycopg.Error as exc:
        answer.append(f"{exc.sqlstate}: {exc}")
