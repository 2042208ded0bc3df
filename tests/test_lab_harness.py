"""The lab's isolation-tester-like harness: blocked detection, barriers, errors, crashes."""

from __future__ import annotations

import time

import pytest

from pgq_thin.tools.lab.harness import Harness, StepHung


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
    t0 = time.monotonic()
    update = h.step(b, "b_update", "UPDATE t SET v = v + 1 WHERE id = 1 RETURNING v")
    assert time.monotonic() - t0 < 5, "the harness must return as soon as the step waits, not at its timeout"
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
    t0 = time.monotonic()
    with pytest.raises(StepHung):
        h.step(s, "sleep", "SELECT pg_sleep(30)", timeout=0.3)
    assert time.monotonic() - t0 < 5
    assert not h.steps[-1].blocked


def test_a_round_starts_its_steps_together_behind_a_barrier(h: Harness) -> None:
    sessions = [h.session(name) for name in ("r1", "r2", "r3")]
    # Each step sleeps 2 s: run together they take about 2 s, one after another 6 s. The bound
    # sits between the two with seconds to spare for a loaded machine (0.4 s steps under a 1.0 s
    # bound left 0.6 s).
    t0 = time.monotonic()
    steps = h.round("sleepers", [(s, f"{s.name}_sleep", "SELECT pg_sleep(2)", None) for s in sessions])
    elapsed = time.monotonic() - t0
    assert all(st.ok and not st.blocked and st.round == "sleepers" for st in steps)
    assert elapsed < 4.0, f"three 2 s steps took {elapsed:.2f}s: they did not run together"
    # Every step started before any of them ended: they overlapped.
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
