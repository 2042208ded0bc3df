# Generated from pgq_thin/worker/owner.py by scripts/async_to_sync.py: do not edit. Edit the
# asyncio source, then run the script (tests/worker/test_worker_generated.py fails while this is stale).
"""The thread runtime's OwnerCalls: made of the asyncio AsyncOwnerCalls
(pgq_thin.worker.owner), blocking a thread instead of awaiting."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from pgq_thin.client import Client
from pgq_thin.errors import PgqError
from pgq_thin.models import Job
from pgq_thin.worker.held import BUSY, GRANTED, Held, HeldJobs, discarded
from pgq_thin.worker.outcomes import Outcome, failed_as, refused_instead
from pgq_thin.worker.owner import COMPLETION_LOCK_TIMEOUT, COMPLETION_STATEMENT_TIMEOUT, released
from pgq_thin.worker.support import Flags, JobLog, Repeat, log
from pgq_thin.worker.threads.waits import nap, sleep

__all__ = ["OwnerCalls"]


class OwnerCalls:
    """Makes owner calls for the jobs in ``held`` through ``client``, bounded (``bounded``: the
    client's calls, each with COMPLETION_LOCK_TIMEOUT and COMPLETION_STATEMENT_TIMEOUT). ``flags``:
    a hard stop or the end of the run ends the repeating."""

    def __init__(self, client: Client, held: HeldJobs, flags: Flags, worker_name: str) -> None:
        self.client = client
        self.bounded = client.bounded(COMPLETION_LOCK_TIMEOUT, COMPLETION_STATEMENT_TIMEOUT)
        self.held = held
        self.flags = flags
        self.worker_name = worker_name

    def settle(self, held: Held, outcome: Outcome) -> None:
        """Record ``outcome`` with one call, unless the job is no longer ours (or a renewal is in
        flight: then wait for it). While the connection is down the call is repeated with the
        same attempt (every owner operation is idempotent for its attempt) until it answers, so a
        finished job is never lost. (Renewing meanwhile would be pointless: it needs the same
        server.) The job is forgotten afterwards."""
        try:
            if not self.granted(held):
                discarded(held, outcome.operation, outcome.raised)
                return
            try:
                answer = self.until_answered(outcome.operation, held.log,
                                                   lambda: outcome.send(self.bounded, held.job))
            except Exception as exc:  # noqa: BLE001
                self.refused(outcome.operation, held, exc, outcome.raised)
                return
            if (answer is None or answer is False) and self.held.cancel_noticed(held):
                held.log.about_outcome(logging.INFO, outcome.raised,
                                       "%s refused: the job was cancelled (pgq.cancel) while it ran", outcome.operation)
            else:
                outcome.answered(held.log, answer)
        finally:
            self.held.forget([held])

    def granted(self, held: Held) -> bool:
        """The registry's settle(), waiting out a renewal in flight."""
        while (verdict := self.held.settle(held)) is BUSY:
            sleep(0.002)  # a renewal answers within one round trip
        return verdict is GRANTED

    def until_answered(self, operation: str, jlog: JobLog, call: Callable[[], Any]) -> Any:
        repeat = Repeat(operation, jlog, self.flags)
        while True:
            try:
                return call()
            except Exception as exc:
                delay = repeat.after(exc)
                self.drop_broken_connections()
                nap(delay, self.flags)

    def refused(self, operation: str, held: Held, exc: Exception,
                      raised: BaseException | None = None) -> None:
        """The outcome call failed for good: we are exiting, or it was refused. Then fail the
        attempt, not retryable, so that someone looks at it (refused_instead). If nothing
        answers, the lease recovers the job."""
        jlog, job = held.log, held.job
        instead = refused_instead(operation, exc, jlog, raised)
        if instead is None:
            return
        try:
            state = self.until_answered("fail", jlog, lambda: instead.send(self.bounded, job))
            jlog.info("recorded as a failure instead: %s", failed_as(state))
        except Exception as again:  # noqa: BLE001
            jlog.error("fail refused too (%s); the lease will recover the job", again)

    def give_back(self, job: Job, why: str) -> None:
        """pgq.release: pending again now, the attempt not counted. One try: if it does not
        answer, the lease expires and the job is recovered anyway."""
        try:
            released(job, self.bounded.release(job.id, job.attempt), why)
        except PgqError as exc:
            JobLog(job).warning("release failed (%s); the lease will recover the job", exc)

    def give_back_unstarted(self, held: Held, why: str) -> None:
        """A held job that no slot started: give it back (unless it is settled already) and
        forget it."""
        if self.granted(held):
            self.give_back(held.job, why)
        self.held.forget([held])

    def drop_broken_connections(self) -> None:
        """After a connection error, test the pool's idle connections and replace the dead ones,
        so that the next call does not pick another connection the server has already closed."""
        if not self.flags.done.is_set():
            try:
                self.client.pool.check()
            except Exception as exc:  # noqa: BLE001 - best effort; the next call reports real trouble
                log.debug("pool check failed: %s", exc, extra={"worker": self.worker_name})
