"""A worker app for the crash tests: one kind, ``work``, that sleeps ``payload["seconds"]`` (default
0) and returns its pid and attempt. Settings come from the environment:

STEADY_QUEUES (comma-separated, default "default"), STEADY_CONCURRENCY (2), STEADY_LEASE (seconds;
empty: the queue's lease), STEADY_POLL (poll interval, 0.2), STEADY_LISTEN ("1"; "0" polls only),
STEADY_SWEEP (sweep interval, 1.0), STEADY_SKEW (seconds added to this process's time.time(), for
a machine whose clock is wrong when faketime is not available). steady_async.py is the same app
on an AsyncWorker.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

_skew = float(os.environ.get("STEADY_SKEW", "0") or 0)
if _skew:
    _real_time = time.time
    time.time = lambda: _real_time() + _skew  # type: ignore[assignment]

from pgq_thin import Job  # noqa: E402
from pgq_thin.worker import JobContext, Worker  # noqa: E402

_lease = os.environ.get("STEADY_LEASE", "")
#: The worker's settings, for either runtime.
SETTINGS: dict[str, Any] = {
    "queues": os.environ.get("STEADY_QUEUES", "default"),
    "concurrency": int(os.environ.get("STEADY_CONCURRENCY", "2")),
    "name": f"steady-{os.getpid()}",
    "lease": float(_lease) if _lease else None,
    "poll_interval": float(os.environ.get("STEADY_POLL", "0.2")),
    "listen": os.environ.get("STEADY_LISTEN", "1") == "1",
    "sweep_interval": float(os.environ.get("STEADY_SWEEP", "1.0")),
    "shutdown_timeout": 10.0,
}
worker = Worker(**SETTINGS)


@worker.handler("work")
def work(job: Job, ctx: JobContext) -> dict[str, Any]:
    seconds = float(job.payload.get("seconds", 0))
    logging.getLogger("steady").info("working on job %s attempt %s for %ss", job.id, job.attempt, seconds)
    threading.Event().wait(seconds)  # not time.sleep: libfaketime breaks its absolute-deadline sleep
    return {"pid": os.getpid(), "attempt": job.attempt}


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    worker.run()
