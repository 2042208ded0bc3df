"""Issue 27 on the command line, run as a user runs it against a real database: ``pgq-thin retry``
and ``pgq-thin cancel`` by filter (--queue, --state, --kind, --before, --limit, and --all to ask
for many), in bounded calls of pgq.retry_jobs / pgq.cancel_jobs, beside their by-id form; and
``pgq-thin enqueue --unique-key K --on-conflict replace``."""

from __future__ import annotations

from datetime import datetime, timezone

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgq_thin import Client, Worker

from clikit import pgq
from sqlhelpers import job, one, run_worker, wait_for


def states(conn: psycopg.Connection, queue: str, kind: str | None = None) -> dict[str, int]:
    rows = conn.execute("SELECT state::text, count(*) FROM pgq.jobs WHERE queue = %s"
                        " AND (%s::text IS NULL OR kind = %s) GROUP BY 1", (queue, kind, kind)).fetchall()
    return {state: int(n) for state, n in rows}


def track_functions(dsn: str, conn: psycopg.Connection) -> None:
    """Count the function calls of the sessions that start from now on (the command's)."""
    conn.execute(f"ALTER DATABASE {conninfo_to_dict(dsn)['dbname']} SET track_functions = 'all'")


def calls(conn: psycopg.Connection, function: str, expected: int) -> int:
    """pgq.<function>'s calls in this database, once they are ``expected`` (the command's backend
    reports its counts when it exits, at the latest)."""
    def seen() -> bool:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        return int(one(conn, "SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions WHERE schemaname = 'pgq'"
                             " AND funcname = %s", (function,))) == expected
    wait_for(seen, f"{expected} calls of pgq.{function}")
    return expected


def test_retry_and_cancel_by_id_work_as_before(dsn: str, conn: psycopg.Connection) -> None:
    with Client(dsn) as client:
        a, b = client.enqueue_many("q", "k", [{}, {}])
    cancelled = pgq("cancel", str(a), str(b), dsn=dsn)
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.splitlines() == [f"job {a}: cancelled", f"job {b}: cancelled"]
    retried = pgq("retry", str(a), dsn=dsn)
    assert (retried.returncode, retried.stdout.strip()) == (0, f"job {a}: pending again"), retried.stderr
    assert (job(conn, a)["state"], job(conn, b)["state"]) == ("pending", "cancelled")


def test_cancel_and_retry_by_filter_loop_in_bounded_calls_and_print_the_total(
        dsn: str, conn: psycopg.Connection) -> None:
    track_functions(dsn, conn)
    with Client(dsn) as client:
        a = client.enqueue_many("q", "a", [{"n": n} for n in range(2300)])
        client.enqueue_many("q", "b", [{}] * 5)
        client.enqueue_many("other", "a", [{}] * 3)

    cancelled = pgq("cancel", "--queue", "q", "--state", "pending", "--kind", "a", "--all", dsn=dsn)
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.strip() == "cancelled 2300 pending job(s) of queue q of kind a"
    assert calls(conn, "cancel_jobs", 4)  # 1000, 1000, 300, then none: the last
    assert states(conn, "q", "a") == {"cancelled": 2300}
    assert states(conn, "q", "b") == {"pending": 5} and states(conn, "other") == {"pending": 3}

    retried = pgq("retry", "--queue", "q", "--state", "cancelled", "--limit", "1500", "--all", dsn=dsn)
    assert retried.returncode == 0, retried.stderr
    assert retried.stdout.strip() == ("retried 1500 cancelled job(s) of queue q (--limit 1500 reached: "
                                      "more may match)")
    assert calls(conn, "retry_jobs", 2)  # 1000, then the 500 left of the limit: no more
    assert [job(conn, i)["state"] for i in (a[0], a[1499], a[1500], a[-1])] == [
        "pending", "pending", "cancelled", "cancelled"]  # oldest first
    rest = pgq("retry", "--queue", "q", "--state", "cancelled", "--all", dsn=dsn)
    assert (rest.returncode, rest.stdout.strip()) == (0, "retried 800 cancelled job(s) of queue q"), rest.stderr
    assert states(conn, "q") == {"pending": 2305} and states(conn, "other") == {"pending": 3}


