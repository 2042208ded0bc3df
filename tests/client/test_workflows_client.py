"""Issue 26 from Python: enqueue's dependency_mode, batch and notify_finished; batches
(batch_open, batch_close, batch_status, cancel_batch); a producer's job_result and wait (LISTEN
pgq_finished, with a slow poll behind it); job_links; and JobContext.dependency_results paging
through a fan-in's inputs on a real Worker and AsyncWorker. Real PostgreSQL, real logins."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from pgq_thin import (
    AsyncClient,
    BatchStatus,
    Client,
    DependencyResult,
    InvalidArgument,
    JobLink,
    JobNotFound,
    JobResult,
    PgqError,
    WaitTimeout,
    WrongState,
)
from pgq_thin.errors import BadArgument, BadArgumentType
from pgq_thin.models import Job
from pgq_thin.worker import AsyncWorker, JobContext, Worker
from pgq_thin.worker.context import DEPENDENCY_PAGE

from loginkit import PROD, PROD2
from sqlhelpers import one, run_worker, wait_for

#: A poll interval no test waits out: a wait given it returns only through a notification.
NEVER = 3600.0


@pytest.fixture
def client(dsn: str):
    with Client(dsn) as c:
        yield c


def run_async(scenario: Any) -> Any:
    return asyncio.run(scenario)


def finish(client: Client, job_id: int, how: str = "done", result: Any = None) -> None:
    """Claims exactly this job (the only claimable one of its queue) and ends it ``how``."""
    queue = client.get_job(job_id).queue
    [claimed] = client.claim("w", [queue])
    assert claimed.id == job_id
    if how == "done":
        assert client.complete(claimed.id, claimed.attempt, result)
    else:
        assert client.fail(claimed.id, claimed.attempt, "boom", retryable=False) == "failed"


# enqueue's new arguments ----------------------------------------------------------------------------

def test_enqueue_and_enqueue_many_pass_dependency_mode_batch_and_notify_finished(client: Client) -> None:
    dep = client.enqueue("q", "dep")
    batch = client.batch_open("callbacks", "report")
    one_job = client.enqueue("q", "k", depends_on=[dep], dependency_mode="all_ended", batch=batch,
                             notify_finished=True)
    many = client.enqueue_many("q", "k", [{}, {}], depends_on=[dep], dependency_mode="all_ended", batch=batch,
                               notify_finished=True)
    for job_id in [one_job, *many]:
        record = client.get_job(job_id)
        assert (record.state, record.dependency_mode, record.batch_id, record.notify_finished) == (
            "waiting", "all_ended", batch, True)
        assert record.enqueued_by is not None
    plain = client.get_job(client.enqueue("q", "k"))
    assert (plain.dependency_mode, plain.batch_id, plain.notify_finished) == (None, None, False)
    assert client.batch_status(batch).members == 3


def test_bad_dependency_mode_and_batch_are_refused_naming_them(client: Client) -> None:
    with pytest.raises(InvalidArgument, match="dependency_mode") as bad_mode:
        client.enqueue("q", "k", depends_on=[client.enqueue("q", "k")], dependency_mode="some_done")
    assert bad_mode.value.sqlstate == "22023"
    with pytest.raises(InvalidArgument, match="batch") as unknown:
        client.enqueue_many("q", "k", [{}], batch=987654)
    assert unknown.value.sqlstate == "22023"
    with pytest.raises(BadArgumentType, match='argument "dependency_mode"'):
        client.enqueue("q", "k", dependency_mode=["all_done"])  # type: ignore[arg-type]
    with pytest.raises(BadArgumentType, match='argument "notify_finished"'):
        client.enqueue("q", "k", notify_finished=1)  # type: ignore[arg-type]
    with pytest.raises(BadArgumentType, match='argument "batch_id"'):
        client.batch_close("7")  # type: ignore[arg-type]
    sealed = client.batch_open("callbacks", "report")
    client.batch_close(sealed)
    with pytest.raises(PgqError, match="batch") as closed:
        client.enqueue("q", "k", batch=sealed)
    assert closed.value.sqlstate == "55000"


# Batches -----------------------------------------------------------------------------------------------

def test_a_batch_counts_its_members_and_enqueues_its_callback_once_sealed_and_ended(client: Client) -> None:
    batch = client.batch_open("callbacks", "report", {"report": 7})
    members = client.enqueue_many("members", "m", [{"n": n} for n in range(3)], batch=batch)
    opened = client.batch_status(batch)
    assert isinstance(opened, BatchStatus)
    assert (opened.batch_id, opened.state, opened.members, opened.unfinished, opened.run_when,
            opened.callback_job_id) == (batch, "open", 3, 3, "all_ended", None)
    assert (opened.callback_queue, opened.callback_kind, opened.sealed_at) == ("callbacks", "report", None)
    finish(client, members[0], "done")
    finish(client, members[1], "failed")
    assert client.batch_close(batch) is True
    assert client.batch_close(batch) is False
    sealed = client.batch_status(batch)
    assert (sealed.state, sealed.unfinished, sealed.done, sealed.failed, sealed.callback_job_id) == (
        "sealed", 1, 1, 1, None)
    assert sealed.sealed_at is not None
    finish(client, members[2], "done")
    ended = client.batch_status(batch)
    assert (ended.state, ended.unfinished, ended.done, ended.failed, ended.cancelled) == ("finished", 0, 2, 1, 0)
    assert ended.callback_job_id is not None
    callback = client.get_job(ended.callback_job_id)
    assert (callback.queue, callback.kind, callback.payload, callback.state) == (
        "callbacks", "report", {"report": 7}, "pending")
    assert callback.meta == {"batch": {"id": batch, "members": 3, "done": 2, "failed": 1, "cancelled": 0}}


def test_cancel_batch_cancels_the_members_not_started_and_the_callback(client: Client) -> None:
    batch = client.batch_open("callbacks", "report", run_when="all_done")
    members = client.enqueue_many("members", "m", [{}, {}, {}], batch=batch)
    assert client.cancel_batch(batch) == 3
    status = client.batch_status(batch)
    assert (status.state, status.cancelled, status.unfinished) == ("cancelled", 3, 0)
    assert {client.get_job(m).state for m in members} == {"cancelled"}
    assert status.callback_job_id is not None  # enqueued already cancelled
    assert client.get_job(status.callback_job_id).state == "cancelled"
    with pytest.raises(JobNotFound):
        client.batch_status(987654)
    with pytest.raises(JobNotFound):
        client.cancel_batch(987654)


def test_the_batch_calls_answer_on_the_async_client_too(dsn: str) -> None:
    async def scenario() -> tuple[BatchStatus, bool, int]:
        async with AsyncClient(dsn) as aclient:
            batch = await aclient.batch_open("callbacks", "report")
            await aclient.enqueue("members", "m", batch=batch)
            closed = await aclient.batch_close(batch)
            return await aclient.batch_status(batch), closed, await aclient.cancel_batch(batch)

    status, closed, cancelled = run_async(scenario())
    assert (status.state, status.members, closed, cancelled) == ("sealed", 1, True, 1)


# Results: job_result, job_links, dependency_results ---------------------------------------------------------

def test_job_result_is_the_state_until_the_end_then_the_result(client: Client) -> None:
    job_id = client.enqueue("q", "k")
    pending = client.job_result(job_id)
    assert isinstance(pending, JobResult)
    assert (pending.state, pending.result, pending.finished_at, pending.finished) == ("pending", None, None, False)
    finish(client, job_id, "done", {"total": 42})
    done = client.job_result(job_id)
    assert (done.state, done.result, done.finished) == ("done", {"total": 42}, True)
    assert done.finished_at is not None
    with pytest.raises(JobNotFound):
        client.job_result(987654)


def test_job_links_lists_the_dependencies_then_the_dependants(client: Client) -> None:
    a, b = client.enqueue("q", "a"), client.enqueue("other", "b")
    c = client.enqueue("q", "c", depends_on=[b, a])
    d = client.enqueue("q", "d", depends_on=[c])
    links = client.job_links(c)
    assert all(isinstance(link, JobLink) for link in links)
    assert [(link.relation, link.job_id, link.queue, link.kind, link.state) for link in links] == [
        ("dependency", a, "q", "a", "pending"), ("dependency", b, "other", "b", "pending"),
        ("dependant", d, "q", "d", "waiting")]
    assert [link.job_id for link in client.job_links(c, limit_rows=1)] == [a, d]
    with pytest.raises(JobNotFound):
        client.job_links(987654)


def test_dependency_results_pages_by_id_for_the_running_attempt_only(client: Client) -> None:
    deps = client.enqueue_many("deps", "d", [{}, {}, {}])
    dependant = client.enqueue("q", "k", depends_on=deps, dependency_mode="all_ended")
    finish(client, deps[0], "done", {"n": 0})
    finish(client, deps[1], "failed")
    client.cancel(deps[2])
    [claimed] = client.claim("w", ["q"])
    assert claimed.id == dependant
    rows = client.dependency_results(claimed.id, claimed.attempt)
    assert all(isinstance(r, DependencyResult) for r in rows)
    assert [(r.dependency_id, r.state, r.result) for r in rows] == [
        (deps[0], "done", {"n": 0}), (deps[1], "failed", None), (deps[2], "cancelled", None)]
    assert rows[1].last_error is not None and "boom" in rows[1].last_error
    page = client.dependency_results(claimed.id, claimed.attempt, limit_rows=1, after_id=deps[0])
    assert [r.dependency_id for r in page] == [deps[1]]
    with pytest.raises(WrongState):
        client.dependency_results(claimed.id, claimed.attempt + 1)
    with pytest.raises(InvalidArgument, match="limit_rows"):
        client.dependency_results(claimed.id, claimed.attempt, limit_rows=0)


# wait ---------------------------------------------------------------------------------------------------

def _waiter_is_listening(conn: psycopg.Connection) -> bool:
    """Whether a wait has LISTENed and read the job's result once: its connection sits idle after
    pgq.job_result (its LISTEN came before that read)."""
    return bool(one(conn, "SELECT count(*) > 0 FROM pg_stat_activity WHERE state = 'idle'"
                          " AND query LIKE '%%pgq.job_result%%' AND pid <> pg_backend_pid()"))


def test_wait_returns_at_once_for_a_job_that_already_ended(client: Client) -> None:
    job_id = client.enqueue("q", "k")
    finish(client, job_id, "done", {"ok": True})
    result = client.wait(job_id, timeout=0)  # 0: look once
    assert (result.state, result.result) == ("done", {"ok": True})
    failed = client.enqueue("q", "k")
    finish(client, failed, "failed")
    assert client.wait(failed, timeout=0).state == "failed"


def test_wait_is_woken_by_the_notification_of_the_end(client: Client, conn: psycopg.Connection) -> None:
    job_id = client.enqueue("q", "k", notify_finished=True)
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(_outcome(lambda: client.wait(
        job_id, timeout=60, poll_interval=NEVER))), daemon=True)
    waiter.start()
    wait_for(lambda: _waiter_is_listening(conn), "the wait to listen and read the result once")
    with Client(client.dsn) as other:  # another connection ends it
        finish(other, job_id, "done", {"sum": 3})
    waiter.join(timeout=60)
    # The poll is an hour: only the notification can have woken it.
    assert not waiter.is_alive() and len(got) == 1
    assert isinstance(got[0], JobResult) and (got[0].state, got[0].result) == ("done", {"sum": 3})


def _outcome(call: Any) -> Any:
    try:
        return call()
    except Exception as exc:  # noqa: BLE001 - the test looks at it
        return exc


def test_wait_polls_a_job_enqueued_without_notify_finished(client: Client, conn: psycopg.Connection) -> None:
    job_id = client.enqueue("q", "k")
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(_outcome(lambda: client.wait(
        job_id, timeout=60, poll_interval=0.05))), daemon=True)
    waiter.start()
    wait_for(lambda: _waiter_is_listening(conn), "the wait to read the result once")
    finish(client, job_id, "failed")
    waiter.join(timeout=60)
    assert len(got) == 1 and isinstance(got[0], JobResult) and got[0].state == "failed"


def test_wait_times_out_naming_the_job_and_its_state(client: Client) -> None:
    job_id = client.enqueue("q", "k")
    with pytest.raises(WaitTimeout) as once:
        client.wait(job_id, timeout=0)
    assert (once.value.job_id, once.value.state) == (job_id, "pending")
    assert f"job {job_id}" in str(once.value) and "pending" in str(once.value)
    assert isinstance(once.value, TimeoutError) and isinstance(once.value, PgqError)
    client.claim("w", ["q"])
    with pytest.raises(TimeoutError, match=f"job {job_id} .*running"):
        client.wait(job_id, timeout=0.2, poll_interval=0.05)


def test_wait_refuses_bad_arguments_naming_them(client: Client) -> None:
    for kwargs, name in (({"timeout": -1}, "timeout"), ({"timeout": float("nan")}, "timeout"),
                         ({"poll_interval": 0}, "poll_interval"), ({"timeout": "5"}, "timeout"),
                         ({"poll_interval": "soon"}, "poll_interval")):  # text: a duration with its unit
        with pytest.raises(BadArgument, match=f'argument "{name}"'):
            client.wait(1, **kwargs)
    with pytest.raises(BadArgumentType, match='argument "job_id"'):
        client.wait("1")  # type: ignore[arg-type]


def test_wait_for_a_job_of_another_login_is_job_not_found(dsn: str, login) -> None:  # noqa: F811
    login(PROD)  # makes the roles
    with Client(make_conninfo(dsn, user=PROD2)) as theirs, Client(make_conninfo(dsn, user=PROD)) as mine:
        their_job = theirs.enqueue("q", "k")
        my_job = mine.enqueue("q", "k")
        with pytest.raises(JobNotFound):
            mine.wait(their_job, timeout=0)
        with pytest.raises(JobNotFound):
            mine.job_result(their_job)
        with pytest.raises(WaitTimeout, match="pending"):
            mine.wait(my_job, timeout=0)  # its own job: it may read it
        assert mine.job_result(my_job).state == "pending"


def test_wait_behind_a_pooling_proxy_polls_without_listen(dsn: str, conn: psycopg.Connection) -> None:
    with Client(dsn, pooled=True) as client:
        job_id = client.enqueue("q", "k", notify_finished=True)
        got: list[Any] = []
        waiter = threading.Thread(target=lambda: got.append(_outcome(lambda: client.wait(
            job_id, timeout=60, poll_interval=0.05))), daemon=True)
        waiter.start()
        wait_for(lambda: _waiter_is_listening(conn), "the wait to read the result once")
        finish(client, job_id, "done")
        waiter.join(timeout=60)
        assert len(got) == 1 and isinstance(got[0], JobResult) and got[0].state == "done"


def test_async_wait_is_woken_by_the_notification_and_times_out_naming_the_state(
        dsn: str, conn: psycopg.Connection) -> None:
    async def scenario() -> tuple[JobResult, WaitTimeout]:
        async with AsyncClient(dsn) as aclient:
            job_id = await aclient.enqueue("q", "k", notify_finished=True)
            waiting = asyncio.create_task(aclient.wait(job_id, timeout=60, poll_interval=NEVER))
            while not await asyncio.to_thread(_waiter_is_listening, conn):
                await asyncio.sleep(0.02)
            await asyncio.to_thread(_finish_elsewhere, dsn, job_id)
            result = await asyncio.wait_for(waiting, timeout=60)
            pending = await aclient.enqueue("q", "k")
            try:
                await aclient.wait(pending, timeout=0.1, poll_interval=0.02)
            except WaitTimeout as exc:
                return result, exc
            raise AssertionError("the wait did not time out")

    result, timed_out = run_async(scenario())
    assert (result.state, result.result) == ("done", {"async": True})
    assert timed_out.state == "pending" and "pending" in str(timed_out)


def _finish_elsewhere(dsn: str, job_id: int) -> None:
    with Client(dsn) as other:
        finish(other, job_id, "done", {"async": True})


def test_async_wait_returns_an_ended_job_and_refuses_another_logins(dsn: str, login) -> None:  # noqa: F811
    login(PROD)
    with Client(make_conninfo(dsn, user=PROD2)) as theirs:
        their_job = theirs.enqueue("q", "k")

    async def scenario() -> None:
        async with AsyncClient(dsn) as aclient:
            job_id = await aclient.enqueue("q", "k")
            await aclient.cancel(job_id)
            assert (await aclient.wait(job_id, timeout=0)).state == "cancelled"
        async with AsyncClient(make_conninfo(dsn, user=PROD)) as mine:
            with pytest.raises(JobNotFound):
                await mine.wait(their_job, timeout=5)

    run_async(scenario())


# JobContext.dependency_results on the workers --------------------------------------------------------------

FAN_IN = 250  # more than two pages of DEPENDENCY_PAGE


def _fan_in(client: Client) -> tuple[list[int], int]:
    """FAN_IN dependencies (every 50th fails) and one dependant of all of them ('all_ended')."""
    assert FAN_IN > 2 * DEPENDENCY_PAGE
    deps = client.enqueue_many("deps", "dep", [{"n": n} for n in range(FAN_IN)], max_attempts=1)
    dependant = client.enqueue("fanin", "sum", depends_on=deps, dependency_mode="all_ended", notify_finished=True)
    return deps, dependant


def _dep(job: Job, ctx: JobContext) -> dict[str, int]:
    if job.payload["n"] % 50 == 0:
        raise ValueError(f"dependency {job.payload['n']} fails")
    return {"n": job.payload["n"]}


def _summary(rows: list[DependencyResult]) -> dict[str, Any]:
    return {"ids": [r.dependency_id for r in rows], "states": [r.state for r in rows],
            "sum": sum(r.result["n"] for r in rows if r.state == "done"),
            "errors": sum(1 for r in rows if r.last_error and "fails" in r.last_error)}


def _check_fan_in(client: Client, deps: list[int], dependant: int) -> None:
    result = client.wait(dependant, timeout=120)
    assert result.state == "done", result
    failing = [n for n in range(FAN_IN) if n % 50 == 0]
    assert result.result["ids"] == deps  # every dependency, once, in id order, across three pages
    assert result.result["states"] == ["failed" if n in failing else "done" for n in range(FAN_IN)]
    assert result.result["sum"] == sum(n for n in range(FAN_IN) if n not in failing)
    assert result.result["errors"] == len(failing)


def test_a_worker_handler_reads_every_dependency_of_a_fan_in(dsn: str, client: Client) -> None:
    deps, dependant = _fan_in(client)
    worker = Worker(queues=["deps", "fanin"], concurrency=4, name="fanin-thread")
    worker.handler("dep")(_dep)

    @worker.handler("sum")
    def total(job: Job, ctx: JobContext) -> dict[str, Any]:
        return _summary(list(ctx.dependency_results()))

    errors: list[BaseException] = []
    thread = run_worker(worker, dsn, errors)
    try:
        _check_fan_in(client, deps, dependant)
    finally:
        worker.stop()
        thread.join(timeout=30)
    assert not errors, errors


def test_an_async_worker_handler_reads_every_dependency_with_async_for_or_await(dsn: str, client: Client) -> None:
    deps, dependant = _fan_in(client)
    awaited = client.enqueue("fanin", "awaited", depends_on=deps[:3], dependency_mode="all_ended",
                             notify_finished=True)
    worker = AsyncWorker(queues=["deps", "fanin"], concurrency=4, name="fanin-async")
    worker.handler("dep")(_dep)

    @worker.handler("sum")
    async def total(job: Job, ctx: JobContext) -> dict[str, Any]:
        return _summary([row async for row in ctx.dependency_results()])

    @worker.handler("awaited")
    async def listed(job: Job, ctx: JobContext) -> list[int]:
        return [row.dependency_id for row in await ctx.dependency_results()]

    errors: list[BaseException] = []
    thread = run_worker(worker, dsn, errors)
    try:
        _check_fan_in(client, deps, dependant)
        assert client.wait(awaited, timeout=120).result == deps[:3]
    finally:
        worker.stop()
        thread.join(timeout=30)
    assert not errors, errors


def test_dependency_results_says_which_loop_to_use_and_marks_a_lost_job(dsn: str, client: Client) -> None:
    dep = client.enqueue("deps", "d")
    finish(client, dep, "done", {"x": 1})
    client.enqueue("q", "k", depends_on=[dep])
    [claimed] = client.claim("w", ["q"])
    context = JobContext(claimed, client, "w")
    assert [(r.dependency_id, r.result) for r in context.dependency_results()] == [(dep, {"x": 1})]

    async def wrong_loops() -> None:
        with pytest.raises(TypeError, match="async for"):
            list(JobContext(claimed, AsyncClient(dsn), "w").dependency_results())
        with pytest.raises(TypeError, match="with for"):
            [row async for row in context.dependency_results()]

    run_async(wrong_loops())
    stale = JobContext(dataclasses.replace(claimed, attempt=claimed.attempt + 1), client, "w")
    with pytest.raises(WrongState):
        list(stale.dependency_results())
    assert stale.lease_lost.is_set() and not context.lease_lost.is_set()
