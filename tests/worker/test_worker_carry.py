"""A worker's completions ride with its next claim (issue 25): when the claimer is about to claim
and completions are queued, it takes them and sends them in the same call
(pgq.complete_and_claim: one round trip, one commit); the completer sends the rest. Each
completion is sent once, by one of the two; what the server refuses is reported as the
completer reports it; a call that fails gives its completions back to the completer. Both
runtimes, a real database; the calls are counted by pg_stat_user_functions."""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from collections import defaultdict
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from pgq_thin import AsyncClient, Client, PgqError
from pgq_thin.models import Job
from pgq_thin.worker import AsyncWorker, JobContext, Worker
from pgq_thin.worker.claimer import AsyncClaimer, ClaimNudge, PollTimer
from pgq_thin.worker.completer import CARRY_CLAIM_MAX, CARRY_MAX, AsyncCompleter, carries
from pgq_thin.worker.held import Held, HeldJobs
from pgq_thin.worker.owner import AsyncOwnerCalls
from pgq_thin.worker.prefetch import PrefetchPolicy
from pgq_thin.worker.renewer import DatabaseClock
from pgq_thin.worker.support import Flags, transient
from pgq_thin.worker.threads.claimer import Claimer
from pgq_thin.worker.threads.completer import Completer
from pgq_thin.worker.threads.owner import OwnerCalls
from pgq_thin.worker.waits import Wakeup

from sqlhelpers import claims, events, one, run_worker, take_over, wait_for

DEADLINE = 30.0


def function_calls(conn: psycopg.Connection, name: str, function: str) -> int:
    """The calls of pgq.<function> so far (nested ones too: track_functions = 'pl'), once the
    sessions of worker ``name`` are gone."""
    claims(conn, name)  # waits for the sessions to end and clears the stats snapshot
    return int(one(conn, "SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions "
                         "WHERE schemaname = 'pgq' AND funcname = %s", (function,)))


def track_functions(dsn: str, conn: psycopg.Connection) -> None:
    conn.execute(f"ALTER DATABASE {conninfo_to_dict(dsn)['dbname']} SET track_functions = 'pl'")


def completed_once_each(conn: psycopg.Connection, jobs: int) -> None:
    """Every job done, with exactly one 'completed' event, and nothing rejected."""
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'done'") == jobs
    per_job = dict(conn.execute("SELECT job_id, count(*) FROM pgq.job_events WHERE event = 'completed'"
                                " GROUP BY job_id").fetchall())
    assert len(per_job) == jobs and set(per_job.values()) == {1}
    assert one(conn, "SELECT count(*) FROM pgq.job_events WHERE event = 'rejected'") == 0


def test_a_slots_completion_and_the_claim_of_its_keys_next_job_are_one_call(
        dsn: str, conn: psycopg.Connection, runtime: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="pgq_thin.worker")
    track_functions(dsn, conn)
    conn.execute("SELECT pgq.configure_queue('q', key_max_running => 1)")
    per_key = 25
    for key in ("a", "b"):
        conn.execute("SELECT pgq.enqueue_many('q', 'k', array_fill(jsonb_build_object('key', %s::text), ARRAY[%s]),"
                     " concurrency_key => %s)", (key, per_key, key))
    jobs = 2 * per_key
    name = f"carry-{runtime}"
    lock = threading.Lock()
    intervals: dict[str, list[tuple[float, float]]] = defaultdict(list)
    errors: list[BaseException] = []

    def handler(job: Any, ctx: Any) -> None:
        start = time.monotonic()
        time.sleep(0.002)
        with lock:
            intervals[job.payload["key"]].append((start, time.monotonic()))

    # 4 slots, 2 keys at most 1 running each: a key's next job can be claimed only once its
    # running job's completion commits. No poll (every hour), no sweep.
    settings: dict[str, Any] = {"queues": ["q"], "concurrency": 4, "poll_interval": 3600.0, "sweep_interval": 0,
                                "name": name}
    worker: Worker | AsyncWorker = Worker(**settings) if runtime == "threads" else AsyncWorker(**settings)
    worker.handler("k")(handler)
    thread = run_worker(worker, dsn, errors)
    try:
        wait_for(lambda: one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'done'") == jobs or errors,
                 f"all {jobs} jobs done", timeout=60)
    finally:
        worker.stop()
        thread.join(timeout=DEADLINE)
    assert not errors, errors
    completed_once_each(conn, jobs)
    for key, spans in intervals.items():  # the limit held
        spans.sort()
        assert len(spans) == per_key, key
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), f"key {key}: handlers overlapped"
    carried = function_calls(conn, name, "complete_and_claim")
    alone = function_calls(conn, name, "complete_many") - carried  # complete_and_claim calls it too
    made = function_calls(conn, name, "claim")  # (complete_and_claim's included)
    # Each job's completion comes with the claim of its key's next job: one call for both. (A
    # completion that came while no claim was about to be made goes alone.)
    assert carried >= jobs // 2, (carried, alone)
    assert alone <= jobs // 4, (carried, alone)
    # About one claim per job: none made only to come back empty while our completions were on
    # their way (a short claim waits for them; a wake-up the claim already answered is dropped).
    assert made <= jobs + 4, made
    messages = [r.getMessage() for r in caplog.records]
    assert sum(m.endswith(": completed") for m in messages) == jobs  # one line per job, whoever sent it


