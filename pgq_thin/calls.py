"""One function per pgq SQL function: its arguments, its statement (from pgq_thin.queries) and how
its rows become the typed result (pgq_thin.models). Each returns a ``Call``; ``PgqCalls`` turns
each into a method of the same name, which Client sends over a pooled connection and AsyncClient
over an async one: the description of a call exists once. Nothing here talks to the database."""

from __future__ import annotations

import inspect
import json
import json.scanner
import logging
import re
from collections.abc import Callable, Coroutine, Generator, Sequence
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from typing import Any, Generic, ParamSpec, Protocol, TypeVar, get_args, overload

import psycopg
from psycopg.adapt import AdaptersMap, Buffer
from psycopg.rows import RowFactory, dict_row
from psycopg.types.json import Jsonb, JsonbBinaryLoader, JsonbLoader

from pgq_thin import encryption, queries, tracecontext
from pgq_thin.durations import Interval, to_timedelta
from pgq_thin.errors import BadArgument, BadArgumentType, JobNotFound
from pgq_thin.models import (
    BatchStatus,
    CompletedAndClaimed,
    DependencyResult,
    HealthFinding,
    Job,
    JobEvent,
    JobLink,
    JobOutcome,
    JobRecord,
    JobResult,
    Privileges,
    QueueGrant,
    QueueKind,
    QueueLimits,
    QueueMetrics,
    QueueSettings,
    QueueStats,
    QueueStatus,
    Schedule,
    SignalAnswer,
    SleepAnswer,
    StepLookup,
    StepRecord,
    TenantSettings,
    UnreadableJson,
    WorkerEntry,
    record,
)

__all__ = ["ALL", "READING", "Call", "Interval", "Method", "PgqCalls", "bulk_plan"]

log = logging.getLogger("pgq_thin.client")

T = TypeVar("T")
P = ParamSpec("P")


#: The caller's own connection, to enqueue inside its transaction (a Connection for Client, an
#: AsyncConnection for AsyncClient).
CallerConnection = psycopg.Connection[Any] | psycopg.AsyncConnection[Any]


@dataclass(frozen=True)
class Call(Generic[T]):
    """One statement to send: ``query`` with ``params``; ``rows`` the psycopg row factory (None:
    tuples); ``read`` makes the result of the rows; ``conn`` the caller's connection, if any.
    Making one checks its parameters (check_params): bad input never reaches psycopg."""

    query: str
    params: dict[str, Any]
    read: Callable[[list[Any]], T]
    rows: RowFactory[Any] | None = None
    conn: CallerConnection | None = None

    def __post_init__(self) -> None:
        check_params(self.params)


# Turning arguments into parameters, checked ------------------------------------------------------
# The server checks what its functions mean (a name's characters, a lease's range) and answers
# with a documented SQLSTATE. What is checked here is only what cannot reach it as the caller
# meant: a text psycopg cannot encode, an integer no SQL integer holds, a number of seconds no
# interval holds, a payload JSON cannot carry, a value of the wrong type that PostgreSQL would
# silently cast (1.5 as a priority) or psycopg would send as something else (a str as a list).
# Each is a BadArgument (SQLSTATE 22023; BadArgumentType, also a TypeError, for a wrong type)
# naming the argument, raised before anything is sent.

#: The parameters named differently in Python (the SQL function's argument is ``id``).
_PYTHON_NAMES = {"id": "job_id", "ids": "job_ids"}

#: What each parameter must be, when given (None is left to the server: some are required).
#: A parameter not listed gets the checks of its value's type only.
_WANT: dict[str, type] = {
    **dict.fromkeys(("queue", "kind", "worker", "unique_key", "tenant", "error", "note", "state", "name", "cron",
                     "timezone", "role", "privilege", "concurrency_key", "key", "dependency_mode",
                     "callback_queue", "callback_kind", "run_when", "on_conflict", "after_name", "host",
                     "key_sequence"), str),
    **dict.fromkeys(("priority", "max_attempts", "batch", "id", "attempt", "max_jobs", "max_running", "weight",
                     "limit_rows", "before_id", "key_max_running", "rate_limit", "key_rate_limit", "batch_id",
                     "after_id", "running", "pid"), int),
    **dict.fromkeys(("retryable", "notify", "audit", "fair", "skip_if_running", "enabled", "notify_finished",
                     "stopping", "keep_done", "archive"), bool),
    **dict.fromkeys(("finished_before", "created_before", "start_by", "before"), datetime),
}

_INT8 = 2 ** 63
#: A JSON NUL escape (\u0000, not an escaped backslash before "u0000"): jsonb refuses it.
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def _refused(name: str, message: str, type_error: bool = False) -> BadArgument:
    base, bracket, index = name.partition("[")
    shown = _PYTHON_NAMES.get(base, base) + bracket + index  # ids[2] is job_ids[2]
    return (BadArgumentType if type_error else BadArgument)(f'argument "{shown}" {message}', "22023")


def _type_name(value: Any) -> str:
    return type(value).__name__


def _shown(number: float) -> str:
    """A number, short (an int of 4000 digits is shown by its size)."""
    text = repr(number)
    return text if len(text) <= 24 else f"{text[:12]}... ({len(text)} digits)"


def _check_text(name: str, value: str) -> None:
    if not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError as exc:
            raise _refused(name, f"cannot be sent: character {exc.start} is {value[exc.start]!r}, "
                           "a lone surrogate (not text; undecodable bytes?)") from None
    if "\x00" in value:
        raise _refused(name, f"cannot be sent: character {value.index(chr(0))} is NUL, which PostgreSQL "
                       "text cannot hold")


def _check_int(name: str, value: int) -> None:
    if not -_INT8 <= value < _INT8:
        raise _refused(name, f"is out of range: {_shown(value)} (a SQL integer is from -2^63 to 2^63-1)")


def _check_value(name: str, value: Any) -> None:
    """The checks of ``value``'s type (for a list: of each element)."""
    cls = type(value)
    if cls is str:
        _check_text(name, value)
    elif cls is int:
        _check_int(name, value)
    elif cls is list:
        for n, element in enumerate(value, 1):
            if element is not None:
                _check_value(f"{name}[{n}]", element)


def check_params(params: dict[str, Any]) -> None:
    """Raise BadArgument for the first parameter that cannot be sent as its call means it."""
    for name, value in params.items():
        if value is None:
            continue
        cls = type(value)
        want = _WANT.get(name)
        if want is not None and cls is not want and (cls is bool or not isinstance(value, want)):
            raise _refused(name, f"must be {'an' if want is int else 'a'} {want.__name__}, got {cls.__name__}",
                           type_error=True)
        _check_value(name, value)


def _interval(name: str, value: Interval | None) -> timedelta | None:
    """A timedelta, a number of seconds (finite, within what a timedelta holds) or a duration with
    its unit (``"30s"``, ``"1h 30m"``: pgq_thin.durations) as an interval."""
    if value is None or isinstance(value, timedelta):
        return value
    try:
        return to_timedelta(value)
    except TypeError as exc:
        raise _refused(name, str(exc), type_error=True) from None
    except ValueError as exc:
        raise _refused(name, str(exc)) from None


