# Generated from pgq_thin/worker/claimer.py by scripts/async_to_sync.py: do not edit. Edit the
# asyncio source, then run the script (tests/worker/test_worker_generated.py fails while this is stale).
"""The thread runtime's Claimer: made of the asyncio AsyncClaimer
(pgq_thin.worker.claimer), blocking a thread instead of awaiting."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from datetime import timedelta

from pgq_thin.client import Client
from pgq_thin.errors import PgqError
from pgq_thin.models import Job
from pgq_thin.worker.claimer import SETTLE_MAX, UNDEFINED_FUNCTION, ClaimNudge, PollTimer
from pgq_thin.worker.completer import CARRY_MAX, carries
from pgq_thin.worker.context import JobContext
from pgq_thin.worker.held import HeldJobs
from pgq_thin.worker.metrics import WorkerMetrics
from pgq_thin.worker.prefetch import PrefetchPolicy
from pgq_thin.worker.renewer import DatabaseClock
from pgq_thin.worker.support import Delay, Flags, log
from pgq_thin.worker.threads.completer import Completer
from pgq_thin.worker.threads.owner import OwnerCalls
from pgq_thin.worker.threads.renewer import read_clock
from pgq_thin.worker.threads.slots import Slots
from pgq_thin.worker.threads.waits import Wakeup, watch

__all__ = ["Claimer"]


class Claimer:
    """Claims for ``queues`` as ``name`` until ``flags.stopping``; ``nudge.wake()`` makes it look
    again at once. Each claim carries the completions ``completer`` has queued (when it is small,
    after a short one). An error that retrying cannot fix ends ``run()``."""

    def __init__(self, client: Client, name: str, queues: Sequence[str] | None, lease: Delay | None,
                 timer: PollTimer, nudge: ClaimNudge[Wakeup], policy: PrefetchPolicy, slots: Slots, held: HeldJobs,
                 owner: OwnerCalls, completer: Completer, clock: DatabaseClock, flags: Flags,
                 listening: threading.Event, kinds: Sequence[str] | None = None,
                 metrics: WorkerMetrics | None = None) -> None:
        self.client = client
        self.name = name
        self.queues = queues
        self.kinds = kinds  # claim only these (the worker's handlers); None: any kind
        self.lease = lease
        self.timer = timer
        self.nudge = nudge
        self.policy = policy
        self.slots = slots
        self.held = held
        self.owner = owner
        self.completer = completer  # whose completions our claims carry
        self.clock = clock
        self.flags = flags
        self.listening = listening
        self.metrics = metrics
        self.combined = True  # False once the database turned out to have no pgq.complete_and_claim

    def run(self) -> None:
        """The claim loop, until a stop."""
        timer, policy, slots = self.timer, self.policy, self.slots
        timer.pace.learned(self.rate_waits())
        try:
            while not self.flags.stopping.is_set():
                if timer.sweep_due():
                    self.carry(False)
                    self.sweep()
                    timer.swept()
                    continue  # look at the stop flag again: the sweep may have waited for a connection
                if timer.settle_due():
                    timer.settled(self.settle())
                if self.completer.holds_back():  # our completions fall behind their calls: claim
                    # no more until a batch of them is recorded (that wakes us), or a poll later
                    self.sleep(timer.poll_interval)
                    continue
                batch = policy.claim_size(slots.assigned)
                if batch == 0:  # every place taken: a finishing job wakes us (and, if that makes
                    # us claim, its completion goes with the claim)
                    self.sleep(timer.poll_interval, carry=self.carries(policy.claim_size(slots.assigned - 1)))
                    continue
                self.carry(self.carries(batch))
                # What wakes us from now on is news to this claim (a wake-up set before it, by a
                # slot whose completion it carries, say, would only make an empty claim after it).
                self.nudge.clear()
                try:
                    jobs = self.claim(batch)
                except PgqError as exc:
                    self.carry(False)
                    delay = timer.claim_failed(exc, self.name)
                    self.owner.drop_broken_connections()
                    self.sleep(delay)
                    continue
                if self.metrics is not None:
                    self.metrics.claimed(len(jobs))
                if jobs:
                    self.hand_over_all(jobs)
                policy.claimed(len(jobs), batch)
                wait = timer.claimed(len(jobs), batch, self.name, self.listening.is_set(), again=self.carrying())
                quiet = False
                if timer.pace.wanted(len(jobs), batch):
                    wait, quiet = timer.pace.paced(self.rate_waits(), wait)
                if wait:
                    self.sleep(wait, limited=True, quiet=quiet,
                                     carry=not quiet and self.carries(policy.claim_size(slots.assigned - 1)))
        finally:
            self.carry(False)  # whatever is queued now is the completer's

    def carry(self, on: bool) -> None:
        """Whether our next call carries the completions queued from now on (Completer.carry)."""
        completer = self.completer
        if completer.carried is not on and (self.combined or not on):
            completer.carry(on)

    def carries(self, batch: int) -> bool:
        """Whether a claim of ``batch`` jobs would carry our completions: a small one (carries()),
        after a claim that came back short. Then our running jobs may be what holds the claims
        back (a key at its limit, a capped queue's places), and the claim sees the completions.
        While claims come back full (a deep backlog) the completer sends them, beside the claims:
        carried, they would wait for the claim in flight and then make the next one longer."""
        return self.combined and self.timer.short and carries(batch)

    def carrying(self) -> bool:
        """Whether completions wait to go with our next claim."""
        completer = self.completer
        return completer.carried and completer.queued > 0

    def claim(self, batch: int) -> list[Job]:
        """Claim up to ``batch`` jobs (pgq.claim). With completions queued, take them and send them
        with the claim (pgq.complete_and_claim): settled here when it answers, given back to the
        completer when it fails (the error is raised)."""
        if self.kinds == []:  # no handler: nothing here could run a job
            return []
        completer = self.completer
        carried = completer.take(CARRY_MAX) if self.carries(batch) else []
        if not carried:
            return self.client.claim(self.name, self.queues, batch=batch, lease=self.lease, kinds=self.kinds)
        try:
            answer = self.owner.bounded.complete_and_claim(
                [h.job.id for h in carried], [h.job.attempt for h in carried], self.name, self.queues,
                batch=batch, lease=self.lease, kinds=self.kinds)
        except BaseException as exc:
            completer.give_back(carried)
            if not (isinstance(exc, PgqError) and exc.sqlstate == UNDEFINED_FUNCTION):
                raise
            log.warning("this database has no pgq.complete_and_claim (its pgq schema is older than this "
                        "pgq-thin: run `pgq-thin migrate`); completions are sent apart from the claims",
                        extra={"worker": self.name})
            self.combined = False
            completer.carry(False)
            return self.client.claim(self.name, self.queues, batch=batch, lease=self.lease, kinds=self.kinds)
        completer.settled(carried, answer.completed)
        return answer.jobs

    def settle(self) -> int | None:
        """pgq.settle_dependencies: how many dependants it moved (0 when it failed; None when the
        database has none: its schema is older than this pgq-thin)."""
        try:
            return self.client.settle_dependencies(max_jobs=SETTLE_MAX)
        except PgqError as exc:
            if exc.sqlstate == UNDEFINED_FUNCTION:
                return None
            log.debug("could not settle dependencies (%s)", exc, extra={"worker": self.name})
            return 0

    def rate_waits(self) -> Mapping[str, timedelta]:
        """pgq.rate_limit_wait for our queues ({} when it fails: then we know of no rate limit)."""
        try:
            return self.client.rate_limit_wait(self.queues)
        except PgqError as exc:
            log.debug("could not read the rate limits (%s)", exc, extra={"worker": self.name})
            return {}

    def sleep(self, seconds: float, limited: bool = False, quiet: bool = False, carry: bool = False) -> None:
        """Wait until woken, ``seconds`` pass or the next sweep is due. The wake-up is cleared
        *before* the next claim, so a job committed before the clear is seen by that claim.
        ``limited`` (after a claim that came back short or empty): a wake-up is held as the
        WakeLimit says.
        ``quiet`` (every queue waits for a rate limit's token): only a stop wakes us sooner.
        ``carry``: a freed slot makes us claim at once, so the completions queued meanwhile wait
        for that claim (not while a wake-up is held back); otherwise the completer sends them."""
        self.carry(carry)
        nudge = self.nudge
        if quiet:
            watch(self.flags.stopping, self.timer.until(seconds))
        elif nudge.wakeup.wait(self.timer.until(seconds)) and limited and not nudge.own:
            hold = self.timer.wakes.held()
            if hold:
                self.carry(False)
                watch(self.flags.stopping, hold)
        nudge.clear()

    def hand_over_all(self, jobs: list[Job]) -> None:
        """Hold the jobs of one claim and hand them to the slots, or give them back if we are
        stopping. (Once per claim, not per job: the clocks, the registry's lock, the slots'.)"""
        stopping = self.flags.stopping
        if stopping.is_set():
            for job in jobs:
                self.owner.give_back(job, "claimed during shutdown, never started")
            return
        client, name, clock = self.client, self.name, self.clock
        contexts = [JobContext(job, client, name, stopping,
                               deadline_monotonic=None if job.deadline is None else clock.monotonic_of(job.deadline))
                    for job in jobs]
        self.slots.submit_all(self.held.hold_all(jobs, contexts, clock.leases_of(jobs, self.lease)))

    def sweep(self) -> None:
        """pgq.sweep, so expired leases recover even when nobody claims; and re-read the database
        clock, which leases are measured by, and which of our queues are rate-limited."""
        try:
            recovered = self.client.sweep()
        except PgqError as exc:
            log.warning("sweep failed: %s", exc, extra={"worker": self.name})
            return
        if recovered:
            log.info("sweep recovered %d jobs with expired leases", recovered,
                     extra={"worker": self.name, "recovered": recovered})
        read_clock(self.clock, self.client)
        self.timer.pace.learned(self.rate_waits())
