"""One function per pgq SQL function: its arguments, its statement (from pgq_thin.queries) and how
its rows become the typed result (pgq_thin.models). Each returns a ``Call``; ``PgqCalls`` turns
each into a method of the same name, which Client sends over a pooled connection and AsyncClient
over an async one: the description of a call exists once. Nothing here talks to the database."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Generic, ParamSpec, Protocol, TypeVar, overload

import psycopg
from psycopg.rows import RowFactory, args_row, dict_row
from psycopg.types.json import Jsonb

from pgq_thin import queries
from pgq_thin.models import (
    HealthFinding,
    Job,
    JobEvent,
    JobRecord,
    QueueMetrics,
    QueueSettings,
    QueueStats,
    QueueStatus,
    Schedule,
    TenantSettings,
    record,
)

__all__ = ["ALL", "Call", "Interval", "Method", "PgqCalls"]

log = logging.getLogger("pgq_thin.client")

T = TypeVar("T")
P = ParamSpec("P")

#: An interval argument: a timedelta, or a number of seconds.
Interval = timedelta | float | int

#: The caller's own connection, to enqueue inside its transaction (a Connection for Client, an
#: AsyncConnection for AsyncClient).
CallerConnection = psycopg.Connection[Any] | psycopg.AsyncConnection[Any]


@dataclass(frozen=True)
class Call(Generic[T]):
    """One statement to send: ``query`` with ``params``; ``rows`` the psycopg row factory (None:
    tuples); ``read`` makes the result of the rows; ``conn`` the caller's connection, if any."""

    query: str
    params: dict[str, Any]
    read: Callable[[list[Any]], T]
    rows: RowFactory[Any] | None = None
    conn: CallerConnection | None = None


def _interval(value: Interval | None) -> timedelta | None:
    if value is None or isinstance(value, timedelta):
        return value
    return timedelta(seconds=float(value))


def _value(rows: list[Any]) -> Any:
    return rows[0][0]


def _flag(rows: list[Any]) -> bool:
    return bool(rows[0][0])


def _count(rows: list[Any]) -> int:
    return int(rows[0][0])


def _ids(rows: list[Any]) -> list[int]:
    return [r[0] for r in rows]


def _settings(rows: list[Any]) -> QueueSettings:
    return record(QueueSettings, rows[0])


# Producers ----------------------------------------------------------------------------------------


def enqueue(
    queue: str,
    kind: str,
    payload: dict[str, Any] | None = None,
    *,
    run_at: datetime | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    unique_key: str | None = None,
    tenant: str | None = None,
    max_run_time: Interval | None = None,
    conn: CallerConnection | None = None,
) -> Call[int]:
    """pgq.enqueue: add one job, now or at ``run_at``; returns its id. With ``conn``, the job
    is part of that connection's current transaction. ``max_run_time`` caps each attempt
    (default: the queue's)."""

    def read(rows: list[Any]) -> int:
        job_id = int(rows[0][0])
        log.debug("enqueued", extra={"job_id": job_id, "queue": queue, "kind": kind})
        return job_id

    return Call(queries.ENQUEUE, {
        "queue": queue, "kind": kind, "payload": Jsonb({} if payload is None else payload),
        "run_at": run_at, "priority": priority, "max_attempts": max_attempts,
        "unique_key": unique_key, "tenant": tenant, "max_run_time": _interval(max_run_time),
    }, read, conn=conn)


def enqueue_many(
    queue: str,
    kind: str,
    payloads: Sequence[dict[str, Any]],
    *,
    run_at: datetime | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    tenant: str | None = None,
    max_run_time: Interval | None = None,
    conn: CallerConnection | None = None,
) -> Call[list[int]]:
    """pgq.enqueue_many: add one job per payload in one statement; ids in payload order."""
    return Call(queries.ENQUEUE_MANY, {
        "queue": queue, "kind": kind, "payloads": [Jsonb(p) for p in payloads],
        "run_at": run_at, "priority": priority, "max_attempts": max_attempts, "tenant": tenant,
        "max_run_time": _interval(max_run_time),
    }, _ids, conn=conn)


# Workers ------------------------------------------------------------------------------------------


