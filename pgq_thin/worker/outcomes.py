"""How a handler's outcome becomes exactly one owner call: what the handler may raise (Retry,
Snooze, OutcomeUnknown) and the one mapping from "returned this" / "raised that" to the pgq
function that records it. Both runtimes use it; neither decides this anywhere else."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

from pgq_thin.durations import Interval, to_timedelta
from pgq_thin.errors import Undecryptable, UnknownKey
from pgq_thin.models import Job, UnreadableJson
from pgq_thin.worker.durable import Parked
from pgq_thin.worker.support import JobLog, sane_seconds, seconds, transient

__all__ = ["CANCELLED", "PARKED", "Outcome", "OutcomeUnknown", "Retry", "Snooze", "cancelled_before_start",
           "no_handler", "of_exception", "of_result", "parked", "undecryptable", "unreadable"]


def _delay(what: str, delay: Interval) -> float | timedelta:
    """A Retry's or a Snooze's delay: a number of seconds or a timedelta as given, a duration in
    text (``"30s"``, ``"1h 30m"``) as its timedelta; positive and finite, else ValueError."""
    if isinstance(delay, str):
        try:
            delay = to_timedelta(delay)
        except ValueError as exc:
            raise ValueError(f"{what} delay {exc}") from None
    if not sane_seconds(delay):
        raise ValueError(f"{what} delay must be a positive finite number of seconds, a timedelta or a duration "
                         f"such as '30s', got {delay!r}")
    return delay


class Retry(Exception):
    """Raise in a handler to fail this attempt and retry after ``delay`` (pgq.fail with retry_in):
    seconds, a timedelta or a duration such as ``"30s"`` or ``"1h 30m"``. ``delay=None`` uses the
    queue's backoff. Counts as an attempt."""

    def __init__(self, delay: Interval | None = None, reason: str = "retry requested") -> None:
        checked = None if delay is None else _delay("Retry", delay)
        super().__init__(reason)
        self.delay = checked
        self.reason = reason


class Snooze(Exception):
    """Raise in a handler to run the job again after ``delay`` (seconds, a timedelta or a duration
    such as ``"5m"``) without using up an attempt (pgq.snooze)."""

    def __init__(self, delay: Interval) -> None:
        checked = _delay("Snooze", delay)
        super().__init__(f"snoozed for {seconds(checked):g} s")
        self.delay = checked


class OutcomeUnknown(Exception):
    """Raise in a handler when the outside effect may or may not have happened (a timeout after
    the request was sent): the job is parked as outcome_unknown until pgq.resolve settles it."""

    def __init__(self, note: str) -> None:
        super().__init__(note)
        self.note = note


Operation = Literal["complete", "fail", "snooze", "mark_unknown", "park"]

def failed_as(state: Any) -> str:
    """What pgq.fail's answer (the job's new state) means, as a sentence."""
    if state == "pending":
        return "failed; it will be retried after its backoff"
    return "failed for good: no attempts left, or not retryable"


def _after(delay: float | timedelta | None) -> str:
    return "after the queue's backoff" if delay is None else f"in {seconds(delay):g} s"


_DONE_MESSAGE: dict[str, Callable[[Any], str]] = {"complete": lambda _: "completed", "fail": failed_as,
                 "snooze": lambda until: f"snoozed: due again at {until}",
                 "mark_unknown": lambda _: "parked as outcome_unknown, until pgq.resolve settles it"}


@dataclass(frozen=True)
class Outcome:
    """One owner call: ``operation`` is the name of the Client / AsyncClient method (and of the pgq
    function), ``arguments`` what it takes after (id, attempt). ``batched``: a completion without
    result, which joins the next pgq.complete_many instead. ``raised``: the handler's exception,
    for a failure it raised; logged once, with the server's answer (JobLog.about_outcome)."""

    operation: Operation
    arguments: dict[str, Any] = field(default_factory=dict)
    batched: bool = False
    raised: BaseException | None = field(default=None, compare=False, repr=False)

    def send(self, client: Any, job: Job) -> Any:
        """Make the call (a Client answers; an AsyncClient returns the awaitable)."""
        return getattr(client, self.operation)(job.id, job.attempt, **self.arguments)

    def answered(self, jlog: JobLog, answer: Any) -> None:
        """Log what the server answered."""
        if answer is None or answer is False:
            jlog.about_outcome(logging.WARNING, self.raised,
                               "%s rejected: the job is no longer ours (its lease expired, or it was cancelled)",
                               self.operation)
        else:
            jlog.about_outcome(logging.INFO, self.raised, _DONE_MESSAGE[self.operation](answer))


