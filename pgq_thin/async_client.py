"""The asyncio client: one ``async def`` method per pgq SQL function, over a
psycopg_pool.AsyncConnectionPool; the same names, arguments and typed results as Client, since
both send the descriptions in pgq_thin.calls.

    async with AsyncClient(dsn) as client:
        job_id = await client.enqueue("default", "send_email", {"to": "a@example.com"})

Producers can pass ``conn=`` (a psycopg.AsyncConnection) to enqueue inside their own transaction.
``await client.wait(job_id, timeout=...)`` waits for a job to end, as Client.wait does.
"""

from __future__ import annotations

import asyncio
import inspect
import weakref
from collections.abc import AsyncIterator, Mapping
from contextlib import aclosing, asynccontextmanager
from typing import Any, TypeVar

import psycopg
from psycopg_pool import AsyncConnectionPool

from pgq_thin import queries
from pgq_thin.calls import READING, Call, Interval, PgqCalls
from pgq_thin.client import DRIVER_CONNECTION, WAIT_POLL_INTERVAL, Bounds, Waiting, resolve_dsn
from pgq_thin.encryption import KeyRing, key_ring
from pgq_thin.errors import InvalidArgument, translated
from pgq_thin.migrate import awarn_if_schema_is_old
from pgq_thin.models import JobResult

__all__ = ["AsyncClient"]

T = TypeVar("T")


class AsyncBoundedCalls(PgqCalls):
    """The calls of an AsyncClient, each sent bounded (AsyncClient.bounded)."""

    def __init__(self, client: AsyncClient, bounds: Bounds) -> None:
        self.client = client
        self.bounds = bounds

    @property
    def keyring(self) -> KeyRing | None:
        """The client's key ring (pgq_thin.encryption): its calls encrypt and decrypt as its own."""
        return self.client.keyring

    async def _send(self, call: Call[T]) -> T:
        return await self.client._send(call, self.bounds)


