"""Enqueueing a task (issue 42): ``task.enqueue(target, **arguments)`` with a Client or a psycopg
Connection (in its transaction) returns the job's id; with an AsyncClient or an AsyncConnection an
awaitable of it. The arguments are checked against the function's signature before anything is
sent: a missing or an unknown one is a BadArgumentType (a TypeError) naming it, nothing enqueued."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import timedelta

import psycopg
import pytest

from pgq_thin import AsyncClient, BadArgument, BadArgumentType, Client, JobContext, Task, Worker

from sqlhelpers import job, one


@dataclass
class Point:
    x: int
    y: int


worker = Worker(["maps"])  # connects to nothing: its tasks are enqueued from anywhere


@worker.task(max_attempts=7, priority=3, unique_key=lambda user_id, **_: f"draw:{user_id}")
def draw(user_id: int, at: Point, ctx: JobContext | None = None, colour: str = "red") -> None:
    raise AssertionError("not run here")


def count(conn: psycopg.Connection) -> int:
    return int(one(conn, "SELECT count(*) FROM pgq.jobs"))


def test_enqueue_with_a_client_returns_the_id_with_the_tasks_defaults(dsn: str, conn: psycopg.Connection) -> None:
    assert isinstance(draw, Task) and draw.kind == "draw" and draw.queue == "maps"
    with Client(dsn) as client:
        job_id = draw.enqueue(client, user_id=1, at=Point(2, 3))
        again = draw.enqueue(client, 1, Point(9, 9))  # positional too; the same unique key: the same job
        later = draw.options(run_at=None, priority=9, unique_key="other", max_run_time="1m").enqueue(
            client, user_id=1, at={"x": 0, "y": 0})
    assert isinstance(job_id, int) and again == job_id and later != job_id
    row = job(conn, job_id)
    assert row["payload"] == {"user_id": 1, "at": {"x": 2, "y": 3}}
    assert (row["queue"], row["kind"], row["max_attempts"], row["priority"], row["unique_key"]) == (
        "maps", "draw", 7, 3, "draw:1")
    other = job(conn, later)
    assert (other["priority"], other["unique_key"], other["max_run_time"]) == (9, "other", timedelta(minutes=1))


def test_enqueue_on_a_connection_is_part_of_its_transaction(dsn: str, conn: psycopg.Connection) -> None:
    with psycopg.connect(dsn) as mine:
        kept = draw.enqueue(mine, user_id=2, at=Point(0, 0))
        mine.commit()
        dropped = draw.enqueue(mine, user_id=3, at=Point(0, 0))
        mine.rollback()
    assert job(conn, kept)["payload"]["user_id"] == 2
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE id = %s", (dropped,)) == 0


def test_enqueue_with_an_async_client_or_connection_returns_an_awaitable(dsn: str, conn: psycopg.Connection) -> None:
    async def main() -> tuple[int, int, int]:
        async with AsyncClient(dsn) as client:
            pending = draw.enqueue(client, user_id=4, at=Point(1, 1))
            assert asyncio.iscoroutine(pending) or asyncio.isfuture(pending) or hasattr(pending, "__await__")
            first = await pending
        async with await psycopg.AsyncConnection.connect(dsn) as mine:
            second = await draw.enqueue(mine, user_id=5, at=Point(1, 1))
            await mine.commit()
            third = await draw.enqueue(mine, user_id=6, at=Point(1, 1))
            await mine.rollback()
        return first, second, third

    first, second, third = asyncio.run(main())
    assert job(conn, first)["payload"]["user_id"] == 4 and job(conn, second)["payload"]["user_id"] == 5
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE id = %s", (third,)) == 0


@pytest.mark.parametrize(("args", "kwargs", "message"), [
    ((), {"user_id": 1}, "task draw: missing a required argument: 'at'"),
    ((), {"user_id": 1, "at": Point(0, 0), "color": "blue"}, "task draw: got an unexpected keyword argument 'color'"),
    ((1, Point(0, 0), "blue", "green"), {}, "task draw: too many positional arguments"),
    ((), {"user_id": 1, "at": (0, 0)}, 'task draw: argument "at" must be Point, got tuple'),
    ((), {"user_id": 1, "at": Point(0, 0), "ctx": None}, 'task draw: argument "ctx" is the job\'s context'),
])
def test_a_bad_argument_is_refused_before_anything_is_sent(
        dsn: str, conn: psycopg.Connection, args: tuple[object, ...], kwargs: dict[str, object], message: str) -> None:
    with Client(dsn) as client:
        with pytest.raises(BadArgumentType, match=f"^{message}") as refused:
            draw.enqueue(client, *args, **kwargs)
        assert isinstance(refused.value, TypeError) and refused.value.sqlstate == "22023"

        async def via_async() -> None:
            async with AsyncClient(dsn) as aclient:
                with pytest.raises(BadArgumentType, match=f"^{message}"):
                    draw.enqueue(aclient, *args, **kwargs)  # at the call, before any await

        asyncio.run(via_async())
    assert count(conn) == 0


def test_a_payload_json_cannot_carry_or_a_bad_target_is_refused(dsn: str, conn: psycopg.Connection) -> None:
    with Client(dsn) as client, pytest.raises(BadArgument, match='argument "payload"'):
        draw.enqueue(client, user_id=float("nan"), at=Point(0, 0))
    with pytest.raises(BadArgumentType, match='argument "target" of draw.enqueue must be a Client'):
        draw.enqueue(dsn, user_id=1, at=Point(0, 0))  # type: ignore[call-overload]
    assert count(conn) == 0


def test_calling_a_task_runs_the_function_here() -> None:
    seen: list[int] = []
    task = Worker(["x"]).task(kind="plain")(lambda n: seen.append(n) or n * 2)
    assert task(21) == 42 and seen == [21]


def test_extra_keywords_and_unresolvable_annotations(caplog: pytest.LogCaptureFixture) -> None:
    def tagged(name: str, **tags: object) -> None: ...

    task = Worker(["x"]).task(kind="tagged")(tagged)
    assert task.payload("a", colour="red", size=3) == {"name": "a", "colour": "red", "size": 3}

    def later(point: NotDefinedAnywhere) -> None: ...  # type: ignore[name-defined]  # noqa: F821

    with caplog.at_level("WARNING", logger="pgq_thin.worker"):
        task = Worker(["x"]).task(kind="later")(later)
    assert "the annotation 'NotDefinedAnywhere' of 'point' cannot be resolved" in caplog.text
    assert task.payload(point={"x": 1}) == {"point": {"x": 1}}
