"""Typed rows returned by the client: what pgq's functions return, nothing more."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple, TypeVar

T = TypeVar("T")


class UnreadableJson:
    """A JSON value (a payload, a result, a checkpoint) the server holds but Python's json cannot
    read: nested deeper than its recursion limit (a job enqueued from another language, say).
    It stands in for the value, so that the row it is in can be read; a worker fails such a job at
    once, not retryable. ``text`` is the value as the server sent it."""

    __slots__ = ("text",)

    def __init__(self, text: bytes) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"<JSON of {len(self.text)} bytes, nested too deeply to read>"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, UnreadableJson) and other.text == self.text

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True)
class Job:
    """A claimed job (pgq.claimed_job). `attempt` is the fencing token for every owner call."""

    id: int
    queue: str
    kind: str
    payload: dict[str, Any]
    priority: int
    attempt: int
    max_attempts: int
    run_at: datetime
    created_at: datetime
    lease_until: datetime
    tenant: str | None
    #: The checkpoint an earlier attempt stored with pgq.progress (None: none yet).
    progress: dict[str, Any] | None = None
    #: This attempt's deadline (claimed_at + max_run_time) by the database clock; None: no limit.
    deadline: datetime | None = None
    #: The producer's metadata (enqueue's ``meta``; None: none), with the trace context under "otel".
    meta: dict[str, Any] | None = None


class CompletedAndClaimed(NamedTuple):
    """What pgq.complete_and_claim returns: the ids of the pairs completed, and the jobs claimed."""

    completed: list[int]
    jobs: list[Job]


@dataclass(frozen=True)
class QueueStats:
    """One row of pgq.stats(): jobs by state for one queue."""

    queue: str
    paused: bool
    pending: int
    scheduled: int
    running: int
    expired: int
    done: int
    failed: int
    cancelled: int
    outcome_unknown: int
    oldest_ready_age: timedelta | None
    #: Jobs waiting for their dependencies (enqueue's ``depends_on``).
    waiting: int = 0


@dataclass(frozen=True)
class QueueMetrics:
    """One row of pgq.metrics(): what an exporter scrapes for one queue, read without counting
    finished rows. ``*_total``: jobs that reached that state (counters kept by the database)."""

    queue: str
    paused: bool
    pending: int
    scheduled: int
    running: int
    expired: int
    outcome_unknown: int
    oldest_ready_age: timedelta | None
    done_total: int
    failed_total: int
    cancelled_total: int
    #: Jobs waiting for their dependencies (enqueue's ``depends_on``).
    waiting: int = 0


@dataclass(frozen=True)
class QueueSettings:
    """A row of pgq.queues: a queue's settings (pgq.configure_queue, pause, resume, queue_settings)."""

    name: str
    paused: bool
    lease: timedelta
    max_attempts: int
    backoff_base: timedelta
    backoff_cap: timedelta
    retention: timedelta
    notify: bool
    audit: bool
    fair: bool
    max_running: int
    created_at: datetime
    max_run_time: timedelta | None = None
    #: The earliest next_run_at of the queue's enabled schedules (None: none).
    next_schedule_at: datetime | None = None
    #: The privileges that have per-queue grants (pgq.grant_queue); None: the queue is open.
    restricted: list[str] | None = None
    #: At most this many jobs of one concurrency_key running at once (0: no limit).
    key_max_running: int = 0
    #: Whether the queue limits its keys (key_max_running or a pgq.set_key_limit override).
    key_limited: bool = False
    #: At most this many jobs claimed per rate_period (a burst of at most rate_limit); 0: no limit.
    rate_limit: int = 0
    #: The period of rate_limit and key_rate_limit.
    rate_period: timedelta = timedelta(seconds=1)
    #: At most this many jobs of one concurrency_key claimed per rate_period; 0: no limit.
    key_rate_limit: int = 0
    #: Whether the queue has a rate limit (rate_limit or key_rate_limit).
    rate_limited: bool = False
    #: The rate limit's state: when its bucket is full again, the latest of its shards (None or
    #: past: full now).
    rate_tat: datetime | None = None
    #: How long failed jobs are kept (None: ``retention``).
    retention_failed: timedelta | None = None
    #: How long cancelled jobs are kept (None: ``retention``).
    retention_cancelled: timedelta | None = None
    #: The kinds claims skip (pgq.pause(queue, kind => ...)), in name order; None: none.
    paused_kinds: list[str] | None = None
    #: False: a job is deleted as it completes (pgq.configure_queue's keep_done).
    keep_done: bool = True
    #: A due job that has waited longer than this is claimed before any job of higher priority
    #: (the lowest priority, then the oldest, first); None: strict priority.
    max_wait: timedelta | None = None
    #: 'halt' or 'continue': the jobs of one concurrency_key run one at a time in the order they were
    #: enqueued ('halt': a job that failed for good holds its key's later jobs); None: off.
    key_sequence: str | None = None
    #: True: the sweep moves the queue's finished jobs into pgq.archive (pgq.configure_queue's archive).
    archive: bool = False