class AsyncClient(PgqCalls):
    """A pgq client for asyncio: one ``async`` method per pgq function (pgq_thin.calls describes
    each; awaiting ``client.name(...)`` gives what Client.name returns). Each call borrows a
    pooled connection (or uses ``conn=``). The pool opens on first use (or with
    ``await client.open()`` / ``async with``)."""

    def __init__(self, dsn: str | None = None, *, pool: AsyncConnectionPool | None = None,
                 min_size: int = 1, max_size: int = 8, prepare: bool = True, pooled: bool = False,
                 keys: Mapping[str, bytes] | None = None, encrypt_with: str | None = None) -> None:
        """The arguments of Client (``pooled=True``: behind a transaction-pooling proxy, no
        server-side prepared statements; ``keys`` and ``encrypt_with``: encrypted payloads and
        results). A ``pool`` passed in (autocommit connections) is the caller's to open and close."""
        self.keyring = key_ring(keys, encrypt_with)
        self.pooled = pooled
        self._prepare = prepare and not pooled
        self._schema_seen: weakref.WeakSet[psycopg.AsyncConnection[Any]] = weakref.WeakSet()
        self._owns_pool = pool is None
        self._opened = not self._owns_pool
        self.pool = pool if pool is not None else AsyncConnectionPool(
            resolve_dsn(dsn), min_size=min_size, max_size=max_size,
            kwargs={"autocommit": True, "context": READING, **({"prepare_threshold": None} if pooled else {})},
            name="pgq_thin", open=False)
        self.dsn = self.pool.conninfo

    async def open(self) -> None:
        """Open the pool (a pool passed in is the caller's to open)."""
        if not self._opened:
            await self.pool.open()
            self._opened = True

    async def close(self) -> None:
        if self._owns_pool:
            await self.pool.close()

    async def __aenter__(self) -> AsyncClient:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def wait(self, job_id: int, timeout: Interval | None = None, *,
                   poll_interval: Interval = WAIT_POLL_INTERVAL) -> JobResult:
        """Wait for the job to end and return its pgq.job_result: Client.wait, awaited (WaitTimeout
        when it has not ended within ``timeout``)."""
        waiting = Waiting(job_id, timeout, poll_interval, self.keyring)
        await self.open()
        async with self._finished_listener(waiting) as conn:
            while True:
                seen = await self._send(waiting.on(conn))
                if seen.finished:
                    return seen
                pause = waiting.pause(seen)
                if conn is None:
                    await asyncio.sleep(pause)
                    continue
                with translated():
                    async with aclosing(conn.notifies(timeout=pause)) as notifies:
                        async for notify in notifies:
                            if waiting.notified(notify.payload):
                                break

    @asynccontextmanager
    async def _finished_listener(self, waiting: Waiting) -> AsyncIterator[psycopg.AsyncConnection[Any] | None]:
        """A connection of its own LISTENing on pgq_finished (None behind a pooling proxy)."""
        if self.pooled:
            yield None
            return
        pool = self.pool
        # A pool's conninfo and kwargs may be functions, or coroutine functions, that make them.
        conninfo = await _made(pool.conninfo)
        kwargs = await _made(pool.kwargs)
        with translated():
            conn = await pool.connection_class.connect(conninfo, **waiting.listen_kwargs(kwargs))
        try:
            with translated():
                await conn.execute(queries.LISTEN_FINISHED)
            yield conn
        finally:
            await conn.close()

    def bounded(self, lock_timeout: Interval, statement_timeout: Interval) -> AsyncBoundedCalls:
        """This client's calls, each bounded: Client.bounded, awaited."""
        return AsyncBoundedCalls(self, Bounds.of(lock_timeout, statement_timeout))

    # The one place a statement is sent ----------------------------------------------------------

    async def _send(self, call: Call[T], bounds: Bounds | None = None) -> T:
        """Send one call and read its result (``bounds``: in a transaction of its own, bounded)."""
        conn = call.conn
        if conn is not None and not isinstance(conn, psycopg.AsyncConnection):
            raise InvalidArgument(f"conn must be a psycopg.AsyncConnection, got {type(conn).__name__} (a "
                                  f"Connection goes with Client); {DRIVER_CONNECTION}")
        await self.open()
        with translated():
            if conn is not None:
                return await self._execute(conn, call)
            async with self.pool.connection() as pooled:
                # Once per database and process, asked once per connection (as Client does).
                if pooled not in self._schema_seen and await awarn_if_schema_is_old(pooled):
                    self._schema_seen.add(pooled)
                if bounds is not None:
                    return await self._bounded(pooled, call, bounds)
                return await self._execute(pooled, call)

    async def _bounded(self, conn: psycopg.AsyncConnection[Any], call: Call[T], bounds: Bounds) -> T:
        try:
            async with conn.pipeline():  # bounded_rows, awaited
                prepare = self._prepare
                await conn.execute(queries.BEGIN, prepare=prepare)
                await conn.execute(queries.CALL_BOUNDS, bounds.params(), prepare=prepare)
                cur = conn.cursor()
                if call.rows is not None:
                    cur.row_factory = call.rows  # type: ignore[assignment]  # (as in _execute)
                await cur.execute(call.query, call.params, prepare=prepare)
                await conn.execute(queries.COMMIT, prepare=prepare)
        except psycopg.Error:
            if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                await conn.execute(queries.ROLLBACK)
            raise
        return call.read(await cur.fetchall())

    async def _execute(self, conn: psycopg.AsyncConnection[Any], call: Call[T]) -> T:
        cur = conn.cursor()
        if call.rows is not None:
            cur.row_factory = call.rows  # type: ignore[assignment]  # psycopg's factories serve both cursors
        await cur.execute(call.query, call.params, prepare=self._prepare)
        return call.read(await cur.fetchall())


async def _made(setting: Any) -> Any:
    """A pool's setting: the value, or what the function (or coroutine function) given makes."""
    if callable(setting):
        setting = setting()
        if inspect.isawaitable(setting):
            setting = await setting
    return setting
