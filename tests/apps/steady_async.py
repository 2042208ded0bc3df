"""steady.py on an AsyncWorker: the same settings (and STEADY_SKEW) and kind, with an
``async def`` handler."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from steady import SETTINGS  # noqa: E402  (also applies STEADY_SKEW)

from pgq_thin import AsyncWorker, Job, JobContext  # noqa: E402

worker = AsyncWorker(**SETTINGS)


@worker.handler("work")
async def work(job: Job, ctx: JobContext) -> dict[str, Any]:
    seconds = float(job.payload.get("seconds", 0))
    logging.getLogger("steady").info("working on job %s attempt %s for %ss", job.id, job.attempt, seconds)
    await asyncio.sleep(seconds)
    return {"pid": os.getpid(), "attempt": job.attempt}


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(worker.run())
