"""Owner operations (renew, complete, complete_many, fail, release, snooze, mark_unknown): what each
does for the owner, that each is idempotent for the same attempt, and that a stale, unknown or
finished attempt gets "not yours" (false / NULL) and changes nothing but the audit trail."""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sqlfixtures import dsn, make_due, module_dsn, running_job  # noqa: F401  (one database per module, emptied per test)
from sqlhelpers import claim, events, expire_lease, job, one

# Every owner operation, as (name, SQL taking id and attempt, the "not yours" answer).
OWNER_OPS = [
    ("renew", "SELECT pgq.renew(%s, %s)", None),
    ("complete", "SELECT pgq.complete(%s, %s)", False),
    ("fail", "SELECT pgq.fail(%s, %s, 'stale error')", None),
    ("release", "SELECT pgq.release(%s, %s)", False),
    ("snooze", "SELECT pgq.snooze(%s, %s, interval '1 hour')", None),
    ("mark_unknown", "SELECT pgq.mark_unknown(%s, %s, 'stale note')", False),
    ("complete_many",
     "SELECT coalesce(array_agg(x), '{}') FROM pgq.complete_many(ARRAY[%s]::bigint[], ARRAY[%s]::int[]) AS x", []),
]
OWNER_OP_IDS = [op[0] for op in OWNER_OPS]


# renew ----------------------------------------------------------------------------------------------

def test_renew_extends_the_lease_from_the_database_clock(conn):
    job_id, attempt = running_job(conn)
    new_lease, now = conn.execute("SELECT pgq.renew(%s, %s, interval '1 hour'), statement_timestamp()",
                                  (job_id, attempt)).fetchone()
    assert new_lease == now + timedelta(hours=1)
    assert job(conn, job_id)["lease_until"] == new_lease
    default_lease, now = conn.execute("SELECT pgq.renew(%s, %s), statement_timestamp()",
                                      (job_id, attempt)).fetchone()
    assert default_lease == now + timedelta(seconds=30)


def test_renew_after_the_lease_expired_but_before_anyone_reclaimed_still_works(conn):
    job_id, attempt = running_job(conn)
    expire_lease(conn, job_id)
    assert one(conn, "SELECT pgq.renew(%s, %s)", (job_id, attempt)) is not None
    assert claim(conn) == []


def test_renew_answers_null_once_the_job_was_reclaimed(conn):
    job_id, attempt = running_job(conn)
    expire_lease(conn, job_id)
    (again,) = claim(conn, worker="w2")
    before = job(conn, job_id)
    assert one(conn, "SELECT pgq.renew(%s, %s)", (job_id, attempt)) is None
    assert job(conn, job_id) == before
    assert one(conn, "SELECT pgq.renew(%s, %s)", (job_id, again["attempt"])) is not None


# complete ------------------------------------------------------------------------------------------

def test_complete_marks_the_job_done_and_stores_the_result(conn):
    job_id, attempt = running_job(conn)
    ok, now = conn.execute("SELECT pgq.complete(%s, %s, '{\"ok\": true}'), statement_timestamp()",
                           (job_id, attempt)).fetchone()
    assert ok is True
    row = job(conn, job_id)
    assert row["state"] == "done" and row["result"] == {"ok": True}
    assert row["finished_at"] == now and row["lease_until"] is None
    assert row["attempt"] == attempt
    assert events(conn, job_id)[-1] == ("completed", 1, "running", "done")


def test_repeating_a_complete_returns_true_again_and_changes_nothing(conn):
    job_id, attempt = running_job(conn)
    assert one(conn, "SELECT pgq.complete(%s, %s, '{\"n\": 1}')", (job_id, attempt)) is True
    before = job(conn, job_id)
    n_events = len(events(conn, job_id))
    assert one(conn, "SELECT pgq.complete(%s, %s, '{\"n\": 2}')", (job_id, attempt)) is True
    assert job(conn, job_id) == before
    assert len(events(conn, job_id)) == n_events


