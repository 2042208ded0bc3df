"""Job dependencies (issue 11): pgq.enqueue(..., depends_on) makes a job wait (state 'waiting')
until every one of those jobs is done, then pending in the transaction of the last completion; a
dependency that ends failed or cancelled cancels the jobs waiting down its chain. Real PostgreSQL,
real concurrent connections."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from pgq_tools.lab.harness import Harness, Step

from dependencykit import backlog, enqueue, links, run, settle, state, written
from loginkit import PROD, PROD2, READERS, WRITERS
from sqlfixtures import sqlstate_of
from sqlhelpers import claim, events, expire_lease, job, notifications_until_marker, one


def complete(conn: psycopg.Connection, job_id: int) -> None:
    assert one(conn, "SELECT pgq.complete(%s, %s)", (job_id, run(conn, job_id))) is True


# The rules --------------------------------------------------------------------------------------

def test_a_job_waits_for_all_its_dependencies_and_is_pending_in_the_last_completions_transaction(
        conn: psycopg.Connection, connect) -> None:
    a, b = enqueue(conn, queue="deps"), enqueue(conn, queue="deps")
    c = enqueue(conn, [a, b], queue="after")
    assert job(conn, c)["state"] == "waiting"
    assert (job(conn, c)["depends_on"], job(conn, c)["dependencies_left"]) == ([a, b], 2)
    assert claim(conn, queues=["after"]) == []  # never claimed while waiting
    attempt_a, attempt_b = (claimed["attempt"] for claimed in claim(conn, queues=["deps"], batch=2))
    assert one(conn, "SELECT pgq.complete(%s, %s)", (a, attempt_a))
    assert (state(conn, c), job(conn, c)["dependencies_left"]) == ("waiting", 1)

    completer = connect(autocommit=False)
    assert one(completer, "SELECT pgq.complete(%s, %s)", (b, attempt_b))
    assert one(completer, "SELECT state::text FROM pgq.jobs WHERE id = %s", (c,)) == "pending"  # same transaction
    assert state(conn, c) == "waiting"  # not before it commits
    completer.commit()
    assert (state(conn, c), job(conn, c)["last_event"]) == ("pending", "dependencies_done")
    assert [claimed["id"] for claimed in claim(conn, queues=["after"])] == [c]
    assert links(conn) == 0
    assert ("dependencies_done", 0, "waiting", "pending") in events(conn, c)


def test_a_dependency_already_done_counts_as_met_and_an_empty_list_is_none(conn: psycopg.Connection) -> None:
    a = enqueue(conn)
    complete(conn, a)
    b = enqueue(conn, [a])
    assert (state(conn, b), job(conn, b)["depends_on"], job(conn, b)["dependencies_left"]) == ("pending", [a], 0)
    c = enqueue(conn, [])
    assert (state(conn, c), job(conn, c)["depends_on"]) == ("pending", None)
    assert links(conn) == 0


def test_duplicate_ids_count_once(conn: psycopg.Connection) -> None:
    a = enqueue(conn)
    b = enqueue(conn, [a, a, a])
    assert (job(conn, b)["depends_on"], job(conn, b)["dependencies_left"], links(conn)) == ([a], 1, 1)
    complete(conn, a)
    assert state(conn, b) == "pending"


def test_a_dependency_in_another_queue_is_allowed(conn: psycopg.Connection) -> None:
    a = enqueue(conn, queue="render")
    b = enqueue(conn, [a], queue="mail")
    complete(conn, a)
    assert state(conn, b) == "pending"


def test_the_release_notifies_the_dependants_queue(conn: psycopg.Connection, connect) -> None:
    a = enqueue(conn, queue="first")
    enqueue(conn, [a], queue="second")
    listener = connect()
    listener.execute("LISTEN pgq")
    attempt = run(conn, a)
    assert notifications_until_marker(listener, conn) == []  # the claim and the waiting enqueue: none
    conn.execute("SELECT pgq.complete(%s, %s)", (a, attempt))
    assert notifications_until_marker(listener, conn) == ["second"]


# Failure and cancellation cascade -----------------------------------------------------------------

def end_failed(conn: psycopg.Connection, job_id: int) -> None:
    conn.execute("SELECT pgq.fail(%s, %s, 'boom', retryable => false)", (job_id, run(conn, job_id)))


def end_cancelled(conn: psycopg.Connection, job_id: int) -> None:
    assert one(conn, "SELECT pgq.cancel(%s)", (job_id,)) is True


def end_running_cancelled(conn: psycopg.Connection, job_id: int) -> None:
    run(conn, job_id)
    assert one(conn, "SELECT pgq.cancel(%s)", (job_id,)) is True


def end_unknown_resolved(to: str):
    def end(conn: psycopg.Connection, job_id: int) -> None:
        conn.execute("SELECT pgq.mark_unknown(%s, %s, 'maybe')", (job_id, run(conn, job_id)))
        conn.execute("SELECT pgq.resolve(%s, %s)", (job_id, to))
    end.__name__ = f"resolved_{to}"
    return end


def end_expired(conn: psycopg.Connection, job_id: int) -> None:
    """The last attempt's lease expires and the sweep fails the job."""
    conn.execute("UPDATE pgq.jobs SET max_attempts = 1 WHERE id = %s", (job_id,))
    run(conn, job_id)
    expire_lease(conn, job_id)
    conn.execute("SELECT pgq.sweep()")
    assert state(conn, job_id) == "failed"