def test_each_completion_is_sent_once_whichever_part_sends_it(
        dsn: str, conn: psycopg.Connection, runtime: str, caplog: pytest.LogCaptureFixture) -> None:
    """Many short jobs with uneven run times: the claimer carries some completions, the completer
    sends the others; none is sent by both, none is lost."""
    caplog.set_level(logging.INFO, logger="pgq_thin.worker")
    track_functions(dsn, conn)
    jobs = 400
    conn.execute("SELECT pgq.enqueue_many('q', 'k', array_agg(jsonb_build_object('n', n))) "
                 "FROM generate_series(1, %s) AS n", (jobs,))
    name = f"once-{runtime}"
    errors: list[BaseException] = []

    def handler(job: Any, ctx: Any) -> None:
        if job.payload["n"] % 7 == 0:
            time.sleep(0.003)

    settings: dict[str, Any] = {"queues": ["q"], "concurrency": 4, "poll_interval": 0.05, "sweep_interval": 0,
                                "name": name}
    worker: Worker | AsyncWorker = Worker(**settings) if runtime == "threads" else AsyncWorker(**settings)
    worker.handler("k")(handler)
    thread = run_worker(worker, dsn, errors)
    try:
        wait_for(lambda: one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'done'") == jobs or errors,
                 f"all {jobs} jobs done", timeout=60)
    finally:
        worker.stop()
        thread.join(timeout=DEADLINE)
    assert not errors, errors
    completed_once_each(conn, jobs)
    messages = [r.getMessage() for r in caplog.records]
    assert sum(m.endswith(": completed") for m in messages) == jobs
    assert not [m for m in messages if "rejected" in m or "no longer ours" in m]
    # Which part sent which completion depends on timing (a loaded machine's completer may send
    # them all): the claimer's carry is driven step by step below
    # (test_the_claimer_carries_the_queued_completions_and_reports_a_refused_one). Here: every job's
    # completion went out through one of the two, once (completed_once_each above).
    assert function_calls(conn, name, "complete_and_claim") + function_calls(conn, name, "complete_many") > 0


# The parts, driven one step at a time ------------------------------------------------------------


@pytest.fixture
def client(dsn: str) -> Any:
    with Client(dsn) as c:
        yield c


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


def claim_parts(client: Any, timer: PollTimer) -> tuple[HeldJobs, Any, Taker, Any]:
    """The registry, a completer (not started: only the claimer sends) and a claimer handing
    over to a Taker, on ``client``: the thread runtime's parts on a Client, the asyncio
    runtime's on an AsyncClient."""
    held, flags = HeldJobs(), Flags()
    threads = isinstance(client, Client)
    nudge = ClaimNudge(timer, threading.Event() if threads else Wakeup())
    owner = (OwnerCalls if threads else AsyncOwnerCalls)(client, held, flags, "w")
    completer = (Completer if threads else AsyncCompleter)(owner, held, flags, nudge)
    taker = Taker()
    claimer = (Claimer if threads else AsyncClaimer)(client, "w", ["default"], None, timer, nudge,
                                                     PrefetchPolicy(0, 2), taker, held, owner, completer,
                                                     DatabaseClock(), flags, threading.Event())
    return held, completer, taker, claimer


async def answer(value: Any) -> Any:
    """What a part's call answers: awaited on the asyncio runtime."""
    return await value if inspect.isawaitable(value) else value


def short_claimed() -> PollTimer:
    """A claim loop's timer after a claim that came back short: its next claim carries (a claim
    after a full one does not: test_a_claim_after_a_full_one_carries_nothing)."""
    timer = PollTimer(0.1, 0)
    timer.claimed(1, 2, "w", listening=True)
    assert timer.short
    return timer


