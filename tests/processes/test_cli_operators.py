"""The operator's commands: several ids, each reported, the exit code saying whether any failed;
looking at one job; settling an outcome_unknown job; messages and hints written for a CLI user."""

from __future__ import annotations

import psycopg

from clikit import pgq
from sqlhelpers import claim, job, one


def _finished(conn: psycopg.Connection, job_id: int, state: str) -> None:
    conn.execute("UPDATE pgq.jobs SET state = %s, finished_at = now(), lease_until = NULL WHERE id = %s",
                 (state, job_id))


def test_cancel_acts_on_every_id_reports_each_and_fails_when_any_failed(dsn: str, conn: psycopg.Connection) -> None:
    a, b = (one(conn, "SELECT pgq.enqueue('q', 'k')") for _ in range(2))
    first_unknown = pgq("cancel", "999", str(a), dsn=dsn)
    assert first_unknown.returncode == 1
    assert first_unknown.stdout == f"job {a}: cancelled\n"
    assert first_unknown.stderr.splitlines() == [
        "pgq-thin: error: job 999: pgq: no job with id 999 [SQLSTATE P0002] (hint: It may have been pruned.)",
        "pgq-thin: 1 of 2 jobs failed; the others were acted on",
    ]
    assert job(conn, a)["state"] == "cancelled"

    last_unknown = pgq("cancel", str(b), "999", str(a), dsn=dsn)
    assert last_unknown.returncode == 1
    assert last_unknown.stdout.splitlines() == [f"job {b}: cancelled", f"job {a}: had already finished, unchanged"]
    assert "job 999: pgq: no job with id 999" in last_unknown.stderr
    assert job(conn, b)["state"] == "cancelled"

    all_fine = pgq("cancel", str(a), str(b), dsn=dsn)
    assert all_fine.returncode == 0 and all_fine.stderr == ""


def test_retry_acts_on_every_id_and_its_hint_names_the_command(dsn: str, conn: psycopg.Connection) -> None:
    failed, unknown, pending = (one(conn, "SELECT pgq.enqueue('q', 'k')") for _ in range(3))
    _finished(conn, failed, "failed")
    conn.execute("UPDATE pgq.jobs SET state = 'outcome_unknown', finished_at = NULL WHERE id = %s", (unknown,))
    result = pgq("retry", str(unknown), str(failed), str(pending), dsn=dsn)
    assert result.returncode == 1
    assert result.stdout == f"job {failed}: pending again\n"
    errors = result.stderr.splitlines()
    assert errors[0] == (f"pgq-thin: error: job {unknown}: pgq: job {unknown} is outcome_unknown, only failed or "
                         "cancelled jobs can be retried [SQLSTATE 55000] "
                         f"(hint: Settle it with pgq-thin resolve {unknown} done|pending|failed|cancelled.)")
    assert errors[1].startswith(f"pgq-thin: error: job {pending}: pgq: job {pending} is pending")
    assert errors[2] == "pgq-thin: 2 of 3 jobs failed; the others were acted on"
    assert "pgq.resolve" not in result.stderr
    assert job(conn, failed)["state"] == "pending"


def test_resolve_settles_an_outcome_unknown_job(dsn: str, conn: psycopg.Connection) -> None:
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k')")
    [claimed] = claim(conn, queues=["q"])
    conn.execute("SELECT pgq.mark_unknown(%s, %s, 'the payment API timed out')", (job_id, claimed["attempt"]))
    bad_state = pgq("resolve", str(job_id), "finished", dsn=dsn)
    assert bad_state.returncode == 1
    assert 'argument "state" must be done, failed, cancelled or pending' in bad_state.stderr
    resolved = pgq("resolve", str(job_id), "done", dsn=dsn)
    assert resolved.returncode == 0, resolved.stderr
    assert resolved.stdout == f"job {job_id}: resolved as done\n"
    assert job(conn, job_id)["state"] == "done"
    again = pgq("resolve", str(job_id), "done", dsn=dsn)
    assert again.returncode == 1 and "only outcome_unknown jobs can be resolved" in again.stderr


