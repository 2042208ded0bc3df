"""What the dashboard's tests share: login roles in the pgq roles, and jobs in each state."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg.conninfo import make_conninfo

from pgq_thin import Client

#: A payload and an error that would run as script if the dashboard did not escape them.
SCRIPT = "<script>window.__pwned = 1; alert('pwned')</script>"


@contextmanager
def logins(dsn: str) -> Iterator[dict[str, str]]:
    """A LOGIN role in pgq_monitor and one in pgq_admin (roles are the cluster's: named uniquely and
    dropped afterwards); yields role -> the DSN that logs in as it."""
    suffix = uuid.uuid4().hex[:8]
    names = {"pgq_monitor": f"dash_monitor_{suffix}", "pgq_admin": f"dash_admin_{suffix}"}
    with psycopg.connect(dsn, autocommit=True) as conn:
        for role, name in names.items():
            conn.execute(f"CREATE ROLE {name} LOGIN IN ROLE {role}")
    try:
        yield {role: make_conninfo(dsn, user=name) for role, name in names.items()}
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for name in names.values():
                conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,))
                conn.execute(f"DROP ROLE {name}")


def failed_job(client: Client, queue: str = "mail", error: str = "smtp said no") -> int:
    """A job that failed its only attempt."""
    job_id = client.enqueue(queue, "send", {"to": "ada@example.com", "note": SCRIPT}, max_attempts=1)
    [job] = client.claim("test-worker", [queue])
    assert job.id == job_id
    assert client.fail(job.id, job.attempt, error, retryable=False) == "failed"
    return job_id


def unknown_job(client: Client, queue: str = "mail") -> int:
    """A job whose attempt was parked as outcome_unknown."""
    job_id = client.enqueue(queue, "charge", {"amount": 10})
    [job] = client.claim("test-worker", [queue])
    assert client.mark_unknown(job.id, job.attempt, "the card network timed out")
    return job_id
