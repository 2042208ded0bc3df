"""The queue's Prometheus metrics: pgq.metrics() and its counters of finished jobs (migration
0010), and pgq_thin.metrics' exposition, parsed with prometheus_client's parser and compared with
pgq.stats() and pgq.health()."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections import Counter
from typing import Any

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families
from psycopg.rows import dict_row

from pgq_thin import Client, metrics
from pgq_thin.migrate import shipped_schema_version

from sqlhelpers import claim, expire_lease, one, wait_for


def parse(body: bytes) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """metric name -> {sorted labels: value} of an exposition."""
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def by_queue(parsed: dict[str, Any], name: str, **fixed: str) -> dict[str, float]:
    """{queue: value} of metric ``name`` for the samples whose other labels are ``fixed``."""
    result = {}
    for labels, value in parsed.get(name, {}).items():
        d = dict(labels)
        if all(d.get(k) == v for k, v in fixed.items()):
            result[d["queue"]] = value
    return result


def mixed_queues(conn: psycopg.Connection) -> None:
    """Three queues with jobs in every state: due, scheduled, running, expired, done, failed,
    cancelled, outcome_unknown, and a paused queue."""
    conn.execute("SELECT pgq.enqueue_many('emails', 'send', array_fill('{}'::jsonb, ARRAY[7]),"
                 " run_at => now() - interval '10 minutes')")
    conn.execute("SELECT pgq.enqueue_many('emails', 'send', array_fill('{}'::jsonb, ARRAY[2]),"
                 " run_at => now() + interval '1 hour')")
    conn.execute("SELECT pgq.enqueue_many('reports', 'build', array_fill('{}'::jsonb, ARRAY[5]))")
    conn.execute("SELECT pgq.configure_queue('idle')")
    jobs = claim(conn, queues=["emails"], batch=6)
    conn.execute("SELECT pgq.complete(%s, %s)", (jobs[0]["id"], jobs[0]["attempt"]))
    conn.execute("SELECT pgq.complete_many(%s, %s)", ([jobs[1]["id"], jobs[2]["id"]],
                                                        [jobs[1]["attempt"], jobs[2]["attempt"]]))
    conn.execute("SELECT pgq.fail(%s, %s, 'boom', retryable => false)", (jobs[3]["id"], jobs[3]["attempt"]))
    conn.execute("SELECT pgq.mark_unknown(%s, %s, 'timeout')", (jobs[4]["id"], jobs[4]["attempt"]))
    reports = claim(conn, queues=["reports"], batch=2)
    expire_lease(conn, jobs[5]["id"])  # after the last claim (a claim recovers expired leases)
    conn.execute("SELECT pgq.fail(%s, %s, 'again')", (reports[0]["id"], reports[0]["attempt"]))  # retried
    conn.execute("SELECT pgq.cancel(%s)", (reports[1]["id"],))
    pending = one(conn, "SELECT min(id) FROM pgq.jobs WHERE queue = 'reports' AND state = 'pending'")
    conn.execute("SELECT pgq.cancel(%s)", (pending,))
    conn.execute("SELECT pgq.pause('reports')")


def test_the_rows_a_client_reads_give_the_exporters_text(conn, dsn):
    """What the dashboard serves (metrics.rows_of over Client.metrics, health and queue_limits) is
    what the exporter serves (its three statements), sample for sample, held-back jobs included."""
    mixed_queues(conn)
    conn.execute("SELECT pgq.enqueue_many('limited', 'k', ARRAY['{}', '{}', '{}']::jsonb[])")
    conn.execute("SELECT pgq.configure_queue('limited', rate_limit => 1, rate_period => '1 hour')")
    conn.execute("SELECT pgq.resume('reports')")
    with Client(dsn) as client:
        findings = client.health()
        served = parse(metrics.text_of(metrics.rows_of(client.metrics(), findings, client.queue_limits()))[0])
    exported = parse(metrics.exposition(conn)[0])
    ages = "pgq_oldest_ready_age_seconds"  # read a moment apart: the same series, ages a moment apart
    assert served.keys() == exported.keys() and served[ages].keys() == exported[ages].keys()
    assert {k: v for k, v in served.items() if k != ages} == {k: v for k, v in exported.items() if k != ages}
    assert served["pgq_jobs_held_back"][(("limit", "rate_limit"), ("queue", "limited"))] == 2  # 3 due, 1 token
    assert sum(served["pgq_health_findings"].values()) == len(findings)


def test_the_exposition_parses_and_agrees_with_stats_and_health(conn):
    mixed_queues(conn)
    body, content_type = metrics.exposition(conn)
    assert content_type.startswith("text/plain")
    parsed = parse(body)
    stats = {r[0]: r for r in conn.execute(
        "SELECT queue, pending, scheduled, running, expired, done, failed, cancelled, outcome_unknown,"
        " extract(epoch FROM oldest_ready_age), paused FROM pgq.stats()")}
    assert set(stats) == {"emails", "idle", "reports"}
    for column, state in ((1, "pending"), (2, "scheduled"), (3, "running"), (8, "outcome_unknown")):
        assert by_queue(parsed, "pgq_jobs", state=state) == {q: r[column] for q, r in stats.items()}, state
    # No prune ran: every finished job is still stored, so the counters equal stats' counts.
    for column, state in ((5, "done"), (6, "failed"), (7, "cancelled")):
        assert by_queue(parsed, "pgq_jobs_finished_total", state=state) == {q: r[column] for q, r in stats.items()}
    assert by_queue(parsed, "pgq_expired_leases") == {q: r[4] for q, r in stats.items()}
    assert by_queue(parsed, "pgq_queue_paused") == {q: float(r[10]) for q, r in stats.items()}
    ages = by_queue(parsed, "pgq_oldest_ready_age_seconds")
    assert ages["idle"] == 0 and ages["reports"] > 0
    assert 600 <= ages["emails"] < 600 + 30 and abs(ages["emails"] - float(stats["emails"][9])) < 30
    # Spot values, so that a wrong mixed_queues cannot make the comparison empty.
    assert by_queue(parsed, "pgq_jobs", state="pending") == {"emails": 1, "idle": 0, "reports": 3}
    assert by_queue(parsed, "pgq_jobs_finished_total", state="done")["emails"] == 3
    assert by_queue(parsed, "pgq_expired_leases")["emails"] == 1
    health = Counter((r[0], r[1]) for r in conn.execute('SELECT "check", severity FROM pgq.health()'))
    findings = parsed["pgq_health_findings"]
    assert {k: v for k, v in findings.items() if v} == {(("check", c), ("severity", s)): n
                                                         for (c, s), n in health.items()}
    assert findings[(("check", "expired_leases"), ("severity", "warning"))] == 1
    assert findings[(("check", "expired_leases"), ("severity", "critical"))] == 0  # every severity, zeros too


def test_exposition_reads_through_a_connection_with_any_row_factory(dsn):
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as c:
        c.execute("SELECT pgq.enqueue('q', 'k')")
        parsed = parse(metrics.exposition(c)[0])
    assert by_queue(parsed, "pgq_jobs", state="pending") == {"q": 1}


def test_the_counters_do_not_drop_when_finished_jobs_are_pruned(conn):
    mixed_queues(conn)
    before = parse(metrics.exposition(conn)[0])["pgq_jobs_finished_total"]
    assert one(conn, "SELECT pgq.prune(older_than => interval '0')") == 6
    # pgq.stats' finished counts are the counters too (issue 40): not lowered by the prune.
    assert one(conn, "SELECT sum(done + failed + cancelled) FROM pgq.stats()") == 6
    assert parse(metrics.exposition(conn)[0])["pgq_jobs_finished_total"] == before


def test_a_scrape_reads_no_finished_row(conn):
    """The scrape's cost does not grow with the history: with 100,000 finished jobs stored,
    pgq.metrics() and pgq.health() read none of them (pg_stat_xact_user_tables counts what a
    transaction read)."""
    conn.execute("INSERT INTO pgq.queues (name) VALUES ('big')")
    conn.execute("""INSERT INTO pgq.jobs (queue, kind, state, max_attempts, attempt, finished_at, last_event)
                    SELECT 'big', 'k', 'done', 25, 1, now(), 'completed' FROM generate_series(1, 100000)""")
    conn.execute("SELECT pgq.enqueue_many('big', 'k', array_fill('{}'::jsonb, ARRAY[20]))")
    claim(conn, queues=["big"], batch=5)
    conn.execute("ANALYZE pgq.jobs")
    with conn.transaction():
        rows = conn.execute("SELECT queue, pending, running FROM pgq.metrics()").fetchall()
        seq_scans, tuples = conn.execute(
            "SELECT seq_scan, seq_tup_read + coalesce(idx_tup_fetch, 0) FROM pg_stat_xact_user_tables"
            " WHERE relid = 'pgq.jobs'::regclass").fetchone()
    assert rows == [("big", 15, 5)]
    assert seq_scans == 0
    assert tuples <= 40, f"pgq.metrics() read {tuples} rows of pgq.jobs"
    with conn.transaction():  # the scrape's other statement: the health findings
        conn.execute("SELECT * FROM pgq.health()").fetchall()
        seq_scans, tuples = conn.execute(
            "SELECT seq_scan, seq_tup_read + coalesce(idx_tup_fetch, 0) FROM pg_stat_xact_user_tables"
            " WHERE relid = 'pgq.jobs'::regclass").fetchone()
    assert seq_scans == 0
    # Its checks read the 20 live jobs a few times each (due jobs by queue, then by kind): never
    # the 100,000 finished ones.
    assert tuples <= 5 * 20, f"pgq.health() read {tuples} rows of pgq.jobs"


def test_the_counters_are_exact_under_concurrent_completions_and_folds(dsn, connect):
    """8 completers (complete, complete_many, fail for good, cancel) while a scraper folds and
    reads in a loop: every sample is monotonic, and the final counts equal the finished jobs."""
    conn = connect()
    per_worker = 150
    workers = 8
    conn.execute("SELECT pgq.configure_queue('q', max_attempts => 1)")
    conn.execute("SELECT pgq.enqueue_many('q', 'k', array_fill('{}'::jsonb, ARRAY[%s]))", (per_worker * workers,))
    errors: list[BaseException] = []
    stop = threading.Event()
    samples: list[tuple[int, int, int]] = []

    def completer(i: int) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                n = 0
                while True:
                    rows = c.execute("SELECT id, attempt FROM pgq.claim(%s, ARRAY['q'], 2)", (f"w{i}",)).fetchall()
                    if not rows:
                        return
                    for job_id, attempt in rows:
                        n += 1
                        if n % 4 == 0:
                            c.execute("SELECT pgq.complete_many(ARRAY[%s]::bigint[], ARRAY[%s]::integer[])",
                                      (job_id, attempt))
                        elif n % 4 == 1:
                            c.execute("SELECT pgq.complete(%s, %s)", (job_id, attempt))
                        elif n % 4 == 2:
                            c.execute("SELECT pgq.fail(%s, %s, 'x')", (job_id, attempt))  # max_attempts 1: failed
                        else:
                            c.execute("SELECT pgq.release(%s, %s)", (job_id, attempt))  # pending again
                            c.execute("SELECT pgq.cancel(%s)", (job_id,))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    def scraper() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                while not stop.is_set():
                    samples.append(c.execute("SELECT done_total, failed_total, cancelled_total"
                                             " FROM pgq.metrics() WHERE queue = 'q'").fetchone())
                    c.execute("SELECT pgq.sweep()")
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=completer, args=(i,)) for i in range(workers)]
    folding = threading.Thread(target=scraper)
    folding.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    folding.join()
    assert not errors, errors
    stored = dict(conn.execute("SELECT state::text, count(*) FROM pgq.jobs GROUP BY 1").fetchall())
    assert sum(stored.values()) == per_worker * workers and set(stored) == {"done", "failed", "cancelled"}
    final = conn.execute("SELECT done_total, failed_total, cancelled_total FROM pgq.metrics()").fetchone()
    assert final == (stored["done"], stored["failed"], stored["cancelled"])
    assert len(samples) > 3
    for earlier, later in zip(samples, samples[1:]):
        assert all(a <= b for a, b in zip(earlier, later)), (earlier, later)
    # Folds ran during the drain, and the deltas are gone once folded.
    assert one(conn, "SELECT count(*) FROM pgq.finished_counts") == 3
    one(conn, "SELECT count(*) FROM pgq.metrics()")
    assert one(conn, "SELECT count(*) FROM pgq.finished_deltas") == 0


def test_a_retried_job_counts_each_time_it_finishes_and_resolve_counts(conn):
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k')")
    j = claim(conn)[0]
    conn.execute("SELECT pgq.fail(%s, %s, 'x', retryable => false)", (job_id, j["attempt"]))
    conn.execute("SELECT pgq.retry(%s)", (job_id,))
    j = claim(conn)[0]
    conn.execute("SELECT pgq.mark_unknown(%s, %s, 'n')", (job_id, j["attempt"]))
    assert conn.execute("SELECT done_total, failed_total FROM pgq.metrics()").fetchone() == (0, 1)
    conn.execute("SELECT pgq.resolve(%s, 'done')", (job_id,))
    assert conn.execute("SELECT done_total, failed_total FROM pgq.metrics()").fetchone() == (1, 1)


def test_read_only_transactions_and_the_monitor_role_read_the_counters_without_folding(conn, connect):
    mixed_queues(conn)
    assert one(conn, "SELECT count(*) FROM pgq.finished_deltas") == 6
    monitor = connect(autocommit=False, role="pgq_monitor")
    monitor.execute("SET TRANSACTION READ ONLY")
    rows = monitor.execute("SELECT queue, done_total, failed_total, cancelled_total FROM pgq.metrics()").fetchall()
    monitor.rollback()
    assert rows == [("emails", 3, 1, 0), ("idle", 0, 0, 0), ("reports", 0, 0, 2)]
    assert one(conn, "SELECT count(*) FROM pgq.finished_deltas") == 6  # nothing folded: read only
    monitor.execute("SET ROLE pgq_monitor")
    monitor.commit()
    body, _ = metrics.exposition(monitor)  # as the monitor, no transaction open: its own, which folds
    assert by_queue(parse(body), "pgq_jobs_finished_total", state="done")["emails"] == 3
    assert one(conn, "SELECT count(*) FROM pgq.finished_deltas") == 0
    assert monitor.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_the_migration_counts_the_finished_jobs_already_stored(databases):
    from pgq_tools.bench import HEAD, _migrate_to

    dsn = databases.create()
    _migrate_to(dsn, "0007_failover_fence")
    with psycopg.connect(dsn, autocommit=True) as c:
        mixed_queues(c)
    _migrate_to(dsn, HEAD)
    with psycopg.connect(dsn, autocommit=True) as c:
        assert one(c, "SELECT pgq.version()") == str(shipped_schema_version())  # the newest migration
        stored = c.execute("SELECT queue, done, failed, cancelled FROM pgq.stats()").fetchall()
        counted = c.execute("SELECT queue, done_total, failed_total, cancelled_total FROM pgq.metrics()").fetchall()
        assert counted == stored and stored[0][1] == 3


def test_serve_answers_scrapes_and_a_restarted_exporter_counts_on(dsn, conn):
    mixed_queues(conn)
    port = free_port()
    stop = metrics.serve(dsn, port)
    try:
        first = parse(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read())
    finally:
        stop()
    jobs = claim(conn, queues=["emails"])
    conn.execute("SELECT pgq.complete(%s, %s)", (jobs[0]["id"], jobs[0]["attempt"]))
    stop = metrics.serve(dsn, port)
    try:
        second = parse(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read())
    finally:
        stop()
    done = {"state": "done"}
    assert by_queue(first, "pgq_jobs_finished_total", **done)["emails"] == 3
    assert by_queue(second, "pgq_jobs_finished_total", **done)["emails"] == 4


def test_without_prometheus_client_the_hint_says_what_to_install():
    code = ("import sys; sys.modules['prometheus_client'] = None\n"
            "from pgq_thin import metrics\n"
            "try:\n    metrics.exposition(None)\n"
            "except Exception as exc:\n    print(type(exc).__name__, exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "PgqError " + metrics.INSTALL_HINT
    assert "pip install 'pgq-thin[metrics]'" in metrics.INSTALL_HINT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(autouse=True)
def _no_global_registry_use():
    """The queue metrics live on registries of their own, never prometheus_client's global one."""
    from prometheus_client import REGISTRY

    before = set(REGISTRY._names_to_collectors)
    yield
    assert set(REGISTRY._names_to_collectors) == before


