"""The failover fence in SQL (pgq._check_timeline, run by pgq.claim), on one server: a promotion
is simulated by making pgq.fence remember an older timeline than the server's. The real thing (a
kill -9 and pg_promote()) is in tests/processes/test_topology_failover.py."""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest

from pgq_tools.lab.harness import Harness

from sqlhelpers import claim, events, job, one

STEP = 100000  # pgq._fence_step()


def promoted(conn: psycopg.Connection, timelines: int = 1) -> None:
    """As if this server had been promoted ``timelines`` times since the fences were last moved."""
    conn.execute("UPDATE pgq.fence SET timeline = pgq._timeline() - %s", (timelines,))


def test_the_fence_remembers_the_servers_timeline_from_the_install(conn):
    expected = [(one(conn, "SELECT pgq._timeline()"), 0)]
    assert conn.execute("SELECT timeline, moves FROM pgq.fence").fetchall() == expected


def test_after_a_promotion_every_unfinished_job_skips_the_old_primarys_numbers(conn, connect):
    done, running, pending, failed, cancelled, unknown = (
        one(conn, "SELECT pgq.enqueue('q', 'k', jsonb_build_object('n', %s))", (n,)) for n in range(6))
    c = claim(conn, "w", batch=6)
    assert [r["attempt"] for r in c] == [1] * 6
    assert one(conn, "SELECT pgq.complete(%s, 1)", (done,))
    assert one(conn, "SELECT pgq.fail(%s, 1, 'boom', retry_in => '1 second')", (pending,)) == "pending"
    assert one(conn, "SELECT pgq.fail(%s, 1, 'fatal', retryable => false)", (failed,)) == "failed"
    assert one(conn, "SELECT pgq.mark_unknown(%s, 1, 'who knows')", (unknown,))
    conn.execute("SELECT pgq.cancel(%s)", (cancelled,))
    promoted(conn)

    fresh = connect()  # a new session: its first claim checks the timeline
    assert claim(fresh, "w2") == []  # nothing due (the retry waits a second); the fences moved
    skips = dict(fresh.execute("SELECT id, attempt_skip FROM pgq.jobs").fetchall())
    assert skips == {done: 0, running: STEP, pending: STEP, failed: STEP, cancelled: STEP, unknown: STEP}
    assert fresh.execute("SELECT moves, jobs_moved FROM pgq.fence").fetchone() == (1, 5)
    assert events(fresh, running)[-1] == ("fenced", 1, "running", "running")

    # The running job's owner is the one this server's history knows: its token still works.
    assert one(fresh, "SELECT pgq.renew(%s, 1)", (running,)) is not None
    # Every number issued from now on is past the old primary's.
    conn.execute("UPDATE pgq.jobs SET run_at = now() - interval '1 second' WHERE id = %s", (pending,))
    conn.execute("SELECT pgq.retry(%s)", (failed,))
    conn.execute("SELECT pgq.retry(%s)", (cancelled,))
    conn.execute("SELECT pgq.resolve(%s, 'pending')", (unknown,))
    got = {r["id"]: (r["attempt"], r["max_attempts"]) for r in claim(fresh, "w2", batch=10)}
    assert got == {pending: (2 + STEP, 25 + STEP), failed: (2 + STEP, 25 + STEP),
                   cancelled: (2 + STEP, 25 + STEP), unknown: (2 + STEP, 25 + STEP)}
    assert one(fresh, "SELECT pgq.complete(%s, 2)", (pending,)) is False  # the old primary's attempt 2
    assert one(fresh, "SELECT pgq.complete(%s, %s)", (pending, 2 + STEP)) is True
    assert job(fresh, pending)["attempt_offset"] == STEP and job(fresh, pending)["attempt_skip"] == 0


def test_the_fences_move_once_per_promotion_not_once_per_claim(conn, connect):
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k')")
    promoted(conn)
    claimed = [claim(connect(), "w") for _ in range(3)]  # three sessions, three first claims
    assert [len(c) for c in claimed] == [1, 0, 0]
    assert conn.execute("SELECT moves FROM pgq.fence").fetchone() == (1,)
    assert job(conn, job_id)["attempt"] == 1 + STEP  # claimed by the first of those claims


def test_one_fence_move_per_timeline_passed(conn, connect):
    """Two promotions whose first fence move never reached the second standby: the numbers the
    middle primary issued (up to 2 * STEP) are skipped too."""
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k')")
    promoted(conn, timelines=2)
    assert [r["attempt"] for r in claim(connect(), "w")] == [1 + 2 * STEP]
    assert job(conn, job_id)["max_attempts"] == 25 + 2 * STEP


