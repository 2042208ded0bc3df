"""Issue 39 from the shell: pgq-thin signal (how many it woke; the payload as JSON, or from
stdin), pgq-thin job showing a durable job's steps, the signal it waits for, its children, parent
and the jobs it awaits, and pgq-thin enqueue's --start-by and --max-lifetime. Run as a user runs
them, against a real database."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from pgq_thin import Client

from clikit import pgq


@pytest.fixture
def client(dsn: str):
    with Client(dsn) as c:
        yield c


def test_signal_wakes_the_waiting_jobs_and_prints_how_many(dsn: str, client: Client) -> None:
    job_id = client.enqueue("orders", "fulfil")
    [job] = client.claim("w", ["orders"])
    assert client.await_signal(job_id, job.attempt, "approved:7", timeout=3600).status == "waiting"
    sent = pgq("signal", "orders", "approved:7", '{"by": "ann"}', dsn=dsn)
    assert sent.returncode == 0, sent.stderr
    assert sent.stdout.strip() == "1" and sent.stderr == ""
    again = pgq("signal", "orders", "approved:7", dsn=dsn)
    assert again.returncode == 0 and again.stdout.strip() == "0"
    assert "the first signal of a name wins" in again.stderr
    [job] = client.claim("w", ["orders"])
    assert client.await_signal(job_id, job.attempt, "approved:7").payload == {"by": "ann"}
    # From stdin, and the errors a user makes.
    piped = pgq("signal", "orders", "shipped", "-", dsn=dsn, stdin='{"carrier": "x"}')
    assert piped.returncode == 0 and piped.stdout.strip() == "0"
    assert client.signal("orders", "shipped") == 0                       # it was stored: the first wins
    unknown = pgq("signal", "nosuch", "go", dsn=dsn)
    assert unknown.returncode == 1 and "names no queue" in unknown.stderr and unknown.stdout == ""
    bad = pgq("signal", "orders", "go", "{not json", dsn=dsn)
    assert bad.returncode == 2 and "payload is not valid JSON" in bad.stderr


def test_job_shows_a_durable_jobs_steps_workflow_and_the_signal_it_waits_for(dsn: str, client: Client) -> None:
    root = client.enqueue("orders", "fulfil")
    [job] = client.claim("w", ["orders"])
    assert client.record_step(root, job.attempt, "reserve", {"reservation": "r-17"})
    kid = client.spawn(root, job.attempt, "invoice", "invoices", "make_invoice")
    assert kid is not None
    assert client.await_jobs(root, job.attempt, [kid]) == "waiting"
    shown = pgq("job", str(root), dsn=dsn)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert "steps (by name)" in out and "reserve" in out and '{"reservation": "r-17"}' in out
    assert '{"job_id": ' + str(kid) + "}" in out
    assert "children (the jobs it spawned)" in out and "awaiting (the jobs it waits for, not ended yet)" in out
    assert "make_invoice" in out
    child = pgq("job", str(kid), dsn=dsn)
    assert "parent (the job that spawned it)" in child.stdout and f"workflow     {root}" in child.stdout
    # The signal a job waits for, and until when.
    other = client.enqueue("orders", "fulfil")
    [job] = [j for j in client.claim("w", ["orders"]) if j.id == other]
    client.await_signal(other, job.attempt, "approved:9", timeout=timedelta(days=2))
    waiting = pgq("job", str(other), dsn=dsn)
    assert "waits for    signal approved:9 until " in waiting.stdout


def test_enqueue_takes_start_by_and_max_lifetime(dsn: str, client: Client) -> None:
    start_by = (datetime.now(timezone.utc) + timedelta(hours=1)).replace(microsecond=0)
    made = pgq("enqueue", "q", "k", "--start-by", start_by.isoformat(), "--max-lifetime", "7d", dsn=dsn)
    assert made.returncode == 0, made.stderr
    record = client.get_job(int(made.stdout))
    assert record.start_by == start_by
    assert record.expires_at is not None and record.expires_at - record.created_at >= timedelta(days=7)
    late = pgq("enqueue", "q", "k", "--start-by", "2000-01-01T00:00:00+00:00", dsn=dsn)
    assert late.returncode == 1 and 'argument "start_by"' in late.stderr