@dataclass(frozen=True)
class JobRecord:
    """A row of pgq.jobs as pgq.get_job returns it: the whole job, for operators."""

    id: int
    queue: str
    kind: str
    payload: dict[str, Any]
    priority: int
    state: str
    run_at: datetime
    created_at: datetime
    attempt: int
    max_attempts: int
    lease_until: datetime | None
    claimed_by: str | None
    claimed_at: datetime | None
    last_error: str | None
    result: Any
    finished_at: datetime | None
    unique_key: str | None
    tenant: str | None
    last_event: str
    max_run_time: timedelta | None = None
    deadline: datetime | None = None
    progress: dict[str, Any] | None = None
    schedule: str | None = None
    #: The database login of the latest claim or owner operation: the owner operations of a running
    #: attempt are accepted only from it (or a pgq_admin member). None: claimed before migration 0008.
    session_role: str | None = None
    #: The producer's metadata (enqueue's ``meta``; None: none).
    meta: dict[str, Any] | None = None
    #: The job's key for per-key concurrency limits (None: not limited by them).
    concurrency_key: str | None = None
    #: The jobs this one waits for, or waited for (enqueue's ``depends_on``; None: none).
    depends_on: list[int] | None = None
    #: While ``waiting``: how many of them are not done yet (None: enqueued without depends_on).
    dependencies_left: int | None = None
    #: Whether jobs wait for this one (from get_job; the column list_jobs shows was written only by
    #: releases before migration 0015, whose enqueue locked this job's row to set it).
    has_dependants: bool = False
    #: How its dependencies release it: 'all_done' (every one done; cancelled when one fails or is
    #: cancelled) or 'all_ended' (every one ended, whatever the mix); None: enqueued without depends_on.
    dependency_mode: str | None = None
    #: The batch it is a member of (enqueue's ``batch``; None: none).
    batch_id: int | None = None
    #: Whether its end is notified on the channel pgq_finished (enqueue's ``notify_finished``).
    notify_finished: bool = False
    #: The login that enqueued it (None: enqueued before migration 0017).
    enqueued_by: str | None = None
    #: A job enqueued by pgq.spawn: the root of its workflow, and the job that spawned it.
    workflow_id: int | None = None
    parent_id: int | None = None
    #: Enqueue's start_by (cancelled when not claimed by then), and created_at + max_lifetime
    #: (failed when still alive then); None: no such limit.
    start_by: datetime | None = None
    expires_at: datetime | None = None
    #: While parked by pgq.await_signal: the signal it waits for, and when the wait times out.
    wait_signal: str | None = None
    wake_at: datetime | None = None
    #: Enqueue's tags (each once, sorted); None: none.
    tags: list[str] | None = None


#: The states a job ends in: pgq.job_result's answer is final in one of them.
FINISHED_STATES = frozenset({"done", "failed", "cancelled"})


