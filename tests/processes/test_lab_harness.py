"""The lab's isolation-tester-like harness: blocked detection, barriers, errors, crashes."""

from __future__ import annotations

import time

import psycopg
import pytest

from pgq_tools.lab.harness import Harness, StepHung

from sqlhelpers import wait_for


@pytest.fixture
def h(dsn: str):  # type: ignore[no-untyped-def]
    harness = Harness(dsn, experiment="harness-test", step_timeout=10)
    harness.fixture("table", "CREATE TABLE t (id integer PRIMARY KEY, v integer NOT NULL DEFAULT 0)")
    harness.fixture("row", "INSERT INTO t (id) VALUES (1), (2)")
    yield harness
    harness.close()


def test_a_step_waiting_on_a_row_lock_is_reported_blocked_not_hung(h: Harness) -> None:
    a, b = h.session("a"), h.session("b")
    h.step(a, "a_begin", "BEGIN")
    h.step(a, "a_lock", "SELECT id FROM t WHERE id = 1 FOR UPDATE")
    update = h.step(b, "b_update", "UPDATE t SET v = v + 1 WHERE id = 1 RETURNING v")
    # step() returned while the UPDATE still waits (at its timeout it would have raised StepHung).
    assert update.blocked and not update.done
    assert update.blocked_by == ["a"]
    assert update.outcome == "blocked"
    # Other steps go on while b waits.
    other = h.step(a, "a_read", "SELECT v FROM t WHERE id = 1")
    assert other.ok and other.value == 0
    commit = h.step(a, "a_commit", "COMMIT")
    h.wait(update)
    assert update.ok and update.value == 1
    assert update.blocked_on.startswith("transactionid ShareLock")  # waiting for a's transaction
    assert update.outcome == f"blocked by a ({update.blocked_on}) then ok"
    assert update.ended_at is not None and commit.started_at is not None
    assert update.ended_at >= commit.started_at


def test_a_step_that_neither_finishes_nor_blocks_is_reported_hung(h: Harness) -> None:
    s = h.session("sleeper")
    with pytest.raises(StepHung):
        h.step(s, "sleep", "SELECT pg_sleep(30)", timeout=0.3)
    # Raised at its timeout, while the statement still ran (not after pg_sleep(30) returned).
    assert not h.steps[-1].done
    assert not h.steps[-1].blocked


def test_a_round_starts_its_steps_together_behind_a_barrier(h: Harness) -> None:
    sessions = [h.session(name) for name in ("r1", "r2", "r3")]
    steps = h.round("sleepers", [(s, f"{s.name}_sleep", "SELECT pg_sleep(1)", None) for s in sessions])
    assert all(st.ok and not st.blocked and st.round == "sleepers" for st in steps)
    # Every step started before any of them ended: they ran together (the condition itself, not
    # a bound on the wall clock).
    assert max(st.started_at for st in steps) < min(st.ended_at for st in steps), \
        [(st.name, st.started_at, st.ended_at) for st in steps]


def test_a_round_marks_a_step_that_waits_on_a_lock(h: Harness) -> None:
    holder, x, y = h.session("holder"), h.session("x"), h.session("y")
    h.step(holder, "begin", "BEGIN")
    h.step(holder, "lock", "SELECT id FROM t WHERE id = 2 FOR UPDATE")

    def commit_later() -> None:  # runs in the holder's own thread, on its connection
        # COMMIT once the round has marked x blocked and y has finished, not after a fixed
        # 0.3 s: on a loaded machine the round could start later than that, and then x would not
        # wait at all or y would find row 2 unlocked. The deadline only keeps a failure finite.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            steps = {st.name: st for st in h.steps if st.round == "mixed"}
            if "x_update" in steps and steps["x_update"].blocked and "y_skip" in steps and steps["y_skip"].done:
                break
            time.sleep(0.005)
        holder.conn.execute("COMMIT")

    release = h.start(holder, "commit_when_x_waits", fn=commit_later,
                      describe="wait until x is seen blocked and y is done, then COMMIT")
    x_step, y_step = h.round("mixed", [(x, "x_update", "UPDATE t SET v = 5 WHERE id = 2", None),
                                       (y, "y_skip", "SELECT id FROM t ORDER BY id FOR UPDATE SKIP LOCKED", None)])
    h.wait(release)
    assert x_step.blocked and x_step.blocked_by == ["holder"] and x_step.ok
    assert not y_step.blocked and y_step.rows == [(1,)]
    assert not y_step.lock_wait and y_step.lock_waits == []  # SKIP LOCKED waited for nothing


def test_a_wait_too_short_for_the_polling_is_reported_by_the_server(h: Harness, dsn: str) -> None:
    """A few milliseconds' wait, ended before the harness ever looks at pg_blocking_pids(), is
    still recorded: the waiting backend reports every wait of 1 ms or more (log_lock_waits)."""
    holder, waiter = h.session("holder"), h.session("waiter")
    assert waiter.wait_logging, "the test cluster's role is a superuser: wait logging must be on"
    h.step(holder, "begin", "BEGIN")
    h.step(holder, "lock", "SELECT id FROM t WHERE id = 1 FOR UPDATE")
    update = h.start(waiter, "w_update", "UPDATE t SET v = v + 1 WHERE id = 1")  # start(): no polling
    # Release the lock as soon as the waiter has waited 2 ms (a condition, from a third connection).
    with psycopg.connect(dsn, autocommit=True) as control:
        wait_for(lambda: control.execute(
            "SELECT coalesce(bool_or(wait_event_type = 'Lock' AND clock_timestamp() - query_start > '2 ms'), false)"
            " FROM pg_stat_activity WHERE pid = %s", (waiter.pid,)).fetchone()[0], "the waiter to wait 2 ms")
    h.step(holder, "commit", "COMMIT")
    h.wait(update)
    assert update.ok and not update.blocked, "never seen by the polling"
    assert update.lock_wait, update.lock_waits
    assert update.logged_waits[0].startswith("ShareLock on transaction"), update.lock_waits
    assert update.lock_wait_ms >= 1.0
    assert update.outcome.startswith("waited ") and update.outcome.endswith(" then ok")
    # A step that waited for nothing reports nothing.
    free = h.step(waiter, "w_read", "SELECT v FROM t WHERE id = 1")
    assert free.lock_waits == [] and not free.lock_wait and free.lock_wait_ms == 0


def test_errors_are_recorded_with_their_sqlstate(h: Harness) -> None:
    s = h.session("s")
    step = h.step(s, "div", "SELECT 1 / %(zero)s", {"zero": 0})
    assert step.sqlstate == "22012" and step.outcome.startswith("error 22012")
    assert step.sql == "SELECT 1 / 0", "the log holds the statement as sent, parameters rendered"


def test_kill_ends_the_sessions_transaction_and_releases_its_locks(h: Harness) -> None:
    a, b = h.session("a"), h.session("b")
    h.step(a, "a_begin", "BEGIN")
    h.step(a, "a_lock", "SELECT id FROM t WHERE id = 1 FOR UPDATE")
    assert h.step(b, "b_nowait", "SELECT id FROM t WHERE id = 1 FOR UPDATE NOWAIT").sqlstate == "55P03"
    h.kill(a)
    assert not a.alive
    assert h.step(b, "b_nowait_again", "SELECT id FROM t WHERE id = 1 FOR UPDATE NOWAIT").ok
