# Generated from pgq_thin/worker/completer.py by scripts/async_to_sync.py: do not edit. Edit the
# asyncio source, then run the script (tests/worker/test_worker_generated.py fails while this is stale).
"""The thread runtime's Completer: made of the asyncio AsyncCompleter
(pgq_thin.worker.completer), blocking a thread instead of awaiting."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from pgq_thin.errors import PgqError
from pgq_thin.worker.completer import BACKLOG_MAX, CARRY_PATIENCE, LOCK_NOT_AVAILABLE, ClaimLoop, report
from pgq_thin.worker.held import BUSY, GONE, Held, HeldJobs, discarded
from pgq_thin.worker.support import Backoff, Flags, log, transient
from pgq_thin.worker.threads.owner import OwnerCalls
from pgq_thin.worker.threads.waits import Part, Wakeup, nap

__all__ = ["Completer"]


class Completer(Part):
    """``add(held)`` queues a completion; the completer's loop (``start()``) flushes the queue
    until ``stop()`` or a hard stop, unless the claimer carries it. ``flush()`` records the queue
    now (the shutdown does). ``claims`` is told when a slot frees (``freed()``) and when a batch
    is settled (the claimer may claim again)."""

    def __init__(self, owner: OwnerCalls, held: HeldJobs, flags: Flags, claims: ClaimLoop) -> None:
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

    def add(self, held: Held) -> bool:
        """Queue the completion of ``held`` for the next pgq.complete_many (or the claimer's next
        call): its one settling call. False (and nothing queued) when the job is settled already
        or no longer ours."""
        verdict = self.held.settle(held)
        if verdict is GONE or (verdict is BUSY and not self.owner.granted(held)):
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

    def flush(self) -> None:
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
            self.send(batch)
        finally:
            self._sending = 0  # (recorded() did, unless the call failed: then the batch is queued again)

    def send(self, batch: list[Held]) -> None:
        """flush()'s call of ``batch``."""
        try:
            done = self.owner.bounded.complete_many([h.job.id for h in batch], [h.job.attempt for h in batch])
        except Exception as exc:
            if transient(exc) and not self.flags.done.is_set():
                if len(batch) > 1 and getattr(exc, "sqlstate", None) == LOCK_NOT_AVAILABLE:
                    self.one_by_one(batch)
                    return
                self.requeue(batch)
                raise
            for held in batch:
                self.owner.refused("complete", held, exc)
            self.held.forget(batch)
            self.recorded()
            return
        self.settled(batch, done)
        self.recorded()

    def one_by_one(self, batch: list[Held]) -> None:
        """Each completion of ``batch`` alone: those that go are settled; one that fails stays
        queued, and the error is raised (the loop repeats it after its backoff)."""
        failed: Exception | None = None
        for held in batch:
            try:
                done = self.owner.bounded.complete_many([held.job.id], [held.job.attempt])
            except Exception as exc:
                if not transient(exc) or self.flags.done.is_set():
                    self.owner.refused("complete", held, exc)
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

    def try_flush(self) -> None:
        """flush(), once: at shutdown a connection error leaves those jobs to their leases."""
        try:
            self.flush()
        except PgqError as exc:
            log.warning("complete_many did not reach the server at shutdown (%s); the leases cover "
                        "those jobs", exc, extra={"worker": self.owner.worker_name})

    def _overdue(self) -> bool:
        """Whether the oldest queued completion has waited CARRY_PATIENCE for the claimer."""
        return bool(self._queue) and time.monotonic() - self._since >= CARRY_PATIENCE

    def run(self) -> None:
        errors = Backoff(first=0.1, cap=10.0)
        while not self._stopped.is_set() and not self.flags.hard_stop.is_set():
            if not self._queued.wait(CARRY_PATIENCE) and not self._overdue():
                continue
            self._queued.clear()
            try:
                self.flush()
            except PgqError as exc:  # a connection error: the batch stays queued; try again
                delay = errors.next()
                log.warning("complete_many did not reach the server (%s); repeating it in %.1fs", exc, delay,
                            extra={"worker": self.owner.worker_name})
                self.owner.drop_broken_connections()
                self._queued.set()
                nap(delay, self.flags)
                continue
            errors.reset()

    def stop(self) -> None:
        super().stop()
        self._queued.set()
