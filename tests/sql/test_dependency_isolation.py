"""Issue 37, the dependency graph's and replace's part: no login reads, delays, rewrites or holds
another login's work through them. Each attack of the issue is played here as it was found on
5e1aa62, through distinct LOGIN roles (a producer, a second producer, a worker, an admin), with
the interleavings stepped in order on their own connections:

* item 6: pgq.dependency_results answered the results of dependencies that pgq.job_result refused
  (a queue the worker may not read, another producer's job);
* item 7: one login's fan-out in the backlog delayed another login's overlapped release by as many
  sweeps as it had thousands of dependants, and such a release waited for the next sweep at all
  (pgq.settle_dependencies now takes it within a worker's poll);
* item 8: an open replace of another producer's pending job hid it from claims, made its producer's
  enqueues and an admin's cancel wait, and rewrote its payload, run_at and max_attempts;
* item 9: the session settings pgq.dependency_budget and pgq.dependency_patience, set in a worker's
  own session, made its ends leave other logins' dependants to the sweep.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from pgq_tools.lab.harness import Harness, Step

from dependencykit import backlog, links, run, state
from loginkit import ALICE, BOSS, PROD, PROD2, WRITERS
from sqlfixtures import sqlstate_of
from sqlhelpers import claim, job, one


@pytest.fixture
def as_login(dsn: str, login) -> Iterator[Any]:  # noqa: F811 - the fixture of test_sql_access
    """as_login(name) is a Harness whose sessions log in as that role (the roles exist once
    `login` has run); the superuser's is as_login(None)."""
    made: list[Harness] = []

    def _harness(name: str | None) -> Harness:
        h = Harness(dsn if name is None else make_conninfo(dsn, user=name), experiment=f"as {name}", step_timeout=10)
        made.append(h)
        return h

    yield _harness
    for h in made:
        h.close()


def not_blocked(step: Step) -> Step:
    assert step.ok and not step.blocked and not step.lock_wait, step.outcome
    return step


# Item 6: one rule for reading results -----------------------------------------------------------

def results(conn: psycopg.Connection, job_id: int, attempt: int) -> dict[int, tuple[Any, Any]]:
    """dependency_id -> (state, result) as pgq.dependency_results answers the caller."""
    return {int(r[0]): (r[1], r[2]) for r in conn.execute(
        "SELECT dependency_id, state, result FROM pgq.dependency_results(%s, %s)", (job_id, attempt))}


def done_with(conn: psycopg.Connection, job_id: int, result: dict[str, Any]) -> None:
    assert one(conn, "SELECT pgq.complete(%s, %s, %s)", (job_id, run(conn, job_id), json.dumps(result))) is True


def test_a_worker_reads_no_dependency_result_in_a_queue_its_grants_do_not_admit(conn, login) -> None:  # noqa: F811
    """The issue's attack: the producer may read queue 'secret' and names a job of it; the worker
    that claims the dependant may not read 'secret', and job_result tells it nothing: neither does
    dependency_results. A grant decides at the time of the read, both ways."""
    conn.execute("SELECT pgq.configure_queue('secret')")
    conn.execute("SELECT pgq.grant_queue('secret', %s, 'read')", (WRITERS,))
    producer, worker = login(PROD2), login(ALICE)  # PROD2 is a member of WRITERS; ALICE is not
    secret = one(producer, "SELECT pgq.enqueue('secret', 'k')")
    dependant = one(producer, "SELECT pgq.enqueue('q', 'k', depends_on => %s)", ([secret],))
    done_with(conn, secret, {"password": "hunter2"})
    [claimed] = claim(worker, queues=["q"])
    assert claimed["id"] == dependant
    assert sqlstate_of(worker, "SELECT * FROM pgq.job_result(%s)", (secret,)) == "P0002"
    assert results(worker, dependant, claimed["attempt"]) == {secret: (None, None)}  # as for a pruned job
    conn.execute("SELECT pgq.grant_queue('secret', 'pgq_worker', 'read')")
    assert results(worker, dependant, claimed["attempt"]) == {secret: ("done", {"password": "hunter2"})}
    conn.execute("SELECT pgq.revoke_queue('secret', 'pgq_worker', 'read')")
    assert results(worker, dependant, claimed["attempt"]) == {secret: (None, None)}