def claim(worker: str, queues: Sequence[str] | None = None, batch: int = 1,
          lease: Interval | None = None, kinds: Sequence[str] | None = None) -> Call[list[Job]]:
    """pgq.claim: up to ``batch`` due jobs of ``queues`` (None: all) and of ``kinds`` (None: any
    kind), each with its attempt."""
    # queries.CLAIM returns Job's fields in order: each row is built straight into a Job.
    return Call(queries.CLAIM, {
        "worker": worker, "queues": list(queues) if queues is not None else None,
        "batch": batch, "lease": _interval(lease), "kinds": list(kinds) if kinds is not None else None,
    }, list, rows=args_row(Job))


def queue_status(queues: Sequence[str]) -> Call[list[QueueStatus]]:
    """pgq.queue_status: whether each queue exists and is paused, in the order given."""
    return Call(queries.QUEUE_STATUS, {"queues": list(queues)}, lambda rows: [QueueStatus(*r) for r in rows])


def renew(job_id: int, attempt: int, lease: Interval | None = None) -> Call[datetime | None]:
    """pgq.renew: the new lease_until, or None when the job is no longer ours."""
    return Call(queries.RENEW, {"id": job_id, "attempt": attempt, "lease": _interval(lease)}, _value)


def complete(job_id: int, attempt: int, result: Any = None) -> Call[bool]:
    """pgq.complete: True when our attempt is (or already was) done; False when not ours."""
    return Call(queries.COMPLETE, {
        "id": job_id, "attempt": attempt, "result": None if result is None else Jsonb(result),
    }, _flag)


def complete_many(job_ids: Sequence[int], attempts: Sequence[int]) -> Call[list[int]]:
    """pgq.complete_many: the ids of the (id, attempt) pairs completed."""
    return Call(queries.COMPLETE_MANY, {"ids": list(job_ids), "attempts": list(attempts)}, _ids)


def fail(job_id: int, attempt: int, error: str, retry_in: Interval | None = None,
         retryable: bool = True) -> Call[str | None]:
    """pgq.fail: the new state ('pending' to retry, or 'failed'); None when not ours."""
    return Call(queries.FAIL, {
        "id": job_id, "attempt": attempt, "error": error,
        "retry_in": _interval(retry_in), "retryable": retryable,
    }, _value)


def release(job_id: int, attempt: int) -> Call[bool]:
    """pgq.release: give an unstarted job back without using up an attempt."""
    return Call(queries.RELEASE, {"id": job_id, "attempt": attempt}, _flag)


def snooze(job_id: int, attempt: int, delay: Interval) -> Call[datetime | None]:
    """pgq.snooze: pending again after ``delay``; the new run_at, or None when not ours."""
    return Call(queries.SNOOZE, {"id": job_id, "attempt": attempt, "delay": _interval(delay)}, _value)


def mark_unknown(job_id: int, attempt: int, note: str) -> Call[bool]:
    """pgq.mark_unknown: park our attempt as outcome_unknown (do not retry blindly)."""
    return Call(queries.MARK_UNKNOWN, {"id": job_id, "attempt": attempt, "note": note}, _flag)


def progress(job_id: int, attempt: int, progress: dict[str, Any]) -> Call[bool]:
    """pgq.progress: store our attempt's checkpoint (the next attempt gets it as
    ``Job.progress``); False when the job is no longer ours."""
    return Call(queries.PROGRESS, {"id": job_id, "attempt": attempt, "progress": Jsonb(progress)}, _flag)


def sweep(max_jobs: int = 1000) -> Call[int]:
    """pgq.sweep: recover jobs whose lease expired or whose attempt timed out (returns how
    many), and fire due schedules."""
    return Call(queries.SWEEP, {"max_jobs": max_jobs}, _count)


# Admin --------------------------------------------------------------------------------------------


def cancel(job_id: int) -> Call[bool]:
    """pgq.cancel: True when cancelled now, False when it had already finished."""
    return Call(queries.CANCEL, {"id": job_id}, _flag)


def retry(job_id: int) -> Call[bool]:
    """pgq.retry: a failed or cancelled job becomes pending again."""
    return Call(queries.RETRY, {"id": job_id}, _flag)


def resolve(job_id: int, state: str) -> Call[bool]:
    """pgq.resolve: settle an outcome_unknown job as done, failed, cancelled or pending."""
    return Call(queries.RESOLVE, {"id": job_id, "state": state}, _flag)