def stale_and_mine(client: Client, conn: psycopg.Connection) -> list[Job]:
    """Three jobs claimed by worker w; the third then expired and taken by another worker."""
    conn.execute("SELECT pgq.enqueue_many('default', 'k', array_fill('{}'::jsonb, array[5]))")
    mine = client.claim("w", ["default"], batch=3)
    assert len(mine) == 3
    assert take_over(conn, mine[2].id, "SELECT id FROM pgq.claim('thief')") == [(mine[2].id,)]
    return mine


def carried_and_reported(conn: psycopg.Connection, mine: list[Job], taken: list[Held], held: HeldJobs,
                         messages: list[str]) -> None:
    """The two completions went with the claim of the next two jobs (one statement: the same
    timestamp), the stale one was refused and reported, and nothing is held but the new jobs."""
    done = conn.execute("SELECT id, finished_at FROM pgq.jobs WHERE state = 'done' ORDER BY id").fetchall()
    assert [r[0] for r in done] == [mine[0].id, mine[1].id]
    assert len(taken) == 2
    claimed_at = {one(conn, "SELECT claimed_at FROM pgq.jobs WHERE id = %s", (h.job.id,)) for h in taken}
    assert claimed_at == {done[0][1]}
    assert [e[0] for e in events(conn, mine[2].id)] == ["claimed", "lease_expired", "claimed", "rejected"]
    assert sum(m.endswith(": completed") for m in messages) == 2
    assert sum("complete rejected: the job is no longer ours" in m for m in messages) == 1
    assert {h.job.id for h in held.jobs()} == {h.job.id for h in taken}


def test_the_claimer_carries_the_queued_completions_and_reports_a_refused_one(
        dsn: str, client: Client, conn: psycopg.Connection, runtime: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="pgq_thin.worker")
    mine = stale_and_mine(client, conn)

    async def scenario(on: Any) -> tuple[HeldJobs, Taker]:
        held, completer, taker, claimer = claim_parts(on, short_claimed())
        for j in mine:
            assert await answer(completer.add(held.hold(j, JobContext(job=j, client=on, worker_name="w"), 30.0)))
        assert completer.queued == 3
        await answer(claimer.hand_over_all(await answer(claimer.claim(2))))
        assert completer.queued == 0
        return held, taker

    async def on_asyncio() -> tuple[HeldJobs, Taker]:
        async with AsyncClient(dsn) as aclient:
            return await scenario(aclient)

    held, taker = asyncio.run(scenario(client) if runtime == "threads" else on_asyncio())
    carried_and_reported(conn, mine, taker.taken, held, [r.getMessage() for r in caplog.records])


def test_a_claim_that_fails_gives_its_carried_completions_back_to_the_completer(
        dsn: str, conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.enqueue_many('default', 'k', array_fill('{}'::jsonb, array[4]))")
    client = Client(dsn, min_size=1, max_size=1)
    try:
        held, completer, _, claimer = claim_parts(client, short_claimed())
        mine = client.claim("w", ["default"], batch=2)
        for j in mine:
            assert completer.add(held.hold(j, JobContext(job=j, client=client, worker_name="w"), 30.0))
        killed = conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname ="
                              " current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
                              ).fetchall()
        assert len(killed) == 1  # the client's one connection
        with pytest.raises(PgqError) as lost:
            claimer.claim(2)
        assert transient(lost.value)
        # Nothing was recorded; the completions are the completer's again, and it was woken.
        assert completer.queued == 2 and len(held) == 2
        assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'running'") == 2
        completer.start()
        try:
            wait_for(lambda: completer.queued == 0 and not held, "the completer to send them")
        finally:
            completer.stop()
            completer.join(DEADLINE)
    finally:
        client.close()
    for j in mine:
        assert [e[0] for e in events(conn, j.id)] == ["claimed", "completed"]
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'pending'") == 2  # the failed claim took none


