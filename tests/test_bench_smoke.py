"""The benchmark still runs end to end (tiny sizes, on the test's own database). It asserts what
was produced, never how fast: benchmarks are not timed tests."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pgq_thin.bench import BenchConfig, run_bench

pytestmark = pytest.mark.skipif(shutil.which("pgbench") is None and not Path("/usr/bin/pgbench").exists(),
                                reason="pgbench is not installed")


def test_the_benchmark_runs_every_workload_and_verifies_its_drains(dsn: str, tmp_path: Path) -> None:
    config = BenchConfig(jobs=40, workers=(2,), repeats=1, enqueue_jobs=1000, single_enqueues=20,
                         latency_samples=2, poll_interval=0.2, finished_levels=(100, 200), claim_samples=5,
                         churn_seconds=0.5, snapshot_seconds=0.3, pgbench_seconds=1)
    assert run_bench(str(tmp_path), dsn=dsn, config=config, print_table=False) == 0

    result = json.loads((tmp_path / "bench.json").read_text())
    drain = result["drain"]["2"]
    for system in ("raw b1", "raw b10", "pgq b1", "pgq b10", "pgq b10 fair", "pgq worker", "pgq worker prefetch",
                   "pgbench"):
        assert drain[system]["median"] > 0, system  # a drain only reports after its done count matched
    assert set(result) >= {"enqueue", "latency", "claim_latency", "churn", "old_snapshot"}
    assert result["enqueue"]["raw INSERT of 1000 rows"]["median"] > 0
    assert result["latency"]["LISTEN"]["missing"] == 0
    assert any("jobs_ready_idx" in plan for plan in result["claim_latency"]["200"]["plans"])
    table = (tmp_path / "bench.md").read_text()
    assert "| raw b1 | 2 |" in table and "× raw b10" in table
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert (tmp_path / "bench.png").stat().st_size > 0