#: The outcome of a handler run that the job's cancel ended (pgq.cancel: an async handler's task
#: interrupted, a handler that raised once told, a job cancelled before its slot started it). It is
#: never sent: the registry refuses every call for a cancelled job (HeldJobs.settle).
CANCELLED = Outcome("fail", {"error": "cancelled while it ran (pgq.cancel)"})

def cancelled_before_start(jlog: JobLog) -> Outcome:
    """A job cancelled (pgq.cancel) while it waited for a slot: its handler is not run."""
    jlog.info("cancelled (pgq.cancel) before a slot started it: the handler is not run")
    return CANCELLED


#: The outcome of a handler run that a durable wait parked (ctx.sleep, ctx.wait_for_signal,
#: ctx.wait_for_jobs raised Parked): the database ended the attempt, nothing is sent.
PARKED = Outcome("park")


def parked(outcome: Outcome, jlog: JobLog) -> None:
    """A durable wait of the handler parked the job (the attempt ended in the database): nothing is
    sent; what the handler did after it (``outcome``, when it caught Parked) is not recorded."""
    if outcome is PARKED:
        jlog.info("parked (a durable sleep or wait): the attempt has ended, the job runs again when it may go on")
    else:
        jlog.warning("parked (a durable sleep or wait), but the handler went on after it: what it did then "
                     "(%s) is not recorded", outcome.operation)


#: A handler returned None: its completion joins the next complete_many batch (the common case:
#: one shared object, nothing made per job).
BATCHED = Outcome("complete", batched=True)


def of_result(result: Any) -> Outcome:
    """The handler returned: complete (None joins the next complete_many batch)."""
    if result is None:
        return BATCHED
    return Outcome("complete", {"result": result})


def committed(outcome: Outcome, jlog: JobLog) -> None:
    """The handler's ctx.transaction() committed the job's completion (with its own writes): the
    job is done, and ``outcome`` (what the handler returned or raised afterwards) is not sent."""
    if outcome.operation == "complete":
        jlog.info("completed, in the handler's transaction")
    else:
        jlog.warning("completed, in the handler's transaction; what the handler did afterwards (%s) is not "
                     "recorded: the job stays done", outcome.operation)


def sendable(text: str) -> str:
    """``text`` as PostgreSQL text can hold it: a NUL or a lone surrogate (an exception's message
    made of undecodable bytes) shown as its escape, so that the failure is still recorded."""
    if text.isascii() and "\x00" not in text:
        return text
    return text.encode("utf-8", "backslashreplace").decode().replace("\x00", "\\x00")


def of_exception(exc: BaseException, jlog: JobLog) -> Outcome:
    """The handler raised ``exc`` (call this inside the ``except`` block: a failure keeps its
    traceback)."""
    if isinstance(exc, Retry):
        if exc.reason == "retry requested":
            jlog.info("the handler asked for a retry %s", _after(exc.delay))
        else:
            jlog.info("the handler asked for a retry %s: %s", _after(exc.delay), exc.reason)
        return Outcome("fail", {"error": sendable(str(exc.reason)), "retry_in": exc.delay})
    if isinstance(exc, Snooze):
        jlog.info("the handler snoozed the job for %g s (no attempt used)", seconds(exc.delay))
        return Outcome("snooze", {"delay": exc.delay})
    if isinstance(exc, Parked):
        return PARKED
    if isinstance(exc, OutcomeUnknown):
        jlog.warning("the handler cannot tell whether the job's effect happened: %s", exc.note)
        return Outcome("mark_unknown", {"note": sendable(str(exc.note))})
    # Logged once, when the server has answered the fail (Outcome.answered and the other ends).
    return Outcome("fail", {"error": sendable(handler_traceback(exc))}, raised=exc)


