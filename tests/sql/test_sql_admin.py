"""Sweep, admin calls (cancel, retry, resolve, prune, pause, resume, configure_queue) and the
observation functions (stats, version)."""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest

from pgq_thin.migrate import shipped_schema_version

from sqlfixtures import dsn, module_dsn, running_job, sqlstate_of  # noqa: F401  (one database per module, emptied per test)
from sqlhelpers import claim, events, expire_lease, job, notifications_until_marker, one

# sweep ---------------------------------------------------------------------------------------------

def test_sweep_makes_an_expired_job_pending_at_once_and_says_its_lease_expired(conn):
    job_id, attempt = running_job(conn, tenant="t")
    expire_lease(conn, job_id)
    lease_until = job(conn, job_id)["lease_until"]
    assert one(conn, "SELECT pgq.sweep()") == 1
    row = job(conn, job_id)
    assert row["state"] == "pending" and row["lease_until"] is None
    assert row["attempt"] == attempt  # the attempt it used is counted
    assert row["run_at"] <= one(conn, "SELECT now()")
    assert "lease expired" in row["last_error"] and "w1" in row["last_error"]
    assert str(lease_until.year) in row["last_error"]
    assert events(conn, job_id)[-1] == ("lease_expired", attempt, "running", "pending")
    assert claim(conn)[0]["attempt"] == attempt + 1


def test_sweep_fails_an_expired_job_that_used_its_last_attempt(conn):
    job_id, _ = running_job(conn, max_attempts=1)
    expire_lease(conn, job_id)
    assert one(conn, "SELECT pgq.sweep()") == 1
    row = job(conn, job_id)
    assert row["state"] == "failed" and row["finished_at"] is not None
    assert "lease expired" in row["last_error"]
    assert events(conn, job_id)[-1] == ("lease_expired", 1, "running", "failed")


def test_sweep_leaves_live_leases_and_other_states_alone(conn):
    live, _ = running_job(conn)
    pending = one(conn, "SELECT pgq.enqueue('q', 'k')")
    before = conn.execute("SELECT * FROM pgq.jobs ORDER BY id").fetchall()
    assert one(conn, "SELECT pgq.sweep()") == 0
    assert conn.execute("SELECT * FROM pgq.jobs ORDER BY id").fetchall() == before
    assert {job(conn, live)["state"], job(conn, pending)["state"]} == {"running", "pending"}


def test_sweep_recovers_at_most_max_jobs_per_call(conn):
    ids = [running_job(conn)[0] for _ in range(3)]
    for i in ids:
        expire_lease(conn, i)
    assert one(conn, "SELECT pgq.sweep(2)") == 2
    assert one(conn, "SELECT pgq.sweep(2)") == 1
    assert one(conn, "SELECT pgq.sweep(2)") == 0


def test_sweep_does_not_touch_a_job_completed_meanwhile(connect):
    setup = connect()
    job_id, attempt = running_job(setup)
    expire_lease(setup, job_id)
    owner = connect(autocommit=False)
    assert one(owner, "SELECT pgq.complete(%s, %s)", (job_id, attempt)) is True  # not yet committed
    sweeper = connect()
    sweeper.execute("SET lock_timeout = '2s'")
    assert one(sweeper, "SELECT pgq.sweep()") == 0
    owner.commit()
    assert one(sweeper, "SELECT pgq.sweep()") == 0
    row = job(setup, job_id)
    assert row["state"] == "done" and row["last_error"] is None


def test_sweep_does_not_touch_a_job_reclaimed_meanwhile(connect):
    setup = connect()
    job_id, attempt = running_job(setup)
    expire_lease(setup, job_id)
    rescuer = connect(autocommit=False)
    (c,) = claim(rescuer, worker="rescuer")  # recovers and re-claims; not yet committed
    assert c["attempt"] == attempt + 1
    sweeper = connect()
    sweeper.execute("SET lock_timeout = '2s'")
    assert one(sweeper, "SELECT pgq.sweep()") == 0
    rescuer.commit()
    assert one(sweeper, "SELECT pgq.sweep()") == 0
    row = job(setup, job_id)
    assert row["state"] == "running" and row["attempt"] == attempt + 1 and row["claimed_by"] == "rescuer"


