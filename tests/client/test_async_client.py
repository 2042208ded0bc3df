"""AsyncClient: the same methods as Client (names, arguments, typed results), sent over asyncio."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg
import pytest

from pgq_thin import AsyncClient, Client, InvalidArgument, Job, JobNotFound, QueueSettings, QueueStats, calls

from sqlhelpers import job

T = TypeVar("T")


def run(test: Callable[[AsyncClient], Awaitable[T]], dsn: str) -> T:
    async def main() -> T:
        async with AsyncClient(dsn) as client:
            return await test(client)
    return asyncio.run(main())


def test_every_call_is_a_method_of_both_clients_with_the_same_name_signature_and_doc(dsn: str) -> None:
    with Client(dsn) as client:
        for method in calls.ALL:
            bound = getattr(client, method.__name__)
            assert getattr(Client, method.__name__) is method
            assert getattr(AsyncClient, method.__name__).build is method.build
            described = inspect.signature(method.build, eval_str=True)
            assert inspect.signature(bound).parameters == described.parameters
            assert bound.__doc__ == method.build.__doc__
            assert bound.__doc__.startswith("pgq.") or method.__name__ in ("privileges", "clock")
    # Every pgq function a role may call, but cron_next (SQL only); and two questions that are not a
    # pgq function's: which of them the login may call (privileges) and the database's clock. (Read
    # from the catalog: a count written here went stale as functions were added.)
    with psycopg.connect(dsn) as conn:
        public = {r[0] for r in conn.execute(
            "SELECT proname FROM pg_proc WHERE pronamespace = 'pgq'::regnamespace AND proname !~ '^_'")}
    assert {m.__name__ for m in calls.ALL} == public - {"cron_next"} | {"privileges", "clock"}

    async def awaitable(client: AsyncClient) -> bool:
        pending = client.version()
        assert inspect.isawaitable(pending)
        return bool(await pending)

    assert run(awaitable, dsn)


def test_enqueue_claim_complete_round_trip_returns_typed_results(dsn: str, conn: psycopg.Connection) -> None:
    async def scenario(client: AsyncClient) -> tuple[int, list[Job], bool, list[QueueStats]]:
        job_id = await client.enqueue("emails", "send", {"to": "a@example.com"}, priority=5, tenant="acme")
        claimed = await client.claim("w1", ["emails"], batch=5, lease=30)
        done = await client.complete(claimed[0].id, claimed[0].attempt, {"sent": True})
        return job_id, claimed, done, await client.stats()

    job_id, claimed, done, stats = run(scenario, dsn)
    assert [(j.id, j.kind, j.payload, j.priority, j.attempt, j.tenant) for j in claimed] == [
        (job_id, "send", {"to": "a@example.com"}, 5, 1, "acme")]
    assert isinstance(claimed[0], Job) and done is True
    assert [(s.queue, s.done) for s in stats] == [("emails", 1)] and isinstance(stats[0], QueueStats)
    assert job(conn, job_id)["result"] == {"sent": True}


def test_the_owner_and_admin_calls_answer_as_the_clients_do(dsn: str) -> None:
    async def scenario(client: AsyncClient) -> dict[str, Any]:
        ids = await client.enqueue_many("q", "k", [{"n": i} for i in range(3)])
        a, b, c = await client.claim("w", ["q"], batch=3)
        return {
            "ids": ids,
            "renew": await client.renew(a.id, a.attempt, lease=60),
            "stale": await client.renew(a.id, a.attempt + 1),
            "fail": await client.fail(a.id, a.attempt, "boom", retry_in=60),
            "snooze": await client.snooze(b.id, b.attempt, 30),
            "many": await client.complete_many([c.id], [c.attempt]),
            "and_claim": await client.complete_and_claim([], [], "w", ["q"]),
            "cancel": await client.cancel(a.id),
            "retry": await client.retry(a.id),
            "record": await client.get_job(c.id),
            "history": [e.event for e in await client.job_history(c.id)],
            "paused": await client.pause("q"),
            "version": await client.version(),
            "sweep": await client.sweep(),
        }

    got = run(scenario, dsn)
    assert len(got["ids"]) == 3 and got["renew"] is not None and got["stale"] is None
    assert got["fail"] == "pending" and got["snooze"] is not None and got["many"] == [got["ids"][2]]
    assert got["and_claim"].completed == [] and got["and_claim"].jobs == []  # (a is failed, b snoozed, c done)
    assert got["cancel"] is True and got["retry"] is True
    assert got["record"].state == "done" and got["history"] == ["claimed", "completed"]
    assert isinstance(got["paused"], QueueSettings) and got["paused"].paused
    assert got["version"] and got["sweep"] == 0


def test_enqueue_joins_the_callers_async_transaction(dsn: str, conn: psycopg.Connection) -> None:
    async def scenario(client: AsyncClient) -> tuple[int, int]:
        async with await psycopg.AsyncConnection.connect(dsn) as tx:
            dropped = await client.enqueue("q", "k", {"n": 1}, conn=tx)
            await tx.rollback()
            kept = (await client.enqueue_many("q", "k", [{"n": 2}], conn=tx))[0]
            await tx.commit()
        return dropped, kept

    dropped, kept = run(scenario, dsn)
    assert conn.execute("SELECT count(*) FROM pgq.jobs WHERE id = %s", (dropped,)).fetchone()[0] == 0
    assert job(conn, kept)["payload"] == {"n": 2}


def test_bad_input_raises_the_same_errors_and_a_sync_connection_is_refused(dsn: str) -> None:
    async def scenario(client: AsyncClient) -> None:
        with pytest.raises(InvalidArgument, match="priority"):
            await client.enqueue("q", "k", priority=10**6)
        with pytest.raises(JobNotFound):
            await client.get_job(999_999)
        with pytest.raises(InvalidArgument, match="payload.*cannot be sent"):
            await client.enqueue("q", "k", {"when": object()})
        with psycopg.connect(dsn) as sync_conn, pytest.raises(InvalidArgument, match="AsyncConnection"):
            await client.enqueue("q", "k", conn=sync_conn)  # type: ignore[arg-type]

    run(scenario, dsn)
    with Client(dsn) as client:
        async def async_conn() -> None:
            async with await psycopg.AsyncConnection.connect(dsn) as tx:
                with pytest.raises(InvalidArgument, match="psycopg.Connection"):
                    client.enqueue("q", "k", conn=tx)
        asyncio.run(async_conn())
