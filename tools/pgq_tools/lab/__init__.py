"""The acceptance lab: the correctness playbook for a SKIP LOCKED queue, run for real against
pgq's own functions, writing an evidence directory (see docs/lab.md).

``run_lab(out_dir, dsn=None)`` runs every experiment, each in a fresh database made from a
migrated template, writes the evidence and returns the process exit code: 0 only when every
experiment passes. Without ``dsn`` it starts a throwaway PostgreSQL and stops it at the end; with
one it creates (and drops) its own databases on that server, so the role needs CREATEDB.
"""

from __future__ import annotations

import logging
import sys
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime
from types import ModuleType
from typing import Any

import psycopg

from pgq_thin.testing.server import Databases
from pgq_tools.lab import (
    exp1_claim_boundary,
    exp2_lock_modes,
    exp3_ordering,
    exp4_starvation,
    exp5_long_work,
    exp6_abandoned_claim,
    exp7_duplicate_effect,
    exp8_query_plans,
    exp9_schedule_firing,
    exp10_hung_handler,
    exp11_key_limits,
    exp12_dependencies,
    exp13_batches,
    exp14_durable_kill,
    exp15_priority_aging,
)
from pgq_tools.lab.harness import Check, Harness, Step, Verdict, utcnow
from pgq_tools.lab.statements import TEMPLATES

__all__ = ["EXPERIMENTS", "ExperimentResult", "run_experiment", "run_lab"]

log = logging.getLogger("pgq_tools.lab")

#: Every experiment, in order. Each module has NUMBER, SLUG, TITLE, BASIS, HYPOTHESIS, PROCEDURE,
#: CONDITION and run(harness) -> Verdict.
EXPERIMENTS: list[ModuleType] = [
    exp1_claim_boundary,
    exp2_lock_modes,
    exp3_ordering,
    exp4_starvation,
    exp5_long_work,
    exp6_abandoned_claim,
    exp7_duplicate_effect,
    exp8_query_plans,
    exp9_schedule_firing,
    exp10_hung_handler,
    exp11_key_limits,
    exp12_dependencies,
    exp13_batches,
    exp14_durable_kill,
    exp15_priority_aging,
]


@dataclass
class ExperimentResult:
    module: ModuleType
    verdict: Verdict
    steps: list[Step]
    transcript: list[tuple[datetime, str]]
    started_at: datetime
    ended_at: datetime
    database: str = ""
    error: str | None = None
    jobs: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.error is None and self.verdict.passed

    @property
    def name(self) -> str:
        return f"experiment-{self.module.NUMBER}-{self.module.SLUG}"

    def failures(self) -> list[Check]:
        return [c for c in self.verdict.checks if not c.passed]


def _rows(conn: psycopg.Connection, query: str) -> list[dict[str, Any]]:
    cur = conn.execute(query)
    cols = [d.name for d in cur.description or []]
    return [dict(zip(cols, r)) for r in cur.fetchall()]


def run_experiment(module: ModuleType, dsn: str, *, database: str = "") -> ExperimentResult:
    """Run one experiment against dsn (a database with pgq installed and nothing else in it)."""
    started = utcnow()
    h = Harness(dsn, experiment=f"{module.NUMBER}-{module.SLUG}", templates=TEMPLATES)
    error = None
    verdict = Verdict()
    try:
        verdict = module.run(h)
    except Exception:  # noqa: BLE001 - an experiment that crashes is a FAIL with its traceback
        error = traceback.format_exc()
        verdict.check("the experiment ran to the end", False, error.strip().splitlines()[-1])
    finally:
        h.close()
    ended = utcnow()
    jobs: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    if getattr(module, "DUMP_JOBS", True):
        with psycopg.connect(dsn, autocommit=True) as conn:
            jobs = _rows(conn, "SELECT * FROM pgq.jobs ORDER BY id")
            events = _rows(conn, "SELECT * FROM pgq.job_events ORDER BY id")
    return ExperimentResult(module, verdict, h.steps, h.transcript, started, ended, database,
                            error, jobs, events)


def run_lab(out_dir: str, dsn: str | None = None, *, experiments: list[ModuleType] | None = None) -> int:
    """Run the lab and write the evidence directory. Returns the process exit code: 0 when every
    experiment passed, 1 when one failed, 2 when the lab itself could not run (the traceback is
    printed to stderr)."""
    from pgq_thin.migrate import migrate
    from pgq_tools.lab import report

    t0 = time.monotonic()
    started = utcnow()
    results: list[ExperimentResult] = []
    try:
        server = Databases(dsn, prefix=f"pgq_lab_{int(time.time())}")
    except Exception:  # noqa: BLE001 - no server: report it, as an exit code
        traceback.print_exc(file=sys.stderr)
        return 2
    try:
        template = f"{server.prefix}_template"
        template_dsn = server.create(template)
        migrate(template_dsn)
        context = report.collect_context(template_dsn)
        for module in experiments or EXPERIMENTS:
            name = f"{server.prefix}_{module.NUMBER}"
            db_dsn = server.create(name, template)
            try:
                result = run_experiment(module, db_dsn, database=name)
            finally:
                server.drop(name)
            results.append(result)
            log.info("experiment %s %s: %s (%.1fs)", module.NUMBER, module.SLUG,
                     "PASS" if result.passed else "FAIL", (result.ended_at - result.started_at).total_seconds())
        context.update(started_at=started, duration_s=time.monotonic() - t0,
                       server_mode="throwaway server (pgq_thin.testing.server)" if dsn is None
                       else "the server given by --dsn (databases created and dropped by the lab)",
                       template=template)
        report.write(out_dir, results, context)
    except Exception:  # noqa: BLE001
        traceback.print_exc(file=sys.stderr)
        return 2
    finally:
        server.close()
    passed = sum(r.passed for r in results)
    log.info("%d/%d experiments passed; evidence in %s", passed, len(results), out_dir)
    return 0 if results and passed == len(results) else 1