def seconds(name: str, value: Interval, *, positive: bool = False) -> float:
    """An interval argument of the client itself (not a SQL function's: wait's timeout) as a number
    of seconds, 0 or more (``positive``: more than 0); a BadArgument naming it otherwise."""
    interval = _interval(name, value)
    if interval is None:
        raise _refused(name, "must be a timedelta, a number of seconds or a duration such as '30s', got None",
                       type_error=True)
    total = interval.total_seconds()
    if total < 0 or (positive and total == 0):
        raise _refused(name, f"must be {'more than 0' if positive else '0 or more'} seconds, got {_shown(total)}")
    return total


def _listed(name: str, value: Any, what: str) -> list[Any]:
    """``value`` as a list (a str, bytes or a dict is not a list of anything here)."""
    if not isinstance(value, (str, bytes, dict)):
        try:
            return list(value)
        except TypeError:
            pass
    shown = f" {value!r:.40} (one name: [{value!r:.40}])" if isinstance(value, str) and what == "names" else ""
    raise _refused(name, f"must be a list of {what}, got {_type_name(value)}{shown}", type_error=True)


def _names(name: str, value: Sequence[str] | None) -> list[str] | None:
    """A list of names (a str alone would be split into its characters)."""
    if value is None:
        return None
    names = _listed(name, value, "names")
    for n, element in enumerate(names, 1):
        if not isinstance(element, str):
            raise _refused(f"{name}[{n}]", f"must be a str, got {_type_name(element)}", type_error=True)
    return names


def _keys(name: str, value: Sequence[str | None] | None) -> list[str | None] | None:
    """A list of names, each a str or None (enqueue_many's unique_keys: None for a payload without)."""
    if value is None:
        return None
    keys = _listed(name, value, "names")
    for n, element in enumerate(keys, 1):
        if element is not None and not isinstance(element, str):
            raise _refused(f"{name}[{n}]", f"must be a str or None, got {_type_name(element)}", type_error=True)
    return keys


def _ints(name: str, value: Sequence[int] | None) -> list[int] | None:
    if value is None:
        return None
    numbers = _listed(name, value, "ints")
    for n, element in enumerate(numbers, 1):
        if not isinstance(element, int) or isinstance(element, bool):
            raise _refused(f"{name}[{n}]", f"must be an int, got {_type_name(element)}", type_error=True)
    return numbers


def _int_array(name: str, value: Sequence[int] | None) -> str | None:
    """_ints(), checked as check_params would check the list, and sent as one array literal (the
    statement casts it): a worker's complete_many of a claim's jobs checks and writes its ids and
    attempts in a few C loops, not in Python calls per element (about 2 us a job)."""
    if value is None:
        return None
    numbers = _listed(name, value, "ints")
    if not all(type(n) is int for n in numbers) or (numbers and not (-_INT8 <= min(numbers) and max(numbers) < _INT8)):
        _check_value(name, _ints(name, numbers))  # (the element that is wrong, named as before)
        numbers = [int(n) for n in numbers]  # an int subclass (an IntEnum, say) as the int it is
    return "{" + ",".join(map(str, numbers)) + "}"


#: json.dumps with keyword arguments makes an encoder per call: one, made once.
_JSON = json.JSONEncoder(ensure_ascii=False, allow_nan=False)


def _as_is(data: Any) -> Any:
    return data


def _json(name: str, value: Any) -> Jsonb:
    """``value`` as jsonb, serialised here, once (psycopg sends the bytes as they are): a value
    JSON cannot carry (NaN, infinity, an object of another type, nesting deeper than Python's
    recursion limit) or jsonb cannot store (a NUL character, a lone surrogate) is refused."""
    try:
        text = _JSON.encode(value)
    except RecursionError:
        raise _refused(name, "is nested too deeply to be sent as JSON") from None
    except (TypeError, ValueError) as exc:  # an unserialisable object; NaN / infinity; a huge int
        raise _refused(name, f"cannot be sent as JSON: {exc}") from None
    if "\\u0000" in text and _JSON_NUL.search(text):
        raise _refused(name, "holds a NUL character (\\u0000), which jsonb cannot store")
    try:
        data = text.encode()
    except UnicodeEncodeError as exc:
        raise _refused(name, f"holds a lone surrogate ({text[exc.start]!r}), which is not text") from None
    return Jsonb(data, dumps=_as_is)


def _jsons(name: str, values: Sequence[Any] | None) -> list[Jsonb] | None:
    if values is None:
        return None
    return [_json(f"{name}[{n}]", value) for n, value in enumerate(_listed(name, values, "JSON objects"), 1)]


# Reading results --------------------------------------------------------------------------------
# A jsonb value nested deeper than Python's recursion limit would make reading its whole row raise
# RecursionError: a job enqueued so from another language would stop every Python worker that
# claims it, again after each lease. Such a value is read as an UnreadableJson instead.

#: The json module's own scanner (C), which json.loads ends in: called on the text at once, it
#: spares json.loads' five Python calls per value (detecting the bytes' encoding, decoding them, the
#: decoder's whitespace checks), about 2.5 us of a claimed job's 20 (a payload per job). The server
#: sends a jsonb value as JSON text without surrounding whitespace; anything else (which it never
#: sends) goes to json.loads, which reads or refuses it as before.
_SCAN: Callable[[str, int], tuple[Any, int]] = json.scanner.make_scanner(
    json.JSONDecoder())  # type: ignore[arg-type]  # (typeshed types its argument as a scanner; it is the decoder)


class _Jsonb(JsonbLoader):
    def load(self, data: Buffer) -> Any:
        try:
            if self.loads is json.loads:  # (psycopg's set_json_loads may have put another one there)
                text = str(data, "utf-8")
                try:
                    value, end = _SCAN(text, 0)
                except StopIteration:
                    end = -1
                if end == len(text):
                    return value
            return super().load(data)
        except RecursionError:
            return UnreadableJson(bytes(data))


class _JsonbBinary(JsonbBinaryLoader):
    def load(self, data: Buffer) -> Any:
        try:
            return super().load(data)
        except RecursionError:
            return UnreadableJson(bytes(data)[1:])


#: The adapters of the connections pgq_thin opens (``context=`` of psycopg's connect): psycopg's,
#: with jsonb read as above.
READING = AdaptersMap(psycopg.adapters)
READING.register_loader("jsonb", _Jsonb)
READING.register_loader("jsonb", _JsonbBinary)


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


