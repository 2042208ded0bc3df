"""Experiment 14's worker process: ``python -m pgq_tools.lab.durable_worker DSN NAME`` runs a
pgq_thin Worker (concurrency 1, a 1-second lease) whose handler ``five_steps`` is a five-step
durable workflow. Each step (``ctx.step(..., transaction=True)``) writes one row of
lab_step_runs in the transaction that records it. Attempt ``a`` of the job stops at step
boundary ``a - 1`` (0: before the first step, 5: after the last) while the payload's ``kills``
says that boundary is to be killed there: it writes a row of lab_boundaries (committed) and waits
for ever, for the experiment's kill -9."""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

import psycopg

from pgq_thin import Job, JobContext, Worker

QUEUE = "lab-durable"
STEPS = 5


def main(dsn: str, name: str) -> None:
    worker = Worker([QUEUE], concurrency=1, name=name, lease=1.0, poll_interval=0.05, sweep_interval=0.5,
                    prefetch=0, shutdown_timeout=1.0)
    marks = psycopg.connect(dsn, autocommit=True)

    def step_body(conn: psycopg.Connection[Any], job: Job, n: int) -> dict[str, Any]:
        conn.execute("INSERT INTO lab_step_runs (job_id, step, attempt, pid) VALUES (%s, %s, %s, %s)",
                     (job.id, n, job.attempt, os.getpid()))
        return {"step": n, "attempt": job.attempt}

    def boundary(job: Job, after: int) -> None:
        if job.attempt - 1 == after and after < job.payload["kills"]:
            marks.execute("INSERT INTO lab_boundaries (job_id, attempt, after_step, pid) VALUES (%s, %s, %s, %s)",
                          (job.id, job.attempt, after, os.getpid()))
            threading.Event().wait()  # until the experiment's kill -9

    @worker.handler("five_steps")
    def five_steps(job: Job, ctx: JobContext) -> Any:
        results = []
        for n in range(1, STEPS + 1):
            boundary(job, n - 1)
            results.append(ctx.step(f"step-{n}", step_body, job, n, transaction=True))
        boundary(job, STEPS)
        return {"steps": results}

    worker.run(dsn)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