@pytest.mark.parametrize("end", [end_failed, end_cancelled, end_running_cancelled, end_unknown_resolved("failed"),
                                 end_unknown_resolved("cancelled"), end_expired], ids=lambda f: f.__name__)
def test_a_dependency_that_ends_badly_cancels_its_chain_naming_the_dependency(conn: psycopg.Connection, end) -> None:
    root, other = enqueue(conn, queue="root"), enqueue(conn, queue="other")
    child = enqueue(conn, [root, other])
    grandchild = enqueue(conn, [child])
    bystander = enqueue(conn, [other])
    end(conn, root)
    ended = state(conn, root)
    assert ended in ("failed", "cancelled")
    for dependant in (child, grandchild):
        row = job(conn, dependant)
        assert (row["state"], row["last_event"], row["finished_at"] is not None) == \
            ("cancelled", "dependency_ended", True)
    assert job(conn, child)["last_error"] == f"pgq: cancelled: its dependency, job {root}, ended {ended}"
    assert job(conn, grandchild)["last_error"] == (f"pgq: cancelled: its dependency, job {child}, was cancelled "
                                                   f"because job {root}, up its chain, ended {ended}")
    assert ("dependency_ended", 0, "waiting", "cancelled") in events(conn, grandchild)
    assert state(conn, bystander) == "waiting"  # other's other dependant is untouched
    assert conn.execute("SELECT depends_on, job_id FROM pgq.job_dependencies").fetchall() == [(other, bystander)]
    complete(conn, other)
    assert state(conn, bystander) == "pending" and links(conn) == 0


def test_resolved_done_releases_like_a_completion(conn: psycopg.Connection) -> None:
    a = enqueue(conn)
    b = enqueue(conn, [a])
    end_unknown_resolved("done")(conn, a)
    assert state(conn, b) == "pending"


def test_complete_many_releases_every_dependant(conn: psycopg.Connection) -> None:
    deps = [enqueue(conn, queue="deps") for _ in range(5)]
    fan_in = enqueue(conn, deps)
    one_of = enqueue(conn, deps[:1])
    claimed = claim(conn, queues=["deps"], batch=5)
    done = conn.execute("SELECT pgq.complete_many(%s, %s)",
                        ([c["id"] for c in claimed], [c["attempt"] for c in claimed])).fetchall()
    assert len(done) == 5
    assert (state(conn, fan_in), state(conn, one_of), links(conn)) == ("pending", "pending", 0)


def test_cancel_of_a_waiting_job_works_and_cancels_its_own_dependants(conn: psycopg.Connection) -> None:
    a = enqueue(conn)
    b = enqueue(conn, [a])
    c = enqueue(conn, [b])
    assert one(conn, "SELECT pgq.cancel(%s)", (b,)) is True
    assert (state(conn, b), state(conn, c)) == ("cancelled", "cancelled")
    assert job(conn, c)["last_error"] == f"pgq: cancelled: its dependency, job {b}, ended cancelled"
    assert links(conn) == 0  # b's own link to a went with it
    complete(conn, a)  # nothing waits for it any more
    assert (state(conn, b), state(conn, c)) == ("cancelled", "cancelled")


def test_a_dependency_that_already_failed_cancels_the_new_job_at_once(conn: psycopg.Connection) -> None:
    a, ok = enqueue(conn, queue="deps"), enqueue(conn, queue="deps")
    end_failed(conn, a)
    complete(conn, ok)
    conn.execute("SELECT pgq.configure_queue('q')")
    before = one(conn, "SELECT cancelled_total FROM pgq.metrics() WHERE queue = 'q'")
    b = enqueue(conn, [ok, a])
    row = job(conn, b)
    assert (row["state"], row["last_event"], row["last_error"]) == \
        ("cancelled", "dependency_ended", f"pgq: cancelled: its dependency, job {a}, ended failed")
    assert ("dependency_ended", 0, "waiting", "cancelled") in events(conn, b)
    many = [int(r[0]) for r in conn.execute("SELECT pgq.enqueue_many('q', 'k', ARRAY['{}', '{}']::jsonb[], "
                                            "depends_on => %s)", ([a],))]
    assert [state(conn, m) for m in many] == ["cancelled", "cancelled"]
    assert one(conn, "SELECT cancelled_total FROM pgq.metrics() WHERE queue = 'q'") == before + 3
    assert links(conn) == 0


def test_retry_of_a_failed_dependency_does_not_revive_its_cancelled_dependants(conn: psycopg.Connection) -> None:
    a = enqueue(conn)
    b = enqueue(conn, [a])
    end_failed(conn, a)
    assert state(conn, b) == "cancelled"
    assert one(conn, "SELECT pgq.retry(%s)", (a,)) is True
    complete(conn, a)
    assert state(conn, b) == "cancelled"


