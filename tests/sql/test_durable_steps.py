"""Durable execution's steps (issue 39): a step recorded once is read back by every later attempt,
the first record of a name wins, only the job's current attempt from the login that claimed it may
read or record (the others are answered as a stale owner operation is, with a rejected event), steps
survive retries, snoozes, sleeps and waits and go with the job when it is pruned, a step recorded in
the caller's transaction commits with its writes or not at all, and the durable sleep."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from clockdb import clock_module_dsn, dsn, set_clock  # noqa: F401  (fixtures)
from durablekit import (
    ADMIN,
    MONITOR,
    PRODUCER,
    PRODUCER2,
    WORKER,
    WORKER2,
    await_signal,
    get_step,
    reclaim,
    record_step,
    rejected,
    running,
    signal,
    state,
    steps,
)
from sqlhelpers import claim, expire_lease, job, one

NOW = "2030-01-01 12:00:00+00"


def test_a_step_is_not_found_until_recorded_and_then_reads_back_its_result(conn):
    job_id, attempt = running(conn)
    assert get_step(conn, job_id, attempt, "charge") == (False, None)
    assert record_step(conn, job_id, attempt, "charge", '{"receipt": "r-1"}') is True
    assert get_step(conn, job_id, attempt, "charge") == (True, {"receipt": "r-1"})
    # A JSON null is a result too (a step without one): found, and null.
    assert record_step(conn, job_id, attempt, "notify", "null") is True
    assert get_step(conn, job_id, attempt, "notify") == (True, None)
    assert one(conn, "SELECT attempt FROM pgq.steps WHERE job_id = %s AND name = 'charge'", (job_id,)) == attempt


def test_the_first_record_of_a_name_wins_and_a_later_one_answers_true_and_keeps_it(conn):
    job_id, attempt = running(conn)
    assert record_step(conn, job_id, attempt, "charge", '{"n": 1}') is True
    assert record_step(conn, job_id, attempt, "charge", '{"n": 2}') is True  # a repeat after an ambiguous commit
    assert get_step(conn, job_id, attempt, "charge") == (True, {"n": 1})
    # And by a later attempt too.
    conn.execute("SELECT pgq.fail(%s, %s, 'boom', '1 second')", (job_id, attempt))
    conn.execute("UPDATE pgq.jobs SET run_at = now() WHERE id = %s", (job_id,))
    second = reclaim(conn, job_id)
    assert record_step(conn, job_id, second, "charge", '{"n": 3}') is True
    assert steps(conn, job_id) == {"charge": {"n": 1}}


def test_a_stale_attempt_may_neither_read_nor_record_and_is_answered_as_a_stale_complete(conn):
    job_id, first = running(conn)
    assert record_step(conn, job_id, first, "one") is True
    expire_lease(conn, job_id)
    second = reclaim(conn, job_id)
    assert second == first + 1
    events_before = len(rejected(conn, job_id))
    assert get_step(conn, job_id, first, "one") is None               # no row
    assert record_step(conn, job_id, first, "two") is False
    assert conn.execute("SELECT * FROM pgq.get_steps(%s, %s)", (job_id, first)).fetchall() == []
    assert one(conn, "SELECT pgq.complete(%s, %s)", (job_id, first)) is False  # the same answer's kin
    notes = [note for _, note in rejected(conn, job_id)[events_before:]]
    assert any(n.startswith("get_step from attempt 1 rejected") for n in notes), notes
    assert any(n.startswith("record_step from attempt 1 rejected") for n in notes), notes
    assert any(n.startswith("get_steps from attempt 1 rejected") for n in notes), notes
    assert steps(conn, job_id) == {"one": {"ok": True}}
    # The current attempt reads what the first one recorded.
    assert get_step(conn, job_id, second, "one") == (True, {"ok": True})
    assert get_step(conn, job_id, second, "two") == (False, None)


def test_a_guessed_attempt_of_an_unknown_or_finished_job_is_answered_not_yours(conn):
    assert get_step(conn, 424242, 1, "x") is None
    assert record_step(conn, 424242, 1, "x") is False
    job_id, attempt = running(conn)
    conn.execute("SELECT pgq.complete(%s, %s)", (job_id, attempt))
    assert record_step(conn, job_id, attempt, "late") is False
    assert get_step(conn, job_id, attempt, "late") is None
    assert steps(conn, job_id) == {}


def test_another_login_may_neither_read_nor_record_the_owners_steps(conn, login_as):
    owner, other = login_as(WORKER), login_as(WORKER2)
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k')")
    (c,) = claim(owner, queues=["q"])
    attempt = c["attempt"]
    assert record_step(owner, job_id, attempt, "mine", '{"secret": 1}') is True
    assert get_step(other, job_id, attempt, "mine") is None
    assert record_step(other, job_id, attempt, "forged", '{"evil": 1}') is False
    assert one(other, "SELECT count(*) FROM pgq.get_steps(%s, %s)", (job_id, attempt)) == 0
    assert {r for r, _ in rejected(conn, job_id)} == {WORKER2}
    assert steps(conn, job_id) == {"mine": {"secret": 1}}
    # An admin may act on any running job, as with every owner operation.
    boss = login_as(ADMIN)
    assert get_step(boss, job_id, attempt, "mine") == (True, {"secret": 1})


def test_steps_survive_a_retry_a_snooze_a_sleep_and_a_signal_wait(conn):
    job_id, a1 = running(conn)
    assert record_step(conn, job_id, a1, "s1", '{"n": 1}')
    conn.execute("SELECT pgq.fail(%s, %s, 'boom', '1 second')", (job_id, a1))          # a retry
    conn.execute("UPDATE pgq.jobs SET run_at = now() WHERE id = %s", (job_id,))
    a2 = reclaim(conn, job_id)
    assert record_step(conn, job_id, a2, "s2", '{"n": 2}')
    conn.execute("SELECT pgq.snooze(%s, %s, '1 second')", (job_id, a2))                 # a snooze
    conn.execute("UPDATE pgq.jobs SET run_at = now() WHERE id = %s", (job_id,))
    a3 = reclaim(conn, job_id)
    assert one(conn, "SELECT status FROM pgq.sleep(%s, %s, 'nap', '1 hour')", (job_id, a3)) == "sleeping"
    set_clock(conn, "2999-01-01 00:00+00")                                                # the sleep is over
    a4 = reclaim(conn, job_id)
    set_clock(conn, None)
    assert await_signal(conn, job_id, a4, "go") == ("waiting", None)                   # a signal wait
    assert signal(conn, "go", '{"v": 1}') == 1
    a5 = reclaim(conn, job_id)
    assert [get_step(conn, job_id, a5, n) for n in ("s1", "s2")] == [(True, {"n": 1}), (True, {"n": 2})]
    assert await_signal(conn, job_id, a5, "go") == ("arrived", {"v": 1})
    assert set(steps(conn, job_id)) == {"s1", "s2", "nap", "signal:go"}
    # The attempts the job used: those that failed (one); the snooze, the sleep and the wait gave
    # theirs back.
    row = job(conn, job_id)
    assert row["attempt"] - row["attempt_offset"] == 5 and row["max_attempts"] == 25 + 3


def test_get_steps_pages_the_recorded_steps_in_name_order(conn):
    job_id, attempt = running(conn)
    for n in range(5):
        assert record_step(conn, job_id, attempt, f"s{n}", f'{{"n": {n}}}')
    first = conn.execute("SELECT name, result FROM pgq.get_steps(%s, %s, limit_rows => 2)",
                         (job_id, attempt)).fetchall()
    assert first == [("s0", {"n": 0}), ("s1", {"n": 1})]
    rest = conn.execute("SELECT name FROM pgq.get_steps(%s, %s, after_name => 's1')", (job_id, attempt)).fetchall()
    assert [r[0] for r in rest] == ["s2", "s3", "s4"]


def test_job_steps_answers_whoever_may_read_the_result_and_p0002_for_anyone_else(conn, login_as):
    producer, stranger, monitor, worker = login_as(PRODUCER), login_as(PRODUCER2), login_as(MONITOR), login_as(WORKER)
    job_id = one(producer, "SELECT pgq.enqueue('q', 'k')")
    (c,) = claim(worker, queues=["q"])
    assert record_step(worker, job_id, c["attempt"], "charge", '{"receipt": "r"}')
    expected = [("charge", c["attempt"], {"receipt": "r"})]
    read = "SELECT name, attempt, result FROM pgq.job_steps(%s)"
    assert producer.execute(read, (job_id,)).fetchall() == expected      # it enqueued it
    assert monitor.execute(read, (job_id,)).fetchall() == expected       # it reads the queue
    assert login_as(ADMIN).execute(read, (job_id,)).fetchall() == expected
    for other in (stranger, worker):                                      # another producer; a worker
        with pytest.raises(psycopg.errors.NoDataFound) as info:
            other.execute(read, (job_id,))
        assert str(info.value).startswith(f"pgq: no job with id {job_id}")
    with pytest.raises(psycopg.errors.NoDataFound):
        producer.execute(read, (424242,))


def test_steps_go_with_the_job_when_it_is_pruned(conn):
    job_id, attempt = running(conn)
    kept_id, kept_attempt = running(conn, queue="other")
    for n in range(3):
        record_step(conn, job_id, attempt, f"s{n}")
    record_step(conn, kept_id, kept_attempt, "s0")
    conn.execute("SELECT pgq.complete(%s, %s)", (job_id, attempt))
    assert one(conn, "SELECT pgq.prune(interval '0')") == 1
    assert steps(conn, job_id) == {}
    assert steps(conn, kept_id) == {"s0": {"ok": True}}


def test_a_step_recorded_in_the_callers_transaction_commits_with_its_writes_or_not_at_all(conn, connect):
    conn.execute("CREATE TABLE public.charges (job_id bigint, amount integer)")
    job_id, attempt = running(conn)
    worker = connect(autocommit=False)
    for outcome in ("rollback", "commit"):
        worker.execute("INSERT INTO public.charges VALUES (%s, 42)", (job_id,))
        assert record_step(worker, job_id, attempt, "charge", '{"charged": 42}') is True
        if outcome == "rollback":
            worker.rollback()
            assert steps(conn, job_id) == {}
            assert one(conn, "SELECT count(*) FROM public.charges") == 0
        else:
            worker.commit()
    assert steps(conn, job_id) == {"charge": {"charged": 42}}
    assert one(conn, "SELECT count(*) FROM public.charges") == 1


# The durable sleep ------------------------------------------------------------------------------------

def test_a_durable_sleep_ends_the_attempt_without_using_one_and_the_job_wakes_at_its_recorded_time(conn):
    set_clock(conn, NOW)
    job_id, attempt = running(conn)
    before = job(conn, job_id)
    row = conn.execute("SELECT status, wake_at FROM pgq.sleep(%s, %s, 'nap', '1 hour')", (job_id, attempt)).fetchone()
    assert row[0] == "sleeping" and row[1].isoformat() == "2030-01-01T13:00:00+00:00"
    after = job(conn, job_id)
    assert after["state"] == "pending" and after["lease_until"] is None
    assert after["run_at"] == row[1] and after["max_attempts"] == before["max_attempts"] + 1
    assert steps(conn, job_id) == {"nap": {"until": "2030-01-01T13:00:00+00:00"}}
    # The repeat of the call (an ambiguous commit) answers the same; nothing else may call it.
    assert conn.execute("SELECT status, wake_at FROM pgq.sleep(%s, %s, 'nap', '1 hour')",
                        (job_id, attempt)).fetchone() == row
    assert claim(conn, queues=["q"]) == []                                # not before its time
    # Claimed early anyway (an operator made it due): it sleeps on until the first call's time.
    set_clock(conn, "2030-01-01 12:30:00+00")
    conn.execute("UPDATE pgq.jobs SET run_at = '2030-01-01 12:30:00+00' WHERE id = %s", (job_id,))
    early = reclaim(conn, job_id)
    assert conn.execute("SELECT status, wake_at FROM pgq.sleep(%s, %s, 'nap', '1 hour')",
                        (job_id, early)).fetchone() == row
    set_clock(conn, "2030-01-01 13:00:00+00")
    woke = reclaim(conn, job_id)
    assert conn.execute("SELECT status, wake_at FROM pgq.sleep(%s, %s, 'nap', '1 hour')",
                        (job_id, woke)).fetchone() == ("awake", row[1])
    assert state(conn, job_id) == "running"
    assert job(conn, job_id)["attempt"] - job(conn, job_id)["attempt_offset"] == 3
    assert job(conn, job_id)["max_attempts"] == before["max_attempts"] + 2


def test_a_sleep_refuses_a_name_another_kind_of_step_holds_and_a_stale_attempt_gets_no_row(conn):
    job_id, attempt = running(conn)
    record_step(conn, job_id, attempt, "charge")
    with pytest.raises(psycopg.errors.InvalidParameterValue) as info:
        conn.execute("SELECT * FROM pgq.sleep(%s, %s, 'charge', '1 hour')", (job_id, attempt))
    assert 'argument "name"' in str(info.value) and "no sleep" in str(info.value)
    assert conn.execute("SELECT * FROM pgq.sleep(%s, %s, 'nap', '1 hour')", (job_id, attempt + 1)).fetchall() == []
    assert state(conn, job_id) == "running"


# Bad input ---------------------------------------------------------------------------------------------

BAD: list[tuple[str, str, str, str]] = [
    ("get_step id NULL", "SELECT * FROM pgq.get_step(NULL, 1, 'a')", "22004", "id"),
    ("get_step attempt NULL", "SELECT * FROM pgq.get_step($JOB, NULL, 'a')", "22004", "attempt"),
    ("get_step name NULL", "SELECT * FROM pgq.get_step($JOB, 1, NULL)", "22004", "name"),
    ("get_step name empty", "SELECT * FROM pgq.get_step($JOB, 1, '')", "22023", "name"),
    ("get_step name too long", "SELECT * FROM pgq.get_step($JOB, 1, repeat('n', 264))", "22023", "name"),
    ("get_steps attempt NULL", "SELECT * FROM pgq.get_steps($JOB, NULL)", "22004", "attempt"),
    ("get_steps limit_rows 0", "SELECT * FROM pgq.get_steps($JOB, 1, limit_rows => 0)", "22023", "limit_rows"),
    ("get_steps limit_rows NULL", "SELECT * FROM pgq.get_steps($JOB, 1, limit_rows => NULL)", "22023", "limit_rows"),
    ("record_step id NULL", "SELECT pgq.record_step(NULL, 1, 'a', '{}')", "22004", "id"),
    ("record_step attempt NULL", "SELECT pgq.record_step($JOB, NULL, 'a', '{}')", "22004", "attempt"),
    ("record_step name NULL", "SELECT pgq.record_step($JOB, 1, NULL, '{}')", "22004", "name"),
    ("record_step name empty", "SELECT pgq.record_step($JOB, 1, '', '{}')", "22023", "name"),
    ("record_step name too long", "SELECT pgq.record_step($JOB, 1, repeat('n', 257), '{}')", "22023", "name"),
    ("record_step name signal:", "SELECT pgq.record_step($JOB, 1, 'signal:go', '{}')", "22023", "name"),
    ("record_step result NULL", "SELECT pgq.record_step($JOB, 1, 'a', NULL)", "22004", "result"),
    ("record_step result over 1 MiB",
     "SELECT pgq.record_step($JOB, 1, 'a', jsonb_build_object('x', repeat('a', 1048576)))", "22023", "result"),
    ("job_steps id NULL", "SELECT * FROM pgq.job_steps(NULL)", "22004", "id"),
    ("job_steps limit_rows 10001", "SELECT * FROM pgq.job_steps($JOB, 10001)", "22023", "limit_rows"),
    ("sleep name NULL", "SELECT * FROM pgq.sleep($JOB, 1, NULL, '1 hour')", "22004", "name"),
    ("sleep name signal:", "SELECT * FROM pgq.sleep($JOB, 1, 'signal:x', '1 hour')", "22023", "name"),
    ("sleep delay NULL", "SELECT * FROM pgq.sleep($JOB, 1, 'nap', NULL)", "22004", "delay"),
    ("sleep delay zero", "SELECT * FROM pgq.sleep($JOB, 1, 'nap', '0')", "22023", "delay"),
    ("sleep delay negative", "SELECT * FROM pgq.sleep($JOB, 1, 'nap', '-1 hour')", "22023", "delay"),
    ("sleep delay over a year", "SELECT * FROM pgq.sleep($JOB, 1, 'nap', '366 days')", "22023", "delay"),
    ("sleep delay in months", "SELECT * FROM pgq.sleep($JOB, 1, 'nap', '1 mon')", "22023", "delay"),
]


def everything(conn: psycopg.Connection) -> tuple[Any, ...]:
    return tuple(conn.execute(f"SELECT * FROM pgq.{t} ORDER BY 1, 2").fetchall()
                 for t in ("jobs", "job_events", "steps"))


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