def _meta(meta: Any, trace_context: Any) -> Jsonb | None:
    """enqueue's meta as jsonb (None stays NULL), with the caller's trace context when asked."""
    if type(trace_context) is not bool:
        raise _refused("trace_context", f"must be a bool, got {_type_name(trace_context)}", type_error=True)
    if trace_context:
        meta = tracecontext.inject(meta)
    return None if meta is None else _json("meta", meta)


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
    meta: dict[str, Any] | None = None,
    trace_context: bool = True,
    concurrency_key: str | None = None,
    depends_on: Sequence[int] | None = None,
    dependency_mode: str = "all_done",
    batch: int | None = None,
    notify_finished: bool = False,
    on_conflict: str = "keep",
    start_by: datetime | None = None,
    max_lifetime: Interval | None = None,
    tags: Sequence[str] | None = None,
    unique_for: Interval | None = None,
    conn: CallerConnection | None = None,
) -> Call[int]:
    """pgq.enqueue: add one job, now or at ``run_at``; returns its id. With ``conn``, the job
    is part of that connection's current transaction. ``max_run_time`` caps each attempt
    (default: the queue's). ``meta``: a JSON object kept with the job and handed to each attempt
    (``Job.meta``); with opentelemetry-api and a current span, the span's W3C trace context is
    added under ``meta["otel"]`` (unless ``trace_context=False`` or meta has an "otel" key);
    ``concurrency_key`` puts the job under the queue's per-key limit; ``depends_on`` (job ids)
    makes it wait (state ``waiting``): with ``dependency_mode="all_done"`` until those jobs are
    done (cancelled if one of them fails or is cancelled), with ``"all_ended"`` until each has
    ended, whatever the mix (its handler reads how with ``JobContext.dependency_results()``).
    ``batch``: a member of that open batch (batch_open). ``notify_finished``: its end is notified
    on the channel pgq_finished, so that ``wait`` returns at once. ``on_conflict``, when a live job
    of the queue holds ``unique_key``: ``"keep"`` answers that job's id and writes nothing;
    ``"replace"`` gives that job, if it has not started (pending, scheduled or waiting), this
    call's payload, run_at, priority, meta and max_attempts and answers its id, and enqueues a new
    job (run after it) if it is running. Debounce: ``on_conflict="replace"``,
    ``run_at=now + delay``. ``start_by``: a job not claimed by then is cancelled, never handed out;
    ``max_lifetime``: one still alive that long after its enqueue (across attempts, sleeps and
    waits) fails. ``tags``: up to 16 tags (1 to 64 characters each) that the ``tags`` filters of
    list_jobs, retry_jobs, cancel_jobs and delete_jobs find. ``unique_for`` (with ``unique_key``):
    a job of the key that ended done within that span of now also holds the key (its id is the
    answer, nothing is enqueued); failed and cancelled jobs never do."""

    def read(rows: list[Any]) -> int:
        job_id = int(rows[0][0])
        log.debug("enqueued", extra={"job_id": job_id, "queue": queue, "kind": kind})
        return job_id

    return Call(queries.ENQUEUE, {
        "queue": queue, "kind": kind, "payload": _json("payload", {} if payload is None else payload),
        "run_at": run_at, "priority": priority, "max_attempts": max_attempts,
        "unique_key": unique_key, "tenant": tenant, "max_run_time": _interval("max_run_time", max_run_time),
        "meta": _meta(meta, trace_context),
        "concurrency_key": concurrency_key, "depends_on": _ints("depends_on", depends_on),
        "dependency_mode": dependency_mode, "batch": batch, "notify_finished": notify_finished,
        "on_conflict": on_conflict, "start_by": start_by, "max_lifetime": _interval("max_lifetime", max_lifetime),
        "tags": _names("tags", tags), "unique_for": _interval("unique_for", unique_for),
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
    meta: dict[str, Any] | None = None,
    trace_context: bool = True,
    concurrency_key: str | None = None,
    depends_on: Sequence[int] | None = None,
    dependency_mode: str = "all_done",
    batch: int | None = None,
    notify_finished: bool = False,
    unique_keys: Sequence[str | None] | None = None,
    on_conflict: str = "keep",
    tags: Sequence[str] | None = None,
    unique_for: Interval | None = None,
    conn: CallerConnection | None = None,
) -> Call[list[int]]:
    """pgq.enqueue_many: add one job per payload in one statement; ids in payload order. Every
    job gets the same ``meta`` (with the trace context, as enqueue's) and the same ``depends_on``,
    ``dependency_mode``, ``batch`` and ``notify_finished``. ``unique_keys``: one per payload (None
    for a payload without), each answered as enqueue's ``unique_key`` with ``on_conflict``; a key
    twice in one call, or a list not as long as ``payloads``, is refused (InvalidArgument).
    ``tags``: the same tags for every job; ``unique_for``: enqueue's, for each key."""
    return Call(queries.ENQUEUE_MANY, {
        "queue": queue, "kind": kind, "payloads": _jsons("payloads", payloads),
        "run_at": run_at, "priority": priority, "max_attempts": max_attempts, "tenant": tenant,
        "max_run_time": _interval("max_run_time", max_run_time), "meta": _meta(meta, trace_context),
        "concurrency_key": concurrency_key, "depends_on": _ints("depends_on", depends_on),
        "dependency_mode": dependency_mode, "batch": batch, "notify_finished": notify_finished,
        "unique_keys": _keys("unique_keys", unique_keys), "on_conflict": on_conflict,
        "tags": _names("tags", tags), "unique_for": _interval("unique_for", unique_for),
    }, _ids, conn=conn)


def update_job(job_id: int, *, payload: dict[str, Any] | None = None, priority: int | None = None,
               run_at: datetime | None = None, meta: dict[str, Any] | None = None) -> Call[bool]:
    """pgq.update_job: give a job that has not started (pending or waiting, and no claim holds it)
    this ``payload``, ``priority``, ``run_at`` and ``meta`` (None keeps the job's own; meta is
    replaced whole, without a trace context); True when changed, False when it had started or
    ended (never waits for a worker). For the login that enqueued it and for admins (JobNotFound
    for anyone else, as for an unknown id)."""
    return Call(queries.UPDATE_JOB, {
        "id": job_id, "payload": None if payload is None else _json("payload", payload), "priority": priority,
        "run_at": run_at, "meta": None if meta is None else _json("meta", meta),
    }, _flag)


# Batches and results ------------------------------------------------------------------------------


def _found(cls: type[T], what: str, key: int) -> Callable[[list[Any]], T]:
    """Reads the one row of a function that raises P0002 for an unknown id (a JobNotFound the
    same, should it answer no row instead)."""

    def read(rows: list[Any]) -> T:
        if not rows:
            raise JobNotFound(f"pgq: no {what} with id {key}", "P0002")
        return record(cls, rows[0])

    return read


def batch_open(callback_queue: str, callback_kind: str, callback_payload: dict[str, Any] | None = None,
               run_when: str = "all_ended", joiners: Sequence[str] | str | None = None) -> Call[int]:
    """pgq.batch_open: open a batch; returns its id. Add members with ``enqueue(..., batch=id)``
    (from any transaction of this login, or of a member of a role named in ``joiners``, one name or
    several: a member's handler's login, say) and seal it with ``batch_close``; then, once every member has ended
    (``run_when="all_ended"``), or is done (``"all_done"``: otherwise the callback is enqueued
    cancelled), one callback job of ``callback_kind`` is enqueued into ``callback_queue`` with
    ``callback_payload``, its meta ``{"batch": {"id", "members", "done", "failed", "cancelled"}}``."""
    return Call(queries.BATCH_OPEN, {
        "callback_queue": callback_queue, "callback_kind": callback_kind,
        "callback_payload": _json("callback_payload", {} if callback_payload is None else callback_payload),
        "run_when": run_when,
        "joiners": [joiners] if isinstance(joiners, str) else _names("joiners", joiners),
    }, _count)


def batch_close(batch_id: int) -> Call[bool]:
    """pgq.batch_close: seal the batch (no members added after); True when sealed by this call,
    False when it already was. An empty batch's callback is enqueued at once."""
    return Call(queries.BATCH_CLOSE, {"batch_id": batch_id}, _flag)


def batch_status(batch_id: int) -> Call[BatchStatus]:
    """pgq.batch_status: the batch's state, its members counted by state and its callback job's id
    once enqueued (to its opener, pgq_monitor and pgq_admin; JobNotFound otherwise)."""
    return Call(queries.BATCH_STATUS, {"batch_id": batch_id}, _found(BatchStatus, "batch", batch_id), rows=dict_row)


def batch_jobs(batch_id: int, state: str | None = None, limit_rows: int = 50,
               before_id: int | None = None) -> Call[list[JobRecord]]:
    """pgq.batch_jobs: a batch's members newest first, of one ``state`` when given (to its opener,
    pgq_monitor and pgq_admin; JobNotFound otherwise); pass a page's last id as ``before_id`` for
    the next."""
    return Call(queries.BATCH_JOBS, {"batch_id": batch_id, "state": state, "limit_rows": limit_rows,
                                     "before_id": before_id},
                lambda rows: [record(JobRecord, r) for r in rows], rows=dict_row)


def cancel_batch(batch_id: int) -> Call[int]:
    """pgq.cancel_batch: seal the batch and cancel it: its members that have not started (returns
    how many it cancelled now; the sweep cancels the rest) and its callback."""
    return Call(queries.CANCEL_BATCH, {"batch_id": batch_id}, _count)


def job_result(job_id: int) -> Call[JobResult]:
    """pgq.job_result: the job's state and, once it has ended, its result, last error and end
    (to the login that enqueued it, pgq_admin and the roles that may read its queue; JobNotFound
    otherwise). ``wait`` waits for it to end."""
    return Call(queries.JOB_RESULT, {"id": job_id}, _found(JobResult, "job", job_id), rows=dict_row)


def dependency_results(job_id: int, attempt: int, limit_rows: int = 100,
                       after_id: int | None = None) -> Call[list[DependencyResult]]:
    """pgq.dependency_results: the dependencies of our running attempt's job (an owner operation:
    WrongState when it is not ours) and how each ended, by id: at most ``limit_rows`` of those
    after ``after_id``. A handler pages through them with ``JobContext.dependency_results()``."""
    return Call(queries.DEPENDENCY_RESULTS, {
        "id": job_id, "attempt": attempt, "limit_rows": limit_rows, "after_id": after_id,
    }, lambda rows: [DependencyResult(*r) for r in rows])


def job_links(job_id: int, limit_rows: int = 100) -> Call[list[JobLink]]:
    """pgq.job_links: the job's dependencies (relation 'dependency'), then its dependants
    ('dependant'), each by id and at most ``limit_rows`` of each, with their queue, kind and state."""
    return Call(queries.JOB_LINKS, {"id": job_id, "limit_rows": limit_rows},
                lambda rows: [JobLink(*r) for r in rows])


# Durable execution ----------------------------------------------------------------------------------
# The owner's calls answer "not yours" (a stale attempt, another login's) as the other owner calls
# do: None, False or nothing, never an exception.


def _one(make: Callable[[Any], T]) -> Callable[[list[Any]], T | None]:
    """Reads the one row of an owner call that answers no row when the attempt is not ours."""
    return lambda rows: make(rows[0]) if rows else None


def get_step(job_id: int, attempt: int, name: str) -> Call[StepLookup | None]:
    """pgq.get_step: whether step ``name`` of our running attempt's job is recorded, and its result
    (``StepLookup(False, None)`` while it is not); None when the attempt is not ours."""
    return Call(queries.GET_STEP, {"id": job_id, "attempt": attempt, "name": name},
                _one(lambda r: StepLookup(bool(r[0]), r[1])))


def get_steps(job_id: int, attempt: int, after_name: str | None = None,
              limit_rows: int = 1000) -> Call[dict[str, Any]]:
    """pgq.get_steps: the recorded steps of our running attempt's job, name -> result, in name order
    after ``after_name``, at most ``limit_rows`` (1 to 10000); empty when the attempt is not ours. A
    worker reads them once per attempt: each step then costs one call (its record) or none."""
    return Call(queries.GET_STEPS, {"id": job_id, "attempt": attempt, "after_name": after_name,
                                    "limit_rows": limit_rows}, lambda rows: {r[0]: r[1] for r in rows})


def record_step(job_id: int, attempt: int, name: str, result: Any,
                conn: CallerConnection | None = None) -> Call[bool]:
    """pgq.record_step: record step ``name`` of our running attempt with its ``result`` (any JSON
    value; the first record of a name wins, a later one keeps it: True); False when the attempt is
    not ours. With ``conn``, in that connection's transaction, with the step's own writes: call it
    last, then commit (roll back on False)."""
    return Call(queries.RECORD_STEP, {"id": job_id, "attempt": attempt, "name": name,
                                      "result": _json("result", result)}, _flag, conn=conn)


def sleep(job_id: int, attempt: int, name: str, delay: Interval) -> Call[SleepAnswer | None]:
    """pgq.sleep: a durable sleep. Step ``name`` records now + ``delay`` once; while that time is
    ahead, the attempt ends until then (``status`` "sleeping": return without completing), after it
    ``status`` is "awake". None when the attempt is not ours."""
    return Call(queries.SLEEP, {"id": job_id, "attempt": attempt, "name": name, "delay": _interval("delay", delay)},
                _one(lambda r: SleepAnswer(r[0], r[1])))


def await_signal(job_id: int, attempt: int, name: str, timeout: Interval | None = None) -> Call[SignalAnswer | None]:
    """pgq.await_signal: the signal ``name`` of our job's queue: "arrived" with its payload,
    "timed_out" once the wait passed ``timeout`` (None: no timeout), or "waiting": the job is parked
    until one of them (return without completing; it runs again from the top). None when the
    attempt is not ours."""
    return Call(queries.AWAIT_SIGNAL, {"id": job_id, "attempt": attempt, "name": name,
                                       "timeout": _interval("timeout", timeout)},
                _one(lambda r: SignalAnswer(r[0], r[1])))


def spawn(job_id: int, attempt: int, name: str, queue: str, kind: str,
          payload: dict[str, Any] | None = None) -> Call[int | None]:
    """pgq.spawn: enqueue the child ``name`` of our running attempt's job once (a later call returns
    the same id); it carries the workflow's root. None when the attempt is not ours."""
    return Call(queries.SPAWN, {"id": job_id, "attempt": attempt, "name": name, "queue": queue, "kind": kind,
                                "payload": _json("payload", {} if payload is None else payload)}, _value)


def await_jobs(job_id: int, attempt: int, job_ids: Sequence[int]) -> Call[str | None]:
    """pgq.await_jobs: "ended" when every one of ``job_ids`` has ended, else "waiting": our job is
    parked until they have (return without completing; ``job_outcomes`` reads how they ended once it
    runs again). None when the attempt is not ours."""
    return Call(queries.AWAIT_JOBS, {"id": job_id, "attempt": attempt, "ids": _ints("ids", job_ids)}, _value)


def job_outcomes(job_id: int, attempt: int, job_ids: Sequence[int]) -> Call[list[JobOutcome]]:
    """pgq.job_outcomes: how the jobs ``job_ids`` (1 to 1000) ended, by id, for our running attempt:
    its workflow's members and the jobs whose result our login may read (others: state None)."""
    return Call(queries.JOB_OUTCOMES, {"id": job_id, "attempt": attempt, "ids": _ints("ids", job_ids)},
                lambda rows: [JobOutcome(*r) for r in rows])


def signal(queue: str, name: str, payload: dict[str, Any] | None = None) -> Call[int]:
    """pgq.signal: send signal ``name`` to ``queue`` with ``payload`` (the first of a name wins, a
    later one changes nothing) and wake the queue's jobs waiting for it; returns how many it woke."""
    return Call(queries.SIGNAL, {"queue": queue, "name": name,
                                 "payload": _json("payload", {} if payload is None else payload)}, _count)


def job_steps(job_id: int, limit_rows: int = 1000, after_name: str | None = None) -> Call[list[StepRecord]]:
    """pgq.job_steps: the job's recorded steps, by name (to whoever may read its result; JobNotFound
    otherwise)."""
    return Call(queries.JOB_STEPS, {"id": job_id, "limit_rows": limit_rows, "after_name": after_name},
                lambda rows: [StepRecord(*r) for r in rows])


def cancel_workflow(job_id: int) -> Call[int]:
    """pgq.cancel_workflow: cancel the unfinished jobs of the workflow of ``job_id`` (its root and
    everything spawned under it), at most 10000 per call: call again until it returns 0."""
    return Call(queries.CANCEL_WORKFLOW, {"id": job_id}, _count)


# Workers ------------------------------------------------------------------------------------------


def claim(worker: str, queues: Sequence[str] | None = None, batch: int = 1,
          lease: Interval | None = None, kinds: Sequence[str] | None = None) -> Call[list[Job]]:
    """pgq.claim: up to ``batch`` due jobs of ``queues`` (None: all) and of ``kinds`` (None: any
    kind), each with its attempt."""
    # queries.CLAIM returns Job's fields in order: each row is built straight into a Job.
    return Call(queries.CLAIM, {
        "worker": worker, "queues": _names("queues", queues),
        "batch": batch, "lease": _interval("lease", lease), "kinds": _names("kinds", kinds),
    }, list, rows=_job_row)


#: Job's fields, in the order queries.CLAIM returns them.
_JOB_FIELDS = tuple(f.name for f in fields(Job))


def _job(values: Sequence[Any]) -> Job:
    """Job(*values), without the 14 calls of a frozen dataclass's __init__ (one object.__setattr__
    per field: about 1 us of a claimed job's 20). Job has no __post_init__ and no __slots__
    (tests/client/test_client_rows.py holds it to that)."""
    job: Job = object.__new__(Job)
    job.__dict__.update(zip(_JOB_FIELDS, values))
    return job


def _job_row(cursor: Any) -> Callable[[Sequence[Any]], Job]:
    """A psycopg row factory: each row a Job (_job)."""
    return _job


def queue_status(queues: Sequence[str]) -> Call[list[QueueStatus]]:
    """pgq.queue_status: whether each queue exists and is paused, in the order given."""
    return Call(queries.QUEUE_STATUS, {"queues": _names("queues", queues)},
                lambda rows: [QueueStatus(*r) for r in rows])


def worker_heartbeat(worker: str, queues: Sequence[str] | None = None, kinds: Sequence[str] | None = None,
                     running: int = 0, host: str | None = None, pid: int | None = None,
                     alive_for: Interval = timedelta(minutes=1), stopping: bool = False) -> Call[datetime | None]:
    """pgq.worker_heartbeat: announce or refresh ``worker`` (of this login) in the registry of live
    workers, alive for ``alive_for``; until when (None with ``stopping=True``, which removes it)."""
    return Call(queries.WORKER_HEARTBEAT, {
        "worker": worker, "queues": _names("queues", queues), "kinds": _names("kinds", kinds), "running": running,
        "host": host, "pid": pid, "alive_for": _interval("alive_for", alive_for), "stopping": stopping,
    }, _value)


def workers() -> Call[list[WorkerEntry]]:
    """pgq.workers: the live workers of the registry (every login's for pgq_monitor and pgq_admin,
    this login's otherwise)."""
    return Call(queries.WORKERS, {}, lambda rows: [WorkerEntry(*r) for r in rows])


def queue_kinds(queues: Sequence[str] | None = None) -> Call[list[QueueKind]]:
    """pgq.queue_kinds: the kinds of each queue's pending jobs (None: every queue this login may
    claim from and read), and whether a live worker of the registry claims each."""
    return Call(queries.QUEUE_KINDS, {"queues": _names("queues", queues)}, lambda rows: [QueueKind(*r) for r in rows])


def rate_limit_wait(queues: Sequence[str] | None = None) -> Call[dict[str, timedelta]]:
    """pgq.rate_limit_wait: each rate-limited queue of ``queues`` (None: all) and how long until its
    rate limits let a claim take a job they hold back now (0: they hold none back)."""
    return Call(queries.RATE_LIMIT_WAIT, {"queues": _names("queues", queues)},
                lambda rows: {r[0]: r[1] for r in rows})


def renew(job_id: int, attempt: int, lease: Interval | None = None) -> Call[datetime | None]:
    """pgq.renew: the new lease_until, or None when the job is no longer ours."""
    return Call(queries.RENEW, {"id": job_id, "attempt": attempt, "lease": _interval("lease", lease)}, _value)


def complete(job_id: int, attempt: int, result: Any = None) -> Call[bool]:
    """pgq.complete: True when our attempt is (or already was) done; False when not ours."""
    return Call(queries.COMPLETE, {
        "id": job_id, "attempt": attempt, "result": None if result is None else _json("result", result),
    }, _flag)


def complete_many(job_ids: Sequence[int], attempts: Sequence[int]) -> Call[list[int]]:
    """pgq.complete_many: the ids of the (id, attempt) pairs completed."""
    return Call(queries.COMPLETE_MANY,
                {"ids": _int_array("ids", job_ids), "attempts": _int_array("attempts", attempts)}, _ids)


def complete_and_claim(job_ids: Sequence[int], attempts: Sequence[int], worker: str,
                       queues: Sequence[str] | None = None, batch: int = 1, lease: Interval | None = None,
                       kinds: Sequence[str] | None = None) -> Call[CompletedAndClaimed]:
    """pgq.complete_and_claim: complete_many's pairs, then claim's jobs, in one transaction: the ids
    completed and the jobs claimed."""
    return Call(queries.COMPLETE_AND_CLAIM, {
        "ids": _int_array("ids", job_ids), "attempts": _int_array("attempts", attempts),
        "worker": worker, "queues": _names("queues", queues),
        "batch": batch, "lease": _interval("lease", lease), "kinds": _names("kinds", kinds),
    }, _completed_and_claimed)


def _completed_and_claimed(rows: list[Any]) -> CompletedAndClaimed:
    # Every row carries the completed ids; a row without a job (id NULL) says none was claimed.
    return CompletedAndClaimed(list(rows[0][0]) if rows else [], [_job(r[1:]) for r in rows if r[1] is not None])


def fail(job_id: int, attempt: int, error: str, retry_in: Interval | None = None,
         retryable: bool = True) -> Call[str | None]:
    """pgq.fail: the new state ('pending' to retry, or 'failed'); None when not ours."""
    return Call(queries.FAIL, {
        "id": job_id, "attempt": attempt, "error": error,
        "retry_in": _interval("retry_in", retry_in), "retryable": retryable,
    }, _value)


def release(job_id: int, attempt: int) -> Call[bool]:
    """pgq.release: give an unstarted job back without using up an attempt."""
    return Call(queries.RELEASE, {"id": job_id, "attempt": attempt}, _flag)


def snooze(job_id: int, attempt: int, delay: Interval) -> Call[datetime | None]:
    """pgq.snooze: pending again after ``delay``; the new run_at, or None when not ours."""
    return Call(queries.SNOOZE, {"id": job_id, "attempt": attempt, "delay": _interval("delay", delay)}, _value)


def mark_unknown(job_id: int, attempt: int, note: str) -> Call[bool]:
    """pgq.mark_unknown: park our attempt as outcome_unknown (do not retry blindly)."""
    return Call(queries.MARK_UNKNOWN, {"id": job_id, "attempt": attempt, "note": note}, _flag)


def progress(job_id: int, attempt: int, progress: dict[str, Any]) -> Call[bool]:
    """pgq.progress: store our attempt's checkpoint (the next attempt gets it as
    ``Job.progress``); False when the job is no longer ours."""
    return Call(queries.PROGRESS, {"id": job_id, "attempt": attempt, "progress": _json("progress", progress)}, _flag)


def sweep(max_jobs: int = 1000) -> Call[int]:
    """pgq.sweep: recover jobs whose lease expired or whose attempt timed out (returns how
    many), and fire due schedules."""
    return Call(queries.SWEEP, {"max_jobs": max_jobs}, _count)


def settle_dependencies(max_jobs: int = 100) -> Call[int]:
    """pgq.settle_dependencies: release (or cancel) the dependants whose enqueue overlapped their
    dependency's end, once both committed, and move up to ``max_jobs`` dependants of the backlog
    on, fairly among logins, never waiting; returns how many it moved on. A worker calls it every
    poll (about once a second): with nothing to do it is three index probes."""
    return Call(queries.SETTLE_DEPENDENCIES, {"max_jobs": max_jobs}, _count)


# Admin --------------------------------------------------------------------------------------------


def cancel(job_id: int) -> Call[bool]:
    """pgq.cancel: True when cancelled now, False when it had already finished."""
    return Call(queries.CANCEL, {"id": job_id}, _flag)


def retry(job_id: int) -> Call[bool]:
    """pgq.retry: a failed or cancelled job becomes pending again."""
    return Call(queries.RETRY, {"id": job_id}, _flag)


def retry_jobs(queue: str, state: str, kind: str | None = None, finished_before: datetime | None = None,
               limit_rows: int = 1000, tags: Sequence[str] | None = None) -> Call[int]:
    """pgq.retry_jobs: make at most ``limit_rows`` (1 to 10000) of the queue's jobs in ``state``
    (``"failed"`` or ``"cancelled"``), of ``kind`` (None: any) and finished before
    ``finished_before`` (None: whenever), pending again, oldest id first, as ``retry`` does each;
    returns how many. A job another transaction holds, or that ``retry`` would refuse (its
    unique_key held by a live job, no attempt left), is skipped. For all of them, call it again
    until it returns 0, with ``finished_before`` fixed (the time you began, say): a job retried
    that fails again meanwhile is then not retried twice (``pgq-thin retry --all`` does so).
    ``tags``: only the jobs holding all of them."""
    return Call(queries.RETRY_JOBS, {
        "queue": queue, "state": state, "kind": kind, "finished_before": finished_before, "limit_rows": limit_rows,
        "tags": _names("tags", tags),
    }, _count)


def cancel_jobs(queue: str, state: str, kind: str | None = None, created_before: datetime | None = None,
                limit_rows: int = 1000, tags: Sequence[str] | None = None) -> Call[int]:
    """pgq.cancel_jobs: cancel at most ``limit_rows`` (1 to 10000) of the queue's jobs in
    ``state`` (``"waiting"``, ``"pending"``, ``"running"`` or ``"outcome_unknown"``), of ``kind``
    (None: any) and created before ``created_before`` (None: whenever), oldest id first, as
    ``cancel`` does each (a running one's worker is told at once); returns how many. A job another
    transaction holds is skipped: for all of them, call it again until it returns 0. ``tags``: only
    the jobs holding all of them."""
    return Call(queries.CANCEL_JOBS, {
        "queue": queue, "state": state, "kind": kind, "created_before": created_before, "limit_rows": limit_rows,
        "tags": _names("tags", tags),
    }, _count)


def delete_jobs(queue: str, state: str, kind: str | None = None, before: datetime | None = None,
                limit_rows: int = 1000, tags: Sequence[str] | None = None) -> Call[int]:
    """pgq.delete_jobs: delete at most ``limit_rows`` (1 to 10000) of the queue's jobs in ``state``
    (``"pending"``, ``"waiting"``, ``"done"``, ``"failed"`` or ``"cancelled"``; never a running
    one), of ``kind`` (None: any) and created (pending, waiting) or finished (the others) before
    ``before`` (None: whenever), oldest id first; returns how many. A pending or waiting job is
    cancelled first, so its dependants and its batch see it end. A job another transaction holds is
    skipped: for all of them, call it again until it returns 0, with ``before`` fixed. ``tags``: only
    the jobs holding all of them."""
    return Call(queries.DELETE_JOBS, {
        "queue": queue, "state": state, "kind": kind, "before": before, "limit_rows": limit_rows,
        "tags": _names("tags", tags),
    }, _count)


def bulk_plan(most: int | None, per_call: int) -> Generator[int, int, int]:
    """Acting on many jobs by filter (retry_jobs, cancel_jobs) in calls of at most ``per_call`` rows,
    as a plan that a caller of either client drives: it yields the ``limit_rows`` of the next call
    and is sent how many jobs that call acted on, until a call acts on none or ``most`` jobs (None:
    no cap) are acted on; it returns the total. (A call may act on fewer than asked while more
    match: it skips a job another transaction holds, and retry one whose unique key is held or that
    has no attempt left; so only a call that acts on none ends it.) The rule is written here once;
    a synchronous caller sends ``client.retry_jobs(...)``'s answers, an asynchronous one awaits them."""
    total = 0
    while most is None or total < most:
        acted = yield per_call if most is None else min(per_call, most - total)
        if acted == 0:
            break
        total += acted
    return total


def resolve(job_id: int, state: str) -> Call[bool]:
    """pgq.resolve: settle an outcome_unknown job as done, failed, cancelled or pending."""
    return Call(queries.RESOLVE, {"id": job_id, "state": state}, _flag)


def prune(older_than: Interval | None = None, max_jobs: int = 10000) -> Call[int]:
    """pgq.prune: delete up to max_jobs finished jobs; returns how many."""
    return Call(queries.PRUNE, {"older_than": _interval("older_than", older_than), "max_jobs": max_jobs}, _count)


def pause(queue: str, kind: str | None = None) -> Call[QueueSettings]:
    """pgq.pause: workers stop claiming from the queue; with ``kind``, only jobs of that kind of it
    (the settings' ``paused_kinds``)."""
    return Call(queries.PAUSE, {"queue": queue, "kind": kind}, _settings, rows=dict_row)


def resume(queue: str, kind: str | None = None) -> Call[QueueSettings]:
    """pgq.resume: workers claim from the queue again; with ``kind``, that paused kind of it (a kind
    that is not paused: nothing changes)."""
    return Call(queries.RESUME, {"queue": queue, "kind": kind}, _settings, rows=dict_row)


def drop_queue(queue: str) -> Call[bool]:
    """pgq.drop_queue: remove a queue that has no jobs and no schedules (its settings, its tenants)."""
    return Call(queries.DROP_QUEUE, {"queue": queue}, _flag)


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
    key_max_running: int | None = None,
    rate_limit: int | None = None,
    rate_period: Interval | None = None,
    key_rate_limit: int | None = None,
    retention_failed: Interval | None = None,
    retention_cancelled: Interval | None = None,
    keep_done: bool | None = None,
    max_wait: Interval | None = None,
    key_sequence: str | None = None,
    archive: bool | None = None,
) -> Call[QueueSettings]:
    """pgq.configure_queue: change the given settings (None leaves one unchanged;
    ``max_run_time=0`` removes the limit; ``key_max_running=0`` the per-key limit; ``rate_limit``
    jobs per ``rate_period`` at most, and ``key_rate_limit`` per key, 0: no limit; ``retention``
    keeps finished jobs, ``retention_failed`` and ``retention_cancelled`` failed and cancelled ones
    for another time: never set, the queue's ``retention``; ``keep_done=False`` deletes a job as it
    completes, unless something reads it after its end: docs/sql-api.md; ``max_wait``: a due job that
    waited longer is claimed before any job of higher priority, 0 restores strict priority;
    ``key_sequence`` ``'halt'`` or ``'continue'``: the jobs of one concurrency_key run one at a time in
    the order they were enqueued, ``'off'`` ends it; ``archive=True``: the sweep moves finished
    jobs into pgq.archive, partitioned by day, whose days retention drops whole: docs/operations.md)."""
    return Call(queries.CONFIGURE_QUEUE, {
        "queue": queue, "lease": _interval("lease", lease), "max_attempts": max_attempts,
        "backoff_base": _interval("backoff_base", backoff_base), "backoff_cap": _interval("backoff_cap", backoff_cap),
        "retention": _interval("retention", retention), "notify": notify, "audit": audit,
        "fair": fair, "max_running": max_running, "max_run_time": _interval("max_run_time", max_run_time),
        "key_max_running": key_max_running, "rate_limit": rate_limit,
        "rate_period": _interval("rate_period", rate_period), "key_rate_limit": key_rate_limit,
        "retention_failed": _interval("retention_failed", retention_failed),
        "retention_cancelled": _interval("retention_cancelled", retention_cancelled),
        "keep_done": keep_done,
        "max_wait": _interval("max_wait", max_wait),
        "key_sequence": key_sequence,
        "archive": archive,
    }, _settings, rows=dict_row)


