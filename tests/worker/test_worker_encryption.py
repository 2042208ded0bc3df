"""Issue 41, encrypted payloads, on both worker runtimes: Worker(keys=..., encrypt_with=...) hands
the handler the plaintext of an envelope, stores its result as an envelope under encrypt_with
(rotation: the payload under another key of the ring), fails for good, naming the key id, a job
whose key is not in the ring (erasure) or whose envelope was altered, and passes a plain payload
through. Against a real PostgreSQL."""

from __future__ import annotations

import base64
import os
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from pgq_thin import BadKey, Client, Job, JobContext
from pgq_thin.encryption import KeyRing, is_envelope

from sqlhelpers import job, wait_for
from workerkit import RUNTIMES, _current, enqueue, finished, running

K1, K2 = os.urandom(32), os.urandom(32)
SECRET = {"card": "4111 1111 1111 1111", "name": "Zoë"}


@pytest.fixture(autouse=True)
def current_runtime(runtime: str) -> Iterator[str]:
    _current[0] = runtime
    yield runtime
    _current[0] = "threads"


def keyed_worker(runtime: str, keys: dict[str, bytes], encrypt_with: str) -> Any:
    return RUNTIMES[runtime](["default"], concurrency=2, poll_interval=0.1, sweep_interval=1.0,
                             shutdown_timeout=10.0, keys=keys, encrypt_with=encrypt_with)


def test_the_handler_gets_the_plaintext_and_its_result_is_stored_encrypted_under_encrypt_with(
        dsn: str, conn: psycopg.Connection, runtime: str) -> None:
    with Client(dsn, keys={"k1": K1}, encrypt_with="k1") as producer:
        old = producer.enqueue("default", "charge", SECRET)  # under k1: rotation
    with Client(dsn, keys={"k2": K2, "k1": K1}, encrypt_with="k2") as client:
        new = client.enqueue("default", "charge", {"n": 2})
        seen: dict[int, Any] = {}
        worker = keyed_worker(runtime, {"k2": K2, "k1": K1}, "k2")

        @worker.handler("charge")
        def charge(job: Job, ctx: JobContext) -> dict[str, Any]:
            seen[job.id] = (job.payload, ctx.job.payload)
            return {"charged": job.payload.get("card", "none")[-4:]}

        with running(worker, dsn):
            wait_for(lambda: all(finished(conn, j)() for j in (old, new)), "both jobs ended")
        assert seen == {old: (SECRET, SECRET), new: ({"n": 2}, {"n": 2})}
        rows = {j: job(conn, j) for j in (old, new)}
        assert [r["state"] for r in rows.values()] == ["done", "done"]
        assert rows[old]["payload"]["kid"] == "k1" and rows[new]["payload"]["kid"] == "k2"
        for row in rows.values():
            assert is_envelope(row["result"]) and row["result"]["kid"] == "k2"
            assert "charged" not in str(row["result"])
        assert KeyRing({"k2": K2}, "k2").decrypt(rows[old]["result"]) == {"charged": "1111"}
        assert client.job_result(old).result == {"charged": "1111"}
        assert client.wait(new, timeout=5).result == {"charged": "none"}


def test_a_job_whose_key_is_not_in_the_ring_fails_for_good_naming_the_key(
        dsn: str, conn: psycopg.Connection, runtime: str) -> None:
    with Client(dsn, keys={"k1": K1}, encrypt_with="k1") as producer:
        erased = producer.enqueue("default", "charge", SECRET, max_attempts=5)
        altered = producer.enqueue("default", "charge", SECRET, max_attempts=5)
    ct = bytearray(base64.b64decode(job(conn, altered)["payload"]["ct"]))
    ct[-1] ^= 1  # the tag
    conn.execute("UPDATE pgq.jobs SET payload = jsonb_set(payload, '{ct}', to_jsonb(%s::text)) WHERE id = %s",
                 (base64.b64encode(bytes(ct)).decode(), altered))
    called = threading.Event()
    # The first job with k1 gone from the ring (erasure); the second with k1 there but altered.
    for job_id, keys in ((erased, {"k2": K2}), (altered, {"k2": K2, "k1": K1})):
        worker = keyed_worker(runtime, keys, "k2")

        @worker.handler("charge")
        def charge(job: Job, ctx: JobContext) -> None:
            called.set()

        conn.execute("UPDATE pgq.jobs SET run_at = CASE WHEN id = %s THEN now() ELSE now() + interval '1 hour' END "
                     "WHERE state = 'pending'", (job_id,))
        with running(worker, dsn):
            wait_for(finished(conn, job_id), f"job {job_id} ended")
    assert not called.is_set()
    erased_row, altered_row = job(conn, erased), job(conn, altered)
    assert (erased_row["state"], erased_row["attempt"]) == ("failed", 1)  # not retried: a retry cannot help
    assert "encrypted with key 'k1', which is not in this worker's key ring (it has: 'k2')" in erased_row["last_error"]
    assert (altered_row["state"], altered_row["attempt"]) == ("failed", 1)
    assert "cannot be decrypted" in altered_row["last_error"] and "does not authenticate" in altered_row["last_error"]
    for row in (erased_row, altered_row):
        assert K1.hex() not in row["last_error"] and "Traceback" not in row["last_error"]
        assert row["payload"]["kid"] == "k1"  # nothing rewritten


