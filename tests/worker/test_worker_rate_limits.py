"""The worker on a rate-limited queue (issue 11): after a claim that came back short, it waits for
the next token as pgq.rate_limit_wait says, rather than for its idle poll interval (an hour here)
or at every NOTIFY (a flood of them here): the jobs get done at the limit's pace with about one
claim per token. Both runtimes, a real database; the claims are counted by pg_stat_user_functions."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from pgq_thin.worker import AsyncWorker, Worker
from pgq_thin.worker.pace import RatePace

from sqlhelpers import claims, one, run_worker, wait_for

NOTIFIES = "BEGIN; NOTIFY pgq, 'q'; COMMIT; " * 200


def start_worker(runtime: str, dsn: str, settings: dict[str, Any], done: list[int],
               errors: list[BaseException]) -> tuple[Worker | AsyncWorker, threading.Thread]:
    worker: Worker | AsyncWorker = Worker(**settings) if runtime == "threads" else AsyncWorker(**settings)
    worker.handler("k")(lambda job, ctx: done.append(job.id))
    return worker, run_worker(worker, dsn, errors)


@pytest.mark.parametrize("listen", [True, False])
def test_a_worker_claims_a_rate_limited_queue_at_the_limits_pace(dsn: str, conn: psycopg.Connection,
                                                                 runtime: str, listen: bool) -> None:
    conn.execute(f"ALTER DATABASE {conninfo_to_dict(dsn)['dbname']} SET track_functions = 'pl'")
    conn.execute("SELECT pgq.configure_queue('q', rate_limit => 4, rate_period => '1 second')")
    jobs = 16
    conn.execute("SELECT pgq.enqueue_many('q', 'k', array_fill('{}'::jsonb, ARRAY[%s]))", (jobs,))
    name = f"paced-{runtime}-{listen}"
    done: list[int] = []
    errors: list[BaseException] = []
    stop_flood = threading.Event()

    def flood() -> None:  # every NOTIFY names the worker's queue: none brings a token
        with psycopg.connect(dsn, autocommit=True) as c:
            while not stop_flood.is_set():
                c.execute(NOTIFIES)

    flooder = threading.Thread(target=flood, daemon=True)
    before = claims(conn, "-")
    # It never polls (every hour) nor sweeps: without the pace, the jobs beyond the first claim's
    # burst would wait for a poll (listen=False) or go at the NOTIFYs' pace (listen=True).
    worker, thread = start_worker(runtime, dsn, {"queues": ["q"], "concurrency": 2, "poll_interval": 3600.0,
                                                 "sweep_interval": 0, "name": name, "listen": listen}, done, errors)
    if listen:
        flooder.start()
    try:
        wait_for(lambda: len(done) == jobs, f"all {jobs} jobs done", timeout=90)
    finally:
        stop_flood.set()
        worker.stop()
        thread.join(timeout=60)
        if listen:
            flooder.join(timeout=30)
    assert not thread.is_alive() and not errors, errors
    made = claims(conn, name) - before
    # 4 at once, then one token per 0.25 s: a claim per token, and one more for a batch that came
    # back full (at most two per job), plus the first. A worker woken by each NOTIFY (at most
    # WAKE_RATE, 100 a second) or spinning makes hundreds.
    assert made <= 2 * jobs + 4, f"{made} claims for {jobs} jobs"
    # And the limit held: the claimed events of the 16 jobs span at least (16 - 4 - 1) / 4 s (the
    # tokens are due one every 0.25 s on a fixed grid: the first after the burst may come at once).
    span = one(conn, "SELECT max(at) - min(at) FROM pgq.job_events WHERE event = 'claimed'")
    assert span >= timedelta(seconds=(jobs - 4 - 1) / 4 * 0.99)


def test_the_pace_waits_for_the_first_token_only_when_every_queue_waits() -> None:
    pace = RatePace(["api", "slow"])
    assert not pace.wanted(0, 5)  # nothing known to be rate-limited: no extra call
    pace.learned({"api": timedelta(0), "slow": timedelta(0)})
    assert pace.wanted(2, 5) and not pace.wanted(5, 5)
    # Both wait for a token: until the first, and nothing wakes us before.
    assert pace.paced({"api": timedelta(seconds=0.5), "slow": timedelta(seconds=2)}, 3600.0) == (0.5, True)
    assert pace.ignores("api") and pace.ignores("slow") and not pace.ignores("other")
    # One has a token (it is just empty): the usual wait, cut short by the other's token, and a
    # NOTIFY naming the empty one still wakes us.
    assert pace.paced({"api": timedelta(0), "slow": timedelta(seconds=2)}, 3600.0) == (2.0, False)
    assert not pace.ignores("api") and pace.ignores("slow")
    assert pace.paced({"api": timedelta(0), "slow": timedelta(seconds=2)}, 0.0) == (0.0, False)
    # None holds a token back: the usual wait.
    assert pace.paced({"api": timedelta(0), "slow": timedelta(0)}, 7.0) == (7.0, False)
    assert not pace.ignores("slow")
    # A worker of every queue (None) never knows that all of its queues wait.
    every = RatePace(None)
    assert every.paced({"api": timedelta(seconds=1)}, 3600.0) == (1.0, False)
    # The limit removed: the next answer has no row for it, and short claims ask no more.
    pace.learned({})
    assert not pace.wanted(0, 5)


def test_a_queue_without_rate_limits_costs_its_worker_no_call_per_claim(dsn: str, conn: psycopg.Connection) -> None:
    conn.execute(f"ALTER DATABASE {conninfo_to_dict(dsn)['dbname']} SET track_functions = 'all'")
    conn.execute("SELECT pgq.enqueue_many('q', 'k', array_fill('{}'::jsonb, ARRAY[30]))")
    done: list[int] = []
    errors: list[BaseException] = []
    worker, thread = start_worker("thread", dsn, {"queues": ["q"], "concurrency": 1, "prefetch": 0,
                                                  "sweep_interval": 0, "name": "plain"}, done, errors)
    wait_for(lambda: len(done) == 30, "all 30 jobs done", timeout=60)
    worker.stop()
    thread.join(timeout=60)
    assert not errors, errors
    claims(conn, "plain")  # the sessions gone, their counts reported
    calls = one(conn, "SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions "
                      "WHERE schemaname = 'pgq' AND funcname = 'rate_limit_wait'")
    assert calls == 1  # at start only (and after each sweep), never after a claim


def test_a_worker_of_a_limited_and_a_plain_queue_ignores_the_limited_ones_notifies_only(
        dsn: str, conn: psycopg.Connection, runtime: str) -> None:
    """While the rate-limited queue waits for its next token (a minute away), NOTIFYs naming it
    wake nobody; one naming the plain queue still brings its job at once (no poll for an hour)."""
    conn.execute(f"ALTER DATABASE {conninfo_to_dict(dsn)['dbname']} SET track_functions = 'pl'")
    conn.execute("SELECT pgq.configure_queue('q', rate_limit => 1, rate_period => '1 minute')")
    conn.execute("SELECT pgq.enqueue_many('q', 'k', array_fill('{}'::jsonb, ARRAY[3]))")
    name = f"mixed-{runtime}"
    done: list[int] = []
    errors: list[BaseException] = []
    stop_flood = threading.Event()
    sent = [0]

    def flood() -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            while not stop_flood.is_set() and sent[0] < 100_000:  # bounded in time and count
                c.execute(NOTIFIES)
                sent[0] += 1

    before = claims(conn, "-")
    worker, thread = start_worker(runtime, dsn, {"queues": ["q", "plain"], "concurrency": 2,
                                                 "poll_interval": 3600.0, "sweep_interval": 0, "name": name},
                                  done, errors)
    flooder = threading.Thread(target=flood, daemon=True)
    try:
        wait_for(lambda: len(done) == 1, "the first token's job", timeout=60)
        flooder.start()
        plain = one(conn, "SELECT pgq.enqueue('plain', 'k')")
        wait_for(lambda: plain in done, "the plain queue's job, by its NOTIFY", timeout=60)
        flooded = sent[0]
        wait_for(lambda: sent[0] >= flooded + 50, "50 more rounds of the flood (10,000 NOTIFYs)", timeout=60)
    finally:
        stop_flood.set()
        flooder.join(timeout=30)
        worker.stop()
        thread.join(timeout=60)
    assert not thread.is_alive() and not errors, errors
    made = claims(conn, name) - before
    # The first claims, the plain job's, and a few for the NOTIFYs that came before the wait
    # began; woken by each NOTIFY (WAKE_RATE, 100 a second) it would make hundreds.
    assert made <= 20, f"{made} claims"
    assert len(done) == 2
