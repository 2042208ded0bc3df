"""Small helpers for tests that drive the SQL API directly."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from pgq_thin.testing.server import Databases
from pgq_thin.worker import AsyncWorker, Worker

_counter = itertools.count()


def fresh_database(databases: Databases, template: str) -> Iterator[str]:
    """Yields the URL of a new database copied from ``template``; drops it afterwards."""
    name = databases.new_name()
    dsn = databases.create(name, template)
    try:
        yield dsn
    finally:
        databases.drop(name)


def one(conn: psycopg.Connection, sql: str, params: Any = None) -> Any:
    """The single value of a one-row, one-column query."""
    row = conn.execute(sql, params).fetchone()
    assert row is not None
    return row[0]


def job(conn: psycopg.Connection, job_id: int) -> dict[str, Any]:
    """A job row as a dict (read as the superuser)."""
    cur = conn.execute("SELECT * FROM pgq.jobs WHERE id = %s", (job_id,))
    row = cur.fetchone()
    assert row is not None, f"job {job_id} not found"
    return dict(zip([d.name for d in cur.description], row))


def claim(conn: psycopg.Connection, worker: str = "w1", queues: list[str] | None = None,
          batch: int = 1, lease: str | None = None) -> list[dict[str, Any]]:
    cur = conn.execute(
        "SELECT * FROM pgq.claim(worker => %s, queues => %s::text[], batch => %s, lease => %s::interval)",
        (worker, queues, batch, lease),
    )
    return [dict(zip([d.name for d in cur.description], r)) for r in cur.fetchall()]


#: Lowers the lease floor (pgq.lease_floor) to the start: after a lease moved into the past by
#: hand, which would lie below the floor the claims raised, so that the next claim finds it as it
#: finds a lease that passed with time (superuser only; nothing on a schema older than 0033).
LOWER_LEASE_FLOOR = ("SELECT setval(to_regclass('pgq.lease_floor'), 0)"
                     " WHERE to_regclass('pgq.lease_floor') IS NOT NULL")


def expire_lease(conn: psycopg.Connection, job_id: int) -> None:
    """Moves a running job's lease into the past (superuser only), as if time had passed (the
    lease floor too: LOWER_LEASE_FLOOR)."""
    conn.execute(
        "UPDATE pgq.jobs SET lease_until = now() - interval '1 second' WHERE id = %s AND state = 'running'",
        (job_id,),
    )
    conn.execute(LOWER_LEASE_FLOOR)


def cancel(conn: psycopg.Connection, job_id: int) -> bool:
    """pgq.cancel, committed (``conn`` in autocommit): a running job's worker is notified
    (pgq_cancel, '<id>:<attempt>')."""
    return bool(one(conn, "SELECT pgq.cancel(%s)", (job_id,)))


def take_over(conn: psycopg.Connection, job_id: int, claim: str, params: Any = ()) -> list[tuple]:
    """As if the job's worker had stalled past its lease: in one transaction (no renewal slips in
    between) its lease expires (expire_lease) and the SQL ``claim`` runs; its rows. A worker claiming
    beside it cannot see the uncommitted move and may raise the lease floor above the moved lease in
    between (a lease moved into the past by hand is the floor's documented exception: sweeps recover
    it), so while ``claim`` takes nothing the floor is lowered and it runs again, for at most 30 s."""
    deadline = time.monotonic() + 30.0
    with conn.transaction():
        expire_lease(conn, job_id)
        while True:
            rows = conn.execute(claim, params).fetchall()
            if rows or time.monotonic() > deadline:
                return rows
            conn.execute(LOWER_LEASE_FLOOR)


def steal(conn: psycopg.Connection, job_id: int, kind: str) -> int:
    """As if its worker had stalled past its lease: the running job's lease expires and another
    claimer ('thief') takes it, in one transaction (take_over); the new attempt."""
    taken = take_over(conn, job_id,
                      "SELECT id, attempt FROM pgq.claim('thief', kinds => ARRAY[%s], lease => '1 minute')", (kind,))
    assert [t[0] for t in taken] == [job_id], taken
    return int(taken[0][1])


def events(conn: psycopg.Connection, job_id: int) -> list[tuple]:
    return conn.execute(
        "SELECT event, attempt, from_state::text, to_state::text FROM pgq.job_events "
        "WHERE job_id = %s ORDER BY id", (job_id,)
    ).fetchall()


def notifications_until_marker(listener: psycopg.Connection, sender: psycopg.Connection,
                               channel: str = "pgq", timeout: float = 60.0) -> list[str]:
    """The payloads ``listener`` (already LISTENing on ``channel``) receives before a marker that
    ``sender`` (autocommit, its earlier statements committed) sends on the same channel now.

    PostgreSQL delivers the notifications of different transactions in the order the transactions
    committed, so every notification committed before the marker arrives before it: no guessed
    quiet period that a slow machine can overrun, and a stray extra one is still seen."""
    marker = f"end-of-notifications-{next(_counter)}"
    sender.execute("SELECT pg_notify(%s, %s)", (channel, marker))
    received: list[str] = []
    for notify in listener.notifies(timeout=timeout):
        if notify.channel == channel and notify.payload == marker:
            return received
        received.append(notify.payload)
    raise AssertionError(f"the marker notification did not arrive within {timeout}s; got {received}")


def wait_for(condition: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    """Poll ``condition`` until it returns something truthy, and return that; fail naming ``what``
    after ``timeout`` seconds (a generous deadline that only keeps a broken test from hanging)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def claims(conn: psycopg.Connection, name: str) -> int:
    """pgq.claim's calls in this database so far, once the sessions of worker ``name`` are gone
    (a backend reports its function counts when it exits, at the latest)."""
    wait_for(lambda: one(conn, "SELECT count(*) = 0 FROM pg_stat_activity WHERE application_name LIKE %s",
                         (f"pgq-% {name}",)), "the worker's sessions to end")
    conn.execute("SELECT pg_stat_clear_snapshot()")
    return int(one(conn, "SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions "
                         "WHERE schemaname = 'pgq' AND funcname = 'claim'"))