def test_complete_of_an_unknown_id_answers_false(conn):
    assert one(conn, "SELECT pgq.complete(987654, 1)") is False
    assert one(conn, "SELECT count(*) FROM pgq.job_events") == 0


# complete_many -------------------------------------------------------------------------------------

def test_complete_many_completes_only_the_pairs_the_caller_owns(conn):
    a, a_att = running_job(conn)
    b, b_att = running_job(conn)
    c, c_att = running_job(conn)
    pending = one(conn, "SELECT pgq.enqueue('other', 'k')")
    ids = [b, a, c, pending, 99999]
    attempts = [b_att, a_att, c_att + 1, 1, 1]
    got = [r[0] for r in conn.execute("SELECT * FROM pgq.complete_many(%s, %s)", (ids, attempts))]
    assert sorted(got) == sorted([a, b])
    assert [job(conn, i)["state"] for i in (a, b, c, pending)] == ["done", "done", "running", "pending"]
    assert events(conn, c)[-1] == ("rejected", c_att + 1, "running", None)


def test_complete_many_is_idempotent_for_the_same_attempts(conn):
    a, a_att = running_job(conn)
    b, b_att = running_job(conn)
    first = conn.execute("SELECT * FROM pgq.complete_many(%s, %s)", ([a], [a_att])).fetchall()
    assert first == [(a,)]
    before = job(conn, a)
    again = [r[0] for r in conn.execute("SELECT * FROM pgq.complete_many(%s, %s)", ([a, b], [a_att, b_att]))]
    assert sorted(again) == sorted([a, b])
    assert job(conn, a) == before
    assert [e[0] for e in events(conn, a)] == ["claimed", "completed"]
    assert one(conn, "SELECT pgq.complete(%s, %s)", (b, b_att)) is True


def test_complete_many_with_empty_arrays_completes_nothing(conn):
    running_job(conn)
    assert conn.execute("SELECT * FROM pgq.complete_many('{}', '{}')").fetchall() == []
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'running'") == 1


# fail ----------------------------------------------------------------------------------------------

def test_fail_with_attempts_left_schedules_a_retry_within_the_backoff_bounds(conn):
    conn.execute("SELECT pgq.configure_queue('q', backoff_base => '10 seconds', backoff_cap => '40 seconds')")
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k', max_attempts => 10)")
    delays = []
    for attempt in range(1, 6):
        make_due(conn, job_id)
        (c,) = claim(conn)
        assert c["attempt"] == attempt
        state, now = conn.execute("SELECT pgq.fail(%s, %s, %s), statement_timestamp()",
                                  (job_id, attempt, f"boom {attempt}")).fetchone()
        assert state == "pending"
        row = job(conn, job_id)
        assert row["state"] == "pending" and row["lease_until"] is None and row["finished_at"] is None
        assert row["last_error"] == f"boom {attempt}"
        delays.append(row["run_at"] - now)
    # attempt 1: [base/2 .. base] clamped up to base; attempt 2: [10, 20]; then capped at 40.
    assert all(timedelta(seconds=10) <= d <= timedelta(seconds=40) for d in delays), delays
    assert delays[0] == timedelta(seconds=10)
    assert timedelta(seconds=20) <= delays[4] <= timedelta(seconds=40)


def test_fail_with_retry_in_schedules_the_retry_exactly_then(conn):
    job_id, attempt = running_job(conn)
    state, now = conn.execute("SELECT pgq.fail(%s, %s, 'later', retry_in => '7 minutes'), statement_timestamp()",
                              (job_id, attempt)).fetchone()
    assert state == "pending"
    assert job(conn, job_id)["run_at"] == now + timedelta(minutes=7)
    assert claim(conn) == []


def test_fail_not_retryable_fails_the_job_for_good(conn):
    job_id, attempt = running_job(conn, max_attempts=5)
    assert one(conn, "SELECT pgq.fail(%s, %s, 'bad input', retryable => false)", (job_id, attempt)) == "failed"
    row = job(conn, job_id)
    assert row["state"] == "failed" and row["last_error"] == "bad input"
    assert row["finished_at"] is not None and row["lease_until"] is None
    assert events(conn, job_id)[-1] == ("failed", 1, "running", "failed")
    assert claim(conn) == []