# pgq-thin metrics: the exporter alone -------------------------------------------------------------


def start_exporter(dsn: str, port: int, *options: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-m", "pgq_thin", "metrics", "--dsn", dsn, "--port", str(port),
                             *options], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})
    assert proc.stderr is not None
    line = proc.stderr.readline()  # it says where it serves once it does
    assert line.strip() == f"pgq-thin metrics: serving http://127.0.0.1:{port}/metrics", line
    return proc


def stop_exporter(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


def test_the_exporter_command_serves_and_counts_on_after_a_restart(dsn, conn):
    mixed_queues(conn)
    port = free_port()
    proc = start_exporter(dsn, port)
    try:
        first = parse(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read())
    finally:
        stop_exporter(proc)
    for _ in range(2):
        jobs = claim(conn, queues=["emails"])
        conn.execute("SELECT pgq.complete(%s, %s)", (jobs[0]["id"], jobs[0]["attempt"]))
    conn.execute("SELECT pgq.prune(older_than => interval '0')")
    proc = start_exporter(dsn, port)
    try:
        second = parse(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read())
    finally:
        stop_exporter(proc)
    assert by_queue(first, "pgq_jobs_finished_total", state="done") == {"emails": 3, "idle": 0, "reports": 0}
    assert by_queue(second, "pgq_jobs_finished_total", state="done") == {"emails": 5, "idle": 0, "reports": 0}
    assert by_queue(second, "pgq_jobs_finished_total", state="cancelled")["reports"] == 2


def test_the_exporter_command_refuses_bad_input_in_one_line(dsn, empty_dsn):
    def pgq_thin(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "pgq_thin", "metrics", *args], capture_output=True,
                              text=True, timeout=60)

    for bad_port in ("70000", "-1", "http"):
        out = pgq_thin("--dsn", dsn, "--port", bad_port)
        assert out.returncode == 2 and "must be a port number from 0 to 65535" in out.stderr
    out = pgq_thin("--dsn", empty_dsn, "--port", "0")
    assert out.returncode == 1 and out.stderr.count("\n") == 1 and "pgq-thin migrate" in out.stderr
    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        out = pgq_thin("--dsn", dsn, "--port", str(port))
    assert out.returncode == 1 and out.stderr.count("\n") == 1 and f"cannot serve on 127.0.0.1:{port}" in out.stderr


