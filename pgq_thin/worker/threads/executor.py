# Generated from pgq_thin/worker/executor.py by scripts/async_to_sync.py: do not edit. Edit the
# asyncio source, then run the script (tests/worker/test_worker_generated.py fails while this is stale).
"""The thread runtime's Executor: made of the asyncio AsyncExecutor
(pgq_thin.worker.executor), blocking a thread instead of awaiting."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping

from pgq_thin.encryption import is_envelope
from pgq_thin.errors import Undecryptable
from pgq_thin.models import UnreadableJson
from pgq_thin.worker import outcomes
from pgq_thin.worker.context import Handler, JobContext
from pgq_thin.worker.held import Held
from pgq_thin.worker.metrics import JobWatch
from pgq_thin.worker.outcomes import BATCHED, Outcome
from pgq_thin.worker.support import Flags, log
from pgq_thin.worker.threads.completer import Completer
from pgq_thin.worker.threads.owner import OwnerCalls

__all__ = ["Executor"]


class Executor:
    """Runs the handler (or its chain of middleware) ``handlers`` has for a job's kind."""

    def __init__(self, handlers: Mapping[str, Handler], owner: OwnerCalls, completer: Completer,
                 flags: Flags,
                 watch: JobWatch | None = None) -> None:
        self.handlers = handlers
        self.owner = owner
        self.completer = completer
        self.flags = flags
        self.watch = watch  # metrics and spans; None: neither is on
        self.keyring = owner.client.keyring  # a worker with keys: payloads decrypted here

    def run(self, held: Held) -> None:
        """Run the handler; record its outcome with exactly one owner call. (A run that a stop at
        once cancels records nothing: the lease covers the job.)"""
        watch = self.watch
        if watch is None:
            outcome = self.outcome(held)
        else:
            token = watch.started(held)
            done: Outcome | None = None
            try:
                outcome = done = self.outcome(held)
            finally:
                watch.finished(token, held, done)
        if held.ctx.completed:  # its ctx.transaction() committed the completion: nothing left to send
            outcomes.committed(outcome, held.log)
            self.owner.held.forget([held])
        elif held.ctx.parked:  # a durable wait ended the attempt in the database: nothing to send
            outcomes.parked(outcome, held.log)
            self.owner.held.forget([held])
        elif outcome.batched:
            if not self.completer.add(held):
                self.owner.held.forget([held])
        else:
            self.owner.settle(held, outcome)

    def outcome(self, held: Held) -> Outcome:
        """Run the handler: what it returned or raised, as the call that records it."""
        job = held.job
        if log.isEnabledFor(logging.DEBUG):
            held.log.debug("started")
        function = self.handlers.get(job.kind)
        if function is None:
            return outcomes.no_handler(job, self.owner.worker_name, sorted(self.handlers), held.log)
        ctx = held.ctx
        if self.keyring is not None and is_envelope(job.payload):
            try:
                job = ctx.job = dataclasses.replace(job, payload=self.keyring.decrypt(job.payload))
            except Undecryptable as exc:
                return outcomes.undecryptable(job, exc, held.log)
        if isinstance(job.payload, UnreadableJson) or isinstance(job.progress, UnreadableJson):
            refused = outcomes.unreadable(job, held.log)  # (not called per job: the common case is neither)
            if refused is not None:
                return refused
        if ctx._cancelled:  # (the attribute, not the property: no call per job)
            return outcomes.cancelled_before_start(held.log)
        try:
            result = function(job, ctx)
        except BaseException as exc:  # noqa: BLE001 - any handler failure is an outcome
            return self.raised(exc, ctx, held)
        return BATCHED if result is None else outcomes.of_result(result)

    def raised(self, exc: BaseException, ctx: JobContext, held: Held) -> Outcome:
        """The outcome of a handler that raised ``exc`` (call it in the ``except`` block)."""
        return outcomes.CANCELLED if ctx.cancelled else outcomes.of_exception(exc, held.log)