def test_fail_on_the_last_attempt_fails_the_job_and_keeps_the_last_error(conn):
    job_id, attempt = running_job(conn, max_attempts=2)
    assert one(conn, "SELECT pgq.fail(%s, %s, 'first')", (job_id, attempt)) == "pending"
    make_due(conn, job_id)
    (c,) = claim(conn)
    assert c["attempt"] == 2
    assert one(conn, "SELECT pgq.fail(%s, 2, 'second and last')", (job_id,)) == "failed"
    row = job(conn, job_id)
    assert row["state"] == "failed" and row["last_error"] == "second and last" and row["attempt"] == 2
    assert [e[:4] for e in events(conn, job_id)] == [
        ("claimed", 1, "pending", "running"), ("failed", 1, "running", "pending"),
        ("claimed", 2, "pending", "running"), ("failed", 2, "running", "failed")]


def test_repeating_a_fail_returns_the_same_state_and_changes_nothing(conn):
    job_id, attempt = running_job(conn)
    assert one(conn, "SELECT pgq.fail(%s, %s, 'once')", (job_id, attempt)) == "pending"
    before = job(conn, job_id)
    assert one(conn, "SELECT pgq.fail(%s, %s, 'twice')", (job_id, attempt)) == "pending"
    assert job(conn, job_id) == before


def test_fail_with_a_huge_attempt_and_year_long_backoff_does_not_overflow(conn):
    conn.execute("SELECT pgq.configure_queue('q', max_attempts => 10000, backoff_base => '365 days', "
                 "backoff_cap => '365 days')")
    job_id, _ = running_job(conn)
    conn.execute("UPDATE pgq.jobs SET attempt = 9999 WHERE id = %s", (job_id,))
    state, now = conn.execute("SELECT pgq.fail(%s, 9999, 'again'), statement_timestamp()", (job_id,)).fetchone()
    assert state == "pending"
    assert job(conn, job_id)["run_at"] == now + timedelta(days=365)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(attempt=st.one_of(st.integers(-(2**31), 2**31 - 1), st.integers(0, 64)),
       base=st.timedeltas(min_value=timedelta(microseconds=1), max_value=timedelta(days=365)),
       cap=st.timedeltas(min_value=timedelta(microseconds=1), max_value=timedelta(days=365)))
def test_backoff_stays_within_base_and_cap_for_every_attempt(conn, attempt, base, cap):
    base, cap = min(base, cap), max(base, cap)  # the queues table requires base <= cap
    delay = one(conn, "SELECT pgq._backoff(%s, %s, %s)", (attempt, base, cap))
    assert base <= delay <= cap
    # Exponential with jitter in the upper half: at least half of min(cap, base * 2^(attempt-1)).
    growth = 2.0 ** (min(max(attempt, 1), 41) - 1)
    ceiling = min(cap.total_seconds(), base.total_seconds() * growth)
    assert delay.total_seconds() >= ceiling / 2 - 1e-6


# release and snooze ----------------------------------------------------------------------------------

def test_release_gives_the_job_back_now_without_using_up_an_attempt(conn):
    job_id, attempt = running_job(conn, max_attempts=1)
    assert one(conn, "SELECT pgq.release(%s, %s)", (job_id, attempt)) is True
    row = job(conn, job_id)
    assert row["state"] == "pending" and row["lease_until"] is None
    assert row["attempt"] == 1 and row["max_attempts"] == 2
    assert events(conn, job_id)[-1] == ("released", 1, "running", "pending")
    (again,) = claim(conn)
    assert again["id"] == job_id and again["attempt"] == 2


def test_repeating_a_release_returns_true_and_changes_nothing(conn):
    job_id, attempt = running_job(conn)
    assert one(conn, "SELECT pgq.release(%s, %s)", (job_id, attempt)) is True
    before = job(conn, job_id)
    assert one(conn, "SELECT pgq.release(%s, %s)", (job_id, attempt)) is True
    assert job(conn, job_id) == before


