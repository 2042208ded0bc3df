"""The executor: runs one handler on one held job and turns its outcome into exactly one owner
call: a completion without result joins the completer's next batch, anything else is one call
of pgq.complete, pgq.fail, pgq.snooze or pgq.mark_unknown (outcomes.py says which). Written once,
for asyncio (AsyncExecutor: an ``async def`` handler awaited in the slot's task, a plain one in a
handler thread, through the TaskBridge); the thread runtime's Executor, which calls the handler in
its slot's thread, is generated from it (pgq_thin/worker/threads/executor.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping

from pgq_thin.encryption import is_envelope
from pgq_thin.errors import Undecryptable
from pgq_thin.models import UnreadableJson
from pgq_thin.worker import outcomes
from pgq_thin.worker.bridge import TaskBridge
from pgq_thin.worker.completer import AsyncCompleter
from pgq_thin.worker.context import Handler, JobContext
from pgq_thin.worker.held import Held
from pgq_thin.worker.metrics import JobWatch
from pgq_thin.worker.outcomes import BATCHED, Outcome
from pgq_thin.worker.owner import AsyncOwnerCalls
from pgq_thin.worker.support import Flags, log
from pgq_thin.worker.waits import ASYNC

__all__ = ["AsyncExecutor"]


class AsyncExecutor:
    """Runs the handler (or its chain of middleware) ``handlers`` has for a job's kind."""

    def __init__(self, handlers: Mapping[str, Handler], owner: AsyncOwnerCalls, completer: AsyncCompleter,
                 flags: Flags,
                 bridge: TaskBridge,  # ASYNC
                 watch: JobWatch | None = None) -> None:
        self.handlers = handlers
        self.owner = owner
        self.completer = completer
        self.flags = flags
        self.bridge = bridge  # ASYNC
        self.watch = watch  # metrics and spans; None: neither is on
        self.keyring = owner.client.keyring  # a worker with keys: payloads decrypted here

    async def run(self, held: Held) -> None:
        """Run the handler; record its outcome with exactly one owner call. (A run that a stop at
        once cancels records nothing: the lease covers the job.)"""
        watch = self.watch
        if watch is None:
            outcome = await self.outcome(held)
        else:
            token = watch.started(held)
            done: Outcome | None = None
            try:
                outcome = done = await self.outcome(held)
            finally:
                watch.finished(token, held, done)
        if held.ctx.completed:  # its ctx.transaction() committed the completion: nothing left to send
            outcomes.committed(outcome, held.log)
            self.owner.held.forget([held])
        elif held.ctx.parked:  # a durable wait ended the attempt in the database: nothing to send
            outcomes.parked(outcome, held.log)
            self.owner.held.forget([held])
        elif outcome.batched:
            if not await self.completer.add(held):
                self.owner.held.forget([held])
        else:
            await self.owner.settle(held, outcome)

    async def outcome(self, held: Held) -> Outcome:
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
            if ASYNC:
                result = await self.bridge.call(function, job, ctx, self.watch is not None)
            else:
                result = function(job, ctx)
        except BaseException as exc:  # noqa: BLE001 - any handler failure is an outcome
            return self.raised(exc, ctx, held)
        return BATCHED if result is None else outcomes.of_result(result)

    def raised(self, exc: BaseException, ctx: JobContext, held: Held) -> Outcome:
        """The outcome of a handler that raised ``exc`` (call it in the ``except`` block)."""
        if ASYNC:
            if isinstance(exc, asyncio.CancelledError) and (not ctx.cancelled or self.flags.done.is_set()):
                raise exc  # a stop at once
        return outcomes.CANCELLED if ctx.cancelled else outcomes.of_exception(exc, held.log)
