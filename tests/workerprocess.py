"""Real worker processes for the crash and signal tests: ``python <app>`` (optionally behind a
prefix such as faketime) with its output in a log file, started through a ``spawn`` function that
kills whatever is still running at the end of the test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEADLINE = 30.0


class WorkerProcess:
    def __init__(self, app: Path, dsn: str, log: Path, prefix: list[str] | None = None, **settings: str) -> None:
        env = {**os.environ, "PGQ_DSN": dsn, "PYTHONUNBUFFERED": "1", **settings}
        self.log = log
        self._log_file = log.open("w")
        self.process = subprocess.Popen([*(prefix or []), sys.executable, str(app)], env=env, cwd=ROOT,
                                        stdout=self._log_file, stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int:
        return self.process.pid

    def logged(self, text: str) -> bool:
        return text in self.log.read_text()

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def wait_exit(self, timeout: float = DEADLINE) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the worker did not exit within {timeout}s; its log:\n{self.log.read_text()}")

    def stop(self) -> int:
        """SIGTERM, then wait: a graceful exit returns 0."""
        self.signal(signal.SIGTERM)
        return self.wait_exit()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._log_file.close()


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
