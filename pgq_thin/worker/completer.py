"""The completer: records the completions of handlers that returned None, each time all of those
queued since its last call in one pgq.complete_many (fenced per job like pgq.complete), on its own
connection, while the claimer claims; after each, ``recorded`` tells the claimer."""

from __future__ import annotations

import threading
from collections.abc import Callable

from pgq_thin.errors import PgqError
from pgq_thin.worker.held import BUSY, GONE, Held, HeldJobs
from pgq_thin.worker.owner import OwnerCalls
from pgq_thin.worker.support import Backoff, Flags, ThreadPart, log, transient

__all__ = ["Completer"]


def report(batch: list[Held], done: set[int]) -> None:
    """Log what one pgq.complete_many answered for each job of ``batch``."""
    for held in batch:
        if held.job.id in done:
            held.log.info("completed")
        else:
            held.log.warning("complete rejected: the job is no longer ours (its lease expired, or it was cancelled)")


class Completer(ThreadPart):
    """``add(held)`` queues a completion; the completer's thread (``start()``) flushes the queue
    until ``stop()`` or a hard stop. ``flush()`` records the queue now (the shutdown does)."""

    def __init__(self, owner: OwnerCalls, held: HeldJobs, flags: Flags,
                 recorded: Callable[[], None] = lambda: None) -> None:
        self.owner = owner
        self.held = held
        self.flags = flags
        self.recorded = recorded  # called after each batch is settled (the claimer may claim again)
        self._queue: list[Held] = []
        self._lock = threading.Lock()
        self._queued = threading.Event()
        super().__init__()

    thread_name = "pgq-complete"

    def add(self, held: Held) -> bool:
        """Queue the completion of ``held`` for the next pgq.complete_many: its one settling call.
        False (and nothing queued) when the job is settled already or no longer ours."""
        verdict = self.held.settle(held)
        if verdict is GONE or (verdict is BUSY and not self.owner.granted(held)):
            held.log.warning("no longer ours: complete not sent, the handler's outcome is discarded")
            return False
        with self._lock:
            self._queue.append(held)
        self._queued.set()
        return True

    @property
    def queued(self) -> int:
        """Completions waiting for the next flush."""
        return len(self._queue)

    def flush(self) -> None:
        """Record every queued completion with one pgq.complete_many. On a connection error the
        batch stays queued and the error is raised (every pair is idempotent for its attempt); a
        refusal that retrying cannot fix fails each job instead, as a refused complete would."""
        with self._lock:
            batch, self._queue = self._queue, []
        if not batch:
            return
        try:
            done = set(self.owner.client.complete_many([h.job.id for h in batch], [h.job.attempt for h in batch]))
        except Exception as exc:
            if transient(exc) and not self.flags.done.is_set():
                with self._lock:
                    self._queue[:0] = batch
                raise
            for held in batch:
                self.owner.refused("complete", held, exc)
            self.held.forget(batch)
            self.recorded()
            return
        self.held.forget(batch)
        report(batch, done)
        self.recorded()

    def try_flush(self) -> None:
        """flush(), once: at shutdown a connection error leaves those jobs to their leases."""
        try:
            self.flush()
        except PgqError as exc:
            log.warning("complete_many did not reach the server at shutdown (%s); the leases cover "
                        "those jobs", exc, extra={"worker": self.owner.worker_name})

    def _loop(self) -> None:
        errors = Backoff(first=0.1, cap=10.0)
        while not self._stopped.is_set() and not self.flags.hard_stop.is_set():
            if not self._queued.wait(0.5):
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
                self.flags.hard_stop.wait(delay)
                continue
            errors.reset()

    def stop(self) -> None:
        super().stop()
        self._queued.set()