def test_a_worker_reads_no_result_of_another_producers_job_that_its_dependant_names(conn, login) -> None:  # noqa: F811
    """A second producer names the first one's job (it may: the queue is open to read) and its
    worker reads that job's result, which job_result refuses both of them. The results of the
    dependencies a producer enqueued itself are the worker's to read, as before."""
    first, second, worker = login(PROD), login(PROD2), login(ALICE)
    theirs = one(first, "SELECT pgq.enqueue('parts', 'k')")
    mine = one(second, "SELECT pgq.enqueue('parts', 'k')")
    dependant = one(second, "SELECT pgq.enqueue('q', 'k', depends_on => %s)", ([theirs, mine],))
    done_with(conn, theirs, {"theirs": 1})
    done_with(conn, mine, {"mine": 1})
    for reader in (second, worker):
        assert sqlstate_of(reader, "SELECT * FROM pgq.job_result(%s)", (theirs,)) == "P0002"
    [claimed] = claim(worker, queues=["q"])
    assert results(worker, dependant, claimed["attempt"]) == {theirs: (None, None), mine: ("done", {"mine": 1})}
    # A login that job_result answers for the job reads it (here: the admin, holding the attempt).
    assert results(conn, dependant, claimed["attempt"])[theirs] == ("done", {"theirs": 1})


# Item 7: a fair backlog, and prompt releases ----------------------------------------------------

def fan_out(producer: psycopg.Connection, conn: psycopg.Connection, size: int) -> int:
    """The producer's job with `size` dependants, done: 1000 released at once, the rest in the backlog."""
    head = one(producer, "SELECT pgq.enqueue('heads', 'k')")
    producer.execute("SELECT pgq.enqueue_many('fan', 'k', array_fill('{}'::jsonb, ARRAY[%s]), depends_on => %s)",
                     (size, [head]))
    assert one(conn, "SELECT pgq.complete(%s, %s)", (head, run(conn, head))) is True
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE queue = 'fan' AND state = 'waiting'") == size - 1000
    return head


def overlapped(conn: psycopg.Connection, as_login, producer_name: str, first: str = "end") -> int:
    """A dependant enqueued by `producer_name` while its dependency's end is in flight, both
    committed: neither saw the other, so its release is left to the checks. Returns its id."""
    dependency = one(conn, "SELECT pgq.enqueue('deps', 'k')")
    attempt = run(conn, dependency)
    ends, enqueues = as_login(None), as_login(producer_name)
    ender, producer = ends.session("ender"), enqueues.session("producer")
    ends.step(ender, "begin", "BEGIN")
    enqueues.step(producer, "begin", "BEGIN")
    end = ("complete", "SELECT pgq.complete(%s, %s)", (dependency, attempt))
    enqueue_it = ("enqueue", "SELECT pgq.enqueue('after', 'k', depends_on => %s)", ([dependency],))
    if first == "end":
        not_blocked(ends.step(ender, *end))
        dependant = not_blocked(enqueues.step(producer, *enqueue_it)).value
    else:
        dependant = not_blocked(enqueues.step(producer, *enqueue_it)).value
        not_blocked(ends.step(ender, *end))
    for h, session in ((ends, ender), (enqueues, producer)) if first == "end" else ((enqueues, producer),
                                                                                   (ends, ender)):
        assert h.step(session, "commit", "COMMIT").ok
    assert (state(conn, dependency), state(conn, dependant)) == ("done", "waiting")
    return int(dependant)


def test_another_logins_fan_out_in_the_backlog_does_not_delay_a_release_past_the_next_sweep(
        conn, login, as_login) -> None:  # noqa: F811
    """The issue's attack: another producer's fan-out of 5,000 (50,000 there) fills the backlog;
    a dependant whose enqueue overlapped its dependency's end was released 4 (49) sweeps later."""
    fan_out(login(PROD), conn, 5000)
    dependant = overlapped(conn, as_login, PROD2)
    conn.execute("SELECT pgq.sweep()")
    assert state(conn, dependant) == "pending"
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE queue = 'fan' AND state = 'pending'") > 1000  # and it moves