def test_snooze_sleeps_the_job_without_using_up_an_attempt(conn):
    job_id, attempt = running_job(conn, max_attempts=1)
    run_at, now = conn.execute("SELECT pgq.snooze(%s, %s, interval '10 minutes'), statement_timestamp()",
                               (job_id, attempt)).fetchone()
    assert run_at == now + timedelta(minutes=10)
    row = job(conn, job_id)
    assert row["state"] == "pending" and row["run_at"] == run_at
    assert row["attempt"] == 1 and row["max_attempts"] == 2
    assert claim(conn) == []
    assert events(conn, job_id)[-1] == ("snoozed", 1, "running", "pending")
    assert one(conn, "SELECT pgq.snooze(%s, %s, interval '1 second')", (job_id, attempt)) == run_at
    assert job(conn, job_id) == row
    make_due(conn, job_id)
    assert claim(conn)[0]["attempt"] == 2


# mark_unknown ----------------------------------------------------------------------------------------

def test_mark_unknown_parks_the_job_until_resolved(conn):
    job_id, attempt = running_job(conn)
    assert one(conn, "SELECT pgq.mark_unknown(%s, %s, 'payment timed out')", (job_id, attempt)) is True
    row = job(conn, job_id)
    assert row["state"] == "outcome_unknown" and row["lease_until"] is None
    assert row["last_error"] == "payment timed out"
    assert events(conn, job_id)[-1] == ("marked_unknown", 1, "running", "outcome_unknown")
    assert claim(conn) == []
    assert one(conn, "SELECT pgq.mark_unknown(%s, %s, 'again')", (job_id, attempt)) is True
    assert job(conn, job_id) == row


# Ownership: the fence ------------------------------------------------------------------------------

def test_stale_worker_writes_are_rejected_after_lease_expiry_and_reclaim(conn):
    job_id, attempt_a = running_job(conn)
    expire_lease(conn, job_id)
    (b,) = claim(conn, worker="worker-b")
    assert b["attempt"] == attempt_a + 1
    before = job(conn, job_id)
    for name, sql, not_yours in OWNER_OPS:
        assert one(conn, sql, (job_id, attempt_a)) == not_yours, name
        assert job(conn, job_id) == before, f"stale {name} changed the job"
    rejected = [e for e in events(conn, job_id) if e[0] == "rejected"]
    assert rejected == [("rejected", attempt_a, "running", None)] * len(OWNER_OPS)
    notes = [r[0] for r in conn.execute("SELECT note FROM pgq.job_events WHERE event = 'rejected' ORDER BY id")]
    assert all("worker-b" in n and f"attempt {attempt_a}" in n for n in notes)
    assert one(conn, "SELECT pgq.complete(%s, %s)", (job_id, b["attempt"])) is True
    assert job(conn, job_id)["state"] == "done"


def finish(conn: psycopg.Connection, how: str) -> tuple[int, int]:
    """A job brought into state `how` by its attempt; returns (id, that attempt)."""
    job_id, attempt = running_job(conn)
    if how == "done":
        one(conn, "SELECT pgq.complete(%s, %s)", (job_id, attempt))
    elif how == "failed":
        one(conn, "SELECT pgq.fail(%s, %s, 'x', retryable => false)", (job_id, attempt))
    elif how == "cancelled":
        one(conn, "SELECT pgq.cancel(%s)", (job_id,))
    elif how == "outcome_unknown":
        one(conn, "SELECT pgq.mark_unknown(%s, %s, 'x')", (job_id, attempt))
    elif how == "pruned":
        one(conn, "SELECT pgq.complete(%s, %s)", (job_id, attempt))
        conn.execute("UPDATE pgq.jobs SET finished_at = now() - interval '1 day' WHERE id = %s", (job_id,))
        assert one(conn, "SELECT pgq.prune(interval '1 hour')") == 1
    return job_id, attempt