# enqueue_many, unique_key, observation ----------------------------------------------------------

def test_enqueue_many_gives_every_job_the_same_dependencies(conn: psycopg.Connection) -> None:
    a, b = enqueue(conn), enqueue(conn)
    ids = [int(r[0]) for r in conn.execute(
        "SELECT pgq.enqueue_many('many', 'k', array_fill('{}'::jsonb, ARRAY[50]), depends_on => %s)", ([b, a, b],))]
    assert len(ids) == 50 and ids == sorted(ids)
    assert conn.execute("SELECT DISTINCT state::text, depends_on, dependencies_left FROM pgq.jobs WHERE id = ANY (%s)",
                        (ids,)).fetchall() == [("waiting", [a, b], 2)]
    assert links(conn) == 100
    complete(conn, a)
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE queue = 'many' AND state = 'waiting'") == 50
    complete(conn, b)
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE queue = 'many' AND state = 'pending'") == 50
    assert links(conn) == 0


def test_a_waiting_job_holds_its_unique_key(conn: psycopg.Connection) -> None:
    a = enqueue(conn)
    b = enqueue(conn, [a], unique_key="report")
    assert enqueue(conn, unique_key="report") == b
    assert enqueue(conn, [a], unique_key="report") == b
    # A deduplicated call writes nothing, with depends_on too (no transaction id is assigned).
    with conn.transaction():
        assert enqueue(conn, [a], unique_key="report") == b
        assert one(conn, "SELECT pg_current_xact_id_if_assigned() IS NULL") is True
    complete(conn, a)
    assert enqueue(conn, unique_key="report") == b  # pending now, still the holder
    # A job cancelled at once (its dependency failed) does not take a key another live job holds.
    f = enqueue(conn, queue="deps")
    end_failed(conn, f)
    assert enqueue(conn, [f], unique_key="report") == b


def test_stats_list_jobs_and_get_job_show_waiting_jobs(conn: psycopg.Connection) -> None:
    a = enqueue(conn)
    b = enqueue(conn, [a])
    stats = conn.execute("SELECT pending, waiting FROM pgq.stats() WHERE queue = 'q'").fetchone()
    assert stats == (1, 1)
    assert one(conn, "SELECT waiting FROM pgq.metrics() WHERE queue = 'q'") == 1
    assert [r[0] for r in conn.execute("SELECT id FROM pgq.list_jobs(state => 'waiting')")] == [b]
    assert one(conn, "SELECT (pgq.get_job(%s)).depends_on", (b,)) == [a]


def test_the_trigger_body_runs_only_for_jobs_with_dependants(conn: psycopg.Connection) -> None:
    plain, dep = enqueue(conn, queue="plain"), enqueue(conn, queue="dep")
    enqueue(conn, [dep], queue="after")
    conn.execute("SET track_functions = 'pl'")

    def calls_in_a_transaction_completing(job_id: int) -> int:
        attempt = run(conn, job_id)
        with conn.transaction():
            conn.execute("SELECT pgq.complete(%s, %s)", (job_id, attempt))
            return int(one(conn, "SELECT coalesce(pg_stat_get_xact_function_calls("
                               "'pgq._dependency_ended'::regproc), 0)"))

    assert calls_in_a_transaction_completing(plain) == 0
    assert calls_in_a_transaction_completing(dep) == 1


def test_links_never_outlive_their_jobs_and_a_pruned_dependency_is_gone(conn: psycopg.Connection) -> None:
    a, b = enqueue(conn), enqueue(conn)
    waiting = [enqueue(conn, [a, b]) for _ in range(3)]
    complete(conn, a)
    end_failed(conn, b)
    assert [state(conn, w) for w in waiting] == ["cancelled"] * 3
    assert links(conn) == 0
    conn.execute("SELECT pgq.prune(older_than => '0')")
    assert sqlstate_of(conn, "SELECT pgq.enqueue('q', 'k', depends_on => %s)", ([a],)) == "22023"


# Bad input ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("function", ["enqueue", "enqueue_many"])
@pytest.mark.parametrize(("depends_on", "problem"), [
    ("ARRAY[{a}, 9999999]::bigint[]", 'argument "depends_on" names no job with id 9999999'),
    ("ARRAY[{a}, NULL]::bigint[]", 'argument "depends_on" must not contain NULL'),
    ("ARRAY[[{a}], [{a}]]::bigint[]", 'argument "depends_on" must be a one-dimensional array of job ids'),
    ("ARRAY(SELECT generate_series({a}, {a} + 10000))",
     'argument "depends_on" must name at most 10000 jobs, got 10001'),
])
def test_bad_depends_on_is_refused_naming_it_and_writes_nothing(conn: psycopg.Connection, function: str,
                                                                depends_on: str, problem: str) -> None:
    a = enqueue(conn)
    before = written(conn)
    call = ("SELECT pgq.enqueue('q', 'k', depends_on => {})" if function == "enqueue" else
            "SELECT pgq.enqueue_many('q', 'k', ARRAY['{{}}']::jsonb[], depends_on => {})")
    with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
        conn.execute(call.format(depends_on.format(a=a)))
    assert caught.value.diag.message_primary == f"pgq: {problem}"
    assert written(conn) == before


