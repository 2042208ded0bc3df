"""The producer's trace context in the job: Client.enqueue under a current span stores the W3C
context in meta["otel"], and the worker's span of every attempt links to the producer's span
(a Link, not a parent). Real Worker and AsyncWorker, the SDK's in-memory exporter."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from pgq_thin import AsyncClient, BadArgument, Client, Job
from pgq_thin.errors import InvalidArgument
from pgq_thin.worker import AsyncWorker, JobContext, Worker

from sqlhelpers import one, wait_for
from workerkit import RUNTIMES, run_in_thread, stop


@pytest.fixture
def provider() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    """An SDK tracer provider with the in-memory exporter (not the global one)."""
    exporter = InMemorySpanExporter()
    made = TracerProvider()
    made.add_span_processor(SimpleSpanProcessor(exporter))
    yield made, exporter
    made.shutdown()


def meta_of(conn, job_id: int):
    return one(conn, "SELECT meta FROM pgq.jobs WHERE id = %s", (job_id,))


def test_every_attempts_span_links_to_the_producers_span(conn, dsn, runtime, provider):
    tracer_provider, spans = provider
    producer = tracer_provider.get_tracer("producer")
    with Client(dsn) as client, producer.start_as_current_span("checkout", kind=trace.SpanKind.PRODUCER) as span:
        job_id = client.enqueue("default", "flaky", {"n": 1}, max_attempts=2)
        [many_id] = client.enqueue_many("default", "plain", [{}])
    produced = span.get_span_context()
    carrier = meta_of(conn, job_id)["otel"]
    flags = int(produced.trace_flags)
    assert carrier["traceparent"] == f"00-{produced.trace_id:032x}-{produced.span_id:016x}-{flags:02x}"
    assert meta_of(conn, many_id)["otel"] == carrier
    plain_id = one(conn, "SELECT pgq.enqueue('default', 'plain')")  # no trace context: no link

    worker: Worker | AsyncWorker = RUNTIMES[runtime](["default"], concurrency=2, poll_interval=0.1,
                                                     sweep_interval=1.0, tracer_provider=tracer_provider)

    @worker.handler("flaky")
    def flaky(job: Job, ctx: JobContext) -> None:
        assert job.meta is not None and job.meta["otel"] == carrier
        raise RuntimeError("try again")

    @worker.handler("plain")
    def plain(job: Job, ctx: JobContext) -> None:
        return None

    conn.execute("SELECT pgq.configure_queue('default', backoff_base => '1 millisecond',"
                 " backoff_cap => '1 millisecond')")
    thread, failure = run_in_thread(worker, dsn)
    try:
        wait_for(lambda: one(conn, "SELECT count(*) FROM pgq.jobs WHERE state IN ('done', 'failed')") == 3,
                 "the jobs finished")
        wait_for(lambda: len([s for s in spans.get_finished_spans() if s.name == "process default"]) == 4,
                 "four attempt spans")
    finally:
        stop(worker, thread, failure)
    attempts = {(s.attributes["pgq.job.id"], s.attributes["pgq.job.attempt"]): s
                for s in spans.get_finished_spans() if s.name == "process default"}
    assert set(attempts) == {(job_id, 1), (job_id, 2), (many_id, 1), (plain_id, 1)}
    for key in [(job_id, 1), (job_id, 2), (many_id, 1)]:
        consumer = attempts[key]
        assert consumer.attributes["pgq.job.linked"] is True
        assert [(link.context.trace_id, link.context.span_id) for link in consumer.links] == [
            (produced.trace_id, produced.span_id)]
        assert consumer.parent is None  # a link, not a parent: its own trace
        assert consumer.context.trace_id != produced.trace_id
    unlinked = attempts[(plain_id, 1)]
    assert unlinked.attributes["pgq.job.linked"] is False and not unlinked.links


def test_without_a_current_span_no_otel_key_is_written(conn, dsn):
    with Client(dsn) as client:
        bare = client.enqueue("q", "k")
        given = client.enqueue("q", "k", meta={"source": "api"})
        [many] = client.enqueue_many("q", "k", [{}])
    assert meta_of(conn, bare) is None
    assert meta_of(conn, given) == {"source": "api"}
    assert meta_of(conn, many) is None


def test_a_callers_otel_key_is_kept_and_trace_context_false_writes_none(conn, dsn, provider):
    tracer_provider, _ = provider
    with Client(dsn) as client, tracer_provider.get_tracer("t").start_as_current_span("producer"):
        own = client.enqueue("q", "k", meta={"otel": {"mine": "yes"}})
        off = client.enqueue("q", "k", trace_context=False)
        off_given = client.enqueue("q", "k", meta={"a": 1}, trace_context=False)
        [off_many] = client.enqueue_many("q", "k", [{}], trace_context=False)
        with_meta = client.enqueue("q", "k", meta={"a": 1})
    assert meta_of(conn, own) == {"otel": {"mine": "yes"}}
    assert meta_of(conn, off) is None and meta_of(conn, off_many) is None
    assert meta_of(conn, off_given) == {"a": 1}
    assert set(meta_of(conn, with_meta)) == {"a", "otel"}


def test_the_async_client_injects_the_context_too(conn, dsn, provider):
    tracer_provider, _ = provider

    async def main() -> int:
        async with AsyncClient(dsn) as client:
            with tracer_provider.get_tracer("t").start_as_current_span("producer"):
                return await client.enqueue("q", "k")

    job_id = asyncio.run(main())
    assert meta_of(conn, job_id)["otel"]["traceparent"].startswith("00-")


def test_bad_meta_and_trace_context_are_refused_before_any_sql(conn, dsn):
    with Client(dsn) as client:
        with pytest.raises(BadArgument, match='argument "trace_context" must be a bool'):
            client.enqueue("q", "k", trace_context="no")  # type: ignore[arg-type]
        with pytest.raises(BadArgument, match='argument "meta" cannot be sent as JSON'):
            client.enqueue("q", "k", meta={"x": float("nan")})
        with pytest.raises(InvalidArgument, match='argument "meta" must be a JSON object, got array') as caught:
            client.enqueue("q", "k", meta=[1, 2])  # type: ignore[arg-type]
    assert caught.value.sqlstate == "22023"  # the server's answer, naming meta
    assert one(conn, "SELECT count(*) FROM pgq.jobs") == 0


def test_without_opentelemetry_enqueue_stores_meta_as_given_and_a_worker_drains(conn, dsn):
    stored = one(conn, "SELECT pgq.enqueue('default', 'ok', meta => %s::jsonb)",
                 ('{"otel": {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}',))
    script = textwrap.dedent(f"""
        import sys, threading
        sys.modules["opentelemetry"] = None
        import psycopg
        from pgq_thin import Client
        from pgq_thin.worker import Worker
        with Client({dsn!r}) as client:
            print(client.enqueue("default", "ok"), client.enqueue("default", "ok", meta={{"a": 1}}))
        seen = []
        worker = Worker(["default"], concurrency=2, poll_interval=0.1)
        worker.handler("ok")(lambda job, ctx: seen.append(job.meta))
        def stop_when_drained():
            with psycopg.connect({dsn!r}, autocommit=True) as c:
                while c.execute("SELECT count(*) FROM pgq.jobs WHERE state <> 'done'").fetchone()[0]:
                    threading.Event().wait(0.05)
            worker.stop()
        threading.Thread(target=stop_when_drained, daemon=True).start()
        worker.run({dsn!r}, install_signal_handlers=False)
        print(len(seen), "opentelemetry" in str(sys.modules.get("opentelemetry")))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    first, counted = out.stdout.splitlines()
    bare, given = (int(n) for n in first.split())
    assert counted == "3 False"
    assert meta_of(conn, bare) is None and meta_of(conn, given) == {"a": 1}
    assert meta_of(conn, stored)["otel"]["traceparent"].startswith("00-0af76519")
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'done'") == 3