def test_job_shows_the_job_its_payload_result_error_and_history(dsn: str, conn: psycopg.Connection) -> None:
    job_id = one(conn, """SELECT pgq.enqueue('emails', 'send_welcome', '{"user_id": 45}', max_attempts => 2)""")
    [first] = claim(conn, "worker-a", ["emails"])
    conn.execute("SELECT pgq.fail(%s, %s, 'SMTP timeout')", (job_id, first["attempt"]))
    conn.execute("UPDATE pgq.jobs SET run_at = now() - interval '1 s' WHERE id = %s", (job_id,))
    [second] = claim(conn, "worker-b", ["emails"])
    conn.execute("""SELECT pgq.complete(%s, %s, '{"sent": true}')""", (job_id, second["attempt"]))
    shown = pgq("job", str(job_id), dsn=dsn)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == f"job {job_id}: done (attempt 2 of 2), queue emails, kind send_welcome"
    text = shown.stdout
    assert 'payload      {"user_id": 45}' in text
    assert 'result       {"sent": true}' in text
    assert "last error   SMTP timeout" in text
    assert "claimed by   worker-b" in text
    history = text[text.index("history"):].splitlines()
    events = [line.split()[3] for line in history[3:]]  # date, time, attempt, event
    assert events == ["claimed", "failed", "claimed", "completed"]
    missing = pgq("job", "999", dsn=dsn)
    assert missing.returncode == 1 and "no job with id 999" in missing.stderr


def test_job_shows_a_repeated_rejection_once_with_its_count(dsn: str, conn: psycopg.Connection) -> None:
    job_id = one(conn, "SELECT pgq.enqueue('emails', 'send_welcome')")
    claim(conn, "worker-a", ["emails"])
    conn.execute("SELECT pgq.complete(%s, 99) FROM generate_series(1, 3)", (job_id,))
    shown = pgq("job", str(job_id), dsn=dsn)
    assert shown.returncode == 0, shown.stderr
    history = shown.stdout[shown.stdout.index("history"):].splitlines()
    assert [line.split()[3:5] for line in history[3:]] == [["claimed", "worker-a"], ["rejected", "x3"]]


def test_an_enqueue_that_hit_a_unique_key_says_so(dsn: str, conn: psycopg.Connection) -> None:
    first = pgq("enqueue", "emails", "welcome", "--unique-key", "welcome:45", dsn=dsn)
    assert first.returncode == 0, first.stderr
    job_id = int(first.stdout)
    again = pgq("enqueue", "emails", "welcome", "--unique-key", "welcome:45", dsn=dsn)
    assert again.returncode == 0, again.stderr
    assert again.stdout == f"{job_id}\n"
    assert again.stderr == f"pgq-thin: existing job {job_id} (unique key welcome:45): nothing enqueued\n"
    assert one(conn, "SELECT count(*) FROM pgq.jobs") == 1
    _finished(conn, job_id, "done")  # the key is free again once its job has finished
    third = pgq("enqueue", "emails", "welcome", "--unique-key", "welcome:45", dsn=dsn)
    assert third.returncode == 0 and int(third.stdout) != job_id and third.stderr == ""


def test_a_database_without_pgq_says_to_run_migrate(empty_dsn: str) -> None:
    for command in (("stats",), ("enqueue", "q", "k"), ("cancel", "1")):
        result = pgq(*command, dsn=empty_dsn)
        assert result.returncode == 1
        assert result.stderr.count("\n") == 1, result.stderr
        assert "3F000" in result.stderr
        assert "(hint: pgq is not installed in this database: run pgq-thin migrate.)" in result.stderr, result.stderr


def test_doctor_hints_name_commands_not_sql(dsn: str, conn: psycopg.Connection) -> None:
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k')")
    [claimed] = claim(conn, queues=["q"])
    other = one(conn, "SELECT pgq.enqueue('q', 'k')")
    [claimed_other] = claim(conn, queues=["q"])
    conn.execute("SELECT pgq.mark_unknown(%s, %s, 'unsure')", (other, claimed_other["attempt"]))
    conn.execute("UPDATE pgq.jobs SET lease_until = now() - interval '1 minute' WHERE id = %s", (job_id,))
    assert claimed["id"] == job_id
    doctor = pgq("doctor", dsn=dsn)
    hints = [line.split("hint: ", 1)[1] for line in doctor.stdout.splitlines() if "hint: " in line]
    assert "No worker is claiming or sweeping: run pgq-thin sweep and check the workers." in hints
    assert ("Find out what happened (pgq-thin jobs --state outcome_unknown lists them), then "
            "pgq-thin resolve ID done|pending|failed|cancelled.") in hints
    assert not any("pgq." in h for h in hints), hints


