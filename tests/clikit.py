"""Helpers of the CLI tests: run pgq-thin as a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys


def pgq(*args: str, dsn: str | None = None, stdin: str | None = None, env: dict[str, str] | None = None,
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    full = [sys.executable, "-m", "pgq_thin", *args]
    if dsn is not None:
        full += ["--dsn", dsn]
    return subprocess.run(full, input=stdin, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
