"""The worker's Prometheus metrics (Worker(metrics_port=...)) and OpenTelemetry spans after real
drains, on both runtimes; a worker without them imports neither library."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from pgq_thin import Job
from pgq_thin.worker import AsyncWorker, JobContext, OutcomeUnknown, Snooze, Worker

from sqlhelpers import cancel, one, steal, wait_for
from workerkit import DEADLINE, RUNTIMES, run_in_thread, stop


def samples(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(body) for s in family.samples}


def jobs_total(scraped: dict[Any, float]) -> dict[tuple[str, str], float]:
    """{(kind, outcome): n} of pgq_worker_jobs_total for queue default."""
    out = {}
    for (name, labels), value in scraped.items():
        d = dict(labels)
        if name == "pgq_worker_jobs_total" and d["queue"] == "default":
            out[(d["kind"], d["outcome"])] = value
    return out


def make_worker(runtime: str, **settings: Any) -> Worker | AsyncWorker:
    worker = RUNTIMES[runtime](["default"], concurrency=3, poll_interval=0.1, sweep_interval=1.0, lease=1.5,
                               shutdown_timeout=10.0, **settings)

    @worker.handler("ok")
    def ok(job: Job, ctx: JobContext) -> None:
        return None

    @worker.handler("boom")
    def boom(job: Job, ctx: JobContext) -> None:
        raise RuntimeError("boom")

    @worker.handler("snooze")
    def snooze(job: Job, ctx: JobContext) -> None:
        raise Snooze(3600)

    @worker.handler("unknown")
    def unknown(job: Job, ctx: JobContext) -> None:
        raise OutcomeUnknown("the request timed out")

    @worker.handler("lost")
    def lost(job: Job, ctx: JobContext) -> None:
        assert ctx.lease_lost.wait(DEADLINE), "the lease was never lost"

    @worker.handler("cancel")
    def cancelled(job: Job, ctx: JobContext) -> None:
        assert ctx.lease_lost.wait(DEADLINE) and ctx.cancelled, "the job was never cancelled"

    if runtime == "asyncio":
        @worker.handler("park")
        async def apark(job: Job, ctx: JobContext) -> None:
            await ctx.sleep(3600)  # a durable sleep: the attempt ends, nothing is recorded for it
    else:
        @worker.handler("park")
        def park(job: Job, ctx: JobContext) -> None:
            ctx.sleep(3600)

    return worker


def enqueue_mix(conn: psycopg.Connection) -> tuple[int, int]:
    """6 ok, 2 boom (one attempt each: failed for good), 1 snooze, 1 unknown, 1 park (a durable
    sleep), 1 lost, 1 cancel; the ids of the lost and the cancel jobs."""
    conn.execute("SELECT pgq.enqueue_many('default', 'ok', array_fill('{}'::jsonb, ARRAY[6]))")
    conn.execute("SELECT pgq.enqueue_many('default', 'boom', array_fill('{}'::jsonb, ARRAY[2]), max_attempts => 1)")
    for kind in ("snooze", "unknown", "park"):
        conn.execute("SELECT pgq.enqueue('default', %s)", (kind,))
    return (int(one(conn, "SELECT pgq.enqueue('default', 'lost')")),
            int(one(conn, "SELECT pgq.enqueue('default', 'cancel')")))


def test_worker_metrics_after_a_real_drain(conn, dsn, runtime):
    lost_id, cancel_id = enqueue_mix(conn)
    worker = make_worker(runtime, metrics_port=0)
    thread, failure = run_in_thread(worker, dsn)
    try:
        for job_id in (lost_id, cancel_id):
            wait_for(lambda job_id=job_id: one(conn, "SELECT state = 'running' AND claimed_by = %s FROM pgq.jobs"
                                                     " WHERE id = %s", (worker.name, job_id)), f"job {job_id} to run")
        steal(conn, lost_id, "lost")  # its next renewal is refused: a lost lease
        assert cancel(conn, cancel_id)  # an expected end, not a lost lease
        wait_for(lambda: one(conn, "SELECT count(*) FROM pgq.jobs WHERE (state = 'running' AND claimed_by <> 'thief')"
                                   " OR (state = 'pending' AND run_at <= now())") == 0, "the drain")
        assert worker.metrics is not None and worker.metrics.port
        port = worker.metrics.port
        wait_for(lambda: sum(jobs_total(samples(port)).values()) == 13, "every run counted")
        scraped = samples(port)
    finally:
        stop(worker, thread, failure)
    assert jobs_total(scraped) == {("ok", "completed"): 6, ("boom", "failed"): 2, ("snooze", "snoozed"): 1,
                                   ("unknown", "outcome_unknown"): 1, ("park", "parked"): 1,
                                   ("lost", "lease_lost"): 1, ("cancel", "cancelled"): 1}
    assert scraped[("pgq_worker_leases_lost_total", ())] == 1
    assert scraped[("pgq_worker_busy_slots", ())] == 0
    assert scraped[("pgq_worker_slots", ())] == 3
    ok = (("kind", "ok"), ("queue", "default"))
    assert scraped[("pgq_worker_job_duration_seconds_count", ok)] == 6
    lost = (("kind", "lost"), ("queue", "default"))
    assert scraped[("pgq_worker_job_duration_seconds_sum", lost)] > 0.3  # it ran until a renewal was refused
    # Every job was claimed exactly once (the snoozed and the sleeping one are due in an hour): the
    # batch sizes add up.
    assert scraped[("pgq_worker_claim_batch_size_sum", ())] == 13
    assert scraped[("pgq_worker_claim_batch_size_count", ())] >= 2
    states = dict(conn.execute("SELECT kind, state::text FROM pgq.jobs").fetchall())
    assert states == {"ok": "done", "boom": "failed", "snooze": "pending", "unknown": "outcome_unknown",
                      "park": "pending", "lost": "running", "cancel": "cancelled"}  # (the thief holds the lost one)
    with pytest.raises(OSError):  # the metrics server stopped with the run
        samples(port)


@pytest.fixture
def provider() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    """An SDK tracer provider with the in-memory exporter, given to the worker (the global
    provider, which can be set once per process, stays untouched for the other tests)."""
    exporter = InMemorySpanExporter()
    made = TracerProvider()
    made.add_span_processor(SimpleSpanProcessor(exporter))
    yield made, exporter
    made.shutdown()


def test_one_span_per_job_attempt_with_its_attributes(conn, dsn, runtime, provider):
    tracer_provider, spans = provider
    conn.execute("SELECT pgq.enqueue('default', 'traced')")
    conn.execute("SELECT pgq.enqueue('default', 'flaky', max_attempts => 2)")
    worker = RUNTIMES[runtime](["default"], concurrency=2, poll_interval=0.1, sweep_interval=1.0,
                               tracer_provider=tracer_provider)
    inner = tracer_provider.get_tracer("test")

    @worker.handler("traced")
    def traced(job: Job, ctx: JobContext) -> dict[str, int]:
        with inner.start_as_current_span("inside the handler"):
            return {"n": 1}

    @worker.handler("flaky")
    def flaky(job: Job, ctx: JobContext) -> None:
        raise RuntimeError("try again")

    conn.execute("SELECT pgq.configure_queue('default', backoff_base => '1 millisecond',"
                 " backoff_cap => '1 millisecond')")
    thread, failure = run_in_thread(worker, dsn)
    try:
        wait_for(lambda: one(conn, "SELECT count(*) FROM pgq.jobs WHERE state IN ('done', 'failed')") == 2,
                 "both jobs finished")
        wait_for(lambda: len(spans.get_finished_spans()) == 4, "four spans")
    finally:
        stop(worker, thread, failure)
    finished = spans.get_finished_spans()
    attempts = sorted((s.attributes["pgq.job.kind"], s.attributes["pgq.job.attempt"], s.attributes["pgq.job.outcome"])
                      for s in finished if s.name == "process default")
    assert attempts == [("flaky", 1, "failed"), ("flaky", 2, "failed"), ("traced", 1, "completed")]
    traced_span = next(s for s in finished if s.attributes.get("pgq.job.kind") == "traced")
    child = next(s for s in finished if s.name == "inside the handler")
    assert child.parent is not None and child.parent.span_id == traced_span.context.span_id
    assert child.context.trace_id == traced_span.context.trace_id
    traced_id = one(conn, "SELECT id FROM pgq.jobs WHERE kind = 'traced'")
    assert traced_span.attributes["pgq.job.id"] == traced_id
    assert traced_span.attributes["pgq.job.queue"] == "default"
    assert traced_span.attributes["messaging.system"] == "pgq"
    assert traced_span.kind == trace.SpanKind.CONSUMER
    assert traced_span.status.status_code == trace.StatusCode.UNSET
    flaky_span = next(s for s in finished if s.attributes.get("pgq.job.kind") == "flaky")
    assert flaky_span.status.status_code == trace.StatusCode.ERROR


def test_without_a_tracer_provider_a_job_starts_no_span_and_one_set_later_is_used(monkeypatch):
    """opentelemetry-api installed, no provider configured: no span per job, and the global
    provider is looked at once per UNSET_RECHECK, not per job; once the application sets one,
    the jobs' spans start."""
    from datetime import datetime, timezone

    from pgq_thin.worker.tracing import Tracing

    now = datetime.now(timezone.utc)
    job = Job(id=1, queue="q", kind="k", payload={}, priority=0, attempt=1, max_attempts=3, run_at=now,
              created_at=now, lease_until=now, tenant=None)
    tracing = Tracing.create()  # the global provider
    assert tracing is not None
    looks = []
    unset = trace.get_tracer_provider()
    assert isinstance(unset, trace.ProxyTracerProvider)  # (no test sets the process-wide one)
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: looks.append(1) or unset)
    assert [tracing.start(job) for _ in range(100)] == [None] * 100
    assert len(looks) == 1
    configured = TracerProvider()  # as if the application set it now
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: configured)
    started = wait_for(lambda: tracing.start(job), "a span once a provider is set")
    tracing.end(started, "completed")
    assert Tracing.create(trace.NoOpTracerProvider()) is None  # a no-op provider given: no tracing at all


