"""What a handler sees besides its job: its JobContext."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from pgq_thin.models import Job

__all__ = ["Handler", "JobContext"]


class JobContext:
    """Handed to a handler with its job.

    ``lease_lost`` is set when the job is no longer ours (a renewal was refused, or the worker gave
    the job back at shutdown): stop, since whatever the handler returns will be discarded.
    ``shutting_down`` is set when the worker stops claiming: finish soon, or be released after
    shutdown_timeout. A long handler should check ``should_stop`` between steps.

    ``client`` is the worker's client: a Client for a Worker, an AsyncClient for an AsyncWorker.

    A per-job facility (a deadline from the claimed row, a progress report) belongs here: both
    runtimes make the context in one way, from the claimed Job, the client and the stop flag
    (Claimer.hand_over, AsyncClaimer.hand_over); a method that calls ``client`` answers on a
    Worker and is awaited on an AsyncWorker, as the client's own methods are.
    """

    def __init__(self, job: Job, client: Any, worker_name: str,
                 shutting_down: threading.Event | None = None) -> None:
        self.job = job
        self.client = client
        self.worker_name = worker_name
        self.shutting_down = shutting_down if shutting_down is not None else threading.Event()
        # Made on first use: most jobs never need one, and an Event costs more to make than
        # the rest of a job's bookkeeping together.
        self._lease_lost: threading.Event | None = None

    @property
    def lease_lost(self) -> threading.Event:
        event = self._lease_lost
        if event is None:
            with _LEASE_LOST_MADE:
                if self._lease_lost is None:
                    self._lease_lost = threading.Event()
                event = self._lease_lost
        return event

    @property
    def should_stop(self) -> bool:
        return self.is_lost() or self.shutting_down.is_set()

    def is_lost(self) -> bool:
        """lease_lost.is_set(), without making the Event."""
        event = self._lease_lost
        return event is not None and event.is_set()

    def __repr__(self) -> str:
        return f"JobContext(job={self.job!r}, worker_name={self.worker_name!r})"


_LEASE_LOST_MADE = threading.Lock()  # makes JobContext.lease_lost once per job, whoever asks first

#: A handler: called with the job and its context; its return value becomes the job's result.
#: On an AsyncWorker it may be an ``async def``.
Handler = Callable[[Job, JobContext], Any]
