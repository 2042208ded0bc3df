"""The held-jobs registry: every job this worker holds (claimed, and not yet recorded: waiting
for a slot, running, or its completion waiting for the next complete_many), and the one place
that decides that a job is settled once.

A held job is in one of four states. ``held``: ours, nobody is calling the server for it.
``renewing``: the renewer is extending its lease right now. ``settled``: one call that ends this
attempt (complete, fail, snooze, mark_unknown, release) was granted; nobody else gets one, and the
renewer leaves it alone. ``lost``: a renewal was refused, another attempt owns the job; whatever
the handler returns is discarded. ``settle`` is the only way into ``settled``, so a job is settled
exactly once whoever asks (the executor, the completer, the shutdown, a slot that never started
it, a handler's ctx.transaction() about to complete the job; ``unsettle`` gives that one's grant
back when its transaction surely rolled back). The registry makes no calls and never waits: a
thread runtime and an asyncio one both use it.

A pgq_cancel notification naming a held attempt is a reason to look, never proof (any login may
NOTIFY): ``notice_cancel`` makes the job's renewal due at once, and a renewal refused after it
means the job was cancelled (``ctx.cancelled``, not counted as a lost lease).
"""

from __future__ import annotations

import enum
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from pgq_thin.models import Job
from pgq_thin.worker.context import JobContext
from pgq_thin.worker.support import JobLog

__all__ = ["BUSY", "CANCEL_CHECK_GAP", "GONE", "GRANTED", "Held", "HeldJobs", "Verdict", "discarded"]

#: The least time between two renewals that pgq_cancel notifications make due for one job: a
#: flood of them (any login may NOTIFY) costs at most one renewal per held job per this many seconds.
CANCEL_CHECK_GAP = 1.0


class Verdict(enum.Enum):
    """The answer to "may I make the call that ends this attempt?"."""

    GRANTED = "granted"  # yes, and nobody else will be
    GONE = "gone"        # no: it is settled already, or no longer ours; its outcome is discarded
    BUSY = "busy"        # not now: a renewal is in flight; ask again in a moment


# The verdicts as module names: looking one up costs a tenth of Verdict.GRANTED (an Enum
# attribute), and settle() is asked once per job.
GRANTED, GONE, BUSY = Verdict.GRANTED, Verdict.GONE, Verdict.BUSY


@dataclass(eq=False, slots=True)
class Held:
    """One job while we hold it. ``lease_seconds`` and ``next_renew`` (time.monotonic()) belong
    to the renewer. ``log`` is the job's logger (made when first used: most jobs log nothing
    that is not filtered)."""

    job: Job
    ctx: JobContext
    lease_seconds: float
    next_renew: float
    #: When the lease, as last confirmed by the database (the claim, or a renewal), ends: on this
    #: process's time.monotonic() clock, never later than it does.
    expires: float = math.inf
    #: Renewals that failed since the lease was last confirmed (the renewer's).
    failed: int = 0
    state: str = "held"
    _log: JobLog | None = None

    @property
    def log(self) -> JobLog:
        jlog = self._log
        if jlog is None:
            jlog = self._log = JobLog(self.job)
        return jlog


def discarded(held: Held, operation: str, raised: BaseException | None = None) -> None:
    """Log that ``operation`` (the call recording the handler's outcome; ``raised``: the handler's
    exception, for a failure) is not sent: the job is no longer ours. Expected, and said quietly,
    when it was cancelled."""
    if held.ctx.cancelled:
        held.log.debug("cancelled (pgq.cancel): %s not sent", operation, exc_info=raised)
    else:
        held.log.about_outcome(logging.WARNING, raised,
                               "no longer ours: %s not sent, the handler's outcome is discarded", operation)


@dataclass(slots=True)
class _Notice:
    """What pgq_cancel notifications asked about one held job."""

    asked: float  # when the last renewal they made due is due (time.monotonic())
    pending: bool = False  # a notification came that no renewal begun after it has answered
    checking: bool = False  # the renewal in flight began after a notification


