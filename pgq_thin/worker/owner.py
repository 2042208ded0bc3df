"""The owner calls: the one call that records a job's outcome (repeated with the same attempt
while the connection is down), the fallback when the server refuses it, and giving a job back
(pgq.release). Written once, for asyncio (AsyncOwnerCalls); the thread runtime's OwnerCalls is
generated from it (pgq_thin/worker/threads/owner.py)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from pgq_thin.async_client import AsyncClient
from pgq_thin.errors import PgqError
from pgq_thin.models import Job
from pgq_thin.worker.held import BUSY, GRANTED, Held, HeldJobs, discarded
from pgq_thin.worker.outcomes import Outcome, failed_as, refused_instead
from pgq_thin.worker.support import Flags, JobLog, Repeat, log
from pgq_thin.worker.waits import nap, sleep

__all__ = ["COMPLETION_LOCK_TIMEOUT", "COMPLETION_STATEMENT_TIMEOUT", "AsyncOwnerCalls", "released"]

#: The bounds of the calls that record an outcome (complete, complete_many, fail, snooze,
#: mark_unknown, release; the claim that carries completions): each runs in a transaction of its
#: own that waits at most COMPLETION_LOCK_TIMEOUT seconds for a lock (a job's row that another
#: transaction holds) and runs at most COMPLETION_STATEMENT_TIMEOUT. A call that meets them fails
#: (55P03, 57014) and is repeated with the same attempt, as when the connection is down: it never
#: hangs the part that makes it.
COMPLETION_LOCK_TIMEOUT = 5.0
COMPLETION_STATEMENT_TIMEOUT = 60.0


def released(job: Job, answer: bool, why: str) -> None:
    """Log what pgq.release answered."""
    if answer:
        JobLog(job).info("released (%s): pending again", why)
    else:
        JobLog(job).warning("release rejected: the job is no longer ours")


class AsyncOwnerCalls:
    """Makes owner calls for the jobs in ``held`` through ``client``, bounded (``bounded``: the
    client's calls, each with COMPLETION_LOCK_TIMEOUT and COMPLETION_STATEMENT_TIMEOUT). ``flags``:
    a hard stop or the end of the run ends the repeating."""

    def __init__(self, client: AsyncClient, held: HeldJobs, flags: Flags, worker_name: str) -> None:
        self.client = client
        self.bounded = client.bounded(COMPLETION_LOCK_TIMEOUT, COMPLETION_STATEMENT_TIMEOUT)
        self.held = held
        self.flags = flags
        self.worker_name = worker_name

    async def settle(self, held: Held, outcome: Outcome) -> None:
        """Record ``outcome`` with one call, unless the job is no longer ours (or a renewal is in
        flight: then wait for it). While the connection is down the call is repeated with the
        same attempt (every owner operation is idempotent for its attempt) until it answers, so a
        finished job is never lost. (Renewing meanwhile would be pointless: it needs the same
        server.) The job is forgotten afterwards."""
        try:
            if not await self.granted(held):
                discarded(held, outcome.operation, outcome.raised)
                return
            try:
                answer = await self.until_answered(outcome.operation, held.log,
                                                   lambda: outcome.send(self.bounded, held.job))
            except Exception as exc:  # noqa: BLE001
                await self.refused(outcome.operation, held, exc, outcome.raised)
                return
            if (answer is None or answer is False) and self.held.cancel_noticed(held):
                held.log.about_outcome(logging.INFO, outcome.raised,
                                       "%s refused: the job was cancelled (pgq.cancel) while it ran", outcome.operation)
            else:
                outcome.answered(held.log, answer)
        finally:
            self.held.forget([held])

    async def granted(self, held: Held) -> bool:
        """The registry's settle(), waiting out a renewal in flight."""
        while (verdict := self.held.settle(held)) is BUSY:
            await sleep(0.002)  # a renewal answers within one round trip
        return verdict is GRANTED

    async def until_answered(self, operation: str, jlog: JobLog, call: Callable[[], Awaitable[Any]]) -> Any:
        repeat = Repeat(operation, jlog, self.flags)
        while True:
            try:
                return await call()
            except Exception as exc:
                delay = repeat.after(exc)
                await self.drop_broken_connections()
                await nap(delay, self.flags)

    async def refused(self, operation: str, held: Held, exc: Exception,
                      raised: BaseException | None = None) -> None:
        """The outcome call failed for good: we are exiting, or it was refused. Then fail the
        attempt, not retryable, so that someone looks at it (refused_instead). If nothing
        answers, the lease recovers the job."""
        jlog, job = held.log, held.job
        instead = refused_instead(operation, exc, jlog, raised)
        if instead is None:
            return
        try:
            state = await self.until_answered("fail", jlog, lambda: instead.send(self.bounded, job))
            jlog.info("recorded as a failure instead: %s", failed_as(state))
        except Exception as again:  # noqa: BLE001
            jlog.error("fail refused too (%s); the lease will recover the job", again)

    async def give_back(self, job: Job, why: str) -> None:
        """pgq.release: pending again now, the attempt not counted. One try: if it does not
        answer, the lease expires and the job is recovered anyway."""
        try:
            released(job, await self.bounded.release(job.id, job.attempt), why)
        except PgqError as exc:
            JobLog(job).warning("release failed (%s); the lease will recover the job", exc)

    async def give_back_unstarted(self, held: Held, why: str) -> None:
        """A held job that no slot started: give it back (unless it is settled already) and
        forget it."""
        if await self.granted(held):
            await self.give_back(held.job, why)
        self.held.forget([held])

    async def drop_broken_connections(self) -> None:
        """After a connection error, test the pool's idle connections and replace the dead ones,
        so that the next call does not pick another connection the server has already closed."""
        if not self.flags.done.is_set():
            try:
                await self.client.pool.check()
            except Exception as exc:  # noqa: BLE001 - best effort; the next call reports real trouble
                log.debug("pool check failed: %s", exc, extra={"worker": self.worker_name})
