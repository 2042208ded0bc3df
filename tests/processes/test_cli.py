"""The pgq-thin command: each subcommand against a real database, run as a user would run it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest

from clikit import pgq
from sqlhelpers import job, one, wait_for


def test_migrate_is_a_no_op_when_up_to_date_and_lists_pending(dsn: str, empty_dsn: str) -> None:
    shipped = sorted(f.stem for f in (Path(__file__).resolve().parents[2] / "migrations").glob("[0-9]*.sql"))
    assert shipped[:2] == ["0001_initial", "0002_cheaper_name_checks"]
    listed = pgq("migrate", "--list", dsn=empty_dsn)
    assert listed.returncode == 0
    assert listed.stdout.splitlines() == [f"pending: {m}" for m in shipped]
    applied = pgq("migrate", dsn=empty_dsn)
    assert applied.returncode == 0
    assert f"applied: {', '.join(shipped)}" in applied.stdout
    again = pgq("migrate", dsn=dsn)
    assert again.returncode == 0 and "up to date" in again.stdout


def test_enqueue_takes_the_payload_from_an_argument_or_stdin(dsn: str, conn: psycopg.Connection) -> None:
    first = pgq("enqueue", "emails", "send", '{"to": "a"}', "--priority", "3", dsn=dsn)
    assert first.returncode == 0, first.stderr
    second = pgq("enqueue", "emails", "send", "-", dsn=dsn, stdin=json.dumps({"to": "b"}))
    assert second.returncode == 0, second.stderr
    a, b = int(first.stdout), int(second.stdout)
    assert (job(conn, a)["payload"], job(conn, a)["priority"]) == ({"to": "a"}, 3)
    assert job(conn, b)["payload"] == {"to": "b"}


def test_enqueue_takes_a_concurrency_key(dsn: str, conn: psycopg.Connection) -> None:
    result = pgq("enqueue", "q", "k", "--concurrency-key", "customer-7", dsn=dsn)
    assert result.returncode == 0, result.stderr
    assert job(conn, int(result.stdout))["concurrency_key"] == "customer-7"
    shown = pgq("job", result.stdout.strip(), dsn=dsn)
    assert shown.returncode == 0 and "customer-7" in shown.stdout
    bad = pgq("enqueue", "q", "k", "--concurrency-key", "", dsn=dsn)
    assert bad.returncode == 1 and 'argument "concurrency_key"' in bad.stderr and "22023" in bad.stderr


def test_dsn_is_read_from_the_environment(dsn: str) -> None:
    result = pgq("enqueue", "q", "k", env={"PGQ_DSN": dsn})
    assert result.returncode == 0 and int(result.stdout) > 0


def test_errors_print_one_clear_line_and_exit_non_zero(dsn: str, conn: psycopg.Connection) -> None:
    bad = pgq("enqueue", "bad queue!", "k", dsn=dsn)
    assert bad.returncode == 1
    assert bad.stderr.count("\n") == 1 and 'argument "queue"' in bad.stderr and "22023" in bad.stderr
    not_json = pgq("enqueue", "q", "k", "{nope", dsn=dsn)
    assert not_json.returncode == 2 and "not valid JSON" in not_json.stderr  # refused before anything is sent
    unknown = pgq("cancel", "999999", dsn=dsn)
    assert unknown.returncode == 1 and "no job with id 999999" in unknown.stderr
    unreachable = pgq("stats", dsn="postgresql://nobody@127.0.0.1:1/none")
    assert unreachable.returncode == 1 and unreachable.stderr.startswith("pgq-thin: error:")
    no_db = pgq("stats", env={"PGQ_DSN": "", "DATABASE_URL": ""})
    assert no_db.returncode == 1 and "no database given" in no_db.stderr
    for setting, value in (("--concurrency", "0"), ("--prefetch", "-1")):
        out_of_range = pgq("worker", "--app", "pgq_tools.demo_app:worker", setting, value, dsn=dsn)
        assert out_of_range.returncode == 2, out_of_range.stderr  # refused before connecting
        assert out_of_range.stderr.count("\n") == 1 and setting[2:] + " must be" in out_of_range.stderr
    not_a_number = pgq("worker", "--app", "pgq_tools.demo_app:worker", "--prefetch", "soon", dsn=dsn)
    assert not_a_number.returncode == 2 and "must be auto or a number, got 'soon'" in not_a_number.stderr
    assert one(conn, "SELECT count(*) FROM pgq.jobs") == 0


def test_stats_sweep_prune_retry_cancel_pause_resume(dsn: str, conn: psycopg.Connection) -> None:
    ids = [one(conn, "SELECT pgq.enqueue('q', 'k')") for _ in range(3)]
    stats = pgq("stats", dsn=dsn)
    assert stats.returncode == 0
    [row] = [line.split() for line in stats.stdout.splitlines() if line.startswith("q ")]
    assert row[:4] == ["q", "no", "3", "0"]

    assert "cancelled" in pgq("cancel", str(ids[0]), dsn=dsn).stdout
    assert job(conn, ids[0])["state"] == "cancelled"
    assert pgq("retry", str(ids[0]), dsn=dsn).returncode == 0
    assert job(conn, ids[0])["state"] == "pending"

    assert pgq("pause", "q", dsn=dsn).returncode == 0
    assert one(conn, "SELECT paused FROM pgq.queues WHERE name = 'q'") is True
    assert pgq("resume", "q", dsn=dsn).returncode == 0
    assert one(conn, "SELECT paused FROM pgq.queues WHERE name = 'q'") is False

    [claimed] = conn.execute("SELECT id, attempt FROM pgq.claim('w', '{q}')").fetchall()
    conn.execute("UPDATE pgq.jobs SET lease_until = now() - interval '1 s' WHERE id = %s", (claimed[0],))
    sweep = pgq("sweep", dsn=dsn)
    assert sweep.returncode == 0 and "recovered 1 job" in sweep.stdout

    for job_id in ids:
        conn.execute("UPDATE pgq.jobs SET state = 'done', finished_at = now() - interval '2 days', "
                     "lease_until = NULL WHERE id = %s", (job_id,))
    pruned = pgq("prune", "--older-than", "1d", "--batch", "2", "--all", dsn=dsn)
    assert pruned.returncode == 0 and "pruned 3 finished job(s)" in pruned.stdout
    assert one(conn, "SELECT count(*) FROM pgq.jobs") == 0


def test_version_flag() -> None:
    import importlib.metadata

    import pgq_thin

    result = pgq("--version")
    # One version number: the installed distribution's metadata is read from pgq_thin.__version__.
    assert pgq_thin.__version__ == importlib.metadata.version("pgq-thin")
    assert result.returncode == 0 and result.stdout.strip() == f"pgq-thin {pgq_thin.__version__}"


@pytest.mark.parametrize("text, seconds", [("30s", 30), ("500ms", 0.5), ("5m", 300), ("2h", 7200), ("7d", 604800),
                                           ("1h 30m", 5400), ("1h30m", 5400)])
def test_durations_on_the_command_line(text: str, seconds: float) -> None:
    from pgq_thin.cli import duration

    assert duration(text).total_seconds() == seconds


def test_worker_command_runs_an_async_app_until_sigterm_and_refuses_what_is_not_a_worker(
        dsn: str, conn: psycopg.Connection) -> None:
    root = Path(__file__).resolve().parents[2]
    conn.execute("SELECT pgq.enqueue_many('default', 'sleep', array_fill('{\"seconds\": 0}'::jsonb, ARRAY[5]))")
    proc = subprocess.Popen([sys.executable, "-m", "pgq_thin", "worker", "--app", "tests.apps.sleepy_async:worker",
                             "--dsn", dsn, "--quiet"], cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        wait_for(lambda: one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'done'") == 5
                 or proc.poll() is not None, "the async worker to do the jobs")
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert one(conn, "SELECT count(DISTINCT claimed_by) FROM pgq.jobs") == 1
    not_a_worker = pgq("worker", "--app", "pgq_thin.queries:CLAIM", dsn=dsn)
    assert not_a_worker.returncode == 2
    assert not_a_worker.stderr == ("pgq-thin: error: --app must name a pgq_thin Worker or AsyncWorker; "
                                   "'pgq_thin.queries:CLAIM' is a str\n")


def test_schedule_add_list_rm(dsn: str, conn: psycopg.Connection) -> None:
    added = pgq("schedule", "add", "hourly-report", "reports", "build", "--every", "1h",
                "--payload", '{"r": 1}', "--skip-if-running", dsn=dsn)
    assert added.returncode == 0, added.stderr
    assert added.stdout.startswith("schedule hourly-report: next run at ")
    row = conn.execute("SELECT queue, kind, every, payload, skip_if_running FROM pgq.schedules").fetchone()
    assert row == ("reports", "build", timedelta(hours=1), {"r": 1}, True)
    listed = pgq("schedule", "list", dsn=dsn)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split()[:4] == ["name", "queue", "kind", "when"]
    assert lines[2].split()[:5] == ["hourly-report", "reports", "build", "every", "1h"]
    neither = pgq("schedule", "add", "x", "q", "k", dsn=dsn)
    assert neither.returncode == 2 and "one of the arguments --cron --every is required" in neither.stderr
    bad = pgq("schedule", "add", "x", "q", "k", "--every", "0.5s", dsn=dsn)
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and 'argument "every"' in bad.stderr
    removed = pgq("schedule", "rm", "hourly-report", dsn=dsn)
    assert removed.returncode == 0 and "removed" in removed.stdout
    again = pgq("schedule", "rm", "hourly-report", dsn=dsn)
    assert again.returncode == 1 and "no schedule named 'hourly-report'" in again.stderr
    assert pgq("schedule", "list", dsn=dsn).stdout.strip() == "no schedules"
