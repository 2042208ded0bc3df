"""A handler's own transaction: what JobContext.transaction returns. The handler writes its tables
through the connection it yields, and the block's end runs pgq.complete in that same transaction,
so the job's effect and its completion commit together or not at all (JobContext.transaction says
how it behaves). It knows the context only by TransactionSeam, the few calls it makes of it (the
context's grant / refused / commit_failed settle the job through the held-jobs registry), so this
module imports nothing of the context's."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager, AbstractContextManager, asynccontextmanager, contextmanager
from types import TracebackType
from typing import Any, Protocol

import psycopg

from pgq_thin import calls, encryption
from pgq_thin.async_client import AsyncClient
from pgq_thin.client import Client
from pgq_thin.errors import LeaseLost, PgqError, translated
from pgq_thin.models import Job

__all__ = ["HandlerTransaction", "TransactionSeam"]


class TransactionSeam(Protocol):
    """What a handler's transaction asks of its job's context (JobContext)."""

    job: Job
    client: Any
    completed: bool

    def may_begin(self) -> None:
        """Raise when a block may not begin (the job completed already, or no longer ours)."""

    def grant(self) -> bool | None:
        """The job's one settling call: True (ours to complete), False (not), None (ask again)."""

    def ungrant(self) -> None:
        """The completion surely did not commit: the job is held again."""

    def refused(self) -> LeaseLost:
        """The error a refused completion raises (lease_lost is set)."""

    def commit_failed(self, exc: psycopg.Error) -> PgqError:
        """The error a failed COMMIT raises."""


class HandlerTransaction:
    """What JobContext.transaction returns: ``with`` it on a Worker, ``async with`` it on an
    AsyncWorker; either yields a psycopg connection (Connection / AsyncConnection) in a
    transaction whose end completes the job. ``result`` (settable until the block ends) is the
    job's result."""

    def __init__(self, context: TransactionSeam, result: Any = None) -> None:
        self._context = context
        self.result = result
        self._completion()  # a result JSON cannot carry: BadArgument now, before the block
        self._entered: AbstractContextManager[Any] | AbstractAsyncContextManager[Any] | None = None

    def _completion(self) -> calls.Call[bool]:
        job = self._context.job
        call = calls.complete(job.id, job.attempt, self.result)
        ring = getattr(self._context.client, "keyring", None)  # a worker with keys: the result encrypted
        return call if ring is None else encryption.sealed(ring, "complete", call)

    def _enter(self, manager: Any) -> Any:
        if self._entered is not None:
            raise RuntimeError("a ctx.transaction() is entered once: call ctx.transaction() again for another")
        self._entered = manager
        return manager

    # On a Worker ---------------------------------------------------------------------------------

    def __enter__(self) -> psycopg.Connection[Any]:
        client = self._context.client
        if not isinstance(client, Client):
            raise TypeError("on an AsyncWorker, use `async with ctx.transaction() as conn` in an async def handler")
        manager: AbstractContextManager[psycopg.Connection[Any]] = self._enter(self._block(client))
        return manager.__enter__()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool | None:
        assert isinstance(self._entered, AbstractContextManager)
        return self._entered.__exit__(kind, exc, tb)

    @contextmanager
    def _block(self, client: Client) -> Iterator[psycopg.Connection[Any]]:
        context = self._context
        context.may_begin()
        with translated():
            borrowed = client.pool.connection()
            conn = borrowed.__enter__()
        try:
            leaving = False  # the block ended: what psycopg raises from now on is the completion's
            try:
                with conn.transaction():
                    yield conn
                    leaving = True
                    self._complete(client, conn)
            except psycopg.Error as exc:
                if not leaving:
                    raise  # the handler's own statement: as psycopg raised it
                raise context.commit_failed(exc) from exc
            context.completed = True
        finally:
            borrowed.__exit__(None, None, None)

    def _complete(self, client: Client, conn: psycopg.Connection[Any]) -> None:
        """pgq.complete in the block's transaction; LeaseLost (which rolls it back) when refused."""
        context = self._context
        call = dataclasses.replace(self._completion(), conn=conn)
        while (granted := context.grant()) is None:
            time.sleep(0.002)  # a renewal answers within one round trip
        if not granted:
            raise context.refused()
        try:
            ours = client._send(call)
        except BaseException:
            context.ungrant()  # not committed: the transaction rolls back with this error
            raise
        if not ours:
            raise context.refused()

    # On an AsyncWorker ---------------------------------------------------------------------------

    async def __aenter__(self) -> psycopg.AsyncConnection[Any]:
        client = self._context.client
        if not isinstance(client, AsyncClient):
            raise TypeError("on a Worker, use `with ctx.transaction() as conn` (async with is for an AsyncWorker)")
        manager: AbstractAsyncContextManager[psycopg.AsyncConnection[Any]] = self._enter(self._ablock(client))
        return await manager.__aenter__()

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool | None:
        assert isinstance(self._entered, AbstractAsyncContextManager)
        return await self._entered.__aexit__(kind, exc, tb)

    @asynccontextmanager
    async def _ablock(self, client: AsyncClient) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        context = self._context
        context.may_begin()
        await client.open()
        with translated():
            borrowed = client.pool.connection()
            conn = await borrowed.__aenter__()
        try:
            leaving = False
            try:
                async with conn.transaction():
                    yield conn
                    leaving = True
                    await self._acomplete(client, conn)
            except psycopg.Error as exc:
                if not leaving:
                    raise
                raise context.commit_failed(exc) from exc
            context.completed = True
        finally:
            await borrowed.__aexit__(None, None, None)

    async def _acomplete(self, client: AsyncClient, conn: psycopg.AsyncConnection[Any]) -> None:
        context = self._context
        call = dataclasses.replace(self._completion(), conn=conn)
        while (granted := context.grant()) is None:
            await asyncio.sleep(0.002)
        if not granted:
            raise context.refused()
        try:
            ours = await client._send(call)
        except BaseException:
            context.ungrant()
            raise
        if not ours:
            raise context.refused()

    def __repr__(self) -> str:
        job = self._context.job
        return f"<the transaction of job {job.id}, attempt {job.attempt}>"