@dataclass(frozen=True)
class JobResult:
    """What pgq.job_result returns: a job's state and, once it has ended, its result (a done job's
    return value), its last error (a failed job's) and when it finished."""

    state: str
    result: Any
    last_error: str | None
    finished_at: datetime | None

    @property
    def finished(self) -> bool:
        """Whether the job has ended (done, failed or cancelled): the answer will not change."""
        return self.state in FINISHED_STATES


@dataclass(frozen=True)
class DependencyResult:
    """One row of pgq.dependency_results: a dependency of the caller's job and how it ended
    (state None: it was pruned since)."""

    dependency_id: int
    state: str | None
    result: Any
    last_error: str | None
    finished_at: datetime | None


@dataclass(frozen=True)
class StepRecord:
    """One row of pgq.job_steps: a recorded step of a job (a spawn's result is ``{"job_id": id}``, a
    signal wait's outcome is the step ``signal:<name>``)."""

    name: str
    attempt: int
    result: Any
    recorded_at: datetime


class StepLookup(NamedTuple):
    """pgq.get_step's answer: whether the step is recorded, and its result."""

    found: bool
    result: Any


class SignalAnswer(NamedTuple):
    """pgq.await_signal's answer: ``arrived`` (with the signal's payload), ``timed_out``, or
    ``waiting`` (the job is parked: the handler returns without completing)."""

    status: str
    payload: Any


class SleepAnswer(NamedTuple):
    """pgq.sleep's answer: ``sleeping`` (the attempt ended until ``wake_at``: the handler returns
    without completing) or ``awake`` (the sleep is over: go on)."""

    status: str
    wake_at: datetime


@dataclass(frozen=True)
class JobOutcome:
    """One row of pgq.job_outcomes: an awaited job and how it ended (state None: not answered, or
    pruned since)."""

    job_id: int
    state: str | None
    result: Any
    last_error: str | None
    finished_at: datetime | None


@dataclass(frozen=True)
class JobLink:
    """One row of pgq.job_links: a job linked to the one asked about, as its ``dependency`` (a job
    of its depends_on), its ``dependant`` (a job whose depends_on names it), its ``parent`` (the
    job that spawned it), its ``child`` (a job it spawned) or a job it is ``awaiting``
    (pgq.await_jobs, not ended yet)."""

    relation: str
    job_id: int
    queue: str
    kind: str
    state: str


@dataclass(frozen=True)
class BatchStatus:
    """What pgq.batch_status returns: a batch (pgq.batch_open), its members counted by state and its
    callback. ``state``: 'open' (members may still be added), 'sealed' (pgq.batch_close; members
    still unfinished), 'finished' (the callback was enqueued) or 'cancelled' (pgq.cancel_batch)."""

    batch_id: int
    state: str
    opened_by: str
    callback_queue: str
    callback_kind: str
    run_when: str
    members: int
    unfinished: int
    done: int
    failed: int
    cancelled: int
    #: The callback job, once enqueued (None before).
    callback_job_id: int | None
    created_at: datetime
    sealed_at: datetime | None
    finished_at: datetime | None


@dataclass(frozen=True)
class JobEvent:
    """A row of pgq.job_events: one claim, transition or rejected stale write."""

    id: int
    job_id: int
    attempt: int
    worker: str | None
    event: str
    from_state: str | None
    to_state: str | None
    at: datetime
    note: str | None
    #: The database login whose call caused the event (worker is the name the caller gave).
    session_role: str | None = None
    #: How many times it happened: more than 1 only for a repeated rejected write, recorded once.
    times: int = 1


@dataclass(frozen=True)
class Schedule:
    """A row of pgq.schedules: a periodic job and when it runs next."""

    name: str
    queue: str
    kind: str
    cron: str | None
    every: timedelta | None
    payload: dict[str, Any]
    timezone: str
    priority: int
    max_attempts: int | None
    tenant: str | None
    skip_if_running: bool
    enabled: bool
    next_run_at: datetime
    last_run_at: datetime | None
    last_job_id: int | None
    last_skipped_at: datetime | None
    skipped: int
    created_at: datetime


