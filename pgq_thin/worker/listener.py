"""The listener: LISTEN pgq on a connection of its own; a NOTIFY naming one of our queues wakes
the claimer. While it is down the claimer polls faster; it reconnects with backoff. On the same
connection it LISTENs pgq_cancel: a notification naming a job's attempt ('<id>:<attempt>', sent
by pgq.cancel) is handed to ``cancelled(id, attempt)`` (the worker then checks it by a renewal).
Written once, for asyncio (AsyncListener); the thread runtime's Listener is generated from it
(pgq_thin/worker/threads/listener.py)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

import psycopg

from pgq_thin import queries
from pgq_thin.worker.support import KEEPALIVES, Backoff, log
from pgq_thin.worker.waits import Part

__all__ = ["AsyncListener", "CancelNoticed", "Reconnects", "cancel_target", "concerns", "heard"]

CancelNoticed = Callable[[int, int], None]


def concerns(payload: str, queues: Sequence[str] | None, ignores: Callable[[str], bool] | None = None) -> bool:
    """A NOTIFY with this payload (a queue name) is news for a worker of ``queues`` (None: all),
    unless ``ignores`` says it is not (a queue waiting for its rate limit's next token)."""
    return (queues is None or payload in queues) and not (ignores is not None and ignores(payload))


def cancel_target(payload: str) -> tuple[int, int] | None:
    """The (job id, attempt) a pgq_cancel payload names ('<id>:<attempt>'); None for anything else
    (any login may NOTIFY pgq_cancel)."""
    job_id, colon, attempt = payload.partition(":")
    if not colon or not (job_id.isascii() and job_id.isdigit() and attempt.isascii() and attempt.isdigit()):
        return None
    if len(job_id) > 19 or len(attempt) > 10:
        return None
    return int(job_id), int(attempt)


def heard(notify: psycopg.Notify, queues: Sequence[str] | None, ignores: Callable[[str], bool] | None,
          wake: Callable[[], None], cancelled: CancelNoticed | None) -> None:
    """Act on one notification (both runtimes): wake the claimer, or hand a cancel on."""
    if notify.channel == queries.CANCEL_CHANNEL:
        if cancelled is not None and (target := cancel_target(notify.payload)) is not None:
            cancelled(*target)
    elif concerns(notify.payload, queues, ignores):
        wake()


class Reconnects:
    """What the listener does when its connection comes and goes (both runtimes): LISTEN works
    (reset the backoff; say so once after a loss), or the connection broke (how long to wait
    before reconnecting; a warning for the first loss, quieter while it stays down)."""

    def __init__(self, worker_name: str) -> None:
        self.worker_name = worker_name
        self.backoff = Backoff(first=0.2, cap=15.0)
        self.lost = False

    def listening(self) -> None:
        self.backoff.reset()
        if self.lost:
            log.info("LISTEN restored", extra={"worker": self.worker_name})
            self.lost = False

    def broke(self, exc: BaseException) -> float:
        delay = self.backoff.next()
        log.log(logging.DEBUG if self.lost else logging.WARNING,
                "LISTEN connection lost (%s); polling until it is back, reconnecting in %.1fs",
                exc, delay, extra={"worker": self.worker_name})
        self.lost = True
        return delay


class AsyncListener(Part):
    """Calls ``wake()`` for each NOTIFY that concerns ``queues`` and once each time LISTEN starts
    (anything enqueued while we were not listening). ``listening`` is set while LISTEN works.
    ``ignores(queue)``: a NOTIFY naming a queue it says is no news wakes nobody (RatePace.ignores).
    ``cancelled(id, attempt)``: called (in the listener's loop) for each pgq_cancel notification;
    None: pgq_cancel is not listened to."""

    def __init__(self, dsn: str, queues: Sequence[str] | None, wake: Callable[[], None], worker_name: str,
                 listening: threading.Event, ignores: Callable[[str], bool] | None = None,
                 cancelled: CancelNoticed | None = None) -> None:
        super().__init__()
        self.dsn = dsn
        self.queues = queues
        self.ignores = ignores
        self.cancelled = cancelled
        self.wake = wake
        self.worker_name = worker_name
        self.listening = listening

    thread_name = "pgq-listen"

    async def run(self) -> None:
        reconnects = Reconnects(self.worker_name)
        while not self._stopped.is_set():
            try:
                async with await psycopg.AsyncConnection.connect(
                        self.dsn, autocommit=True, connect_timeout=5,
                        application_name=f"pgq-listen {self.worker_name}"[:63], **KEEPALIVES) as conn:
                    if self.cancelled is not None:  # first: the connection's last statement stays
                        await conn.execute(queries.LISTEN_CANCEL)  # LISTEN pgq (how a test sees it)
                    await conn.execute(queries.LISTEN)
                    self.listening.set()
                    self.wake()  # anything enqueued while we were not listening
                    reconnects.listening()
                    queues, ignores, wake, cancelled = self.queues, self.ignores, self.wake, self.cancelled
                    while not self._stopped.is_set():
                        async for notify in conn.notifies(timeout=0.25):
                            heard(notify, queues, ignores, wake, cancelled)
            except psycopg.Error as exc:
                self.listening.clear()
                if self._stopped.is_set():
                    break
                await self._stopped.wait(reconnects.broke(exc))
        self.listening.clear()
