"""The heartbeat: the worker in the registry of live workers (pgq.worker_heartbeat). ``announce()``
at start registers it and reports the kinds of its queues' pending jobs that no live worker handles
(pgq.queue_kinds), which would otherwise wait unseen; the part then refreshes the entry every
``heartbeat_interval`` (alive for three intervals, at least 1 s, so one lost beat is no death) with how many jobs
it runs; ``farewell()`` at the end removes it. A database without the registry (a schema older
than migration 0026), or a login that may not heartbeat, is said once and the worker goes on
without. Written once, for asyncio (AsyncHeartbeat); the thread runtime's Heartbeat is generated
from it (pgq_thin/worker/threads/heartbeat.py)."""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence

from pgq_thin.async_client import AsyncClient
from pgq_thin.errors import PermissionDenied, PgqError
from pgq_thin.worker.claimer import UNDEFINED_FUNCTION
from pgq_thin.worker.held import HeldJobs
from pgq_thin.worker.support import Flags, log
from pgq_thin.worker.waits import Part

__all__ = ["AsyncHeartbeat"]

#: A heartbeat, and the farewell, wait at most this long for a lock and for the server.
HEARTBEAT_TIMEOUT = 5.0


class AsyncHeartbeat(Part):
    """Keeps worker ``name`` (claiming ``kinds`` from ``queues``; None: all) in the registry through
    ``client``, every ``every`` seconds (<= 0: never), with the count of ``held`` jobs."""

    thread_name = "pgq-heartbeat"

    def __init__(self, client: AsyncClient, name: str, queues: Sequence[str] | None, kinds: Sequence[str],
                 held: HeldJobs, flags: Flags, every: float) -> None:
        super().__init__()
        self.client = client.bounded(HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT)
        self.name = name
        self.queues = list(queues) if queues else None
        self.kinds = list(kinds)
        self.held = held
        self.flags = flags
        # A worker without handlers claims nothing: it has no kinds to announce (NULL would say "any").
        self.every = every if self.kinds else 0.0
        self.host = socket.gethostname()[:255] or None
        self.pid = os.getpid()
        self.registered = False

    async def beat(self, stopping: bool = False) -> None:
        """One heartbeat (or the farewell); a failure is logged, never raised."""
        try:
            await self.client.worker_heartbeat(self.name, self.queues, self.kinds,
                                               running=len(self.held.jobs()), host=self.host, pid=self.pid,
                                               alive_for=max(3 * self.every, 1.0), stopping=stopping)
            self.registered = not stopping
        except PgqError as exc:
            if exc.sqlstate == UNDEFINED_FUNCTION:
                log.warning("this database has no registry of workers (no pgq.worker_heartbeat: its pgq schema "
                            "is older than this pgq-thin; run pgq-thin migrate): this worker is not listed by "
                            "pgq.workers()", extra={"worker": self.name})
            elif isinstance(exc, PermissionDenied):
                log.warning("this login may not heartbeat (%s): this worker is not listed by pgq.workers()", exc,
                            extra={"worker": self.name})
            else:
                log.warning("heartbeat failed (%s); the next one is in %g s", exc, self.every,
                            extra={"worker": self.name})
                return
            self.every = 0.0  # said once; the worker goes on without

    async def announce(self) -> None:
        """The first heartbeat, then the report of its queues' pending kinds that no live worker
        handles (this one is in the registry by then: pgq.queue_kinds counts its kinds too)."""
        if self.every <= 0:
            return
        await self.beat()
        if not self.registered:
            return
        try:
            rows = await self.client.queue_kinds(self.queues)
        except PgqError as exc:
            log.debug("could not read the queues' pending kinds (%s)", exc, extra={"worker": self.name})
            return
        for r in rows:
            if not r.handled:
                log.warning("queue %s has pending jobs of kind %r, which no running worker handles (this one "
                            "handles %s): they wait until a worker with a handler for it starts", r.queue, r.kind,
                            ", ".join(repr(k) for k in self.kinds), extra={"worker": self.name, "queue": r.queue,
                                                                        "kind": r.kind})

    async def run(self) -> None:
        while self.every > 0 and not self.flags.done.is_set():
            if await self._stopped.wait(self.every):
                return
            await self.beat()

    async def farewell(self) -> None:
        """The last heartbeat: the entry goes."""
        if self.registered:
            await self.beat(stopping=True)
