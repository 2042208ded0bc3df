"""``pgq-thin workers`` (issue 41), run as a user runs it against a real database: the live workers
of the registry, what each claims and runs; a line saying the registry is empty otherwise. And
``pgq-thin doctor`` names, at once, a pending kind that none of a queue's live workers handles.
``pgq-thin jobs --batch ID [--state S]`` lists a batch's members (issue 42)."""

from __future__ import annotations

import psycopg

from clikit import pgq
from sqlhelpers import one


def test_workers_lists_the_live_workers_and_says_when_there_is_none(dsn: str, conn: psycopg.Connection) -> None:
    empty = pgq("workers", dsn=dsn)
    assert empty.returncode == 0 and empty.stdout.startswith("no live worker in the registry"), empty.stdout
    one(conn, "SELECT pgq.worker_heartbeat('web-1-4242', ARRAY['emails', 'sms'], ARRAY['send'], running => 3,"
              " host => 'web-1', pid => 4242)")
    one(conn, "SELECT pgq.worker_heartbeat('gone', stopping => false, kinds => ARRAY['x'])")
    conn.execute("UPDATE pgq.worker_registry SET alive_until = now() - interval '1 second' WHERE worker = 'gone'")
    listed = pgq("workers", dsn=dsn)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["worker", "login", "host", "pid", "queues", "kinds", "running", "started", "last",
                                "seen"]
    assert set(lines[1]) <= {"-", " "}
    assert lines[2].split()[:8] == ["web-1-4242", "postgres", "web-1", "4242", "emails,", "sms", "send", "3"]
    assert len(lines) == 3 and "gone" not in listed.stdout


def test_doctor_names_a_pending_kind_no_live_worker_handles(dsn: str, conn: psycopg.Connection) -> None:
    one(conn, "SELECT pgq.enqueue('emails', 'send_welcom')")
    one(conn, "SELECT pgq.worker_heartbeat('w1', ARRAY['emails'], ARRAY['send_welcome'])")
    doctor = pgq("doctor", dsn=dsn)
    assert "queue emails: pending jobs of kind send_welcom, which none of its 1 live worker(s) handles" \
        in doctor.stdout, doctor.stdout + doctor.stderr


def test_jobs_batch_lists_a_batchs_members_and_finds_the_failed_one(dsn: str, conn: psycopg.Connection) -> None:
    batch = one(conn, "SELECT pgq.batch_open('after', 'report')")
    members = [one(conn, "SELECT pgq.enqueue('work', 'member', batch => %s)", (batch,)) for _ in range(4)]
    conn.execute("UPDATE pgq.jobs SET state = 'failed', finished_at = now(), last_error = 'boom' WHERE id = %s",
                 (members[1],))
    listed = pgq("jobs", "--batch", str(batch), dsn=dsn)
    assert listed.returncode == 0, listed.stderr
    assert [int(line.split()[0]) for line in listed.stdout.splitlines()[2:]] == members[::-1]
    failed = pgq("jobs", "--batch", str(batch), "--state", "failed", dsn=dsn)
    assert [int(line.split()[0]) for line in failed.stdout.splitlines()[2:]] == [members[1]]
    assert "boom" in failed.stdout
    mixed = pgq("jobs", "--batch", str(batch), "--queue", "work", dsn=dsn)
    assert mixed.returncode == 2 and "--queue does not go with it" in mixed.stderr, mixed.stderr
    unknown = pgq("jobs", "--batch", "424242", dsn=dsn)
    assert unknown.returncode == 1 and "no batch with id 424242" in unknown.stderr, unknown.stderr