# The role matrix -----------------------------------------------------------------------------------

def test_a_producer_enqueues_with_depends_on(conn: psycopg.Connection, login) -> None:  # noqa: F811
    a = enqueue(conn)
    producer = login(PROD)
    b = one(producer, "SELECT pgq.enqueue('q', 'k', depends_on => %s)", ([a],))
    ids = producer.execute("SELECT pgq.enqueue_many('q', 'k', ARRAY['{}']::jsonb[], depends_on => %s)", ([a],))
    assert state(conn, b) == "waiting" and [state(conn, r[0]) for r in ids] == ["waiting"]


def test_a_job_of_a_queue_the_login_may_not_read_is_as_if_absent(conn: psycopg.Connection, login) -> None:  # noqa: F811
    secret = enqueue(conn, queue="secret")
    conn.execute("SELECT pgq.grant_queue('secret', %s, 'read')", (READERS,))
    conn.execute("SELECT pgq.grant_queue('secret', %s, 'read')", (WRITERS,))
    before = written(conn)
    producer = login(PROD)  # not a member of either group
    with pytest.raises(psycopg.errors.InvalidParameterValue) as hidden:
        producer.execute("SELECT pgq.enqueue('q', 'k', depends_on => %s)", ([secret],))
    with pytest.raises(psycopg.errors.InvalidParameterValue) as absent:
        producer.execute("SELECT pgq.enqueue('q', 'k', depends_on => %s)", ([secret + 1000],))
    assert hidden.value.diag.message_primary == f'pgq: argument "depends_on" names no job with id {secret}'
    assert absent.value.diag.message_primary == f'pgq: argument "depends_on" names no job with id {secret + 1000}'
    assert hidden.value.diag.message_hint == absent.value.diag.message_hint
    assert written(conn) == before
    allowed = login(PROD2)  # a member of WRITERS, granted read
    b = one(allowed, "SELECT pgq.enqueue('q', 'k', depends_on => %s)", ([secret],))
    assert state(conn, b) == "waiting"


# No locks on the jobs named (issue 24) ----------------------------------------------------------------
# An enqueue with depends_on used to lock (and flag) the rows of the jobs it named until it committed:
# their owners' renew and complete waited, claims skipped them, an admin's cancel gave up with 55P03.
# It reads them now and locks nothing; an end it overlaps is settled by the sweep (its checks).


@pytest.fixture
def h(dsn: str) -> Iterator[Harness]:
    harness = Harness(dsn, experiment="dependencies", step_timeout=10)
    yield harness
    harness.close()


def not_blocked(step: Step) -> Step:
    assert step.ok and not step.blocked and not step.lock_wait, step.outcome
    return step