def test_sweep_does_not_touch_a_job_renewed_meanwhile(connect):
    setup = connect()
    job_id, attempt = running_job(setup)
    expire_lease(setup, job_id)
    owner = connect(autocommit=False)
    assert one(owner, "SELECT pgq.renew(%s, %s, '1 hour')", (job_id, attempt)) is not None
    sweeper = connect()
    sweeper.execute("SET lock_timeout = '2s'")
    assert one(sweeper, "SELECT pgq.sweep()") == 0
    owner.commit()
    assert one(sweeper, "SELECT pgq.sweep()") == 0
    row = job(setup, job_id)
    assert row["state"] == "running" and row["attempt"] == attempt and row["last_error"] is None


def test_sweep_notifies_the_queues_it_recovered_jobs_for(connect):
    setup = connect()
    job_id, _ = running_job(setup, queue="swept")
    expire_lease(setup, job_id)
    listener = connect()
    listener.execute("LISTEN pgq")
    assert one(setup, "SELECT pgq.sweep()") == 1
    assert notifications_until_marker(listener, setup) == ["swept"]


# cancel --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("state", ["pending", "running", "outcome_unknown"])
def test_cancel_cancels_a_job_that_has_not_finished(conn, state):
    job_id, attempt = running_job(conn)
    if state == "pending":
        conn.execute("SELECT pgq.release(%s, %s)", (job_id, attempt))
    elif state == "outcome_unknown":
        conn.execute("SELECT pgq.mark_unknown(%s, %s, 'n')", (job_id, attempt))
    assert one(conn, "SELECT pgq.cancel(%s)", (job_id,)) is True
    row = job(conn, job_id)
    assert row["state"] == "cancelled" and row["lease_until"] is None and row["finished_at"] is not None
    assert events(conn, job_id)[-1] == ("cancelled", attempt, state, "cancelled")
    assert one(conn, "SELECT pgq.complete(%s, %s)", (job_id, attempt)) is False
    assert claim(conn) == []


@pytest.mark.parametrize("final", ["done", "failed", "cancelled"])
def test_cancel_of_a_finished_job_answers_false_and_changes_nothing(conn, final):
    job_id, attempt = running_job(conn)
    if final == "done":
        conn.execute("SELECT pgq.complete(%s, %s)", (job_id, attempt))
    elif final == "failed":
        conn.execute("SELECT pgq.fail(%s, %s, 'x', retryable => false)", (job_id, attempt))
    else:
        conn.execute("SELECT pgq.cancel(%s)", (job_id,))
    before = job(conn, job_id)
    n = len(events(conn, job_id))
    assert one(conn, "SELECT pgq.cancel(%s)", (job_id,)) is False
    assert job(conn, job_id) == before and len(events(conn, job_id)) == n


# retry ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("final", ["failed", "cancelled"])
def test_retry_makes_a_failed_or_cancelled_job_pending_now_keeping_its_attempt(conn, final):
    job_id, attempt = running_job(conn, max_attempts=1)
    if final == "failed":
        conn.execute("SELECT pgq.fail(%s, %s, 'broken', retryable => false)", (job_id, attempt))
    else:
        conn.execute("SELECT pgq.cancel(%s)", (job_id,))
    retried, now = conn.execute("SELECT pgq.retry(%s), statement_timestamp()", (job_id,)).fetchone()
    assert retried is True
    row = job(conn, job_id)
    assert row["state"] == "pending" and row["run_at"] == now and row["finished_at"] is None
    assert row["attempt"] == 1 and row["max_attempts"] == 2
    assert events(conn, job_id)[-1] == ("retried", 1, final, "pending")
    assert claim(conn)[0]["attempt"] == 2


def test_retry_keeps_a_higher_max_attempts(conn):
    job_id, attempt = running_job(conn, max_attempts=9)
    conn.execute("SELECT pgq.fail(%s, %s, 'x', retryable => false)", (job_id, attempt))
    conn.execute("SELECT pgq.retry(%s)", (job_id,))
    assert job(conn, job_id)["max_attempts"] == 9