def test_many_small_rows_of_one_login_do_not_crowd_out_another_logins_check(conn, login, as_login) -> None:  # noqa: F811
    """A login's many overlapped enqueues (checks) and ends (backlog rows) take their share; another
    login's one check is settled and its dependant released by the next call all the same."""
    producer = login(PROD)
    heads = [one(producer, "SELECT pgq.enqueue('heads', 'k')") for _ in range(30)]
    for head in heads:  # a check each, never settled: their dependencies have not ended
        producer.execute("SELECT pgq.enqueue_many('fan', 'k', array_fill('{}'::jsonb, ARRAY[5]), depends_on => %s)",
                         ([head],))
    producer.execute("SELECT pgq.enqueue_many('fan', 'k', array_fill('{}'::jsonb, ARRAY[1]), depends_on => %s)",
                     (heads,))  # 30 checks more
    dependant = overlapped(conn, as_login, PROD2)
    assert backlog(conn)[0] == 30 + 30 + 1
    conn.execute("SELECT pgq.sweep(2)")  # 20 checks: 10 a login
    assert state(conn, dependant) == "pending"


@pytest.mark.parametrize("first", ["end", "enqueue"])
def test_a_dependant_whose_enqueue_overlapped_the_end_is_released_by_the_next_settle_call(
        conn, login, as_login, first: str) -> None:  # noqa: F811
    """What a worker calls every poll: the overlap is settled within a second of both commits,
    not at the next sweep (30 s by default)."""
    dependant = overlapped(conn, as_login, PROD, first)
    worker = login(ALICE)
    assert one(worker, "SELECT pgq.settle_dependencies()") == 1
    assert state(conn, dependant) == "pending"
    assert (links(conn), backlog(conn)) == (0, (0, 0))
    assert one(worker, "SELECT pgq.settle_dependencies()") == 0  # nothing left: nothing done


def test_settle_dependencies_never_waits_for_an_end_in_flight_and_takes_it_once_committed(
        conn, login, as_login) -> None:  # noqa: F811
    dependency = one(conn, "SELECT pgq.enqueue('deps', 'k')")
    attempt = run(conn, dependency)
    dependant = one(login(PROD), "SELECT pgq.enqueue('after', 'k', depends_on => %s)", ([dependency],))
    ends, workers = as_login(None), as_login(ALICE)
    ender, worker = ends.session("ender"), workers.session("worker")
    ends.step(ender, "begin", "BEGIN")
    not_blocked(ends.step(ender, "complete", "SELECT pgq.complete(%s, %s)", (dependency, attempt)))
    assert not_blocked(workers.step(worker, "settle", "SELECT pgq.settle_dependencies()")).value == 0
    assert state(conn, dependant) == "waiting"
    assert ends.step(ender, "commit", "COMMIT").ok  # (its end saw the link: it released the dependant)
    assert state(conn, dependant) == "pending"
    assert not_blocked(workers.step(worker, "settle_again", "SELECT pgq.settle_dependencies()")).value == 0
    assert backlog(conn) == (0, 0)


def test_settle_dependencies_is_fair_with_another_logins_fan_out_in_the_backlog(conn, login, as_login) -> None:  # noqa: F811
    fan_out(login(PROD), conn, 3000)
    dependant = overlapped(conn, as_login, PROD2)
    moved = one(login(ALICE), "SELECT pgq.settle_dependencies(max_jobs => 100)")
    assert state(conn, dependant) == "pending"
    assert moved == 100  # its own release, and the rest of the call's share for the fan-out
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE queue = 'fan' AND state = 'pending'") == 1099