def test_an_open_enqueue_that_names_jobs_makes_no_one_wait_and_hides_nothing(h: Harness,
                                                                             conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('deps', audit => false)")
    running = enqueue(conn, queue="owned")
    attempt = run(conn, running)
    pending = [int(r[0]) for r in conn.execute(
        "SELECT pgq.enqueue_many('deps', 'k', array_fill('{}'::jsonb, ARRAY[1000]))")]
    cancel_me, fail_me = pending[-2:]
    producer, owner, worker, admin = h.session("producer"), h.session("owner"), h.session("worker"), h.session("admin")
    h.step(producer, "begin", "BEGIN")
    waiting = not_blocked(h.step(producer, "enqueue", "SELECT pgq.enqueue('after', 'k', depends_on => %s)",
                                 ([running, *pending],))).value
    # While that transaction stays open: the owner renews and completes at once, a claim of every
    # pending dependency returns them all, an admin cancels one, a worker fails another.
    not_blocked(h.step(owner, "renew", "SELECT pgq.renew(%s, %s)", (running, attempt)))
    claimed = not_blocked(h.step(worker, "claim", "SELECT id, attempt FROM pgq.claim('w', ARRAY['deps'], 1000)"))
    assert sorted(r[0] for r in claimed.rows) == pending
    attempts = dict(claimed.rows)
    not_blocked(h.step(admin, "cancel", "SELECT pgq.cancel(%s)", (cancel_me,)))
    not_blocked(h.step(worker, "fail", "SELECT pgq.fail(%s, %s, 'boom', retryable => false)",
                       (fail_me, attempts[fail_me])))
    assert not_blocked(h.step(owner, "complete", "SELECT pgq.complete(%s, %s)", (running, attempt))).value is True
    assert not_blocked(h.step(owner, "complete_many", "SELECT count(*) FROM pgq.complete_many(%s, %s)",
                              (pending[:10], [attempts[i] for i in pending[:10]]))).value == 10
    assert h.step(producer, "commit", "COMMIT").ok
    # The dependant saw none of those ends, nor they it: the sweep settles it, cancelled by the first
    # dependency that ended failed or cancelled, never pending.
    assert state(conn, waiting) == "waiting"
    settle(conn)
    row = job(conn, waiting)
    assert row["state"] == "cancelled" and row["last_error"] in (
        f"pgq: cancelled: its dependency, job {cancel_me}, ended cancelled",
        f"pgq: cancelled: its dependency, job {fail_me}, ended failed"), row["last_error"]
    assert links(conn) == 0


def test_an_admin_cancel_of_a_job_an_open_enqueue_named_does_not_wait(h: Harness, conn: psycopg.Connection) -> None:
    a = enqueue(conn)
    producer, admin = h.session("producer"), h.session("admin")
    h.step(producer, "begin", "BEGIN")
    b = not_blocked(h.step(producer, "enqueue", "SELECT pgq.enqueue('q', 'k', depends_on => %s)", ([a],))).value
    assert not_blocked(h.step(admin, "cancel", "SELECT pgq.cancel(%s)", (a,))).value is True
    assert h.step(producer, "commit", "COMMIT").ok
    settle(conn)
    assert job(conn, b)["last_error"] == f"pgq: cancelled: its dependency, job {a}, ended cancelled"


# The race the lock used to guard: an end and an enqueue in flight at once ---------------------------
# Neither waits for the other now. A dependant moves on in the ending transaction when its enqueue
# committed before the end looked (the tests above this section), and by the first sweep after both
# committed when they overlapped (these, both ways); never early.

ENDS = {"done": "SELECT pgq.complete(%s, %s)", "failed": "SELECT pgq.fail(%s, %s, 'boom', retryable => false)"}


@pytest.mark.parametrize("outcome", ["done", "failed"])
@pytest.mark.parametrize("first", ["end", "enqueue"])
def test_an_end_and_an_enqueue_that_overlap_are_settled_by_the_next_sweep(
        h: Harness, conn: psycopg.Connection, outcome: str, first: str) -> None:
    a = enqueue(conn)
    attempt = run(conn, a)
    ender, producer = h.session("ender"), h.session("producer")
    h.step(ender, "begin", "BEGIN")
    h.step(producer, "begin", "BEGIN")
    if first == "end":
        not_blocked(h.step(ender, "end", ENDS[outcome], (a, attempt)))
        b = not_blocked(h.step(producer, "enqueue", "SELECT pgq.enqueue('q', 'k', depends_on => %s)", ([a],))).value
    else:
        b = not_blocked(h.step(producer, "enqueue", "SELECT pgq.enqueue('q', 'k', depends_on => %s)", ([a],))).value
        not_blocked(h.step(ender, "end", ENDS[outcome], (a, attempt)))
    # Either commits first.
    for session in ((ender, producer) if first == "end" else (producer, ender)):
        assert h.step(session, "commit", "COMMIT").ok
    assert (state(conn, a), state(conn, b)) == (outcome, "waiting")  # not moved on yet, and never early
    assert one(conn, "SELECT pgq.sweep()") == 0
    assert state(conn, b) == ("pending" if outcome == "done" else "cancelled")
    if outcome == "failed":
        assert job(conn, b)["last_error"] == f"pgq: cancelled: its dependency, job {a}, ended failed"
    else:
        assert [e for e in events(conn, b) if e[0] == "dependencies_done"] == \
            [("dependencies_done", 0, "waiting", "pending")]
    assert (links(conn), backlog(conn)) == (0, (0, 0))


@pytest.mark.parametrize("first", ["end", "enqueue"])
def test_an_all_ended_dependant_whose_enqueue_overlapped_a_failure_is_released_by_the_next_sweep(
        h: Harness, conn: psycopg.Connection, first: str) -> None:
    a = enqueue(conn)
    attempt = run(conn, a)
    ender, producer = h.session("ender"), h.session("producer")
    h.step(ender, "begin", "BEGIN")
    h.step(producer, "begin", "BEGIN")
    sql = "SELECT pgq.enqueue('q', 'k', depends_on => %s, dependency_mode => 'all_ended')"
    if first == "end":
        not_blocked(h.step(ender, "end", ENDS["failed"], (a, attempt)))
        b = not_blocked(h.step(producer, "enqueue", sql, ([a],))).value
    else:
        b = not_blocked(h.step(producer, "enqueue", sql, ([a],))).value
        not_blocked(h.step(ender, "end", ENDS["failed"], (a, attempt)))
    for session in ((ender, producer) if first == "end" else (producer, ender)):
        assert h.step(session, "commit", "COMMIT").ok
    assert (state(conn, a), state(conn, b)) == ("failed", "waiting")
    assert one(conn, "SELECT pgq.sweep()") == 0
    assert state(conn, b) == "pending"
    assert (links(conn), backlog(conn)) == (0, (0, 0))


def test_an_end_still_in_flight_at_the_sweep_is_settled_by_the_sweep_after_it_commits(
        h: Harness, conn: psycopg.Connection) -> None:
    a = enqueue(conn)
    attempt = run(conn, a)
    ender, producer = h.session("ender"), h.session("producer")
    h.step(ender, "begin", "BEGIN")
    h.step(producer, "begin", "BEGIN")
    not_blocked(h.step(producer, "enqueue", "SELECT pgq.enqueue('q', 'k', depends_on => %s)", ([a],)))
    not_blocked(h.step(ender, "complete", "SELECT pgq.complete(%s, %s)", (a, attempt)))  # its lookup: no link
    assert h.step(producer, "commit", "COMMIT").ok
    [b] = [r[0] for r in conn.execute("SELECT id FROM pgq.jobs WHERE state = 'waiting'")]
    # The end holds the row: the check cannot tell yet, and waits (it is not waited for).
    sweep = h.session("sweeper")
    not_blocked(h.step(sweep, "sweep", "SELECT pgq.sweep()"))
    assert (state(conn, b), backlog(conn)) == ("waiting", (1, 0))
    assert h.step(ender, "commit", "COMMIT").ok
    not_blocked(h.step(sweep, "sweep_again", "SELECT pgq.sweep()"))
    assert state(conn, b) == "pending" and backlog(conn) == (0, 0)


def test_an_end_that_rolls_back_releases_nothing_and_the_next_end_sees_the_link(
        h: Harness, conn: psycopg.Connection) -> None:
    a = enqueue(conn)
    attempt = run(conn, a)
    ender, producer = h.session("ender"), h.session("producer")
    h.step(ender, "begin", "BEGIN")
    not_blocked(h.step(ender, "complete", "SELECT pgq.complete(%s, %s)", (a, attempt)))
    b = not_blocked(h.step(producer, "enqueue", "SELECT pgq.enqueue('q', 'k', depends_on => %s)", ([a],))).value
    assert h.step(ender, "rollback", "ROLLBACK").ok
    conn.execute("SELECT pgq.sweep()")
    assert (state(conn, a), state(conn, b), backlog(conn)) == ("running", "waiting", (0, 0))
    complete_in_one_transaction = one(conn, "SELECT pgq.complete(%s, %s)", (a, attempt))
    assert complete_in_one_transaction is True and state(conn, b) == "pending"  # in the completion's transaction


def test_an_end_under_an_older_repeatable_read_snapshot_leaves_a_check_of_its_own(
        h: Harness, conn: psycopg.Connection) -> None:
    """The snapshot of a REPEATABLE READ transaction can predate a dependant's enqueue (and the check
    that enqueue left can be settled before the end): the end then leaves a check itself."""
    a = enqueue(conn)
    attempt = run(conn, a)
    ender, producer = h.session("ender"), h.session("producer")
    h.step(ender, "begin", "BEGIN ISOLATION LEVEL REPEATABLE READ")
    h.step(ender, "snapshot", "SELECT count(*) FROM pgq.stats()")
    b = not_blocked(h.step(producer, "enqueue", "SELECT pgq.enqueue('q', 'k', depends_on => %s)", ([a],))).value
    conn.execute("SELECT pgq.sweep()")  # the enqueue's check: nothing in flight, so the end will see it...
    assert backlog(conn) == (0, 0)
    not_blocked(h.step(ender, "complete", "SELECT pgq.complete(%s, %s)", (a, attempt)))  # ...not in this snapshot
    assert h.step(ender, "commit", "COMMIT").ok
    assert (state(conn, b), backlog(conn)) == ("waiting", (1, 0))
    conn.execute("SELECT pgq.sweep()")
    assert state(conn, b) == "pending" and backlog(conn) == (0, 0)


def test_a_cascade_and_a_dependant_enqueued_meanwhile_on_a_member_of_its_chain(h: Harness,
                                                                               conn: psycopg.Connection) -> None:
    root = enqueue(conn)
    member = enqueue(conn, [root])
    attempt = run(conn, root)
    producer, ender = h.session("producer"), h.session("ender")
    h.step(producer, "begin", "BEGIN")
    late = not_blocked(h.step(producer, "enqueue", "SELECT pgq.enqueue('q', 'k', depends_on => %s)",
                              ([member],))).value
    assert not_blocked(h.step(ender, "fail", ENDS["failed"], (root, attempt))).value == "failed"
    assert h.step(producer, "commit", "COMMIT").ok
    assert (state(conn, member), state(conn, late)) == ("cancelled", "waiting")
    conn.execute("SELECT pgq.sweep()")
    assert (state(conn, member), state(conn, late)) == ("cancelled", "cancelled")
    assert job(conn, late)["last_error"] == f"pgq: cancelled: its dependency, job {member}, ended cancelled"
    assert links(conn) == 0


def test_a_job_the_login_may_not_read_is_refused_at_once_while_its_owner_holds_it(
        h: Harness, conn: psycopg.Connection, dsn: str, login) -> None:  # noqa: F811
    """Exactly as an unknown id: the same message and hint, without waiting for the row's lock (the
    enqueue used to lock it first), nothing written."""
    secret = enqueue(conn, queue="secret")
    attempt = run(conn, secret)
    conn.execute("SELECT pgq.grant_queue('secret', %s, 'read')", (READERS,))
    login(PROD).close()  # the login exists
    owner = h.session("owner")
    h.step(owner, "begin", "BEGIN")
    not_blocked(h.step(owner, "renew", "SELECT pgq.renew(%s, %s)", (secret, attempt)))  # holds the row
    before = written(conn)
    with Harness(make_conninfo(dsn, user=PROD), experiment="hidden dependency", step_timeout=10) as as_producer:
        producer = as_producer.session("producer")
        answers = []
        for job_id in (secret, secret + 1000):
            step = as_producer.step(producer, f"enqueue_{job_id}", "SELECT pgq.enqueue('q', 'k', depends_on => %s)",
                                    ([job_id],))
            assert step.done and not step.blocked and step.sqlstate == "22023", step.outcome
            answers.append(step.message.replace(str(job_id), "ID"))
    assert answers == ['pgq: argument "depends_on" names no job with id ID'] * 2
    assert written(conn) == before
    assert h.step(owner, "commit", "COMMIT").ok


@pytest.mark.parametrize("mode", ["all_done", "all_ended"])
def test_many_enqueuers_and_completers_at_once_lose_nothing_and_run_nothing_early(
        dsn: str, conn: psycopg.Connection, mode: str) -> None:
    """Both dependency modes: all_done dependants of a failed job are cancelled, all_ended ones
    released once every dependency has ended, however; none runs before that."""
    conn.execute("SELECT pgq.configure_queue('deps', audit => false)")
    deps = [int(r[0]) for r in conn.execute(
        "SELECT pgq.enqueue_many('deps', 'k', array_fill('{}'::jsonb, ARRAY[300]))")]
    running = {c["id"]: c["attempt"] for c in claim(conn, queues=["deps"], batch=300)}
    assert len(running) == 300
    to_end = list(running)
    random.Random(1).shuffle(to_end)
    failing = set(to_end[::10])  # every tenth ends failed
    stop = threading.Event()
    errors: list[BaseException] = []
    early: list[Any] = []
    enqueued: list[tuple[int, list[int]]] = []
    lock = threading.Lock()

    def enqueuer(seed: int) -> None:
        rng = random.Random(seed)
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                while not stop.is_set():
                    picked = rng.sample(deps, rng.randint(1, 4))
                    with lock:
                        enqueued.append((enqueue(c, picked, queue="after", dependency_mode=mode), picked))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    def completer(share: list[int]) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                for job_id in share:
                    if job_id in failing:
                        c.execute("SELECT pgq.fail(%s, %s, 'boom', retryable => false)", (job_id, running[job_id]))
                    else:
                        assert c.execute("SELECT pgq.complete(%s, %s)", (job_id, running[job_id])).fetchone() == (True,)
                    time.sleep(0.01)  # the enqueuers keep adding dependants meanwhile
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    def sampler() -> None:
        # One snapshot: a pending dependant with a dependency not done would be a job run early.
        with psycopg.connect(dsn, autocommit=True) as c:
            while not stop.is_set():
                early.extend(c.execute(
                    "SELECT j.id FROM pgq.jobs AS j WHERE j.queue = 'after' AND j.state = 'pending' AND EXISTS ("
                    " SELECT FROM pgq.jobs AS d WHERE d.id = ANY (j.depends_on)"
                    " AND d.state <> ALL (%s::pgq.job_state[]))",
                    (["done"] if mode == "all_done" else ["done", "failed", "cancelled"],)).fetchall())

    enqueuers = [threading.Thread(target=enqueuer, args=(i,)) for i in range(4)]
    completers = [threading.Thread(target=completer, args=(to_end[i::3],)) for i in range(3)]
    watcher = threading.Thread(target=sampler)
    for t in [*enqueuers, *completers, watcher]:
        t.start()
    for t in completers:
        t.join(timeout=120)
    stop.set()
    for t in [*enqueuers, watcher]:
        t.join(timeout=30)
    assert not errors, errors[:3]
    assert not early, f"dependants pending before their dependencies were done: {early[:5]}"
    assert len(enqueued) > 100
    settle(conn)  # the enqueues that overlapped an end
    states = dict(conn.execute("SELECT id, state::text FROM pgq.jobs WHERE queue = 'after'").fetchall())
    wrong = [(b, picked, states[b]) for b, picked in enqueued
             if states[b] != ("cancelled" if mode == "all_done" and failing & set(picked) else "pending")]
    assert not wrong, f"dependants in the wrong state: {wrong[:5]}"
    assert links(conn) == 0


# Long chains and wide fan-ins ---------------------------------------------------------------------

def test_a_chain_of_1000_is_cancelled_whole_by_its_first_failure(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('chain', audit => false)")
    first = enqueue(conn, queue="chain")
    chain = [first]
    for _ in range(1000):
        chain.append(enqueue(conn, [chain[-1]], queue="chain"))
    end_failed(conn, first)
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE queue = 'chain' AND state = 'cancelled'") == 1000
    assert f"because job {first}, up its chain" in job(conn, chain[-1])["last_error"]
    assert f"job {chain[-2]}" in job(conn, chain[-1])["last_error"]
    assert links(conn) == 0


def test_a_chain_runs_one_job_at_a_time_in_order(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('chain', audit => false)")
    chain = [enqueue(conn, queue="chain")]
    for _ in range(300):
        chain.append(enqueue(conn, [chain[-1]], queue="chain"))
    order = []
    while claimed := claim(conn, queues=["chain"], batch=10):
        assert len(claimed) == 1  # only the head of the chain is ever claimable
        order.append(claimed[0]["id"])
        conn.execute("SELECT pgq.complete(%s, %s)", (claimed[0]["id"], claimed[0]["attempt"]))
    assert order == chain


def test_a_fan_in_of_1000_completed_by_concurrent_workers_is_released_once_by_the_last(
        dsn: str, conn: psycopg.Connection) -> None:
    deps = [int(r[0]) for r in conn.execute(
        "SELECT pgq.enqueue_many('parts', 'k', array_fill('{}'::jsonb, ARRAY[1000]))")]
    callback = enqueue(conn, deps, queue="callback")
    assert job(conn, callback)["dependencies_left"] == 1000
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                while rows := c.execute("SELECT id, attempt FROM pgq.claim('w', '{parts}', batch => 7)").fetchall():
                    c.execute("SELECT pgq.complete_many(%s, %s)", ([r[0] for r in rows], [r[1] for r in rows]))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    assert not errors, errors[:3]
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE queue = 'parts' AND state = 'done'") == 1000
    # Completions of parts take turns on the callback's row (each waits up to 50 ms for another's
    # commit); one that found it held longer left its decrement to the sweep.
    released_by = one(conn, "SELECT xmin::text FROM pgq.jobs WHERE id = %s", (callback,))
    completions = {r[0] for r in conn.execute("SELECT xmin::text FROM pgq.jobs WHERE id = ANY (%s)", (deps,))}
    if state(conn, callback) == "pending":  # released by the transaction of the last completion
        assert released_by in completions
    settle(conn)
    assert state(conn, callback) == "pending"
    assert [e for e in events(conn, callback) if e[0] == "dependencies_done"] == \
        [("dependencies_done", 0, "waiting", "pending")]  # exactly once
    assert links(conn) == 0


# Python and the command line -----------------------------------------------------------------------

def test_the_client_enqueues_with_depends_on(dsn: str, conn: psycopg.Connection) -> None:
    from pgq_thin import Client, InvalidArgument

    with Client(dsn) as client:
        a = client.enqueue("q", "k")
        b = client.enqueue("q", "k", depends_on=[a], concurrency_key="acme")
        many = client.enqueue_many("q", "k", [{}, {}], depends_on=(a,))
        record = client.get_job(b)
        assert (record.state, record.depends_on, record.dependencies_left) == ("waiting", [a], 1)
        assert client.get_job(a).has_dependants is True
        assert [j.id for j in client.list_jobs(state="waiting")] == [*reversed(many), b]
        assert [(s.queue, s.waiting) for s in client.stats()] == [("q", 3)]
        assert [(m.queue, m.waiting) for m in client.metrics()] == [("q", 3)]
        before = written(conn)
        for bad in (["1"], [1.5], [True], "12", [2 ** 63]):
            with pytest.raises(InvalidArgument, match='argument "depends_on'):
                client.enqueue("q", "k", depends_on=bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument, match='argument "depends_on" names no job with id 999'):
            client.enqueue("q", "k", depends_on=[a, 999])
        assert written(conn) == before
    complete(conn, a)
    assert [state(conn, i) for i in (b, *many)] == ["pending"] * 3


def test_the_cli_enqueues_with_depends_on_and_lists_waiting_jobs(dsn: str, conn: psycopg.Connection) -> None:
    import subprocess
    import sys

    def pgq(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "pgq_thin", *args, "--dsn", dsn], capture_output=True,
                              text=True, timeout=120)

    a, b = enqueue(conn), enqueue(conn)
    done = pgq("enqueue", "q", "k", "--depends-on", f"{a},{b}")
    assert done.returncode == 0, done.stderr
    job_id = int(done.stdout)
    assert (state(conn, job_id), job(conn, job_id)["depends_on"]) == ("waiting", [a, b])
    listed = pgq("jobs", "--state", "waiting")
    assert listed.returncode == 0 and str(job_id) in listed.stdout, listed
    shown = pgq("job", str(job_id))
    assert f"depends on   {a}, {b}" in shown.stdout, shown.stdout
    stats = pgq("stats")
    assert stats.returncode == 0 and "waiting" in stats.stdout.splitlines()[0], stats.stdout
    before = written(conn)
    refused = pgq("enqueue", "q", "k", "--depends-on", f"{a},424242")
    assert refused.returncode == 1 and refused.stdout == "", refused
    assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
    assert 'argument "depends_on" names no job with id 424242' in refused.stderr
    assert written(conn) == before
