"""A worker app for the kill -9 tests of ctx.transaction() (tests/worker/test_handler_transaction.py):
one kind, ``effect``, whose handler writes a row of ``effects`` (job id, attempt) in
ctx.transaction(result={"attempt": ...}). Its first attempt logs each step (``job ID attempt N at
STEP``: before_write, after_write, after_commit) and, at the step ``payload["pause"]`` names,
waits there (for the test's kill). TRANSACTIONAL_LEASE (seconds, default 2) is the worker's lease.
transactional_async.py is the same app on an AsyncWorker.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from pgq_thin import Job
from pgq_thin.worker import JobContext, Worker

#: The worker's settings, for either runtime.
SETTINGS: dict[str, Any] = {
    "concurrency": 2,
    "name": f"transactional-{os.getpid()}",
    "lease": float(os.environ.get("TRANSACTIONAL_LEASE", "2")),
    "poll_interval": 0.2,
    "sweep_interval": 1.0,
    "shutdown_timeout": 10.0,
}
INSERT = "INSERT INTO effects (job_id, attempt) VALUES (%s, %s)"
PAUSE = 60.0  # longer than any test waits: the kill comes first

worker = Worker(["default"], **SETTINGS)


def step(job: Job, name: str) -> None:
    """Log the step; on the first attempt, wait at the one the payload names."""
    logging.getLogger("transactional").info("job %s attempt %s at %s", job.id, job.attempt, name)
    if job.attempt == 1 and job.payload.get("pause") == name:
        threading.Event().wait(PAUSE)


@worker.handler("effect")
def effect(job: Job, ctx: JobContext) -> None:
    with ctx.transaction(result={"attempt": job.attempt}) as conn:
        step(job, "before_write")
        conn.execute(INSERT, (job.id, job.attempt))
        step(job, "after_write")
    step(job, "after_commit")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    worker.run()