def test_every_claim_reads_the_fence_row_and_keeps_no_session_state(conn, connect):
    """The check is the fence row's, read by every claim: no session setting says it was done (a
    setting is one any caller can forge: tests/sql/test_limit_isolation.py)."""
    one(conn, "SELECT pgq.enqueue('q', 'k')")
    worker = connect()
    assert claim(worker, "w")
    assert one(worker, "SELECT current_setting('pgq.fence', true)") is None
    promoted(conn)  # (cannot happen to a live session; shows that its next claim checks again)
    claim(worker, "w")
    assert one(conn, "SELECT moves FROM pgq.fence") == 1

    promoted(conn)
    tx = connect(autocommit=False)
    claim(tx, "w")   # this claim moves the fences ...
    tx.rollback()    # ... and the rollback undoes the move
    assert one(conn, "SELECT moves FROM pgq.fence") == 1
    tx.rollback()


def test_concurrent_first_claims_after_a_promotion_move_the_fences_once(dsn, conn):
    """The first claim locks the fence row; a second session's first claim waits for it, then
    finds the fences moved (no second move, so its claim issues the same numbers as without it)."""
    ids = [one(conn, "SELECT pgq.enqueue('q', 'k', jsonb_build_object('n', %s))", (n,)) for n in range(2)]
    promoted(conn)
    with Harness(dsn, experiment="fence", step_timeout=10) as h:
        a, b = h.session("a"), h.session("b")
        h.step(a, "a_begin", "BEGIN")
        first = h.step(a, "a_claim", "SELECT id, attempt FROM pgq.claim('a')")
        assert first.ok and first.rows == [(ids[0], 1 + STEP)]
        second = h.step(b, "b_claim", "SELECT id, attempt FROM pgq.claim('b')")
        assert second.blocked, "the second first-claim waits for the fence row"
        h.step(a, "a_commit", "COMMIT")
        h.wait(second)
        assert second.ok and second.rows == [(ids[1], 1 + STEP)]
    assert conn.execute("SELECT moves, jobs_moved FROM pgq.fence").fetchone() == (1, 2)


def test_backoff_counts_attempts_not_skipped_numbers(conn, connect):
    """pgq.fail's backoff after a fence move is the one of the job's real attempt count."""
    conn.execute("SELECT pgq.configure_queue('q', backoff_base => '10 seconds', backoff_cap => '1 day')")
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k')")
    promoted(conn)
    (row,) = claim(connect(), "w")
    assert row["attempt"] == 1 + STEP
    before = one(conn, "SELECT now()")
    assert one(conn, "SELECT pgq.fail(%s, %s, 'boom')", (job_id, row["attempt"])) == "pending"
    delay = job(conn, job_id)["run_at"] - before
    # Attempt 1's delay is the base (10 s); counted from attempt 100001 it would be the cap (1 day).
    assert timedelta(seconds=9) <= delay <= timedelta(seconds=11), delay


@pytest.mark.parametrize("role", ["pgq_worker"])
def test_a_worker_role_gets_the_fence_moved_by_its_claim(conn, connect, role):
    one(conn, "SELECT pgq.enqueue('q', 'k')")
    promoted(conn)
    worker = connect(role=role)
    assert [r["attempt"] for r in claim(worker, "w")] == [1 + STEP]


def test_a_deleted_fence_row_is_recreated_by_the_next_move(conn, connect):
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k')")
    conn.execute("DELETE FROM pgq.fence")
    assert [r["attempt"] for r in claim(connect(), "w")] == [1 + STEP]
    assert conn.execute("SELECT timeline, moves FROM pgq.fence").fetchone() == (one(conn, "SELECT pgq._timeline()"), 1)
    assert job(conn, job_id)["attempt_offset"] == STEP
    claim(connect(), "w")  # a later session finds the fence in place: no second move
    assert one(conn, "SELECT moves FROM pgq.fence") == 1


def test_a_timed_out_attempt_backs_off_from_the_real_attempt_count_too(conn, connect):
    conn.execute("SELECT pgq.configure_queue('q', backoff_base => '10 seconds', backoff_cap => '1 day')")
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k', max_run_time => '1 hour')")
    promoted(conn)
    (row,) = claim(connect(), "w")
    assert row["attempt"] == 1 + STEP
    conn.execute("UPDATE pgq.jobs SET deadline = now() - interval '1 second', lease_until = now() - interval '1 second'"
                 " WHERE id = %s", (job_id,))  # as if the hour had passed
    before = one(conn, "SELECT now()")
    assert one(conn, "SELECT pgq.sweep()") == 1
    after = job(conn, job_id)
    assert (after["state"], after["last_event"]) == ("pending", "timed_out")
    assert timedelta(seconds=9) <= after["run_at"] - before <= timedelta(seconds=11), after["run_at"] - before


def test_a_claim_by_kinds_checks_the_fence_too(conn, connect):
    one(conn, "SELECT pgq.enqueue('q', 'mail')")
    promoted(conn)
    rows = connect().execute("SELECT kind, attempt FROM pgq.claim('w', kinds => ARRAY['mail'])").fetchall()
    assert rows == [("mail", 1 + STEP)]
