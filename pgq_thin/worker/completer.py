"""The completer: the queue of the completions of handlers that returned None, and the thread
that records them, each time all of those queued since its last call in one pgq.complete_many
(fenced per job like pgq.complete), on its own connection; after each, ``recorded`` tells the
claimer.

The claimer may carry them instead: while it is about to claim (``carry(True)``: a small claim
after one that came back short, Claimer.carries), a completion queued does not wake the
completer's thread, and the claimer ``take()``s the queue into its claim (pgq.complete_and_claim:
one round trip and one commit for both, at most CARRY_MAX of them). Whoever takes the queue
under its lock sends what it took, so each completion is sent once. When the claimer will not
claim after all (it sleeps, no slot is free, it stops) it hands the queue back (``carry(False)``
wakes the thread); a call of its that fails gives its completions back (``give_back``); and what
the claimer holds longer than CARRY_PATIENCE is sent by the thread anyway.

Written once, for asyncio (AsyncCompleter, a task); the thread runtime's Completer (a thread) is
generated from it (pgq_thin/worker/threads/completer.py)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from pgq_thin.errors import PgqError
from pgq_thin.worker.held import BUSY, GONE, Held, HeldJobs, discarded
from pgq_thin.worker.owner import AsyncOwnerCalls
from pgq_thin.worker.support import Backoff, Flags, log, transient
from pgq_thin.worker.waits import Part, Wakeup, nap

__all__ = ["BACKLOG_MAX", "CARRY_CLAIM_MAX", "CARRY_MAX", "CARRY_PATIENCE", "AsyncCompleter", "carries", "report"]

#: The longest a queued completion waits for the claimer's call before the completer's thread
#: sends it itself (a claim that waits for a lock or a connection, say), in seconds.
CARRY_PATIENCE = 0.1
#: The most completions one claim carries (the oldest; the completer sends the rest), and the
#: largest claim that carries any: pgq.complete_and_claim costs more than its two parts once both
#: are large (measured on PostgreSQL 15: 64 completions with a claim of 116 cost what the two calls
#: cost, 512 with 500 twice that), while the claims that gain from it, those a key or a capped
#: queue holds back until our completions commit, are small.
CARRY_MAX = 64
CARRY_CLAIM_MAX = 128
#: The most completions that wait for their pgq.complete_many before the claimer claims no more
#: (back-pressure, as River's completer has): while the calls fall behind (a slow or locked
#: database, or slots that finish jobs faster than one connection records them), the jobs in hand
#: stop growing. Each of them holds a lease that the renewer keeps, and runs again if the worker
#: dies before its call.
BACKLOG_MAX = 4096
#: SQLSTATE lock_not_available: a bounded call waited out its lock_timeout.
LOCK_NOT_AVAILABLE = "55P03"


def carries(batch: int) -> bool:
    """Whether a claim of ``batch`` jobs carries the completions queued."""
    return 0 < batch <= CARRY_CLAIM_MAX


def report(batch: Sequence[Held], done: Sequence[int], cancelled: Callable[[Held], bool] = lambda _: False) -> None:
    """Log what one pgq.complete_many (or complete_and_claim) answered for each job of ``batch``
    (``cancelled(held)``: whether a refusal was expected, the job cancelled while it ran)."""
    if len(done) == len(batch):  # the common case: every pair was ours (the ids are the batch's)
        if log.isEnabledFor(logging.INFO):  # not one call per job when the line is filtered anyway
            for held in batch:
                held.log.info("completed")
        return
    completed = set(done)
    for held in batch:
        if held.job.id in completed:
            held.log.info("completed")
        elif cancelled(held):
            held.log.info("complete refused: the job was cancelled (pgq.cancel) while it ran")
        else:
            held.log.warning("complete rejected: the job is no longer ours (its lease expired, or it was cancelled)")


class ClaimLoop(Protocol):
    """What a completer tells the claim loop: its completions committed, or a slot freed while
    they wait (the claimer's ClaimNudge)."""

    @property
    def short(self) -> bool:
        """Whether the last claim took fewer jobs than it asked for."""

    def ours(self) -> None:
        """Look again at once, for a reason of our own."""


class AsyncCompleter(Part):
    """``add(held)`` queues a completion; the completer's loop (``start()``) flushes the queue
    until ``stop()`` or a hard stop, unless the claimer carries it. ``flush()`` records the queue
    now (the shutdown does). ``claims`` is told when a slot frees (``freed()``) and when a batch
    is settled (the claimer may claim again)."""

    def __init__(self, owner: AsyncOwnerCalls, held: HeldJobs, flags: Flags, claims: ClaimLoop) -> None:
        super().__init__()
        self.owner = owner
        self.held = held
        self.flags = flags
        self.claims = claims
        self._queue: list[Held] = []
        self._since = 0.0  # when the oldest completion queued was queued (time.monotonic())
        self._carried = False  # the claimer takes the queue with its next call
        self._lock = threading.Lock()  # (the thread runtime's slots add from their threads)
        self._queued = Wakeup()
        self._holding = False  # the claimer waits for a batch to be recorded (holds_back)
        self._sending = 0  # completions taken by our loop's call in flight (flush)

    thread_name = "pgq-complete"
    backlog_max = BACKLOG_MAX

    async def add(self, held: Held) -> bool:
        """Queue the completion of ``held`` for the next pgq.complete_many (or the claimer's next
        call): its one settling call. False (and nothing queued) when the job is settled already
        or no longer ours."""
        verdict = self.held.settle(held)
        if verdict is GONE or (verdict is BUSY and not await self.owner.granted(held)):
            discarded(held, "complete")
            return False
        with self._lock:
            if not self._queue:
                self._since = time.monotonic()
            self._queue.append(held)
            carried = self._carried
        if not carried and not self._queued.is_set():
            self._queued.set()
        return True

    def freed(self) -> None:
        """A slot finished a job: the claimer looks again at once. But after a claim that came
        back short, while that job's completion is queued here (not carried by the next claim),
        the claim waits for it (recorded()): until it commits, the job counts as running (a full
        key, a capped queue's place) and the claim would come back short again."""
        claims = self.claims
        if not claims.short or self._carried or not self._queue:
            claims.ours()

    def recorded(self) -> None:
        """Completions committed (or settled otherwise): after a claim that came back short, the
        claimer claims again, since our own running jobs may be what held it back; and so does
        a claimer that holds_back() held. (The batch is no longer in flight first: a claimer
        that looks after it sees so, one that looked before is woken.)"""
        self._sending = 0
        if self.claims.short or self._holding:
            self._holding = False
            self.claims.ours()

    def holds_back(self) -> bool:
        """The claimer, before it claims: whether to claim no more for now, ``backlog_max``
        completions waiting for their call (queued, or in the call of ours in flight). While it
        waits, the next batch recorded wakes it (set before the look, so that a batch recorded
        between the two wakes it too)."""
        was = self._holding
        self._holding = True
        waiting = len(self._queue) + self._sending
        if waiting >= self.backlog_max:
            if not was:  # (flow control, not a fault: a drain of no-op jobs at 36,000 a second gets here)
                log.debug("%d completions wait for pgq.complete_many: claiming no more until they are "
                          "recorded", waiting, extra={"worker": self.owner.worker_name})
            return True
        self._holding = False
        return False

    @property
    def queued(self) -> int:
        """Completions waiting for the next flush."""
        return len(self._queue)

    @property
    def carried(self) -> bool:
        """Whether the claimer's next call takes the queue (see carry)."""
        return self._carried

    def carry(self, on: bool) -> None:
        """The claimer: ``True`` while it is about to claim, so that completions queued meanwhile
        go with its call; ``False`` when it will not claim now: the loop sends what is queued."""
        with self._lock:
            self._carried = on
            waiting = bool(self._queue)
        if not on and waiting:
            self._queued.set()

    def take(self, most: int | None = None) -> list[Held]:
        """Take the queued completions (the claimer: ``most`` of them, the oldest, to send with its
        call and then settled() or give_back() them; the loop is woken for the rest)."""
        with self._lock:
            queue = self._queue
            if most is None or len(queue) <= most:
                self._queue = []
                return queue
            batch, self._queue = queue[:most], queue[most:]
        self._queued.set()
        return batch

    def settled(self, batch: list[Held], done: Sequence[int]) -> None:
        """The claimer's call recorded ``batch``: ``done`` are the ids completed (the others
        were no longer ours)."""
        report(batch, done, self.held.cancel_noticed)
        self.held.forget(batch)

    def give_back(self, batch: list[Held]) -> None:
        """The claimer's call failed: ``batch`` is queued again, first, and the loop sends it
        (repeating it while the connection is down, failing a refused one as flush() does)."""
        if not batch:
            return
        with self._lock:
            if not self._queue:
                self._since = time.monotonic()
            self._queue[:0] = batch
        self._queued.set()

    async def flush(self) -> None:
        """Record every queued completion with one pgq.complete_many. On a connection error the
        batch stays queued and the error is raised (every pair is idempotent for its attempt); a
        refusal that retrying cannot fix fails each job instead, as a refused complete would. A
        batch that waited out its lock_timeout (one of its rows held by another transaction) is
        sent again one job at a time, so that the others are not held back with that one."""
        batch = self.take()
        if not batch:
            return
        self._sending = len(batch)
        try:
            await self.send(batch)
        finally:
            self._sending = 0  # (recorded() did, unless the call failed: then the batch is queued again)

    async def send(self, batch: list[Held]) -> None:
        """flush()'s call of ``batch``."""
        try:
            done = await self.owner.bounded.complete_many([h.job.id for h in batch], [h.job.attempt for h in batch])
        except Exception as exc:
            if transient(exc) and not self.flags.done.is_set():
                if len(batch) > 1 and getattr(exc, "sqlstate", None) == LOCK_NOT_AVAILABLE:
                    await self.one_by_one(batch)
                    return
                self.requeue(batch)
                raise
            for held in batch:
                await self.owner.refused("complete", held, exc)
            self.held.forget(batch)
            self.recorded()
            return
        self.settled(batch, done)
        self.recorded()

    async def one_by_one(self, batch: list[Held]) -> None:
        """Each completion of ``batch`` alone: those that go are settled; one that fails stays
        queued, and the error is raised (the loop repeats it after its backoff)."""
        failed: Exception | None = None
        for held in batch:
            try:
                done = await self.owner.bounded.complete_many([held.job.id], [held.job.attempt])
            except Exception as exc:
                if not transient(exc) or self.flags.done.is_set():
                    await self.owner.refused("complete", held, exc)
                    self.held.forget([held])
                    continue
                self.requeue([held])
                failed = exc
                continue
            self.settled([held], done)
        self.recorded()
        if failed is not None:
            raise failed

    def requeue(self, batch: list[Held]) -> None:
        """Queue ``batch`` again, first (a call that did not record it)."""
        with self._lock:
            if not self._queue:
                self._since = time.monotonic()
            self._queue[:0] = batch

    async def try_flush(self) -> None:
        """flush(), once: at shutdown a connection error leaves those jobs to their leases."""
        try:
            await self.flush()
        except PgqError as exc:
            log.warning("complete_many did not reach the server at shutdown (%s); the leases cover "
                        "those jobs", exc, extra={"worker": self.owner.worker_name})

    def _overdue(self) -> bool:
        """Whether the oldest queued completion has waited CARRY_PATIENCE for the claimer."""
        return bool(self._queue) and time.monotonic() - self._since >= CARRY_PATIENCE

    async def run(self) -> None:
        errors = Backoff(first=0.1, cap=10.0)
        while not self._stopped.is_set() and not self.flags.hard_stop.is_set():
            if not await self._queued.wait(CARRY_PATIENCE) and not self._overdue():
                continue
            self._queued.clear()
            try:
                await self.flush()
            except PgqError as exc:  # a connection error: the batch stays queued; try again
                delay = errors.next()
                log.warning("complete_many did not reach the server (%s); repeating it in %.1fs", exc, delay,
                            extra={"worker": self.owner.worker_name})
                await self.owner.drop_broken_connections()
                self._queued.set()
                await nap(delay, self.flags)
                continue
            errors.reset()

    def stop(self) -> None:
        super().stop()
        self._queued.set()