def test_stats_watch_shows_the_columns_of_stats(dsn: str, conn: psycopg.Connection) -> None:
    import subprocess
    import sys

    conn.execute("SELECT pgq.enqueue('q', 'k')")
    plain = pgq("stats", dsn=dsn).stdout.splitlines()[0].split("  ")
    proc = subprocess.Popen([sys.executable, "-m", "pgq_thin", "stats", "--watch", "0.2", "--dsn", dsn],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        while not proc.stdout.readline().startswith("pgq stats at"):
            pass
        header = proc.stdout.readline()
    finally:
        proc.kill()
        proc.wait()
    watched = [h for h in header.rstrip("\n").split("  ") if h]
    assert watched == [h for h in plain if h] + ["done/s"]


def test_worker_command_exits_non_zero_when_a_second_signal_stops_it_at_once(
        dsn: str, conn: psycopg.Connection, tmp_path) -> None:
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from sqlhelpers import wait_for

    root = Path(__file__).resolve().parents[2]
    job_id = one(conn, """SELECT pgq.enqueue('default', 'sleep', '{"seconds": 60}')""")
    log = tmp_path / "worker.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "pgq_thin", "worker", "--app", "tests.apps.sleepy:worker",
                                 "--dsn", dsn], cwd=root, stdout=out, stderr=subprocess.STDOUT,
                                env={**__import__("os").environ, "SLEEPY_SHUTDOWN_TIMEOUT": "60"})
    try:
        wait_for(lambda: f"sleeping 60s for job {job_id}" in log.read_text(), "the handler to start")
        proc.send_signal(signal.SIGTERM)
        wait_for(lambda: "shutting down gracefully" in log.read_text(), "the graceful shutdown to begin")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 1, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "stopping at once" in log.read_text()
    assert job(conn, job_id)["state"] == "running"  # left to its lease


def test_jobs_lists_newest_first_with_filters_and_says_how_to_get_the_next_page(
        dsn: str, conn: psycopg.Connection) -> None:
    ids = [one(conn, "SELECT pgq.enqueue('emails', %s)", (kind,)) for kind in ("welcome", "digest", "welcome")]
    [claimed] = claim(conn, queues=["emails"])
    conn.execute("SELECT pgq.fail(%s, %s, 'Traceback (most recent call last):\n  ...\nValueError: no such user',"
                 " retryable => false)", (claimed["id"], claimed["attempt"]))
    listed = pgq("jobs", dsn=dsn)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["id", "queue", "kind", "state", "attempt", "run", "at", "created", "finished", "last",
                                "error"]
    assert [int(line.split()[0]) for line in lines[2:]] == ids[::-1]
    failed = pgq("jobs", "--queue", "emails", "--state", "failed", dsn=dsn)
    [row] = failed.stdout.splitlines()[2:]
    assert row.split()[:5] == [str(ids[0]), "emails", "welcome", "failed", "1/25"]
    assert row.endswith("ValueError: no such user")
    kinds = pgq("jobs", "--kind", "welcome", "--limit", "1", dsn=dsn).stdout.splitlines()
    assert int(kinds[2].split()[0]) == ids[2]
    assert kinds[3] == f"(the newest 1; older ones: the same command with --before {ids[2]})"
    older = pgq("jobs", "--kind", "welcome", "--before", str(ids[2]), dsn=dsn).stdout.splitlines()
    assert [int(line.split()[0]) for line in older[2:]] == [ids[0]]
    typo = pgq("jobs", "--queue", "emials", dsn=dsn)
    assert typo.returncode == 1
    assert typo.stderr == ("pgq-thin: error: pgq: argument \"queue\" names no queue: 'emials' [SQLSTATE 22023] "
                           "(hint: A queue is created by its first job; pgq-thin stats lists them.)\n")
    bad_state = pgq("jobs", "--state", "finished", dsn=dsn)
    assert bad_state.returncode == 1 and "must be one of waiting, pending, running, done" in bad_state.stderr


