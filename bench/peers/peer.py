"""What every Python adapter of bench/peers shares (standard library only: it is imported by the
adapters that run in the peers' venv as well as by pgq's, which runs in the repository's).

An adapter is started by run.py as ``python ADAPTER.py MODE DSN [--workers W] [--jobs N]
[--variant V] [--keyed]``:

- ``migrate``: install the system's schema with its own migrator, then exit;
- ``run``: enqueue N jobs with the system's bulk API (not timed), print ``READY``, wait for the line
  ``go`` on stdin (run.py starts its clock and its observer then), start the consumers, and on
  SIGTERM stop them the system's own graceful way and print ``RESULT {json}``: how many handlers
  ran and, for the keyed workload, every handler's (start, end) per key.

Plain jobs are no-ops. Keyed jobs (``--keyed``): KEYS keys, job i has key ``key-{i % KEYS}``
(round-robin in the queue's order), and the handler sleeps SLEEP seconds.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import threading
import time

KEYS = 16
SLEEP = 0.002


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("migrate", "run"))
    parser.add_argument("dsn")
    parser.add_argument("--workers", type=int, default=4, help="concurrency: handlers running at once")
    parser.add_argument("--jobs", type=int, default=0)
    parser.add_argument("--variant", default="default", help="the adapter's configuration (see its file)")
    parser.add_argument("--keyed", action="store_true", help=f"{KEYS} keys, at most one running per key")
    return parser.parse_args()


def key_of(i: int) -> str:
    return f"key-{i % KEYS}"


def ready_then_go() -> None:
    """Tell run.py that the jobs are queued, and wait until it has started its clock."""
    print("READY", flush=True)
    if sys.stdin.readline().strip() != "go":
        sys.exit("run.py closed stdin before saying go")


class Recorder:
    """What the handlers did: how many ran, and (keyed) each one's (start, end) by key."""

    def __init__(self) -> None:
        self._counter = itertools.count()
        self._handled = 0
        self._lock = threading.Lock()
        self.intervals: dict[str, list[tuple[float, float]]] = {}

    def count(self) -> None:
        next(self._counter)  # atomic in CPython: handlers in threads may call it at once

    def add(self, key: str, start: float, end: float) -> None:
        with self._lock:
            self.intervals.setdefault(key, []).append((start, end))

    def report(self) -> None:
        handled = next(self._counter) + sum(len(v) for v in self.intervals.values())
        print("RESULT " + json.dumps({"handled": handled, "intervals": self.intervals}), flush=True)


def now() -> float:
    return time.monotonic()