@pytest.mark.parametrize("state", ["pending", "running", "done", "outcome_unknown"])
def test_retry_of_a_job_in_another_state_raises_55000_and_changes_nothing(conn, state):
    job_id, attempt = running_job(conn)
    if state == "pending":
        conn.execute("SELECT pgq.release(%s, %s)", (job_id, attempt))
    elif state == "done":
        conn.execute("SELECT pgq.complete(%s, %s)", (job_id, attempt))
    elif state == "outcome_unknown":
        conn.execute("SELECT pgq.mark_unknown(%s, %s, 'n')", (job_id, attempt))
    before = job(conn, job_id)
    with pytest.raises(psycopg.Error) as info:
        conn.execute("SELECT pgq.retry(%s)", (job_id,))
    assert info.value.sqlstate == "55000"
    assert state in str(info.value)
    assert job(conn, job_id) == before


# resolve -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("target", ["done", "failed", "cancelled", "pending"])
def test_resolve_settles_an_outcome_unknown_job(conn, target):
    job_id, attempt = running_job(conn, max_attempts=1)
    conn.execute("SELECT pgq.mark_unknown(%s, %s, 'did the charge go through?')", (job_id, attempt))
    assert one(conn, "SELECT pgq.resolve(%s, %s)", (job_id, target)) is True
    row = job(conn, job_id)
    assert row["state"] == target
    assert row["attempt"] == 1
    assert events(conn, job_id)[-1] == ("resolved", 1, "outcome_unknown", target)
    if target == "pending":
        assert row["finished_at"] is None and row["max_attempts"] == 2
        assert claim(conn)[0]["attempt"] == 2
    else:
        assert row["finished_at"] is not None and row["max_attempts"] == 1
        assert claim(conn) == []


@pytest.mark.parametrize("state", ["pending", "running", "done"])
def test_resolve_of_a_job_that_is_not_outcome_unknown_raises_55000(conn, state):
    job_id, attempt = running_job(conn)
    if state == "pending":
        conn.execute("SELECT pgq.release(%s, %s)", (job_id, attempt))
    elif state == "done":
        conn.execute("SELECT pgq.complete(%s, %s)", (job_id, attempt))
    before = job(conn, job_id)
    assert sqlstate_of(conn, "SELECT pgq.resolve(%s, 'done')", (job_id,)) == "55000"
    assert job(conn, job_id) == before


# prune ---------------------------------------------------------------------------------------------

def test_prune_deletes_finished_jobs_older_than_the_cutoff_with_their_events(conn):
    old_done, a = running_job(conn)
    conn.execute("SELECT pgq.complete(%s, %s)", (old_done, a))
    old_failed, a = running_job(conn)
    conn.execute("SELECT pgq.fail(%s, %s, 'x', retryable => false)", (old_failed, a))
    old_cancelled = one(conn, "SELECT pgq.enqueue('q', 'k')")
    conn.execute("SELECT pgq.cancel(%s)", (old_cancelled,))
    recent_done, a = running_job(conn)
    conn.execute("SELECT pgq.complete(%s, %s)", (recent_done, a))
    running, _ = running_job(conn)
    pending = one(conn, "SELECT pgq.enqueue('q', 'k')")
    conn.execute("UPDATE pgq.jobs SET finished_at = now() - interval '2 days', "
                 "created_at = now() - interval '2 days' WHERE id = ANY(%s)",
                 ([old_done, old_failed, old_cancelled],))
    conn.execute("UPDATE pgq.jobs SET run_at = now() - interval '30 days' WHERE id = %s", (pending,))
    assert one(conn, "SELECT pgq.prune(interval '1 day')") == 3
    left = [r[0] for r in conn.execute("SELECT id FROM pgq.jobs ORDER BY id")]
    assert left == sorted([recent_done, running, pending])
    assert one(conn, "SELECT count(*) FROM pgq.job_events WHERE job_id = ANY(%s)",
               ([old_done, old_failed, old_cancelled],)) == 0
    assert one(conn, "SELECT count(*) FROM pgq.job_events WHERE job_id = %s", (recent_done,)) == 2


def test_prune_works_in_batches_of_max_jobs(conn):
    for _ in range(5):
        job_id, a = running_job(conn)
        conn.execute("SELECT pgq.complete(%s, %s)", (job_id, a))
    conn.execute("UPDATE pgq.jobs SET finished_at = now() - interval '1 hour'")
    assert [one(conn, "SELECT pgq.prune(interval '1 minute', 2)") for _ in range(4)] == [2, 2, 1, 0]


