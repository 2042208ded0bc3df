"""Issue 41 on the command line, run as a user runs it against a real database: ``pgq-thin enqueue
--tag`` (repeatable) and ``--unique-for``, the ``--tag`` filters of ``jobs``, ``retry``, ``cancel``
and ``delete``, and ``pgq-thin job ID`` showing a job's tags."""

from __future__ import annotations

import psycopg

from clikit import pgq
from sqlhelpers import job, one


def test_tags_from_enqueue_to_the_filters_and_the_job_page(dsn: str, conn: psycopg.Connection) -> None:
    made = pgq("enqueue", "q", "k", "--tag", "vip", "--tag", "eu", dsn=dsn)
    assert made.returncode == 0, made.stderr
    vip = int(made.stdout)
    plain = int(pgq("enqueue", "q", "k", dsn=dsn).stdout)
    assert job(conn, vip)["tags"] == ["eu", "vip"] and job(conn, plain)["tags"] is None
    shown = pgq("job", str(vip), dsn=dsn)
    assert shown.returncode == 0 and "tags         eu, vip" in shown.stdout, shown.stdout
    listed = pgq("jobs", "--tag", "vip", "--tag", "eu", dsn=dsn)
    assert listed.returncode == 0 and f"\n{vip} " in "\n" + listed.stdout and f"\n{plain} " not in listed.stdout
    cancelled = pgq("cancel", "--queue", "q", "--state", "pending", "--tag", "vip", "--all", dsn=dsn)
    assert cancelled.returncode == 0, cancelled.stderr
    assert "cancelled 1 pending job(s) of queue q tagged vip" in cancelled.stdout
    assert job(conn, plain)["state"] == "pending"
    retried = pgq("retry", "--queue", "q", "--state", "cancelled", "--tag", "eu", "--all", dsn=dsn)
    assert retried.returncode == 0 and "retried 1 " in retried.stdout, retried.stdout + retried.stderr
    deleted = pgq("delete", "--queue", "q", "--state", "pending", "--tag", "vip", "--all", dsn=dsn)
    assert deleted.returncode == 0 and "deleted 1 " in deleted.stdout, deleted.stdout + deleted.stderr
    assert one(conn, "SELECT array_agg(id) FROM pgq.jobs") == [plain]
    bad = pgq("enqueue", "q", "k", "--tag", "", dsn=dsn)
    assert bad.returncode != 0 and '"tags"' in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    assert one(conn, "SELECT count(*) FROM pgq.jobs") == 1


def test_enqueue_unique_for_prints_the_done_job_of_the_key(dsn: str, conn: psycopg.Connection) -> None:
    first = int(pgq("enqueue", "q", "k", "--unique-key", "u", dsn=dsn).stdout)
    conn.execute("UPDATE pgq.jobs SET state = 'done', finished_at = now(), attempt = 1 WHERE id = %s", (first,))
    again = pgq("enqueue", "q", "k", "--unique-key", "u", "--unique-for", "1h", dsn=dsn)
    assert again.returncode == 0 and int(again.stdout) == first, again.stderr
    assert f"existing job {first}" in again.stderr
    assert one(conn, "SELECT count(*) FROM pgq.jobs") == 1