def set_tenant_weight(queue: str, tenant: str, weight: int) -> Call[TenantSettings]:
    """pgq.set_tenant_weight: a tenant of a fair queue gets `weight` turns per round."""
    return Call(queries.SET_TENANT_WEIGHT, {"queue": queue, "tenant": tenant, "weight": weight},
                lambda rows: record(TenantSettings, rows[0]), rows=dict_row)


def set_key_limit(queue: str, key: str, max_running: int | None) -> Call[int]:
    """pgq.set_key_limit: at most ``max_running`` jobs of this concurrency key running at once
    (0: no limit for it; None removes the override). Returns the limit now in effect (0: none)."""
    return Call(queries.SET_KEY_LIMIT, {"queue": queue, "key": key, "max_running": max_running},
                lambda rows: int(rows[0][0]))


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
        "name": name, "queue": queue, "kind": kind, "cron": cron, "every": _interval("every", every),
        "payload": _json("payload", {} if payload is None else payload), "timezone": timezone,
        "priority": priority, "max_attempts": max_attempts, "tenant": tenant,
        "skip_if_running": skip_if_running, "enabled": enabled,
    }, lambda rows: record(Schedule, rows[0]), rows=dict_row)


def unschedule(name: str) -> Call[bool]:
    """pgq.unschedule: delete the schedule (its jobs stay); False when there was none."""
    return Call(queries.UNSCHEDULE, {"name": name}, _flag)


