"""transactional.py on an AsyncWorker: the same settings, kind and steps, with an ``async def``
handler and ``async with ctx.transaction()``."""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from transactional import INSERT, PAUSE, SETTINGS  # noqa: E402

from pgq_thin import AsyncWorker, Job, JobContext  # noqa: E402

worker = AsyncWorker(["default"], **SETTINGS)


async def step(job: Job, name: str) -> None:
    logging.getLogger("transactional").info("job %s attempt %s at %s", job.id, job.attempt, name)
    if job.attempt == 1 and job.payload.get("pause") == name:
        await asyncio.sleep(PAUSE)


@worker.handler("effect")
async def effect(job: Job, ctx: JobContext) -> None:
    async with ctx.transaction(result={"attempt": job.attempt}) as conn:
        await step(job, "before_write")
        await conn.execute(INSERT, (job.id, job.attempt))
        await step(job, "after_write")
    await step(job, "after_commit")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(worker.run())