def test_prune_without_a_cutoff_uses_each_queues_retention(conn):
    conn.execute("SELECT pgq.configure_queue('short', retention => '1 hour')")
    for queue in ("short", "long"):
        job_id, a = running_job(conn, queue=queue)
        conn.execute("SELECT pgq.complete(%s, %s)", (job_id, a))
    conn.execute("UPDATE pgq.jobs SET finished_at = now() - interval '2 hours'")
    assert one(conn, "SELECT pgq.prune()") == 1
    assert [r[0] for r in conn.execute("SELECT queue FROM pgq.jobs")] == ["long"]


# pause, resume, configure_queue ----------------------------------------------------------------------

def test_pause_stops_claims_and_resume_lets_them_go_on(conn):
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k')")
    paused = conn.execute("SELECT name, paused FROM pgq.pause('q')").fetchone()
    assert paused == ("q", True)
    assert claim(conn) == []
    assert one(conn, "SELECT pgq.enqueue('q', 'k')") > job_id  # enqueue still works
    resumed = conn.execute("SELECT name, paused FROM pgq.resume('q')").fetchone()
    assert resumed == ("q", False)
    assert claim(conn)[0]["id"] == job_id


def test_pause_and_resume_of_a_queue_that_does_not_exist_are_refused_and_create_nothing(conn):
    for call in ("pause", "resume"):
        with pytest.raises(psycopg.errors.InvalidParameterValue) as err:
            conn.execute(f"SELECT pgq.{call}('emials')")
        assert err.value.diag.message_primary == 'pgq: argument "queue" names no queue: \'emials\''
        assert "pgq.configure_queue" in err.value.diag.message_hint
    with pytest.raises(psycopg.errors.InvalidParameterValue, match='argument "queue" is not a valid name'):
        conn.execute("SELECT pgq.pause('bad queue!')")
    with pytest.raises(psycopg.errors.NullValueNotAllowed, match='argument "queue" must not be NULL'):
        conn.execute("SELECT pgq.pause(NULL)")
    assert one(conn, "SELECT count(*) FROM pgq.queues WHERE name IN ('emials', 'bad queue!')") == 0


def test_a_queue_made_by_configure_queue_can_be_paused_before_its_first_job(conn):
    conn.execute("SELECT pgq.configure_queue('later')")  # configure_queue still creates a queue
    assert conn.execute("SELECT paused FROM pgq.pause('later')").fetchone() == (True,)
    job_id = one(conn, "SELECT pgq.enqueue('later', 'k')")
    assert claim(conn) == []
    conn.execute("SELECT pgq.resume('later')")
    assert claim(conn)[0]["id"] == job_id


def test_pausing_does_not_stop_running_jobs_from_completing(conn):
    job_id, attempt = running_job(conn)
    conn.execute("SELECT pgq.pause('q')")
    assert one(conn, "SELECT pgq.complete(%s, %s)", (job_id, attempt)) is True


def test_resume_notifies_and_pause_does_not(connect):
    c = connect()
    listener = connect()
    listener.execute("LISTEN pgq")
    c.execute("SELECT pgq.configure_queue('q')")
    c.execute("SELECT pgq.pause('q')")
    c.execute("SELECT pgq.resume('q')")
    assert notifications_until_marker(listener, c) == ["q"]


def test_configure_queue_changes_only_the_given_settings_and_returns_them(conn):
    cols = "name, paused, lease, max_attempts, backoff_base, backoff_cap, retention, notify, audit"
    first = conn.execute(f"SELECT {cols} FROM pgq.configure_queue('q', lease => '2 minutes', "
                         "max_attempts => 3)").fetchone()
    assert first == ("q", False, timedelta(minutes=2), 3, timedelta(seconds=1), timedelta(hours=1),
                     timedelta(days=7), True, True)
    second = conn.execute(f"SELECT {cols} FROM pgq.configure_queue(queue => 'q', backoff_base => '5 seconds', "
                          "backoff_cap => '10 minutes', retention => '1 day', notify => false, "
                          "audit => false)").fetchone()
    assert second == ("q", False, timedelta(minutes=2), 3, timedelta(seconds=5), timedelta(minutes=10),
                      timedelta(days=1), False, False)
    unchanged = conn.execute(f"SELECT {cols} FROM pgq.configure_queue('q')").fetchone()
    assert unchanged == second
    assert conn.execute(f"SELECT {cols} FROM pgq.queues").fetchall() == [second]


