"""Issue 26 from the shell: pgq-thin wait (the result as JSON; exit 0 done, 1 failed or cancelled,
3 timed out, 2 a usage error), pgq-thin job showing a job's dependencies, dependants and batch,
and pgq-thin enqueue's --dependency-mode, --batch and --notify-finished. Run as a user runs them,
against a real database."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime

import psycopg
import pytest

from pgq_thin import Client

from clikit import pgq
from sqlhelpers import job, one, wait_for


def _finish(client: Client, job_id: int, how: str = "done", result: object = None) -> None:
    queue = client.get_job(job_id).queue
    [claimed] = client.claim("w", [queue])
    assert claimed.id == job_id
    if how == "done":
        assert client.complete(claimed.id, claimed.attempt, result)
    else:
        assert client.fail(claimed.id, claimed.attempt, "boom\nin two lines", retryable=False) == "failed"


@pytest.fixture
def client(dsn: str):
    with Client(dsn) as c:
        yield c


def test_wait_prints_the_result_and_exits_0_when_done(dsn: str, client: Client) -> None:
    job_id = client.enqueue("q", "k")
    _finish(client, job_id, "done", {"total": 3, "name": "\u202eevil"})
    done = pgq("wait", str(job_id), dsn=dsn)
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert set(printed) == {"state", "result", "last_error", "finished_at"}
    assert (printed["state"], printed["result"], printed["last_error"]) == (
        "done", {"total": 3, "name": "\u202eevil"}, None)
    assert datetime.fromisoformat(printed["finished_at"]) == client.job_result(job_id).finished_at
    assert "\u202e" not in done.stdout  # JSON escapes, never the control itself


@pytest.mark.parametrize("how", ["failed", "cancelled"])
def test_wait_exits_1_when_the_job_failed_or_was_cancelled(dsn: str, client: Client, how: str) -> None:
    job_id = client.enqueue("q", "k")
    if how == "failed":
        _finish(client, job_id, "failed")
    else:
        client.cancel(job_id)
    ended = pgq("wait", str(job_id), "--timeout", "5", dsn=dsn)
    assert ended.returncode == 1 and ended.stderr == ""
    printed = json.loads(ended.stdout)
    assert printed["state"] == how
    assert (printed["last_error"] == "boom\nin two lines") if how == "failed" else True


def test_wait_exits_3_on_timeout_naming_the_job_and_its_state(dsn: str, client: Client) -> None:
    job_id = client.enqueue("q", "k")
    at_once = pgq("wait", str(job_id), "--timeout", "0", dsn=dsn)
    assert at_once.returncode == 3 and at_once.stdout == ""
    assert at_once.stderr.strip() == f"pgq-thin: job {job_id} did not finish within 0s: it is pending"
    client.claim("w", ["q"])
    later = pgq("wait", str(job_id), "--timeout", "200ms", dsn=dsn)
    assert later.returncode == 3 and f"job {job_id}" in later.stderr and "running" in later.stderr


def test_wait_errors_and_usage_errors(dsn: str) -> None:
    unknown = pgq("wait", "987654", "--timeout", "1", dsn=dsn)
    assert unknown.returncode == 1 and unknown.stdout == "" and "P0002" in unknown.stderr
    for bad in (["wait", "x"], ["wait", "1", "--timeout", "-1"], ["wait", "1", "--timeout", "soon"]):
        usage = pgq(*bad, dsn=dsn)
        assert usage.returncode == 2 and "--help" in usage.stderr, bad
    helped = pgq("wait", "--help")
    assert helped.returncode == 0
    text = " ".join(helped.stdout.split())
    assert "exits 0 when it is done, 1 when it failed or was cancelled" in text and "3 when" in text


def test_wait_returns_when_another_connection_ends_a_notified_job(dsn: str, conn: psycopg.Connection,
                                                                  client: Client) -> None:
    job_id = client.enqueue("q", "k", notify_finished=True)
    waiter = subprocess.Popen([sys.executable, "-m", "pgq_thin", "wait", str(job_id), "--timeout", "120",
                               "--dsn", dsn], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ))
    try:
        wait_for(lambda: one(conn, "SELECT count(*) > 0 FROM pg_stat_activity WHERE state = 'idle'"
                                   " AND query LIKE '%%pgq.job_result%%' AND pid <> pg_backend_pid()"),
                 "pgq-thin wait to listen and read the result once", timeout=60)
        _finish(client, job_id, "done", {"ok": 1})
        out, err = waiter.communicate(timeout=120)
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.communicate()
    assert waiter.returncode == 0, err
    assert json.loads(out)["result"] == {"ok": 1}


def test_enqueue_takes_dependency_mode_batch_and_notify_finished(dsn: str, conn: psycopg.Connection,
                                                                 client: Client) -> None:
    dep = client.enqueue("q", "dep")
    batch = client.batch_open("callbacks", "report")
    made = pgq("enqueue", "q", "k", "--depends-on", str(dep), "--dependency-mode", "all_ended",
               "--batch", str(batch), "--notify-finished", dsn=dsn)
    assert made.returncode == 0, made.stderr
    row = job(conn, int(made.stdout))
    assert (row["dependency_mode"], row["batch_id"], row["notify_finished"]) == ("all_ended", batch, True)
    plain = job(conn, int(pgq("enqueue", "q", "k", dsn=dsn).stdout))
    assert (plain["dependency_mode"], plain["batch_id"], plain["notify_finished"]) == (None, None, False)
    bad_mode = pgq("enqueue", "q", "k", "--dependency-mode", "some_done", dsn=dsn)
    assert bad_mode.returncode == 2 and "--dependency-mode" in bad_mode.stderr
    bad_batch = pgq("enqueue", "q", "k", "--batch", "x", dsn=dsn)
    assert bad_batch.returncode == 2 and "not a batch id" in bad_batch.stderr
    unknown_batch = pgq("enqueue", "q", "k", "--batch", "987654", dsn=dsn)
    assert unknown_batch.returncode == 1 and "batch" in unknown_batch.stderr and "22023" in unknown_batch.stderr


def test_job_shows_its_dependencies_dependants_and_batch(dsn: str, conn: psycopg.Connection, client: Client) -> None:
    a, b = client.enqueue("q", "a"), client.enqueue("other", "b")
    batch = client.batch_open("callbacks", "report", run_when="all_done")
    c = client.enqueue("q", "c", depends_on=[a, b], dependency_mode="all_ended", batch=batch)
    d = client.enqueue("q", "d", depends_on=[c])
    client.batch_close(batch)
    shown = pgq("job", str(c), dsn=dsn)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert f"depends on   {a}, {b} (all_ended)" in lines
    assert f"batch        {batch}" in lines
    assert f"enqueued by  {one(conn, 'SELECT session_user')}" in lines
    deps = lines.index("dependencies")
    assert lines[deps + 1].split() == ["id", "queue", "kind", "state"]
    assert lines[deps + 3].split() == [str(a), "q", "a", "pending"]
    assert lines[deps + 4].split() == [str(b), "other", "b", "pending"]
    dependants = lines.index("dependants (jobs that wait for it)")
    assert lines[dependants + 3].split() == [str(d), "q", "d", "waiting"]
    assert (f"batch {batch}: sealed, 1 member(s): 1 unfinished, 0 done, 0 failed, 0 cancelled") in lines
    assert "callback     callbacks/report when all_done: not enqueued yet" in lines

    plain = pgq("job", str(client.enqueue("q", "plain")), dsn=dsn)
    assert plain.returncode == 0
    assert "dependencies" not in plain.stdout and "dependants" not in plain.stdout
    assert "batch " not in plain.stdout.replace("batch        -", "")
