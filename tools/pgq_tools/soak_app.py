"""The handlers the chaos soak's worker processes run (pgq-thin worker --app pgq_tools.soak_app:worker).

Each execution of a job writes one row to the soak's effects ledger (``pgq_soak.effects``): the
stand-in for an outside effect, deliberately *not* fenced by the job's attempt, so that the soak
can count how often an effect happened more than once and check that every such duplicate is
explained by pgq.job_events. The row carries a token unique to the execution, so a ledger write
repeated after a lost connection never counts twice, while two executions of the same attempt
(two live owners) would show as two rows.

Settings come from the environment (the soak sets them): PGQ_SOAK_WORKER (the worker's name),
PGQ_SOAK_LEASE (seconds, default 2), PGQ_SOAK_CONCURRENCY (default 4).
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

from pgq_thin.models import Job
from pgq_thin.worker import JobContext, Worker

QUEUE = "soak"

worker = Worker(
    queues=[QUEUE],
    concurrency=int(os.environ.get("PGQ_SOAK_CONCURRENCY", "4")),
    name=os.environ.get("PGQ_SOAK_WORKER"),
    lease=float(os.environ.get("PGQ_SOAK_LEASE", "2")),
    poll_interval=0.3,
    sweep_interval=1.0,
    shutdown_timeout=5.0,
)

#: How long the handler keeps trying to write its ledger row through connection kills and a
#: server restart before it gives up (and the attempt fails, which the soak reports).
LEDGER_PATIENCE = 60.0


def _write_effect(job: Job, ctx: JobContext) -> None:
    token = str(uuid.uuid4())
    deadline = time.monotonic() + LEDGER_PATIENCE
    while True:
        try:
            with ctx.client.pool.connection() as conn:
                conn.execute(
                    "INSERT INTO pgq_soak.effects (job_id, attempt, worker, token) VALUES (%s, %s, %s, %s)"
                    " ON CONFLICT (token) DO NOTHING",
                    (job.id, job.attempt, ctx.worker_name, token))
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@worker.handler("soak.work")
def work(job: Job, ctx: JobContext) -> dict[str, Any] | None:
    """The effect first, then the payload's work time (some jobs outlive their lease: the worker
    renews it; the soak's pauses and kills are what make a lease actually expire)."""
    _write_effect(job, ctx)
    time.sleep(job.payload.get("ms", 5) / 1000)
    # Odd ids return a result (one pgq.complete each), even ids None: the worker's completer
    # records those in batches (pgq.complete_many), so both paths go through the chaos.
    return {"attempt": job.attempt} if job.id % 2 else None
