"""Workflows and results in SQL (issue 26): dependencies that release their job whatever the outcome
(dependency_mode 'all_ended') and show it their results (pgq.dependency_results), batches with
exactly one callback (pgq.batch_open / batch_close / batch_status / cancel_batch), and a producer
that reads its job's result (pgq.job_result) and is told when it ends (notify_finished). Real
PostgreSQL, real concurrent connections; the races as deterministic interleavings and a stress run."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from pgq_tools.lab.harness import Harness, Step

from loginkit import PROD, PROD2, WATCH
from sqlhelpers import claim, notifications_until_marker, one


def enqueue(conn: psycopg.Connection, queue: str = "q", **kwargs: Any) -> int:
    extra = "".join(f", {name} => %({name})s" for name in kwargs)
    return int(one(conn, f"SELECT pgq.enqueue(%(queue)s, 'k'{extra})", {"queue": queue, **kwargs}))


def run(conn: psycopg.Connection, job_id: int) -> int:
    """Claims exactly this job (the only claimable one of its queue) and returns its attempt."""
    queue = one(conn, "SELECT queue FROM pgq.jobs WHERE id = %s", (job_id,))
    [claimed] = claim(conn, queues=[queue])
    assert claimed["id"] == job_id
    return int(claimed["attempt"])


def finish(conn: psycopg.Connection, job_id: int, outcome: str, result: dict[str, Any] | None = None) -> None:
    attempt = run(conn, job_id)
    if outcome == "done":
        assert one(conn, "SELECT pgq.complete(%s, %s, %s)",
                   (job_id, attempt, json.dumps(result) if result is not None else None)) is True
    elif outcome == "failed":
        assert one(conn, "SELECT pgq.fail(%s, %s, 'boom', retryable => false)", (job_id, attempt)) == "failed"
    else:
        assert one(conn, "SELECT pgq.cancel(%s)", (job_id,)) is True


def state(conn: psycopg.Connection, job_id: int) -> str:
    return str(one(conn, "SELECT state::text FROM pgq.jobs WHERE id = %s", (job_id,)))


def status(conn: psycopg.Connection, batch: int) -> dict[str, Any]:
    row = conn.cursor(row_factory=dict_row).execute("SELECT * FROM pgq.batch_status(%s)", (batch,)).fetchone()
    assert row is not None
    return row


def callbacks(conn: psycopg.Connection, batch: int) -> list[dict[str, Any]]:
    return conn.cursor(row_factory=dict_row).execute(
        "SELECT id, queue, kind, payload, meta, state::text AS state, last_error FROM pgq.jobs "
        "WHERE meta -> 'batch' ->> 'id' = %s ORDER BY id", (str(batch),)).fetchall()


# dependency_mode ---------------------------------------------------------------------------------


@pytest.mark.parametrize("outcome", ["done", "failed", "cancelled"])
def test_an_all_ended_dependant_is_released_whatever_its_dependency_ended(conn, outcome):
    first, second = enqueue(conn, "a"), enqueue(conn, "b")
    waiting = enqueue(conn, "c", depends_on=[first, second], dependency_mode="all_ended")
    assert state(conn, waiting) == "waiting"
    finish(conn, first, outcome)
    assert state(conn, waiting) == "waiting"
    finish(conn, second, "done")
    assert state(conn, waiting) == "pending"
    assert one(conn, "SELECT dependency_mode FROM pgq.jobs WHERE id = %s", (waiting,)) == "all_ended"


def test_all_done_is_still_todays_rule(conn):
    first = enqueue(conn, "a")
    default = enqueue(conn, "c", depends_on=[first])
    named = enqueue(conn, "c", depends_on=[first], dependency_mode="all_done")
    finish(conn, first, "failed")
    assert (state(conn, default), state(conn, named)) == ("cancelled", "cancelled")


def test_an_all_ended_job_whose_dependencies_have_all_ended_is_pending_at_once(conn):
    failed, cancelled = enqueue(conn, "a"), enqueue(conn, "b")
    finish(conn, failed, "failed")
    finish(conn, cancelled, "cancelled")
    job_id = enqueue(conn, "c", depends_on=[failed, cancelled], dependency_mode="all_ended")
    assert state(conn, job_id) == "pending"
    one_open = enqueue(conn, "d", depends_on=[failed, enqueue(conn, "e")], dependency_mode="all_ended")
    assert state(conn, one_open) == "waiting"


def test_a_chain_cancelled_by_a_failure_releases_the_all_ended_job_below_it(conn):
    root = enqueue(conn, "a")
    middle = enqueue(conn, "b", depends_on=[root])                       # all_done: cancelled
    bottom = enqueue(conn, "c", depends_on=[middle], dependency_mode="all_ended")
    finish(conn, root, "failed")
    assert (state(conn, middle), state(conn, bottom)) == ("cancelled", "pending")


def test_enqueue_many_takes_the_mode_for_every_job(conn):
    dep = enqueue(conn, "a")
    ids = [r[0] for r in conn.execute(
        "SELECT pgq.enqueue_many('c', 'k', ARRAY['{}', '{}']::jsonb[], depends_on => ARRAY[%s]::bigint[], "
        "dependency_mode => 'all_ended')", (dep,))]
    finish(conn, dep, "failed")
    assert [state(conn, i) for i in ids] == ["pending", "pending"]


@pytest.mark.parametrize("call", [
    "SELECT pgq.enqueue('q', 'k', dependency_mode => 'any')",
    "SELECT pgq.enqueue('q', 'k', dependency_mode => NULL)",
    "SELECT pgq.enqueue_many('q', 'k', ARRAY['{}']::jsonb[], dependency_mode => 'ALL_DONE')",
])
def test_a_bad_dependency_mode_is_22023_naming_it_and_writes_nothing(conn, call):
    with pytest.raises(psycopg.Error) as e:
        conn.execute(call)
    assert e.value.sqlstate in ("22023", "22004")
    assert "dependency_mode" in str(e.value)
    assert one(conn, "SELECT count(*) FROM pgq.jobs") == 0


# dependency_results ------------------------------------------------------------------------------


def test_a_dependant_reads_its_dependencies_results_page_by_page(conn):
    deps = [enqueue(conn, "a", payload=json.dumps({"n": n})) for n in range(5)]
    for n, dep in enumerate(deps):
        if n == 3:
            finish(conn, dep, "failed")
        else:
            finish(conn, dep, "done", {"n": n})
    fan_in = enqueue(conn, "c", depends_on=deps, dependency_mode="all_ended")
    attempt = run(conn, fan_in)
    first = conn.execute("SELECT * FROM pgq.dependency_results(%s, %s, limit_rows => 2)", (fan_in, attempt)).fetchall()
    assert [r[0] for r in first] == deps[:2]
    rest = conn.execute("SELECT * FROM pgq.dependency_results(%s, %s, 100, %s)",
                        (fan_in, attempt, first[-1][0])).fetchall()
    rows = first + rest
    assert [r[0] for r in rows] == deps
    assert [r[1] for r in rows] == ["done", "done", "done", "failed", "done"]
    assert [r[2] for r in rows] == [{"n": 0}, {"n": 1}, {"n": 2}, None, {"n": 4}]
    assert "boom" in rows[3][3] and all(r[4] is not None for r in rows)


def test_dependency_results_belong_to_the_running_attempt_of_its_owner(conn, login):  # noqa: F811 - the fixture
    dep = enqueue(conn, "a")
    finish(conn, dep, "done", {"x": 1})
    job_id = enqueue(conn, "c", depends_on=[dep])
    attempt = run(conn, job_id)
    for args in ((job_id, attempt + 1), (job_id + 1000, 1)):
        with pytest.raises(psycopg.Error) as e:
            conn.execute("SELECT * FROM pgq.dependency_results(%s, %s)", args)
        assert e.value.sqlstate == "55000"
    for bad in (0, 1001, None):
        with pytest.raises(psycopg.Error) as e:
            conn.execute("SELECT * FROM pgq.dependency_results(%s, %s, %s)", (job_id, attempt, bad))
        assert e.value.sqlstate in ("22023", "22004") and "limit_rows" in str(e.value)


# job_result and notify_finished ------------------------------------------------------------------


def test_job_result_answers_the_enqueuer_readers_and_admins_and_nobody_else(conn, login):  # noqa: F811 - the fixture
    producer, other, monitor = login(PROD), login(PROD2), login(WATCH)
    job_id = int(one(producer, "SELECT pgq.enqueue('q', 'k')"))
    assert one(conn, "SELECT enqueued_by FROM pgq.jobs WHERE id = %s", (job_id,)) == PROD
    assert producer.execute("SELECT * FROM pgq.job_result(%s)", (job_id,)).fetchone() == ("pending", None, None, None)
    finish(conn, job_id, "done", {"answer": 42})
    mine = producer.execute("SELECT * FROM pgq.job_result(%s)", (job_id,)).fetchone()
    assert mine is not None and mine[:3] == ("done", {"answer": 42}, None) and mine[3] is not None
    assert monitor.execute("SELECT state FROM pgq.job_result(%s)", (job_id,)).fetchone() == ("done",)
    assert conn.execute("SELECT state FROM pgq.job_result(%s)", (job_id,)).fetchone() == ("done",)
    for unknown in (job_id, job_id + 1000):
        with pytest.raises(psycopg.Error) as e:
            other.execute("SELECT * FROM pgq.job_result(%s)", (unknown,))
        assert e.value.sqlstate == "P0002" and f"no job with id {unknown}" in str(e.value)


def test_only_a_job_enqueued_with_notify_finished_notifies_its_end(conn, dsn):
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN pgq_finished")
        quiet, loud = enqueue(conn, "a"), enqueue(conn, "b", notify_finished=True)
        finish(conn, quiet, "done")
        finish(conn, loud, "failed")
        got = notifications_until_marker(listener, conn, "pgq_finished")
    assert got == [str(loud)]


# batches -----------------------------------------------------------------------------------------


def test_a_sealed_batch_enqueues_its_callback_once_when_its_last_member_ends(conn):
    batch = int(one(conn, "SELECT pgq.batch_open('cb', 'report', '{\"to\": \"ops\"}')"))
    members = [enqueue(conn, "m", batch=batch) for _ in range(3)]
    members += [r[0] for r in conn.execute("SELECT pgq.enqueue_many('m', 'k', ARRAY['{}', '{}']::jsonb[], batch => %s)",
                                           (batch,))]
    assert status(conn, batch)["state"] == "open"
    finish(conn, members[0], "done")
    finish(conn, members[1], "failed")
    assert one(conn, "SELECT pgq.batch_close(%s)", (batch,)) is True
    assert one(conn, "SELECT pgq.batch_close(%s)", (batch,)) is False
    for m in members[2:4]:
        finish(conn, m, "done")
    assert callbacks(conn, batch) == [] and status(conn, batch)["unfinished"] == 1
    finish(conn, members[4], "cancelled")
    [cb] = callbacks(conn, batch)
    assert (cb["queue"], cb["kind"], cb["payload"], cb["state"]) == ("cb", "report", {"to": "ops"}, "pending")
    assert cb["meta"] == {"batch": {"id": batch, "members": 5, "done": 3, "failed": 1, "cancelled": 1}}
    s = status(conn, batch)
    assert (s["state"], s["members"], s["unfinished"], s["done"], s["failed"], s["cancelled"], s["callback_job_id"]) \
        == ("finished", 5, 0, 3, 1, 1, cb["id"])
    conn.execute("SELECT pgq.sweep()")
    assert len(callbacks(conn, batch)) == 1


def test_an_empty_sealed_batch_calls_back_at_once(conn):
    batch = int(one(conn, "SELECT pgq.batch_open('cb', 'report')"))
    one(conn, "SELECT pgq.batch_close(%s)", (batch,))
    [cb] = callbacks(conn, batch)
    assert cb["state"] == "pending" and cb["meta"]["batch"]["members"] == 0


def test_an_all_done_batch_with_a_failure_has_its_callback_cancelled(conn):
    batch = int(one(conn, "SELECT pgq.batch_open('cb', 'report', run_when => 'all_done')"))
    ok, bad = enqueue(conn, "m", batch=batch), enqueue(conn, "m2", batch=batch)
    one(conn, "SELECT pgq.batch_close(%s)", (batch,))
    finish(conn, bad, "failed")
    finish(conn, ok, "done")
    [cb] = callbacks(conn, batch)
    assert cb["state"] == "cancelled" and "1 of the 2 members" in cb["last_error"]


def test_members_join_only_an_open_batch_that_exists(conn):
    batch = int(one(conn, "SELECT pgq.batch_open('cb', 'report')"))
    one(conn, "SELECT pgq.batch_close(%s)", (batch,))
    before = one(conn, "SELECT count(*) FROM pgq.jobs")
    for call, code in (("SELECT pgq.enqueue('m', 'k', batch => %s)", "55000"),
                       ("SELECT pgq.enqueue_many('m', 'k', ARRAY['{}']::jsonb[], batch => %s)", "55000")):
        with pytest.raises(psycopg.Error) as e:
            conn.execute(call, (batch,))
        assert e.value.sqlstate == code and "batch" in str(e.value)
    with pytest.raises(psycopg.Error) as e:
        conn.execute("SELECT pgq.enqueue('m', 'k', batch => 987654)")
    assert e.value.sqlstate == "22023" and "batch" in str(e.value)
    assert one(conn, "SELECT count(*) FROM pgq.jobs") == before


@pytest.mark.parametrize("call, argument", [
    ("SELECT pgq.batch_open('cb', 'k', run_when => 'sometimes')", "run_when"),
    ("SELECT pgq.batch_open('', 'k')", "callback_queue"),
    ("SELECT pgq.batch_open('cb', NULL)", "callback_kind"),
    ("SELECT pgq.batch_open('cb', 'k', '[1]')", "callback_payload"),
])
def test_batch_open_refuses_bad_input_naming_the_argument(conn, call, argument):
    with pytest.raises(psycopg.Error) as e:
        conn.execute(call)
    assert e.value.sqlstate in ("22023", "22004") and argument in str(e.value)
    assert one(conn, "SELECT count(*) FROM pgq.batches") == 0


def test_a_batch_is_its_openers_a_monitors_and_an_admins_to_see(conn, login):  # noqa: F811 - the fixture
    producer, other, monitor = login(PROD), login(PROD2), login(WATCH)
    batch = int(one(producer, "SELECT pgq.batch_open('cb', 'report')"))
    assert status(monitor, batch)["opened_by"] == PROD
    assert status(conn, batch)["state"] == "open"
    for call in ("SELECT * FROM pgq.batch_status(%s)", "SELECT pgq.batch_close(%s)", "SELECT pgq.cancel_batch(%s)"):
        with pytest.raises(psycopg.Error) as e:
            other.execute(call, (batch,))
        assert e.value.sqlstate == "P0002"
    assert status(producer, batch)["state"] == "open"


def test_cancel_batch_cancels_the_members_not_started_and_the_callback(conn):
    batch = int(one(conn, "SELECT pgq.batch_open('cb', 'report')"))
    running = enqueue(conn, "m", batch=batch)
    attempt = run(conn, running)
    waiting_on = enqueue(conn, "x")
    rest = [enqueue(conn, "m2", batch=batch) for _ in range(3)]
    rest.append(enqueue(conn, "m3", batch=batch, depends_on=[waiting_on]))
    assert one(conn, "SELECT pgq.cancel_batch(%s)", (batch,)) == 4
    assert [state(conn, j) for j in rest] == ["cancelled"] * 4
    assert state(conn, running) == "running" and status(conn, batch)["state"] == "cancelled"
    with pytest.raises(psycopg.Error) as e:
        conn.execute("SELECT pgq.enqueue('m', 'k', batch => %s)", (batch,))
    assert e.value.sqlstate == "55000"
    assert callbacks(conn, batch) == []
    assert one(conn, "SELECT pgq.complete(%s, %s)", (running, attempt)) is True
    [cb] = callbacks(conn, batch)
    assert cb["state"] == "cancelled" and cb["meta"]["batch"] == {
        "id": batch, "members": 5, "done": 1, "failed": 0, "cancelled": 4}


def test_cancel_batch_works_in_bounded_steps_and_the_sweep_takes_the_rest(conn):
    conn.execute("CREATE OR REPLACE FUNCTION pgq._dependency_step() RETURNS integer LANGUAGE sql STABLE AS 'SELECT 3'")
    batch = int(one(conn, "SELECT pgq.batch_open('cb', 'report')"))
    conn.execute("SELECT pgq.enqueue_many('m', 'k', array_fill('{}'::jsonb, ARRAY[10]), batch => %s)", (batch,))
    assert one(conn, "SELECT pgq.cancel_batch(%s)", (batch,)) == 3
    conn.execute("SELECT pgq.sweep(4)")
    assert status(conn, batch)["cancelled"] == 7
    conn.execute("SELECT pgq.sweep(4)")
    s = status(conn, batch)
    assert (s["cancelled"], s["unfinished"]) == (10, 0)
    [cb] = callbacks(conn, batch)
    assert cb["state"] == "cancelled"


def test_a_retried_member_counts_once(conn):
    batch = int(one(conn, "SELECT pgq.batch_open('cb', 'report')"))
    a, b = enqueue(conn, "m", batch=batch), enqueue(conn, "m2", batch=batch)
    one(conn, "SELECT pgq.batch_close(%s)", (batch,))
    finish(conn, a, "failed")
    assert one(conn, "SELECT pgq.retry(%s)", (a,)) is True
    assert status(conn, batch)["failed"] == 0
    finish(conn, a, "done")
    assert callbacks(conn, batch) == []
    finish(conn, b, "done")
    [cb] = callbacks(conn, batch)
    assert cb["meta"]["batch"]["done"] == 2 and cb["meta"]["batch"]["failed"] == 0


def test_a_member_adds_members_from_its_own_transaction_while_the_batch_is_open(conn, dsn):
    batch = int(one(conn, "SELECT pgq.batch_open('cb', 'report')"))
    parent = enqueue(conn, "m", batch=batch)
    attempt = run(conn, parent)
    with psycopg.connect(dsn) as handler:  # one transaction: the handler's writes and its completion
        handler.execute("SELECT pgq.enqueue('m2', 'k', batch => %s)", (batch,))
        handler.execute("SELECT pgq.complete(%s, %s)", (parent, attempt))
        handler.commit()
    one(conn, "SELECT pgq.batch_close(%s)", (batch,))
    assert callbacks(conn, batch) == []
    [child] = [r[0] for r in conn.execute("SELECT id FROM pgq.jobs WHERE batch_id = %s AND id <> %s", (batch, parent))]
    finish(conn, child, "done")
    assert len(callbacks(conn, batch)) == 1


# races -------------------------------------------------------------------------------------------


def _claimed(conn: psycopg.Connection, queue: str) -> tuple[int, int]:
    [row] = claim(conn, queues=[queue])
    return int(row["id"]), int(row["attempt"])


@pytest.fixture
def h(dsn: str) -> Iterator[Harness]:
    harness = Harness(dsn, experiment="batches", step_timeout=10)
    yield harness
    harness.close()


def test_two_last_members_ending_at_once_give_one_callback_in_the_last_ones_transaction(conn, h):
    """Both end in open transactions, each counted in its own shard (the first one no other
    transaction holds), so neither sees the other's end; the second takes its turn on the batch row
    after the first commits, then sees both, and enqueues the callback in its own transaction."""
    batch = int(one(conn, "SELECT pgq.batch_open('cb', 'report')"))
    members = [enqueue(conn, "m", batch=batch), enqueue(conn, "m2", batch=batch)]
    one(conn, "SELECT pgq.batch_close(%s)", (batch,))
    (ja, aa), (jb, ab) = _claimed(conn, "m"), _claimed(conn, "m2")
    assert [ja, jb] == members
    first, second = h.session("first"), h.session("second")
    h.step(first, "begin", "BEGIN")
    h.step(second, "begin", "BEGIN")
    assert h.step(first, "complete", "SELECT pgq.complete(%s, %s)", (ja, aa)).value is True
    waiting = h.step(second, "complete", "SELECT pgq.complete(%s, %s)", (jb, ab))
    assert waiting.blocked, waiting.outcome  # its turn on the batch row comes at first's commit
    assert h.step(first, "commit", "COMMIT").ok
    assert h.wait(waiting).value is True
    assert callbacks(conn, batch) == []      # the second's transaction has not committed yet
    assert h.step(second, "commit", "COMMIT").ok
    [cb] = callbacks(conn, batch)
    assert cb["meta"]["batch"]["done"] == 2 and status(conn, batch)["callback_job_id"] == cb["id"]
    conn.execute("SELECT pgq.sweep()")
    assert len(callbacks(conn, batch)) == 1


def test_a_member_ending_while_the_batch_is_sealed_gives_one_callback_from_the_close(conn, h):
    """The last end is in flight (it did not see a seal) when batch_close runs: the close waits for
    its shard, then sees the end and enqueues the callback itself."""
    batch = int(one(conn, "SELECT pgq.batch_open('cb', 'report')"))
    member = enqueue(conn, "m", batch=batch)
    job_id, attempt = _claimed(conn, "m")
    assert member == job_id
    ender, closer = h.session("ender"), h.session("closer")
    h.step(ender, "begin", "BEGIN")
    assert h.step(ender, "complete", "SELECT pgq.complete(%s, %s)", (job_id, attempt)).value is True
    closing = h.step(closer, "close", "SELECT pgq.batch_close(%s)", (batch,))
    assert closing.blocked, closing.outcome
    assert h.step(ender, "commit", "COMMIT").ok
    assert h.wait(closing).value is True
    [cb] = callbacks(conn, batch)
    assert cb["meta"]["batch"] == {"id": batch, "members": 1, "done": 1, "failed": 0, "cancelled": 0}


def test_a_transaction_ending_two_members_while_the_close_waits_for_it_is_not_a_deadlock(conn, h):
    """The close holds the batch row and waits for the ender's shard; the ender's second end
    updates its shard again, which checks the shard's foreign key (FOR KEY SHARE on the batch row):
    the close holds it FOR NO KEY UPDATE, which does not conflict, so the ender goes on."""
    batch = int(one(conn, "SELECT pgq.batch_open('cb', 'report')"))
    for _ in range(3):
        enqueue(conn, "m", batch=batch)
    rows = claim(conn, queues=["m"], batch=3)
    ender, closer = h.session("ender"), h.session("closer")
    h.step(ender, "begin", "BEGIN")
    not_blocked(h.step(ender, "first", "SELECT pgq.complete(%s, %s)", (rows[0]["id"], rows[0]["attempt"])))
    closing = h.step(closer, "close", "SELECT pgq.batch_close(%s)", (batch,))
    assert closing.blocked, closing.outcome
    not_blocked(h.step(ender, "second", "SELECT pgq.complete(%s, %s)", (rows[1]["id"], rows[1]["attempt"])))
    assert h.step(ender, "commit", "COMMIT").ok
    assert h.wait(closing).value is True
    assert (status(conn, batch)["done"], callbacks(conn, batch)) == (2, [])
    assert one(conn, "SELECT pgq.complete(%s, %s)", (rows[2]["id"], rows[2]["attempt"])) is True
    assert len(callbacks(conn, batch)) == 1


def test_ends_beyond_the_tail_in_flight_at_once_are_settled_by_the_sweep(conn, h):
    """More ends in flight at once than pgq._batch_tail() (1 here): neither locks the batch row, so
    neither sees the other's; the next sweep enqueues the callback, once."""
    conn.execute("CREATE OR REPLACE FUNCTION pgq._batch_tail() RETURNS integer LANGUAGE sql IMMUTABLE AS 'SELECT 0'")
    batch = int(one(conn, "SELECT pgq.batch_open('cb', 'report')"))
    members = [enqueue(conn, "m", batch=batch), enqueue(conn, "m2", batch=batch)]
    one(conn, "SELECT pgq.batch_close(%s)", (batch,))
    (ja, aa), (jb, ab) = _claimed(conn, "m"), _claimed(conn, "m2")
    assert [ja, jb] == members
    first, second = h.session("first"), h.session("second")
    for session, (job_id, attempt) in ((first, (ja, aa)), (second, (jb, ab))):
        h.step(session, "begin", "BEGIN")
        assert not_blocked(h.step(session, "complete", "SELECT pgq.complete(%s, %s)", (job_id, attempt))).value
    assert h.step(first, "commit", "COMMIT").ok
    assert h.step(second, "commit", "COMMIT").ok
    assert callbacks(conn, batch) == [] and status(conn, batch)["unfinished"] == 0
    conn.execute("SELECT pgq.sweep()")
    conn.execute("SELECT pgq.sweep()")
    assert len(callbacks(conn, batch)) == 1


