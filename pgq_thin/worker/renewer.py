"""The renewer: extends the lease of every held job at about a third of its lease (pgq.renew), by
the database clock; a refusal means the job is no longer ours: the handler is told. Written once,
for asyncio (AsyncRenewer, read_clock); the thread runtime's Renewer is generated from it
(pgq_thin/worker/threads/renewer.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from datetime import datetime

import psycopg

from pgq_thin import queries
from pgq_thin.async_client import AsyncClient
from pgq_thin.errors import PgqError
from pgq_thin.models import Job
from pgq_thin.worker.held import Held, HeldJobs
from pgq_thin.worker.support import Delay, Flags, log, seconds
from pgq_thin.worker.waits import ASYNC, Part, Wakeup

__all__ = ["AsyncRenewer", "DatabaseClock", "read_clock", "renewal_bound"]

#: The shortest lease the worker plans with (a lease nearly run out when the job was claimed).
MIN_LEASE = 0.3


class DatabaseClock:
    """Leases are measured by the database clock, so a worker whose clock is off by minutes must
    not renew by its own: keep the offset between the two (read at start and at each sweep)."""

    def __init__(self) -> None:
        self.offset = 0.0  # database clock minus local clock, in seconds

    def observe(self, before: float, database_now: datetime, after: float) -> None:
        """Account one reading: time.time() before and after, and what the database said."""
        self.offset = database_now.timestamp() - (before + after) / 2

    def seconds_until(self, when: datetime) -> float:
        """How long, by the database clock, until ``when`` (at least MIN_LEASE)."""
        return max(when.timestamp() - (time.time() + self.offset), MIN_LEASE)

    def monotonic_of(self, when: datetime | None) -> float | None:
        """``when`` (by the database clock) on this process's time.monotonic() clock."""
        if when is None:
            return None
        return time.monotonic() + when.timestamp() - (time.time() + self.offset)

    def lease_of(self, job: Job, lease: Delay | None) -> float:
        """The lease a just-claimed job has: the worker's own, or what is left of the queue's."""
        return self.leases_of([job], lease)[0]

    def leases_of(self, jobs: Sequence[Job], lease: Delay | None) -> list[float]:
        """lease_of() for the jobs of one claim (the clock read once)."""
        if lease is not None:
            return [max(seconds(lease), MIN_LEASE)] * len(jobs)
        now = time.time() + self.offset
        return [max(job.lease_until.timestamp() - now, MIN_LEASE) for job in jobs]


def renewal_bound(lease_seconds: float) -> float:
    """How long one renewal may wait for a lock, and run (its lock_timeout and statement_timeout):
    a sixth of the lease, from 0.05 s to 5 s. A renewal that another transaction holds back (its
    job's row locked) fails then, and the renewer goes on with the other jobs."""
    return min(max(lease_seconds / 6, 0.05), 5.0)


def retry_gap(lease_seconds: float) -> float:
    """How soon a renewal that failed is tried again."""
    return min(1.0, lease_seconds / 6)


def confirm_by(held: Held) -> float:
    """When (time.monotonic()) the lease of ``held`` must have been confirmed again, or the job is
    lost if its last renewals failed (HeldJobs.unconfirmed): early enough that the renewer, whose
    next look may come after a bounded renewal and a retry's gap, tells the handler before the
    lease ends (at two thirds of the lease, for a lease up to 6 s; 6 s before its end from 30 s
    on), and late enough that the renewal due at a third of the lease, and a retry, confirm it."""
    return held.expires - renewal_bound(held.lease_seconds) - retry_gap(held.lease_seconds)


def renewed(held: Held, until: datetime | None, clock: DatabaseClock, lease: Delay | None, sent: float) -> bool:
    """Account what pgq.renew answered for ``held`` (asked at ``sent``, time.monotonic()): True when
    the job is no longer ours."""
    if until is None:  # (HeldJobs.end_renewal says why: a lost lease, or a cancel)
        return True
    held.failed = 0
    if lease is None:  # the queue's lease may have been reconfigured
        held.lease_seconds = clock.seconds_until(until)
        held.expires = time.monotonic() + held.lease_seconds
    else:  # the database counted it from a moment after we asked
        held.expires = sent + held.lease_seconds
    held.next_renew = time.monotonic() + held.lease_seconds / 3
    deadline = held.ctx.deadline_monotonic
    if deadline is not None:  # wake at the deadline (max_run_time), not after it
        held.next_renew = min(held.next_renew, deadline)
    held.log.debug("lease renewed until %s", until.isoformat())
    return False


