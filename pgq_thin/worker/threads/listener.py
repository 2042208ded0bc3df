# Generated from pgq_thin/worker/listener.py by scripts/async_to_sync.py: do not edit. Edit the
# asyncio source, then run the script (tests/worker/test_worker_generated.py fails while this is stale).
"""The thread runtime's Listener: made of the asyncio AsyncListener
(pgq_thin.worker.listener), blocking a thread instead of awaiting."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import psycopg

from pgq_thin import queries
from pgq_thin.worker.listener import CancelNoticed, Reconnects, heard
from pgq_thin.worker.support import KEEPALIVES
from pgq_thin.worker.threads.waits import Part

__all__ = ["Listener"]


class Listener(Part):
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

    def run(self) -> None:
        reconnects = Reconnects(self.worker_name)
        while not self._stopped.is_set():
            try:
                with psycopg.Connection.connect(
                        self.dsn, autocommit=True, connect_timeout=5,
                        application_name=f"pgq-listen {self.worker_name}"[:63], **KEEPALIVES) as conn:
                    if self.cancelled is not None:  # first: the connection's last statement stays
                        conn.execute(queries.LISTEN_CANCEL)  # LISTEN pgq (how a test sees it)
                    conn.execute(queries.LISTEN)
                    self.listening.set()
                    self.wake()  # anything enqueued while we were not listening
                    reconnects.listening()
                    queues, ignores, wake, cancelled = self.queues, self.ignores, self.wake, self.cancelled
                    while not self._stopped.is_set():
                        for notify in conn.notifies(timeout=0.25):
                            heard(notify, queues, ignores, wake, cancelled)
            except psycopg.Error as exc:
                self.listening.clear()
                if self._stopped.is_set():
                    break
                self._stopped.wait(reconnects.broke(exc))
        self.listening.clear()