def test_configure_queue_settings_apply_to_later_jobs(conn):
    conn.execute("SELECT pgq.configure_queue('q', lease => '3 minutes', max_attempts => 2)")
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k')")
    assert job(conn, job_id)["max_attempts"] == 2
    lease_until, now = conn.execute(
        "SELECT c.lease_until, statement_timestamp() FROM pgq.claim('w1') AS c").fetchone()
    assert lease_until == now + timedelta(minutes=3)


def test_configure_queue_keeps_the_backoff_cap_at_least_the_base(conn):
    conn.execute("SELECT pgq.configure_queue('q', backoff_base => '1 minute', backoff_cap => '2 minutes')")
    assert sqlstate_of(conn, "SELECT pgq.configure_queue('q', backoff_base => '3 minutes')") == "22023"
    assert sqlstate_of(conn, "SELECT pgq.configure_queue('q', backoff_cap => '30 seconds')") == "22023"
    row = conn.execute("SELECT backoff_base, backoff_cap FROM pgq.queues WHERE name = 'q'").fetchone()
    assert row == (timedelta(minutes=1), timedelta(minutes=2))
    conn.execute("SELECT pgq.configure_queue('q', backoff_base => '3 minutes', backoff_cap => '3 minutes')")


# stats and version ---------------------------------------------------------------------------------

def test_stats_counts_every_state_per_queue(conn):
    def add(state: str) -> int:
        if state == "pending":
            return one(conn, "SELECT pgq.enqueue('q', 'k')")
        job_id, attempt = running_job(conn)
        if state == "scheduled":
            conn.execute("SELECT pgq.snooze(%s, %s, '1 hour')", (job_id, attempt))
        elif state == "expired":
            expire_lease(conn, job_id)
        elif state == "done":
            conn.execute("SELECT pgq.complete(%s, %s)", (job_id, attempt))
        elif state == "failed":
            conn.execute("SELECT pgq.fail(%s, %s, 'x', retryable => false)", (job_id, attempt))
        elif state == "cancelled":
            conn.execute("SELECT pgq.cancel(%s)", (job_id,))
        elif state == "outcome_unknown":
            conn.execute("SELECT pgq.mark_unknown(%s, %s, 'n')", (job_id, attempt))
        return job_id

    # In this order, so that no claim made by add() picks up an earlier job.
    plan = {"scheduled": 1, "running": 3, "done": 4, "failed": 1, "cancelled": 2,
            "outcome_unknown": 1, "expired": 1, "pending": 2}
    for state, n in plan.items():
        for _ in range(n):
            add(state)
    conn.execute("UPDATE pgq.jobs SET run_at = now() - interval '10 minutes' WHERE state = 'pending' "
                 "AND run_at <= now()")
    conn.execute("SELECT pgq.configure_queue('idle')")
    conn.execute("SELECT pgq.pause('idle')")
    cur = conn.execute("SELECT * FROM pgq.stats()")
    rows = {r[0]: dict(zip([d.name for d in cur.description], r)) for r in cur.fetchall()}
    assert set(rows) == {"idle", "q"}
    q = rows["q"]
    assert q["paused"] is False
    assert (q["pending"], q["scheduled"], q["running"], q["expired"], q["done"], q["failed"],
            q["cancelled"], q["outcome_unknown"]) == (2, 1, 4, 1, 4, 1, 2, 1)
    assert timedelta(minutes=10) <= q["oldest_ready_age"] < timedelta(minutes=11)
    idle = rows["idle"]
    assert idle["paused"] is True
    assert [idle[k] for k in ("pending", "scheduled", "running", "expired", "done", "failed",
                              "cancelled", "outcome_unknown")] == [0] * 8
    assert idle["oldest_ready_age"] is None


def test_version_is_the_number_of_the_newest_migration(conn):
    assert one(conn, "SELECT pgq.version()") == str(shipped_schema_version())