def test_settle_dependencies_is_a_workers_call_and_checks_its_argument(conn, login) -> None:  # noqa: F811
    assert one(login(ALICE), "SELECT pgq.settle_dependencies()") == 0
    assert sqlstate_of(login(PROD), "SELECT pgq.settle_dependencies()") == "42501"
    for bad, sqlstate in (("NULL", "22004"), ("0", "22023"), ("100001", "22023")):
        assert sqlstate_of(conn, f"SELECT pgq.settle_dependencies({bad})") == sqlstate


# Item 8: a replace takes only the caller's own job ----------------------------------------------

def keyed(conn: psycopg.Connection, payload: dict[str, Any], **kwargs: Any) -> int:
    named = "".join(f", {name} => %({name})s" for name in kwargs)
    return int(one(conn, f"SELECT pgq.enqueue('q', 'k', %(payload)s, unique_key => 'k1'{named})",
                   {"payload": json.dumps(payload), **kwargs}))


REPLACE = ("SELECT pgq.enqueue('q', 'k', '{\"n\": 2}', unique_key => 'k1', on_conflict => 'replace', "
           "max_attempts => 1, run_at => now() + interval '1 hour')")


def test_an_open_replace_of_another_producers_pending_job_neither_rewrites_nor_holds_it(
        conn, login, as_login) -> None:  # noqa: F811
    """The issue's attack: the second producer's replace, left open, hid the first one's job from
    claims, made its producer's enqueue of the key and an admin's cancel wait, and rewrote its
    payload, run_at and max_attempts. Against another login's holder a replace is a keep."""
    owner = login(PROD)
    holder = keyed(owner, {"n": 1}, max_attempts=5)
    before = job(conn, holder)
    intruders, owners, workers, admins = as_login(PROD2), as_login(PROD), as_login(ALICE), as_login(BOSS)
    intruder = intruders.session("intruder")
    intruders.step(intruder, "begin", "BEGIN")
    assert not_blocked(intruders.step(intruder, "replace", REPLACE)).value == holder  # the holder: kept
    again = not_blocked(owners.step(owners.session("owner"), "enqueue", "SELECT pgq.enqueue('q', 'k', "
                                    "unique_key => 'k1')"))
    assert again.value == holder
    claimed = not_blocked(workers.step(workers.session("worker"), "claim", "SELECT id FROM pgq.claim('w', ARRAY['q'])"))
    assert claimed.rows == [(holder,)]
    assert not_blocked(admins.step(admins.session("admin"), "cancel", "SELECT pgq.cancel(%s)", (holder,))).value is True
    assert intruders.step(intruder, "commit", "COMMIT").ok
    after = job(conn, holder)
    assert {k: after[k] for k in ("payload", "run_at", "max_attempts")} == \
        {k: before[k] for k in ("payload", "run_at", "max_attempts")}
    assert one(conn, "SELECT count(*) FROM pgq.jobs") == 1  # and nothing was enqueued behind it


def test_a_replace_never_rewrites_another_logins_successor(conn, login) -> None:  # noqa: F811
    """Behind the first producer's running holder, its replace enqueued a successor: the second
    producer's replace of the key used to rewrite that job. It keeps the holder now."""
    owner, intruder = login(PROD), login(PROD2)
    holder = keyed(owner, {"n": 0})
    run(conn, holder)
    successor = keyed(owner, {"n": 1}, on_conflict="replace")
    assert successor != holder and state(conn, successor) == "waiting"
    assert keyed(intruder, {"n": 666}, on_conflict="replace") == holder
    assert job(conn, successor)["payload"] == {"n": 1}
    assert keyed(owner, {"n": 2}, on_conflict="replace") == successor  # the owner's own, still
    assert job(conn, successor)["payload"] == {"n": 2}
    assert one(conn, "SELECT count(*) FROM pgq.jobs") == 2