def test_a_worker_without_metrics_or_opentelemetry_imports_neither_and_works(dsn, conn, tmp_path):
    """prometheus_client and opentelemetry made unimportable: a worker drains, and one asked
    for metrics says what to install."""
    conn.execute("SELECT pgq.enqueue_many('default', 'ok', array_fill('{}'::jsonb, ARRAY[5]))")
    script = textwrap.dedent(f"""
        import sys, threading
        sys.modules["prometheus_client"] = None
        sys.modules["opentelemetry"] = None
        import psycopg
        from pgq_thin import PgqError
        from pgq_thin.worker import Worker
        worker = Worker(["default"], concurrency=2, poll_interval=0.1)
        worker.handler("ok")(lambda job, ctx: None)
        def stop_when_drained():
            with psycopg.connect({dsn!r}, autocommit=True) as c:
                while c.execute("SELECT count(*) FROM pgq.jobs WHERE state <> 'done'").fetchone()[0]:
                    threading.Event().wait(0.05)
            worker.stop()
        threading.Thread(target=stop_when_drained, daemon=True).start()
        worker.run({dsn!r}, install_signal_handlers=False)
        print("drained")
        try:
            Worker(["default"], metrics_port=0).run({dsn!r}, install_signal_handlers=False)
        except PgqError as exc:
            print(exc)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["drained", "metrics_port needs prometheus_client: pip install "
                                                  "'pgq-thin[metrics]'"]
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'done'") == 5


def test_a_bad_metrics_port_is_refused_before_anything_runs():
    for bad in (-1, 70000, "9187", True):
        with pytest.raises(ValueError, match="metrics_port"):
            Worker(["default"], metrics_port=bad)  # type: ignore[arg-type]


def test_the_worker_command_serves_its_metrics_on_metrics_port(dsn, conn):
    import signal
    import socket
    from pathlib import Path

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = Path(__file__).resolve().parents[2]
    conn.execute("SELECT pgq.enqueue_many('default', 'sleep', array_fill('{\"seconds\": 0}'::jsonb, ARRAY[4]))")
    proc = subprocess.Popen([sys.executable, "-m", "pgq_thin", "worker", "--app", "tests.apps.sleepy:worker",
                             "--dsn", dsn, "--quiet", "--metrics-port", str(port)], cwd=root,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'done'") == 4
                 or proc.poll() is not None, "the worker to do the jobs")
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        wait_for(lambda: jobs_total(samples(port)).get(("sleep", "completed")) == 4, "the runs counted")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    bad = subprocess.run([sys.executable, "-m", "pgq_thin", "worker", "--app", "tests.apps.sleepy:worker",
                          "--dsn", dsn, "--metrics-port", "99999"], cwd=root, capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "must be a port number from 0 to 65535" in bad.stderr


def fetch(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_a_workers_metrics_answer_only_metrics_and_only_to_its_own_host_names(dsn, runtime):
    worker = make_worker(runtime, metrics_port=0)
    thread, failure = run_in_thread(worker, dsn)
    try:
        port = wait_for(lambda: worker.metrics is not None and worker.metrics.port, "the metrics server")
        url = f"http://127.0.0.1:{port}/metrics"
        status, body = fetch(url)
        assert status == 200 and b"pgq_worker_slots 3.0" in body
        status, body = fetch(url, {"Host": "rebound.example"})  # a DNS-rebinding page's request
        assert status == 400 and b"pgq_worker" not in body
        assert fetch(url, {"Host": f"localhost:{port}"})[0] == 200
        for path in ("/", "/favicon.ico", "/metrics/x"):
            status, body = fetch(f"http://127.0.0.1:{port}{path}")
            assert status == 404 and b"pgq_worker" not in body, path
    finally:
        stop(worker, thread, failure)


def test_a_workers_metrics_want_its_token_when_given_one(dsn, runtime):
    worker = make_worker(runtime, metrics_port=0, metrics_token="s3cret")
    thread, failure = run_in_thread(worker, dsn)
    try:
        port = wait_for(lambda: worker.metrics is not None and worker.metrics.port, "the metrics server")
        url = f"http://127.0.0.1:{port}/metrics"
        status, body = fetch(url)
        assert status == 401 and b"pgq_worker" not in body
        assert fetch(url, {"Authorization": "Bearer guess"})[0] == 401
        status, body = fetch(url, {"Authorization": "Bearer s3cret"})
        assert status == 200 and b"pgq_worker_slots 3.0" in body
    finally:
        stop(worker, thread, failure)


def test_a_bad_metrics_token_is_refused_before_anything_runs():
    for bad in ("", " ", " padded ", 42):
        with pytest.raises(ValueError, match="metrics_token"):
            Worker(["default"], metrics_port=0, metrics_token=bad)  # type: ignore[arg-type]


def test_the_worker_command_takes_its_metrics_token_from_the_option_or_the_environment(dsn):
    import os
    import signal
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for options, env, token in (([], {"PGQ_METRICS_TOKEN": "from-env"}, "from-env"),
                                (["--metrics-token", "from-option"], {"PGQ_METRICS_TOKEN": "from-env"},
                                 "from-option")):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        proc = subprocess.Popen([sys.executable, "-m", "pgq_thin", "worker", "--app", "tests.apps.sleepy:worker",
                                 "--dsn", dsn, "--quiet", "--metrics-port", str(port), *options], cwd=root,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, **env})
        try:
            url = f"http://127.0.0.1:{port}/metrics"

            def answered(proc: subprocess.Popen[str] = proc, url: str = url) -> int:
                assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
                try:
                    return fetch(url)[0]
                except OSError:  # not listening yet
                    return 0

            assert wait_for(answered, "the metrics port") == 401
            assert fetch(url, {"Authorization": f"Bearer {token}"})[0] == 200
            assert fetch(url, {"Authorization": "Bearer from-env"})[0] == (200 if token == "from-env" else 401)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