@pytest.mark.slow  # 2500 jobs failed twice by a worker
def test_retry_all_against_a_worker_that_fails_them_again_retries_each_once_and_ends(
        dsn: str, conn: psycopg.Connection) -> None:
    """The command acts only on jobs that ended before it started: jobs its first calls retried, and
    that a worker fails again while it runs, are not retried again; a loop without that bound would
    chase them for as long as the worker keeps up."""
    with Client(dsn) as client:
        client.enqueue_many("q", "k", [{"n": n} for n in range(2500)], max_attempts=1)
    worker = Worker(queues=["q"], concurrency=8)

    @worker.handler("k")
    def still_broken(job: object, ctx: object) -> None:
        raise RuntimeError("still broken")

    errors: list[BaseException] = []
    thread = run_worker(worker, dsn, errors)
    try:
        wait_for(lambda: states(conn, "q") == {"failed": 2500}, "every job to fail", timeout=120)
        retried = pgq("retry", "--queue", "q", "--state", "failed", "--all", dsn=dsn)
        assert (retried.returncode, retried.stdout.strip()) == (0, "retried 2500 failed job(s) of queue q"), (
            retried.stderr)
        assert one(conn, "SELECT count(*) FILTER (WHERE event = 'retried') FROM pgq.job_events") == 2500
        assert one(conn, "SELECT count(DISTINCT job_id) FILTER (WHERE event = 'retried') FROM pgq.job_events") == 2500
        wait_for(lambda: states(conn, "q") == {"failed": 2500}, "every retried job to fail again", timeout=120)
    finally:
        worker.stop()
        thread.join(timeout=60)
    assert errors == [] and not thread.is_alive()


def test_before_takes_a_time_or_how_long_ago(dsn: str, conn: psycopg.Connection) -> None:
    with Client(dsn) as client:
        old = client.enqueue_many("q", "k", [{}] * 3)
        middle = one(conn, "SELECT clock_timestamp()")
        new = client.enqueue_many("q", "k", [{}] * 2)
    none = pgq("cancel", "--queue", "q", "--state", "pending", "--before", "1h", "--all", dsn=dsn)
    assert (none.returncode, none.stdout.strip()) == (0, "cancelled 0 pending job(s) of queue q"), none.stderr
    local = middle.astimezone().replace(tzinfo=None).isoformat()  # no offset: this machine's local time
    for before in (middle.isoformat(), local):
        some = pgq("cancel", "--queue", "q", "--state", "pending", "--before", before, "--all", dsn=dsn)
        assert some.returncode == 0, some.stderr
    assert [job(conn, i)["state"] for i in old + new] == ["cancelled"] * 3 + ["pending"] * 2
    # retry's --before is about when the job finished: the three ended after `middle`.
    later = pgq("retry", "--queue", "q", "--state", "cancelled", "--before", middle.isoformat(), "--all", dsn=dsn)
    assert later.stdout.strip() == "retried 0 cancelled job(s) of queue q", later.stderr
    now = pgq("retry", "--queue", "q", "--state", "cancelled", "--before", "0s", "--all", dsn=dsn)
    assert now.stdout.strip() == "retried 3 cancelled job(s) of queue q", now.stderr
    future = datetime(2999, 1, 1, tzinfo=timezone.utc).isoformat()  # after the command started: its start
    running = pgq("cancel", "--queue", "q", "--state", "pending", "--before", future, "--all", dsn=dsn)
    assert running.stdout.strip() == "cancelled 5 pending job(s) of queue q", running.stderr


@pytest.mark.parametrize("command", ["retry", "cancel"])
def test_a_filter_without_all_and_other_mistakes_are_usage_errors_that_change_nothing(
        dsn: str, conn: psycopg.Connection, command: str) -> None:
    with Client(dsn) as client:
        ids = client.enqueue_many("q", "k", [{}, {}])
        if command == "retry":
            assert client.cancel_jobs("q", "pending") == 2
    state = "cancelled" if command == "retry" else "pending"
    for args, words in [
        (["--queue", "q", "--state", state], ["add --all", "acts on every job that matches"]),
        (["--queue", "q", "--state", state, "--limit", "1"], ["add --all"]),
        ([], ["give job ids, or --queue Q --state S --all"]),
        ([str(ids[0]), "--queue", "q"], ["not both", "--queue"]),
        ([str(ids[0]), "--all"], ["not both", "--all"]),
        (["--state", state, "--all"], ["--queue and --state", "missing: --queue"]),
        (["--queue", "q", "--all"], ["missing: --state"]),
        (["--queue", "q", "--state", "done", "--all"], ["--state", "invalid choice: 'done'"]),
        (["--queue", "q", "--state", state, "--before", "last tuesday", "--all"], ["--before", "not a time"]),
        (["--queue", "q", "--state", state, "--before", "5", "--all"], ["--before", "not a time"]),
        (["--queue", "q", "--state", state, "--limit", "0", "--all"], ["--limit", "must be 1 or more"]),
        (["--queue", "q", "--state", state, "--before", "999999d", "--all"], ["--before", "before the year 1"]),
    ]:
        result = pgq(command, *args, dsn=dsn)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert result.stderr.startswith((f"pgq-thin {command}: error: ", "pgq-thin: error: --before")), args
        assert result.stderr.count("\n") == 1, args
        assert "Traceback" not in result.stderr and result.stdout == ""
        for word in words:
            assert word in result.stderr, (args, result.stderr)
    assert {job(conn, i)["state"] for i in ids} == {state}