def test_an_open_replace_of_a_logins_own_successor_holds_no_other_logins_replace(
        conn, login, as_login) -> None:  # noqa: F811
    """Replace calls of one key took turns on one row for every login: the first producer's open
    replace of its own successor made the second producer's replace of the key wait."""
    owner = login(PROD)
    holder = keyed(owner, {"n": 0})
    attempt = run(conn, holder)
    successor = keyed(owner, {"n": 1}, on_conflict="replace")
    assert one(conn, "SELECT pgq.complete(%s, %s)", (holder, attempt)) is True
    assert state(conn, successor) == "pending"  # the key's last job, holding no key
    owners, others = as_login(PROD), as_login(PROD2)
    first = owners.session("owner")
    owners.step(first, "begin", "BEGIN")
    assert not_blocked(owners.step(first, "replace", REPLACE)).value == successor
    other = not_blocked(others.step(others.session("other"), "replace", REPLACE)).value
    assert other not in (holder, successor) and job(conn, other)["enqueued_by"] == PROD2
    assert owners.step(first, "commit", "COMMIT").ok
    assert job(conn, successor)["payload"] == {"n": 2}


def test_an_admin_replaces_any_logins_pending_holder(conn, login) -> None:  # noqa: F811
    holder = keyed(login(PROD), {"n": 1})
    assert keyed(login(BOSS), {"n": 2}, on_conflict="replace") == holder
    assert job(conn, holder)["payload"] == {"n": 2}


# Item 9: no session setting changes a cascade ---------------------------------------------------

def test_a_forged_dependency_budget_in_a_workers_session_delays_no_release(conn, login) -> None:  # noqa: F811
    """The issue's attack: `SET pgq.dependency_budget = '0'` made the worker's own ends leave every
    dependant, other producers' too, to the next sweep."""
    producer, worker = login(PROD), login(ALICE)
    head = one(producer, "SELECT pgq.enqueue('heads', 'k')")
    dependant = one(producer, "SELECT pgq.enqueue('after', 'k', depends_on => %s)", ([head],))
    conn.execute("SELECT pgq.sweep()")  # the enqueue's check
    [claimed] = claim(worker, queues=["heads"])
    worker.execute("SET pgq.dependency_budget = '0'")
    worker.execute("SELECT set_config('pgq.dependency_budget', '0', false)")
    assert one(worker, "SELECT pgq.complete(%s, %s)", (head, claimed["attempt"])) is True
    assert state(conn, dependant) == "pending"
    assert backlog(conn) == (0, 0)


def test_a_forged_dependency_patience_makes_an_end_wait_no_less(conn, login, as_login) -> None:  # noqa: F811
    """`SET pgq.dependency_patience` to a moment long past made the worker's end give up at once on
    a dependant whose row another transaction holds (a fan-in's other completion), leaving it to
    the sweep; the end waits its 50 ms now whatever the session says (seen polling, pg_sleep)."""
    producer = login(PROD)
    head = one(producer, "SELECT pgq.enqueue('heads', 'k')")
    dependant = one(producer, "SELECT pgq.enqueue('after', 'k', depends_on => %s)", ([head],))
    conn.execute("SELECT pgq.sweep()")
    holders, workers = as_login(None), as_login(ALICE)
    holder, worker = holders.session("holder"), workers.session("worker")
    [claimed] = claim(worker.conn, queues=["heads"])
    not_blocked(workers.step(worker, "forge", "SET pgq.dependency_patience = '1'"))
    holders.step(holder, "begin", "BEGIN")
    not_blocked(holders.step(holder, "lock", "SELECT id FROM pgq.jobs WHERE id = %s FOR NO KEY UPDATE", (dependant,)))
    end = workers.start(worker, "complete", "SELECT pgq.complete(%s, %s)", (head, claimed["attempt"]))
    slept = False
    while not end.done:
        slept = slept or one(conn, "SELECT wait_event = 'PgSleep' FROM pg_stat_activity WHERE pid = %s",
                             (worker.pid,)) is True
    workers.wait(end)
    assert end.ok and end.value is True, end.outcome
    assert slept, "the end gave up on the held dependant without waiting"
    assert holders.step(holder, "commit", "COMMIT").ok
    assert state(conn, dependant) == "waiting" and backlog(conn) == (0, 1)  # left to the sweep after 50 ms


