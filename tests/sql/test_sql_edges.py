"""Edges found while documenting the API: hints, unique keys across outcome_unknown and retry,
wake-ups for jobs that become due again, the result's size, reading a job, the lease clock."""

from __future__ import annotations

import json
from datetime import timedelta

import psycopg
import pytest

from sqlfixtures import dsn, module_dsn, running_job  # noqa: F401  (fixtures)
from sqlhelpers import claim, job, one


def test_an_error_without_a_hint_carries_no_hint(conn: psycopg.Connection) -> None:
    with pytest.raises(psycopg.Error) as no_hint:
        conn.execute("SELECT pgq.claim('w', batch => 0)")
    assert no_hint.value.sqlstate == "22023" and no_hint.value.diag.message_hint is None
    with pytest.raises(psycopg.Error) as with_hint:
        conn.execute("SELECT pgq.enqueue('q', 'k', '[]')")
    assert with_hint.value.diag.message_hint and "jsonb_build_object" in with_hint.value.diag.message_hint


def test_an_outcome_unknown_job_keeps_its_unique_key(conn: psycopg.Connection) -> None:
    job_id, attempt = running_job(conn, unique_key="charge-7")
    assert one(conn, "SELECT pgq.mark_unknown(%s, %s, 'timeout after the charge request')", (job_id, attempt))
    assert one(conn, "SELECT pgq.enqueue('q', 'k', unique_key => 'charge-7')") == job_id
    assert one(conn, "SELECT count(*) FROM pgq.jobs") == 1


def test_retry_of_a_job_whose_unique_key_was_taken_meanwhile_is_a_clear_55000(conn: psycopg.Connection) -> None:
    old, attempt = running_job(conn, unique_key="nightly")
    conn.execute("SELECT pgq.fail(%s, %s, 'broken', retryable => false)", (old, attempt))
    new = one(conn, "SELECT pgq.enqueue('q', 'k', unique_key => 'nightly')")
    assert new != old
    with pytest.raises(psycopg.Error) as err:
        conn.execute("SELECT pgq.retry(%s)", (old,))
    assert err.value.sqlstate == "55000"
    assert f"job {new} holds its unique_key" in err.value.diag.message_primary
    assert job(conn, old)["state"] == "failed"


@pytest.mark.parametrize("how", ["release", "retry", "resolve"])
def test_a_job_due_again_wakes_listening_workers(dsn: str, conn: psycopg.Connection, how: str) -> None:  # noqa: F811
    job_id, attempt = running_job(conn)
    if how == "retry":
        conn.execute("SELECT pgq.cancel(%s)", (job_id,))
    elif how == "resolve":
        conn.execute("SELECT pgq.mark_unknown(%s, %s, 'n')", (job_id, attempt))
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN pgq")
        {
            "release": lambda: conn.execute("SELECT pgq.release(%s, %s)", (job_id, attempt)),
            "retry": lambda: conn.execute("SELECT pgq.retry(%s)", (job_id,)),
            "resolve": lambda: conn.execute("SELECT pgq.resolve(%s, 'pending')", (job_id,)),
        }[how]()
        received = [n.payload for n in listener.notifies(timeout=60, stop_after=1)]
    assert received == ["q"]


def test_a_result_over_one_mib_is_refused_and_the_job_stays_running(conn: psycopg.Connection) -> None:
    job_id, attempt = running_job(conn)
    big = json.dumps({"blob": "x" * (1024 * 1024 + 10)})
    with pytest.raises(psycopg.Error) as err:
        conn.execute("SELECT pgq.complete(%s, %s, %s::jsonb)", (job_id, attempt, big))
    assert err.value.sqlstate == "22023" and 'argument "result"' in err.value.diag.message_primary
    assert job(conn, job_id)["state"] == "running"


def test_get_job_and_job_history_show_one_job(conn: psycopg.Connection) -> None:
    job_id, attempt = running_job(conn)
    conn.execute("SELECT pgq.complete(%s, %s)", (job_id, attempt))
    row = conn.execute("SELECT id, state::text, attempt FROM pgq.get_job(%s)", (job_id,)).fetchone()
    assert row == (job_id, "done", 1)
    history = conn.execute("SELECT event, attempt FROM pgq.job_history(%s)", (job_id,)).fetchall()
    assert history == [("claimed", 1), ("completed", 1)]
    with pytest.raises(psycopg.Error) as err:
        conn.execute("SELECT * FROM pgq.get_job(987654)")
    assert err.value.sqlstate == "P0002"


def test_a_claim_late_in_a_long_transaction_still_gets_its_whole_lease(dsn: str) -> None:  # noqa: F811
    # Compared with the statement's and the transaction's clocks, not with the wall clock after
    # the fact: with a 1-second lease, a loaded machine could spend the lease between the claim
    # and the checks (and the other session's claim would then rightly recover the job).
    with psycopg.connect(dsn) as tx:
        tx.execute("SELECT pgq.enqueue('q', 'k')")
        tx.execute("SELECT pg_sleep(1.2)")
        lease_until, statement_at, transaction_at = tx.execute(
            "SELECT c.lease_until, statement_timestamp(), now()"
            " FROM pgq.claim('w', lease => '1 minute') AS c").fetchone()
        tx.commit()
    assert statement_at - transaction_at >= timedelta(seconds=1.2)  # the transaction was long
    # The whole lease from the claim's statement, not from the transaction's start.
    assert lease_until == statement_at + timedelta(minutes=1)
    assert lease_until - transaction_at >= timedelta(minutes=1, seconds=1.2)
    with psycopg.connect(dsn, autocommit=True) as other:
        assert claim(other) == []


def test_job_history_of_null_is_a_clear_22004(conn: psycopg.Connection) -> None:
    with pytest.raises(psycopg.Error) as err:
        conn.execute("SELECT * FROM pgq.job_history(NULL)")
    assert err.value.sqlstate == "22004" and '"id"' in err.value.diag.message_primary
