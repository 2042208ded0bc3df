# Generated from pgq_thin/worker/slots.py by scripts/async_to_sync.py: do not edit. Edit the
# asyncio source, then run the script (tests/worker/test_worker_generated.py fails while this is stale).
"""The thread runtime's Slots: made of the asyncio AsyncSlots
(pgq_thin.worker.slots), blocking a thread instead of awaiting."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from pgq_thin.worker.held import Held
from pgq_thin.worker.prefetch import PrefetchPolicy
from pgq_thin.worker.support import Flags
from pgq_thin.worker.threads.executor import Executor
from pgq_thin.worker.threads.owner import OwnerCalls
from pgq_thin.worker.threads.waits import Ready

__all__ = ["Slots"]


class Slots:
    """``submit_all(helds)`` hands jobs to the next free slots. ``freed()`` is called each time a
    slot finishes a job. Once ``flags.stopping`` is set, a slot gives back the jobs it has not
    started."""

    def __init__(self, concurrency: int, executor: Executor, owner: OwnerCalls, policy: PrefetchPolicy,
                 flags: Flags, freed: Callable[[], None]) -> None:
        self.concurrency = concurrency
        self.executor = executor
        self.owner = owner
        self.policy = policy
        self.flags = flags
        self.freed = freed
        self._ready = Ready()
        self._assigned = 0
        self._lock = threading.Lock()  # (the thread runtime's slots count from their threads)
        self._runners: list[Any] = []

    @property
    def assigned(self) -> int:
        return self._assigned

    def submit_all(self, helds: list[Held]) -> None:
        """Hand the jobs of one claim to the slots."""
        with self._lock:
            self._assigned += len(helds)
        self._ready.put_all(helds)

    def take_waiting(self) -> list[Held]:
        """Take back the jobs no slot has started (the shutdown gives them back at once)."""
        waiting: list[Held] = self._ready.take_all()
        with self._lock:
            self._assigned -= len(waiting)
        return waiting

    def run_slot(self) -> None:
        """One slot: run the jobs handed over, one at a time, until stop()."""
        ready, stopping, run, timed, lock = (self._ready, self.flags.stopping, self.executor.run, self.policy.timed,
                                             self._lock)
        monotonic = time.monotonic
        while (held := ready.get()) is not None:
            started: float | None = None
            try:
                if stopping.is_set():
                    self.owner.give_back_unstarted(held, "claimed before shutdown, never started")
                else:
                    started = monotonic()
                    run(held)
            except BaseException as exc:  # noqa: BLE001 - a slot must survive anything; the lease covers the job
                held.log.exception("the slot failed while running this job: %r", exc)
                self.owner.held.forget([held])
            finally:
                with lock:
                    if started is not None:
                        timed(monotonic() - started)
                    self._assigned -= 1
                self.freed()  # a free slot, and maybe a completion to record

    def start(self) -> None:
        self._runners = [threading.Thread(target=self.run_slot, name=f"pgq-slot-{n}", daemon=True)
                         for n in range(1, self.concurrency + 1)]
        for thread in self._runners:
            thread.start()

    def stop(self) -> None:
        """Each slot ends after its current job (a slot still in a handler stays a daemon thread,
        or is cancelled at the end of an asyncio run)."""
        self._ready.close(self.concurrency)

    def cancel(self) -> None:
        """The end of a run: an asyncio slot still in an async handler is cancelled (a thread ends
        with its handler)."""
    def join(self, timeout: float | None = None) -> None:
        for thread in self._runners:
            thread.join(timeout)
