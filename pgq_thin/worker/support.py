"""Small things every part of the worker uses: the logger, backoff and jitter, which errors are
worth retrying, a job's logger, the stop flags, and the worker's connection settings."""

from __future__ import annotations

import logging
import os
import random
import secrets
import socket
import threading
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import psycopg

from pgq_thin import queries
from pgq_thin.durations import Interval, to_timedelta
from pgq_thin.errors import ConnectionLost, PgqError
from pgq_thin.models import Job

log = logging.getLogger("pgq_thin.worker")

#: The channel the pgq functions notify, with the queue name as payload.
CHANNEL = queries.CHANNEL

#: TCP keepalives, so that a silently dead connection (a LISTEN waiting for news) is noticed.
KEEPALIVES: dict[str, Any] = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10,
                              "keepalives_count": 3}

#: A delay or a lease as the worker takes one: a number of seconds, a timedelta or a duration as
#: the CLI reads it (``"30s"``, ``"3m 12s"``: pgq_thin.durations).
Delay = Interval


def seconds(delay: Delay) -> float:
    """``delay`` in seconds (a duration in text read by to_timedelta: ValueError if it is not one)."""
    if isinstance(delay, str):
        delay = to_timedelta(delay)
    return delay.total_seconds() if isinstance(delay, timedelta) else float(delay)


#: The longest delay a timedelta (and so an interval sent by the client) holds.
MAX_SECONDS = timedelta.max.total_seconds()


def sane_seconds(delay: Any, low: float = 0.0, high: float = MAX_SECONDS, low_included: bool = False) -> bool:
    """Whether ``delay`` (a number, a timedelta or a duration in text, not a bool) is finite and
    within (low, high] (or [low, high])."""
    if isinstance(delay, bool) or not isinstance(delay, (int, float, timedelta, str)):
        return False
    try:
        number = seconds(delay)
    except (OverflowError, ValueError):  # an int too large for a float; a text that is no duration
        return False
    return (low <= number if low_included else low < number) and number <= high  # NaN: neither


class Backoff:
    """Exponential delays with jitter: the n-th delay is random in [d/2, d], d = min(cap, first * 2**n)."""

    def __init__(self, first: float, cap: float) -> None:
        self.first = min(first, cap)
        self.cap = cap
        self._n = 0

    def next(self) -> float:
        ceiling = min(self.cap, self.first * 2 ** min(self._n, 30))
        self._n += 1
        return random.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self._n = 0


def jitter(value: float) -> float:
    """``value`` scaled by a random factor in [0.8, 1.2], so that many workers drift apart."""
    return value * random.uniform(0.8, 1.2)


def transient(exc: BaseException) -> bool:
    """Worth retrying: the connection broke, or the server asked us to come back later
    (serialization failure / deadlock 40, insufficient resources 53, operator intervention 57,
    lock timeout 55P03: a claim waiting its turn on a capped queue, say)."""
    if isinstance(exc, (ConnectionLost, psycopg.OperationalError)):
        return True
    return isinstance(exc, PgqError) and ((exc.sqlstate or "")[:2] in ("40", "53", "57") or exc.sqlstate == "55P03")


class JobLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """The worker's logger for one job: messages start with "job <id> (<kind>, attempt <n>)" and
    carry job_id, attempt, kind and queue as ``extra=`` fields for structured handlers."""

    def __init__(self, job: Job) -> None:
        super().__init__(log)
        self.job = job  # the prefix and fields are built only for a message that is logged

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        job = self.job
        kwargs["extra"] = {"job_id": job.id, "attempt": job.attempt, "kind": job.kind, "queue": job.queue,
                           **kwargs.get("extra", {})}
        return f"job {job.id} ({job.kind}, attempt {job.attempt}): {msg}", kwargs

    def about_outcome(self, level: int, raised: BaseException | None, msg: str, *args: Any) -> None:
        """Log what became of a handler's outcome. When the handler raised ``raised``, this is the
        one line its failure gets: at least a WARNING, naming the exception, with its traceback,
        and what the server made of the failure (retried, failed for good, rejected)."""
        if raised is None:
            self.log(level, msg, *args)
        else:
            self.log(max(level, logging.WARNING), "the handler raised %r; " + msg, raised, *args, exc_info=raised)


def default_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"


@dataclass
class Flags:
    """What every part of one run watches. ``stopping``: stop claiming (a graceful stop has begun;
    shared with every JobContext as ctx.shutting_down). ``hard_stop``: stop at once, wait for
    nothing. ``done``: the run is over, background parts give up. Thread-safe Events, so an
    asyncio runtime and its threads (sync handlers) read the same flags."""

    stopping: threading.Event = field(default_factory=threading.Event)
    hard_stop: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)

    def giving_up(self) -> bool:
        """Repeating a call is pointless now: we stop at once, or the run is over."""
        return self.hard_stop.is_set() or self.done.is_set()


class Repeat:
    """The rule for repeating an owner call while the server cannot be reached: a transient error
    is repeated after a growing delay (logged), unless we stop at once or the run is over; any
    other error is raised."""

    def __init__(self, operation: str, jlog: JobLog, flags: Flags) -> None:
        self.operation = operation
        self.jlog = jlog
        self.flags = flags
        self.backoff = Backoff(first=0.1, cap=10.0)

    def after(self, exc: Exception) -> float:
        """How long to wait before repeating the call that raised ``exc`` (or raise it)."""
        if not transient(exc) or self.flags.giving_up():
            raise exc
        delay = self.backoff.next()
        self.jlog.warning("%s did not reach the server (%s); repeating it in %.1fs", self.operation, exc, delay)
        return delay
