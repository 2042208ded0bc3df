"""Retention per state, applied by pgq itself (issue 40): configure_queue's retention_failed and
retention_cancelled, the sweep's bounded retention step, pgq.prune's per-state rule, and their races
with the calls that hold a finished job (a retry) or finish one (claim and complete)."""

from __future__ import annotations

import threading
from datetime import timedelta

import psycopg
import pytest

from sqlhelpers import one


def finished(conn: psycopg.Connection, queue: str, state: str, age: str, n: int = 1) -> list[int]:
    """n jobs of `queue` that finished as `state` `age` ago (written as the schema owner)."""
    rows = conn.execute(
        """INSERT INTO pgq.jobs (queue, kind, state, attempt, max_attempts, run_at, created_at, finished_at,
                                 last_event)
           SELECT %s, 'k', %s::pgq.job_state, 1, 1, now() - %s::interval, now() - %s::interval,
                  now() - %s::interval, 'completed'
           FROM generate_series(1, %s) RETURNING id""", (queue, state, age, age, age, n)).fetchall()
    return [r[0] for r in rows]


def left(conn: psycopg.Connection, ids: list[int]) -> set[int]:
    return {r[0] for r in conn.execute("SELECT id FROM pgq.jobs WHERE id = ANY(%s)", (ids,))}


def test_configure_queue_sets_and_keeps_the_retention_of_each_state(conn: psycopg.Connection) -> None:
    row = conn.execute("SELECT retention, retention_failed, retention_cancelled FROM pgq.configure_queue('q')"
                       ).fetchone()
    assert row == (timedelta(days=7), None, None)  # never set: NULL, the queue's retention
    conn.execute("SELECT pgq.configure_queue('q', retention => '1 day', retention_failed => '30 days', "
                 "retention_cancelled => '0')")
    conn.execute("SELECT pgq.configure_queue('q', max_attempts => 3)")  # NULL leaves them as they are
    assert conn.execute("SELECT retention::text, retention_failed::text, retention_cancelled::text "
                        "FROM pgq.queues WHERE name = 'q'").fetchone() == ("1 day", "30 days", "00:00:00")


@pytest.mark.parametrize(("argument", "value", "message"), [
    ("retention_failed", "-1 second", "must be between 0 and 3650 days"),
    ("retention_cancelled", "3651 days", "must be between 0 and 3650 days"),
    ("retention_failed", "1 month", "must not count months or years"),
    ("retention_cancelled", "1 day -1 hour", "must not mix a positive and a negative part"),
])
def test_a_bad_retention_is_refused_naming_it_and_nothing_is_written(
        conn: psycopg.Connection, argument: str, value: str, message: str) -> None:
    conn.execute("SELECT pgq.configure_queue('q', retention => '2 days')")
    with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
        conn.execute(f"SELECT pgq.configure_queue('q', retention => '1 day', {argument} => %s::interval)",
                     (value,))
    assert argument in str(caught.value) and message in str(caught.value)
    assert conn.execute("SELECT retention::text, retention_failed, retention_cancelled FROM pgq.queues "
                        "WHERE name = 'q'").fetchone() == ("2 days", None, None)


def per_state_history(conn: psycopg.Connection) -> tuple[list[int], list[int]]:
    """Queue q keeps done jobs 1 hour, failed 30 days, cancelled not at all; queue other has the
    defaults (7 days for every state). Returns (the jobs past their retention, the others)."""
    conn.execute("SELECT pgq.configure_queue('q', retention => '1 hour', retention_failed => '30 days', "
                 "retention_cancelled => '0')")
    conn.execute("SELECT pgq.configure_queue('other')")
    doomed = (finished(conn, "q", "done", "2 hours", 3) + finished(conn, "q", "failed", "31 days", 2)
              + finished(conn, "q", "cancelled", "1 second", 2))
    kept = (finished(conn, "q", "done", "10 minutes", 2) + finished(conn, "q", "failed", "2 days", 3)
            + finished(conn, "other", "done", "2 hours") + finished(conn, "other", "failed", "6 days")
            + finished(conn, "other", "cancelled", "6 days"))
    conn.execute("SELECT pgq.enqueue('q', 'k')")  # a live job is never touched
    return doomed, kept


def test_the_sweep_deletes_each_state_past_its_own_retention(conn: psycopg.Connection) -> None:
    doomed, kept = per_state_history(conn)
    conn.execute("SELECT pgq.sweep()")
    assert left(conn, doomed) == set() and left(conn, kept) == set(kept)
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'pending'") == 1


def test_prune_follows_the_same_rule_and_older_than_overrides_it(conn: psycopg.Connection) -> None:
    doomed, kept = per_state_history(conn)
    assert one(conn, "SELECT pgq.prune()") == len(doomed)
    assert left(conn, kept) == set(kept)
    assert one(conn, "SELECT pgq.prune(older_than => interval '0')") == len(kept)
    assert one(conn, "SELECT count(*) FROM pgq.jobs") == 1