def test_a_scrape_the_database_does_not_answer_is_an_http_500_and_the_next_one_reconnects(dsn, conn):
    port = free_port()
    stop = metrics.serve(dsn, port)
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        assert urllib.request.urlopen(url, timeout=10).status == 200
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                     " WHERE application_name = 'pgq-thin metrics'")
        with pytest.raises(urllib.error.HTTPError) as failed:
            urllib.request.urlopen(url, timeout=10)
        assert failed.value.code == 500
        assert urllib.request.urlopen(url, timeout=10).status == 200
    finally:
        stop()


def test_a_fold_takes_every_delta_and_the_sweep_folds_too(conn):
    """Folds after folds of nothing (the plan the fold's function caches is made while the table is
    empty), then a fold of 20,000 deltas: it takes all of them, in one transaction."""
    conn.execute("SELECT pgq.configure_queue('q')")
    for _ in range(8):
        assert one(conn, "SELECT pgq._fold_finished()") == 0
    conn.execute("INSERT INTO pgq.finished_deltas SELECT 'q', 'done' FROM generate_series(1, 20000)")
    assert one(conn, "SELECT done_total FROM pgq.metrics()") == 20000
    assert one(conn, "SELECT count(*) FROM pgq.finished_deltas") == 0
    assert one(conn, "SELECT total FROM pgq.finished_counts") == 20000
    conn.execute("INSERT INTO pgq.finished_deltas SELECT 'q', 'done' FROM generate_series(1, 5)")
    assert one(conn, "SELECT pgq.sweep()") == 0  # the sweep folds too
    assert one(conn, "SELECT count(*) FROM pgq.finished_deltas") == 0
    assert one(conn, "SELECT done_total FROM pgq.metrics()") == 20005


