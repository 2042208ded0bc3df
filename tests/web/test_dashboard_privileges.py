"""What a login may do, as the dashboard learns it: once per page it asks the database which of
pgq's admin functions the login may call (to grey the buttons and say "read-only"), and an action
is simply the call: a login that may not make it gets the database's own refusal (42501), shown as
such, and nothing changes. The statements are counted as the dashboard sends them, by a recording
cursor on its own AsyncClient, against a real database. And the client's calls behind it:
privileges(), clock(), and the act-by-filter plan (calls.bulk_plan) the bulk buttons drive."""

from __future__ import annotations

import asyncio
from collections.abc import Generator, Iterator
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict
from starlette.testclient import TestClient

from pgq_thin import AsyncClient, Client
from pgq_thin.calls import bulk_plan
from pgq_thin.dashboard.app import create_app
from pgq_thin.models import Privileges

from dashboardkit import enqueue_linked, failed_job, logins, open_batch, unknown_job

#: What the privilege question asks the catalog (pgq_thin.queries.PRIVILEGES).
PROBE = "has_function_privilege"


@pytest.fixture
def roles(pgq_dsn: str) -> Iterator[dict[str, str]]:
    with logins(pgq_dsn) as dsns:
        yield dsns


def recording(dsn: str, statements: list[str]) -> AsyncClient:
    """An AsyncClient of ``dsn`` whose connections append every statement they execute to ``statements``."""

    class Cursor(psycopg.AsyncCursor[Any]):
        async def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            statements.append(str(query))
            return await super().execute(query, params, **kwargs)

    client = AsyncClient(dsn, max_size=2)
    client.pool.kwargs["cursor_factory"] = Cursor
    return client


def probes(statements: list[str]) -> int:
    return sum(PROBE in statement for statement in statements)


def test_each_page_asks_what_the_login_may_do_once_and_the_api_never(
        pgq_client: Client, roles: dict[str, str]) -> None:
    job_id = failed_job(pgq_client)
    batch = open_batch(pgq_client.dsn)
    [member] = enqueue_linked(pgq_client.dsn, batch=batch)
    statements: list[str] = []
    with TestClient(create_app(lambda: recording(roles["pgq_monitor"], statements))) as http:
        for path in ("/", "/jobs", "/jobs?queue=mail&state=failed", f"/jobs/{job_id}", f"/jobs/{member}",
                     f"/batches/{batch}", "/schedules", "/health", "/jobs/987654", "/jobs?state=bogus"):
            statements.clear()
            page = http.get(path)
            assert page.status_code in (200, 400, 404) and "<html" in page.text, (path, page.text)
            assert probes(statements) == 1, (path, statements)
            assert "Read-only" in page.text, path
        for path in ("/api/queues", "/api/jobs", f"/api/jobs/{job_id}", f"/api/batches/{batch}", "/api/health",
                     "/api/schedules", "/healthz", "/metrics"):
            statements.clear()
            assert http.get(path).status_code == 200, path
            assert statements and probes(statements) == 0, (path, statements)


