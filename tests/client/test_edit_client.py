"""Issue 41 from Python: Client.update_job and AsyncClient.update_job against a real database: what
an edit changes and keeps, its False for a job that has started, and its errors."""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest

from pgq_thin.errors import BadArgument, InvalidArgument, JobNotFound

from clientkit import clients
from sqlhelpers import job, one


def test_update_job_changes_a_queued_job_and_answers_false_once_it_runs(
        dsn: str, conn: psycopg.Connection, client_kind: str) -> None:
    with clients(client_kind, dsn) as client:
        job_id = client.enqueue("q", "k", {"v": 1}, priority=2, meta={"m": 1}, trace_context=False)
        later = one(conn, "SELECT now()") + timedelta(hours=1)
        assert client.update_job(job_id, payload={"v": 2}, run_at=later) is True
        row = job(conn, job_id)
        assert (row["payload"], row["priority"], row["run_at"], row["meta"]) == ({"v": 2}, 2, later, {"m": 1})
        assert client.update_job(job_id, priority=5, meta={"m": 2}, run_at=later - timedelta(hours=2)) is True
        [claimed] = client.claim("w", ["q"])
        assert (claimed.id, claimed.payload, claimed.meta) == (job_id, {"v": 2}, {"m": 2})
        assert client.update_job(job_id, payload={"v": 3}) is False
        assert job(conn, job_id)["payload"] == {"v": 2}


def test_update_job_errors_name_what_is_wrong(dsn: str, conn: psycopg.Connection, client_kind: str) -> None:
    with clients(client_kind, dsn) as client:
        job_id = client.enqueue("q", "k", {"v": 1})
        before = job(conn, job_id)
        with pytest.raises(JobNotFound):
            client.update_job(424242, priority=1)
        with pytest.raises(InvalidArgument, match='"priority"'):
            client.update_job(job_id, priority=5000)
        with pytest.raises(InvalidArgument, match='"payload"'):
            client.update_job(job_id)  # nothing to change
        with pytest.raises(BadArgument, match='"payload"'):
            client.update_job(job_id, payload={"a": float("nan")})
        assert job(conn, job_id) == before


def test_delete_jobs_deletes_by_filter_and_cancels_an_unfinished_job_first(
        dsn: str, conn: psycopg.Connection, client_kind: str) -> None:
    with clients(client_kind, dsn) as client:
        first = client.enqueue("q", "a")
        dependant = client.enqueue("q", "b", depends_on=[first])
        kept = client.enqueue("q", "b")
        assert client.delete_jobs("q", "pending", kind="a", limit_rows=10) == 1
        assert job(conn, dependant)["state"] == "cancelled"
        assert client.delete_jobs("q", "cancelled", before=one(conn, "SELECT clock_timestamp()")) == 1
        assert one(conn, "SELECT array_agg(id ORDER BY id) FROM pgq.jobs") == [kept]
        with pytest.raises(InvalidArgument, match='"state"'):
            client.delete_jobs("q", "running")
        with pytest.raises(BadArgument, match='"before"'):
            client.delete_jobs("q", "done", before="yesterday")  # type: ignore[arg-type]