def test_pause_of_a_queue_that_does_not_exist_is_refused_and_creates_nothing(
        dsn: str, conn: psycopg.Connection) -> None:
    typo = pgq("pause", "emials", dsn=dsn)
    assert typo.returncode == 1
    assert typo.stderr.startswith("pgq-thin: error: pgq: argument \"queue\" names no queue: 'emials'")
    assert "pgq.configure_queue" not in typo.stderr and typo.stdout == ""
    assert one(conn, "SELECT count(*) FROM pgq.queues") == 0
    assert pgq("resume", "emials", dsn=dsn).returncode == 1


def test_pause_and_resume_of_one_kind(dsn: str, conn: psycopg.Connection) -> None:
    fast = one(conn, "SELECT pgq.enqueue('q', 'fast')")
    one(conn, "SELECT pgq.enqueue('q', 'slow', priority => 5)")
    paused = pgq("pause", "q", "--kind", "slow", dsn=dsn)
    assert paused.returncode == 0 and paused.stdout == "queue q: kind slow paused (paused kinds: slow)\n"
    assert [c["id"] for c in claim(conn, "w", ["q"], batch=5)] == [fast]
    bad = pgq("pause", "q", "--kind", "a b", dsn=dsn)
    assert bad.returncode == 1 and 'argument "kind" is not a valid name' in bad.stderr
    resumed = pgq("resume", "q", "--kind", "slow", dsn=dsn)
    assert resumed.returncode == 0 and resumed.stdout == "queue q: kind slow resumed (paused kinds: (none))\n"
    assert [c["kind"] for c in claim(conn, "w", ["q"], batch=5)] == ["slow"]


def test_a_schedule_with_an_unknown_time_zone_gets_a_hint_for_the_command_line(dsn: str) -> None:
    result = pgq("schedule", "add", "nightly", "q", "k", "--cron", "0 3 * * *", "--timezone", "Mars/Olympus",
                 dsn=dsn)
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert "(hint: Use an IANA time zone name, such as Europe/Paris, or UTC.)" in result.stderr
    assert "pg_timezone_names" not in result.stderr


def test_job_history_shows_the_login_of_each_event(dsn: str, conn: psycopg.Connection) -> None:
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k')")
    [c] = claim(conn, "worker-a", ["q"])
    conn.execute("SELECT pgq.complete(%s, %s)", (job_id, c["attempt"]))
    shown = pgq("job", str(job_id), dsn=dsn)
    assert shown.returncode == 0, shown.stderr
    login = one(conn, "SELECT session_user")
    assert f"login        {login}" in shown.stdout
    history = shown.stdout[shown.stdout.index("history"):].splitlines()
    assert history[1].split()[:5] == ["at", "attempt", "event", "worker", "login"]
    assert [line.split()[5] for line in history[3:]] == [login, login]  # date, time, attempt, event, worker


def test_grant_revoke_and_grants_commands(dsn: str, conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('payments')")
    assert pgq("grants", dsn=dsn).stdout.startswith("no grants")
    granted = pgq("grant", "payments", "pgq_worker", "claim", dsn=dsn)
    assert granted.returncode == 0 and granted.stdout == "pgq_worker may claim on queue payments\n"
    again = pgq("grant", "payments", "pgq_worker", "claim", dsn=dsn)
    assert again.stdout == "pgq_worker may claim on queue payments (already granted)\n"
    listed = pgq("grants", "--queue", "payments", dsn=dsn)
    assert listed.returncode == 0
    assert listed.stdout.splitlines()[2].split()[:3] == ["payments", "claim", "pgq_worker"]
    bad = pgq("grant", "payments", "pgq_no_such_role", "claim", dsn=dsn)
    assert bad.returncode == 1 and 'argument "role" names no role' in bad.stderr and "Traceback" not in bad.stderr
    wrong = pgq("grant", "payments", "pgq_worker", "delete", dsn=dsn)
    assert wrong.returncode == 2 and "invalid choice" in wrong.stderr
    revoked = pgq("revoke", "payments", "pgq_worker", "claim", dsn=dsn)
    assert revoked.returncode == 0 and "no claim grant left" in revoked.stdout
    assert pgq("revoke", "payments", "pgq_worker", "claim", dsn=dsn).stdout.endswith(": unchanged\n")
    assert one(conn, "SELECT count(*) FROM pgq.grants") == 0