def not_blocked(step: Step) -> Step:
    assert step.ok and not step.blocked, step.outcome
    return step


def test_batch_close_waits_for_a_member_being_added_and_counts_it(conn, dsn):
    batch = int(one(conn, "SELECT pgq.batch_open('cb', 'report')"))
    with psycopg.connect(dsn) as adder:
        adder.execute("SELECT pgq.enqueue('m', 'k', batch => %s)", (batch,))
        done = threading.Event()

        def close() -> None:
            with psycopg.connect(dsn, autocommit=True) as c:
                c.execute("SELECT pgq.batch_close(%s)", (batch,))
            done.set()

        closing = threading.Thread(target=close)
        closing.start()
        # The close waits for the adder's lock on the batch row (seen in pg_locks, not by a sleep).
        from sqlhelpers import wait_for
        wait_for(lambda: one(conn, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                   "AND query LIKE '%%batch_close%%'") == 1, "batch_close waiting")
        assert not done.is_set()
        adder.commit()
        closing.join(30)
    assert done.is_set()
    s = status(conn, batch)
    assert (s["state"], s["members"]) == ("sealed", 1)


@pytest.mark.parametrize("how", ["one by one", "complete_many"])
def test_many_workers_ending_members_of_one_batch_give_one_callback_with_exact_counts(conn, dsn, how):
    """8 workers end 1,200 members (10% failing) while a sampler seals the batch a third of the way
    through and sweeps; the tail (pgq._batch_tail()) is most of the batch. complete_many counts its
    members once per batch (one shard update), the others once per job."""
    batch = int(one(conn, "SELECT pgq.batch_open('cb', 'report')"))
    total = 1200
    conn.execute("SELECT pgq.enqueue_many('m', 'k', array_fill('{}'::jsonb, ARRAY[%s]), batch => %s, "
                 "max_attempts => 1)", (total, batch))
    outcomes: dict[int, str] = {}
    errors: list[BaseException] = []
    lock = threading.Lock()
    sealed = threading.Event()
    callbacks_seen: list[int] = []

    def worker(n: int) -> None:
        rng = random.Random(n)
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                while True:
                    rows = c.execute("SELECT id, attempt FROM pgq.claim(%s, ARRAY['m'], 7)", (f"w{n}",)).fetchall()
                    if not rows:
                        return
                    with c.transaction():
                        ended: dict[int, str] = {}
                        for job_id, attempt in rows:
                            if rng.random() < 0.1:
                                c.execute("SELECT pgq.fail(%s, %s, 'x', retryable => false)", (job_id, attempt))
                                ended[job_id] = "failed"
                            elif how == "one by one":
                                c.execute("SELECT pgq.complete(%s, %s)", (job_id, attempt))
                                ended[job_id] = "done"
                        if how == "complete_many":
                            done = [(j, a) for j, a in rows if j not in ended]
                            got = c.execute("SELECT count(*) FROM pgq.complete_many(%s, %s)",
                                            ([j for j, _ in done], [a for _, a in done])).fetchone()
                            assert got == (len(done),)
                            ended.update({j: "done" for j, _ in done})
                        with lock:
                            outcomes.update(ended)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def sampler() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                while len(outcomes) < total and not errors:
                    if len(outcomes) > total // 3 and not sealed.is_set():
                        c.execute("SELECT pgq.batch_close(%s)", (batch,))
                        sealed.set()
                    c.execute("SELECT pgq.sweep()")
                    callbacks_seen.append(len(callbacks(c, batch)))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)] + [threading.Thread(target=sampler)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, [str(e) for e in errors]
    if not sealed.is_set():
        one(conn, "SELECT pgq.batch_close(%s)", (batch,))
    conn.execute("SELECT pgq.sweep()")
    assert max(callbacks_seen, default=0) <= 1
    [cb] = callbacks(conn, batch)
    done = sum(1 for o in outcomes.values() if o == "done")
    assert cb["meta"]["batch"] == {"id": batch, "members": total, "done": done, "failed": total - done, "cancelled": 0}
    assert len(outcomes) == total


# job_links ---------------------------------------------------------------------------------------


def test_job_links_lists_dependencies_and_dependants_after_release(conn):
    a, b = enqueue(conn, "a"), enqueue(conn, "b")
    child = enqueue(conn, "c", depends_on=[b, a])
    other = enqueue(conn, "d", depends_on=[a], dependency_mode="all_ended")
    finish(conn, a, "done")
    finish(conn, b, "done")
    rows = conn.execute("SELECT relation, job_id, queue, state FROM pgq.job_links(%s)", (child,)).fetchall()
    assert rows == [("dependency", a, "a", "done"), ("dependency", b, "b", "done")]
    rows = conn.execute("SELECT relation, job_id, state FROM pgq.job_links(%s, 1)", (a,)).fetchall()
    assert rows == [("dependant", child, "pending")]
    rows = conn.execute("SELECT job_id FROM pgq.job_links(%s)", (a,)).fetchall()
    assert rows == [(child,), (other,)]
    with pytest.raises(psycopg.Error) as e:
        conn.execute("SELECT * FROM pgq.job_links(%s)", (987654,))
    assert e.value.sqlstate == "P0002"


def test_complete_many_counts_members_of_several_batches_once_each(conn):
    conn.execute("CREATE OR REPLACE FUNCTION pgq._batch_tail() RETURNS integer LANGUAGE sql IMMUTABLE AS 'SELECT 2'")
    first, second = (int(one(conn, "SELECT pgq.batch_open('cb', 'report')")) for _ in range(2))
    for batch in (first, second):
        conn.execute("SELECT pgq.enqueue_many('m', 'k', array_fill('{}'::jsonb, ARRAY[40]), batch => %s)", (batch,))
        one(conn, "SELECT pgq.batch_close(%s)", (batch,))
    conn.execute("SELECT pgq.enqueue_many('m', 'k', array_fill('{}'::jsonb, ARRAY[5]))")  # not members
    rows = claim(conn, queues=["m"], batch=85)
    ids, attempts = [r["id"] for r in rows], [r["attempt"] for r in rows]
    assert one(conn, "SELECT count(*) FROM pgq.complete_many(%s, %s)", (ids[:50], attempts[:50])) == 50
    assert (status(conn, first)["done"], status(conn, second)["done"]) == (40, 10)
    assert len(callbacks(conn, first)) == 1 and callbacks(conn, second) == []
    assert one(conn, "SELECT count(*) FROM pgq.complete_many(%s, %s)", (ids[50:], attempts[50:])) == 35
    assert status(conn, second)["done"] == 40 and len(callbacks(conn, second)) == 1


def test_prune_deletes_a_finished_batch_with_its_members_rows_and_counts(conn):
    batch = int(one(conn, "SELECT pgq.batch_open('cb', 'report')"))
    member = enqueue(conn, "m", batch=batch)
    one(conn, "SELECT pgq.batch_close(%s)", (batch,))
    finish(conn, member, "done")
    [cb] = callbacks(conn, batch)
    conn.execute("UPDATE pgq.jobs SET finished_at = now() - interval '30 days' WHERE id = %s", (member,))
    conn.execute("UPDATE pgq.batches SET finished_at = now() - interval '30 days' WHERE id = %s", (batch,))
    assert one(conn, "SELECT pgq.prune(interval '1 day')") == 1
    rows = [one(conn, f"SELECT count(*) FROM pgq.{t} WHERE batch_id = %s", (batch,))
            for t in ("batch_members", "batch_counts")]
    assert rows == [0, 0] and one(conn, "SELECT count(*) FROM pgq.batches") == 0
    assert state(conn, cb["id"]) == "pending"  # the callback is a job of its own queue, kept