def run_worker(worker: Worker | AsyncWorker, dsn: str, errors: list[BaseException]) -> threading.Thread:
    """Runs ``worker`` (either runtime) on ``dsn`` in a thread of its own, without signal
    handlers; what it raises goes into ``errors``. Stop it with worker.stop() and join the thread."""
    def main() -> None:
        try:
            if isinstance(worker, AsyncWorker):
                asyncio.run(worker.run(dsn, install_signal_handlers=False))
            else:
                worker.run(dsn, install_signal_handlers=False)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    return thread


#: A login with CONNECT (PUBLIC's default) and nothing else: no pgq role, no USAGE on schema pgq
#: (issue 37's squatter, TESTING item 38).
SQUATTER = "pgq_t_squatter"

#: The first key of the queue's writer lock, an advisory lock pgq took before issue 37 (5e1aa62).
WRITER_KEY = 1885827329


def squatter_session(su: psycopg.Connection, open_login: Callable[..., psycopg.Connection]) -> psycopg.Connection:
    """A session of SQUATTER (created if missing; ``open_login`` is test_sql_access's login
    fixture), with every pgq.* setting set in it: it may call no pgq function."""
    if su.execute("SELECT FROM pg_roles WHERE rolname = %s", (SQUATTER,)).fetchone() is None:
        try:
            su.execute(f"CREATE ROLE {SQUATTER} LOGIN")
        except (psycopg.errors.DuplicateObject, psycopg.errors.UniqueViolation):
            pass  # another database of the session's server made it meanwhile
    sq = open_login(SQUATTER)
    with pytest.raises(psycopg.Error) as e:
        sq.execute("SELECT pgq.version()")
    assert e.value.sqlstate == "42501"  # no pgq role: no USAGE on the schema
    for setting in ("batch_counting", "batch_shard", "dependency_budget", "dependency_patience", "key_walk",
                    "fence"):
        sq.execute(f"SET pgq.{setting} = 'caller'")
    return sq


def hold_every_key(sq: psycopg.Connection, queues: list[str], job_ids: range, logins: list[str]) -> int:
    """Takes, exclusively and shared, on session ``sq``, every advisory key pgq took at 5e1aa62 that
    concerns these queues, jobs and logins: the queues' writer locks, the fold lock, the rejection
    locks (the tables' oids are read from pg_class, which every login may read). Returns how many."""
    oid = "(SELECT c.oid::integer FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace " \
          "WHERE n.nspname = 'pgq' AND c.relname = %s)"
    keys: list[tuple[str, tuple[Any, ...]]] = [(f"{WRITER_KEY}, hashtext(%s)", (q,)) for q in queues]
    keys.append((f"{oid}, 0", ("finished_counts",)))
    keys += [(f"{oid}, hashtext(%s || ' ' || %s)", ("job_events", str(i), who)) for i in job_ids for who in logins]
    for args, params in keys:
        sq.execute(f"SELECT pg_advisory_lock({args}), pg_advisory_lock_shared({args})", params + params)
    held = one(sq, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()")
    assert held >= len(keys)
    return len(keys)


#: The advisory lock key the gated clock (install_gated_clock) waits on.
GATE_KEY = 424242


def install_gated_clock(conn: psycopg.Connection) -> None:
    """pgq._now() that waits on advisory lock GATE_KEY in sessions with pgq_test.gate = 'on'
    (test database only). VOLATILE, so it is evaluated per row, in the scan's filter, below the
    row-locking node: a gated statement (a claim, a sweep) stops after its snapshot and before its
    first row lock."""
    conn.execute(f"""
        CREATE OR REPLACE FUNCTION pgq._now() RETURNS timestamptz LANGUAGE plpgsql VOLATILE AS $$
        BEGIN
            IF current_setting('pgq_test.gate', true) = 'on' THEN
                PERFORM pg_advisory_lock_shared({GATE_KEY});
                PERFORM pg_advisory_unlock_shared({GATE_KEY});
            END IF;
            RETURN statement_timestamp();
        END $$""")
