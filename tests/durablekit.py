"""What the durable-execution tests share: logins of their own (a job is bound to the login that
claimed it, so "another login" must be a real LOGIN role; SET ROLE keeps session_user) and the
calls a handler makes, spelled once."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from sqlhelpers import claim, one

#: The logins (LOGIN roles, cluster-wide, created once per server) and their pgq roles.
WORKER, WORKER2, PRODUCER, PRODUCER2, MONITOR, ADMIN = (
    "pgq_d_worker", "pgq_d_worker2", "pgq_d_producer", "pgq_d_producer2", "pgq_d_monitor", "pgq_d_admin")
LOGINS = {WORKER: "pgq_worker", WORKER2: "pgq_worker", PRODUCER: "pgq_producer", PRODUCER2: "pgq_producer",
          MONITOR: "pgq_monitor", ADMIN: "pgq_admin"}
#: A NOLOGIN group role the signal grants name.
SIGNALLERS = "pgq_d_signallers"

Login = Callable[..., psycopg.Connection]


def ensure_role(su: psycopg.Connection, name: str, options: str, *member_of: str) -> None:
    if su.execute("SELECT FROM pg_roles WHERE rolname = %s", (name,)).fetchone() is None:
        try:
            su.execute(f"CREATE ROLE {name} {options}")
        except (psycopg.errors.DuplicateObject, psycopg.errors.UniqueViolation):
            pass  # another database of the session's server made it meanwhile
    for role in member_of:
        su.execute(f"GRANT {role} TO {name}")


@pytest.fixture
def login_as(conn: psycopg.Connection, dsn: str) -> Iterator[Login]:
    """login_as(name) opens a connection (autocommit unless told) as that LOGIN role."""
    ensure_role(conn, SIGNALLERS, "NOLOGIN")
    for name, role in LOGINS.items():
        ensure_role(conn, name, "LOGIN", role)
    opened: list[psycopg.Connection] = []

    def _login(name: str, autocommit: bool = True) -> psycopg.Connection:
        c = psycopg.connect(make_conninfo(dsn, user=name), autocommit=autocommit)
        opened.append(c)
        return c

    yield _login
    for c in opened:
        c.close()


def running(conn: psycopg.Connection, queue: str = "q", kind: str = "k", **enqueue: Any) -> tuple[int, int]:
    """A job enqueued (with ``enqueue``'s named arguments) and claimed on ``conn``: (id, attempt)."""
    extra = "".join(f", {name} => %({name})s" for name in enqueue)
    job_id = one(conn, f"SELECT pgq.enqueue(%(queue)s, %(kind)s{extra})", {"queue": queue, "kind": kind, **enqueue})
    claimed = claim(conn, queues=[queue])
    assert [c["id"] for c in claimed] == [job_id], claimed
    return job_id, claimed[0]["attempt"]


def reclaim(conn: psycopg.Connection, job_id: int, queue: str = "q") -> int:
    """Claims job_id again (it must be the queue's only claimable job): its new attempt."""
    claimed = claim(conn, queues=[queue])
    assert [c["id"] for c in claimed] == [job_id], claimed
    return int(claimed[0]["attempt"])


def get_step(c: psycopg.Connection, job_id: int, attempt: int, name: str) -> tuple[Any, Any] | None:
    row = c.execute("SELECT found, result FROM pgq.get_step(%s, %s, %s)", (job_id, attempt, name)).fetchone()
    return None if row is None else (row[0], row[1])


def record_step(c: psycopg.Connection, job_id: int, attempt: int, name: str, result: str = '{"ok": true}') -> bool:
    return one(c, "SELECT pgq.record_step(%s, %s, %s, %s::jsonb)", (job_id, attempt, name, result))


def await_signal(c: psycopg.Connection, job_id: int, attempt: int, name: str,
                 timeout: str | None = "1 hour") -> tuple[str, Any] | None:
    row = c.execute("SELECT status, payload FROM pgq.await_signal(%s, %s, %s, %s::interval)",
                    (job_id, attempt, name, timeout)).fetchone()
    return None if row is None else (row[0], row[1])


def signal(c: psycopg.Connection, name: str, payload: str = "{}", queue: str = "q") -> int:
    return one(c, "SELECT pgq.signal(%s, %s, %s::jsonb)", (queue, name, payload))


def state(conn: psycopg.Connection, job_id: int) -> str:
    return str(one(conn, "SELECT state::text FROM pgq.jobs WHERE id = %s", (job_id,)))


def rejected(conn: psycopg.Connection, job_id: int) -> list[tuple[str, str]]:
    """(session_role, note) of the job's rejected events, oldest first."""
    return [(r[0], r[1]) for r in conn.execute(
        "SELECT session_role, note FROM pgq.job_events WHERE job_id = %s AND event = 'rejected' ORDER BY id",
        (job_id,))]


def steps(conn: psycopg.Connection, job_id: int) -> dict[str, Any]:
    """The job's recorded steps, name -> result (read as the superuser)."""
    return dict(conn.execute("SELECT name, result FROM pgq.steps WHERE job_id = %s", (job_id,)).fetchall())


def settle(conn: psycopg.Connection) -> int:
    """pgq.settle_dependencies, as a worker calls it about once a second."""
    return int(one(conn, "SELECT pgq.settle_dependencies()"))