def test_a_second_fold_while_one_runs_skips_instead_of_waiting(conn, connect):
    conn.execute("SELECT pgq.configure_queue('q')")
    conn.execute("INSERT INTO pgq.finished_deltas SELECT 'q', 'failed' FROM generate_series(1, 10)")
    first = connect(autocommit=False)
    assert one(first, "SELECT pgq._fold_finished()") == 10  # its transaction stays open
    second = connect()
    second.execute("SET lock_timeout = '5s'")
    assert one(second, "SELECT pgq._fold_finished()") == 0  # skipped at once, no lock wait
    assert one(second, "SELECT failed_total FROM pgq.metrics()") == 10  # the deltas, not yet folded for it
    first.commit()
    assert one(second, "SELECT failed_total FROM pgq.metrics()") == 10
    assert one(conn, "SELECT total FROM pgq.finished_counts") == 10


def test_health_of_a_stuck_queue_reads_a_bounded_part_of_its_history(conn):
    """A kind whose due job has waited 10 minutes, in a queue with 100,000 finished jobs of that
    same kind since: the unclaimed_kind check looks for other kinds among the newest finished jobs
    of the queue, not through every job finished since (which it did)."""
    conn.execute("INSERT INTO pgq.queues (name) VALUES ('stuck')")
    conn.execute("SELECT pgq.enqueue('stuck', 'b', run_at => now() - interval '10 minutes')")
    conn.execute("""INSERT INTO pgq.jobs (queue, kind, state, max_attempts, attempt, claimed_at, finished_at,
                                          last_event)
                    SELECT 'stuck', 'b', 'done', 25, 1, now(), now(), 'completed' FROM generate_series(1, 100000)""")
    conn.execute("ANALYZE pgq.jobs")
    with conn.transaction():
        found = conn.execute("""SELECT severity FROM pgq.health(max_ready_age => '8 minutes')
                                WHERE "check" = 'unclaimed_kind'""").fetchall()
        tuples = one(conn, "SELECT seq_tup_read + coalesce(idx_tup_fetch, 0) FROM pg_stat_xact_user_tables"
                           " WHERE relid = 'pgq.jobs'::regclass")
    assert found == [("ok",)]  # no other kind was claimed: the ready_age check reports it instead
    assert tuples <= 3 * 1000 + 100, f"pgq.health() read {tuples} rows of pgq.jobs"