def test_a_plain_payload_reaches_a_keyed_workers_handler_as_it_is(
        dsn: str, conn: psycopg.Connection, runtime: str) -> None:
    plain = enqueue(conn, "echo", '{"v": 1}')
    worker = keyed_worker(runtime, {"k1": K1}, "k1")

    @worker.handler("echo")
    def echo(job: Job, ctx: JobContext) -> dict[str, Any]:
        return {"got": job.payload}

    with running(worker, dsn):
        wait_for(finished(conn, plain), "the plain job ended")
    row = job(conn, plain)
    assert row["state"] == "done" and row["payload"] == {"v": 1}
    assert KeyRing({"k1": K1}, "k1").decrypt(row["result"]) == {"got": {"v": 1}}


def test_a_handler_transactions_result_is_stored_encrypted(dsn: str, conn: psycopg.Connection, runtime: str) -> None:
    with Client(dsn, keys={"k1": K1}, encrypt_with="k1") as client:
        job_id = client.enqueue("default", "tx", {"v": 1})
        worker = keyed_worker(runtime, {"k1": K1}, "k1")
        if runtime == "threads":
            @worker.handler("tx")
            def tx(job: Job, ctx: JobContext) -> None:
                with ctx.transaction(result={"in_tx": job.payload["v"]}) as tx_conn:
                    tx_conn.execute("SELECT 1")
        else:
            @worker.handler("tx")
            async def atx(job: Job, ctx: JobContext) -> None:
                async with ctx.transaction(result={"in_tx": job.payload["v"]}) as tx_conn:
                    await tx_conn.execute("SELECT 1")

        with running(worker, dsn):
            wait_for(finished(conn, job_id), "the job ended")
        assert job(conn, job_id)["state"] == "done" and job(conn, job_id)["result"]["kid"] == "k1"
        assert client.job_result(job_id).result == {"in_tx": 1}


def test_a_dependants_handler_reads_its_dependencies_results_decrypted(
        dsn: str, conn: psycopg.Connection, runtime: str) -> None:
    with Client(dsn, keys={"k1": K1}, encrypt_with="k1") as client:
        first = client.enqueue("default", "make", {"v": 7})
        then = client.enqueue("default", "use", {}, depends_on=[first])
    worker = keyed_worker(runtime, {"k1": K1}, "k1")
    seen: list[Any] = []

    @worker.handler("make")
    def make(job: Job, ctx: JobContext) -> dict[str, Any]:
        return {"made": job.payload["v"]}

    if runtime == "threads":
        @worker.handler("use")
        def use(job: Job, ctx: JobContext) -> None:
            seen.extend(d.result for d in ctx.dependency_results())
    else:
        @worker.handler("use")
        async def ause(job: Job, ctx: JobContext) -> None:
            seen.extend([d.result async for d in ctx.dependency_results()])

    with running(worker, dsn):
        wait_for(lambda: job(conn, then)["state"] in ("done", "failed", "cancelled"), "the dependant ended")
    assert job(conn, first)["result"]["kid"] == "k1" and job(conn, then)["state"] == "done"
    assert seen == [{"made": 7}]


def test_a_child_a_durable_handler_spawns_is_enqueued_encrypted(
        dsn: str, conn: psycopg.Connection, runtime: str) -> None:
    with Client(dsn, keys={"k1": K1}, encrypt_with="k1") as client:
        parent = client.enqueue("default", "parent", {"v": 3})
    worker = keyed_worker(runtime, {"k1": K1}, "k1")
    children: list[int] = []
    seen: list[Any] = []

    if runtime == "threads":
        @worker.handler("parent")
        def spawn(job: Job, ctx: JobContext) -> None:
            children.append(ctx.spawn("child", "default", "child", {"from": job.payload["v"]}))
    else:
        @worker.handler("parent")
        async def aspawn(job: Job, ctx: JobContext) -> None:
            children.append(await ctx.spawn("child", "default", "child", {"from": job.payload["v"]}))

    @worker.handler("child")
    def child(job: Job, ctx: JobContext) -> None:
        seen.append(job.payload)

    with running(worker, dsn):
        wait_for(lambda: seen, "the child ran")
        wait_for(finished(conn, parent), "the parent ended")
    assert seen == [{"from": 3}]
    assert job(conn, children[0])["payload"]["kid"] == "k1"


@pytest.mark.parametrize(("keys", "encrypt_with", "named"), [
    ({"k1": b"x" * 16}, "k1", "keys['k1']"),
    ({"k1": K1}, "k9", '"encrypt_with"'),
    ({"k1": K1}, None, '"encrypt_with"'),
])
def test_a_worker_refuses_bad_keys_naming_the_argument(runtime: str, keys: Any, encrypt_with: Any,
                                                       named: str) -> None:
    with pytest.raises(BadKey) as raised:
        keyed_worker(runtime, keys, encrypt_with)
    assert named in str(raised.value) and isinstance(raised.value, ValueError)
