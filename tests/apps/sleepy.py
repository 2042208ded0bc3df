"""A worker app for the process tests: one kind, ``sleep``, that sleeps ``payload["seconds"]``.

Run it as a script (``python tests/apps/sleepy.py``) with PGQ_DSN set; ``pgq-thin worker --app``
can load ``worker`` from it too. Settings come from the environment so each test can pick them:
SLEEPY_LEASE (seconds, default 2), SLEEPY_SHUTDOWN_TIMEOUT (default 30), SLEEPY_CONCURRENCY (2).
sleepy_async.py is the same app on an AsyncWorker.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from pgq_thin import Job
from pgq_thin.worker import JobContext, Worker

#: The worker's settings, for either runtime.
SETTINGS: dict[str, Any] = {
    "concurrency": int(os.environ.get("SLEEPY_CONCURRENCY", "2")),
    "name": f"sleepy-{os.getpid()}",
    "lease": float(os.environ.get("SLEEPY_LEASE", "2")),
    "poll_interval": 0.2,
    "sweep_interval": 1.0,
    "shutdown_timeout": float(os.environ.get("SLEEPY_SHUTDOWN_TIMEOUT", "30")),
}
worker = Worker(["default"], **SETTINGS)


@worker.handler("sleep")
def sleep(job: Job, ctx: JobContext) -> dict[str, Any]:
    """Sleeps without looking at ctx: a handler that does not cooperate with shutdown."""
    logging.getLogger("sleepy").info("sleeping %ss for job %s", job.payload["seconds"], job.id)
    time.sleep(job.payload["seconds"])
    return {"slept": job.payload["seconds"], "pid": os.getpid()}


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    worker.run()
    raise SystemExit(1 if worker.stopped_at_once else 0)  # as pgq-thin worker exits
