"""The parts of the worker (pgq_thin/worker/), each driven alone through its own methods, with
its collaborators passed in: the real ones, or a small stand-in that records what it is given.
The behaviour of a whole worker is in test_worker.py; these tests pin each part's own rules."""

from __future__ import annotations

import logging
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import psycopg.conninfo
import pytest

from pgq_thin import Client, ConnectionLost, Job, PermissionDenied
from pgq_thin.worker import JobContext, OutcomeUnknown, Retry, Snooze, outcomes
from pgq_thin.worker.claimer import SETTLE_MAX, ClaimNudge, PollTimer
from pgq_thin.worker.held import Held, HeldJobs, Verdict
from pgq_thin.worker.listener import concerns
from pgq_thin.worker.prefetch import AUTO_PREFETCH_DEEP, AUTO_PREFETCH_MAX, PrefetchPolicy
from pgq_thin.worker.renewer import DatabaseClock
from pgq_thin.worker.signals import Signals
from pgq_thin.worker.support import Flags, JobLog
from pgq_thin.worker.threads.claimer import Claimer
from pgq_thin.worker.threads.completer import Completer
from pgq_thin.worker.threads.executor import Executor
from pgq_thin.worker.threads.listener import Listener
from pgq_thin.worker.threads.owner import OwnerCalls
from pgq_thin.worker.threads.renewer import Renewer
from pgq_thin.worker.threads.slots import Slots

from sqlhelpers import events, expire_lease, job, one, take_over, wait_for

DEADLINE = 20.0
NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def a_job(job_id: int = 1, kind: str = "k", attempt: int = 1) -> Job:
    return Job(id=job_id, queue="default", kind=kind, payload={}, priority=0, attempt=attempt, max_attempts=25,
               run_at=NOW, created_at=NOW, lease_until=NOW + timedelta(seconds=30), tenant=None)


def held_of(registry: HeldJobs, j: Job, client: Any = None, lease: float = 30.0) -> Held:
    return registry.hold(j, JobContext(job=j, client=client, worker_name="w"), lease)


# The held-jobs registry (no database) ------------------------------------------------------------