@pytest.mark.parametrize("command", ["retry", "cancel"])
def test_the_servers_refusals_are_one_line_naming_the_argument(dsn: str, conn: psycopg.Connection,
                                                               command: str) -> None:
    state = "cancelled" if command == "retry" else "pending"
    bad = pgq(command, "--queue", "bad queue!", "--state", state, "--all", dsn=dsn)
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1
    assert 'argument "queue"' in bad.stderr and "22023" in bad.stderr and "Traceback" not in bad.stderr
    conn.execute("CREATE ROLE power_monitor LOGIN IN ROLE pgq_monitor")
    try:
        with Client(dsn) as client:
            job_id = client.enqueue("q", "k")
        monitor = make_conninfo(dsn, user="power_monitor")
        denied = pgq("cancel", "--queue", "q", "--state", "pending", "--all", dsn=monitor)
        assert denied.returncode == 1 and "42501" in denied.stderr and denied.stderr.count("\n") == 1
        assert job(conn, job_id)["state"] == "pending"
    finally:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'power_monitor'")
        conn.execute("DROP ROLE power_monitor")


def test_enqueue_on_conflict_replace_updates_the_holder(dsn: str, conn: psycopg.Connection) -> None:
    first = pgq("enqueue", "q", "k", '{"v": 1}', "--unique-key", "u", dsn=dsn)
    assert first.returncode == 0, first.stderr
    holder = int(first.stdout)
    kept = pgq("enqueue", "q", "k", '{"v": 2}', "--unique-key", "u", dsn=dsn)
    assert int(kept.stdout) == holder and "nothing enqueued" in kept.stderr
    assert job(conn, holder)["payload"] == {"v": 1}
    replaced = pgq("enqueue", "q", "k", '{"v": 3}', "--unique-key", "u", "--on-conflict", "replace",
                   "--priority", "5", dsn=dsn)
    assert replaced.returncode == 0 and int(replaced.stdout) == holder, replaced.stderr
    assert (job(conn, holder)["payload"], job(conn, holder)["priority"]) == ({"v": 3}, 5)
    bad = pgq("enqueue", "q", "k", "--unique-key", "u", "--on-conflict", "merge", dsn=dsn)
    assert bad.returncode == 2 and "--on-conflict" in bad.stderr and "invalid choice" in bad.stderr
    assert one(conn, "SELECT count(*) FROM pgq.jobs") == 1


def test_delete_by_filter_loops_in_bounded_calls_and_needs_all(dsn: str, conn: psycopg.Connection) -> None:
    track_functions(dsn, conn)
    with Client(dsn) as client:
        client.enqueue_many("q", "a", [{}] * 1200)
        client.enqueue_many("q", "b", [{}] * 3)
    refused = pgq("delete", "--queue", "q", "--state", "pending", dsn=dsn)
    assert refused.returncode == 2 and "--all" in refused.stderr
    deleted = pgq("delete", "--queue", "q", "--state", "pending", "--kind", "a", "--all", dsn=dsn)
    assert deleted.returncode == 0, deleted.stderr
    assert deleted.stdout.strip() == "deleted 1200 pending job(s) of queue q of kind a"
    assert calls(conn, "delete_jobs", 3)  # 1000, 200, then none
    assert states(conn, "q") == {"pending": 3}
    wrong = pgq("delete", "--queue", "q", "--state", "running", "--all", dsn=dsn)
    assert wrong.returncode == 2 and "invalid choice" in wrong.stderr