def test_the_fold_works_where_a_publication_for_all_tables_includes_the_deltas(conn):
    conn.execute("CREATE PUBLICATION pgq_test_everything FOR ALL TABLES")
    try:
        mixed_queues(conn)
        assert conn.execute("SELECT done_total, failed_total FROM pgq.metrics() WHERE queue = 'emails'"
                            ).fetchone() == (3, 1)
        assert one(conn, "SELECT count(*) FROM pgq.finished_deltas") == 0
    finally:
        conn.execute("DROP PUBLICATION pgq_test_everything")


# The exporter's HTTP rules: its own Host names, /metrics only, an optional bearer token -----------


def fetch(url: str, headers: dict[str, str] | None = None, method: str = "GET") -> tuple[int, Any, bytes]:
    """(status, headers, body) of one request, whatever the status."""
    request = urllib.request.Request(url, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers, error.read()


def test_the_exporter_answers_only_to_its_own_host_names(dsn, conn):
    """Bound to loopback, a DNS-rebinding page's request (its own name in Host) gets 400."""
    mixed_queues(conn)
    port = free_port()
    stop = metrics.serve(dsn, port)
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        status, _, body = fetch(url)
        assert status == 200 and by_queue(parse(body), "pgq_jobs", state="pending")["emails"] == 1
        for host in ("rebound.example", f"rebound.example:{port}", "127.0.0.1.nip.io", f"127.0.0.1:{port}x"):
            status, _, body = fetch(url, {"Host": host})
            assert status == 400 and b"refused" in body and b"pgq_jobs" not in body, host
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", "LOCALHOST", f"[::1]:{port}"):
            assert fetch(url, {"Host": host})[0] == 200, host
    finally:
        stop()
    stop = metrics.serve(dsn, port, "0.0.0.0")  # bound to every interface: any name (like the dashboard)
    try:
        assert fetch(f"http://127.0.0.1:{port}/metrics", {"Host": "metrics.example"})[0] == 200
    finally:
        stop()


def test_the_exporter_answers_only_metrics(dsn):
    port = free_port()
    stop = metrics.serve(dsn, port)
    try:
        base = f"http://127.0.0.1:{port}"
        assert fetch(f"{base}/metrics")[0] == 200
        assert fetch(f"{base}/metrics?name[]=pgq_jobs")[0] == 200  # prometheus_client's filter is kept
        for path in ("/", "/favicon.ico", "/metrics/", "/metricsx", "/api/queues", "/?name[]=pgq_jobs"):
            status, _, body = fetch(base + path)
            assert status == 404 and b"/metrics" in body and b"pgq_jobs" not in body, path
        status, headers, _ = fetch(f"{base}/metrics", method="POST")
        assert status == 405 and headers["Allow"] == "GET, HEAD"
    finally:
        stop()


def test_the_exporter_wants_its_bearer_token_and_slows_down_wrong_ones(dsn, conn):
    port = free_port()
    stop = metrics.serve(dsn, port, token="s3cret")
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        status, headers, body = fetch(url)
        assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer") and b"pgq_jobs" not in body
        status, _, body = fetch(url, {"Authorization": "Bearer s3cret"})
        assert status == 200 and "pgq_health_findings" in parse(body)
        for _ in range(6):  # five answer at once, the sixth makes the address wait 1 s
            assert fetch(url, {"Authorization": "Bearer guess"})[0] == 401
        status, headers, _ = fetch(url, {"Authorization": "Bearer s3cret"})  # not even checked now
        assert status == 429 and headers["Retry-After"] == "1"
        wait_for(lambda: fetch(url, {"Authorization": "Bearer s3cret"})[0] == 200, "the wait to end", 20)
    finally:
        stop()


def test_the_exporter_command_takes_its_token_from_the_option_or_the_environment(dsn):
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    proc = start_exporter(dsn, port, env={"PGQ_METRICS_TOKEN": "from-env"})
    try:
        assert fetch(url)[0] == 401
        assert fetch(url, {"Authorization": "Bearer from-env"})[0] == 200
    finally:
        stop_exporter(proc)
    proc = start_exporter(dsn, port, "--token", "from-option", env={"PGQ_METRICS_TOKEN": "from-env"})
    try:
        assert fetch(url, {"Authorization": "Bearer from-option"})[0] == 200
        assert fetch(url, {"Authorization": "Bearer from-env"})[0] == 401
    finally:
        stop_exporter(proc)