class HeldJobs:
    """Thread-safe: one short lock guards every decision; no call to the server happens under it."""

    def __init__(self, on_lost: Callable[[], None] | None = None,
                 on_cancelled: Callable[[Held], None] | None = None) -> None:
        self._jobs: dict[int, Held] = {}
        self._lock = threading.Lock()
        self._notices: dict[int, _Notice] = {}  # by job id: held jobs a pgq_cancel notification named
        #: Called (outside the lock) each time a held job stops being ours: the worker's metrics.
        self.on_lost = on_lost
        #: Called (outside the lock, by whoever ends the renewal) when a held job turns out to be
        #: cancelled: the AsyncWorker interrupts its handler's task.
        self.on_cancelled = on_cancelled

    def hold(self, job: Job, ctx: JobContext, lease_seconds: float) -> Held:
        """Register a claimed job; its first renewal is due at a third of its lease."""
        return self.hold_all([job], [ctx], [lease_seconds])[0]

    def hold_all(self, jobs: Sequence[Job], contexts: Sequence[JobContext], leases: Sequence[float]) -> list[Held]:
        """hold() for the jobs of one claim, their contexts and leases (one lock for them all)."""
        now = time.monotonic()
        helds = []
        for job, ctx, lease_seconds in zip(jobs, contexts, leases):
            first = now + lease_seconds / 3
            if ctx.deadline_monotonic is not None:  # the renewer wakes at the deadline, at the latest
                first = min(first, ctx.deadline_monotonic)
            ctx._registry = self  # ctx.transaction() settles through us (entry_of finds its Held)
            helds.append(Held(job, ctx, lease_seconds, first, now + lease_seconds))
        with self._lock:
            registry = self._jobs
            for held in helds:
                registry[held.job.id] = held
        return helds

    def settle(self, held: Held) -> Verdict:
        """Ask for the one call that ends this attempt (see Verdict)."""
        with self._lock:
            if held.state == "held" and not held.ctx.ended():
                held.state = "settled"
                return GRANTED
            return BUSY if held.state == "renewing" else GONE

    def entry_of(self, ctx: JobContext) -> Held | None:
        """The held job whose context is ``ctx``; None when it is not held (any more). (The
        context keeps the registry, not its Held: no reference cycle per job.)"""
        held = self._jobs.get(ctx.job.id)
        return held if held is not None and held.ctx is ctx else None

    def unsettle(self, held: Held) -> None:
        """Undo a grant whose call surely did not take effect (the handler's transaction rolled
        back before its pgq.complete committed): the job is held again, renewed again, and the
        handler's outcome is recorded as usual."""
        with self._lock:
            if held.state == "settled":
                held.state = "held"

    def take_over(self, held: Held) -> Verdict:
        """settle() for the shutdown: when granted, the handler is told that its job is no longer
        ours (ctx.lease_lost), so that its outcome is discarded."""
        verdict = self.settle(held)
        if verdict is GRANTED:
            held.ctx.lease_lost.set()
        return verdict

    def unconfirmed(self, held: Held) -> bool:
        """The renewer could not confirm this lease in time (a renewal that failed, or waited out
        its bounds, again and again, while the lease runs out): the job is lost before the lease
        can pass to another worker, so that the handler stops (ctx.lease_lost, should_stop) and its
        outcome is discarded. False when it is settled, renewing or lost already."""
        with self._lock:
            if held.state != "held":
                return False
            held.state = "lost"
        held.ctx.lease_lost.set()
        if self.on_lost is not None:
            self.on_lost()
        held.log.warning("its lease could not be renewed in time (the last renewals failed): the handler "
                         "should stop; its outcome will be discarded, and the lease recovers the job")
        return True

    def begin_renewal(self, held: Held) -> bool:
        """The renewer may extend this lease now (nobody settles it meanwhile)."""
        with self._lock:
            if held.state != "held" or held.ctx.is_lost():
                return False
            if not held.ctx.past_deadline():
                held.state = "renewing"
                if self._notices and (notice := self._notices.get(held.job.id)) is not None:
                    notice.checking, notice.pending = notice.pending, False
                return True
            held.state = "lost"  # max_run_time is up: no more renewals, ever
        held.ctx.lease_lost.set()
        if self.on_lost is not None:
            self.on_lost()
        held.log.warning("deadline reached (max_run_time): no more renewals; the handler should stop, "
                         "its outcome will be discarded and the attempt ends as timed_out")
        return False

    def end_renewal(self, held: Held, *, lost: bool = False, answered: bool = True) -> None:
        """The renewal is over: ``answered`` (False: it did not reach the server), and ``lost``:
        it was refused, the job is no longer ours, and the handler is told (ctx.lease_lost; and
        ctx.cancelled when a pgq_cancel notification named this attempt: the refusal proves it)."""
        cancelled = ignored = False
        with self._lock:
            held.state = "lost" if lost else "held"
            notice = self._notices.get(held.job.id) if self._notices else None
            if notice is not None:
                if lost:
                    cancelled = notice.checking or notice.pending
                elif not answered:  # the next renewal (due soon: renewal_failed) asks again
                    notice.pending = notice.pending or notice.checking
                elif notice.pending:  # one came while this renewal was in flight: look again
                    held.next_renew = min(held.next_renew, max(time.monotonic(), notice.asked))
                else:
                    ignored = notice.checking
                notice.checking = False
        if ignored:
            held.log.warning("a pgq_cancel notification named this attempt, but its renewal was granted: "
                             "still ours, the notification is ignored (sent by another session?)")
        if not lost:
            return
        if cancelled:
            held.log.info("cancelled while it ran (pgq.cancel): the handler is told, its outcome will be discarded")
            held.ctx._cancel()
            if self.on_cancelled is not None:
                self.on_cancelled(held)
            return
        held.log.warning("lease lost: the job is no longer ours; the handler's outcome will be discarded")
        held.ctx.lease_lost.set()
        if self.on_lost is not None:
            self.on_lost()

    def notice_cancel(self, job_id: int, attempt: int) -> bool:
        """A pgq_cancel notification named (job_id, attempt). When we hold that attempt its renewal
        is made due now, or CANCEL_CHECK_GAP after the last one a notification made due: a refusal
        proves the cancel (end_renewal). True when the renewer should look again. (A job whose
        outcome call is in flight is left to that call; its refusal is then logged quietly:
        cancel_noticed.)"""
        now = time.monotonic()
        with self._lock:
            held = self._jobs.get(job_id)
            if held is None or held.job.attempt != attempt or held.state == "lost":
                return False
            notice = self._notices.get(job_id)
            if notice is None:
                notice = self._notices[job_id] = _Notice(-math.inf)
            notice.pending = True
            if held.state == "settled":
                return False
            if notice.asked <= now:  # (else the renewal due at notice.asked answers this one too)
                notice.asked = max(now, notice.asked + CANCEL_CHECK_GAP)
            held.next_renew = min(held.next_renew, notice.asked)
            return True

    def cancel_noticed(self, held: Held) -> bool:
        """Whether a pgq_cancel notification named this attempt (its outcome call, refused, was
        expected to be)."""
        with self._lock:
            notice = self._notices.get(held.job.id)
            return held.ctx.cancelled or (notice is not None and (notice.pending or notice.checking))

    def forget(self, helds: Iterable[Held]) -> None:
        """No longer held: recorded, given back, or given up to its lease."""
        with self._lock:
            for held in helds:
                if self._jobs.get(held.job.id) is held:
                    del self._jobs[held.job.id]
                    if self._notices:
                        self._notices.pop(held.job.id, None)

    def jobs(self) -> list[Held]:
        with self._lock:
            return list(self._jobs.values())

    def next_renewal(self) -> float | None:
        """When the earliest renewal of a job not yet settled is due (time.monotonic())."""
        with self._lock:
            return min((h.next_renew for h in self._jobs.values() if h.state == "held"), default=None)

    def __len__(self) -> int:
        return len(self._jobs)

    def __bool__(self) -> bool:
        return bool(self._jobs)
