"""Worker processes, for the demo, the soak and pgq's own crash and signal tests: each one a real
``python`` process (``pgq-thin worker --app module:attr``, or a script) with its output in a log
file, that can be signalled, frozen, killed and stopped gracefully.

    fleet = Fleet(log_dir)
    fleet.start("w1", worker_command("pgq_tools.demo_app:worker", dsn, queues=["demo"]))
    fleet["w1"].signal(signal.SIGKILL)
    fleet.stop()        # SIGTERM to all (thawing frozen ones), a grace period, then SIGKILL
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

__all__ = ["Fleet", "WorkerProcess", "stop_processes", "worker_command"]


def worker_command(app: str, dsn: str, *, queues: Sequence[str] | None = None, concurrency: int | None = None,
                   quiet: bool = True) -> list[str]:
    """``python -m pgq_thin worker --app APP --dsn DSN ...``: the command a user runs."""
    command = [sys.executable, "-m", "pgq_thin", "worker", "--app", app, "--dsn", dsn]
    if queues:
        command += ["--queues", ",".join(queues)]
    if concurrency is not None:
        command += ["--concurrency", str(concurrency)]
    return command + (["--quiet"] if quiet else [])


class WorkerProcess:
    """One process, its stdout and stderr in ``log``."""

    def __init__(self, command: Sequence[str], log: str | os.PathLike[str], *,
                 env: Mapping[str, str] | None = None, cwd: str | os.PathLike[str] | None = None) -> None:
        self.command = list(command)
        self.log = Path(log)
        with open(self.log, "wb") as log_file:
            self.process = subprocess.Popen(self.command, stdout=log_file, stderr=subprocess.STDOUT,
                                            env={**os.environ, **(env or {})}, cwd=cwd)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def logged(self, text: str) -> bool:
        return text in self.log_text()

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def freeze(self) -> None:
        self.signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self.signal(signal.SIGCONT)

    def kill(self) -> None:
        """kill -9, and reap it."""
        if self.alive:
            self.process.kill()
        self.process.wait()

    def wait_exit(self, timeout: float) -> int:
        """The exit code; raises subprocess.TimeoutExpired when it is still running."""
        return self.process.wait(timeout)

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, then wait for the exit code (a graceful exit returns 0)."""
        self.signal(signal.SIGTERM)
        return self.wait_exit(timeout)

    def close(self) -> None:
        """Kill it if it still runs."""
        self.kill()


def stop_processes(procs: Iterable[WorkerProcess], timeout: float = 20) -> None:
    """SIGTERM every live process (thawing a frozen one first), wait up to ``timeout`` seconds in
    all for them to shut down gracefully, then kill what is left."""
    procs = list(procs)
    for proc in procs:
        if proc.alive:
            proc.thaw()
            proc.process.terminate()
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.wait_exit(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()


class Fleet:
    """Worker processes by name, their logs in ``log_dir`` (``<name>.log``)."""

    def __init__(self, log_dir: str | os.PathLike[str]) -> None:
        self.log_dir = os.fspath(log_dir)
        self.procs: dict[str, WorkerProcess] = {}

    def start(self, name: str, command: Sequence[str], *, env: Mapping[str, str] | None = None,
              cwd: str | os.PathLike[str] | None = None) -> WorkerProcess:
        """Start ``command`` as the process ``name`` (replacing a dead one of that name)."""
        proc = WorkerProcess(command, os.path.join(self.log_dir, f"{name}.log"), env=env, cwd=cwd)
        self.procs[name] = proc
        return proc

    def __getitem__(self, name: str) -> WorkerProcess:
        return self.procs[name]

    def __iter__(self) -> Iterator[WorkerProcess]:
        return iter(list(self.procs.values()))

    def __len__(self) -> int:
        return len(self.procs)

    def stop(self, timeout: float = 20) -> None:
        """Stop every process gracefully (see stop_processes)."""
        stop_processes(self.procs.values(), timeout)

    def close(self) -> None:
        """Kill whatever still runs."""
        for proc in self.procs.values():
            proc.close()