def grant_queue(queue: str, role: str, privilege: str) -> Call[bool]:
    """pgq.grant_queue (admin): let members of ``role`` use ``privilege`` (enqueue, claim or read) on
    ``queue``. Once a queue has a grant of a privilege, only granted roles (and pgq_admin) have it.
    True when the grant is new."""
    return Call(queries.GRANT_QUEUE, {"queue": queue, "role": role, "privilege": privilege}, _flag)


def revoke_queue(queue: str, role: str, privilege: str) -> Call[bool]:
    """pgq.revoke_queue (admin): take a grant back; True when there was one. Without a grant of the
    privilege left, the queue is open for it again to every holder of the pgq role."""
    return Call(queries.REVOKE_QUEUE, {"queue": queue, "role": role, "privilege": privilege}, _flag)


def queue_grants(queue: str | None = None) -> Call[list[QueueGrant]]:
    """pgq.queue_grants: the per-queue grants of ``queue`` (None: of every queue)."""
    return Call(queries.QUEUE_GRANTS, {"queue": queue}, lambda rows: [record(QueueGrant, r) for r in rows],
                rows=dict_row)


def queue_settings(queue: str | None = None) -> Call[list[QueueSettings]]:
    """pgq.queue_settings: the settings of ``queue`` (None: of every queue, by name)."""
    return Call(queries.QUEUE_SETTINGS, {"queue": queue},
                lambda rows: [record(QueueSettings, r) for r in rows], rows=dict_row)


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