@dataclass(frozen=True)
class TenantSettings:
    """A row of pgq.tenants: a tenant of a fair queue, its weight and virtual time."""

    queue: str
    tenant: str
    weight: int
    vtime: float


@dataclass(frozen=True)
class Privileges:
    """Which of pgq's admin functions the current login may call (Client.privileges): ``role`` is
    current_user; ``functions`` maps each (by its client method's name: retry, cancel, resolve,
    pause, resume, retry_jobs, cancel_jobs, delete_jobs) to True or False, or to None when the schema has no
    such function (it predates the migration that adds it). A question for showing what a login may
    do (the dashboard greys its buttons): the database itself refuses a call it may not make (42501)."""

    role: str
    functions: dict[str, bool | None]

    @property
    def read_only(self) -> bool:
        """Whether the login may call none of them."""
        return not any(self.functions.values())

    @property
    def missing(self) -> list[str]:
        """The functions the schema does not have."""
        return [name for name, may in self.functions.items() if may is None]


@dataclass(frozen=True)
class HealthFinding:
    """One row of pgq.health(): severity is ok, warning or critical."""

    severity: str
    check: str
    detail: str
    hint: str | None


@dataclass(frozen=True)
class QueueLimits:
    """One row of pgq.queue_limits(): a queue's limits and how many of its due jobs (ready) each
    holds back now (held_by_*; a job may be held by several)."""

    queue: str
    paused: bool
    ready: int
    running: int
    max_running: int
    key_max_running: int
    rate_limit: int
    rate_period: timedelta
    key_rate_limit: int
    held_by_max_running: int
    held_by_key_limit: int
    held_by_rate_limit: int
    held_by_key_rate_limit: int
    #: When the queue's bucket holds a token again (None: it holds one, or has no rate limit).
    next_token_at: datetime | None
    #: The earliest such moment of a key whose due jobs its key rate limit holds back.
    next_key_token_at: datetime | None


@dataclass(frozen=True)
class QueueStatus:
    """One row of pgq.queue_status(): whether a queue exists and whether it is paused."""

    queue: str
    known: bool
    paused: bool


@dataclass(frozen=True)
class WorkerEntry:
    """One row of pgq.workers(): a live worker of the registry (pgq.worker_heartbeat), what it
    claims (queues, kinds; None: all, any), how many jobs it runs, where, and since when."""

    worker: str
    login: str
    host: str | None
    pid: int | None
    queues: list[str] | None
    kinds: list[str] | None
    running: int
    started_at: datetime
    last_seen: datetime
    alive_until: datetime


@dataclass(frozen=True)
class QueueKind:
    """One row of pgq.queue_kinds(): a kind of a queue's pending jobs, and whether a live worker of
    the registry claims it."""

    queue: str
    kind: str
    handled: bool


@dataclass(frozen=True)
class QueueGrant:
    """One row of pgq.queue_grants(): members of ``role`` may use ``privilege`` on ``queue``."""

    queue: str
    privilege: str
    role: str
    granted_at: datetime
    granted_by: str


_TRACEBACK = "Traceback (most recent call last):"


def error_summary(error: str | None) -> str | None:
    """An error in one line, for lists: for a Python traceback (what the worker stores for a
    handler that raised) the exception's line, ``ValueError: bad address``, after the traceback's
    last frame (of the last exception, when they are chained); for any other text its first line.
    None for no error."""
    if not error or not error.strip():
        return None
    lines = error.strip().splitlines()
    if not lines[0].startswith(_TRACEBACK):
        return lines[0]
    # After the last exception's header, its frames are indented; the exception's line is not.
    after = max(i for i, line in enumerate(lines) if line.startswith(_TRACEBACK)) + 1
    while after < len(lines) and lines[after][:1].isspace():
        after += 1
    return lines[after] if after < len(lines) else lines[-1]


def record(cls: type[T], row: dict[str, Any]) -> T:
    """A dataclass from a row, ignoring columns it does not know (added by later migrations)."""
    fields = cls.__dataclass_fields__  # type: ignore[attr-defined]
    return cls(**{k: v for k, v in row.items() if k in fields})
