"""The peer benchmark (bench/peers/run.py) still runs end to end: pgq's own rows only (its Worker,
its AsyncWorker and its raw-SQL floor), at a tiny size, on the test session's server; no peer is
installed (no network, no npm or pip). It asserts what was produced, never how fast."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _runner():
    spec = importlib.util.spec_from_file_location("bench_peers_run", ROOT / "bench" / "peers" / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_pgq_rows_of_the_peer_benchmark_run_and_report(admin_dsn: str, tmp_path: Path) -> None:
    runner = _runner()
    readme = tmp_path / "README.md"
    readme.write_text(f"before\n{runner.BEGIN}\nnot run yet\n{runner.END}\nafter\n")
    res = runner.run(tmp_path / "out", jobs=200, keyed_jobs=200, workers=[2], repeats=1, systems={"pgq", "raw"},
                     sections=["plain", "keyed"], fsync=False, readme=str(readme), skip_install=True,
                     admin_dsn=admin_dsn, print_table=False)

    assert res["failures"] == {} and res["not_run"] == {}
    got = {(s["section"], s["label"]): s for s in res["samples"]}
    assert set(got) == {("plain", "raw b1"), ("plain", "raw b10"), ("plain", "pgq worker"),
                        ("plain", "pgq async worker"), ("keyed", "pgq worker"), ("keyed", "pgq worker, no limit")}
    for s in got.values():  # a drain is only reported once the observer counted all its jobs done
        assert s["jobs_per_s"] > 0 and s["cpu_ms_per_job"] >= 0 and s["jobs"] == 200, s
    for key in (("plain", "pgq worker"), ("plain", "pgq async worker"), ("keyed", "pgq worker")):
        assert got[key]["handled"] == 200, got[key]  # every handler ran once, in the adapter's process
    assert got[("keyed", "pgq worker")]["most_running_per_key"] == 1  # the limit held
    table = (tmp_path / "out" / "peers.md").read_text()
    assert "| pgq async worker | 2 |" in table and "| pgq worker, no limit |" in table
    assert json.loads((tmp_path / "out" / "peers.json").read_text())["samples"] == res["samples"]
    page = readme.read_text()
    assert page.startswith("before\n") and page.endswith("after\n") and "not run yet" not in page
    assert "| raw b10 | 2 |" in page
