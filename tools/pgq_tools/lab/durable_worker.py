"""Experiment 14's worker process: ``python -m pgq_tools.lab.durable_worker DSN NAME`` runs a
pgq_thin Worker (concurrency 1, a 1-second lease) whose handler ``five_steps`` is a five-step
durable workflow. Each step (``ctx.step(..., transaction=True)``) writes one row of
lab_step_runs in the transaction that records it. Attempt ``a`` of the job (while ``a`` is at
most the payload's ``kills``) stops where the experiment kills it: an odd attempt ``2k + 1`` at
step boundary ``k`` (0: before the first step, 5: after the last), an even one ``2n`` inside
step ``n``'s transaction, after the step's write and before its record. There it writes a row of
lab_stops (committed, on a connection of its own) and waits for ever, for the kill -9."""

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
        stop_at(job, "inside", n)  # the write is not committed yet: a kill here rolls it back
        return {"step": n, "attempt": job.attempt}

    def stop_at(job: Job, where: str, n: int) -> None:
        """Wait for the kill when this attempt is to be killed here (``where`` "boundary" after step
        ``n``, or "inside" step ``n``)."""
        attempt = job.attempt
        if attempt > job.payload["kills"]:
            return
        if (where, n) == (("boundary", (attempt - 1) // 2) if attempt % 2 else ("inside", attempt // 2)):
            marks.execute("INSERT INTO lab_stops (job_id, attempt, place, step, pid) VALUES (%s, %s, %s, %s, %s)",
                          (job.id, attempt, where, n, os.getpid()))
            threading.Event().wait()  # until the experiment's kill -9

    @worker.handler("five_steps")
    def five_steps(job: Job, ctx: JobContext) -> Any:
        results = []
        for n in range(1, STEPS + 1):
            stop_at(job, "boundary", n - 1)
            results.append(ctx.step(f"step-{n}", step_body, job, n, transaction=True))
        stop_at(job, "boundary", STEPS)
        return {"steps": results}

    worker.run(dsn)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
