"""The acceptance lab: every experiment must PASS against the real pgq functions, and run_lab must
write the complete evidence package."""

from __future__ import annotations

import csv
import re
from pathlib import Path
from types import ModuleType

import psycopg
import pytest

from pgq_thin.lab import EXPERIMENTS, run_experiment, run_lab
from pgq_thin.lab.report import COMMON_FILES, STEP_COLUMNS


@pytest.mark.parametrize("module", EXPERIMENTS, ids=lambda m: f"{m.NUMBER}-{m.SLUG}")
def test_experiment_passes(module: ModuleType, dsn: str) -> None:
    result = run_experiment(module, dsn)
    problems = [f"{c.label}: {c.observed}" for c in result.failures()]
    assert result.error is None, result.error
    assert result.passed, "\n".join(problems)
    assert result.verdict.observation, "an experiment must write its observation from the data"


def test_run_lab_writes_the_evidence_package_with_a_pass_row_per_experiment(
        tmp_path: Path, pg_server, admin_dsn: str) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "evidence"
    rc = run_lab(str(out), dsn=pg_server.dsn_for("postgres"))
    failed = [line for line in (out / "acceptance.md").read_text().splitlines() if "FAIL" in line]
    assert rc == 0, "\n".join(failed)

    expected = list(COMMON_FILES) + [f"experiment-{m.NUMBER}-{m.SLUG}.{ext}" for m in EXPERIMENTS
                                     for ext in ("csv", "txt")]
    missing = [name for name in expected if not (out / name).is_file() or (out / name).stat().st_size == 0]
    assert not missing, f"missing or empty evidence files: {missing}"

    acceptance = (out / "acceptance.md").read_text()
    rows = [line for line in acceptance.splitlines() if re.match(r"^\| \d+ \|", line)]
    assert len(rows) == len(EXPERIMENTS) == 10
    assert all(line.rstrip().endswith("| PASS |") for line in rows), rows
    assert "not observed" not in acceptance and "not executed" not in acceptance.lower()
    assert re.search(r"PostgreSQL \d+", acceptance) and "duration" in acceptance

    with (out / "experiment-2-lock-modes.csv").open() as f:
        log = list(csv.DictReader(f))
    assert list(log[0]) == list(STEP_COLUMNS)
    assert any(re.fullmatch(r"blocked by worker-a \(.+\) then ok", r["outcome"]) for r in log)
    assert any("error 55P03" in r["outcome"] for r in log)

    assert "CREATE FUNCTION pgq.claim" in (out / "schema.sql").read_text()
    assert "pgq.claim(worker =>" in (out / "claim.sql").read_text()
    assert "pgq.complete(id =>" in (out / "complete.sql").read_text()
    assert "pgq.sweep(max_jobs =>" in (out / "recover.sql").read_text()
    assert "enqueue_many" in (out / "seed.sql").read_text()
    assert "jobs_ready_idx" in (out / "query-plans.txt").read_text()
    assert ",rejected," in (out / "job-events.csv").read_text()
    assert "experiment-3-ordering" in (out / "final-jobs.csv").read_text()

    # The lab dropped every database it created.
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        left = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE 'pgq_lab_%'").fetchall()
    assert left == []
