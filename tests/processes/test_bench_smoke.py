"""The benchmark still runs end to end (tiny sizes, on the test's own database). It asserts what
was produced, never how fast: benchmarks are not timed tests."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest

from pgq_tools.bench import BenchConfig, run_bench

pytestmark = pytest.mark.skipif(shutil.which("pgbench") is None and not Path("/usr/bin/pgbench").exists(),
                                reason="pgbench is not installed")


@pytest.mark.slow
def test_the_benchmark_runs_every_workload_and_verifies_its_drains(dsn: str, tmp_path: Path) -> None:
    config = BenchConfig(jobs=40, workers=(2,), repeats=1, enqueue_jobs=1000, single_enqueues=20,
                         latency_samples=2, poll_interval=0.2, finished_levels=(100, 200), claim_samples=5,
                         churn_seconds=0.5, snapshot_seconds=0.3, pgbench_seconds=1, idle_queues=200,
                         waiting_tenants=200, many_samples=5, batch_jobs=40)
    assert run_bench(str(tmp_path), dsn=dsn, config=config, print_table=False) == 0

    result = json.loads((tmp_path / "bench.json").read_text())
    drain = result["drain"]["2"]
    for system in ("raw b1", "raw b10", "pgq b1", "pgq b10", "pgq b1 cc", "pgq b10 cc", "pgq b10 fair", "pgq worker",
                   "pgq worker prefetch", "pgbench"):
        assert drain[system]["median"] > 0, system  # a drain only reports after its done count matched
    assert set(result) >= {"enqueue", "latency", "claim_latency", "churn", "old_snapshot", "many", "limits",
                           "keyed", "batch"}
    limits = result["limits"]  # each limited drain only reports after all its jobs are done
    assert limits["no limit"]["jobs_per_s"]["median"] > 0
    # A sampler (every 2 ms) counts the running jobs of each key: it may see none of a drain of 40
    # jobs that takes 13 ms (a CI run's did), but never more than the limit of one that has it.
    assert all(limits[name]["samples"] > 0 for name in ("no limit", "key_max_running 2")), limits
    assert limits["key_max_running 2"]["most_running_per_key"] <= 2
    rated = limits["rate_limit 200/s"]  # 800 jobs: a burst of 200, then 3 s of tokens at 200 a second
    assert rated["jobs"] == 800 and rated["min_seconds"] == 3.0 and rated["seconds"] >= 3.0
    assert "| key_max_running 2 | 40 |" in (tmp_path / "bench.md").read_text()
    keyed = result["keyed"]["rows"]  # each keyed drain reports after all its handlers ran
    assert {(x["order"], x["queue"]) for x in keyed} == {(o, q) for o in ("interleaved", "blocks")
                                                         for q in ("no limit", "key_max_running 1")}
    assert all(x["most_running_per_key"] == 1 for x in keyed if x["queue"] == "key_max_running 1"), keyed
    assert all(x["ceiling"] == 1000 for x in keyed), keyed  # 2 workers, 2 ms handlers
    assert "| blocks | 2 | key_max_running 1 |" in (tmp_path / "bench.md").read_text()
    many = result["many"]
    assert many["claim(queues => NULL), 1 queue + 200 idle"]["claim_ms"]["median"] > 0
    assert any("queues_pkey" in plan for plan in many["fair claim, 200 tenants"]["plans"])
    assert any("tenants_vtime_idx" in plan for plan in many["fair claim, 200 tenants"]["plans"])
    assert result["enqueue"]["raw INSERT of 1000 rows"]["median"] > 0
    assert result["latency"]["LISTEN"]["missing"] == 0
    assert any("jobs_ready_idx" in plan for plan in result["claim_latency"]["200"]["plans"])
    table = (tmp_path / "bench.md").read_text()
    assert "| raw b1 | 2 |" in table and "× raw b10" in table
    # The page says what it measured on: the machine and the server's settings.
    assert f"Machine: {os.cpu_count()} CPUs" in table and "RAM" in table, table[:600]
    assert re.search(r"Server settings: shared_buffers \S+, max_connections \d+, work_mem", table), table[:600]
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert (tmp_path / "bench.png").stat().st_size > 0
    # Every table states the server's fsync (the smoke test's server: whatever the test cluster has).
    sections = [block for block in table.split("### ")[1:]]
    assert sections and all(f"fsync {result['fsync']}" in block.splitlines()[0] for block in sections), \
        [block.splitlines()[0] for block in sections]
    # The polling row is labelled with what it measured: LISTEN off, the idle time before each job.
    polling = result["latency"]["polling only"]
    assert polling["listen"] is False and polling["poll_interval"] == 0.2 and polling["idle"] == 0.4
    assert "| polling only | 0.2 s | 0.4 s + random 0–0.2 s |" in table
    # The targets table is computed from the run's own figures.
    drain_ratio = drain["pgq b1"]["median"] / drain["raw b1"]["median"]
    assert f"| batch-1 drain ≥ 0.8× raw b1 | W = 2: {drain_ratio:.2f} |" in table


def test_the_batch_workload_drains_members_beside_plain_jobs_and_sees_one_callback_per_batch(
        dsn: str, tmp_path: Path) -> None:
    """Workload "batch" alone, tiny: each run's drain reports only after its done count matched, and
    each batch run counted its callback jobs (one) and compared their meta with the data."""
    config = BenchConfig(workers=(2,), repeats=2, batch_jobs=60)
    assert run_bench(str(tmp_path), dsn=dsn, config=config, workloads=("batch",), print_table=False) == 0

    result = json.loads((tmp_path / "bench.json").read_text())
    batch = result["batch"]
    assert batch["jobs"] == 60 and set(batch) == {"jobs", "2"}
    runs = batch["2"]
    assert len(runs["plain"]["samples"]) == len(runs["batch"]["samples"]) == 2
    assert runs["plain"]["median"] > 0 and runs["batch"]["median"] > 0
    assert runs["ratio"] == runs["batch"]["median"] / runs["plain"]["median"]
    assert runs["within_spread"] == (runs["batch"]["median"] >= runs["plain"]["min"])
    assert runs["callbacks"] == [1, 1] and runs["meta_matches"] and runs["status_matches"], runs
    assert set(runs["callback_by"]) <= {"end", "sweep"} and len(runs["callback_by"]) == 2
    assert runs["status"] == ["finished"]
    table = (tmp_path / "bench.md").read_text()
    assert "### A batch's members drained beside the same plain jobs (60 jobs each" in table
    assert f"| 2 | {_rate(runs['plain'])} | {_rate(runs['batch'])} | {runs['ratio']:.2f} |" in table
    assert "| a batch of 60 members drains at the plain rate within the spread (W = 2), one callback |" in table
    # The bench leaves no batch's jobs behind in the scratch database.
    import psycopg

    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM pgq.jobs").fetchone() == (0,)


def test_the_cancel_workload_times_each_cancel_to_the_handler_on_both_runtimes(dsn: str, tmp_path: Path) -> None:
    """Workload "cancel" alone, tiny: every cancelled job's handler saw it (nothing missing), and
    the page has its section and its target rows."""
    config = BenchConfig(cancel_samples=3)
    assert run_bench(str(tmp_path), dsn=dsn, config=config, workloads=("cancel",), print_table=False) == 0

    result = json.loads((tmp_path / "bench.json").read_text())["cancel"]
    assert set(result) == {"Worker", "AsyncWorker", "lease_s"}
    for runtime in ("Worker", "AsyncWorker"):
        row = result[runtime]
        assert (row["n"], row["missing"], row["cancelled"]) == (3, 0, 3), row
        assert row["p50_ms"] <= row["p95_ms"] <= row["max_ms"], row
    table = (tmp_path / "bench.md").read_text()
    assert "### pgq.cancel COMMIT to the running handler seeing it" in table
    worker, aio = result["Worker"], result["AsyncWorker"]
    assert (f"| Worker | {worker['handler']} | {worker['p50_ms']:.1f} | {worker['p95_ms']:.1f} |"
            f" {worker['max_ms']:.1f} | 3 | 0 |") in table
    assert f"| a cancel reaches the running handler within a second (AsyncWorker) | p95 {aio['p95_ms']:.1f} ms" in table


def _rate(s: dict[str, float]) -> str:
    return f"{s['median']:,.0f} ({s['min']:,.0f}–{s['max']:,.0f})"


def test_readme_block_is_replaced_by_the_runs_table(tmp_path: Path) -> None:
    from pgq_tools.bench import BENCH_BEGIN, BENCH_END, update_readme

    page = tmp_path / "README.md"
    page.write_text(f"# title\n\nprose\n\n{BENCH_BEGIN}\nold figures\n{BENCH_END}\n\nmore prose\n")
    update_readme(str(page), "| new | table |\n")
    assert page.read_text() == f"# title\n\nprose\n\n{BENCH_BEGIN}\n| new | table |\n{BENCH_END}\n\nmore prose\n"
    (tmp_path / "plain.md").write_text("no block\n")
    with pytest.raises(ValueError, match="block"):
        update_readme(str(tmp_path / "plain.md"), "x")


def test_bench_readme_shows_exactly_the_committed_runs_tables() -> None:
    """bench/README.md's generated block is bench/bench.md, byte for byte: the page's figures are
    one run's output, not typed by hand."""
    from pgq_tools.bench import BENCH_BEGIN, BENCH_END

    bench = Path(__file__).resolve().parents[2] / "bench"
    page = (bench / "README.md").read_text()
    block = page.split(BENCH_BEGIN, 1)[1].split(BENCH_END, 1)[0]
    assert block.strip() == (bench / "bench.md").read_text().strip()
    assert "fsync" in block.splitlines()[1]


