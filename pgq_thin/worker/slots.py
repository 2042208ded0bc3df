"""The slots: ``concurrency`` threads, each running the held jobs handed to it one at a time
with the executor. The slots count the jobs handed to them and not yet finished (``assigned``:
running, or waiting for a slot: the prefetch), and time each run for the prefetch policy."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

from pgq_thin.worker.executor import Executor
from pgq_thin.worker.held import Held
from pgq_thin.worker.owner import OwnerCalls
from pgq_thin.worker.prefetch import PrefetchPolicy
from pgq_thin.worker.support import Flags

__all__ = ["Slots"]


class Slots:
    """``submit(held)`` hands a job to the next free slot. ``freed()`` is called each time a slot
    finishes a job. Once ``flags.stopping`` is set, a slot gives back the jobs it has not started."""

    def __init__(self, concurrency: int, executor: Executor, owner: OwnerCalls, policy: PrefetchPolicy,
                 flags: Flags, freed: Callable[[], None]) -> None:
        self.concurrency = concurrency
        self.executor = executor
        self.owner = owner
        self.policy = policy
        self.flags = flags
        self.freed = freed
        self._ready: queue.SimpleQueue[Held | None] = queue.SimpleQueue()
        self._assigned = 0
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    @property
    def assigned(self) -> int:
        return self._assigned

    def submit(self, held: Held) -> None:
        self.submit_all([held])

    def submit_all(self, helds: list[Held]) -> None:
        """submit() the jobs of one claim."""
        with self._lock:
            self._assigned += len(helds)
        put = self._ready.put
        for held in helds:
            put(held)

    def take_waiting(self) -> list[Held]:
        """Take back the jobs no slot has started (the shutdown gives them back at once)."""
        waiting: list[Held] = []
        while True:
            try:
                item = self._ready.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                waiting.append(item)
        with self._lock:
            self._assigned -= len(waiting)
        return waiting

    def _loop(self) -> None:
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
            except BaseException:  # noqa: BLE001 - a slot must survive anything; the lease covers the job
                held.log.exception("the slot failed while running this job")
                self.owner.held.forget([held])
            finally:
                with lock:
                    if started is not None:
                        timed(monotonic() - started)
                    self._assigned -= 1
                self.freed()  # a free slot, and maybe a completion to record

    def start(self) -> None:
        self._threads = [threading.Thread(target=self._loop, name=f"pgq-slot-{n}", daemon=True)
                         for n in range(1, self.concurrency + 1)]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        """Each slot ends after its current job (a slot still in a handler stays a daemon thread)."""
        for _ in self._threads:
            self._ready.put(None)

    def join(self, timeout: float | None = None) -> None:
        for thread in self._threads:
            thread.join(timeout)