def test_an_end_without_dependants_writes_no_cascade_state(conn) -> None:
    """The hot path: a job that nothing waits for ends as before, with nothing written for the graph."""
    job_id = one(conn, "SELECT pgq.enqueue('plain', 'k')")
    assert one(conn, "SELECT pgq.complete(%s, %s)", (job_id, run(conn, job_id))) is True
    assert one(conn, "SELECT count(*) FROM pgq.cascade_budgets") == 0


def test_the_clients_settle_dependencies_moves_the_backlog_on(dsn: str, conn) -> None:
    from pgq_thin import Client

    fan_out(conn, conn, 1030)
    with Client(dsn) as client:
        assert client.settle_dependencies(max_jobs=20) == 20
        assert client.settle_dependencies() == 10
        assert client.settle_dependencies() == 0
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE queue = 'fan' AND state = 'pending'") == 1030


# The upgrade: 0021's new tables take the old ones' rows over ------------------------------------

@pytest.mark.slow
def test_an_upgrade_from_5e1aa62_hands_checks_backlog_and_successor_slots_over(databases) -> None:
    """A database at 5e1aa62 (0018) holding a check, a backlog row and a replace's successor slot,
    one check held by a sweep while 0021 runs: after the upgrade every dependant is released by the
    sweeps and the slot's login still updates its successor; the old tables end empty."""
    from pgq_thin import migrate
    from pgq_tools.bench import _migrate_to

    from sqlhelpers import fresh_database

    for dsn in fresh_database(databases, "template1"):
        _migrate_to(dsn, "git:5e1aa62")
        with psycopg.connect(dsn, autocommit=True) as su:
            head = one(su, "SELECT pgq.enqueue('heads', 'k')")
            su.execute("SELECT pgq.enqueue_many('fan', 'k', array_fill('{}'::jsonb, ARRAY[1200]), depends_on => %s)",
                       ([head],))
            assert one(su, "SELECT pgq.complete(%s, %s)", (head, run(su, head))) is True  # 200 left to the backlog
            other = one(su, "SELECT pgq.enqueue('heads', 'k')")
            late = one(su, "SELECT pgq.enqueue('after', 'k', depends_on => %s)", ([other],))  # a check
            holder = keyed(su, {"n": 0})
            run(su, holder)
            successor = keyed(su, {"n": 1}, on_conflict="replace")
            # Three checks (the successor's too), a backlog row, a slot.
            assert su.execute("SELECT (SELECT count(*) FROM pgq.dependency_checks), "
                              "(SELECT count(*) FROM pgq.dependency_backlog), "
                              "(SELECT count(*) FROM pgq.unique_successors)").fetchone() == (3, 1, 1)
            with psycopg.connect(dsn) as sweeper:  # holds the late check while 0021 runs
                sweeper.execute("SELECT id FROM pgq.dependency_checks WHERE job_id = %s FOR UPDATE", (other,))
                migrate(dsn)
            assert su.execute("SELECT (SELECT count(*) FROM pgq.dependency_checks), "
                              "(SELECT count(*) FROM pgq.overlap_checks), "
                              "(SELECT count(*) FROM pgq.cascade_backlog), "
                              "(SELECT count(*) FROM pgq.replace_slots)").fetchone() == (1, 2, 1, 1)
            assert keyed(su, {"n": 2}, on_conflict="replace") == successor
            assert job(su, successor)["payload"] == {"n": 2}
            assert one(su, "SELECT pgq.complete(%s, %s)", (other, run(su, other))) is True
            assert state(su, late) == "pending"
            for _ in range(3):
                su.execute("SELECT pgq.sweep()")
            assert one(su, "SELECT count(*) FROM pgq.jobs WHERE queue = 'fan' AND state = 'pending'") == 1200
            assert su.execute("SELECT (SELECT count(*) FROM pgq.dependency_checks), "
                              "(SELECT count(*) FROM pgq.dependency_backlog), "
                              "(SELECT count(*) FROM pgq.unique_successors), "
                              "(SELECT count(*) FROM pgq.overlap_checks), "
                              "(SELECT count(*) FROM pgq.cascade_backlog)").fetchone() == (0, 0, 0, 0, 0)