def test_the_performance_page_quotes_no_benchmark_figures() -> None:
    """docs/performance.md (once the README's Performance section) names the generated page
    instead of quoting figures that go stale."""
    performance = (Path(__file__).resolve().parents[2] / "docs" / "performance.md").read_text()
    assert "bench/README.md" in performance
    assert not re.search(r"\d+(\.\d+)?\s*(×|x\b|ms\b|jobs/s)|\b0\.\d\d\b", performance), performance


def test_every_drain_is_reported_by_the_one_clock_of_timed_drain(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each system's rate is N over _timed_drain's seconds (no system substitutes a kinder span of
    its own), and that clock starts before the consumers do, so their start-up counts."""
    from pgq_tools import bench

    bench._prepare_database(dsn)
    real_timed, real_consumers = bench._timed_drain, bench._consumers
    measured: dict[str, float] = {}

    def slow_start(dsn_: str, system: str, workers: int, stop) -> None:  # type: ignore[no-untyped-def]
        time.sleep(0.2)  # a consumer's start-up (connections, pool, LISTEN)
        real_consumers(dsn_, system, workers, stop)

    def timed(dsn_: str, system: str, workers: int, n: int) -> float:
        measured[system] = real_timed(dsn_, system, workers, n)
        return 4.0  # what the report must use, whatever the system

    monkeypatch.setattr(bench, "_consumers", slow_start)
    monkeypatch.setattr(bench, "_timed_drain", timed)
    for system in bench.DRAIN_SYSTEMS:
        assert bench._one_drain(dsn, system, 2, 20) == 20 / 4.0, system
    assert set(measured) == set(bench.DRAIN_SYSTEMS)
    assert all(seconds >= 0.2 for seconds in measured.values()), measured