def prune(older_than: Interval | None = None, max_jobs: int = 10000) -> Call[int]:
    """pgq.prune: delete up to max_jobs finished jobs; returns how many."""
    return Call(queries.PRUNE, {"older_than": _interval(older_than), "max_jobs": max_jobs}, _count)


def pause(queue: str) -> Call[QueueSettings]:
    """pgq.pause: workers stop claiming from the queue."""
    return Call(queries.PAUSE, {"queue": queue}, _settings, rows=dict_row)


def resume(queue: str) -> Call[QueueSettings]:
    """pgq.resume: workers claim from the queue again."""
    return Call(queries.RESUME, {"queue": queue}, _settings, rows=dict_row)


def configure_queue(
    queue: str,
    *,
    lease: Interval | None = None,
    max_attempts: int | None = None,
    backoff_base: Interval | None = None,
    backoff_cap: Interval | None = None,
    retention: Interval | None = None,
    notify: bool | None = None,
    audit: bool | None = None,
    fair: bool | None = None,
    max_running: int | None = None,
    max_run_time: Interval | None = None,
) -> Call[QueueSettings]:
    """pgq.configure_queue: change the given settings (None leaves one unchanged;
    ``max_run_time=0`` removes the limit)."""
    return Call(queries.CONFIGURE_QUEUE, {
        "queue": queue, "lease": _interval(lease), "max_attempts": max_attempts,
        "backoff_base": _interval(backoff_base), "backoff_cap": _interval(backoff_cap),
        "retention": _interval(retention), "notify": notify, "audit": audit,
        "fair": fair, "max_running": max_running, "max_run_time": _interval(max_run_time),
    }, _settings, rows=dict_row)


def set_tenant_weight(queue: str, tenant: str, weight: int) -> Call[TenantSettings]:
    """pgq.set_tenant_weight: a tenant of a fair queue gets `weight` turns per round."""
    return Call(queries.SET_TENANT_WEIGHT, {"queue": queue, "tenant": tenant, "weight": weight},
                lambda rows: record(TenantSettings, rows[0]), rows=dict_row)


# Schedules ----------------------------------------------------------------------------------------


def schedule(
    name: str,
    queue: str,
    kind: str,
    *,
    cron: str | None = None,
    every: Interval | None = None,
    payload: dict[str, Any] | None = None,
    timezone: str = "UTC",
    priority: int = 0,
    max_attempts: int | None = None,
    tenant: str | None = None,
    skip_if_running: bool = False,
    enabled: bool = True,
) -> Call[Schedule]:
    """pgq.schedule: create or replace the schedule ``name`` (exactly one of ``cron`` and
    ``every``); returns it, with its next_run_at. Claims and sweeps fire it."""
    return Call(queries.SCHEDULE, {
        "name": name, "queue": queue, "kind": kind, "cron": cron, "every": _interval(every),
        "payload": Jsonb({} if payload is None else payload), "timezone": timezone,
        "priority": priority, "max_attempts": max_attempts, "tenant": tenant,
        "skip_if_running": skip_if_running, "enabled": enabled,
    }, lambda rows: record(Schedule, rows[0]), rows=dict_row)


def unschedule(name: str) -> Call[bool]:
    """pgq.unschedule: delete the schedule (its jobs stay); False when there was none."""
    return Call(queries.UNSCHEDULE, {"name": name}, _flag)


def schedules() -> Call[list[Schedule]]:
    """pgq.schedules: every schedule, by name."""
    return Call(queries.SCHEDULES, {}, lambda rows: [record(Schedule, r) for r in rows], rows=dict_row)


# Observe ------------------------------------------------------------------------------------------


def stats() -> Call[list[QueueStats]]:
    """pgq.stats: one row per queue."""
    return Call(queries.STATS, {}, lambda rows: [QueueStats(**r) for r in rows], rows=dict_row)


def metrics() -> Call[list[QueueMetrics]]:
    """pgq.metrics: one row per queue for exporters (live jobs, expired leases, finished counters)."""
    return Call(queries.METRICS, {}, lambda rows: [QueueMetrics(**r) for r in rows], rows=dict_row)


def health(max_snapshot_age: Interval = timedelta(minutes=5),
           max_ready_age: Interval = timedelta(minutes=5)) -> Call[list[HealthFinding]]:
    """pgq.health: one finding per check (severity ok, warning or critical)."""
    return Call(queries.HEALTH, {
        "max_snapshot_age": _interval(max_snapshot_age), "max_ready_age": _interval(max_ready_age),
    }, lambda rows: [HealthFinding(**r) for r in rows], rows=dict_row)


