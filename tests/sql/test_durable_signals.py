"""Signals and the jobs that wait for them (issue 39): a wait parks the job (no attempt used, no
lease, no slot) until its signal or its timeout, and the job then runs again from the top and is
told the same outcome every time; the first signal of a name wins; the signal privilege; the
second look every signal gets (its check) and when it goes. The races are
tests/sql/test_durable_interleavings.py's."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from clockdb import clock_module_dsn, dsn, set_clock  # noqa: F401  (fixtures)
from durablekit import (
    ADMIN,
    PRODUCER,
    PRODUCER2,
    SIGNALLERS,
    WORKER,
    WORKER2,
    await_signal,
    reclaim,
    rejected,
    running,
    settle,
    signal,
    state,
    steps,
)
from sqlhelpers import claim, expire_lease, job, one

NOW = "2030-01-01 12:00:00+00"


def checks(conn: psycopg.Connection) -> list[tuple[str, str, bool]]:
    return [(r[0], r[1], r[2]) for r in conn.execute(
        "SELECT queue, name, horizon IS NOT NULL FROM pgq.signal_checks ORDER BY id")]


def test_a_signal_sent_before_the_wait_is_answered_at_once_and_parks_nothing(conn):
    job_id, attempt = running(conn)
    assert signal(conn, "approved", '{"by": "ann"}') == 0   # nobody waits yet
    assert await_signal(conn, job_id, attempt, "approved") == ("arrived", {"by": "ann"})
    assert state(conn, job_id) == "running"
    assert steps(conn, job_id) == {"signal:approved": {"status": "arrived", "payload": {"by": "ann"}}}


def test_a_wait_parks_the_job_without_using_an_attempt_and_its_signal_wakes_it_once(conn):
    job_id, attempt = running(conn)
    before = job(conn, job_id)
    assert await_signal(conn, job_id, attempt, "approved", "1 day") == ("waiting", None)
    parked = job(conn, job_id)
    assert (parked["state"], parked["lease_until"], parked["wait_signal"]) == ("waiting", None, "approved")
    assert parked["max_attempts"] == before["max_attempts"] + 1 and parked["attempt"] == attempt
    assert parked["wake_at"] is not None
    assert claim(conn, queues=["q"]) == []                        # it holds no slot and is not claimable
    stats = conn.execute("SELECT waiting, running FROM pgq.stats() WHERE queue = 'q'").fetchone()
    assert stats == (1, 0)
    # The parked attempt is over: its owner operations are not yours any more.
    assert one(conn, "SELECT pgq.complete(%s, %s)", (job_id, attempt)) is False
    assert signal(conn, "approved", '{"by": "ann"}') == 1
    woken = job(conn, job_id)
    assert (woken["state"], woken["wait_signal"], woken["wake_at"], woken["last_event"]) == \
        ("pending", None, None, "signalled")
    assert signal(conn, "approved", '{"by": "bob"}') == 0        # the first wins; nothing is woken again
    again = reclaim(conn, job_id)
    assert again == attempt + 1
    assert await_signal(conn, job_id, again, "approved") == ("arrived", {"by": "ann"})
    events = [r[0] for r in conn.execute(
        "SELECT event FROM pgq.job_events WHERE job_id = %s ORDER BY id", (job_id,))]
    assert events == ["claimed", "awaiting_signal", "rejected", "signalled", "claimed"]
    assert one(conn, "SELECT count(*) FROM pgq.signals WHERE queue = 'q' AND name = 'approved'") == 1


def test_a_signal_wakes_every_job_of_its_queue_waiting_for_it_and_no_other(conn):
    waiting = []
    for queue, name in [("q", "go"), ("q", "go"), ("q", "stop"), ("other", "go")]:
        job_id, attempt = running(conn, queue=queue)
        assert await_signal(conn, job_id, attempt, name)[0] == "waiting"
        waiting.append(job_id)
    assert signal(conn, "go") == 2
    assert [state(conn, j) for j in waiting] == ["pending", "pending", "waiting", "waiting"]


def test_the_outcome_a_job_was_told_stays_when_the_signal_is_pruned(conn):
    job_id, attempt = running(conn)
    assert await_signal(conn, job_id, attempt, "go")[0] == "waiting"
    signal(conn, "go", '{"v": 1}')
    conn.execute("UPDATE pgq.signals SET sent_at = sent_at - interval '30 days'")
    conn.execute("SELECT pgq.prune()")
    assert one(conn, "SELECT count(*) FROM pgq.signals") == 0
    again = reclaim(conn, job_id)
    assert await_signal(conn, job_id, again, "go") == ("arrived", {"v": 1})


def test_a_wait_times_out_in_the_next_settle_and_the_job_is_told_timed_out_even_if_the_signal_comes(conn):
    set_clock(conn, NOW)
    job_id, attempt = running(conn)
    assert await_signal(conn, job_id, attempt, "approved", "1 hour") == ("waiting", None)
    assert job(conn, job_id)["wake_at"].isoformat() == "2030-01-01T13:00:00+00:00"
    set_clock(conn, "2030-01-01 12:59:59+00")
    assert settle(conn) == 0 and state(conn, job_id) == "waiting"
    set_clock(conn, "2030-01-01 13:00:00+00")
    # A worker calls pgq.settle_dependencies about once a second (and pgq.sweep fires them too).
    assert settle(conn) == 1
    row = job(conn, job_id)
    assert (row["state"], row["last_event"], row["wait_signal"]) == ("pending", "wait_timed_out", None)
    assert signal(conn, "approved", '{"late": true}') == 0
    again = reclaim(conn, job_id)
    assert await_signal(conn, job_id, again, "approved") == ("timed_out", None)
    assert steps(conn, job_id) == {"signal:approved": {"status": "timed_out"}}


def test_the_sweep_fires_a_timeout_too_and_a_wait_without_one_waits_on(conn):
    set_clock(conn, NOW)
    timed, a1 = running(conn)
    forever, a2 = running(conn)
    assert await_signal(conn, timed, a1, "x", "1 minute")[0] == "waiting"
    assert await_signal(conn, forever, a2, "y", None)[0] == "waiting"
    assert job(conn, forever)["wake_at"] is None
    set_clock(conn, "2040-01-01 00:00:00+00")
    conn.execute("SELECT pgq.sweep()")
    assert (state(conn, timed), state(conn, forever)) == ("pending", "waiting")


def test_repeating_a_wait_whose_park_committed_answers_waiting_again_and_others_get_no_row(conn, login_as):
    worker, other = login_as(WORKER), login_as(WORKER2)
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k')")
    (c,) = claim(worker, queues=["q"])
    assert await_signal(other, job_id, c["attempt"], "go") is None        # another login: not yours
    assert await_signal(worker, job_id, c["attempt"] + 1, "go") is None   # a wrong attempt
    assert state(conn, job_id) == "running"
    assert await_signal(worker, job_id, c["attempt"], "go") == ("waiting", None)
    assert await_signal(worker, job_id, c["attempt"], "go") == ("waiting", None)   # the repeat
    assert await_signal(other, job_id, c["attempt"], "go") is None
    assert await_signal(worker, job_id, c["attempt"], "stop") is None      # not what it waits for
    assert {who for who, _ in rejected(conn, job_id)} == {WORKER, WORKER2}
    assert state(conn, job_id) == "waiting"


def test_a_stale_attempt_cannot_wait_and_leaves_a_rejected_event(conn):
    job_id, first = running(conn)
    expire_lease(conn, job_id)
    second = reclaim(conn, job_id)
    assert await_signal(conn, job_id, first, "go") is None
    assert rejected(conn, job_id)[-1][1].startswith("await_signal from attempt 1 rejected")
    assert (state(conn, job_id), job(conn, job_id)["attempt"]) == ("running", second)


def test_who_may_signal_is_a_queue_privilege_open_to_producers_until_granted(conn, login_as):
    producer, outsider, admin = login_as(PRODUCER), login_as(PRODUCER2), login_as(ADMIN)
    job_id, attempt = running(conn)
    assert await_signal(conn, job_id, attempt, "go")[0] == "waiting"
    assert one(outsider, "SELECT pgq.signal('q', 'early')") == 0           # no grant: every producer may
    assert one(conn, "SELECT pgq.grant_queue('q', %s, 'signal')", (SIGNALLERS,)) is True
    assert conn.execute("SELECT privilege, role FROM pgq.queue_grants('q')").fetchall() == [("signal", SIGNALLERS)]
    assert one(conn, "SELECT restricted FROM pgq.queues WHERE name = 'q'") == ["signal"]
    for stranger in (producer, outsider):
        with pytest.raises(psycopg.errors.InsufficientPrivilege) as info:
            stranger.execute("SELECT pgq.signal('q', 'go')")
        assert "may not signal queue 'q'" in str(info.value)
    conn.execute(f"GRANT {SIGNALLERS} TO {PRODUCER}")
    try:
        assert one(producer, "SELECT pgq.signal('q', 'go')") == 1
    finally:
        conn.execute(f"REVOKE {SIGNALLERS} FROM {PRODUCER}")
    assert one(admin, "SELECT pgq.signal('q', 'admin-may')") == 0
    # A signal grant restricts signals only: the queue's enqueues stay open.
    assert one(outsider, "SELECT pgq.enqueue('q', 'k')") > 0
    assert one(conn, "SELECT pgq.revoke_queue('q', %s, 'signal')", (SIGNALLERS,)) is True
    assert one(outsider, "SELECT pgq.signal('q', 'open-again')") == 0
    assert one(conn, "SELECT restricted FROM pgq.queues WHERE name = 'q'") is None


def test_a_signal_to_a_queue_that_does_not_exist_creates_nothing(conn):
    with pytest.raises(psycopg.errors.InvalidParameterValue) as info:
        conn.execute("SELECT pgq.signal('nosuch', 'go')")
    assert 'argument "queue"' in str(info.value) and "names no queue" in str(info.value)
    assert one(conn, "SELECT count(*) FROM pgq.queues") == 0


def test_more_waiters_than_one_call_wakes_are_woken_by_the_next_settle(conn):
    n = 1003
    ids = [r[0] for r in conn.execute("SELECT * FROM pgq.enqueue_many('q', 'k', array_fill('{}'::jsonb, ARRAY[%s]))",
                                      (n,))]
    claimed = claim(conn, queues=["q"], batch=1000) + claim(conn, queues=["q"], batch=1000)
    assert len(claimed) == n
    for c in claimed:
        conn.execute("SELECT * FROM pgq.await_signal(%s, %s, 'go', NULL)", (c["id"], c["attempt"]))
    assert signal(conn, "go") == 1000
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'waiting'") == 3
    settle(conn)
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'pending' AND id = ANY(%s)", (ids,)) == n


def test_a_signals_check_goes_after_two_looks_and_stays_while_an_older_transaction_runs(conn, connect):
    job_id, attempt = running(conn)
    signal(conn, "go")
    assert checks(conn) == [("q", "go", False)]
    settle(conn)                                            # the first look stamps it
    assert checks(conn) == [("q", "go", True)]
    settle(conn)                                            # the second lets it go
    assert checks(conn) == []
    # A transaction that began before the stamp (any login's, doing anything) keeps it.
    old = connect(autocommit=False)
    one(old, "SELECT pg_current_xact_id()")
    signal(conn, "again")
    settle(conn)
    settle(conn)
    assert checks(conn) == [("q", "again", True)]
    old.rollback()
    settle(conn)
    assert checks(conn) == []
    assert state(conn, job_id) == "running"


BAD: list[tuple[str, str, str, str]] = [
    ("signal queue NULL", "SELECT pgq.signal(NULL, 'go')", "22004", "queue"),
    ("signal queue bad", "SELECT pgq.signal('a b', 'go')", "22023", "queue"),
    ("signal name NULL", "SELECT pgq.signal('q', NULL)", "22004", "name"),
    ("signal name empty", "SELECT pgq.signal('q', '')", "22023", "name"),
    ("signal name too long", "SELECT pgq.signal('q', repeat('n', 257))", "22023", "name"),
    ("signal payload NULL", "SELECT pgq.signal('q', 'go', NULL)", "22004", "payload"),
    ("signal payload array", "SELECT pgq.signal('q', 'go', '[1]')", "22023", "payload"),
    ("signal payload over 1 MiB",
     "SELECT pgq.signal('q', 'go', jsonb_build_object('x', repeat('a', 1048576)))", "22023", "payload"),
    ("await_signal id NULL", "SELECT * FROM pgq.await_signal(NULL, 1, 'go', NULL)", "22004", "id"),
    ("await_signal attempt NULL", "SELECT * FROM pgq.await_signal($JOB, NULL, 'go', NULL)", "22004", "attempt"),
    ("await_signal name NULL", "SELECT * FROM pgq.await_signal($JOB, 1, NULL, NULL)", "22004", "name"),
    ("await_signal name empty", "SELECT * FROM pgq.await_signal($JOB, 1, '', NULL)", "22023", "name"),
    ("await_signal timeout zero", "SELECT * FROM pgq.await_signal($JOB, 1, 'go', '0')", "22023", "timeout"),
    ("await_signal timeout negative", "SELECT * FROM pgq.await_signal($JOB, 1, 'go', '-1 hour')", "22023",
     "timeout"),
    ("await_signal timeout months", "SELECT * FROM pgq.await_signal($JOB, 1, 'go', '1 mon')", "22023", "timeout"),
    ("await_signal timeout too long", "SELECT * FROM pgq.await_signal($JOB, 1, 'go', '3651 days')", "22023",
     "timeout"),
    ("grant_queue privilege bogus", "SELECT pgq.grant_queue('q', 'pgq_producer', 'signals')", "22023", "privilege"),
]


def everything(conn: psycopg.Connection) -> tuple[Any, ...]:
    return tuple(conn.execute(f"SELECT * FROM pgq.{t} ORDER BY 1, 2").fetchall()
                 for t in ("jobs", "job_events", "steps", "signals", "signal_checks", "signal_grants"))


@pytest.mark.parametrize("label,sql,sqlstate,argument", BAD, ids=[b[0] for b in BAD])
def test_bad_input_raises_its_documented_sqlstate_naming_the_argument_and_writes_nothing(
        conn, label, sql, sqlstate, argument):
    job_id, attempt = running(conn)
    assert attempt == 1
    before = everything(conn)
    with pytest.raises(psycopg.Error) as info:
        conn.execute(sql.replace("$JOB", str(job_id)))
    assert info.value.sqlstate == sqlstate, f"{label}: {info.value.sqlstate} {info.value}"
    assert f'pgq: argument "{argument}"' in str(info.value), str(info.value)
    assert everything(conn) == before
