"""The handlers the demo's worker processes run (pgq-thin worker --app pgq_tools.demo_app:worker)."""

from __future__ import annotations

import os
import time
from typing import Any

from pgq_thin.models import Job
from pgq_thin.worker import JobContext, Worker

worker = Worker(queues=["demo"], concurrency=4, name=os.environ.get("PGQ_DEMO_WORKER"),
                poll_interval=0.5, sweep_interval=2.0, shutdown_timeout=10.0)


@worker.handler("demo.work")
def work(job: Job, ctx: JobContext) -> dict[str, Any]:
    """A short piece of work: sleeps the payload's ms."""
    time.sleep(job.payload.get("ms", 1) / 1000)
    return {"n": job.payload.get("n")}


@worker.handler("demo.slow")
def slow(job: Job, ctx: JobContext) -> dict[str, Any]:
    """Long on its first attempt (so the demo can crash or freeze its worker mid-job), quick after."""
    if job.attempt == 1:
        deadline = time.monotonic() + job.payload.get("seconds", 8)
        while time.monotonic() < deadline and not ctx.lease_lost.is_set():
            time.sleep(0.05)
    return {"attempt": job.attempt, "worker": ctx.worker_name}