def test_an_action_the_login_may_not_make_gets_the_databases_refusal_without_asking_first(
        pgq_client: Client, roles: dict[str, str]) -> None:
    job_id = failed_job(pgq_client)
    unknown = unknown_job(pgq_client)
    pending = pgq_client.enqueue("mail", "send", {})
    statements: list[str] = []
    actions = [(f"/api/jobs/{job_id}/retry", None, "retry"), (f"/api/jobs/{pending}/cancel", None, "cancel"),
               (f"/api/jobs/{unknown}/resolve", {"state": "done"}, "resolve"),
               ("/api/queues/mail/pause", None, "pause"), ("/api/queues/mail/resume", None, "resume"),
               ("/api/jobs/retry-all", {"queue": "mail", "state": "failed", "max_jobs": 5}, "retry_jobs"),
               ("/api/jobs/cancel-all", {"queue": "mail", "state": "pending", "max_jobs": 5}, "cancel_jobs")]
    with TestClient(create_app(lambda: recording(roles["pgq_monitor"], statements))) as http:
        for url, body, function in actions:
            statements.clear()
            refused = http.post(url, json=body)
            assert refused.status_code == 403, (url, refused.text)
            answer = refused.json()
            assert answer["sqlstate"] == "42501"
            assert answer["error"] == f"permission denied for function {function}"  # PostgreSQL's own words
            assert "read-only" in answer["hint"] and "pgq_monitor" in answer["hint"] and "pgq_admin" in answer["hint"]
            assert f"pgq.{function} " in answer["hint"]
            assert probes(statements) == 0, (url, statements)  # no question before the call:
            assert [s for s in statements if f"pgq.{function}(" in s], (url, statements)  # the call itself
    assert pgq_client.get_job(job_id).state == "failed"
    assert pgq_client.get_job(unknown).state == "outcome_unknown"
    assert pgq_client.get_job(pending).state == "pending"
    assert not pgq_client.stats()[0].paused


# The client's calls behind it -----------------------------------------------------------------


def test_privileges_names_the_login_what_it_may_call_and_none_for_what_the_schema_lacks(
        pgq_client: Client, roles: dict[str, str]) -> None:
    functions = {"retry", "cancel", "resolve", "pause", "resume", "retry_jobs", "cancel_jobs", "delete_jobs"}
    with Client(roles["pgq_monitor"]) as monitor, Client(roles["pgq_admin"]) as admin:
        seen = monitor.privileges(), admin.privileges()
    for privileges, dsn in zip(seen, (roles["pgq_monitor"], roles["pgq_admin"])):
        assert privileges.role == conninfo_to_dict(dsn)["user"] and set(privileges.functions) == functions
    assert seen[0].functions == dict.fromkeys(functions, False) and seen[0].read_only and seen[0].missing == []
    assert seen[1].functions == dict.fromkeys(functions, True) and not seen[1].read_only
    with psycopg.connect(pgq_client.dsn, autocommit=True) as conn:
        conn.execute("DROP FUNCTION pgq.retry_jobs(text, text, text, timestamptz, integer, text[])")

    async def asked() -> Privileges:
        async with AsyncClient(roles["pgq_admin"]) as client:
            return await client.privileges()

    older = asyncio.run(asked())
    assert older.functions["retry_jobs"] is None and older.missing == ["retry_jobs"] and not older.read_only
    assert older.functions["cancel_jobs"] is True


def test_clock_is_the_databases(pgq_client: Client, conn: psycopg.Connection) -> None:
    before = conn.execute("SELECT clock_timestamp()").fetchone()[0]  # type: ignore[index]
    now = pgq_client.clock()
    after = conn.execute("SELECT clock_timestamp()").fetchone()[0]  # type: ignore[index]
    assert before <= now <= after and now.tzinfo is not None


def drive(plan: Generator[int, int, int], answers: list[int]) -> tuple[list[int], int]:
    """The limit_rows a plan asks for, each answered from ``answers``; and what it returns."""
    asked, answers = [], list(answers)
    try:
        rows = next(plan)
        while True:
            asked.append(rows)
            rows = plan.send(answers.pop(0))
    except StopIteration as done:
        return asked, done.value


def test_the_bulk_plan_asks_until_a_call_acts_on_none_or_the_cap_is_reached() -> None:
    assert drive(bulk_plan(None, 1000), [1000, 1000, 300, 0]) == ([1000, 1000, 1000, 1000], 2300)
    assert drive(bulk_plan(2500, 1000), [1000, 1000, 500]) == ([1000, 1000, 500], 2500)
    assert drive(bulk_plan(2500, 1000), [1000, 999, 501]) == ([1000, 1000, 501], 2500)  # fewer than asked: go on
    assert drive(bulk_plan(5, 1000), [0]) == ([5], 0)
