"""Issue 41 from Python: tags and unique_for through Client and AsyncClient against a real
database: enqueue's and enqueue_many's tags in get_job and list_jobs (JobRecord.tags), the tags
filters of list_jobs, retry_jobs, cancel_jobs and delete_jobs, unique_for's answer, and the errors."""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest

from pgq_thin.errors import InvalidArgument

from clientkit import clients
from sqlhelpers import one


def test_tags_are_kept_shown_and_filtered_on(dsn: str, conn: psycopg.Connection, client_kind: str) -> None:
    with clients(client_kind, dsn) as client:
        vip = client.enqueue("q", "k", tags=["vip", "eu"])
        plain = client.enqueue("q", "k")
        many = client.enqueue_many("q", "k", [{}, {}], tags=("vip",))
        assert client.get_job(vip).tags == ["eu", "vip"] and client.get_job(plain).tags is None
        assert [j.id for j in client.list_jobs(tags=["vip"])] == sorted([vip, *many], reverse=True)
        assert [(j.id, j.tags) for j in client.list_jobs("q", tags=["eu", "vip"])] == [(vip, ["eu", "vip"])]
        assert client.cancel_jobs("q", "pending", tags=["vip"]) == 3
        assert client.retry_jobs("q", "cancelled", tags=["eu"]) == 1
        assert client.delete_jobs("q", "cancelled", tags=["vip"]) == 2
        assert one(conn, "SELECT array_agg(id ORDER BY id) FROM pgq.jobs") == [vip, plain]
        with pytest.raises(InvalidArgument, match='"tags"'):
            client.enqueue("q", "k", tags=["x" * 65])
        with pytest.raises(InvalidArgument, match='"tags"'):
            client.list_jobs(tags=[])
        assert one(conn, "SELECT count(*) FROM pgq.jobs") == 2


def test_unique_for_answers_a_done_job_of_the_key(dsn: str, conn: psycopg.Connection, client_kind: str) -> None:
    with clients(client_kind, dsn) as client:
        first = client.enqueue("q", "k", unique_key="u")
        [claimed] = client.claim("w", ["q"])
        assert client.complete(claimed.id, claimed.attempt) is True
        assert client.enqueue("q", "k", unique_key="u", unique_for=timedelta(hours=1)) == first
        assert client.enqueue_many("q", "k", [{}], unique_keys=["u"], unique_for="1h") == [first]
        assert client.enqueue("q", "k", unique_key="u") != first
        with pytest.raises(InvalidArgument, match='"unique_for"'):
            client.enqueue("q", "k", unique_for=60)