def queue_limits(queue: str | None = None) -> Call[list[QueueLimits]]:
    """pgq.queue_limits: every queue with a limit (or ``queue``): its limits and how many due jobs
    each holds back now, and when its next token is due."""
    return Call(queries.QUEUE_LIMITS, {"queue": queue}, lambda rows: [record(QueueLimits, r) for r in rows],
                rows=dict_row)


def health(max_snapshot_age: Interval = timedelta(minutes=5),
           max_ready_age: Interval = timedelta(minutes=5)) -> Call[list[HealthFinding]]:
    """pgq.health: one finding per check (severity ok, warning or critical)."""
    return Call(queries.HEALTH, {
        "max_snapshot_age": _interval("max_snapshot_age", max_snapshot_age),
        "max_ready_age": _interval("max_ready_age", max_ready_age),
    }, lambda rows: [HealthFinding(**r) for r in rows], rows=dict_row)


def list_jobs(queue: str | None = None, state: str | None = None, kind: str | None = None,
              limit_rows: int = 50, before_id: int | None = None,
              tags: Sequence[str] | None = None) -> Call[list[JobRecord]]:
    """pgq.list_jobs: jobs newest first, filtered (``tags``: the jobs holding all of them); pass a
    page's last id as ``before_id`` for the next."""
    return Call(queries.LIST_JOBS, {
        "queue": queue, "state": state, "kind": kind, "limit_rows": limit_rows, "before_id": before_id,
        "tags": _names("tags", tags),
    }, lambda rows: [record(JobRecord, r) for r in rows], rows=dict_row)


