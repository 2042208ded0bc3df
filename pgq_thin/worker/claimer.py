"""The claimer: THE CLAIM LOOP. It claims as many jobs as the prefetch policy allows (free slots,
plus places for jobs that wait for a slot) with pgq.claim, hands them to the slots, sweeps now and
then (pgq.sweep), and sleeps until woken (a NOTIFY, a freed slot, its completions committed after
a short claim, stop) or the next poll. About once a second it settles the dependants whose enqueue
overlapped their dependencies' ends (pgq.settle_dependencies), so a workflow's next job starts within
a second of both commits rather than at the next sweep. After a claim that came back short, a small claim carries
the completions queued meanwhile: with some, it is one pgq.complete_and_claim (one round trip, one
commit; the claim sees them, so a key that one of them frees is claimable at once); see
Claimer.carries, and pgq_thin.worker.completer for who sends what.
After a claim that found nothing (or less than it asked for), NOTIFY wake-ups start at most about
WAKE_RATE claims a second (any login may NOTIFY pgq); its own are never held back. After a short claim on rate-limited
queues it waits for their next token as the database says (pgq_thin.worker.pace).

Written once, for asyncio (AsyncClaimer, and ClaimNudge: what wakes it); the thread runtime's
Claimer is generated from it (pgq_thin/worker/threads/claimer.py)."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Generic, Protocol, TypeVar

from pgq_thin.async_client import AsyncClient
from pgq_thin.errors import PgqError
from pgq_thin.models import Job
from pgq_thin.worker.completer import CARRY_MAX, AsyncCompleter, carries
from pgq_thin.worker.context import JobContext
from pgq_thin.worker.held import HeldJobs
from pgq_thin.worker.metrics import WorkerMetrics
from pgq_thin.worker.owner import AsyncOwnerCalls
from pgq_thin.worker.pace import RatePace
from pgq_thin.worker.prefetch import PrefetchPolicy
from pgq_thin.worker.renewer import DatabaseClock, read_clock
from pgq_thin.worker.slots import AsyncSlots
from pgq_thin.worker.support import Backoff, Delay, Flags, jitter, log, transient
from pgq_thin.worker.waits import Wakeup, watch

__all__ = ["SETTLE_INTERVAL", "SETTLE_MAX", "WAKE_BURST", "WAKE_RATE", "AsyncClaimer", "ClaimNudge", "PollTimer",
           "WakeLimit"]

#: SQLSTATE undefined_function: a database whose schema is older than this pgq-thin (no
#: pgq.complete_and_claim yet; docs/upgrading.md: migrate first, then the workers).
UNDEFINED_FUNCTION = "42883"

#: After a claim that found nothing, the claims that wake-ups start: WAKE_RATE a second at most,
#: after a burst of WAKE_BURST. Any login may NOTIFY pgq, even one without a pgq role: a flood
#: of notifications naming our queue would otherwise become a flood of empty claims.
WAKE_RATE = 100.0
WAKE_BURST = 10

#: How often (jittered; poll_interval when that is longer) the claim loop calls
#: pgq.settle_dependencies: a dependant whose enqueue overlapped its dependency's end (neither
#: transaction saw the other) is released by the first call after both committed. With nothing to
#: settle a call costs the server about 12 µs.
SETTLE_INTERVAL = 1.0
#: Dependants one call moves at most (its max_jobs); a call that moved that many is followed by
#: another at once.
SETTLE_MAX = 100


class WakeLimit:
    """A token bucket for the claims that wake-ups start on an empty queue: ``held()`` says how
    long to wait before the next one (0 while the bucket has a token). The wake-ups that come
    meanwhile are folded into that one claim: a NOTIFY is never lost, it waits at most
    1/WAKE_RATE s, and only while wake-ups come faster than that."""

    def __init__(self, rate: float | None = None, burst: int = WAKE_BURST,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = WAKE_RATE if rate is None else rate
        self.burst = float(burst)
        self.tokens = self.burst
        self.clock = clock
        self.stamp = clock()

    def held(self) -> float:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate) - 1
        self.stamp = now
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate


class PollTimer:
    """How long an idle claimer sleeps when a claim found nothing: while LISTEN works, about
    ``poll_interval`` (jittered; a NOTIFY wakes it sooner); without it, backing off from quick
    retries to poll_interval. And when the next sweep is due (``sweep_interval`` jittered; <= 0:
    never; none at start: every claim recovers expired leases first), and the next
    pgq.settle_dependencies (every SETTLE_INTERVAL, or poll_interval when that is longer, jittered).
    ``pace``: the wait for the rate limits of ``queues`` (RatePace)."""

    def __init__(self, poll_interval: float, sweep_interval: float, queues: Sequence[str] | None = None) -> None:
        self.poll_interval = poll_interval
        self.sweep_interval = sweep_interval
        self.idle = Backoff(first=min(0.05, poll_interval), cap=poll_interval)
        self.errors = Backoff(first=0.2, cap=15.0)
        self.wakes = WakeLimit()
        self.pace = RatePace(queues)
        self.next_sweep = math.inf
        self.next_settle = math.inf
        self.settling = True  # False once the database turned out to have no pgq.settle_dependencies
        # (no more often than the worker polls: a wait it cuts short ends in a claim)
        self.settle_interval = max(SETTLE_INTERVAL, poll_interval)
        self.short = False  # whether the last claim took fewer jobs than it asked for
        self.swept()

    def swept(self) -> None:
        self.next_sweep = (time.monotonic() + jitter(self.sweep_interval) if self.sweep_interval > 0
                           else math.inf)
        self.settled(0)  # a sweep settles what a settle call would

    def sweep_due(self) -> bool:
        return time.monotonic() >= self.next_sweep

    def settled(self, moved: int | None) -> None:
        """After a pgq.settle_dependencies that moved ``moved`` dependants: the next one at once
        when it moved as many as it may (more may wait), else in about SETTLE_INTERVAL; None: never
        again (the database has no such function: its schema is older than this pgq-thin)."""
        if moved is None:
            self.settling = False
        if not self.settling:
            self.next_settle = math.inf
        elif moved and moved >= SETTLE_MAX:
            self.next_settle = time.monotonic()
        else:
            self.next_settle = time.monotonic() + jitter(self.settle_interval)

    def settle_due(self) -> bool:
        return time.monotonic() >= self.next_settle

    def claim_failed(self, exc: PgqError, worker_name: str) -> float:
        """How long to wait after a claim that raised ``exc`` (an error retrying cannot fix is
        raised: it ends the run)."""
        if not transient(exc):
            raise exc
        delay = self.errors.next()
        log.warning("claim failed (%s); retrying in %.1fs", exc, delay, extra={"worker": worker_name})
        return delay

    def claimed(self, jobs: int, batch: int, worker_name: str, listening: bool, again: bool = True) -> float:
        """How long to wait after a claim that took ``jobs`` of ``batch``: none when it came back
        full (there may be more), nor when it took some and ``again`` (our completions wait to
        go with the next claim, which they may make longer: a key or a capped queue's place they
        free). A short claim otherwise waits as an empty one: what it left was not claimable, and
        a freed slot, our completions committing or a NOTIFY wakes us; polling finds scheduled
        jobs and covers a missing or broken LISTEN."""
        if log.isEnabledFor(logging.DEBUG):
            log.debug("claimed %d of %d", jobs, batch, extra={"worker": worker_name, "batch": batch, "claimed": jobs})
        self.errors.reset()
        self.short = jobs < batch
        if jobs:
            self.idle.reset()
            if not self.short or again:
                return 0.0
        return min(self.poll_interval, jitter(self.poll_interval)) if listening else self.idle.next()

    def until(self, wait: float) -> float:
        """``wait``, cut short by the next sweep or settle call."""
        return max(0.0, min(wait, min(self.next_sweep, self.next_settle) - time.monotonic()))


class Settable(Protocol):
    """An event's setting side (asyncio's Wakeup, or a threading.Event)."""

    def set(self) -> None: ...

    def clear(self) -> None: ...

    def is_set(self) -> bool: ...


W = TypeVar("W", bound=Settable)


class ClaimNudge(Generic[W]):
    """What wakes the claim loop: ``wake()`` (a NOTIFY, stop()) and ``ours()`` (a reason of our
    own: a slot freed, our completions committed), never held back by the WakeLimit, which is for
    wake-ups anyone can send. Made before the parts that wake the loop, which take it in their
    constructors (the completer); the claimer waits on it. A runtime's wake-up (``Wakeup``: an
    asyncio one, or a threading.Event) is set from the loop's thread (asyncio) or any thread."""

    def __init__(self, timer: PollTimer, wakeup: W) -> None:
        self.timer = timer
        self.wakeup = wakeup
        self.own = False  # whether the wake-up is our own: the WakeLimit does not hold it

    @property
    def short(self) -> bool:
        """Whether the last claim took fewer jobs than it asked for."""
        return self.timer.short

    def wake(self) -> None:
        self.wakeup.set()

    def ours(self) -> None:
        self.own = True
        if not self.wakeup.is_set():  # (set() costs six calls; a wake-up already set is enough)
            self.wakeup.set()

    def clear(self) -> None:
        """What wakes us from now on is news to the next claim."""
        self.own = False
        self.wakeup.clear()