def snapshot(conn: psycopg.Connection) -> tuple:
    return (conn.execute("SELECT * FROM pgq.jobs ORDER BY id").fetchall(),
            conn.execute("SELECT * FROM pgq.queues ORDER BY name").fetchall())


# What the attempt that finished the job gets when it repeats an operation: the operation that
# finished it is idempotent; every other one is "not yours".
IDEMPOTENT_REPEAT = {("done", "complete"): True, ("done", "complete_many"): "ids",
                     ("failed", "fail"): "failed", ("outcome_unknown", "mark_unknown"): True}


@pytest.mark.parametrize("how", ["done", "failed", "cancelled", "outcome_unknown", "pruned", "never_existed"])
def test_owner_operations_on_finished_or_missing_jobs_answer_not_yours_and_change_nothing(conn, how):
    for name, sql, not_yours in OWNER_OPS:
        if how == "never_existed":
            job_id, attempt = 10**12, 1
        else:
            job_id, attempt = finish(conn, how)
        for quoted in (attempt, attempt + 1):
            before = snapshot(conn)
            expected = not_yours
            if quoted == attempt and (how, name) in IDEMPOTENT_REPEAT:
                expected = IDEMPOTENT_REPEAT[(how, name)]
                expected = [job_id] if expected == "ids" else expected
            assert one(conn, sql, (job_id, quoted)) == expected, (name, quoted)
            assert snapshot(conn) == before, (name, quoted)


def test_owner_operations_with_a_wrong_attempt_answer_not_yours(conn):
    job_id, attempt = running_job(conn)
    assert attempt == 1
    before = job(conn, job_id)
    for name, sql, not_yours in OWNER_OPS:
        for wrong in (-1, 0, 2, 2**31 - 1, -(2**31)):
            assert one(conn, sql, (job_id, wrong)) == not_yours, (name, wrong)
            assert job(conn, job_id) == before, (name, wrong)


def test_no_aba_a_snoozed_then_reclaimed_job_never_accepts_the_old_attempt(conn):
    job_id, first = running_job(conn)
    assert one(conn, "SELECT pgq.snooze(%s, %s, interval '1 second')", (job_id, first)) is not None
    make_due(conn, job_id)
    (c,) = claim(conn)
    assert c["attempt"] == first + 1
    before = job(conn, job_id)
    for name, sql, not_yours in OWNER_OPS:
        assert one(conn, sql, (job_id, first)) == not_yours, name
    assert job(conn, job_id) == before


def test_no_aba_an_admin_retry_keeps_the_attempt_and_the_old_attempt_stays_invalid(conn):
    job_id, first = running_job(conn, max_attempts=1)
    assert one(conn, "SELECT pgq.fail(%s, %s, 'final', retryable => false)", (job_id, first)) == "failed"
    assert one(conn, "SELECT pgq.retry(%s)", (job_id,)) is True
    row = job(conn, job_id)
    assert row["attempt"] == first and row["max_attempts"] == first + 1 and row["state"] == "pending"
    # Pending again: the old attempt is not the owner even before anyone claims.
    for name, sql, not_yours in OWNER_OPS:
        assert one(conn, sql, (job_id, first)) == not_yours, name
    assert job(conn, job_id) == row
    (c,) = claim(conn)
    assert c["attempt"] == first + 1
    for name, sql, not_yours in OWNER_OPS:
        assert one(conn, sql, (job_id, first)) == not_yours, name
    assert one(conn, "SELECT pgq.complete(%s, %s)", (job_id, c["attempt"])) is True


