"""A Starlette (or FastAPI) app that runs an AsyncWorker in its lifespan and enqueues from its
requests. Run it with ``uvicorn examples.starlette_app:app`` (PGQ_DSN names the database)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from pgq_thin import AsyncClient, AsyncWorker, Job, JobContext


def make_app(dsn: str) -> Starlette:
    worker = AsyncWorker(queues=["emails"], concurrency=10)

    @worker.handler("send_welcome")
    async def send_welcome(job: Job, ctx: JobContext) -> None:
        await asyncio.sleep(0.2)  # stands for: await mailer.send(job.payload["user_id"])

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with AsyncClient(dsn) as client:  # one pool for the requests' enqueues
            app.state.pgq = client
            # The server owns SIGTERM / SIGINT: the worker installs no handlers of its own.
            running = asyncio.create_task(worker.run(dsn, install_signal_handlers=False))
            try:
                yield
            finally:
                worker.stop()  # graceful: no new claims, the running jobs finish
                await running  # (raises what run() raised, e.g. a database it could not reach)

    async def signup(request: Request) -> JSONResponse:
        user_id = (await request.json())["user_id"]
        job_id = await request.app.state.pgq.enqueue("emails", "send_welcome", {"user_id": user_id})
        return JSONResponse({"job_id": job_id}, status_code=202)

    return Starlette(routes=[Route("/signup", signup, methods=["POST"])], lifespan=lifespan)


app = make_app(os.environ.get("PGQ_DSN", "postgresql:///app"))
