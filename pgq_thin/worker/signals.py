"""Signal handling: the first SIGTERM / SIGINT asks for a graceful stop, the second for a stop at
once. ``Signals`` holds that rule; ``install()`` wires it to Python's signal module (a thread
runtime), ``install_on(loop)`` to an asyncio loop."""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from pgq_thin.worker.support import log

__all__ = ["Signals"]

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Signals:
    """``stop(graceful)`` is called once per signal: graceful for the first one (unless
    ``stopping()`` says a stop has begun already), at once for any other."""

    def __init__(self, stop: Callable[[bool], None], stopping: Callable[[], bool], worker_name: str) -> None:
        self.stop = stop
        self.stopping = stopping
        self.worker_name = worker_name
        self.received = 0
        self._previous: dict[int, Any] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def graceful_next(self) -> bool:
        """Count a signal; whether it asks for a graceful stop."""
        self.received += 1
        return self.received == 1 and not self.stopping()

    def deliver(self, signum: int, graceful: bool) -> None:
        # Stop first, then say so: whoever reads the line (an operator, a test that enqueues after
        # it) may rely on the claimer's stop flag being set already (stop() only sets flags).
        self.stop(graceful)
        log.warning("%s: %s", signal.Signals(signum).name,
                    "shutting down gracefully (send it again to stop at once)" if graceful
                    else "stopping at once; running jobs are recovered when their leases expire",
                    extra={"worker": self.worker_name})

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # This runs in the main thread between two bytecodes, maybe while that thread holds a
        # lock that stop() needs (the lock of an Event the claimer waits on and clears): stopping
        # from here could wait for ourselves forever. So only count here, and stop from a thread
        # of its own, which gets the lock as soon as the main thread lets go.
        graceful = self.graceful_next()
        threading.Thread(target=self.deliver, args=(signum, graceful), name="pgq-signal", daemon=True).start()

    def install(self) -> bool:
        """Handle SIGTERM / SIGINT from now on; only in the main thread (Python allows signal
        handlers nowhere else): False elsewhere, and nothing is installed."""
        if threading.current_thread() is not threading.main_thread():
            return False
        for signum in SIGNALS:
            self._previous[signum] = signal.signal(signum, self._on_signal)
        return True

    def _on_loop_signal(self, signum: int) -> None:
        self.deliver(signum, self.graceful_next())

    def install_on(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Handle SIGTERM / SIGINT in ``loop`` (its callbacks run between the loop's steps, so
        stop() runs there directly). False where the loop cannot (not the main thread)."""
        if threading.current_thread() is not threading.main_thread():
            return False
        for signum in SIGNALS:
            self._previous[signum] = signal.getsignal(signum)
            loop.add_signal_handler(signum, self._on_loop_signal, signum)
        self._loop = loop
        return True

    def restore(self) -> None:
        """Put back what handled the signals before."""
        for signum, previous in self._previous.items():
            if self._loop is not None:
                self._loop.remove_signal_handler(signum)
            signal.signal(signum, previous)
        self._previous.clear()
        self._loop = None
