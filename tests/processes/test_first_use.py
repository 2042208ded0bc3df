"""What a newcomer tripped on, tried as a new user would (issue 28): a closed pipe, a hint naming a
command that then refuses, a worker that cannot reach its database, a traceback as a failed job's
"last error", a duration without its unit. Each test runs the real command (or the real worker and
dashboard) against a real database."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from datetime import timedelta

import psycopg
import pytest
from starlette.testclient import TestClient

from pgq_thin import AsyncClient, AsyncWorker, Client, Worker
from pgq_thin.cli import CLOSED_PIPE
from pgq_thin.dashboard.app import create_app
from pgq_thin.durations import format_duration, parse_duration
from pgq_thin.models import error_summary
from pgq_thin.testing import adrain, drain

from sqlhelpers import one

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def pgq(*args: str, dsn: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    full = [sys.executable, "-m", "pgq_thin", *args] + (["--dsn", dsn] if dsn is not None else [])
    return subprocess.run(full, capture_output=True, text=True, timeout=timeout)


def piped(*args: str, dsn: str, lines: int) -> subprocess.CompletedProcess[str]:
    """``pgq-thin ARGS | head -LINES``: read that many lines of its output, then close the pipe."""
    proc = subprocess.Popen([sys.executable, "-m", "pgq_thin", *args, "--dsn", dsn], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    read = [proc.stdout.readline() for _ in range(lines)]
    proc.stdout.close()
    stderr = proc.stderr.read()
    proc.wait(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, "".join(read), stderr)


# A closed pipe --------------------------------------------------------------------------------------

def test_jobs_piped_into_head_ends_quietly(dsn: str, conn: psycopg.Connection) -> None:
    # Rows of about 150 characters: 1000 of them are more than the pipe and Python's buffer hold.
    conn.execute("SELECT pgq.enqueue_many('q', %s, array_fill('{}'::jsonb, ARRAY[1000]))", ("k" * 80,))
    result = piped("jobs", "--limit", "1000", dsn=dsn, lines=1)
    assert result.stdout.split() == ["id", "queue", "kind", "state", "attempt", "run", "at", "created", "finished",
                                     "last", "error"]
    assert (result.returncode, result.stderr) == (CLOSED_PIPE, "")


def test_a_job_with_a_long_history_piped_into_head_ends_quietly(dsn: str, conn: psycopg.Connection) -> None:
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k', max_attempts => 200)")
    for _ in range(150):  # 150 failed attempts, each with a traceback of 12 lines
        attempt = one(conn, "SELECT attempt FROM pgq.claim('w1')")
        conn.execute("SELECT pgq.fail(%s, %s, %s, retry_in => '1 second')",
                     (job_id, attempt, "Traceback (most recent call last):\n" + '  File "x.py", line 1\n' * 10
                      + "ValueError: no"))
        conn.execute("UPDATE pgq.jobs SET run_at = now() WHERE id = %s", (job_id,))  # its retry is due now
    result = piped("job", str(job_id), dsn=dsn, lines=2)
    assert result.stdout.startswith(f"job {job_id}: pending")
    assert (result.returncode, result.stderr) == (CLOSED_PIPE, "")


def test_a_short_output_whose_reader_is_gone_ends_quietly(dsn: str, conn: psycopg.Connection) -> None:
    """stats writes less than a buffer: the write fails at the last flush, which is caught too."""
    conn.execute("SELECT pgq.enqueue('q', 'k')")
    result = piped("stats", dsn=dsn, lines=0)  # the reader closes the pipe before anything is written
    assert (result.returncode, result.stderr) == (CLOSED_PIPE, "")


# Hints name a command that works ---------------------------------------------------------------

def test_retrying_a_done_job_gives_no_hint_that_resolve_would_refuse(dsn: str, conn: psycopg.Connection) -> None:
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k')")
    attempt = one(conn, "SELECT attempt FROM pgq.claim('w1')")
    assert one(conn, "SELECT pgq.complete(%s, %s)", (job_id, attempt)) is True
    result = pgq("retry", str(job_id), dsn=dsn)
    assert result.returncode == 1
    assert result.stderr == (f"pgq-thin: error: job {job_id}: pgq: job {job_id} is done, only failed or cancelled "
                             "jobs can be retried [SQLSTATE 55000]\n")
    assert "resolve" not in result.stderr


@pytest.mark.parametrize("state", ["pending", "running"])
def test_retrying_an_unfinished_job_gives_no_hint(dsn: str, conn: psycopg.Connection, state: str) -> None:
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k')")
    if state == "running":
        conn.execute("SELECT pgq.claim('w1')")
    result = pgq("retry", str(job_id), dsn=dsn)
    assert result.returncode == 1 and f"is {state}, only failed" in result.stderr
    assert "hint" not in result.stderr.lower() and "resolve" not in result.stderr


def test_retrying_an_outcome_unknown_job_hints_resolve_and_resolve_works(dsn: str, conn: psycopg.Connection) -> None:
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k')")
    attempt = one(conn, "SELECT attempt FROM pgq.claim('w1')")
    conn.execute("SELECT pgq.mark_unknown(%s, %s, 'timed out')", (job_id, attempt))
    result = pgq("retry", str(job_id), dsn=dsn)
    assert result.returncode == 1
    hint = f"Settle it with pgq-thin resolve {job_id} done|pending|failed|cancelled."
    assert hint in result.stderr
    settled = pgq("resolve", str(job_id), "pending", dsn=dsn)  # what the hint names works
    assert (settled.returncode, settled.stdout) == (0, f"job {job_id}: resolved as pending\n"), settled.stderr


# A worker that cannot reach its database ---------------------------------------------------------

APP = "pgq_tools.demo_app:worker"


def test_a_worker_that_cannot_reach_its_database_exits_1_with_the_reason() -> None:
    started = time.monotonic()
    result = pgq("worker", "--app", APP, dsn="postgresql://postgres@127.0.0.1:1/nowhere")
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith("pgq-thin: error: connection failed: connection to server at \"127.0.0.1\", "
                                    "port 1 failed: Connection refused")
    assert len(result.stderr.splitlines()) == 1 and "started" not in result.stderr
    assert time.monotonic() - started < 30  # not retrying forever


def test_a_worker_on_a_database_without_pgq_says_to_migrate(empty_dsn: str) -> None:
    result = pgq("worker", "--app", APP, dsn=empty_dsn)
    assert result.returncode == 1
    assert result.stderr == ('pgq-thin: error: schema "pgq" does not exist [SQLSTATE 3F000] '
                             "(hint: pgq is not installed in this database: run pgq-thin migrate.)\n")


@pytest.mark.parametrize("command", [["worker", "--app", APP], ["stats"], ["enqueue", "q", "k"]])
def test_a_mysql_url_is_told_that_pgq_needs_postgresql(command: list[str]) -> None:
    result = pgq(*command, dsn="mysql://app:s3cret@db.example.com/app")
    assert result.returncode == 2
    assert result.stderr.startswith("pgq-thin: error: pgq needs a PostgreSQL database, and the address is a "
                                    "mysql:// URL: give a postgresql:// URL")
    assert "s3cret" not in result.stderr


def test_a_client_refuses_another_databases_url() -> None:
    from pgq_thin.errors import BadArgument

    with pytest.raises(BadArgument, match="pgq needs a PostgreSQL database.*mysql:// URL"):
        Client("mysql://app@localhost/app")


# A failed job's last error ------------------------------------------------------------------------

def bad_address(job: object, ctx: object) -> None:
    raise ValueError("bad address: ada@")


async def bad_address_async(job: object, ctx: object) -> None:
    await asyncio.sleep(0)
    raise ValueError("bad address: ada@")


def _stored_traceback(runtime: str, dsn: str) -> str:
    with Client(dsn, max_size=1) as client:
        job_id = client.enqueue("mail", "send", {}, max_attempts=1)
    if runtime == "threads":
        worker = Worker(queues=["mail"])
        worker.handler("send")(bad_address)
        result = drain(worker, dsn)
    else:
        worker = AsyncWorker(queues=["mail"])
        worker.handler("send")(bad_address_async if runtime == "asyncio" else bad_address)
        result = asyncio.run(adrain(worker, dsn))
    assert result.outcomes == {job_id: "failed"}
    error = result[job_id].error
    assert error is not None
    return error


@pytest.mark.parametrize("runtime", ["threads", "asyncio", "asyncio-thread"])
def test_a_stored_traceback_starts_at_the_handler_without_pgqs_executor_frame(dsn: str, runtime: str) -> None:
    error = _stored_traceback(runtime, dsn)
    lines = error.strip().splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert re.match(r'  File ".*test_first_use\.py", line \d+, in bad_address', lines[1]), error
    assert "pgq_thin" not in error and "asyncio" not in error and "threading" not in error
    assert lines[-1] == "ValueError: bad address: ada@"


def test_the_dashboard_lists_a_failed_jobs_exception_and_keeps_its_traceback_in_the_history(dsn: str) -> None:
    error = _stored_traceback("threads", dsn)
    with Client(dsn, max_size=2) as client, TestClient(create_app(lambda: AsyncClient(dsn, max_size=2))) as http:
        listing = http.get("/jobs?state=failed").text
        [job_id] = [j.id for j in client.list_jobs(state="failed")]
        page = http.get(f"/jobs/{job_id}").text
    assert "ValueError: bad address: ada@" in listing and "Traceback" not in listing
    assert '<pre class="error">Traceback (most recent call last):' in page  # the history's failed attempt
    assert f'<pre id="last-error" class="error">{error.strip().splitlines()[0]}' in page


def test_the_cli_lists_the_exception_and_prints_tracebacks_on_lines_of_their_own(dsn: str) -> None:
    error = _stored_traceback("threads", dsn)
    listing = pgq("jobs", dsn=dsn).stdout
    assert listing.splitlines()[2].endswith("ValueError: bad address: ada@")
    job_id = listing.splitlines()[2].split()[0]
    detail = pgq("job", job_id, dsn=dsn).stdout
    assert max(len(line) for line in detail.splitlines()) < 200  # no traceback as one long cell
    history = detail.split("history (oldest first)\n")[1]
    assert "ValueError: bad address: ada@ (in full below)" in history
    block = history.split("failed at attempt 1 (")[1].splitlines()[1:]
    assert [line.removeprefix("  ") for line in block] == error.strip().splitlines()


@pytest.mark.parametrize(("error", "summary"), [
    (None, None),
    ("", None),
    ("smtp said no", "smtp said no"),
    ("first line\nsecond line", "first line"),
    ('Traceback (most recent call last):\n  File "a.py", line 1, in f\n    f()\n    ^^^\n'
     "KeyError: 'x'", "KeyError: 'x'"),
    # A message of several lines: the exception's line, not the message's last line.
    ('Traceback (most recent call last):\n  File "a.py", line 1, in f\n    f()\n'
     "psycopg.errors.UniqueViolation: duplicate key\nDETAIL:  Key (id)=(1) already exists.",
     "psycopg.errors.UniqueViolation: duplicate key"),
    # Chained: the last exception's.
    ('Traceback (most recent call last):\n  File "a.py", line 1, in f\n    g()\nOSError: disk\n\n'
     "During handling of the above exception, another exception occurred:\n\n"
     'Traceback (most recent call last):\n  File "a.py", line 3, in f\n    h()\nRuntimeError: gave up',
     "RuntimeError: gave up"),
])
def test_an_errors_summary(error: str | None, summary: str | None) -> None:
    assert error_summary(error) == summary


# Durations ----------------------------------------------------------------------------------------

def test_a_duration_without_a_unit_is_refused(dsn: str) -> None:
    result = pgq("schedule", "add", "s", "q", "k", "--every", "5", dsn=dsn)
    assert result.returncode == 2
    assert ("argument --every: a duration needs a unit: '5' could be 5s, 5m or 5h (units: ms, s, m, h, d)"
            in result.stderr)
    assert "a bare number is refused" in " ".join(pgq("schedule", "add", "--help").stdout.split())


def test_the_cli_and_the_dashboard_write_an_interval_the_same_way(dsn: str) -> None:
    added = pgq("schedule", "add", "hourly", "q", "k", "--every", "1h", dsn=dsn)
    assert added.returncode == 0, added.stderr
    listed = pgq("schedule", "list", dsn=dsn).stdout
    assert "every 1h " in listed
    with TestClient(create_app(lambda: AsyncClient(dsn, max_size=2))) as http:
        assert "every 1h," in http.get("/schedules").text or "every 1h<" in http.get("/schedules").text


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0s"), (0.25, "250ms"), (4.5, "4.5s"), (60, "1m"), (192, "3m 12s"), (3600, "1h"), (5400, "1h 30m"),
    (7500, "2h 5m"), (86400, "1d"), (273600, "3d 4h"),
])
def test_a_written_duration_reads_back(seconds: float, text: str) -> None:
    assert format_duration(timedelta(seconds=seconds)) == text
    assert parse_duration(text) == timedelta(seconds=seconds)