def test_on_a_database_without_complete_and_claim_the_completions_go_alone(
        dsn: str, conn: psycopg.Connection, runtime: str, caplog: pytest.LogCaptureFixture) -> None:
    """A pgq schema older than this pgq-thin (docs/upgrading.md: migrate first; a worker started
    before the migration still works): the first call that would carry completions meets 42883,
    says so once, and from then on the claims go alone, the completer sends every completion."""
    caplog.set_level(logging.INFO, logger="pgq_thin.worker")
    conn.execute("DROP FUNCTION pgq.complete_and_claim(bigint[], integer[], text, text[], integer, interval, text[])")
    conn.execute("SELECT pgq.configure_queue('q', key_max_running => 1)")  # short claims: they would carry
    for key in ("a", "b"):
        conn.execute("SELECT pgq.enqueue_many('q', 'k', array_fill('{}'::jsonb, ARRAY[30]), concurrency_key => %s)",
                     (key,))
    jobs = 60
    errors: list[BaseException] = []
    settings: dict[str, Any] = {"queues": ["q"], "concurrency": 4, "poll_interval": 0.05,
                                "sweep_interval": 0, "name": f"old-{runtime}"}
    worker: Worker | AsyncWorker = Worker(**settings) if runtime == "threads" else AsyncWorker(**settings)
    worker.handler("k")(lambda job, ctx: None)
    thread = run_worker(worker, dsn, errors)
    try:
        wait_for(lambda: one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'done'") == jobs or errors,
                 f"all {jobs} jobs done", timeout=60)
    finally:
        worker.stop()
        thread.join(timeout=DEADLINE)
    assert not errors, errors
    completed_once_each(conn, jobs)
    messages = [r.getMessage() for r in caplog.records]
    assert sum("no pgq.complete_and_claim" in m for m in messages) == 1
    assert sum(m.endswith(": completed") for m in messages) == jobs


def test_a_large_claim_carries_no_completion_and_a_claim_carries_at_most_carry_max(
        client: Client, conn: psycopg.Connection) -> None:
    """pgq.complete_and_claim costs more than its two parts once both are large: a claim of more
    than CARRY_CLAIM_MAX jobs goes alone (the completer sends the completions), and a claim
    carries the oldest CARRY_MAX completions, the completer the rest (woken for them)."""
    conn.execute("SELECT pgq.enqueue_many('default', 'k', array_fill('{}'::jsonb, array[%s]))",
                 (CARRY_MAX + 5 + CARRY_CLAIM_MAX + 1,))
    held, completer, taker, claimer = claim_parts(client, short_claimed())
    mine = client.claim("w", ["default"], batch=CARRY_MAX + 5)
    for j in mine:
        assert completer.add(held.hold(j, JobContext(job=j, client=client, worker_name="w"), 30.0))
    assert not carries(CARRY_CLAIM_MAX + 1) and carries(CARRY_CLAIM_MAX)
    assert len(claimer.claim(CARRY_CLAIM_MAX + 1)) == CARRY_CLAIM_MAX + 1
    assert completer.queued == CARRY_MAX + 5  # none carried
    assert len(claimer.claim(1)) == 0  # (nothing left to claim; the completions went)
    assert completer.queued == 5 and completer._queued.is_set()  # the rest: the completer's, woken
    done = [r[0] for r in conn.execute("SELECT id FROM pgq.jobs WHERE state = 'done' ORDER BY id").fetchall()]
    assert done == sorted(j.id for j in mine[:CARRY_MAX])  # the oldest


def test_a_short_claim_claims_again_at_once_only_with_completions_to_carry() -> None:
    timer = PollTimer(5.0, 0)
    assert timer.claimed(10, 10, "w", listening=True, again=False) == 0  # full: there may be more
    assert timer.claimed(3, 10, "w", listening=True, again=True) == 0  # ours go with the next one
    assert timer.claimed(3, 10, "w", listening=True, again=False) > 1  # what it left is not claimable
    assert timer.claimed(0, 10, "w", listening=True, again=True) > 1  # (an empty one: as ever)


def test_a_claim_after_a_full_one_carries_nothing(client: Client, conn: psycopg.Connection) -> None:
    """While claims come back full (a deep backlog) the completer sends the completions beside
    them: carried, they would wait for the claim in flight and make the next one longer."""
    conn.execute("SELECT pgq.enqueue_many('default', 'k', array_fill('{}'::jsonb, array[6]))")
    timer = PollTimer(0.1, 0)
    held, completer, _, claimer = claim_parts(client, timer)
    for j in client.claim("w", ["default"], batch=2):
        assert completer.add(held.hold(j, JobContext(job=j, client=client, worker_name="w"), 30.0))
    timer.claimed(2, 2, "w", listening=True)  # the last claim came back full
    assert len(claimer.claim(2)) == 2 and completer.queued == 2
    timer.claimed(1, 2, "w", listening=True)  # ... short: the next one carries
    assert len(claimer.claim(2)) == 2 and completer.queued == 0
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'done'") == 2
