"""pgq.jobs.meta, the producer's metadata: enqueue's and enqueue_many's last argument, checked as a
payload is (22023 naming meta, nothing written), kept across retries, returned by pgq.claim,
get_job and list_jobs."""

from __future__ import annotations

import psycopg
import pytest
from psycopg.types.json import Jsonb

from sqlhelpers import claim, job, one, wait_for

META = {"otel": {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}, "who": "test"}


def test_enqueue_stores_meta_and_claim_returns_it(conn):
    with_meta = one(conn, "SELECT pgq.enqueue('q', 'k', meta => %s)", (Jsonb(META),))
    without = one(conn, "SELECT pgq.enqueue('q', 'k', '{\"n\": 1}')")
    assert job(conn, with_meta)["meta"] == META
    assert job(conn, without)["meta"] is None
    claimed = {c["id"]: c for c in claim(conn, batch=2)}
    assert claimed[with_meta]["meta"] == META
    assert claimed[without]["meta"] is None


def test_enqueue_with_a_unique_key_stores_meta(conn):
    first = one(conn, "SELECT pgq.enqueue('q', 'k', unique_key => 'u', meta => %s)", (Jsonb(META),))
    # The live job's id comes back; its meta is the first enqueue's.
    assert one(conn, "SELECT pgq.enqueue('q', 'k', unique_key => 'u', meta => '{\"other\": 1}')") == first
    assert job(conn, first)["meta"] == META


def test_enqueue_many_gives_every_job_the_same_meta(conn):
    ids = [r[0] for r in conn.execute(
        "SELECT * FROM pgq.enqueue_many('q', 'k', ARRAY['{}', '{}']::jsonb[], meta => %s)", (Jsonb(META),))]
    assert [job(conn, i)["meta"] for i in ids] == [META, META]
    plain = one(conn, "SELECT * FROM pgq.enqueue_many('q', 'k', ARRAY['{}']::jsonb[])")
    assert job(conn, plain)["meta"] is None


def test_meta_is_kept_across_a_retry_and_an_operators_retry(conn):
    conn.execute("SELECT pgq.configure_queue('q', backoff_base => '1 millisecond', backoff_cap => '1 millisecond')")
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k', max_attempts => 3, meta => %s)", (Jsonb(META),))
    first = claim(conn, queues=["q"])
    conn.execute("SELECT pgq.fail(%s, %s, 'try again')", (job_id, first[0]["attempt"]))  # backoff: 1 ms
    second = wait_for(lambda: claim(conn, queues=["q"]), "the retry to be due")
    assert [c["attempt"] for c in second] == [2] and second[0]["meta"] == META
    conn.execute("SELECT pgq.fail(%s, 2, 'for good', retryable => false)", (job_id,))
    assert job(conn, job_id)["state"] == "failed"
    conn.execute("SELECT pgq.retry(%s)", (job_id,))
    third = claim(conn, queues=["q"])
    assert third[0]["id"] == job_id and third[0]["meta"] == META


def test_get_job_and_list_jobs_return_meta(conn):
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k', meta => %s)", (Jsonb(META),))
    assert one(conn, "SELECT (pgq.get_job(%s)).meta", (job_id,)) == META
    assert one(conn, "SELECT meta FROM pgq.list_jobs(queue => 'q')") == META


BAD_META = [
    ("'[1, 2]'", "must be a JSON object, got array"),
    ("'\"text\"'", "must be a JSON object, got string"),
    ("'null'", "must be a JSON object, got null"),
    ("jsonb_build_object('x', repeat('x', 1048577))", "the limit is 1048576"),
]


@pytest.mark.parametrize(("value", "message"), BAD_META)
@pytest.mark.parametrize("call", [
    "SELECT pgq.enqueue('q', 'k', meta => {})",
    "SELECT pgq.enqueue('q', 'k', unique_key => 'u', meta => {})",
    "SELECT * FROM pgq.enqueue_many('q', 'k', ARRAY['{{}}']::jsonb[], meta => {})",
])
def test_bad_meta_is_refused_with_22023_naming_meta_and_writes_nothing(conn, call, value, message):
    before = one(conn, "SELECT count(*) FROM pgq.jobs")
    with pytest.raises(psycopg.Error) as caught:
        conn.execute(call.format(value))
    assert caught.value.sqlstate == "22023"
    assert 'argument "meta"' in str(caught.value) and message in str(caught.value)
    assert one(conn, "SELECT count(*) FROM pgq.jobs") == before


def test_a_compressed_meta_is_measured_by_its_real_size(conn):
    # A value read from a column is compressed: 2 MB of one letter is stored in a few kB.
    conn.execute("CREATE TEMP TABLE big AS SELECT jsonb_build_object('x', repeat('x', 2000000)) AS v")
    with pytest.raises(psycopg.Error) as caught:
        conn.execute("SELECT pgq.enqueue('q', 'k', meta => (SELECT v FROM big))")
    assert caught.value.sqlstate == "22023" and 'argument "meta"' in str(caught.value)
