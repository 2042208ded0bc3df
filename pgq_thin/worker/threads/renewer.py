# Generated from pgq_thin/worker/renewer.py by scripts/async_to_sync.py: do not edit. Edit the
# asyncio source, then run the script (tests/worker/test_worker_generated.py fails while this is stale).
"""The thread runtime's read_clock, Renewer: made of the asyncio read_clock, AsyncRenewer
(pgq_thin.worker.renewer), blocking a thread instead of awaiting."""

from __future__ import annotations

import time

import psycopg

from pgq_thin import queries
from pgq_thin.client import Client
from pgq_thin.errors import PgqError
from pgq_thin.worker.held import Held, HeldJobs
from pgq_thin.worker.renewer import DatabaseClock, confirm_by, renewal_bound, renewal_failed, renewed, until_next
from pgq_thin.worker.support import Delay, Flags, log
from pgq_thin.worker.threads.waits import Part, Wakeup

__all__ = ["Renewer", "read_clock"]


def read_clock(clock: DatabaseClock, client: Client) -> None:
    """Read the database clock into ``clock`` (a failure leaves the offset as it was)."""
    try:
        with client.pool.connection() as conn:
            before = time.time()
            row = (conn.execute(queries.CLOCK)).fetchone()
            after = time.time()
    except psycopg.Error as exc:
        log.debug("could not read the database clock: %s", exc)
        return
    if row is not None:
        clock.observe(before, row[0], after)


class Renewer(Part):
    """Renews the jobs in ``held`` through ``client`` (``lease``: the worker's own, or None for
    the queues'), until ``stop()``, a hard stop or the end of the run."""

    def __init__(self, client: Client, held: HeldJobs, clock: DatabaseClock, flags: Flags,
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

    def renew_due(self) -> float:
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
        for held in due:
            self.renew(held)
        return until_next(self.held, now)

    def renew(self, held: Held) -> None:
        if not self.held.begin_renewal(held):
            return  # settled (its outcome is being recorded), or lost
        lost = answered = False
        bound = renewal_bound(held.lease_seconds)
        sent = time.monotonic()
        try:
            until = self.client.bounded(bound, bound).renew(held.job.id, held.job.attempt, lease=self.lease)
            lost = renewed(held, until, self.clock, self.lease, sent)
            answered = True
        except PgqError as exc:
            renewal_failed(held, exc)
        finally:
            self.held.end_renewal(held, lost=lost, answered=answered)

    def run(self) -> None:
        while not self._stopped.is_set() and not self.flags.hard_stop.is_set():
            self._wake.wait(self.renew_due())
            self._wake.clear()

    def stop(self) -> None:
        super().stop()
        self._wake.set()
