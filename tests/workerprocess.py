"""Real worker processes for the crash and signal tests: ``python <app>`` (optionally behind a
prefix such as faketime) with its output in a log file, started through a ``spawn`` function that
kills whatever is still running at the end of the test."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from pgq_tools import fleet

ROOT = Path(__file__).resolve().parent.parent
DEADLINE = 30.0


class WorkerProcess(fleet.WorkerProcess):
    """pgq_tools.fleet's WorkerProcess, failing the test when it does not exit in time."""

    def __init__(self, app: Path, dsn: str, log: Path, prefix: list[str] | None = None, **settings: str) -> None:
        super().__init__([*(prefix or []), sys.executable, str(app)], log, cwd=ROOT,
                         env={"PGQ_DSN": dsn, "PYTHONUNBUFFERED": "1", **settings})

    def wait_exit(self, timeout: float = DEADLINE) -> int:
        try:
            return super().wait_exit(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the worker did not exit within {timeout}s; its log:\n{self.log_text()}")

    def stop(self, timeout: float = DEADLINE) -> int:
        """SIGTERM, then wait: a graceful exit returns 0."""
        self.signal(signal.SIGTERM)
        return self.wait_exit(timeout)


@contextmanager
def spawner(app: Path, dsn: str, log_dir: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """``spawn(dsn=None, prefix=None, **environment)`` starts one more worker of ``app``."""
    started: list[WorkerProcess] = []

    def spawn(dsn_: str | None = None, prefix: list[str] | None = None, **settings: str) -> WorkerProcess:
        process = WorkerProcess(app, dsn_ or dsn, log_dir / f"worker-{len(started)}.log", prefix, **settings)
        started.append(process)
        return process

    try:
        yield spawn
    finally:
        for process in started:
            process.close()
