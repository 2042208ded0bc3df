"""Stopping the worker processes the demo and the soak start."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterable


def stop_processes(procs: Iterable[subprocess.Popen[bytes]], timeout: float = 20) -> None:
    """SIGTERM every live process (thawing a frozen one first), wait up to ``timeout`` seconds in
    all for them to shut down gracefully, then kill what is left."""
    procs = list(procs)
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.terminate()
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
