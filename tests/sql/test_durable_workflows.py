"""Children, workflows and lifetimes (issue 39): a child spawned once per name carries the root's
id, a job awaits its children without holding a slot and reads their outcomes, a workflow is
cancelled as a tree, a job not claimed by its start_by is cancelled (and never handed out), and one
alive longer than its max_lifetime fails, across attempts, sleeps and waits. The races are
tests/sql/test_durable_interleavings.py's."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

from clockdb import clock_module_dsn, dsn, set_clock  # noqa: F401  (fixtures)
from durablekit import (
    ADMIN,
    PRODUCER,
    PRODUCER2,
    WORKER,
    await_signal,
    reclaim,
    record_step,
    rejected,
    running,
    settle,
    state,
    steps,
)
from plankit import capture, plan_of
from sqlhelpers import claim, expire_lease, job, notifications_until_marker, one

NOW = "2030-01-01 12:00:00+00"


def spawn(c: psycopg.Connection, job_id: int, attempt: int, name: str, queue: str = "kids",
          payload: str = "{}") -> int | None:
    return one(c, "SELECT pgq.spawn(%s, %s, %s, %s, 'child', %s::jsonb)", (job_id, attempt, name, queue, payload))


def await_jobs(c: psycopg.Connection, job_id: int, attempt: int, ids: list[int]) -> str | None:
    return one(c, "SELECT pgq.await_jobs(%s, %s, %s::bigint[])", (job_id, attempt, ids))


def outcomes(c: psycopg.Connection, job_id: int, attempt: int, ids: list[int]) -> list[tuple[Any, ...]]:
    return c.execute("SELECT job_id, state, result, last_error FROM pgq.job_outcomes(%s, %s, %s::bigint[])",
                     (job_id, attempt, ids)).fetchall()


def claim_one(c: psycopg.Connection, queue: str) -> tuple[int, int]:
    (x,) = claim(c, queues=[queue])
    return x["id"], x["attempt"]


# Children ------------------------------------------------------------------------------------------

def test_a_child_is_spawned_once_per_name_and_carries_the_roots_id(conn):
    root, attempt = running(conn)
    child = spawn(conn, root, attempt, "fetch", payload='{"url": "u"}')
    assert spawn(conn, root, attempt, "fetch", payload='{"url": "other"}') == child   # once per name
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE queue = 'kids'") == 1
    row = job(conn, child)
    assert (row["kind"], row["payload"], row["workflow_id"], row["parent_id"]) == ("child", {"url": "u"}, root, root)
    assert job(conn, root)["workflow_id"] is None
    assert steps(conn, root) == {"fetch": {"job_id": child}}
    # A grandchild carries the root, not its parent.
    kid_id, kid_attempt = claim_one(conn, "kids")
    grandchild = spawn(conn, kid_id, kid_attempt, "deeper")
    assert (job(conn, grandchild)["workflow_id"], job(conn, grandchild)["parent_id"]) == (root, child)
    # A later attempt of the root spawns nothing new.
    conn.execute("SELECT pgq.fail(%s, %s, 'boom', '1 second')", (root, attempt))
    conn.execute("UPDATE pgq.jobs SET run_at = now() WHERE id = %s", (root,))
    second = reclaim(conn, root)
    assert spawn(conn, root, second, "fetch") == child


def test_a_spawn_of_a_name_a_plain_step_holds_is_refused_and_a_stale_one_enqueues_nothing(conn):
    root, attempt = running(conn)
    record_step(conn, root, attempt, "charge")
    with pytest.raises(psycopg.errors.InvalidParameterValue) as info:
        spawn(conn, root, attempt, "charge")
    assert 'argument "name"' in str(info.value) and "no spawn" in str(info.value)
    expire_lease(conn, root)
    reclaim(conn, root)
    assert spawn(conn, root, attempt, "late") is None
    assert rejected(conn, root)[-1][1].startswith("spawn from attempt 1 rejected")
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE queue = 'kids'") == 0


def test_a_spawn_needs_the_child_queues_enqueue_privilege_for_the_workers_login(conn, login_as):
    worker = login_as(WORKER)
    one(conn, "SELECT pgq.enqueue('kids', 'warmup')")
    conn.execute("SELECT pgq.grant_queue('kids', 'pgq_admin', 'enqueue')")
    root = one(conn, "SELECT pgq.enqueue('q', 'k')")
    (c,) = claim(worker, queues=["q"])
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        spawn(worker, root, c["attempt"], "child")
    assert steps(conn, root) == {}


# Awaiting jobs -------------------------------------------------------------------------------------

def test_await_jobs_answers_ended_at_once_when_every_listed_job_has_ended(conn):
    done = one(conn, "SELECT pgq.enqueue('kids', 'child')")
    kid, ka = claim_one(conn, "kids")
    conn.execute("SELECT pgq.complete(%s, %s, '{\"r\": 1}')", (kid, ka))
    gone = one(conn, "SELECT pgq.enqueue('kids', 'child')")
    conn.execute("SELECT pgq.cancel(%s)", (gone,))
    root, attempt = running(conn)
    assert await_jobs(conn, root, attempt, [done, gone]) == "ended"
    assert state(conn, root) == "running"
    assert outcomes(conn, root, attempt, [gone, done]) == [
        (done, "done", {"r": 1}, None), (gone, "cancelled", None, None)]


def test_a_job_awaiting_its_children_holds_no_slot_and_is_claimable_once_each_has_ended_however(conn):
    root, attempt = running(conn)
    kids = [spawn(conn, root, attempt, f"kid{n}") for n in range(3)]
    before = job(conn, root)
    assert await_jobs(conn, root, attempt, kids) == "waiting"
    parked = job(conn, root)
    assert (parked["state"], parked["lease_until"], parked["dependencies_left"], parked["dependency_mode"]) == \
        ("waiting", None, 3, "all_ended")
    assert parked["max_attempts"] == before["max_attempts"] + 1
    assert claim(conn, queues=["q"]) == []
    assert await_jobs(conn, root, attempt, kids) == "waiting"        # the repeat of the call
    # The children end each their own way: done, failed, cancelled.
    (k1, a1), (k2, a2) = claim_one(conn, "kids"), claim_one(conn, "kids")
    conn.execute("SELECT pgq.complete(%s, %s, '{\"sum\": 3}')", (k1, a1))
    conn.execute("SELECT pgq.fail(%s, %s, 'nope', retryable => false)", (k2, a2))
    assert state(conn, root) == "waiting"
    conn.execute("SELECT pgq.cancel(%s)", (kids[2],))
    assert state(conn, root) == "pending"
    again = reclaim(conn, root)
    assert await_jobs(conn, root, again, kids) == "ended"
    assert outcomes(conn, root, again, kids) == [
        (k1, "done", {"sum": 3}, None), (k2, "failed", None, "nope"), (kids[2], "cancelled", None, None)]


def test_await_jobs_refuses_what_it_cannot_wait_for(conn):
    root, attempt = running(conn)
    cases = [
        ([], "22023", "must name 1 to 10000 jobs"),
        ([root], "22023", "must not name the job itself"),
        ([424242], "22023", "names no job with id 424242"),
        ([1, None], "22023", "must not contain NULL"),
    ]
    for ids, sqlstate, text in cases:
        with pytest.raises(psycopg.Error) as info:
            await_jobs(conn, root, attempt, ids)
        assert info.value.sqlstate == sqlstate and text in str(info.value), (ids, str(info.value))
        assert 'argument "ids"' in str(info.value)
    assert state(conn, root) == "running"


def test_await_jobs_and_job_outcomes_of_a_stale_attempt_are_not_yours(conn):
    root, attempt = running(conn)
    kid = spawn(conn, root, attempt, "kid")
    expire_lease(conn, root)
    second = reclaim(conn, root)
    assert await_jobs(conn, root, attempt, [kid]) is None
    assert outcomes(conn, root, attempt, [kid]) == []
    assert (state(conn, root), job(conn, root)["attempt"]) == ("running", second)


def test_job_outcomes_answers_the_workflows_jobs_and_those_the_login_may_read_only(conn, login_as):
    worker, producer, stranger = login_as(WORKER), login_as(PRODUCER), login_as(PRODUCER2)
    theirs = one(stranger, "SELECT pgq.enqueue('elsewhere', 'k')")
    own = one(producer, "SELECT pgq.enqueue('elsewhere', 'k')")
    root = one(producer, "SELECT pgq.enqueue('q', 'k')")
    (c,) = claim(worker, queues=["q"])
    kid = spawn(worker, root, c["attempt"], "kid")
    rows = {r[0]: r[1] for r in outcomes(worker, root, c["attempt"], [theirs, own, kid, root, 424242])}
    # The workflow's jobs; not another login's job (nor its producer's: the worker enqueued neither).
    assert rows == {theirs: None, own: None, kid: "pending", root: "running", 424242: None}


# Workflows -----------------------------------------------------------------------------------------

def test_cancel_workflow_cancels_every_unfinished_job_of_the_tree_and_tells_running_workers(conn, connect):
    root, attempt = running(conn)
    kids = [spawn(conn, root, attempt, f"kid{n}") for n in range(3)]
    (k0, a0) = claim_one(conn, "kids")
    grandchild = spawn(conn, k0, a0, "deeper")
    conn.execute("SELECT pgq.complete(%s, %s)", (k0, a0))                     # finished: stays done
    (k1, a1) = claim_one(conn, "kids")                                         # running
    assert await_jobs(conn, root, attempt, kids) == "waiting"                  # the root parked
    outsider = one(conn, "SELECT pgq.enqueue('kids', 'child')")
    listener = connect()
    listener.execute("LISTEN pgq_cancel")
    assert one(conn, "SELECT pgq.cancel_workflow(%s)", (kids[2],)) == 4         # any member names its tree
    assert {j: state(conn, j) for j in [root, *kids, grandchild, outsider]} == {
        root: "cancelled", kids[0]: "done", kids[1]: "cancelled", kids[2]: "cancelled",
        grandchild: "cancelled", outsider: "pending"}
    assert notifications_until_marker(listener, conn, "pgq_cancel") == [f"{k1}:{a1}"]
    assert one(conn, "SELECT pgq.cancel_workflow(%s)", (root,)) == 0
    assert one(conn, "SELECT pgq.complete(%s, %s)", (k1, a1)) is False
    assert one(conn, "SELECT count(*) FROM pgq.job_dependencies WHERE job_id = %s", (root,)) == 0


def test_cancel_workflow_is_for_admins_and_the_login_that_enqueued_the_root(conn, login_as):
    producer, stranger, admin = login_as(PRODUCER), login_as(PRODUCER2), login_as(ADMIN)
    first = one(producer, "SELECT pgq.enqueue('q', 'k')")
    second = one(producer, "SELECT pgq.enqueue('q', 'k')")
    with pytest.raises(psycopg.errors.NoDataFound):
        stranger.execute("SELECT pgq.cancel_workflow(%s)", (first,))
    with pytest.raises(psycopg.errors.NoDataFound):
        producer.execute("SELECT pgq.cancel_workflow(424242)")
    assert one(producer, "SELECT pgq.cancel_workflow(%s)", (first,)) == 1
    assert one(admin, "SELECT pgq.cancel_workflow(%s)", (second,)) == 1


def test_a_spawn_from_a_cancelled_parent_enqueues_nothing(conn):
    root, attempt = running(conn)
    conn.execute("SELECT pgq.cancel_workflow(%s)", (root,))
    assert spawn(conn, root, attempt, "late") is None
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE queue = 'kids'") == 0


# Lifetimes -----------------------------------------------------------------------------------------

def test_a_job_not_claimed_by_its_start_by_ends_cancelled_and_no_claim_hands_it_out(conn):
    set_clock(conn, NOW)
    late = one(conn, "SELECT pgq.enqueue('q', 'k', start_by => '2030-01-01 12:01:00+00')")
    later = one(conn, "SELECT pgq.enqueue('q', 'k', start_by => '2030-01-01 12:05:00+00')")
    set_clock(conn, "2030-01-01 12:01:00+00")
    # The claim meets the expired job first (in order): it sets it aside and hands out the next.
    assert [c["id"] for c in claim(conn, queues=["q"], batch=1)] == []
    assert (state(conn, late), job(conn, late)["last_event"]) == ("waiting", "expired")
    assert [c["id"] for c in claim(conn, queues=["q"], batch=1)] == [later]
    settle(conn)
    row = job(conn, late)
    assert (row["state"], row["last_event"]) == ("cancelled", "expired")
    assert row["last_error"].startswith("pgq: expired: not claimed by its start_by")
    # Claimed in time, it is not cancelled later, whatever becomes of its attempt.
    set_clock(conn, "2030-01-01 12:06:00+00")
    conn.execute("SELECT pgq.fail(%s, 1, 'boom', '1 second')", (later,))
    settle(conn)
    set_clock(conn, "2030-01-01 12:07:00+00")
    assert [c["id"] for c in claim(conn, queues=["q"])] == [later]


def test_the_sweep_cancels_an_unclaimed_expired_job_no_claim_met_and_one_waiting_for_dependencies(conn):
    set_clock(conn, NOW)
    paused = one(conn, "SELECT pgq.enqueue('q', 'k', start_by => '2030-01-01 12:01:00+00')")
    conn.execute("SELECT pgq.pause('q')")
    blocker = one(conn, "SELECT pgq.enqueue('other', 'k')")
    waiting = one(conn, "SELECT pgq.enqueue('other', 'k', depends_on => ARRAY[%s]::bigint[], "
                        "start_by => '2030-01-01 12:01:00+00')", (blocker,))
    set_clock(conn, "2030-01-01 12:02:00+00")
    conn.execute("SELECT pgq.sweep()")
    assert (state(conn, paused), state(conn, waiting), state(conn, blocker)) == ("cancelled", "cancelled", "pending")


def test_a_job_alive_longer_than_its_max_lifetime_fails_across_attempts_sleeps_and_waits(conn):
    set_clock(conn, NOW)
    pending = one(conn, "SELECT pgq.enqueue('a', 'k', run_at => '2030-01-01 13:00+00', max_lifetime => '10 minutes')")
    sleeper, s1 = running(conn, queue="b", max_lifetime="10 minutes")
    waiter, w1 = running(conn, queue="c", max_lifetime="10 minutes")
    worker, r1 = running(conn, queue="d", max_lifetime="10 minutes", max_run_time="1 hour")
    assert one(conn, "SELECT status FROM pgq.sleep(%s, %s, 'nap', '1 hour')", (sleeper, s1)) == "sleeping"
    assert await_signal(conn, waiter, w1, "go", None)[0] == "waiting"
    # The running attempt's lease and deadline never pass the lifetime.
    row = job(conn, worker)
    assert row["deadline"].isoformat() == "2030-01-01T12:10:00+00:00"
    assert one(conn, "SELECT pgq.renew(%s, %s, '1 day')", (worker, r1)).isoformat() == "2030-01-01T12:10:00+00:00"
    set_clock(conn, "2030-01-01 12:09:59+00")
    settle(conn)
    assert [state(conn, j) for j in (pending, sleeper, waiter, worker)] == ["pending", "pending", "waiting", "running"]
    set_clock(conn, "2030-01-01 12:10:01+00")
    conn.execute("SELECT pgq.sweep()")        # recovers the attempt past its deadline, and ends the rest
    settle(conn)
    for j in (pending, sleeper, waiter, worker):
        row = job(conn, j)
        assert (row["state"], row["last_event"]) == ("failed", "expired"), (j, row["state"], row["last_event"])
        assert row["last_error"] == ("pgq: expired: alive longer than its max_lifetime "
                                     "(until 2030-01-01 12:10:00+00)"), row
    assert claim(conn, batch=10) == []


def test_a_claim_never_hands_out_a_job_whose_lifetime_has_passed(conn):
    set_clock(conn, NOW)
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k', max_lifetime => '1 minute')")
    set_clock(conn, "2030-01-01 12:01:00+00")
    assert claim(conn, queues=["q"]) == [] and claim(conn, queues=None) == []
    conn.execute("SELECT * FROM pgq.complete_and_claim('{}', '{}', 'w', ARRAY['q'])")
    assert state(conn, job_id) == "waiting"
    settle(conn)
    assert state(conn, job_id) == "failed"


def test_a_claim_sets_aside_only_its_expired_picks_and_hands_out_the_rest_in_the_same_call(conn):
    set_clock(conn, NOW)
    plain = one(conn, "SELECT pgq.enqueue('q', 'k')")
    unclaimed = one(conn, "SELECT pgq.enqueue('q', 'k', start_by => '2030-01-01 12:01:00+00')")
    lived = one(conn, "SELECT pgq.enqueue('q', 'k', max_lifetime => '1 minute')")
    kept = one(conn, "SELECT pgq.enqueue('q', 'k', start_by => '2030-01-01 12:05:00+00', max_lifetime => '1 hour', "
                     "priority => 1)")
    set_clock(conn, "2030-01-01 12:01:00+00")
    got = claim(conn, queues=["q"], batch=4)
    assert [c["id"] for c in got] == [kept, plain]   # in the claim's order, leased in two passes
    assert [c["attempt"] for c in got] == [1, 1]
    assert got[0]["lease_until"] <= job(conn, kept)["expires_at"]
    for j in (unclaimed, lived):
        row = job(conn, j)
        assert (row["state"], row["last_event"], row["attempt"], row["lease_until"]) == ("waiting", "expired", 0, None)
    assert one(conn, "SELECT count(*) FROM pgq.job_events WHERE job_id = ANY(%s) AND event = 'claimed'",
               ([unclaimed, lived],)) == 0
    settle(conn)
    assert (state(conn, unclaimed), state(conn, lived)) == ("cancelled", "failed")


def test_a_claim_of_jobs_without_a_lifetime_runs_nothing_for_lifetimes(conn):
    """Issue 39's cost rule: the lease tests no expiry, and the statement that sets expired picks aside
    runs only when a pick has a start_by or an expires_at."""
    for _ in range(3):
        conn.execute("SELECT pgq.enqueue('q', 'k')")
    conn.execute("LOAD 'auto_explain'")
    rows, plans = capture(conn, "SELECT id FROM pgq.claim('w', queues => '{q}', batch => 3)")
    assert len(rows) == 3
    assert not [p.query for p in plans if "pgq._expired(" in p.query]
    assert "pgq._expired(" not in plan_of(plans, "WITH claimed AS").query
    conn.execute("SELECT pgq.enqueue('q', 'k', max_lifetime => '1 hour')")
    rows, plans = capture(conn, "SELECT id FROM pgq.claim('w', queues => '{q}', batch => 3)")
    assert len(rows) == 1
    assert any("pgq._expired(" in p.query and "waiting" in p.query for p in plans)


def test_many_claimers_hand_out_each_unexpired_job_once_and_no_expired_one(dsn: str, conn: psycopg.Connection) -> None:  # noqa: F811
    """The lease's two passes under load: four sessions claim batches of three from plain jobs,
    jobs with a lifetime not yet passed and jobs past their start_by, interleaved in the queue."""
    set_clock(conn, NOW)
    plain, kept, late = [], [], []
    for _ in range(60):
        plain.append(one(conn, "SELECT pgq.enqueue('q', 'k')"))
        kept.append(one(conn, "SELECT pgq.enqueue('q', 'k', max_lifetime => '1 hour')"))
        late.append(one(conn, "SELECT pgq.enqueue('q', 'k', start_by => '2030-01-01 12:00:30+00')"))
    set_clock(conn, "2030-01-01 12:01:00+00")
    taken: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def claimer(name: str) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                while True:
                    got = [g["id"] for g in claim(c, worker=name, queues=["q"], batch=3)]
                    with lock:
                        taken.extend(got)
                    if not got and one(c, "SELECT count(*) FROM pgq.jobs WHERE state = 'pending'") == 0:
                        return
        except BaseException as e:  # noqa: BLE001  (re-raised by the test)
            errors.append(e)

    threads = [threading.Thread(target=claimer, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and not any(t.is_alive() for t in threads), errors
    assert len(taken) == len(set(taken))
    assert sorted(taken) == sorted(plain + kept)
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE id = ANY(%s) AND state = 'waiting' "
                     "AND last_event = 'expired' AND attempt = 0", (late,)) == len(late)


BAD: list[tuple[str, str, str, str]] = [
    ("spawn id NULL", "SELECT pgq.spawn(NULL, 1, 'c', 'kids', 'k')", "22004", "id"),
    ("spawn attempt NULL", "SELECT pgq.spawn($JOB, NULL, 'c', 'kids', 'k')", "22004", "attempt"),
    ("spawn name NULL", "SELECT pgq.spawn($JOB, 1, NULL, 'kids', 'k')", "22004", "name"),
    ("spawn name signal:", "SELECT pgq.spawn($JOB, 1, 'signal:x', 'kids', 'k')", "22023", "name"),
    ("spawn queue NULL", "SELECT pgq.spawn($JOB, 1, 'c', NULL, 'k')", "22004", "queue"),
    ("spawn queue bad", "SELECT pgq.spawn($JOB, 1, 'c', 'a;b', 'k')", "22023", "queue"),
    ("spawn kind bad", "SELECT pgq.spawn($JOB, 1, 'c', 'kids', '')", "22023", "kind"),
    ("spawn payload array", "SELECT pgq.spawn($JOB, 1, 'c', 'kids', 'k', '[]')", "22023", "payload"),
    ("await_jobs attempt NULL", "SELECT pgq.await_jobs($JOB, NULL, '{1}')", "22004", "attempt"),
    ("await_jobs ids NULL", "SELECT pgq.await_jobs($JOB, 1, NULL)", "22004", "ids"),
    ("await_jobs ids 2-d", "SELECT pgq.await_jobs($JOB, 1, '{{1},{2}}')", "22023", "ids"),
    ("job_outcomes ids NULL", "SELECT * FROM pgq.job_outcomes($JOB, 1, NULL)", "22004", "ids"),
    ("job_outcomes too many",
     "SELECT * FROM pgq.job_outcomes($JOB, 1, ARRAY(SELECT generate_series(1, 1001))::bigint[])",
     "22023", "ids"),
    ("cancel_workflow NULL", "SELECT pgq.cancel_workflow(NULL)", "22004", "id"),
    ("enqueue start_by past", "SELECT pgq.enqueue('q', 'k', start_by => now() - interval '1 second')", "22023",
     "start_by"),
    ("enqueue start_by infinity", "SELECT pgq.enqueue('q', 'k', start_by => 'infinity')", "22023", "start_by"),
    ("enqueue start_by before run_at",
     "SELECT pgq.enqueue('q', 'k', run_at => now() + interval '1 hour', start_by => now() + interval '1 minute')",
     "22023", "start_by"),
    ("enqueue max_lifetime zero", "SELECT pgq.enqueue('q', 'k', max_lifetime => '0')", "22023", "max_lifetime"),
    ("enqueue max_lifetime negative", "SELECT pgq.enqueue('q', 'k', max_lifetime => '-1 day')", "22023",
     "max_lifetime"),
    ("enqueue max_lifetime months", "SELECT pgq.enqueue('q', 'k', max_lifetime => '1 mon')", "22023",
     "max_lifetime"),
    ("enqueue max_lifetime too long", "SELECT pgq.enqueue('q', 'k', max_lifetime => '3651 days')", "22023",
     "max_lifetime"),
]


def everything(conn: psycopg.Connection) -> tuple[Any, ...]:
    return tuple(conn.execute(f"SELECT * FROM pgq.{t} ORDER BY 1, 2").fetchall()
                 for t in ("jobs", "job_events", "steps", "queues"))


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