def test_a_held_job_is_granted_its_settling_call_once_however_many_threads_ask() -> None:
    registry = HeldJobs()
    for round_ in range(50):
        held = held_of(registry, a_job(round_))
        verdicts: list[Verdict] = []
        gate = threading.Barrier(8)

        def ask(gate: threading.Barrier = gate, verdicts: list[Verdict] = verdicts, held: Held = held) -> None:
            gate.wait()
            verdicts.append(registry.settle(held))

        threads = [threading.Thread(target=ask) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert verdicts.count(Verdict.GRANTED) == 1 and verdicts.count(Verdict.GONE) == 7


def test_a_renewal_in_flight_makes_a_settle_wait_and_a_refused_one_discards_the_outcome() -> None:
    registry = HeldJobs()
    held = held_of(registry, a_job())
    assert registry.begin_renewal(held)
    assert not registry.begin_renewal(held)  # one renewal at a time
    assert registry.settle(held) is Verdict.BUSY
    registry.end_renewal(held)
    assert registry.settle(held) is Verdict.GRANTED
    assert not registry.begin_renewal(held)  # the renewer leaves a settled job alone

    lost = held_of(registry, a_job(2))
    assert registry.begin_renewal(lost)
    registry.end_renewal(lost, lost=True)
    assert lost.ctx.lease_lost.is_set() and lost.ctx.should_stop
    assert registry.settle(lost) is Verdict.GONE


def test_the_shutdown_takes_over_a_held_job_and_tells_its_handler() -> None:
    registry = HeldJobs()
    held = held_of(registry, a_job())
    assert registry.take_over(held) is Verdict.GRANTED
    assert held.ctx.lease_lost.is_set()
    assert registry.settle(held) is Verdict.GONE  # the handler's outcome, later, is discarded
    assert registry.take_over(held) is Verdict.GONE


def test_the_registry_forgets_and_knows_the_next_renewal_of_unsettled_jobs_only() -> None:
    registry = HeldJobs()
    early = held_of(registry, a_job(1), lease=3.0)
    late = held_of(registry, a_job(2), lease=30.0)
    assert len(registry) == 2 and registry.next_renewal() == early.next_renew
    registry.settle(early)
    assert registry.next_renewal() == late.next_renew
    registry.forget([early, late])
    assert not registry and registry.next_renewal() is None
    registry.forget([early])  # forgetting twice is harmless


# The prefetch policy (no database) ---------------------------------------------------------------


def test_a_fixed_prefetch_claims_free_slots_plus_waiting_places_and_refills_at_half() -> None:
    policy = PrefetchPolicy(4, concurrency=2)
    assert policy.limit() == 4
    assert policy.claim_size(assigned=0) == 6
    assert policy.claim_size(assigned=1) == 5  # a slot is idle: claim
    assert policy.claim_size(assigned=5) == 0  # all slots busy, one of four places free: wait
    assert policy.claim_size(assigned=4) == 2  # half the places free: claim
    assert policy.claim_size(assigned=6) == 0
    assert PrefetchPolicy(0, concurrency=3).claim_size(assigned=1) == 2


def test_auto_prefetch_starts_at_none_grows_for_short_jobs_and_stops_at_once_for_a_long_one() -> None:
    policy = PrefetchPolicy("auto", concurrency=4)
    assert policy.limit() == 0 and policy.claim_size(assigned=0) == 4
    policy.timed(0.001)  # 4 slots x 0.1 s / 1 ms = 400: capped
    assert policy.limit() == AUTO_PREFETCH_MAX
    policy.timed(0.5)  # a slower job counts at once
    assert policy.limit() == 0
    for _ in range(200):  # a faster one moves the estimate gradually
        policy.timed(0.01)
    assert 0 < policy.limit() <= 40


def test_auto_prefetch_grows_while_claims_come_back_full_and_shrinks_when_one_is_short() -> None:
    policy = PrefetchPolicy("auto", concurrency=4)
    policy.timed(0.0001)  # 4 slots x 0.1 s / 0.1 ms = 4,000 jobs: only the cap holds it
    assert policy.limit() == AUTO_PREFETCH_MAX
    policy.claimed(got=104, asked=104)  # a full claim: the backlog is deeper than we took
    assert policy.limit() == 2 * AUTO_PREFETCH_MAX
    for _ in range(10):
        policy.claimed(got=500, asked=500)
    assert policy.limit() == AUTO_PREFETCH_DEEP and policy.claim_size(assigned=0) == 1000  # a claim's most
    policy.claimed(got=3, asked=500)  # a short claim: the backlog is drained, or others took it
    assert policy.limit() == AUTO_PREFETCH_DEEP // 2
    for _ in range(10):
        policy.claimed(got=0, asked=10)
    assert policy.limit() == AUTO_PREFETCH_MAX  # never below where it started


def test_auto_prefetch_of_long_jobs_stays_none_however_deep_the_backlog() -> None:
    policy = PrefetchPolicy("auto", concurrency=4)
    policy.timed(0.5)  # 4 slots x 0.1 s / 0.5 s: no job may wait for a slot
    for _ in range(20):
        policy.claimed(got=4, asked=4)  # every claim full: a deep backlog
    assert policy.limit() == 0 and policy.claim_size(assigned=4) == 0 and policy.claim_size(assigned=3) == 1
    for _ in range(2000):  # the jobs turn short: the prefetch starts again from the start's cap,
        policy.timed(0.0001)  # not from one the long jobs' full claims had grown
    assert policy.limit() == AUTO_PREFETCH_MAX


def test_a_fixed_prefetch_stays_what_it_was_set_to_whatever_the_claims_bring() -> None:
    for prefetch in (0, 7):
        policy = PrefetchPolicy(prefetch, concurrency=2)
        policy.timed(0.0001)
        for _ in range(10):
            policy.claimed(got=2 + prefetch, asked=2 + prefetch)
        assert policy.limit() == prefetch and policy.claim_size(assigned=0) == 2 + prefetch


def test_prefetch_settings_out_of_range_are_refused() -> None:
    for bad in (-1, 1001, 1.5, True, "always"):
        with pytest.raises(ValueError, match="prefetch"):
            PrefetchPolicy(bad, concurrency=1)  # type: ignore[arg-type]


# Outcomes (no database) ----------------------------------------------------------------------------


class Recorder:
    """A stand-in client: records the owner calls it is asked to make."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int, dict[str, Any]]] = []

    def __getattr__(self, operation: str) -> Any:
        def call(job_id: int, attempt: int, **arguments: Any) -> bool:
            self.calls.append((operation, job_id, attempt, arguments))
            return True
        return call


def outcome_of(raise_: BaseException) -> outcomes.Outcome:
    try:
        raise raise_
    except BaseException as exc:  # noqa: BLE001
        return outcomes.of_exception(exc, JobLog(a_job()))


def test_each_handler_outcome_maps_to_one_owner_call_with_its_arguments() -> None:
    assert outcomes.of_result(None) == outcomes.Outcome("complete", batched=True)
    assert outcomes.of_result({"a": 1}) == outcomes.Outcome("complete", {"result": {"a": 1}})
    assert outcome_of(Retry(5, "later")) == outcomes.Outcome("fail", {"error": "later", "retry_in": 5})
    assert outcome_of(Snooze(7)) == outcomes.Outcome("snooze", {"delay": 7})
    assert outcome_of(OutcomeUnknown("maybe")) == outcomes.Outcome("mark_unknown", {"note": "maybe"})
    failed = outcome_of(KeyError("x"))
    assert failed.operation == "fail" and "KeyError: 'x'" in failed.arguments["error"]
    missing = outcomes.no_handler(a_job(kind="odd"), "w", ["a", "b"], JobLog(a_job()))
    assert missing.arguments["retryable"] is False and "no handler for kind 'odd'" in missing.arguments["error"]

    client = Recorder()
    outcome_of(Snooze(7)).send(client, a_job(9, attempt=3))
    assert client.calls == [("snooze", 9, 3, {"delay": 7})]


def test_the_log_says_what_became_of_each_outcome_in_a_sentence(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="pgq_thin.worker")
    outcome_of(Retry())
    outcome_of(Retry(5, "the API said 429"))
    outcome_of(Snooze(timedelta(minutes=1)))
    job = JobLog(a_job(4, attempt=2))
    outcomes.Outcome("fail").answered(job, "pending")
    outcomes.Outcome("fail").answered(job, "failed")
    messages = [r.getMessage().split(": ", 1)[1] for r in caplog.records]
    assert messages == [
        "the handler asked for a retry after the queue's backoff",
        "the handler asked for a retry in 5 s: the API said 429",
        "the handler snoozed the job for 60 s (no attempt used)",
        "failed; it will be retried after its backoff",
        "failed for good: no attempts left, or not retryable",
    ]
    assert str(Snooze(90)) == "snoozed for 90 s"


# The signal rule (no database; the real signals are in test_worker_processes.py) ---------------------


def test_the_first_signal_asks_for_a_graceful_stop_and_any_other_for_a_stop_at_once() -> None:
    asked: list[bool] = []
    signals = Signals(asked.append, lambda: bool(asked), "w")
    signals.deliver(15, signals.graceful_next())
    signals.deliver(15, signals.graceful_next())
    signals.deliver(2, signals.graceful_next())
    assert asked == [True, False, False]
    already = Signals(asked.append, lambda: True, "w")  # a stop had begun before the first signal
    assert already.graceful_next() is False


# The poll timer and the database clock (no database) -----------------------------------------------


def test_an_idle_claimer_backs_off_to_the_poll_interval_without_listen_and_polls_near_it_with() -> None:
    with pytest.raises(PermissionDenied):
        PollTimer(1.0, 0).claim_failed(PermissionDenied("permission denied for function claim", "42501"), "w")
    assert 0.1 <= PollTimer(1.0, 0).claim_failed(ConnectionLost("server closed the connection"), "w") <= 0.2
    timer = PollTimer(poll_interval=1.0, sweep_interval=0)
    assert not timer.sweep_due() and not timer.settle_due()
    assert 0.5 <= timer.until(5.0) <= 1.2  # no sweeps: only the next settle call cuts a wait short
    timer.settled(None)  # a database without pgq.settle_dependencies: nothing does
    assert timer.until(5.0) == 5.0
    timer.swept()
    assert timer.until(5.0) == 5.0
    without = [timer.claimed(0, 4, "w", listening=False) for _ in range(10)]
    assert without[0] <= 0.05 and without[-1] >= 0.5 and max(without) <= 1.0
    assert all(0.8 <= timer.claimed(0, 4, "w", listening=True) <= 1.0 for _ in range(20))
    assert timer.claimed(3, 4, "w", listening=False) == 0.0  # it took some: claim again at once
    assert timer.claimed(0, 4, "w", listening=False) <= 0.05  # ...and the idle backoff starts over
    swept = PollTimer(poll_interval=1.0, sweep_interval=0.2)
    assert swept.until(5.0) <= 0.24
    slow = PollTimer(poll_interval=4.0, sweep_interval=0)  # settles no more often than it polls
    assert 3.0 <= slow.until(10.0) <= 4.8
    slow.settled(SETTLE_MAX)  # it moved as many as it may: settle again at once
    assert slow.settle_due() and slow.until(10.0) == 0.0
    slow.settled(3)
    assert not slow.settle_due()


def test_the_database_clock_measures_leases_by_the_servers_time() -> None:
    clock = DatabaseClock()
    local = time.time()
    clock.observe(local - 0.01, datetime.fromtimestamp(local + 600, timezone.utc), local + 0.01)
    assert 599 < clock.offset < 601
    assert 29 < clock.seconds_until(datetime.fromtimestamp(time.time() + 630, timezone.utc)) <= 30
    assert clock.seconds_until(NOW) == 0.3  # long past: the shortest lease the worker plans with
    assert clock.lease_of(a_job(), 5.0) == 5.0


# The parts that talk to the database ---------------------------------------------------------------


@pytest.fixture
def client(dsn: str) -> Any:
    with Client(dsn) as c:
        yield c


def parts(client: Client) -> tuple[HeldJobs, Flags, OwnerCalls, Completer]:
    held, flags = HeldJobs(), Flags()
    owner = OwnerCalls(client, held, flags, "w")
    nudge = ClaimNudge(PollTimer(1.0, 0), threading.Event())  # (no claim loop waits on it here)
    return held, flags, owner, Completer(owner, held, flags, nudge)


def claimed(client: Client, conn: psycopg.Connection, held: HeldJobs, kind: str = "k", lease: float = 30.0) -> Held:
    conn.execute("SELECT pgq.enqueue('default', %s, '{}')", (kind,))
    [j] = client.claim("w", ["default"], lease=lease)
    return held_of(held, j, client, lease)


def test_the_executor_turns_each_handler_run_into_exactly_one_owner_call(
        client: Client, conn: psycopg.Connection) -> None:
    held, _, owner, completer = parts(client)
    executor = Executor({"value": lambda j, ctx: {"ok": 1}, "none": lambda j, ctx: None,
                         "retry": lambda j, ctx: (_ for _ in ()).throw(Retry(60))}, owner, completer, Flags())
    value, none, retry, odd = (claimed(client, conn, held, kind) for kind in ("value", "none", "retry", "odd"))
    for h in (value, none, retry, odd):
        executor.run(h)
    assert [e[0] for e in events(conn, value.job.id)] == ["claimed", "completed"]
    assert job(conn, value.job.id)["result"] == {"ok": 1}
    assert [e[0] for e in events(conn, retry.job.id)] == ["claimed", "failed"]
    assert job(conn, odd.job.id)["state"] == "failed"  # no handler: not retried
    # None joins the completer's next batch: still running, and held, until it is flushed.
    assert job(conn, none.job.id)["state"] == "running" and completer.queued == 1 and len(held) == 1
    completer.flush()
    assert [e[0] for e in events(conn, none.job.id)] == ["claimed", "completed"] and not held


def test_the_executor_sends_nothing_for_a_job_that_is_no_longer_ours(client: Client, conn: psycopg.Connection) -> None:
    held, _, owner, completer = parts(client)
    executor = Executor({"k": lambda j, ctx: "late"}, owner, completer, Flags())
    h = claimed(client, conn, held)
    assert held.begin_renewal(h)
    held.end_renewal(h, lost=True)  # as the renewer does when pgq.renew says "not yours"
    executor.run(h)
    assert [e[0] for e in events(conn, h.job.id)] == ["claimed"] and not held


def test_the_completer_thread_records_what_is_queued_until_stopped(client: Client, conn: psycopg.Connection) -> None:
    held, _, _, completer = parts(client)
    completer.start()
    try:
        batch = [claimed(client, conn, held) for _ in range(3)]
        for h in batch:
            assert completer.add(h)
        assert not completer.add(batch[0])  # settled once: a second completion is refused
        wait_for(lambda: one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'done'") == 3, "the completions")
    finally:
        completer.stop()
        completer.join(DEADLINE)
    assert not held


def test_the_renewer_extends_leases_and_tells_a_handler_whose_job_was_taken(
        client: Client, conn: psycopg.Connection) -> None:
    held, flags, _, _ = parts(client)
    renewer = Renewer(client, held, DatabaseClock(), flags, lease=2.0)
    mine = claimed(client, conn, held, lease=2.0)
    taken = claimed(client, conn, held, lease=2.0)
    before = job(conn, mine.job.id)["lease_until"]
    for h in (mine, taken):
        h.next_renew = 0.0  # due now
    assert take_over(conn, taken.job.id, "SELECT id FROM pgq.claim('thief')") == [(taken.job.id,)]
    assert renewer.renew_due() <= 0.5
    assert job(conn, mine.job.id)["lease_until"] > before and not mine.ctx.should_stop
    assert mine.next_renew > time.monotonic()
    assert taken.ctx.lease_lost.is_set() and held.settle(taken) is Verdict.GONE

    renewer.start()  # and as a thread: renews when due, until stopped
    try:
        lease = job(conn, mine.job.id)["lease_until"]
        wait_for(lambda: job(conn, mine.job.id)["lease_until"] > lease, "a renewal by the thread")
    finally:
        renewer.stop()
        renewer.join(DEADLINE)


def test_the_listener_wakes_for_our_queues_only_and_says_when_it_listens(dsn: str, conn: psycopg.Connection) -> None:
    assert concerns("a", ["a", "b"]) and concerns("x", None) and not concerns("x", ["a"])
    wakes = threading.Semaphore(0)
    listener = Listener(dsn, ["default"], wakes.release, "w", threading.Event())
    listener.start()
    try:
        assert listener.listening.wait(DEADLINE) and wakes.acquire(timeout=DEADLINE)  # woken once on LISTEN
        # One connection's notifications arrive in order: once the second has woken the listener,
        # the first was heard, and woke nobody.
        conn.execute("SELECT pg_notify('pgq', 'elsewhere')")
        conn.execute("SELECT pg_notify('pgq', 'default')")
        assert wakes.acquire(timeout=DEADLINE)
        assert not wakes.acquire(blocking=False)  # one wake-up, for our queue
    finally:
        listener.stop()
        listener.join(DEADLINE)
    assert not listener.listening.is_set()


class Taker:
    """A stand-in for the slots: takes what the claimer hands over and runs nothing."""

    def __init__(self) -> None:
        self.taken: list[Held] = []

    @property
    def assigned(self) -> int:
        return len(self.taken)

    def submit(self, held: Held) -> None:
        self.taken.append(held)

    def submit_all(self, helds: list[Held]) -> None:
        self.taken.extend(helds)


class ClaimerThread:
    """A claimer's run() in a thread of the test: ``start()``, ``stop()`` (a graceful stop),
    ``join()``; ``error``: what ended it; ``asleep``: set each time it sleeps with every place
    taken or after a claim (what it does when it has nothing to claim)."""

    def __init__(self, claimer: Claimer) -> None:
        self.claimer = claimer
        self.error: BaseException | None = None
        self.asleep = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        sleep = claimer.sleep

        def sleeping(*args: Any, **kwargs: Any) -> None:
            self.asleep.set()
            sleep(*args, **kwargs)

        claimer.sleep = sleeping  # type: ignore[method-assign]

    def _run(self) -> None:
        try:
            self.claimer.run()
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            self.error = exc
            self.claimer.flags.stopping.set()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.claimer.flags.stopping.set()
        self.claimer.nudge.wake()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.claimer, name)


def a_claimer(client: Client, held: HeldJobs, flags: Flags, owner: OwnerCalls, slots: Any,
              prefetch: int = 0, concurrency: int = 3) -> ClaimerThread:
    timer = PollTimer(0.1, 0)
    nudge = ClaimNudge(timer, threading.Event())
    completer = Completer(owner, held, flags, nudge)
    return ClaimerThread(Claimer(client, "w", ["default"], None, timer, nudge, PrefetchPolicy(prefetch, concurrency),
                                 slots, held, owner, completer, DatabaseClock(), flags, threading.Event()))


def test_the_claimer_claims_as_many_jobs_as_the_policy_allows_and_holds_them(
        client: Client, conn: psycopg.Connection) -> None:
    held, flags, owner, _ = parts(client)
    taker = Taker()
    claimer = a_claimer(client, held, flags, owner, taker, prefetch=1, concurrency=3)
    conn.execute("SELECT pgq.enqueue_many('default', 'k', array_fill('{}'::jsonb, array[6]))")
    claimer.start()
    try:
        wait_for(lambda: len(taker.taken) == 4, "three slots and one waiting place")
        claimer.asleep.clear()
        assert claimer.asleep.wait(DEADLINE)  # it went to sleep again: every place is taken
        assert len(taker.taken) == 4 and len(held) == 4  # nothing is handed back: nothing more claimed
        assert all(h.ctx.worker_name == "w" and h.lease_seconds > 25 for h in taker.taken)  # the queue's lease
    finally:
        claimer.stop()
        claimer.join(DEADLINE)
    assert claimer.error is None and flags.stopping.is_set()
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'running'") == 4


def test_the_claimer_gives_back_a_job_claimed_once_stopping_and_sweeps_expired_leases(
        client: Client, conn: psycopg.Connection) -> None:
    held, flags, owner, _ = parts(client)
    claimer = a_claimer(client, held, flags, owner, Taker())
    orphan = one(conn, "SELECT pgq.enqueue('elsewhere', 'k', '{}')")
    conn.execute("SELECT pgq.claim('crashed', array['elsewhere'])")
    expire_lease(conn, orphan)
    claimer.sweep()
    assert job(conn, orphan)["state"] == "pending"

    flags.stopping.set()
    [late] = client.claim("w", ["elsewhere"])
    claimer.hand_over_all([late])
    assert [e[0] for e in events(conn, late.id)][-1] == "released" and not held


def test_the_claimer_ends_with_the_error_a_retry_cannot_fix(dsn: str, conn: psycopg.Connection) -> None:
    conn.execute("CREATE ROLE nobody_here LOGIN")
    with Client(psycopg.conninfo.make_conninfo(dsn, user="nobody_here")) as outsider:
        held, flags, owner, _ = parts(outsider)
        claimer = a_claimer(outsider, held, flags, owner, Taker())
        claimer.start()
        claimer.join(DEADLINE)
    assert claimer.error is not None and "permission denied" in str(claimer.error)
    assert flags.stopping.is_set()


class Runs:
    """A stand-in executor: records the jobs it runs and finishes each at once."""

    def __init__(self) -> None:
        self.ran: list[int] = []

    def run(self, held: Held) -> None:
        self.ran.append(held.job.id)


def test_the_slots_run_what_they_are_handed_count_it_time_it_and_report_each_free_slot(
        client: Client, conn: psycopg.Connection) -> None:
    held, flags, owner, _ = parts(client)
    runs, freed = Runs(), threading.Semaphore(0)
    policy = PrefetchPolicy("auto", concurrency=2)
    slots = Slots(2, runs, owner, policy, flags, freed.release)  # type: ignore[arg-type]
    slots.start()
    try:
        for n in range(5):
            slots.submit_all([held_of(held, a_job(n))])
        for _ in range(5):
            assert freed.acquire(timeout=DEADLINE)
        assert sorted(runs.ran) == [0, 1, 2, 3, 4] and slots.assigned == 0
        assert policy.limit() > 0  # the runs were timed: short jobs, so a prefetch
    finally:
        slots.stop()
        slots.join(DEADLINE)

    # Once stopping, a job no slot has started is given back, not run.
    h = claimed(client, conn, held)
    flags.stopping.set()
    runs = Runs()
    stopped = Slots(1, runs, owner, policy, flags, lambda: None)  # type: ignore[arg-type]
    stopped.submit_all([h])
    assert stopped.take_waiting() == [h] and stopped.assigned == 0
    stopped.submit_all([h])
    stopped.start()
    stopped.stop()
    stopped.join(DEADLINE)
    assert [e[0] for e in events(conn, h.job.id)] == ["claimed", "released"] and runs.ran == []