class AsyncClaimer:
    """Claims for ``queues`` as ``name`` until ``flags.stopping``; ``nudge.wake()`` makes it look
    again at once. Each claim carries the completions ``completer`` has queued (when it is small,
    after a short one). An error that retrying cannot fix ends ``run()``."""

    def __init__(self, client: AsyncClient, name: str, queues: Sequence[str] | None, lease: Delay | None,
                 timer: PollTimer, nudge: ClaimNudge[Wakeup], policy: PrefetchPolicy, slots: AsyncSlots, held: HeldJobs,
                 owner: AsyncOwnerCalls, completer: AsyncCompleter, clock: DatabaseClock, flags: Flags,
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

    async def run(self) -> None:
        """The claim loop, until a stop."""
        timer, policy, slots = self.timer, self.policy, self.slots
        timer.pace.learned(await self.rate_waits())
        try:
            while not self.flags.stopping.is_set():
                if timer.sweep_due():
                    self.carry(False)
                    await self.sweep()
                    timer.swept()
                    continue  # look at the stop flag again: the sweep may have waited for a connection
                if timer.settle_due():
                    timer.settled(await self.settle())
                if self.completer.holds_back():  # our completions fall behind their calls: claim
                    # no more until a batch of them is recorded (that wakes us), or a poll later
                    await self.sleep(timer.poll_interval)
                    continue
                batch = policy.claim_size(slots.assigned)
                if batch == 0:  # every place taken: a finishing job wakes us (and, if that makes
                    # us claim, its completion goes with the claim)
                    await self.sleep(timer.poll_interval, carry=self.carries(policy.claim_size(slots.assigned - 1)))
                    continue
                self.carry(self.carries(batch))
                # What wakes us from now on is news to this claim (a wake-up set before it, by a
                # slot whose completion it carries, say, would only make an empty claim after it).
                self.nudge.clear()
                try:
                    jobs = await self.claim(batch)
                except PgqError as exc:
                    self.carry(False)
                    delay = timer.claim_failed(exc, self.name)
                    await self.owner.drop_broken_connections()
                    await self.sleep(delay)
                    continue
                if self.metrics is not None:
                    self.metrics.claimed(len(jobs))
                if jobs:
                    await self.hand_over_all(jobs)
                policy.claimed(len(jobs), batch)
                wait = timer.claimed(len(jobs), batch, self.name, self.listening.is_set(), again=self.carrying())
                quiet = False
                if timer.pace.wanted(len(jobs), batch):
                    wait, quiet = timer.pace.paced(await self.rate_waits(), wait)
                if wait:
                    await self.sleep(wait, limited=True, quiet=quiet,
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

    async def claim(self, batch: int) -> list[Job]:
        """Claim up to ``batch`` jobs (pgq.claim). With completions queued, take them and send them
        with the claim (pgq.complete_and_claim): settled here when it answers, given back to the
        completer when it fails (the error is raised)."""
        if self.kinds == []:  # no handler: nothing here could run a job
            return []
        completer = self.completer
        carried = completer.take(CARRY_MAX) if self.carries(batch) else []
        if not carried:
            return await self.client.claim(self.name, self.queues, batch=batch, lease=self.lease, kinds=self.kinds)
        try:
            answer = await self.owner.bounded.complete_and_claim(
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
            return await self.client.claim(self.name, self.queues, batch=batch, lease=self.lease, kinds=self.kinds)
        completer.settled(carried, answer.completed)
        return answer.jobs

    async def settle(self) -> int | None:
        """pgq.settle_dependencies: how many dependants it moved (0 when it failed; None when the
        database has none: its schema is older than this pgq-thin)."""
        try:
            return await self.client.settle_dependencies(max_jobs=SETTLE_MAX)
        except PgqError as exc:
            if exc.sqlstate == UNDEFINED_FUNCTION:
                return None
            log.debug("could not settle dependencies (%s)", exc, extra={"worker": self.name})
            return 0

    async def rate_waits(self) -> Mapping[str, timedelta]:
        """pgq.rate_limit_wait for our queues ({} when it fails: then we know of no rate limit)."""
        try:
            return await self.client.rate_limit_wait(self.queues)
        except PgqError as exc:
            log.debug("could not read the rate limits (%s)", exc, extra={"worker": self.name})
            return {}

    async def sleep(self, seconds: float, limited: bool = False, quiet: bool = False, carry: bool = False) -> None:
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
            await watch(self.flags.stopping, self.timer.until(seconds))
        elif await nudge.wakeup.wait(self.timer.until(seconds)) and limited and not nudge.own:
            hold = self.timer.wakes.held()
            if hold:
                self.carry(False)
                await watch(self.flags.stopping, hold)
        nudge.clear()

    async def hand_over_all(self, jobs: list[Job]) -> None:
        """Hold the jobs of one claim and hand them to the slots, or give them back if we are
        stopping. (Once per claim, not per job: the clocks, the registry's lock, the slots'.)"""
        stopping = self.flags.stopping
        if stopping.is_set():
            for job in jobs:
                await self.owner.give_back(job, "claimed during shutdown, never started")
            return
        client, name, clock = self.client, self.name, self.clock
        contexts = [JobContext(job, client, name, stopping,
                               deadline_monotonic=None if job.deadline is None else clock.monotonic_of(job.deadline))
                    for job in jobs]
        self.slots.submit_all(self.held.hold_all(jobs, contexts, clock.leases_of(jobs, self.lease)))

    async def sweep(self) -> None:
        """pgq.sweep, so expired leases recover even when nobody claims; and re-read the database
        clock, which leases are measured by, and which of our queues are rate-limited."""
        try:
            recovered = await self.client.sweep()
        except PgqError as exc:
            log.warning("sweep failed: %s", exc, extra={"worker": self.name})
            return
        if recovered:
            log.info("sweep recovered %d jobs with expired leases", recovered,
                     extra={"worker": self.name, "recovered": recovered})
        await read_clock(self.clock, self.client)
        self.timer.pace.learned(await self.rate_waits())