#: Where the frames of the worker runtime come from: pgq_thin/worker/ and, on the asyncio
#: runtime, the standard library's asyncio, concurrent.futures and threading that run a handler.
_RUNTIME_FILES = tuple(os.path.dirname(os.path.abspath(str(m.__file__))) + os.sep
                       for m in (asyncio, concurrent.futures)) + (os.path.dirname(os.path.abspath(__file__)) + os.sep,)
_RUNTIME_MODULES = (os.path.abspath(str(threading.__file__)),)


def _runtime_frame(filename: str) -> bool:
    path = os.path.abspath(filename)
    return path.startswith(_RUNTIME_FILES) or path in _RUNTIME_MODULES


def handler_traceback(exc: BaseException) -> str:
    """The traceback of what a handler raised, as the job's error stores it: from the handler's own
    frame on (the worker runtime's frames that called it, pgq's executor first, are left out)."""
    tb = exc.__traceback__
    while tb is not None and _runtime_frame(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def unreadable(job: Job, jlog: JobLog) -> Outcome | None:
    """A job whose payload or checkpoint Python cannot read (UnreadableJson): it fails at once,
    not retryable (no attempt of it could run); None for any other job."""
    what = [name for name in ("payload", "progress") if isinstance(getattr(job, name), UnreadableJson)]
    if not what:
        return None
    jlog.error("its %s is nested too deeply for Python's json to read: the job fails for good", " and ".join(what))
    return Outcome("fail", {"error": f"pgq_thin worker: the job's {' and '.join(what)} is nested too deeply for "
                                     "Python's json to read (its recursion limit)", "retryable": False})


def undecryptable(job: Job, exc: Undecryptable, jlog: JobLog) -> Outcome:
    """A job whose encrypted payload the worker's key ring cannot open (its key is not in the ring,
    or the envelope was altered): it fails at once, not retryable (another attempt of a worker with
    the same ring could not read it either), with an error naming the key id, never a key."""
    if isinstance(exc, UnknownKey):
        error = (f"pgq_thin worker: the job's payload is encrypted with key {exc.kid!r}, which is not in this "
                 f"worker's key ring (it has: {', '.join(map(repr, exc.kids))})")
    else:
        error = f"pgq_thin worker: the job's payload cannot be decrypted: {exc.message}"
    jlog.error("%s: the job fails for good", error.removeprefix("pgq_thin worker: "))
    return Outcome("fail", {"error": error, "retryable": False})


def no_handler(job: Job, worker_name: str, kinds: list[str], jlog: JobLog) -> Outcome:
    """No handler for the job's kind: fail at once, not retryable."""
    jlog.error("this worker has no handler for kind %r: the job fails for good", job.kind)
    error = (f"no handler for kind {job.kind!r} in worker {worker_name!r} "
             f"(it handles: {', '.join(kinds) or 'nothing'})")
    return Outcome("fail", {"error": error, "retryable": False})


def refused_instead(operation: str, exc: BaseException, jlog: JobLog,
                    raised: BaseException | None = None) -> Outcome | None:
    """What to send when the outcome call ``operation`` failed for good with ``exc``: None when
    we are exiting (a transient error: the lease recovers the job) or it was a fail already; for
    a call the server refused (a snooze delay out of range, a result that is not JSON), a fail of
    the attempt, not retryable, so that someone looks at it."""
    if transient(exc):
        jlog.about_outcome(logging.WARNING, raised, "%s abandoned at exit; the lease will recover the job", operation)
        return None
    jlog.about_outcome(logging.ERROR, raised, "%s refused: %s", operation, exc)
    if operation == "fail":
        return None
    return Outcome("fail", {"error": sendable(f"pgq_thin worker: {operation} of this attempt was refused: "
                                              f"{type(exc).__name__}: {exc}"), "retryable": False})