def get_job(job_id: int) -> Call[JobRecord]:
    """pgq.get_job: the whole job row; JobNotFound when there is no such job."""
    return Call(queries.GET_JOB, {"id": job_id}, lambda rows: record(JobRecord, rows[0]), rows=dict_row)


def job_history(job_id: int) -> Call[list[JobEvent]]:
    """pgq.job_history: the job's claims, transitions and rejected stale writes, oldest first."""
    return Call(queries.JOB_HISTORY, {"id": job_id}, lambda rows: [record(JobEvent, r) for r in rows], rows=dict_row)


def version() -> Call[str]:
    """pgq.version: the installed schema's version."""
    return Call(queries.VERSION, {}, lambda rows: str(rows[0][0]))


def privileges() -> Call[Privileges]:
    """Which of pgq's admin functions (retry, cancel, resolve, pause, resume, retry_jobs,
    cancel_jobs, delete_jobs) the current login may call, by the catalog (has_function_privilege): to show what
    it may do. Not a check before a call: the database refuses a call the login may not make
    (PermissionDenied, 42501)."""

    def read(rows: list[Any]) -> Privileges:
        row = rows[0]
        return Privileges(str(row["current_user"]), {name: row[name] for name in queries.ACTION_FUNCTIONS})

    return Call(queries.PRIVILEGES, {}, read, rows=dict_row)


