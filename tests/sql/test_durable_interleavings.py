"""Durable execution's races, stepped in a fixed order on the lab's multi-session harness (as
tests/sql/test_interleavings.py does; a step is "blocked" when pg_blocking_pids() shows it waiting, and
a wait of 1 ms or more is reported by the server: Step.lock_wait):

- a signal committed before, during or after a wait wakes it, exactly once, in every order of the
  two transactions, and neither waits for the other; many signals of one name at once wake it once;
- a producer's transaction left open after pgq.signal holds back no worker's claim, wait, step or
  completion (and no sweep or settle);
- a spawn and pgq.cancel_workflow take turns on the parent: the child is cancelled, or never made;
- a step recorded by an attempt whose lease has passed is kept when it came before the reclaim
  (which skips the job meanwhile), and refused when it came after;
- a child that ends while its parent's pgq.await_jobs is in flight releases the parent by the next
  settle.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import psycopg
import pytest

from pgq_tools.lab.harness import Harness, Step

from durablekit import await_signal, reclaim, running, settle, state
from sqlhelpers import claim, expire_lease, job, one

AWAIT = "SELECT status, payload FROM pgq.await_signal(%s, %s, 'go', '1 hour')"
SIGNAL = "SELECT pgq.signal('q', 'go', %s::jsonb)"


@pytest.fixture
def h(dsn: str) -> Iterator[Harness]:
    harness = Harness(dsn, experiment="durable", step_timeout=10)
    yield harness
    harness.close()


def never_waited(*steps: Step) -> None:
    for s in steps:
        assert s.ok and not s.lock_wait, f"{s.session} {s.name}: {s.outcome}"


def signalled_events(conn: psycopg.Connection, job_id: int) -> int:
    return int(one(conn, "SELECT count(*) FROM pgq.job_events WHERE job_id = %s AND event = 'signalled'", (job_id,)))


# A signal and a wait ---------------------------------------------------------------------------------

ORDERS = sorted({order for order in itertools.permutations(["w_await", "w_commit", "p_signal", "p_commit"])
                 if order.index("w_await") < order.index("w_commit")
                 and order.index("p_signal") < order.index("p_commit")})


def test_every_order_of_a_signal_and_a_wait_wakes_the_job_exactly_once_and_neither_waits(
        dsn: str, conn: psycopg.Connection) -> None:
    assert len(ORDERS) == 6
    for order in ORDERS:
        conn.execute("TRUNCATE pgq.jobs, pgq.job_events, pgq.steps, pgq.signals, pgq.signal_checks")
        with Harness(dsn, experiment=" ".join(order), step_timeout=10) as h:
            _signal_and_wait(h, conn, order)


def _signal_and_wait(h: Harness, conn: psycopg.Connection, order: tuple[str, ...]) -> None:
    where = " ".join(order)
    job_id, attempt = running(conn)
    w, p = h.session("w"), h.session("p")
    h.step(w, "w_begin", "BEGIN")
    h.step(p, "p_begin", "BEGIN")
    taken: dict[str, Step] = {}
    for name in order:
        session = w if name.startswith("w") else p
        if name.endswith("commit"):
            taken[name] = h.step(session, name, "COMMIT")
        elif name == "w_await":
            taken[name] = h.step(w, name, AWAIT, (job_id, attempt))
        else:
            taken[name] = h.step(p, name, SIGNAL, ('{"from": "p"}',))
    never_waited(*taken.values())
    told = taken["w_await"].rows[0]
    woken_by_signal = taken["p_signal"].value
    # Before: the wait read the signal. After: the signal woke the parked job. During: neither saw
    # the other, and the signal's check wakes it at the first settle after both committed.
    if told[0] == "arrived":
        assert order.index("p_commit") < order.index("w_await") and woken_by_signal == 0, where
        assert state(conn, job_id) == "running", where
    else:
        assert told == ("waiting", None), where
        if woken_by_signal == 0:
            assert state(conn, job_id) == "waiting", where
            settle(conn)
        assert state(conn, job_id) == "pending", where
        assert signalled_events(conn, job_id) == 1, where
        again = reclaim(conn, job_id)
        assert await_signal(conn, job_id, again, "go") == ("arrived", {"from": "p"}), where
    # Nothing is woken twice, and the check goes once no transaction of that time runs.
    settle(conn)
    settle(conn)
    assert signalled_events(conn, job_id) in (0, 1), where
    assert one(conn, "SELECT count(*) FROM pgq.signal_checks") == 0, where
    assert one(conn, "SELECT count(*) FROM pgq.steps WHERE name = 'signal:go'") == 1, where


def test_the_check_of_a_signal_whose_wait_committed_after_its_horizon_still_wakes_it(
        h: Harness, conn: psycopg.Connection) -> None:
    """A wait that read no signal stays in flight across the signal's first look (the stamp): the
    check waits for it (its transaction id is older than the horizon), and wakes it once it commits."""
    job_id, attempt = running(conn)
    w, p = h.session("w"), h.session("p")
    h.step(w, "w_begin", "BEGIN")
    h.step(p, "p_begin", "BEGIN")
    never_waited(h.step(p, "p_signal", SIGNAL, ('{}',)))
    parked = h.step(w, "w_await", AWAIT, (job_id, attempt))
    never_waited(parked, h.step(p, "p_commit", "COMMIT"))
    assert parked.rows == [("waiting", None)]
    settle(conn)                       # stamps the check; the park is not committed yet
    settle(conn)                       # the horizon has not passed: the wait's transaction is older
    assert one(conn, "SELECT count(*) FROM pgq.signal_checks WHERE horizon IS NOT NULL") == 1
    never_waited(h.step(w, "w_commit", "COMMIT"))
    settle(conn)
    assert state(conn, job_id) == "pending" and signalled_events(conn, job_id) == 1
    assert one(conn, "SELECT count(*) FROM pgq.signal_checks") == 0


def test_many_signals_of_one_name_at_once_wake_the_job_once(h: Harness, conn: psycopg.Connection) -> None:
    job_id, attempt = running(conn)
    assert await_signal(conn, job_id, attempt, "go")[0] == "waiting"
    senders = [h.session(f"p{n}") for n in range(3)]
    for s in senders:
        h.step(s, f"{s.name}_begin", "BEGIN")
    first = h.step(senders[0], "p0_signal", SIGNAL, ('{"n": 0}',))
    assert first.ok and first.value == 1
    later = [h.step(s, f"{s.name}_signal", SIGNAL, (f'{{"n": {n}}}',)) for n, s in enumerate(senders[1:], 1)]
    # The later ones wait for the first (its key), not for each other: the first of a name wins.
    assert all(s.blocked and s.blocked_by == ["p0"] for s in later), [s.outcome for s in later]
    h.step(senders[0], "p0_commit", "COMMIT")
    for s in later:
        h.wait(s)
        assert s.ok and s.value == 0, s.outcome
    for s in senders[1:]:
        h.step(s, f"{s.name}_commit", "COMMIT")
    settle(conn)
    assert signalled_events(conn, job_id) == 1
    again = reclaim(conn, job_id)
    assert await_signal(conn, job_id, again, "go") == ("arrived", {"n": 0})


def test_when_the_first_signal_of_a_name_rolls_back_the_next_one_wins(h: Harness, conn: psycopg.Connection) -> None:
    job_id, attempt = running(conn)
    assert await_signal(conn, job_id, attempt, "go")[0] == "waiting"
    p0, p1 = h.session("p0"), h.session("p1")
    h.step(p0, "p0_begin", "BEGIN")
    assert h.step(p0, "p0_signal", SIGNAL, ('{"n": 0}',)).value == 1
    second = h.step(p1, "p1_signal", SIGNAL, ('{"n": 1}',))
    assert second.blocked
    h.step(p0, "p0_rollback", "ROLLBACK")
    h.wait(second)
    assert second.ok and second.value == 1
    assert state(conn, job_id) == "pending" and signalled_events(conn, job_id) == 1
    assert one(conn, "SELECT payload FROM pgq.signals WHERE name = 'go'") == {"n": 1}


def test_a_signal_behind_another_transactions_signal_of_its_name_gives_up_after_lock_timeout(
        h: Harness, conn: psycopg.Connection) -> None:
    running(conn)
    p0, p1 = h.session("p0"), h.session("p1")
    h.step(p0, "p0_begin", "BEGIN")
    h.step(p0, "p0_signal", SIGNAL, ('{}',))
    second = h.step(p1, "p1_signal", SIGNAL, ('{}',))
    assert second.blocked
    h.wait(second, timeout=30)
    assert second.sqlstate == "55P03", second.outcome
    assert "is being sent by a transaction that has not ended" in (second.message or "")
    h.step(p0, "p0_commit", "COMMIT")


# A producer's open transaction ----------------------------------------------------------------------

def test_a_producers_transaction_left_open_after_a_signal_holds_back_no_worker(
        h: Harness, conn: psycopg.Connection) -> None:
    parked, pa = running(conn)
    assert await_signal(conn, parked, pa, "go")[0] == "waiting"
    other, oa = running(conn)
    for _ in range(2):
        one(conn, "SELECT pgq.enqueue('q', 'k')")
    producer, worker = h.session("producer"), h.session("worker")
    h.step(producer, "p_begin", "BEGIN")
    assert h.step(producer, "p_signal", SIGNAL, ('{"v": 1}',)).value == 1   # woke `parked`, uncommitted
    steps = [
        h.step(worker, "w_claim", "SELECT id, attempt FROM pgq.claim('w', ARRAY['q'], 5)"),
        h.step(worker, "w_record", "SELECT pgq.record_step(%s, %s, 's', '{}')", (other, oa)),
        h.step(worker, "w_get", "SELECT * FROM pgq.get_step(%s, %s, 's')", (other, oa)),
        h.step(worker, "w_await", AWAIT, (other, oa)),                        # the very signal, in flight
        h.step(worker, "w_sweep", "SELECT pgq.sweep()"),
        h.step(worker, "w_settle", "SELECT pgq.settle_dependencies()"),
    ]
    never_waited(*steps)
    claimed = steps[0].rows
    assert len(claimed) == 2 and parked not in [r[0] for r in claimed]       # the woken job is skipped
    assert steps[3].rows == [("waiting", None)]
    completes = [h.step(worker, f"w_complete_{i}", "SELECT pgq.complete(%s, %s)", r) for i, r in enumerate(claimed)]
    never_waited(*completes)
    assert all(c.value is True for c in completes)
    h.step(producer, "p_commit", "COMMIT")
    settle(conn)
    assert (state(conn, parked), state(conn, other)) == ("pending", "pending")


# Spawn and cancel_workflow -------------------------------------------------------------------------

def test_a_cancellation_waits_for_a_spawn_in_flight_and_cancels_its_child(h: Harness, conn: psycopg.Connection) -> None:
    root, attempt = running(conn)
    w, admin = h.session("w"), h.session("admin")
    h.step(w, "w_begin", "BEGIN")
    child = h.step(w, "w_spawn", "SELECT pgq.spawn(%s, %s, 'kid', 'kids', 'child')", (root, attempt)).value
    cancel = h.step(admin, "admin_cancel", "SELECT pgq.cancel_workflow(%s)", (root,))
    assert cancel.blocked and cancel.blocked_by == ["w"], cancel.outcome
    h.step(w, "w_commit", "COMMIT")
    h.wait(cancel)
    assert cancel.ok and cancel.value == 2
    assert (state(conn, root), state(conn, child)) == ("cancelled", "cancelled")


def test_a_spawn_behind_a_cancellation_in_flight_makes_no_child(h: Harness, conn: psycopg.Connection) -> None:
    root, attempt = running(conn)
    w, admin = h.session("w"), h.session("admin")
    h.step(admin, "admin_begin", "BEGIN")
    assert h.step(admin, "admin_cancel", "SELECT pgq.cancel_workflow(%s)", (root,)).value == 1
    spawn = h.step(w, "w_spawn", "SELECT pgq.spawn(%s, %s, 'kid', 'kids', 'child')", (root, attempt))
    assert spawn.blocked and spawn.blocked_by == ["admin"], spawn.outcome
    h.step(admin, "admin_commit", "COMMIT")
    h.wait(spawn)
    assert spawn.ok and spawn.value is None
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE queue = 'kids'") == 0
    assert state(conn, root) == "cancelled"


def test_a_cancellation_finds_the_grandchild_a_running_child_spawned_meanwhile(
        h: Harness, conn: psycopg.Connection) -> None:
    root, attempt = running(conn)
    child = one(conn, "SELECT pgq.spawn(%s, %s, 'kid', 'kids', 'child')", (root, attempt))
    (kid,) = claim(conn, queues=["kids"])
    w, admin = h.session("w"), h.session("admin")
    h.step(w, "w_begin", "BEGIN")
    grandchild = h.step(w, "w_spawn", "SELECT pgq.spawn(%s, %s, 'deeper', 'kids', 'child')",
                        (child, kid["attempt"])).value
    cancel = h.step(admin, "admin_cancel", "SELECT pgq.cancel_workflow(%s)", (root,))
    assert cancel.blocked
    h.step(w, "w_commit", "COMMIT")
    h.wait(cancel)
    assert cancel.ok and cancel.value == 3
    assert [state(conn, j) for j in (root, child, grandchild)] == ["cancelled"] * 3


# A step after the lease ------------------------------------------------------------------------------

def test_a_step_recorded_after_the_lease_passed_but_before_a_reclaim_keeps_the_job_until_it_commits(
        h: Harness, conn: psycopg.Connection) -> None:
    job_id, attempt = running(conn)
    expire_lease(conn, job_id)
    a, b = h.session("a"), h.session("b")
    h.step(a, "a_begin", "BEGIN")
    recorded = h.step(a, "a_record", "SELECT pgq.record_step(%s, %s, 'charge', '{\"n\": 1}')", (job_id, attempt))
    assert recorded.value is True
    early = h.step(b, "b_claim", "SELECT id, attempt FROM pgq.claim('b', ARRAY['q'])")
    sweep = h.step(b, "b_sweep", "SELECT pgq.sweep()")
    never_waited(early, sweep)
    assert early.rows == [] and sweep.value == 0            # the job is skipped, not taken
    h.step(a, "a_commit", "COMMIT")
    late = h.step(b, "b_claim_again", "SELECT id, attempt FROM pgq.claim('b', ARRAY['q'])")
    assert late.rows == [(job_id, attempt + 1)]
    assert one(conn, "SELECT found FROM pgq.get_step(%s, %s, 'charge')", (job_id, attempt + 1)) is True


def test_a_step_recorded_after_a_reclaim_is_refused_even_when_it_waited_for_the_reclaim_to_commit(
        h: Harness, conn: psycopg.Connection) -> None:
    job_id, attempt = running(conn)
    expire_lease(conn, job_id)
    a, b = h.session("a"), h.session("b")
    h.step(b, "b_begin", "BEGIN")
    assert h.step(b, "b_claim", "SELECT id, attempt FROM pgq.claim('b', ARRAY['q'])").rows == [(job_id, attempt + 1)]
    late = h.step(a, "a_record", "SELECT pgq.record_step(%s, %s, 'charge', '{\"n\": 1}')", (job_id, attempt))
    assert late.blocked and late.blocked_by == ["b"]      # the reclaim in flight: its outcome decides
    h.step(b, "b_commit", "COMMIT")
    h.wait(late)
    assert late.ok and late.value is False
    assert one(conn, "SELECT count(*) FROM pgq.steps") == 0
    assert one(conn, "SELECT count(*) FROM pgq.job_events WHERE job_id = %s AND event = 'rejected'", (job_id,)) == 1


# Awaiting jobs -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("first", ["await", "end"])
def test_a_child_ending_while_its_parents_await_is_in_flight_releases_the_parent_by_the_next_settle(
        h: Harness, conn: psycopg.Connection, first: str) -> None:
    root, attempt = running(conn)
    child = one(conn, "SELECT pgq.spawn(%s, %s, 'kid', 'kids', 'child')", (root, attempt))
    (kid,) = claim(conn, queues=["kids"])
    w, k = h.session("w"), h.session("k")
    h.step(w, "w_begin", "BEGIN")
    h.step(k, "k_begin", "BEGIN")
    calls = {"await": (w, "w_await", "SELECT pgq.await_jobs(%s, %s, ARRAY[%s]::bigint[])", (root, attempt, child)),
             "end": (k, "k_complete", "SELECT pgq.complete(%s, %s)", (child, kid["attempt"]))}
    order = ["await", "end"] if first == "await" else ["end", "await"]
    steps = [h.step(*calls[c]) for c in order]
    never_waited(*steps, h.step(k, "k_commit", "COMMIT"), h.step(w, "w_commit", "COMMIT"))
    assert calls and [s.value for s in steps if s.name == "w_await"] == ["waiting"]
    assert state(conn, root) == "waiting" and state(conn, child) == "done"
    settle(conn)
    assert state(conn, root) == "pending"
    again = reclaim(conn, root)
    assert one(conn, "SELECT pgq.await_jobs(%s, %s, ARRAY[%s]::bigint[])", (root, again, child)) == "ended"
    assert job(conn, root)["attempt"] == again
