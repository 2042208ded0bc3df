"""How the asyncio runtime waits: the few primitives the worker's parts wait with. The parts are
written once, for asyncio (claimer.py, completer.py, owner.py, renewer.py, listener.py, slots.py,
executor.py); the thread runtime's are generated from them (scripts/async_to_sync.py writes
pgq_thin/worker/threads/), where these same names come from pgq_thin/worker/threads/waits.py and
block a thread instead. So these and their thread twins are the only place the two runtimes differ
in how a part waits."""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import Coroutine
from typing import Any

from pgq_thin.worker.support import Flags

__all__ = ["ASYNC", "Part", "Ready", "Wakeup", "nap", "sleep", "watch"]

#: True here, False in the thread twin: ``if ASYNC:`` marks what only one runtime does (the
#: generator keeps the ``else:`` branch for the threads).
ASYNC = True

#: How often a wait on a threading.Event (set from any thread) looks at it from the loop.
LOOK_EVERY = 0.05

sleep = asyncio.sleep


async def nap(seconds: float, flags: Flags) -> None:
    """Sleep ``seconds``, or less: until a hard stop."""
    await watch(flags.hard_stop, seconds)


async def watch(event: threading.Event, seconds: float) -> bool:
    """Wait up to ``seconds`` for ``event`` (a threading.Event, which any thread may set); whether
    it is set."""
    deadline = time.monotonic() + seconds
    while not event.is_set() and (left := deadline - time.monotonic()) > 0:
        await asyncio.sleep(min(left, LOOK_EVERY))
    return event.is_set()


class Wakeup:
    """threading.Event's API for one loop: ``set()`` it (in the loop's thread), ``await
    wait(timeout)``: whether it is set."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def set(self) -> None:
        self._event.set()

    def clear(self) -> None:
        self._event.clear()

    def is_set(self) -> bool:
        return self._event.is_set()

    async def wait(self, timeout: float | None = None) -> bool:
        if self._event.is_set():
            return True
        try:
            await asyncio.wait_for(self._event.wait(), timeout)
        except TimeoutError:
            pass
        return self._event.is_set()


class Ready:
    """The jobs handed to the slots and not started: ``put_all`` them, a slot ``await get()``s the
    next one (None once ``close()``d and empty). asyncio.Queue's rules without its calls per item."""

    def __init__(self) -> None:
        self._items: collections.deque[Any] = collections.deque()
        self._idle: collections.deque[asyncio.Future[None]] = collections.deque()
        self._closed = False

    def put_all(self, items: list[Any]) -> None:
        self._items.extend(items)
        idle, wake = self._idle, len(items)
        while wake and idle:  # one waiting slot per item (a busy slot may take it first: then it
            waiter = idle.popleft()  # looks, finds none, and waits again)
            if not waiter.done():
                waiter.set_result(None)
                wake -= 1

    async def get(self) -> Any:
        items = self._items
        while not items:
            if self._closed:
                return None
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._idle.append(waiter)
            await waiter  # (a cancelled slot leaves a done future behind: put_all skips it)
        return items.popleft()

    def take_all(self) -> list[Any]:
        taken = list(self._items)
        self._items.clear()
        return taken

    def close(self, slots: int) -> None:
        """No more items: each slot's get() answers None once the line is empty."""
        self._closed = True
        while self._idle:
            waiter = self._idle.popleft()
            if not waiter.done():
                waiter.set_result(None)


class Part:
    """A part that runs a loop (``run()``) as a task of its own: ``start()``, ``stop()`` (the loop
    ends soon after), ``await join(timeout)``."""

    thread_name = "pgq-part"

    def __init__(self) -> None:
        self._stopped = Wakeup()
        self._task: asyncio.Task[None] | None = None

    def run(self) -> Coroutine[Any, Any, None]:
        raise NotImplementedError

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name=self.thread_name)

    def stop(self) -> None:
        self._stopped.set()

    async def join(self, timeout: float | None = None) -> None:
        if self._task is not None:
            await asyncio.wait([self._task], timeout=timeout)

    def cancel(self) -> None:
        """Stop at once: cancel the task (the end of a run)."""
        if self._task is not None:
            self._task.cancel()
