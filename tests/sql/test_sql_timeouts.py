"""Execution timeouts (max_run_time) and progress checkpoints (pgq.progress).

Timeouts: an attempt may run at most max_run_time from its claim, by the database clock. claim
and renew never lease past the deadline (renew at it returns NULL), and the recovery (sweep,
claim's probe) ends the attempt as timed_out: retried after a backoff while attempts remain,
failed otherwise; the timed-out attempt's writes are then refused.
Progress: fenced like complete, replaced by each call, kept across retries, returned by claim.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import psycopg
import pytest

from clockdb import clock_module_dsn, dsn, set_clock  # noqa: F401  (fixtures)
from sqlfixtures import row_counts, sqlstate_of
from sqlhelpers import claim, events, job, one

T0 = "2030-01-01 12:00:00+00"


def at(seconds: float) -> str:
    return (datetime.fromisoformat(T0) + timedelta(seconds=seconds)).isoformat()


def utc(seconds: float) -> datetime:
    return (datetime.fromisoformat(T0) + timedelta(seconds=seconds)).astimezone(timezone.utc)


# Timeouts ----------------------------------------------------------------------------------------


def test_a_queues_max_run_time_caps_the_claims_lease_and_sets_the_attempts_deadline(conn):
    set_clock(conn, T0)
    settings = conn.execute(
        "SELECT max_run_time FROM pgq.configure_queue('q', max_run_time => '10 seconds')").fetchone()
    assert settings == (timedelta(seconds=10),)
    a = one(conn, "SELECT pgq.enqueue('q', 'k')")
    (c,) = claim(conn)  # the queue's lease is 30 s: capped at the deadline
    assert (c["id"], c["lease_until"], c["deadline"]) == (a, utc(10), utc(10))
    row = job(conn, a)
    assert (row["lease_until"], row["deadline"], row["claimed_at"]) == (utc(10), utc(10), utc(0))
    b = one(conn, "SELECT pgq.enqueue('q', 'k')")
    (c,) = claim(conn, lease="2 seconds")  # a shorter lease stays as it is
    assert (c["id"], c["lease_until"], c["deadline"]) == (b, utc(2), utc(10))


def test_a_jobs_max_run_time_overrides_the_queues_and_no_limit_means_no_deadline(conn):
    set_clock(conn, T0)
    conn.execute("SELECT pgq.configure_queue('q', max_run_time => '1 hour')")
    a = one(conn, "SELECT pgq.enqueue('q', 'k', max_run_time => '5 seconds')")
    b, d = [r[0] for r in conn.execute(
        "SELECT * FROM pgq.enqueue_many('q', 'k', ARRAY['{}', '{}']::jsonb[], max_run_time => '7 seconds')")]
    e = one(conn, "SELECT pgq.enqueue('q', 'k')")
    got = {c["id"]: (c["lease_until"], c["deadline"]) for c in claim(conn, batch=4)}
    assert got == {a: (utc(5), utc(5)), b: (utc(7), utc(7)), d: (utc(7), utc(7)), e: (utc(30), utc(3600))}
    assert job(conn, a)["max_run_time"] == timedelta(seconds=5)
    # '0' removes the queue's limit; NULL leaves it unchanged.
    assert conn.execute("SELECT max_run_time FROM pgq.configure_queue('q', lease => '1 minute')").fetchone() \
        == (timedelta(hours=1),)
    assert conn.execute("SELECT max_run_time FROM pgq.configure_queue('q', max_run_time => '0')").fetchone() == (None,)
    f = one(conn, "SELECT pgq.enqueue('q', 'k')")
    (c,) = claim(conn)
    assert (c["id"], c["lease_until"], c["deadline"]) == (f, utc(60), None)


def test_renew_never_leases_past_the_deadline_and_returns_null_at_it_without_a_rejection(conn):
    set_clock(conn, T0)
    a = one(conn, "SELECT pgq.enqueue('q', 'k', max_run_time => '20 seconds')")
    (c,) = claim(conn, lease="5 seconds")
    set_clock(conn, at(4))
    assert one(conn, "SELECT pgq.renew(%s, 1, '5 seconds')", (a,)) == utc(9)
    set_clock(conn, at(18))
    assert one(conn, "SELECT pgq.renew(%s, 1, '5 seconds')", (a,)) == utc(20)
    set_clock(conn, at(20))
    assert one(conn, "SELECT pgq.renew(%s, 1)", (a,)) is None
    assert job(conn, a)["lease_until"] == utc(20)
    assert [e[0] for e in events(conn, a)] == ["claimed"]  # at the deadline, renew is not a stale write
    assert one(conn, "SELECT pgq.renew(%s, 2)", (a,)) is None  # a wrong attempt still is
    assert [e[0] for e in events(conn, a)] == ["claimed", "rejected"]


def test_a_sweep_ends_a_timed_out_attempt_retries_it_with_backoff_and_refuses_its_late_writes(conn):
    set_clock(conn, T0)
    conn.execute("SELECT pgq.configure_queue('q', backoff_base => '1 minute', backoff_cap => '1 minute')")
    a = one(conn, "SELECT pgq.enqueue('q', 'k', max_run_time => '3 seconds', max_attempts => 2)")
    (c,) = claim(conn, worker="hung", lease="1 minute")
    set_clock(conn, at(2.9))
    assert one(conn, "SELECT pgq.sweep()") == 0
    set_clock(conn, at(3.5))
    assert one(conn, "SELECT pgq.sweep()") == 1
    row = job(conn, a)
    assert (row["state"], row["last_event"], row["last_error"], row["lease_until"]) == (
        "pending", "timed_out", "timed out after 00:00:03", None)
    assert row["run_at"] == utc(3.5 + 60)  # the queue's backoff (base = cap = 1 minute)
    assert events(conn, a) == [("claimed", 1, "pending", "running"), ("timed_out", 1, "running", "pending")]
    note = one(conn, "SELECT note FROM pgq.job_events WHERE job_id = %s AND event = 'timed_out'", (a,))
    assert note == "timed out after 00:00:03"
    # The fence refuses the timed-out attempt's outcome.
    assert one(conn, "SELECT pgq.complete(%s, 1)", (a,)) is False
    assert one(conn, "SELECT pgq.fail(%s, 1, 'late')", (a,)) is None
    # The last attempt times out to failed.
    set_clock(conn, at(70))
    (c,) = claim(conn, lease="1 minute")
    assert c["attempt"] == 2 and c["deadline"] == utc(73)
    set_clock(conn, at(80))
    assert claim(conn) == []  # the claim's probe recovers it, and there is nothing left to claim
    row = job(conn, a)
    assert (row["state"], row["last_event"], row["finished_at"]) == ("failed", "timed_out", utc(80))


def test_an_attempt_whose_lease_expired_before_its_deadline_is_a_lease_expiry_not_a_timeout(conn):
    set_clock(conn, T0)
    a = one(conn, "SELECT pgq.enqueue('q', 'k', max_run_time => '1 hour')")
    claim(conn, lease="5 seconds")  # the worker dies: no renew
    set_clock(conn, at(6))
    assert one(conn, "SELECT pgq.sweep()") == 1
    row = job(conn, a)
    assert (row["state"], row["last_event"], row["run_at"] <= utc(0)) == ("pending", "lease_expired", True)


def test_a_completion_before_recovery_counts_like_one_after_a_lease_expiry(conn):
    """Between the deadline and the recovery the attempt still owns the job: the fence is the
    state, as for an expired lease. (The Python worker discards outcomes after its deadline.)"""
    set_clock(conn, T0)
    a = one(conn, "SELECT pgq.enqueue('q', 'k', max_run_time => '1 second')")
    claim(conn)
    set_clock(conn, at(5))
    assert one(conn, "SELECT pgq.complete(%s, 1)", (a,)) is True
    assert one(conn, "SELECT pgq.sweep()") == 0


@pytest.mark.parametrize(("sql", "sqlstate"), [
    ("SELECT pgq.enqueue('q', 'k', max_run_time => '0')", "22023"),
    ("SELECT pgq.enqueue('q', 'k', max_run_time => '-1 second')", "22023"),
    ("SELECT pgq.enqueue('q', 'k', max_run_time => '366 days')", "22023"),
    ("SELECT pgq.enqueue_many('q', 'k', ARRAY['{}']::jsonb[], max_run_time => '0')", "22023"),
    ("SELECT pgq.configure_queue('q', max_run_time => '-1 second')", "22023"),
    ("SELECT pgq.configure_queue('q', max_run_time => '366 days')", "22023"),
])
def test_a_bad_max_run_time_is_22023_naming_it_and_writes_nothing(conn, sql, sqlstate):
    before = row_counts(conn)
    with pytest.raises(psycopg.Error) as info:
        conn.execute(sql)
    assert info.value.sqlstate == sqlstate
    assert 'argument "max_run_time"' in str(info.value)
    assert row_counts(conn) == before


# Progress ----------------------------------------------------------------------------------------


def test_progress_is_fenced_replaced_and_handed_to_the_next_attempt_after_a_retry(conn):
    a = one(conn, "SELECT pgq.enqueue('q', 'k')")
    (c,) = claim(conn)
    assert c["progress"] is None
    assert one(conn, "SELECT pgq.progress(%s, 1, '{\"page\": 3}')", (a,)) is True
    assert one(conn, "SELECT pgq.progress(%s, 1, '{\"page\": 7, \"cursor\": \"x\"}')", (a,)) is True
    assert conn.execute("SELECT progress FROM pgq.get_job(%s)", (a,)).fetchone() == ({"page": 7, "cursor": "x"},)
    assert [e[0] for e in events(conn, a)] == ["claimed"]  # progress writes no event
    # Not the owner: false, nothing stored, a rejection recorded.
    assert one(conn, "SELECT pgq.progress(%s, 2, '{\"page\": 99}')", (a,)) is False
    assert one(conn, "SELECT pgq.progress(12345, 1, '{}')") is False
    assert [e[0] for e in events(conn, a)] == ["claimed", "rejected"]
    # The attempt fails; the next one resumes from the checkpoint.
    assert one(conn, "SELECT pgq.fail(%s, 1, 'crash', retry_in => '1 second')", (a,)) == "pending"
    conn.execute("UPDATE pgq.jobs SET run_at = now() - interval '1 second' WHERE id = %s", (a,))
    (c,) = claim(conn)
    assert (c["attempt"], c["progress"]) == (2, {"page": 7, "cursor": "x"})
    # The old attempt can no longer write it.
    assert one(conn, "SELECT pgq.progress(%s, 1, '{\"page\": 0}')", (a,)) is False
    assert job(conn, a)["progress"] == {"page": 7, "cursor": "x"}
    assert one(conn, "SELECT pgq.complete(%s, 2)", (a,)) is True
    assert one(conn, "SELECT pgq.progress(%s, 2, '{}')", (a,)) is False  # done: not running any more


@pytest.mark.parametrize(("args", "sqlstate", "argument"), [
    ("NULL, 1, '{}'", "22004", "id"),
    ("1, NULL, '{}'", "22004", "attempt"),
    ("1, 1, NULL", "22004", "progress"),
    ("1, 1, '[1, 2]'", "22023", "progress"),
    ("1, 1, '\"text\"'", "22023", "progress"),
    ("1, 1, jsonb_build_object('big', repeat(md5(random()::text), 40000))", "22023", "progress"),
])
def test_bad_progress_arguments_are_clear_errors_and_change_nothing(conn, args, sqlstate, argument):
    a = one(conn, "SELECT pgq.enqueue('q', 'k')")
    claim(conn)
    one(conn, "SELECT pgq.progress(%s, 1, '{\"ok\": true}')", (a,))
    before = row_counts(conn)
    with pytest.raises(psycopg.Error) as info:
        conn.execute(f"SELECT pgq.progress({args})")
    assert info.value.sqlstate == sqlstate
    assert f'argument "{argument}"' in str(info.value)
    assert row_counts(conn) == before
    assert job(conn, a)["progress"] == {"ok": True}


def test_progress_and_timeouts_for_the_worker_role(conn, connect):
    a = one(conn, "SELECT pgq.enqueue('q', 'k', max_run_time => '1 minute')")
    w = connect(role="pgq_worker")
    (c,) = claim(w)
    assert c["deadline"] is not None
    assert one(w, "SELECT pgq.progress(%s, 1, '{\"n\": 1}')", (a,)) is True
    assert sqlstate_of(connect(role="pgq_producer"), "SELECT pgq.progress(1, 1, '{}')") == "42501"
