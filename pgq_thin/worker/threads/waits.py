"""How the thread runtime waits: the twin of pgq_thin/worker/waits.py, the same names blocking a
thread. The thread runtime's parts (generated from the asyncio ones) import these."""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

from pgq_thin.worker.support import Flags

__all__ = ["ASYNC", "Part", "Ready", "Wakeup", "nap", "sleep", "watch"]

ASYNC = False

sleep = time.sleep

#: A thread's wake-up is a threading.Event: ``wait(timeout)`` blocks, and says whether it is set.
Wakeup = threading.Event


def nap(seconds: float, flags: Flags) -> None:
    """Sleep ``seconds``, or less: until a hard stop."""
    flags.hard_stop.wait(seconds)


def watch(event: threading.Event, seconds: float) -> bool:
    """Wait up to ``seconds`` for ``event``; whether it is set."""
    return event.wait(seconds)


class Ready:
    """The jobs handed to the slots and not started: ``put_all`` them, a slot ``get()``s the next
    one, blocking (None once ``close()``d)."""

    def __init__(self) -> None:
        self._items: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def put_all(self, items: list[Any]) -> None:
        put = self._items.put
        for item in items:
            put(item)

    def get(self) -> Any:
        return self._items.get()

    def take_all(self) -> list[Any]:
        taken: list[Any] = []
        while True:
            try:
                item = self._items.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                taken.append(item)
        return taken

    def close(self, slots: int) -> None:
        """No more items: each of ``slots`` slots gets None after what is queued."""
        for _ in range(slots):
            self._items.put(None)


class Part:
    """A part that runs a loop (``run()``) in a daemon thread of its own, named ``thread_name``:
    ``start()``, ``stop()`` (the loop ends soon after), ``join(timeout)``."""

    thread_name = "pgq-part"

    def __init__(self) -> None:
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def run(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name=self.thread_name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def cancel(self) -> None:
        """Stop at once: a thread cannot be cancelled; it is a daemon, and ends with the process."""