def clock() -> Call[datetime]:
    """The database's clock now (clock_timestamp(), not the transaction's start): the clock of
    leases, and of the times retry_jobs and cancel_jobs compare (finished_before, created_before)."""
    return Call(queries.CLOCK, {}, _value)


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
    answers and an AsyncClient returns what to await.

    Its signature is the description's, with the annotations evaluated and the result as the
    client gives it (``Call[int]`` is ``-> int`` on Client, ``-> Coroutine[Any, Any, int]`` on
    AsyncClient), so that ``help(Client)`` and ``inspect.signature(client.enqueue)`` show what a
    call takes and returns. ``Client.name(client, ...)`` works as for any method."""

    def __init__(self, build: Callable[P, Call[T]], asynchronous: bool = False) -> None:
        self.build = build
        self.asynchronous = asynchronous
        self.__name__ = build.__name__
        self.__qualname__ = build.__name__
        self.__doc__ = build.__doc__
        self.__wrapped__ = build
        described = inspect.signature(build, eval_str=True)
        (result,) = get_args(described.return_annotation) or (Any,)
        returns = Coroutine[Any, Any, result] if asynchronous else result  # type: ignore[valid-type]
        #: The signature of a bound method (client.name): the description's, returning ``returns``.
        self.bound_signature = described.replace(return_annotation=returns)
        self.__signature__ = self.bound_signature.replace(parameters=[
            inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
            *described.parameters.values()])
        self._twin: Method[P, T] | None = None

    def for_client(self, owner: type[Any]) -> Method[P, T]:
        """This method as ``owner``'s class attribute: the asyncio twin for a client whose
        ``_send`` is awaited (its signature returns the awaitable), else itself."""
        if not inspect.iscoroutinefunction(getattr(owner, "_send", None)) or self.asynchronous:
            return self
        if self._twin is None:
            self._twin = Method(self.build, asynchronous=True)
        return self._twin

    def __call__(self, client: Any, *args: P.args, **kwargs: P.kwargs) -> Any:
        call = self.build(*args, **kwargs)
        ring = getattr(client, "keyring", None)
        return client._send(call if ring is None else encryption.sealed(ring, self.__name__, call))

    @overload
    def __get__(self, client: None, owner: type[Any]) -> Method[P, T]: ...

    @overload
    def __get__(self, client: AsyncSends, owner: type[Any]) -> Callable[P, Coroutine[Any, Any, T]]: ...

    @overload
    def __get__(self, client: Sends, owner: type[Any]) -> Callable[P, T]: ...

    def __get__(self, client: Any, owner: type[Any]) -> Any:
        if client is None:
            return self.for_client(owner)
        build, send = self.build, client._send
        ring = getattr(client, "keyring", None)  # a client with keys= (pgq_thin.encryption)
        if ring is not None and (self.__name__ in encryption.SEALED or self.__name__ in encryption.OPENED):
            name = self.__name__

            def method(*args: P.args, **kwargs: P.kwargs) -> Any:
                return send(encryption.sealed(ring, name, build(*args, **kwargs)))
        else:
            def method(*args: P.args, **kwargs: P.kwargs) -> Any:
                return send(build(*args, **kwargs))

        method.__name__ = method.__qualname__ = self.__name__
        method.__doc__ = self.__doc__
        method.__signature__ = self.for_client(owner).bound_signature  # type: ignore[attr-defined]
        return method


class PgqCalls:
    """One method per pgq function, for Client and AsyncClient alike (each subclass sends)."""

    enqueue = Method(enqueue)
    enqueue_many = Method(enqueue_many)
    update_job = Method(update_job)
    claim = Method(claim)
    renew = Method(renew)
    complete = Method(complete)
    complete_many = Method(complete_many)
    complete_and_claim = Method(complete_and_claim)
    fail = Method(fail)
    release = Method(release)
    snooze = Method(snooze)
    mark_unknown = Method(mark_unknown)
    progress = Method(progress)
    sweep = Method(sweep)
    settle_dependencies = Method(settle_dependencies)
    cancel = Method(cancel)
    retry = Method(retry)
    retry_jobs = Method(retry_jobs)
    cancel_jobs = Method(cancel_jobs)
    delete_jobs = Method(delete_jobs)
    resolve = Method(resolve)
    prune = Method(prune)
    pause = Method(pause)
    resume = Method(resume)
    drop_queue = Method(drop_queue)
    configure_queue = Method(configure_queue)
    set_tenant_weight = Method(set_tenant_weight)
    set_key_limit = Method(set_key_limit)
    schedule = Method(schedule)
    unschedule = Method(unschedule)
    schedules = Method(schedules)
    grant_queue = Method(grant_queue)
    revoke_queue = Method(revoke_queue)
    queue_grants = Method(queue_grants)
    queue_settings = Method(queue_settings)
    stats = Method(stats)
    metrics = Method(metrics)
    health = Method(health)
    list_jobs = Method(list_jobs)
    queue_status = Method(queue_status)
    worker_heartbeat = Method(worker_heartbeat)
    workers = Method(workers)
    queue_kinds = Method(queue_kinds)
    rate_limit_wait = Method(rate_limit_wait)
    queue_limits = Method(queue_limits)
    get_job = Method(get_job)
    job_history = Method(job_history)
    version = Method(version)
    privileges = Method(privileges)
    clock = Method(clock)
    batch_open = Method(batch_open)
    batch_close = Method(batch_close)
    batch_status = Method(batch_status)
    batch_jobs = Method(batch_jobs)
    cancel_batch = Method(cancel_batch)
    job_result = Method(job_result)
    dependency_results = Method(dependency_results)
    job_links = Method(job_links)
    get_step = Method(get_step)
    get_steps = Method(get_steps)
    record_step = Method(record_step)
    sleep = Method(sleep)
    await_signal = Method(await_signal)
    spawn = Method(spawn)
    await_jobs = Method(await_jobs)
    job_outcomes = Method(job_outcomes)
    signal = Method(signal)
    job_steps = Method(job_steps)
    cancel_workflow = Method(cancel_workflow)


#: Every call: each client has one method of each name.
ALL: tuple[Method[..., Any], ...] = tuple(m for m in vars(PgqCalls).values() if isinstance(m, Method))
