"""Tasks as typed functions on both runtimes (issue 42): @worker.task registers a handler whose
arguments are the payload's fields; dataclasses and pydantic models are rebuilt for it; a ``ctx``
parameter gets the JobContext; ``async def`` tasks run on an AsyncWorker; handlers written the
(job, ctx) way keep working beside tasks."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from pgq_thin import Client, Job, JobContext
from pgq_thin.worker import AsyncWorker, Worker

from sqlhelpers import job, wait_for
from workerkit import _current, enqueue, fast_worker, running


@pytest.fixture(autouse=True)
def current_runtime(runtime: str) -> Iterator[str]:
    _current[0] = runtime
    yield runtime
    _current[0] = "threads"


@dataclass
class Address:
    street: str
    city: str


@dataclass
class Customer:
    name: str
    address: Address
    previous: list[Address]
    vip: bool = False


def done(conn: psycopg.Connection, *ids: int) -> bool:
    return all(job(conn, i)["state"] == "done" for i in ids)


def test_a_task_gets_the_payloads_fields_as_arguments_and_its_dataclasses_rebuilt(
        dsn: str, conn: psycopg.Connection) -> None:
    worker = fast_worker()
    seen: list[tuple[Any, ...]] = []

    @worker.task(queue="default", max_attempts=3, priority=5)
    def welcome(user_id: int, customer: Customer, note: str | None = None, greeting: str = "hello") -> Customer:
        seen.append((user_id, customer, note, greeting))
        return customer

    # the function's __qualname__, without its "<locals>." (a kind is a name: no "<" or ">")
    assert worker.kinds == ["test_a_task_gets_the_payloads_fields_as_arguments_and_its_dataclasses_rebuilt.welcome"]
    customer = Customer("Ada", Address("1 Main St", "Paris"), [Address("2 Old Rd", "Lyon")])
    with Client(dsn) as client:
        job_id = welcome.enqueue(client, 42, customer=customer, note=None)
    row = job(conn, job_id)
    assert row["payload"] == {"user_id": 42, "note": None, "customer": {
        "name": "Ada", "address": {"street": "1 Main St", "city": "Paris"},
        "previous": [{"street": "2 Old Rd", "city": "Lyon"}], "vip": False}}
    assert (row["kind"], row["queue"], row["max_attempts"], row["priority"]) == (welcome.kind, "default", 3, 5)
    with running(worker, dsn):
        wait_for(lambda: done(conn, job_id), "the task's job done")
    assert seen == [(42, customer, None, "hello")]
    assert isinstance(seen[0][1].previous[0], Address)
    assert job(conn, job_id)["result"] == row["payload"]["customer"]  # a dataclass result: its fields


def test_a_ctx_parameter_gets_the_job_context_and_old_handlers_work_beside_tasks(
        dsn: str, conn: psycopg.Connection) -> None:
    worker = fast_worker()
    contexts: list[JobContext] = []

    @worker.task(kind="with_ctx")
    def with_ctx(ctx: JobContext, n: int) -> int:
        contexts.append(ctx)
        return n * 2

    @worker.handler("classic")
    def classic(job_: Job, ctx: JobContext) -> dict[str, Any]:
        return {"payload": job_.payload}

    with Client(dsn) as client:
        task_id = with_ctx.enqueue(client, n=21)
    classic_id = enqueue(conn, "classic", '{"a": 1}')
    with running(worker, dsn):
        wait_for(lambda: done(conn, task_id, classic_id), "both jobs done")
    assert job(conn, task_id)["result"] == 42 and job(conn, task_id)["payload"] == {"n": 21}
    assert isinstance(contexts[0], JobContext) and contexts[0].job.id == task_id
    assert job(conn, classic_id)["result"] == {"payload": {"a": 1}}


def test_a_payload_the_signature_cannot_take_fails_the_attempt_naming_the_field(
        dsn: str, conn: psycopg.Connection) -> None:
    worker = fast_worker()

    @worker.task(kind="strict", max_attempts=1)
    def strict(user_id: int) -> None:
        raise AssertionError("not called")

    missing, unknown = enqueue(conn, "strict", "{}", max_attempts=1), enqueue(
        conn, "strict", '{"user_id": 1, "userid": 2}', max_attempts=1)
    with running(worker, dsn):
        wait_for(lambda: job(conn, missing)["state"] == "failed" and job(conn, unknown)["state"] == "failed",
                 "both jobs failed")
    assert "payload lacks 'user_id'" in job(conn, missing)["last_error"]
    assert "fields the function does not take: 'userid'" in job(conn, unknown)["last_error"]


def test_pydantic_models_are_sent_as_their_fields_and_rebuilt(dsn: str, conn: psycopg.Connection) -> None:
    pydantic = pytest.importorskip("pydantic")

    class Order(pydantic.BaseModel):  # type: ignore[name-defined,misc]
        sku: str
        quantity: int

    worker = fast_worker()
    seen: list[Any] = []

    def ship(order: Order, orders: list[Order] | None = None) -> None:
        seen.append((order, orders))

    ship.__annotations__ = {"order": Order, "orders": list[Order] | None, "return": None}
    task = worker.task(kind="ship")(ship)
    with Client(dsn) as client:
        job_id = task.enqueue(client, order=Order(sku="A-1", quantity=2), orders=[Order(sku="B", quantity=1)])
    assert job(conn, job_id)["payload"] == {"order": {"sku": "A-1", "quantity": 2},
                                           "orders": [{"sku": "B", "quantity": 1}]}
    with running(worker, dsn):
        wait_for(lambda: done(conn, job_id), "the task's job done")
    assert seen == [(Order(sku="A-1", quantity=2), [Order(sku="B", quantity=1)])]


def test_async_def_tasks_run_on_an_async_worker_and_are_refused_by_a_worker(
        runtime: str, dsn: str, conn: psycopg.Connection) -> None:
    worker = fast_worker()

    async def notify(address: Address) -> str:
        await asyncio.sleep(0)
        return f"{address.city}: {threading.current_thread().name}"

    if runtime == "threads":
        assert isinstance(worker, Worker)
        with pytest.raises(TypeError, match="is an async def, which a Worker cannot run"):
            worker.task(notify)
        assert worker.kinds == []
        return
    assert isinstance(worker, AsyncWorker)
    task = worker.task(notify)
    with Client(dsn) as client:
        job_id = task.enqueue(client, address=Address("3 Quay", "Nantes"))
    with running(worker, dsn):
        wait_for(lambda: done(conn, job_id), "the async task's job done")
    assert job(conn, job_id)["result"] == "Nantes: test-worker"  # in the loop's thread, not a handler thread


def test_a_task_is_refused_after_run_or_twice_for_a_kind(dsn: str) -> None:
    worker = fast_worker()
    worker.task(kind="once")(lambda n: n)
    with pytest.raises(ValueError, match="a handler for kind 'once' is already registered"):
        worker.task(kind="once")(lambda n: n)
    with pytest.raises(TypeError, match="'delay' is not an option of enqueue"):
        worker.task(kind="other", delay=5)(lambda n: n)
    with pytest.raises(TypeError, match="parameter 'args' has no name a payload can carry"):
        worker.task(kind="varargs")(lambda *args: None)
    with pytest.raises(TypeError, match="has no name a kind can be made of .* give its kind="):
        worker.task(lambda n: n)
    with running(worker, dsn):
        pass
    with pytest.raises(RuntimeError, match="must be registered before run"):
        worker.task(kind="late")(lambda n: n)
