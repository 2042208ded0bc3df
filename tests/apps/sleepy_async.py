"""sleepy.py on an AsyncWorker: the same settings and kind, with an ``async def`` handler that
sleeps without looking at ctx (a handler that does not cooperate with shutdown)."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sleepy import SETTINGS  # noqa: E402

from pgq_thin import AsyncWorker, Job, JobContext  # noqa: E402

worker = AsyncWorker(["default"], **SETTINGS)


@worker.handler("sleep")
async def sleep(job: Job, ctx: JobContext) -> dict[str, Any]:
    logging.getLogger("sleepy").info("sleeping %ss for job %s", job.payload["seconds"], job.id)
    await asyncio.sleep(job.payload["seconds"])
    return {"slept": job.payload["seconds"], "pid": os.getpid()}


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(worker.run())
    raise SystemExit(1 if worker.stopped_at_once else 0)  # as pgq-thin worker exits