def test_a_sweep_deletes_at_most_ten_per_job_of_max_jobs(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('a', retention => '1 hour')")
    conn.execute("SELECT pgq.configure_queue('b', retention_failed => '1 hour')")
    finished(conn, "a", "done", "1 day", 150)
    finished(conn, "b", "failed", "1 day", 100)
    counts = []
    for _ in range(4):
        before = one(conn, "SELECT count(*) FROM pgq.jobs")
        conn.execute("SELECT pgq.sweep(max_jobs => 10)")
        counts.append(before - one(conn, "SELECT count(*) FROM pgq.jobs"))
    assert counts == [100, 100, 50, 0]
    assert one(conn, "SELECT pgq.prune(max_jobs => 1)") == 0


def test_the_sweep_reads_the_jobs_it_deletes_not_the_history_it_keeps(conn: psycopg.Connection) -> None:
    """5,000 failed jobs kept 30 days finished before 20 done jobs past their 1 hour: a sweep that
    deletes the 20 fetches a few rows per deleted job (pg_stat_xact_user_tables), not the 5,000."""
    conn.execute("SELECT pgq.configure_queue('q', retention => '1 hour', retention_failed => '30 days')")
    finished(conn, "q", "failed", "2 days", 5000)
    doomed = finished(conn, "q", "done", "1 day", 20)
    conn.execute("ANALYZE pgq.jobs")
    with conn.transaction():
        conn.execute("SELECT pgq.sweep()")
        fetched = one(conn, "SELECT idx_tup_fetch + seq_tup_read FROM pg_stat_xact_user_tables "
                            "WHERE relid = 'pgq.jobs'::regclass")
    assert left(conn, doomed) == set()
    assert one(conn, "SELECT count(*) FROM pgq.jobs") == 5000
    assert fetched <= 10 * len(doomed), fetched


def test_a_job_a_retry_holds_is_skipped_and_once_retried_never_deleted(connect) -> None:
    a, b = connect(), connect()
    a.execute("SELECT pgq.configure_queue('q', retention_failed => '1 hour')")
    [job_id] = finished(a, "q", "failed", "1 day")
    other = finished(a, "q", "failed", "1 day")
    b.execute("BEGIN")
    assert one(b, "SELECT pgq.retry(%s)", (job_id,)) is True  # holds the row, not committed
    a.execute("SET lock_timeout = '2s'")
    a.execute("SELECT pgq.sweep()")  # does not wait for b: the held job is skipped, the other deleted
    assert left(a, other) == set()
    b.execute("COMMIT")
    a.execute("SELECT pgq.sweep()")
    assert one(a, "SELECT state::text FROM pgq.jobs WHERE id = %s", (job_id,)) == "pending"


def test_retention_zero_under_claimers_and_completers_loses_nothing(connect) -> None:
    """Retention 0: every finished job is due for deletion at once. Two workers claim and complete
    (or fail) 400 jobs while a third session sweeps in a loop: every complete and fail is accepted,
    no unfinished job is deleted, every job is finished once (the counters), and the sweeps leave no
    finished job behind."""
    setup = connect()
    setup.execute("SELECT pgq.configure_queue('q', retention => '0', max_attempts => 1)")
    total = 400
    setup.execute("SELECT pgq.enqueue_many('q', 'k', array_fill('{}'::jsonb, ARRAY[%s]))", (total,))
    refused: list[int] = []
    errors: list[BaseException] = []
    ended = [0, 0]
    done = threading.Event()

    def work(index: int) -> None:
        try:
            c = connect()
            while True:
                rows = c.execute("SELECT id, attempt FROM pgq.claim(%s, queues => '{q}', batch => 5)",
                                 (f"w{index}",)).fetchall()
                if not rows:
                    return
                for job_id, attempt in rows:
                    if job_id % 3:
                        ok = one(c, "SELECT pgq.complete(%s, %s)", (job_id, attempt))
                    else:
                        ok = one(c, "SELECT pgq.fail(%s, %s, 'no')", (job_id, attempt))
                    if ok:
                        ended[index] += 1
                    else:
                        refused.append(job_id)
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    def sweep() -> None:
        try:
            c = connect()
            while not done.is_set():
                c.execute("SELECT pgq.sweep(max_jobs => 5)")
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    sweeper = threading.Thread(target=sweep)
    workers = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    sweeper.start()
    for t in workers:
        t.start()
    for t in workers:
        t.join(timeout=120)
    done.set()
    sweeper.join(timeout=60)
    assert not errors and not refused
    assert sum(ended) == total
    setup.execute("SELECT pgq.sweep(max_jobs => 1000)")
    assert one(setup, "SELECT count(*) FROM pgq.jobs") == 0
    assert setup.execute("SELECT sum(done_total + failed_total)::int FROM pgq.metrics()").fetchone() == (total,)
