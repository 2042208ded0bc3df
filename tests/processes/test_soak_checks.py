"""The chaos soak's invariant checks (pgq_tools.soak._check) on hand-made histories: each check
must fail on the history it exists to catch, so that "0" in the soak's summary means something."""

from __future__ import annotations

import psycopg

from pgq_tools.soak import QUEUE, SoakCounts, _check, _prepare

from sqlhelpers import expire_lease, one


def claim(conn: psycopg.Connection, worker: str) -> tuple[int, int]:
    row = conn.execute("SELECT id, attempt FROM pgq.claim(%s, ARRAY[%s], 1)", (worker, QUEUE)).fetchone()
    assert row is not None
    return row[0], row[1]


def effect(conn: psycopg.Connection, job_id: int, attempt: int, token: str) -> None:
    conn.execute("INSERT INTO pgq_soak.effects (job_id, attempt, worker, token) VALUES (%s, %s, 'w', %s)",
                 (job_id, attempt, token))


def a_job_recovered_once(conn: psycopg.Connection) -> int:
    """Attempt 1 executes, loses its lease (recovered by a sweep), attempt 2 executes and completes."""
    job_id = one(conn, "SELECT pgq.enqueue(%s, 'soak.work')", (QUEUE,))
    _, attempt = claim(conn, "w1")
    effect(conn, job_id, attempt, f"{job_id}-1")
    expire_lease(conn, job_id)
    assert one(conn, "SELECT pgq.sweep()") == 1
    _, attempt2 = claim(conn, "w2")
    effect(conn, job_id, attempt2, f"{job_id}-2")
    assert one(conn, "SELECT pgq.complete(%s, %s)", (job_id, attempt2)) is True
    return job_id


def test_a_clean_history_passes_and_counts_its_attempt_intervals(dsn: str, conn: psycopg.Connection) -> None:
    _prepare(dsn)
    job_id = a_job_recovered_once(conn)
    counts = SoakCounts()
    assert _check(dsn, [job_id], counts) == []
    assert counts.attempts == 2 and counts.overlapping_attempts == 0 and counts.double_owners == 0
    assert counts.closest_handover_ms is not None and counts.closest_handover_ms >= 0
    assert counts.duplicates == 1 and counts.explained == 1 and counts.not_executed == 0


def test_two_attempts_live_at_once_are_two_live_owners(dsn: str, conn: psycopg.Connection) -> None:
    """Attempt 2 claimed while attempt 1 still ran (each attempt on its own (job, attempt) ledger
    row, so the old per-attempt row count saw nothing)."""
    _prepare(dsn)
    job_id = one(conn, "SELECT pgq.enqueue(%s, 'soak.work')", (QUEUE,))
    _, attempt = claim(conn, "w1")
    effect(conn, job_id, attempt, "t1")
    # A second owner: the job handed out again while attempt 1 is running and its lease is valid.
    conn.execute("UPDATE pgq.jobs SET attempt = 2, claimed_by = 'w2' WHERE id = %s", (job_id,))
    conn.execute("INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state)"
                 " VALUES (%s, 2, 'w2', 'claimed', 'pending', 'running')", (job_id,))
    effect(conn, job_id, 2, "t2")
    assert one(conn, "SELECT pgq.complete(%s, 2)", (job_id,)) is True
    conn.execute("INSERT INTO pgq.job_events (job_id, attempt, worker, event, from_state, to_state)"
                 " VALUES (%s, 1, 'w1', 'failed', 'running', 'failed')", (job_id,))
    counts = SoakCounts()
    problems = _check(dsn, [job_id], counts)
    assert counts.overlapping_attempts == 1 and counts.double_owners == 1
    assert any("two live owners: job" in p and "attempts 1 and 2" in p for p in problems), problems
    # Its duplicate effect has no expired lease behind it either.
    assert counts.unexplained == 1


def test_a_duplicate_effect_without_an_expired_lease_is_unexplained(dsn: str, conn: psycopg.Connection) -> None:
    _prepare(dsn)
    job_id = a_job_recovered_once(conn)
    conn.execute("DELETE FROM pgq.job_events WHERE job_id = %s AND event = 'lease_expired'", (job_id,))
    counts = SoakCounts()
    problems = _check(dsn, [job_id], counts)
    assert counts.duplicates == 1 and counts.unexplained == 1
    assert any("not explained by an expired lease" in p for p in problems), problems


def test_a_done_job_its_completing_attempt_never_executed_breaks_at_least_once(
        dsn: str, conn: psycopg.Connection) -> None:
    _prepare(dsn)
    job_id = one(conn, "SELECT pgq.enqueue(%s, 'soak.work')", (QUEUE,))
    _, attempt = claim(conn, "w1")
    assert one(conn, "SELECT pgq.complete(%s, %s)", (job_id, attempt)) is True  # no ledger row
    counts = SoakCounts()
    problems = _check(dsn, [job_id], counts)
    assert counts.not_executed == 1
    assert any("without an execution of the completing attempt" in p for p in problems), problems
