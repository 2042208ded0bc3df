"""docs/prometheus-alerts.yml and docs/grafana-dashboard.json: the rules pass promtool (check rules,
and the unit tests of tests/promtool/alerts_test.yml), every PromQL expression of the dashboard
parses, and every pgq metric either names is one the exporters really serve."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pgq_thin import metrics
from pgq_thin.worker.metrics import WorkerMetrics

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "docs" / "prometheus-alerts.yml"
DASHBOARD = ROOT / "docs" / "grafana-dashboard.json"
ALERT_TESTS = ROOT / "tests" / "promtool" / "alerts_test.yml"

needs_promtool = pytest.mark.skipif(
    shutil.which("promtool") is None,
    reason="promtool is not installed (scripts/ensure-promtool.sh installs Debian's prometheus package)")


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def dashboard_exprs() -> list[str]:
    panels = json.loads(DASHBOARD.read_text(encoding="utf-8"))["panels"]
    exprs = [t["expr"] for p in panels for t in p.get("targets", [])]
    assert len(exprs) >= 12
    return exprs


def served_series(conn) -> set[str]:
    """The sample names the queue exporter and a worker serve."""
    conn.execute("SELECT pgq.enqueue('q', 'k')")  # a queue, so that its series exist
    worker = WorkerMetrics(2)
    worker.jobs.labels("q", "k", "completed").inc()  # labelled series exist once used
    worker.duration.labels("q", "k").observe(0.1)
    names = set()
    for body in (metrics.exposition(conn)[0], generate_latest(worker.registry)):
        names |= {f.name for f in text_string_to_metric_families(body.decode())}
        names |= {s.name for f in text_string_to_metric_families(body.decode()) for s in f.samples}
    return names


@needs_promtool
def test_the_alert_rules_pass_promtool_and_their_unit_tests(tmp_path):
    checked = promtool("check", "rules", str(ALERTS), cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 4 rules found" in checked.stdout
    shutil.copy(ALERTS, tmp_path / "alerts.yml")
    shutil.copy(ALERT_TESTS, tmp_path / "alerts_test.yml")
    tested = promtool("test", "rules", "alerts_test.yml", cwd=tmp_path)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


@needs_promtool
def test_every_expression_of_the_dashboard_parses(tmp_path):
    """Each panel's query, with Grafana's variables filled in, as a recording rule for promtool."""
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"pgq:panel_{n}", "expr": expr.replace("$queue", ".*").replace("$__rate_interval", "1m")}
        for n, expr in enumerate(dashboard_exprs())]}]}
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(json.dumps(rules), encoding="utf-8")  # JSON is YAML
    checked = promtool("check", "rules", str(path), cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_dashboard_and_the_rules_name_only_metrics_that_are_served(conn):
    served = served_series(conn)
    named = set()
    for text in [*dashboard_exprs(), ALERTS.read_text(encoding="utf-8")]:
        named |= set(re.findall(r"\bpgq_[a-z_]+\b", text))
    named -= {"pgq_thin"}
    assert {"pgq_jobs", "pgq_worker_jobs_total", "pgq_health_findings", "pgq_expired_leases"} <= named
    assert named <= served, named - served