def test_attempt_never_decreases_across_every_transition(conn):
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k', max_attempts => 2)")
    seen = [job(conn, job_id)["attempt"]]

    def step(sql: str, *params) -> None:
        conn.execute(sql, params)
        row = job(conn, job_id)
        seen.append(row["attempt"])
        assert row["attempt"] <= row["max_attempts"]

    def claim_now() -> int:
        make_due(conn, job_id)
        (c,) = claim(conn)
        seen.append(c["attempt"])
        return c["attempt"]

    a = claim_now()
    step("SELECT pgq.release(%s, %s)", job_id, a)
    a = claim_now()
    step("SELECT pgq.snooze(%s, %s, '1 second')", job_id, a)
    a = claim_now()
    step("SELECT pgq.fail(%s, %s, 'x')", job_id, a)
    a = claim_now()
    expire_lease(conn, job_id)
    step("SELECT pgq.sweep()")
    step("SELECT pgq.cancel(%s)", job_id)
    step("SELECT pgq.retry(%s)", job_id)
    a = claim_now()
    step("SELECT pgq.mark_unknown(%s, %s, 'hm')", job_id, a)
    step("SELECT pgq.resolve(%s, 'pending')", job_id)
    a = claim_now()
    step("SELECT pgq.complete(%s, %s)", job_id, a)
    assert seen == sorted(seen)
    assert seen[-1] == 6


# Audit ---------------------------------------------------------------------------------------------

def test_every_transition_of_a_job_leaves_an_event(conn):
    job_id, a1 = running_job(conn, max_attempts=3)
    conn.execute("SELECT pgq.renew(%s, %s)", (job_id, a1))
    conn.execute("SELECT pgq.fail(%s, %s, 'e1', retry_in => '1 second')", (job_id, a1))
    make_due(conn, job_id)
    (c,) = claim(conn)
    conn.execute("SELECT pgq.release(%s, %s)", (job_id, c["attempt"]))
    (c,) = claim(conn)
    conn.execute("SELECT pgq.snooze(%s, %s, '1 second')", (job_id, c["attempt"]))
    make_due(conn, job_id)
    (c,) = claim(conn)
    expire_lease(conn, job_id)
    conn.execute("SELECT pgq.sweep()")
    (c,) = claim(conn)
    conn.execute("SELECT pgq.complete(%s, %s)", (job_id, c["attempt"] - 1))  # stale
    conn.execute("SELECT pgq.mark_unknown(%s, %s, 'n')", (job_id, c["attempt"]))
    conn.execute("SELECT pgq.resolve(%s, 'pending')", (job_id,))
    (c,) = claim(conn)
    conn.execute("SELECT pgq.cancel(%s)", (job_id,))
    conn.execute("SELECT pgq.retry(%s)", (job_id,))
    (c,) = claim(conn)
    conn.execute("SELECT pgq.complete(%s, %s)", (job_id, c["attempt"]))
    assert [e[0] for e in events(conn, job_id)] == [
        "claimed", "failed", "claimed", "released", "claimed", "snoozed", "claimed", "lease_expired",
        "claimed", "rejected", "marked_unknown", "resolved", "claimed", "cancelled", "retried",
        "claimed", "completed"]
    workers = conn.execute("SELECT DISTINCT worker FROM pgq.job_events WHERE event = 'claimed'").fetchall()
    assert workers == [("w1",)]


def test_with_audit_off_no_events_are_written(conn):
    conn.execute("SELECT pgq.configure_queue('quiet', audit => false)")
    job_id, a = running_job(conn, queue="quiet")
    conn.execute("SELECT pgq.complete(%s, %s)", (job_id, a + 1))  # stale: would be 'rejected'
    conn.execute("SELECT * FROM pgq.complete_many(%s, %s)", ([job_id], [a + 1]))
    conn.execute("SELECT pgq.fail(%s, %s, 'x')", (job_id, a))
    make_due(conn, job_id)
    (c,) = claim(conn, queues=["quiet"])
    expire_lease(conn, job_id)
    conn.execute("SELECT pgq.sweep()")
    conn.execute("SELECT pgq.cancel(%s)", (job_id,))
    conn.execute("SELECT pgq.retry(%s)", (job_id,))
    (c,) = claim(conn, queues=["quiet"])
    conn.execute("SELECT pgq.complete(%s, %s)", (job_id, c["attempt"]))
    assert job(conn, job_id)["state"] == "done"
    assert one(conn, "SELECT count(*) FROM pgq.job_events") == 0
