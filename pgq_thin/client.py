"""The client: one method per pgq SQL function, over a psycopg_pool.ConnectionPool.

Every method sends exactly one statement from pgq_thin.queries and returns what the function
returned, typed. Producers can pass ``conn=`` to enqueue inside their own transaction, so the job
is written atomically with their business data.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any, TypeVar

import psycopg
from psycopg.rows import RowFactory, args_row, dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from pgq_thin import queries
from pgq_thin.errors import InvalidArgument, PgqError, translate
from pgq_thin.migrate import warn_if_schema_is_old
from pgq_thin.models import (
    HealthFinding,
    Job,
    JobEvent,
    JobRecord,
    QueueSettings,
    QueueStats,
    TenantSettings,
)

__all__ = ["Client", "resolve_dsn"]

log = logging.getLogger("pgq_thin.client")

T = TypeVar("T")

#: An interval argument: a timedelta, or a number of seconds.
Interval = timedelta | float | int


def resolve_dsn(dsn: str | None = None) -> str:
    """The database to use: the argument, else $PGQ_DSN, else $DATABASE_URL."""
    found = dsn or os.environ.get("PGQ_DSN") or os.environ.get("DATABASE_URL")
    if not found:
        raise PgqError("no database given: pass a DSN (--dsn) or set PGQ_DSN or DATABASE_URL")
    return found


def _interval(value: Interval | None) -> timedelta | None:
    if value is None or isinstance(value, timedelta):
        return value
    return timedelta(seconds=float(value))


def _record(cls: type[T], row: dict[str, Any]) -> T:
    """A dataclass from a row, ignoring columns it does not know (added by later migrations)."""
    fields = cls.__dataclass_fields__  # type: ignore[attr-defined]
    return cls(**{k: v for k, v in row.items() if k in fields})


def _settings(row: dict[str, Any]) -> QueueSettings:
    return _record(QueueSettings, row)


class Client:
    """A pgq client. Thread-safe: each call borrows a pooled connection (or uses ``conn=``)."""

    def __init__(
        self,
        dsn: str | None = None,
        *,
        pool: ConnectionPool | None = None,
        min_size: int = 1,
        max_size: int = 8,
        prepare: bool = True,
        pooled: bool = False,
    ) -> None:
        """Connect to ``dsn`` (or $PGQ_DSN / $DATABASE_URL), or use an existing ``pool`` whose
        connections are in autocommit mode. ``prepare=False`` turns server-side prepared
        statements off.

        ``pooled=True`` is the switch for a transaction-pooling proxy (PgBouncer with
        ``pool_mode = transaction``, where consecutive transactions of one connection may run on
        different server connections): no server-side prepared statements (psycopg's
        prepare_threshold=None as well), and no session state (the client sets none anyway: every
        call is one autocommit statement). Without it, such a proxy fails with a prepared-statement
        error, raised as a PgqError that names this switch."""
        self.pooled = pooled
        self._prepare = prepare and not pooled
        if pool is not None:
            self.pool = pool
            self._owns_pool = False
            self.dsn = pool.conninfo
        else:
            self.dsn = resolve_dsn(dsn)
            self.pool = ConnectionPool(
                self.dsn,
                min_size=min_size,
                max_size=max_size,
                kwargs={"autocommit": True, **({"prepare_threshold": None} if pooled else {})},
                name="pgq_thin",
                open=True,
            )
            self._owns_pool = True

    def close(self) -> None:
        if self._owns_pool:
            self.pool.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # The one place a statement is sent ----------------------------------------------------------

    @contextmanager
    def _cursor(self, conn: psycopg.Connection | None) -> Iterator[psycopg.Cursor[Any]]:
        try:
            if conn is not None:
                yield conn.cursor()
            else:
                with self.pool.connection() as pooled:
                    warn_if_schema_is_old(pooled)  # once per database and process
                    yield pooled.cursor()
        except psycopg.Error as exc:
            raise translate(exc) from exc
        except TypeError as exc:  # a payload or result that json cannot serialise
            raise InvalidArgument(f"cannot send the arguments: {exc}") from exc

    def _rows(self, query: str, params: dict[str, Any], conn: psycopg.Connection | None = None,
              *, rows: RowFactory[Any] | None = None) -> list[Any]:
        """The rows of ``query``: tuples, or what ``rows`` (a psycopg row factory) makes of them."""
        with self._cursor(conn) as cur:
            if rows is not None:
                cur.row_factory = rows
            cur.execute(query, params, prepare=self._prepare)
            return cur.fetchall()

    def _value(self, query: str, params: dict[str, Any], conn: psycopg.Connection | None = None) -> Any:
        rows = self._rows(query, params, conn)
        return rows[0][0]

    # Producers ----------------------------------------------------------------------------------

    def enqueue(
        self,
        queue: str,
        kind: str,
        payload: dict[str, Any] | None = None,
        *,
        run_at: datetime | None = None,
        priority: int = 0,
        max_attempts: int | None = None,
        unique_key: str | None = None,
        tenant: str | None = None,
        conn: psycopg.Connection | None = None,
    ) -> int:
        """pgq.enqueue: add one job, now or at ``run_at``; returns its id. With ``conn``, the job
        is part of that connection's current transaction."""
        job_id: int = self._value(queries.ENQUEUE, {
            "queue": queue, "kind": kind, "payload": Jsonb({} if payload is None else payload),
            "run_at": run_at, "priority": priority, "max_attempts": max_attempts,
            "unique_key": unique_key, "tenant": tenant,
        }, conn)
        log.debug("enqueued", extra={"job_id": job_id, "queue": queue, "kind": kind})
        return job_id

    def enqueue_many(
        self,
        queue: str,
        kind: str,
        payloads: Sequence[dict[str, Any]],
        *,
        run_at: datetime | None = None,
        priority: int = 0,
        max_attempts: int | None = None,
        tenant: str | None = None,
        conn: psycopg.Connection | None = None,
    ) -> list[int]:
        """pgq.enqueue_many: add one job per payload in one statement; ids in payload order."""
        rows = self._rows(queries.ENQUEUE_MANY, {
            "queue": queue, "kind": kind, "payloads": [Jsonb(p) for p in payloads],
            "run_at": run_at, "priority": priority, "max_attempts": max_attempts, "tenant": tenant,
        }, conn)
        return [r[0] for r in rows]

    # Workers ------------------------------------------------------------------------------------

    def claim(self, worker: str, queues: Sequence[str] | None = None, batch: int = 1,
              lease: Interval | None = None) -> list[Job]:
        """pgq.claim: up to ``batch`` due jobs of ``queues`` (None: all), each with its attempt."""
        # queries.CLAIM returns Job's fields in order: each row is built straight into a Job.
        return self._rows(queries.CLAIM, {
            "worker": worker, "queues": list(queues) if queues is not None else None,
            "batch": batch, "lease": _interval(lease),
        }, rows=args_row(Job))

    def renew(self, job_id: int, attempt: int, lease: Interval | None = None) -> datetime | None:
        """pgq.renew: the new lease_until, or None when the job is no longer ours."""
        return self._value(queries.RENEW, {"id": job_id, "attempt": attempt, "lease": _interval(lease)})  # type: ignore[no-any-return]

    def complete(self, job_id: int, attempt: int, result: Any = None) -> bool:
        """pgq.complete: True when our attempt is (or already was) done; False when not ours."""
        return bool(self._value(queries.COMPLETE, {
            "id": job_id, "attempt": attempt, "result": None if result is None else Jsonb(result),
        }))

    def complete_many(self, job_ids: Sequence[int], attempts: Sequence[int]) -> list[int]:
        """pgq.complete_many: the ids of the (id, attempt) pairs completed."""
        rows = self._rows(queries.COMPLETE_MANY, {"ids": list(job_ids), "attempts": list(attempts)})
        return [r[0] for r in rows]

    def fail(self, job_id: int, attempt: int, error: str, retry_in: Interval | None = None,
             retryable: bool = True) -> str | None:
        """pgq.fail: the new state ('pending' to retry, or 'failed'); None when not ours."""
        return self._value(queries.FAIL, {  # type: ignore[no-any-return]
            "id": job_id, "attempt": attempt, "error": error,
            "retry_in": _interval(retry_in), "retryable": retryable,
        })

    def release(self, job_id: int, attempt: int) -> bool:
        """pgq.release: give an unstarted job back without using up an attempt."""
        return bool(self._value(queries.RELEASE, {"id": job_id, "attempt": attempt}))

    def snooze(self, job_id: int, attempt: int, delay: Interval) -> datetime | None:
        """pgq.snooze: pending again after ``delay``; the new run_at, or None when not ours."""
        return self._value(queries.SNOOZE, {"id": job_id, "attempt": attempt, "delay": _interval(delay)})  # type: ignore[no-any-return]

    def mark_unknown(self, job_id: int, attempt: int, note: str) -> bool:
        """pgq.mark_unknown: park our attempt as outcome_unknown (do not retry blindly)."""
        return bool(self._value(queries.MARK_UNKNOWN, {"id": job_id, "attempt": attempt, "note": note}))

    def sweep(self, max_jobs: int = 1000) -> int:
        """pgq.sweep: recover jobs whose lease expired; returns how many."""
        return int(self._value(queries.SWEEP, {"max_jobs": max_jobs}))

    # Admin --------------------------------------------------------------------------------------

    def cancel(self, job_id: int) -> bool:
        """pgq.cancel: True when cancelled now, False when it had already finished."""
        return bool(self._value(queries.CANCEL, {"id": job_id}))

    def retry(self, job_id: int) -> bool:
        """pgq.retry: a failed or cancelled job becomes pending again."""
        return bool(self._value(queries.RETRY, {"id": job_id}))

    def resolve(self, job_id: int, state: str) -> bool:
        """pgq.resolve: settle an outcome_unknown job as done, failed, cancelled or pending."""
        return bool(self._value(queries.RESOLVE, {"id": job_id, "state": state}))

    def prune(self, older_than: Interval | None = None, max_jobs: int = 10000) -> int:
        """pgq.prune: delete up to max_jobs finished jobs; returns how many."""
        return int(self._value(queries.PRUNE, {"older_than": _interval(older_than), "max_jobs": max_jobs}))

    def pause(self, queue: str) -> QueueSettings:
        """pgq.pause: workers stop claiming from the queue."""
        return _settings(self._rows(queries.PAUSE, {"queue": queue}, rows=dict_row)[0])

    def resume(self, queue: str) -> QueueSettings:
        """pgq.resume: workers claim from the queue again."""
        return _settings(self._rows(queries.RESUME, {"queue": queue}, rows=dict_row)[0])

    def configure_queue(
        self,
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
    ) -> QueueSettings:
        """pgq.configure_queue: change the given settings (None leaves one unchanged)."""
        row = self._rows(queries.CONFIGURE_QUEUE, {
            "queue": queue, "lease": _interval(lease), "max_attempts": max_attempts,
            "backoff_base": _interval(backoff_base), "backoff_cap": _interval(backoff_cap),
            "retention": _interval(retention), "notify": notify, "audit": audit,
            "fair": fair, "max_running": max_running,
        }, rows=dict_row)[0]
        return _settings(row)

    def set_tenant_weight(self, queue: str, tenant: str, weight: int) -> TenantSettings:
        """pgq.set_tenant_weight: a tenant of a fair queue gets `weight` turns per round."""
        row = self._rows(queries.SET_TENANT_WEIGHT, {"queue": queue, "tenant": tenant, "weight": weight},
                         rows=dict_row)[0]
        return _record(TenantSettings, row)

    # Observe ------------------------------------------------------------------------------------

    def stats(self) -> list[QueueStats]:
        """pgq.stats: one row per queue."""
        return [QueueStats(**r) for r in self._rows(queries.STATS, {}, rows=dict_row)]

    def health(self, max_snapshot_age: Interval = timedelta(minutes=5),
               max_ready_age: Interval = timedelta(minutes=5)) -> list[HealthFinding]:
        """pgq.health: one finding per check (severity ok, warning or critical)."""
        return [HealthFinding(**r) for r in self._rows(queries.HEALTH, {
            "max_snapshot_age": _interval(max_snapshot_age), "max_ready_age": _interval(max_ready_age),
        }, rows=dict_row)]

    def get_job(self, job_id: int) -> JobRecord:
        """pgq.get_job: the whole job row; JobNotFound when there is no such job."""
        return _record(JobRecord, self._rows(queries.GET_JOB, {"id": job_id}, rows=dict_row)[0])

    def job_history(self, job_id: int) -> list[JobEvent]:
        """pgq.job_history: the job's claims, transitions and rejected stale writes, oldest first."""
        return [JobEvent(**r) for r in self._rows(queries.JOB_HISTORY, {"id": job_id}, rows=dict_row)]

    def version(self) -> str:
        """pgq.version: the installed schema's version."""
        return str(self._value(queries.VERSION, {}))
