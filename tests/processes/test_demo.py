"""The demo is the main job: it must run end to end on its own throwaway server and say what it saw."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import psycopg
import pytest

from sqlhelpers import one


@pytest.mark.slow
def test_demo_on_a_throwaway_server_recovers_the_crash_and_rejects_the_stale_write() -> None:
    result = subprocess.run([sys.executable, "-m", "pgq_thin", "demo", "--jobs", "500"],
                            capture_output=True, text=True, timeout=300)
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "Starting a throwaway PostgreSQL" in out and "Stopped the throwaway PostgreSQL" in out
    assert re.search(r"jobs done\s+500/500 \(\+ the slow job: done\)", out), out
    assert re.search(r"killed demo-worker-\d+ \(pid \d+, kill -9\)", out), out
    # The killed worker's job finished on a later attempt; the frozen worker's late write was rejected.
    assert re.search(r"\(its worker was killed\): done at attempt [2-9]", out), out
    assert re.search(r"stale writes\s+[1-9]\d* rejected by the fence", out), out
    assert "rejected" in out.split("(its worker was frozen past its lease)")[1]
    assert "result           OK" in out
    # Every job it shows is introduced before it is shown, and nothing is left behind.
    crash_id = re.search(r"and job (\d+), a slow one \(30 s, claimed first\): its worker will be killed", out)
    freeze_id = re.search(r"enqueued job (\d+), a slow one \(4 s, claimed next\): its worker will be frozen", out)
    assert crash_id and freeze_id, out
    assert f"job {crash_id[1]} (its worker was killed)" in out and f"job {freeze_id[1]} (its worker was frozen" in out
    assert "Each claim is an attempt" in out
    log_dir = re.search(r"their logs in (\S+), removed at the end", out)
    assert log_dir, out
    assert not os.path.exists(log_dir[1])


@pytest.mark.slow
def test_demo_on_your_database_says_what_it_leaves_there(dsn: str) -> None:
    from pgq_tools.demo import LEFT_BEHIND

    result = subprocess.run([sys.executable, "-m", "pgq_thin", "demo", "--jobs", "200", "--dsn", dsn],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"1. Using the database you gave (--dsn); the demo's jobs go to queue 'demo'. {LEFT_BEHIND}"
    assert lines[-1] == f"7. {LEFT_BEHIND}"
    with psycopg.connect(dsn) as conn:  # and that is what it left
        assert conn.execute("SELECT DISTINCT queue FROM pgq.jobs").fetchall() == [("demo",)]
        assert conn.execute("SELECT name FROM pgq.queues").fetchall() == [("demo",)]


def test_worker_command_runs_an_app_until_sigterm(dsn: str, conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.enqueue_many('cli', 'demo.work', array_fill('{\"ms\": 1}'::jsonb, ARRAY[20]))")
    proc = subprocess.Popen([sys.executable, "-m", "pgq_thin", "worker", "--app", "pgq_tools.demo_app:worker",
                             "--dsn", dsn, "--queues", "cli", "--concurrency", "2", "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'done'") < 20:
            assert time.monotonic() < deadline, "the worker did not finish the jobs"
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert one(conn, "SELECT count(DISTINCT claimed_by) FROM pgq.jobs") == 1
    assert one(conn, "SELECT count(*) FROM pgq.job_events WHERE event = 'completed'") == 20


def test_worker_command_reports_a_bad_app_in_one_line(dsn: str) -> None:
    result = subprocess.run([sys.executable, "-m", "pgq_thin", "worker", "--app", "no.such.module:worker",
                             "--dsn", dsn], capture_output=True, text=True, timeout=60,
                            env={**os.environ})
    assert result.returncode == 1
    assert result.stderr.startswith("pgq-thin: error: cannot load the worker 'no.such.module:worker'")