def renewal_failed(held: Held, exc: PgqError) -> None:
    """pgq.renew did not answer: try again soon, well within the lease."""
    held.failed += 1
    held.next_renew = time.monotonic() + retry_gap(held.lease_seconds)
    held.log.warning("lease renewal failed (%s); trying again", exc)


def until_next(held: HeldJobs, now: float) -> float:
    """How long the renewer may wait for the next renewal due (0.05 s to 0.5 s)."""
    upcoming = held.next_renewal()
    wait = (upcoming if upcoming is not None else now + 0.5) - time.monotonic()
    return min(max(wait, 0.05), 0.5)


async def read_clock(clock: DatabaseClock, client: AsyncClient) -> None:
    """Read the database clock into ``clock`` (a failure leaves the offset as it was)."""
    try:
        async with client.pool.connection() as conn:
            before = time.time()
            row = await (await conn.execute(queries.CLOCK)).fetchone()
            after = time.time()
    except psycopg.Error as exc:
        log.debug("could not read the database clock: %s", exc)
        return
    if row is not None:
        clock.observe(before, row[0], after)


class AsyncRenewer(Part):
    """Renews the jobs in ``held`` through ``client`` (``lease``: the worker's own, or None for
    the queues'), until ``stop()``, a hard stop or the end of the run."""

    def __init__(self, client: AsyncClient, held: HeldJobs, clock: DatabaseClock, flags: Flags,
                 lease: Delay | None) -> None:
        super().__init__()
        self.client = client
        self.held = held
        self.clock = clock
        self.flags = flags
        self.lease = lease
        self._wake = Wakeup()  # set by stop() and wake()

    thread_name = "pgq-renew"

    def wake(self) -> None:
        """Renew what is due at once (a pgq_cancel notification made a renewal due)."""
        self._wake.set()

    def cancel_noticed(self, job_id: int, attempt: int) -> None:
        """A pgq_cancel notification named this attempt (the listener): renew it now, whose
        refusal proves the cancel."""
        if self.held.notice_cancel(job_id, attempt):
            self.wake()

    async def renew_due(self) -> float:
        """Renew every job whose renewal is due; how long until the next one is (capped at 0.5 s).
        (The asyncio runtime sends them at once, each on a pooled connection; a thread, in turn.)
        A job whose renewals failed until its lease is about to end is lost first (the handler is
        told): a renewal waits at most its bound, so a failure, not a hung call, comes first."""
        now = time.monotonic()
        jobs = self.held.jobs()
        for held in jobs:
            if held.failed and held.state == "held" and now >= confirm_by(held):
                self.held.unconfirmed(held)
        due = [held for held in jobs if held.next_renew <= now and held.state == "held"]
        if ASYNC:
            await asyncio.gather(*(self.renew(held) for held in due))
        else:
            for held in due:
                self.renew(held)
        return until_next(self.held, now)

    async def renew(self, held: Held) -> None:
        if not self.held.begin_renewal(held):
            return  # settled (its outcome is being recorded), or lost
        lost = answered = False
        bound = renewal_bound(held.lease_seconds)
        sent = time.monotonic()
        try:
            until = await self.client.bounded(bound, bound).renew(held.job.id, held.job.attempt, lease=self.lease)
            lost = renewed(held, until, self.clock, self.lease, sent)
            answered = True
        except PgqError as exc:
            renewal_failed(held, exc)
        finally:
            self.held.end_renewal(held, lost=lost, answered=answered)

    async def run(self) -> None:
        while not self._stopped.is_set() and not self.flags.hard_stop.is_set():
            await self._wake.wait(await self.renew_due())
            self._wake.clear()

    def stop(self) -> None:
        super().stop()
        self._wake.set()