def list_jobs(queue: str | None = None, state: str | None = None, kind: str | None = None,
              limit_rows: int = 50, before_id: int | None = None) -> Call[list[JobRecord]]:
    """pgq.list_jobs: jobs newest first, filtered; pass a page's last id as ``before_id`` for the next."""
    return Call(queries.LIST_JOBS, {
        "queue": queue, "state": state, "kind": kind, "limit_rows": limit_rows, "before_id": before_id,
    }, lambda rows: [record(JobRecord, r) for r in rows], rows=dict_row)


def get_job(job_id: int) -> Call[JobRecord]:
    """pgq.get_job: the whole job row; JobNotFound when there is no such job."""
    return Call(queries.GET_JOB, {"id": job_id}, lambda rows: record(JobRecord, rows[0]), rows=dict_row)


def job_history(job_id: int) -> Call[list[JobEvent]]:
    """pgq.job_history: the job's claims, transitions and rejected stale writes, oldest first."""
    return Call(queries.JOB_HISTORY, {"id": job_id}, lambda rows: [JobEvent(**r) for r in rows], rows=dict_row)


def version() -> Call[str]:
    """pgq.version: the installed schema's version."""
    return Call(queries.VERSION, {}, lambda rows: str(rows[0][0]))


# The methods ---------------------------------------------------------------------------------------


class Sends(Protocol):
    """A client that answers a call (Client)."""

    def _send(self, call: Call[T]) -> T: ...


class AsyncSends(Protocol):
    """A client whose answer to a call is awaited (AsyncClient)."""

    def _send(self, call: Call[T]) -> Coroutine[Any, Any, T]: ...


class Method(Generic[P, T]):
    """A client method made from a call description: the same name, arguments and doc on every
    client; ``client.name(...)`` sends ``build(...)`` with the client's ``_send``, so a Client
    answers and an AsyncClient returns what to await."""

    def __init__(self, build: Callable[P, Call[T]]) -> None:
        self.build = build
        self.__name__ = build.__name__
        self.__doc__ = build.__doc__
        self.__signature__ = inspect.signature(build)

    @overload
    def __get__(self, client: None, owner: type[Any]) -> Method[P, T]: ...

    @overload
    def __get__(self, client: AsyncSends, owner: type[Any]) -> Callable[P, Coroutine[Any, Any, T]]: ...

    @overload
    def __get__(self, client: Sends, owner: type[Any]) -> Callable[P, T]: ...

    def __get__(self, client: Any, owner: type[Any]) -> Any:
        if client is None:
            return self
        build, send = self.build, client._send

        def method(*args: P.args, **kwargs: P.kwargs) -> Any:
            return send(build(*args, **kwargs))

        method.__name__ = self.__name__
        method.__doc__ = self.__doc__
        method.__signature__ = self.__signature__  # type: ignore[attr-defined]
        return method


class PgqCalls:
    """One method per pgq function, for Client and AsyncClient alike (each subclass sends)."""

    enqueue = Method(enqueue)
    enqueue_many = Method(enqueue_many)
    claim = Method(claim)
    renew = Method(renew)
    complete = Method(complete)
    complete_many = Method(complete_many)
    fail = Method(fail)
    release = Method(release)
    snooze = Method(snooze)
    mark_unknown = Method(mark_unknown)
    progress = Method(progress)
    sweep = Method(sweep)
    cancel = Method(cancel)
    retry = Method(retry)
    resolve = Method(resolve)
    prune = Method(prune)
    pause = Method(pause)
    resume = Method(resume)
    configure_queue = Method(configure_queue)
    set_tenant_weight = Method(set_tenant_weight)
    schedule = Method(schedule)
    unschedule = Method(unschedule)
    schedules = Method(schedules)
    stats = Method(stats)
    metrics = Method(metrics)
    health = Method(health)
    list_jobs = Method(list_jobs)
    queue_status = Method(queue_status)
    get_job = Method(get_job)
    job_history = Method(job_history)
    version = Method(version)


#: Every call: each client has one method of each name.
ALL: tuple[Method[..., Any], ...] = tuple(m for m in vars(PgqCalls).values() if isinstance(m, Method))
