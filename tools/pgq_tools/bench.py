"""The benchmark: pgq measured beside the physical references of the same server, same run.

    from pgq_tools.bench import run_bench
    run_bench("bench/results")            # throwaway PostgreSQL, default sizes (about 10 minutes)
    run_bench("out", quick=True)          # seconds: what CI runs (tests/processes/test_bench_smoke.py)

References, measured in the same run on the same server:

- the raw SQL floor: the canonical statement (CTE ... ORDER BY run_at, id LIMIT n FOR UPDATE SKIP
  LOCKED + UPDATE ... RETURNING, then UPDATE ... SET status = 'done' WHERE id = ANY(...)) on a bare
  table with its partial index, one psycopg connection per worker thread, batch 1 and batch 10;
- the commit ceiling: pgbench, one single-row UPDATE per transaction, the same client counts.

Workloads: 1 enqueue, 2 drain, 3 enqueue-to-start latency, 4 claim latency against finished rows,
5 churn with pruning, 6 throughput while an old snapshot is held, and more (WORKLOADS), among them
``batch``: a batch's members drained beside the same plain jobs. Every drain, pgq's and the
references', is timed by one clock (``_timed_drain``): from starting its consumers to an outside
observer counting N done jobs in the database; its done count is verified. Systems are alternated
within each repetition and reported as median (min-max). The throwaway server runs with fsync on
unless ``fsync=False``; every table states the server's fsync and synchronous_commit. Writes
bench.md (the tables), bench.json (every sample) and bench.png (the chart); ``readme=`` also
copies bench.md into a page's generated block (bench/README.md).

The numbers are only meaningful as ratios to the references of the same run: absolute figures on a
shared 2-core machine move by +-10% from run to run.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import re
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from pgq_thin import calls, queries
from pgq_thin.testing.server import SERVER_SETTINGS, Databases

__all__ = ["run_bench", "BenchConfig"]

log = logging.getLogger("pgq_tools.bench")

QUEUE = "bench"

# The raw floor: the canonical job table of the seed, its partial index, its statements.
RAW_SCHEMA = """
DROP SCHEMA IF EXISTS bench_raw CASCADE;
CREATE SCHEMA bench_raw;
CREATE TYPE bench_raw.job_status AS ENUM ('pending', 'running', 'done', 'failed');
CREATE TABLE bench_raw.jobs (
  id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  queue       text        NOT NULL DEFAULT 'default',
  payload     jsonb       NOT NULL,
  status      bench_raw.job_status NOT NULL DEFAULT 'pending',
  attempts    int         NOT NULL DEFAULT 0,
  max_attempts int        NOT NULL DEFAULT 5,
  run_at      timestamptz NOT NULL DEFAULT now(),
  locked_at   timestamptz,
  locked_by   text,
  last_error  text,
  created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX jobs_pending_idx ON bench_raw.jobs (queue, run_at, id) WHERE status = 'pending';
"""

RAW_CLAIM = """
WITH next_job AS (
  SELECT id FROM bench_raw.jobs
  WHERE status = 'pending' AND queue = 'default' AND run_at <= now()
  ORDER BY run_at, id
  LIMIT %(n)s
  FOR UPDATE SKIP LOCKED
)
UPDATE bench_raw.jobs j
SET status = 'running', attempts = attempts + 1, locked_at = now(), locked_by = %(worker)s
FROM next_job
WHERE j.id = next_job.id
RETURNING j.*
"""

RAW_COMPLETE = "UPDATE bench_raw.jobs SET status = 'done', locked_at = NULL, locked_by = NULL WHERE id = ANY(%(ids)s)"

RAW_INSERT = "INSERT INTO bench_raw.jobs (payload) VALUES (%(payload)s::jsonb) RETURNING id"

#: The bulk reference: the same rows in one INSERT from an array, sent like enqueue_many's.
RAW_INSERT_MANY = ("INSERT INTO bench_raw.jobs (payload) SELECT p FROM unnest(%(payloads)b::jsonb[]) AS p"
                   " RETURNING id")

#: The enqueue statements' parameters of 0017 (issue 26) and 0018 (issue 27), for a job of no
#: workflow and no key: what the client sends by default.
NO_WORKFLOW: dict[str, Any] = {"dependency_mode": "all_done", "batch": None, "notify_finished": False,
                               "unique_keys": None, "on_conflict": "keep", "start_by": None, "max_lifetime": None,
                               "tags": None, "unique_for": None}

#: The prefetch of the "pgq worker prefetch" drain: claimed jobs that may wait for a slot.
WORKER_PREFETCH = 100

PGBENCH_SCRIPT = ("\\set aid random(1, 100000 * :scale)\n"
                  "UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = :aid;\n")


@dataclass
class BenchConfig:
    """Sizes of one run. ``quick`` sizes take seconds; the defaults take about ten minutes."""

    jobs: int = 4_000                        # jobs per drain (workload 2; the issue's 20k, scaled down)
    workers: Sequence[int] = (4, 16)         # worker threads / pgbench clients
    repeats: int = 3                         # repetitions of each drain, alternating systems
    enqueue_jobs: int = 20_000               # workload 1, bulk
    single_enqueues: int = 2_000             # workload 1, one call per job
    latency_samples: int = 40                # workload 3, per mode
    poll_interval: float = 1.0               # workload 3, the polling-only worker's poll_interval
    finished_levels: Sequence[int] = (10_000, 100_000, 1_000_000)  # workload 4
    claim_samples: int = 500                 # workload 4, claims timed per level
    churn_seconds: float = 150.0             # workload 5
    snapshot_seconds: float = 20.0           # workload 6, per phase
    pgbench_seconds: float = 5.0
    idle_queues: int = 20_000                # workload 7: idle queues beside the one with jobs
    waiting_tenants: int = 50_000            # workload 7: tenants of a fair queue holding due jobs
    many_samples: int = 200                  # workload 7: claims timed per case
    batch_jobs: int = 100_000                # workload 10: members of one batch (and as many plain jobs)
    cancel_samples: int = 50                 # workload "cancel": running jobs cancelled, per runtime

    @classmethod
    def quick(cls) -> BenchConfig:
        return cls(jobs=300, workers=(2,), repeats=1, enqueue_jobs=1_000, single_enqueues=100,
                   latency_samples=4, poll_interval=0.2, finished_levels=(1_000, 5_000), claim_samples=30,
                   churn_seconds=1.5, snapshot_seconds=0.7, pgbench_seconds=1.0, idle_queues=1_000,
                   waiting_tenants=1_000, many_samples=20, batch_jobs=2_000, cancel_samples=5)


# Small helpers ------------------------------------------------------------------------------------


def _connect(dsn: str) -> psycopg.Connection:
    return psycopg.connect(dsn, autocommit=True)


def _summary(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def _pct(values: Sequence[float], p: float) -> float:
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


def _run_threads(n: int, target: Callable[[int], None]) -> None:
    errors: list[BaseException] = []

    def wrapped(i: int) -> None:
        try:
            target(i)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            errors.append(exc)

    threads = [threading.Thread(target=wrapped, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


class _Server:
    """The server under test: a database on a throwaway PostgreSQL, or the database the caller names."""

    def __init__(self, dsn: str | None, fsync: bool = True) -> None:
        self._databases: Databases | None = None
        if dsn is None:
            # The throwaway server's settings, with fsync as asked (a later -c wins over -F).
            args = f"{SERVER_SETTINGS} -c fsync={'on' if fsync else 'off'}"
            self._databases = Databases(postgres_args=args)
            self.dsn = self._databases.create("pgq_bench")
        else:
            self.dsn = dsn

    def stop(self) -> None:
        if self._databases is not None:
            self._databases.close()


# Setup --------------------------------------------------------------------------------------------


def _prepare_database(dsn: str) -> None:
    from pgq_thin import migrate

    migrate(dsn)
    with _connect(dsn) as conn:
        conn.execute(RAW_SCHEMA)
        # The client's own description of the call: its parameters are every one the function takes.
        configure = calls.configure_queue(QUEUE, notify=True, audit=True, fair=False)
        conn.execute(configure.query, configure.params)


def _reset(conn: psycopg.Connection) -> None:
    """Empty both job tables, so that every drain starts from the same state."""
    conn.execute("TRUNCATE bench_raw.jobs, pgq.jobs, pgq.job_events, pgq.tenants")


def _set_mode(conn: psycopg.Connection, audit: bool, fair: bool = False) -> None:
    conn.execute("SELECT pgq.configure_queue(queue => %s, audit => %s, fair => %s)", (QUEUE, audit, fair))


#: Tenants the fair-mode drain spreads its jobs over.
FAIR_TENANTS = 8


def _load_pgq(conn: psycopg.Connection, n: int, tenants: int = 0) -> None:
    for start in range(0, n, 5000):
        chunk = range(start, min(n, start + 5000))
        groups = [(None, list(chunk))] if not tenants else [
            (f"tenant-{t}", [i for i in chunk if i % tenants == t]) for t in range(tenants)]
        for tenant, ids in groups:
            conn.execute(queries.ENQUEUE_MANY, {
                "queue": QUEUE, "kind": "noop", "payloads": [Jsonb({"n": i}) for i in ids],
                "run_at": None, "priority": 0, "max_attempts": None, "tenant": tenant, "max_run_time": None,
                "meta": None, "concurrency_key": None, "depends_on": None, **NO_WORKFLOW})
    conn.execute("VACUUM ANALYZE pgq.jobs")
    conn.execute("VACUUM ANALYZE pgq.job_events")


def _load_raw(conn: psycopg.Connection, n: int) -> None:
    conn.execute("INSERT INTO bench_raw.jobs (payload) SELECT jsonb_build_object('n', g) FROM generate_series(1, %s) g",
                 (n,))
    conn.execute("VACUUM ANALYZE bench_raw.jobs")


# Workload 2: drains -------------------------------------------------------------------------------


def _drain_raw(dsn: str, workers: int, batch: int) -> None:
    def work(i: int) -> None:
        with _connect(dsn) as conn:
            name = f"raw-{i}"
            while True:
                rows = conn.execute(RAW_CLAIM, {"n": batch, "worker": name}, prepare=True).fetchall()
                if not rows:
                    return
                conn.execute(RAW_COMPLETE, {"ids": [r[0] for r in rows]}, prepare=True)

    _run_threads(workers, work)


def _drain_pgq(dsn: str, workers: int, batch: int, together: bool = False) -> None:
    """W threads claim ``batch`` and complete what they claimed (one pgq.complete per job at batch
    1, one pgq.complete_many otherwise), each call a transaction; ``together``: each thread's
    completions ride with its next claim, one pgq.complete_and_claim per round (the "cc" rows)."""
    def work(i: int) -> None:
        with _connect(dsn) as conn:
            params = {"worker": f"bench-{i}", "queues": [QUEUE], "batch": batch, "lease": None, "kinds": None}
            if together:
                held: list[Any] = []
                while True:
                    rows = conn.execute(queries.COMPLETE_AND_CLAIM, {**params, "ids": [r[1] for r in held],
                                                                     "attempts": [r[6] for r in held]},
                                        prepare=True).fetchall()
                    held = [r for r in rows if r[1] is not None]
                    if not held:
                        return
            while True:
                rows = conn.execute(queries.CLAIM, params, prepare=True).fetchall()
                if not rows:
                    return
                if batch == 1:
                    for r in rows:
                        conn.execute(queries.COMPLETE, {"id": r[0], "attempt": r[5], "result": None}, prepare=True)
                else:
                    conn.execute(queries.COMPLETE_MANY, {"ids": [r[0] for r in rows],
                                                         "attempts": [r[5] for r in rows]}, prepare=True)

    _run_threads(workers, work)


def _drain_worker(dsn: str, workers: int, stop: threading.Event, **settings: Any) -> None:
    """The Worker runtime with its defaults (and ``concurrency=workers``), but for ``settings``:
    started here (pool, LISTEN and all), stopped when ``stop`` is set."""
    from pgq_thin.worker import Worker

    worker = Worker(queues=[QUEUE], concurrency=workers, name="bench-worker", **settings)

    @worker.handler("noop")
    def noop(job: Any, ctx: Any) -> None:
        return None

    thread = threading.Thread(target=worker.run, args=(dsn,), kwargs={"install_signal_handlers": False}, daemon=True)
    thread.start()
    try:
        stop.wait(600)
    finally:
        worker.stop()
        thread.join(timeout=30)


def _done_count(conn: psycopg.Connection, system: str) -> int:
    if system.startswith("raw"):
        sql = "SELECT count(*) FROM bench_raw.jobs WHERE status = 'done'"
    else:
        sql = "SELECT count(*) FROM pgq.jobs WHERE state = 'done' AND queue = 'bench'"
    return int(conn.execute(sql, prepare=True).fetchone()[0])  # type: ignore[index]


DRAIN_SYSTEMS = ("raw b1", "raw b10", "pgq b1", "pgq b10", "pgq b1 audit off", "pgq b10 audit off",
                 "pgq b1 cc", "pgq b10 cc", "pgq b10 fair", "pgq worker", "pgq worker prefetch")

#: How often the outside observer of a drain counts the done jobs (the timing's resolution).
OBSERVER_POLL = 0.005


def _consumers(dsn: str, system: str, workers: int, stop: threading.Event) -> None:
    """Run ``system``'s consumers until the queue is empty (threads) or ``stop`` is set (Worker)."""
    if system == "raw b1":
        _drain_raw(dsn, workers, 1)
    elif system == "raw b10":
        _drain_raw(dsn, workers, 10)
    elif system.startswith("pgq b10"):
        _drain_pgq(dsn, workers, 10, system.endswith(" cc"))
    elif system.startswith("pgq b1"):
        _drain_pgq(dsn, workers, 1, system.endswith(" cc"))
    elif system == "pgq worker":
        _drain_worker(dsn, workers, stop)
    elif system == "pgq worker prefetch":
        _drain_worker(dsn, workers, stop, prefetch=WORKER_PREFETCH)
    else:
        raise ValueError(f"unknown drain system {system!r}")


def _timed_drain(dsn: str, system: str, workers: int, n: int) -> float:
    """Seconds from starting ``system``'s consumers (connections, pools, LISTEN and all) to the
    moment an outside observer's count of done jobs in the database first reaches ``n``. Every
    system is timed this way: the same clock, the same observer, polling every OBSERVER_POLL s."""
    stop = threading.Event()
    errors: list[BaseException] = []
    ended = threading.Event()

    def run() -> None:
        try:
            _consumers(dsn, system, workers, stop)
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)
        finally:
            ended.set()

    with _connect(dsn) as observer:
        thread = threading.Thread(target=run, daemon=True)
        started = time.perf_counter()
        thread.start()
        try:
            while True:
                done = _done_count(observer, system)
                elapsed = time.perf_counter() - started
                if done >= n:
                    break
                if errors:
                    raise errors[0]
                if ended.is_set() and _done_count(observer, system) < n:
                    raise RuntimeError(f"{system}: the consumers stopped with {done} of {n} jobs done")
                if elapsed > 600:
                    raise RuntimeError(f"{system}: {done} of {n} jobs done after 600 s")
                time.sleep(OBSERVER_POLL)
        finally:
            stop.set()
            thread.join(timeout=60)
    if errors:
        raise errors[0]
    return elapsed


def _one_drain(dsn: str, system: str, workers: int, n: int) -> float:
    """Load n jobs, drain them with ``system``, verify the done count; jobs per second."""
    with _connect(dsn) as conn:
        _reset(conn)
        fair = system.endswith("fair")
        _set_mode(conn, "audit off" not in system, fair)
        if system.startswith("raw"):
            _load_raw(conn, n)
        else:
            _load_pgq(conn, n, FAIR_TENANTS if fair else 0)
    elapsed = _timed_drain(dsn, system, workers, n)
    with _connect(dsn) as conn:
        done = _done_count(conn, system)
        _set_mode(conn, True)
    if done != n:
        raise RuntimeError(f"{system}: {done} jobs done in the database, expected {n}")
    return n / elapsed


def _pgbench(dsn: str, clients: int, seconds: float, workdir: Path) -> float:
    script = workdir / "update.sql"
    script.write_text(PGBENCH_SCRIPT)
    pgbench = shutil.which("pgbench") or "/usr/bin/pgbench"
    proc = subprocess.run([pgbench, "-n", "-M", "prepared", "-c", str(clients), "-j", str(min(clients, 2)),
                           "-T", str(max(1, round(seconds))), "-f", str(script), dsn],
                          capture_output=True, text=True, check=True)
    match = re.search(r"tps = ([\d.]+) \(without initial connection time\)", proc.stdout)
    if not match:
        raise RuntimeError(f"cannot read pgbench's tps from: {proc.stdout}")
    return float(match.group(1))


def _pgbench_init(dsn: str) -> None:
    pgbench = shutil.which("pgbench") or "/usr/bin/pgbench"
    subprocess.run([pgbench, "-i", "-q", "-s", "1", dsn], capture_output=True, text=True, check=True)


def _drains(dsn: str, cfg: BenchConfig, workdir: Path, systems: Sequence[str]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for w in cfg.workers:
        samples: dict[str, list[float]] = {s: [] for s in (*systems, "pgbench")}
        for rep in range(cfg.repeats):
            # Alternate: each repetition starts with a different system.
            order = list(systems[rep % len(systems):]) + list(systems[:rep % len(systems)])
            for system in order:
                rate = _one_drain(dsn, system, w, cfg.jobs)
                samples[system].append(rate)
                log.info("drain W=%d %-18s %8.0f jobs/s", w, system, rate)
            tps = _pgbench(dsn, w, cfg.pgbench_seconds, workdir)
            samples["pgbench"].append(tps)
            log.info("drain W=%d %-18s %8.0f tps", w, "pgbench", tps)
        results[str(w)] = {s: {**_summary(v), "samples": v} for s, v in samples.items()}
    return results


# Workload 1: enqueue ------------------------------------------------------------------------------


PRODUCERS = 8
PRODUCERS_ON = f"enqueue, {PRODUCERS} producers, notify on"
PRODUCERS_OFF = f"enqueue, {PRODUCERS} producers, notify off"


def _concurrent_enqueues(dsn: str, producers: int, total: int) -> float:
    """``producers`` connections each committing single enqueues (autocommit); jobs per second."""
    each = max(1, total // producers)

    def work(i: int) -> None:
        with _connect(dsn) as conn:
            for n in range(each):
                conn.execute(queries.ENQUEUE, {"queue": QUEUE, "kind": "noop", "payload": Jsonb({"n": n}),
                                               "run_at": None, "priority": 0, "max_attempts": None,
                                               "unique_key": None, "tenant": None, "max_run_time": None,
                                               "meta": None, "concurrency_key": None,
                                               "depends_on": None, **NO_WORKFLOW}, prepare=True)

    t = time.perf_counter()
    _run_threads(producers, work)
    return each * producers / (time.perf_counter() - t)


def _enqueue(dsn: str, cfg: BenchConfig) -> dict[str, Any]:
    out: dict[str, list[float]] = {"enqueue_many (1000 per call)": [], "raw INSERT of 1000 rows": [],
                                   "enqueue (one per call)": [], "raw single-row INSERT": []}
    with _connect(dsn) as conn:
        for _ in range(cfg.repeats):
            _reset(conn)
            payloads = [Jsonb({"n": i}) for i in range(1000)]
            t = time.perf_counter()
            for _ in range(cfg.enqueue_jobs // 1000):
                conn.execute(queries.ENQUEUE_MANY, {"queue": QUEUE, "kind": "noop", "payloads": payloads,
                                                    "run_at": None, "priority": 0, "max_attempts": None,
                                                    "tenant": None, "max_run_time": None, "meta": None,
                                                    "concurrency_key": None,
                                                    "depends_on": None, **NO_WORKFLOW}, prepare=True)
            out["enqueue_many (1000 per call)"].append((cfg.enqueue_jobs // 1000) * 1000 / (time.perf_counter() - t))
            _reset(conn)
            t = time.perf_counter()
            for _ in range(cfg.enqueue_jobs // 1000):
                conn.execute(RAW_INSERT_MANY, {"payloads": payloads}, prepare=True).fetchall()
            out["raw INSERT of 1000 rows"].append((cfg.enqueue_jobs // 1000) * 1000 / (time.perf_counter() - t))
            for label in ("raw single-row INSERT", "enqueue (one per call)"):
                _reset(conn)
                t = time.perf_counter()
                for i in range(cfg.single_enqueues):
                    if label.startswith("raw"):
                        conn.execute(RAW_INSERT, {"payload": Jsonb({"n": i})}, prepare=True)
                    else:
                        conn.execute(queries.ENQUEUE, {"queue": QUEUE, "kind": "noop", "payload": Jsonb({"n": i}),
                                                       "run_at": None, "priority": 0, "max_attempts": None,
                                                       "unique_key": None, "tenant": None, "max_run_time": None,
                                                       "meta": None, "concurrency_key": None,
                                                       "depends_on": None, **NO_WORKFLOW},
                                     prepare=True)
                out[label].append(cfg.single_enqueues / (time.perf_counter() - t))
            # TESTING.md 17: the commit-lock cost of NOTIFY. A transaction that notifies takes a
            # global lock at commit; with many producers committing one enqueue each, compare the
            # queue with notify on and off (alternating which goes first).
            modes = (True, False) if len(out.get(PRODUCERS_ON, [])) % 2 == 0 else (False, True)
            for notify in modes:
                _reset(conn)
                conn.execute("SELECT pgq.configure_queue(queue => %s, notify => %s)", (QUEUE, notify))
                out.setdefault(PRODUCERS_ON if notify else PRODUCERS_OFF, []).append(
                    _concurrent_enqueues(dsn, PRODUCERS, cfg.single_enqueues))
            conn.execute("SELECT pgq.configure_queue(queue => %s, notify => true)", (QUEUE,))
        _reset(conn)
    for k, v in out.items():
        log.info("enqueue %-30s %8.0f jobs/s", k, statistics.median(v))
    return {k: {**_summary(v), "samples": v} for k, v in out.items()}


# Workload 3: enqueue-to-start latency -------------------------------------------------------------


def _listening_backends(conn: psycopg.Connection) -> int:
    return int(conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                            " AND query = 'LISTEN pgq'").fetchone()[0])  # type: ignore[index]


def latency_modes(cfg: BenchConfig) -> dict[str, dict[str, Any]]:
    """The two latency rows; the table shows each one's poll_interval and idle time. With LISTEN, each job is
    enqueued 50 ms after the previous one started (the worker is idle, waiting for a NOTIFY).
    Polling only, each job is enqueued after the worker has been idle for twice its poll_interval
    (its idle backoff has reached poll_interval by then) plus a random part of one interval, so
    that the sample falls anywhere in a poll period."""
    p = cfg.poll_interval
    return {
        "LISTEN": {"listen": True, "poll_interval": 1.0, "idle": 0.05, "spread": 0.0},
        "polling only": {"listen": False, "poll_interval": p, "idle": 2 * p, "spread": p},
    }


def _latency(dsn: str, cfg: BenchConfig) -> dict[str, Any]:
    from pgq_thin.worker import Worker

    results: dict[str, Any] = {}
    rng = random.Random(7)
    for key, mode in latency_modes(cfg).items():
        with _connect(dsn) as conn:
            _reset(conn)
        starts: dict[int, float] = {}
        worker = Worker(queues=[QUEUE], concurrency=4, name="bench-latency", listen=mode["listen"],
                        poll_interval=mode["poll_interval"])

        @worker.handler("noop")
        def noop(job: Any, ctx: Any, starts: dict[int, float] = starts) -> None:  # this iteration's dict
            starts[job.id] = time.time()

        thread = threading.Thread(target=worker.run, args=(dsn,), kwargs={"install_signal_handlers": False},
                                  daemon=True)
        thread.start()
        committed: dict[int, float] = {}
        try:
            with _connect(dsn) as conn:
                # A first job shows the worker is up (and, with LISTEN, listening): not a sample.
                deadline = time.monotonic() + 30
                while mode["listen"] and _listening_backends(conn) == 0 and time.monotonic() < deadline:
                    time.sleep(0.01)
                warm = conn.execute(queries.ENQUEUE, {
                    "queue": QUEUE, "kind": "noop", "payload": Jsonb({"n": -1}), "run_at": None, "priority": 0,
                    "max_attempts": None, "unique_key": None, "tenant": None,
                    "max_run_time": None, "meta": None, "concurrency_key": None,
                    "depends_on": None, **NO_WORKFLOW}).fetchone()[0]  # type: ignore[index]
                while warm not in starts and time.monotonic() < deadline:
                    time.sleep(0.001)
                for i in range(cfg.latency_samples):
                    # Idle again before the next one (a busy worker would claim it at once).
                    time.sleep(mode["idle"] + rng.uniform(0, mode["spread"]))
                    job_id = conn.execute(queries.ENQUEUE, {
                        "queue": QUEUE, "kind": "noop", "payload": Jsonb({"n": i}), "run_at": None, "priority": 0,
                        "max_attempts": None, "unique_key": None, "tenant": None, "max_run_time": None,
                        "meta": None, "concurrency_key": None,
                        "depends_on": None, **NO_WORKFLOW}).fetchone()[0]  # type: ignore[index]
                    committed[job_id] = time.time()  # autocommit: the COMMIT has returned
                    deadline = time.monotonic() + 5 + 2 * mode["poll_interval"]
                    while job_id not in starts and time.monotonic() < deadline:
                        time.sleep(0.001)
        finally:
            worker.stop()
            thread.join(timeout=30)
        lat = [(starts[j] - committed[j]) * 1000 for j in committed if j in starts]
        results[key] = {"p50_ms": _pct(lat, 50), "p95_ms": _pct(lat, 95), "p99_ms": _pct(lat, 99),
                        "max_ms": max(lat), "n": len(lat), "missing": len(committed) - len(lat), **mode}
        log.info("latency %-34s p50 %.1f ms p95 %.1f ms", key, results[key]["p50_ms"], results[key]["p95_ms"])
    return results


# Workload 4: claim latency against finished rows --------------------------------------------------


def _plans_of_claim(conn: psycopg.Connection,
                    claim: str = "SELECT * FROM pgq.claim('bench-plan', ARRAY['bench'], 1)") -> list[str]:
    """The plans PL/pgSQL actually runs inside pgq.claim, from auto_explain (superuser only)."""
    plans: list[str] = []

    def collect(diag: psycopg.errors.Diagnostic) -> None:
        if diag.message_primary and "Query Text" in diag.message_primary:
            plans.append(diag.message_primary)

    try:
        conn.execute("LOAD 'auto_explain'")
    except psycopg.Error:
        return ["(auto_explain unavailable: not a superuser)"]
    conn.add_notice_handler(collect)
    try:
        conn.execute("SET auto_explain.log_min_duration = 0")
        conn.execute("SET auto_explain.log_nested_statements = on")
        conn.execute("SET auto_explain.log_analyze = on")
        conn.execute("SET client_min_messages = log")
        conn.execute("BEGIN")
        conn.execute(claim).fetchall()
        conn.execute("ROLLBACK")
    finally:
        conn.execute("RESET client_min_messages")
        conn.execute("SET auto_explain.log_min_duration = -1")
        conn.remove_notice_handler(collect)
    return plans


def _claim_latency(dsn: str, cfg: BenchConfig) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with _connect(dsn) as conn:
        _reset(conn)
        have = 0
        for level in cfg.finished_levels:
            conn.execute(
                "INSERT INTO pgq.jobs (queue, kind, state, attempt, max_attempts, finished_at, last_event)"
                " SELECT 'bench', 'noop', 'done', 1, 25, now() - interval '1 minute', 'completed'"
                " FROM generate_series(1, %s)", (level - have,))
            have = level
            conn.execute("DELETE FROM pgq.jobs WHERE state <> 'done'")
            _load_pgq(conn, cfg.claim_samples + 10)
            try:  # measure the claim, not the checkpoint that loading a million rows sets off
                conn.execute("CHECKPOINT")
            except psycopg.Error:
                pass  # not a superuser (--dsn): the checkpointer will get there
            params = {"worker": "bench-claim", "queues": [QUEUE], "batch": 1, "lease": None, "kinds": None}
            claim_ms, complete_ms = [], []
            for _ in range(cfg.claim_samples):
                t = time.perf_counter()
                row = conn.execute(queries.CLAIM, params, prepare=True).fetchone()
                t2 = time.perf_counter()
                assert row is not None
                conn.execute(queries.COMPLETE, {"id": row[0], "attempt": row[5], "result": None}, prepare=True)
                complete_ms.append((time.perf_counter() - t2) * 1000)
                claim_ms.append((t2 - t) * 1000)
            plans = _plans_of_claim(conn)
            size = conn.execute("SELECT pg_total_relation_size('pgq.jobs')").fetchone()[0]  # type: ignore[index]
            results[str(level)] = {"claim_ms": _summary(claim_ms), "complete_ms": _summary(complete_ms),
                                   "jobs_table_bytes": size, "plans": plans}
            log.info("claim latency with %8d finished rows: %.3f ms (complete %.3f ms)", level,
                     statistics.median(claim_ms), statistics.median(complete_ms))
        _reset(conn)
    return results


# Workload 7: claims beside idle queues and many waiting tenants -----------------------------------

#: The fair queue of workload 7.
FAIR_QUEUE = "bench-fair"


#: Claims (batch 1) timed one by one inside the server, each job completed after: what the claim
#: itself costs, without the round trip and the commit's flush (on a loaded 2-CPU machine those
#: vary by milliseconds and would hide a difference of a tenth of one).
MANY_LOOP = """
DO $$
DECLARE
    r record;
    t timestamptz;
    ms float8[] := '{}';
BEGIN
    FOR i IN 1..%s LOOP
        t := clock_timestamp();
        SELECT c.id, c.attempt INTO r FROM pgq.claim('bench-many', %s::text[], 1) AS c;
        ms := ms || extract(epoch FROM clock_timestamp() - t)::float8 * 1000;
        IF r.id IS NULL THEN
            RAISE EXCEPTION 'a timed claim found no job';
        END IF;
        PERFORM pgq.complete(r.id, r.attempt);
    END LOOP;
    PERFORM set_config('bench.claim_ms', array_to_string(ms, ','), false);
END $$"""


def _timed_claims(conn: psycopg.Connection, queues: list[str] | None, samples: int) -> list[float]:
    """Milliseconds of each of ``samples`` claims (batch 1) of ``queues`` (MANY_LOOP)."""
    queue_list = "NULL" if queues is None else "ARRAY[" + ", ".join(f"'{q}'" for q in queues) + "]"
    conn.execute(MANY_LOOP % (int(samples), queue_list))
    return [float(x) for x in conn.execute("SELECT current_setting('bench.claim_ms')").fetchone()[0].split(",")]  # type: ignore[index]


def _many_queues_and_tenants(dsn: str, cfg: BenchConfig) -> dict[str, Any]:
    """The claim's cost beside what it must not read: claim(queues => NULL) with one queue holding
    jobs, alone and beside cfg.idle_queues queues without jobs; a fair queue's claim with 5 tenants
    holding due jobs and with cfg.waiting_tenants. Each pair in this run, the small case first (the
    reference); the plans of the big cases (auto_explain) are kept in bench.json."""
    samples = cfg.many_samples
    res: dict[str, Any] = {}
    with _connect(dsn) as conn:
        _reset(conn)
        conn.execute("DELETE FROM pgq.queues WHERE name <> %s", (QUEUE,))
        _load_pgq(conn, 2 * samples + 40)
        _timed_claims(conn, None, 20)  # warm-up: the session's first claims plan and check the fence
        res["claim(queues => NULL), 1 queue"] = {"claim_ms": _summary(_timed_claims(conn, None, samples))}
        conn.execute("INSERT INTO pgq.queues (name) SELECT 'bench-idle-' || i FROM generate_series(1, %s) AS i",
                     (cfg.idle_queues,))
        conn.execute("VACUUM ANALYZE pgq.queues")
        res[f"claim(queues => NULL), 1 queue + {cfg.idle_queues:,} idle"] = {
            "claim_ms": _summary(_timed_claims(conn, None, samples)),
            "plans": _plans_of_claim(conn, "SELECT * FROM pgq.claim('bench-plan')")}
        t = time.perf_counter()
        conn.execute("SELECT count(*) FROM pgq.stats()").fetchone()
        res["stats_ms_with_idle_queues"] = (time.perf_counter() - t) * 1000
        conn.execute("DELETE FROM pgq.queues WHERE name LIKE 'bench-idle-%'")

        _reset(conn)
        conn.execute("SELECT pgq.configure_queue(%s, fair => true, audit => true)", (FAIR_QUEUE,))
        conn.execute("SELECT pgq.enqueue_many(%s, 'noop', array_fill('{}'::jsonb, ARRAY[%s]), tenant => 't' || i)"
                     " FROM generate_series(1, 5) AS i", (FAIR_QUEUE, samples))
        conn.execute("VACUUM ANALYZE pgq.jobs")
        conn.execute("VACUUM ANALYZE pgq.tenants")
        res["fair claim, 5 tenants"] = {"claim_ms": _summary(_timed_claims(conn, [FAIR_QUEUE], samples))}
        _reset(conn)
        conn.execute("SELECT pgq.enqueue(%s, 'noop', tenant => 't' || i) FROM generate_series(1, %s) AS i",
                     (FAIR_QUEUE, cfg.waiting_tenants))
        conn.execute("VACUUM ANALYZE pgq.jobs")
        conn.execute("VACUUM ANALYZE pgq.tenants")
        res[f"fair claim, {cfg.waiting_tenants:,} tenants"] = {
            "claim_ms": _summary(_timed_claims(conn, [FAIR_QUEUE], samples)),
            "plans": _plans_of_claim(conn, f"SELECT * FROM pgq.claim('bench-plan', ARRAY['{FAIR_QUEUE}'], 1)")}
        _reset(conn)
        conn.execute("SELECT pgq.drop_queue(%s)", (FAIR_QUEUE,))
    for k, v in res.items():
        if isinstance(v, dict):
            log.info("%-50s claim %.3f ms", k, v["claim_ms"]["median"])
    return res


# Workload 8: drains on limited queues (per-key concurrency, rate limit) -------------------------

#: The limited drains' queue, its keys and limits.
LIMITED_QUEUE = "bench-limited"
LIMITED_KEYS = 16
KEY_MAX_RUNNING = 2
RATE_LIMIT = 200  # jobs per second
FAST_RATE_LIMIT = 2000  # jobs per second: 16 shards, whose claimers spend side by side


def _limited_load(conn: psycopg.Connection, n: int, keys: int) -> None:
    conn.execute("TRUNCATE pgq.jobs, pgq.job_events")
    for k in range(keys):  # n jobs, spread evenly over the keys
        conn.execute("SELECT pgq.enqueue_many(%s, 'noop', ARRAY(SELECT jsonb_build_object('n', g)"
                     " FROM generate_series(1, %s) AS g), concurrency_key => %s)",
                     (LIMITED_QUEUE, n // keys + (k < n % keys), f"key-{k}"))
    conn.execute("VACUUM ANALYZE pgq.jobs")


def _limited_drain(dsn: str, workers: int, n: int, batch: int = 10) -> dict[str, Any]:
    """Drain the limited queue's n jobs with ``workers`` threads (claim batch, complete_many); an
    empty claim while jobs remain (every key full, or no token) waits 1 ms and claims again. A
    sampler counts the most running jobs of one key every 2 ms, from before the first claim (a small
    drain could otherwise end while the sampler still connects, and it would see none). Jobs per
    second by the wall clock."""
    stop = threading.Event()
    sampling = threading.Event()
    most = {"per_key": 0, "samples": 0, "empty_claims": 0, "done": 0}
    lock = threading.Lock()

    def sampler() -> None:
        with _connect(dsn) as conn:
            while not stop.is_set():
                row = conn.execute("SELECT coalesce(max(c), 0) FROM (SELECT count(*) AS c FROM pgq.jobs"
                                   " WHERE queue = %s AND state = 'running' GROUP BY concurrency_key) AS s",
                                   (LIMITED_QUEUE,), prepare=True).fetchone()
                most["per_key"] = max(most["per_key"], int(row[0]))  # type: ignore[index]
                most["samples"] += 1
                sampling.set()
                stop.wait(0.002)

    def work(i: int) -> None:
        with _connect(dsn) as conn:
            params = {"worker": f"limited-{i}", "queues": [LIMITED_QUEUE], "batch": batch, "lease": None,
                      "kinds": None}
            while True:
                rows = conn.execute(queries.CLAIM, params, prepare=True).fetchall()
                if rows:
                    done = conn.execute(queries.COMPLETE_MANY, {"ids": [r[0] for r in rows],
                                                                "attempts": [r[5] for r in rows]},
                                        prepare=True).fetchall()
                    with lock:
                        most["done"] += len(done)
                    continue
                with lock:  # (counted by the threads: a count(*) of the table per empty claim cost CPU)
                    if most["done"] >= n:
                        return
                    most["empty_claims"] += 1
                time.sleep(0.001)

    watcher = threading.Thread(target=sampler, daemon=True)
    watcher.start()
    if not sampling.wait(timeout=30):
        raise RuntimeError("limited drain: the sampler took no sample in 30 s")
    started = time.perf_counter()
    try:
        _run_threads(workers, work)
    finally:
        elapsed = time.perf_counter() - started
        stop.set()
        watcher.join(timeout=10)
    with _connect(dsn) as conn:
        done = conn.execute("SELECT count(*) FROM pgq.jobs WHERE queue = %s AND state = 'done'",
                            (LIMITED_QUEUE,)).fetchone()[0]  # type: ignore[index]
        # Claims per second in the busiest whole second, and the sustained rate after the burst.
        claimed = [r[0] for r in conn.execute(
            "SELECT extract(epoch FROM e.at)::float8 FROM pgq.job_events AS e JOIN pgq.jobs AS j ON j.id = e.job_id"
            " WHERE j.queue = %s AND e.event = 'claimed' ORDER BY e.at", (LIMITED_QUEUE,))]
    if done != n:
        raise RuntimeError(f"limited drain: {done} jobs done, expected {n}")
    busiest = 0
    lo = 0
    for hi, t in enumerate(claimed):  # the most claims in any window of one second
        while claimed[lo] <= t - 1.0:
            lo += 1
        busiest = max(busiest, hi - lo + 1)
    return {"jobs_per_s": n / elapsed, "seconds": elapsed, "most_running_per_key": most["per_key"],
            "samples": most["samples"], "empty_claims": most["empty_claims"], "busiest_second": busiest,
            "claims_seen": len(claimed)}


def _limited_drains(dsn: str, cfg: BenchConfig) -> dict[str, Any]:
    """Drains of one queue with the same jobs (LIMITED_KEYS keys) and workers: without limits (the
    reference, in this run), with key_max_running KEY_MAX_RUNNING, and with a rate limit of
    RATE_LIMIT and of FAST_RATE_LIMIT a second (n: 3 s of tokens after the burst). Alternating,
    cfg.repeats times."""
    workers = max(cfg.workers)
    cases: dict[str, tuple[dict[str, Any], int]] = {
        "no limit": ({"key_max_running": 0, "rate_limit": 0}, cfg.jobs),
        f"key_max_running {KEY_MAX_RUNNING}": ({"key_max_running": KEY_MAX_RUNNING, "rate_limit": 0}, cfg.jobs),
        f"rate_limit {RATE_LIMIT}/s": ({"key_max_running": 0, "rate_limit": RATE_LIMIT}, 4 * RATE_LIMIT),
        f"rate_limit {FAST_RATE_LIMIT}/s": ({"key_max_running": 0, "rate_limit": FAST_RATE_LIMIT},
                                            4 * FAST_RATE_LIMIT),
    }
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in cases}
    with _connect(dsn) as conn:
        conn.execute("SELECT pgq.configure_queue(%s, audit => true)", (LIMITED_QUEUE,))
    for r in range(cfg.repeats):
        for name, (settings, n) in (list(cases.items()) if r % 2 == 0 else list(reversed(cases.items()))):
            with _connect(dsn) as conn:
                conn.execute("SELECT pgq.configure_queue(%s, key_max_running => %s, rate_limit => %s,"
                             " rate_period => '1 second')",
                             (LIMITED_QUEUE, settings["key_max_running"], settings["rate_limit"]))
                _limited_load(conn, n, LIMITED_KEYS)
            runs[name].append(_limited_drain(dsn, workers, n))
    with _connect(dsn) as conn:
        conn.execute("TRUNCATE pgq.jobs, pgq.job_events")
        conn.execute("SELECT pgq.drop_queue(%s)", (LIMITED_QUEUE,))
    res: dict[str, Any] = {"workers": workers, "keys": LIMITED_KEYS}
    for name, rs in runs.items():
        n = cases[name][1]
        res[name] = {"jobs": n, "jobs_per_s": _summary([x["jobs_per_s"] for x in rs]),
                     "seconds": min(x["seconds"] for x in rs),
                     # The rate limit's floor: after its burst of r, one token per 1/r s.
                     "min_seconds": ((n - cases[name][0]["rate_limit"]) / cases[name][0]["rate_limit"]
                                     if cases[name][0]["rate_limit"] else 0.0),
                     "most_running_per_key": max(x["most_running_per_key"] for x in rs),
                     "busiest_second": max(x["busiest_second"] for x in rs),
                     "samples": sum(x["samples"] for x in rs), "empty_claims": sum(x["empty_claims"] for x in rs)}
        log.info("%-28s %8.0f jobs/s, most running per key %d, busiest second %d", name,
                 res[name]["jobs_per_s"]["median"], res[name]["most_running_per_key"], res[name]["busiest_second"])
    return res


# Workload 9: the Worker on a queue with one running job per key --------------------------------

KEYED_QUEUE = "bench_keyed"
KEYED_KEYS = 16
KEYED_LIMIT = 1
KEYED_SLEEP = 0.002  # seconds per handler
#: How the jobs' keys follow one another in the queue's order: round-robin, or each key's jobs in
#: one run (the head of the queue is then one key's, and the claims must walk past it).
KEYED_ORDERS = ("interleaved", "blocks")


def _keyed_load(conn: psycopg.Connection, n: int, keys: int, order: str) -> None:
    conn.execute("TRUNCATE pgq.jobs, pgq.job_events")
    key = "mod(g, %s)" if order == "interleaved" else "(g - 1) * %s / " + str(n)
    conn.execute(f"SELECT pgq.enqueue(%s, 'keyed', jsonb_build_object('key', 'key-' || ({key})),"
                 f" concurrency_key => 'key-' || ({key})) FROM generate_series(1, %s) AS g",
                 (KEYED_QUEUE, keys, keys, n))
    conn.execute("VACUUM ANALYZE pgq.jobs")


def _most_at_once(intervals: Sequence[tuple[float, float]]) -> int:
    """The most of these (start, end) intervals open at one moment (an end before a start at a tie)."""
    events = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def _keyed_drain(dsn: str, workers: int, n: int) -> dict[str, Any]:
    """The Worker with its defaults (concurrency ``workers``) drains the keyed queue's n jobs, whose
    handler sleeps KEYED_SLEEP; every handler's (start, end) is recorded, per key. Timed like the
    other drains: from the Worker's start to an outside observer's count of done jobs reaching n."""
    from pgq_thin.worker import Worker

    intervals: dict[str, list[tuple[float, float]]] = {}
    lock = threading.Lock()
    worker = Worker(queues=[KEYED_QUEUE], concurrency=workers, name="bench-keyed")

    @worker.handler("keyed")
    def keyed(job: Any, ctx: Any) -> None:
        start = time.monotonic()
        time.sleep(KEYED_SLEEP)
        end = time.monotonic()
        with lock:
            intervals.setdefault(job.payload["key"], []).append((start, end))

    errors: list[BaseException] = []

    def run() -> None:
        try:
            worker.run(dsn, install_signal_handlers=False)
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    with _connect(dsn) as observer:
        thread = threading.Thread(target=run, daemon=True)
        started = time.perf_counter()
        thread.start()
        try:
            while True:
                done = int(observer.execute("SELECT count(*) FROM pgq.jobs WHERE queue = %s AND state = 'done'",
                                            (KEYED_QUEUE,), prepare=True).fetchone()[0])  # type: ignore[index]
                elapsed = time.perf_counter() - started
                if done >= n or errors:
                    break
                if elapsed > 600:
                    raise RuntimeError(f"keyed drain: {done} of {n} jobs done after 600 s")
                time.sleep(OBSERVER_POLL)
        finally:
            worker.stop()
            thread.join(timeout=60)
    if errors:
        raise errors[0]
    handled = sum(len(v) for v in intervals.values())
    if handled != n:
        raise RuntimeError(f"keyed drain: {handled} handlers ran, expected {n}")
    return {"jobs_per_s": n / elapsed, "most_running_per_key": max(_most_at_once(v) for v in intervals.values())}


def _keyed_drains(dsn: str, cfg: BenchConfig) -> dict[str, Any]:
    """The same n jobs over KEYED_KEYS keys, in each KEYED_ORDERS order, drained by the Worker at
    each of cfg.workers: on a queue without a limit (the reference, in this run) and with
    key_max_running KEYED_LIMIT. Alternating, cfg.repeats times. The ceiling of a drain is
    min(W, keys × limit) / sleep jobs a second (W / sleep without a limit)."""
    cases = {"no limit": 0, f"key_max_running {KEYED_LIMIT}": KEYED_LIMIT}
    runs: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for r in range(cfg.repeats):
        for order in KEYED_ORDERS:
            for w in cfg.workers:
                for name, limit in (list(cases.items()) if r % 2 == 0 else list(reversed(cases.items()))):
                    with _connect(dsn) as conn:
                        conn.execute("SELECT pgq.configure_queue(%s, key_max_running => %s, audit => false)",
                                     (KEYED_QUEUE, limit))
                        _keyed_load(conn, cfg.jobs, KEYED_KEYS, order)
                    runs.setdefault((order, w, name), []).append(_keyed_drain(dsn, w, cfg.jobs))
    with _connect(dsn) as conn:
        conn.execute("TRUNCATE pgq.jobs, pgq.job_events")
        conn.execute("SELECT pgq.drop_queue(%s)", (KEYED_QUEUE,))
    rows = []
    for (order, w, name), rs in runs.items():
        limit = cases[name]
        ceiling = (min(w, KEYED_KEYS * limit) if limit else w) / KEYED_SLEEP
        rate = _summary([x["jobs_per_s"] for x in rs])
        rows.append({"order": order, "workers": w, "queue": name, "jobs_per_s": rate, "ceiling": ceiling,
                     "of_ceiling": rate["median"] / ceiling,
                     "most_running_per_key": max(x["most_running_per_key"] for x in rs)})
        log.info("keyed %-11s W%-3d %-18s %8.0f jobs/s (%.2f of %g), most running of one key %d", order, w, name,
                 rate["median"], rows[-1]["of_ceiling"], ceiling, rows[-1]["most_running_per_key"])
    return {"jobs": cfg.jobs, "keys": KEYED_KEYS, "limit": KEYED_LIMIT, "sleep_ms": KEYED_SLEEP * 1000,
            "rows": rows}


# Workload 10: a batch's members drained beside the same plain jobs -------------------------------

#: Where the batch's callback goes: another queue, so that the drain neither claims it nor counts it.
BATCH_CALLBACK_QUEUE = "bench-batch-done"
BATCH_CASES = ("plain", "batch")


def _batch_load(conn: psycopg.Connection, n: int, batch: int | None) -> None:
    """n no-op jobs in QUEUE, 5,000 per enqueue_many, members of ``batch`` (None: plain jobs)."""
    for start in range(0, n, 5000):
        conn.execute("SELECT count(*) FROM pgq.enqueue_many(queue => %s, kind => 'noop',"
                     " payloads => ARRAY(SELECT jsonb_build_object('n', g)"
                     " FROM generate_series(%s::integer, %s::integer) AS g),"
                     " batch => %s::bigint)", (QUEUE, start + 1, min(n, start + 5000), batch))
    conn.execute("VACUUM ANALYZE pgq.jobs")


def _batch_drain(dsn: str, case: str, workers: int, n: int) -> dict[str, Any]:
    """Load n jobs (``case`` "batch": members of a batch opened before and sealed after the load),
    drain them like "pgq b10" (threads claiming batch 10, one complete_many per claim), timed by
    _timed_drain; for the batch, count its callback jobs and compare their meta with the data."""
    with _connect(dsn) as conn:
        _reset(conn)
        conn.execute("TRUNCATE pgq.batch_members, pgq.batch_counts, pgq.batches")  # the last run's batch
        _set_mode(conn, True)
        batch = None
        if case == "batch":
            batch = conn.execute("SELECT pgq.batch_open(callback_queue => %s, callback_kind => 'batch_done')",
                                 (BATCH_CALLBACK_QUEUE,)).fetchone()[0]  # type: ignore[index]
        _batch_load(conn, n, batch)
        if batch is not None:
            conn.execute("SELECT pgq.batch_close(%s)", (batch,))
    seconds = _timed_drain(dsn, "pgq b10", workers, n)
    out: dict[str, Any] = {"jobs_per_s": n / seconds}
    with _connect(dsn) as conn:
        done = _done_count(conn, "pgq b10")
        if done != n:
            raise RuntimeError(f"batch drain ({case}): {done} jobs done in the database, expected {n}")
        if batch is not None:
            # The last member's end enqueues the callback (the last ends take turns on the batch
            # row); should it not have, the sweep run here would (not timed: after the drain).
            def callbacks() -> list[tuple[Any, ...]]:
                return conn.execute("SELECT id, meta -> 'batch' FROM pgq.jobs WHERE queue = %s"
                                    " AND (meta -> 'batch' ->> 'id')::bigint = %s",
                                    (BATCH_CALLBACK_QUEUE, batch)).fetchall()

            rows = callbacks()
            by = "end" if rows else "sweep"
            if not rows:
                conn.execute("SELECT pgq.sweep()")
                rows = callbacks()
            status = conn.execute("SELECT state, callback_job_id FROM pgq.batch_status(%s)", (batch,)).fetchone()
            expected = {"id": batch, "members": n, "done": n, "failed": 0, "cancelled": 0}
            out.update(callbacks=len(rows), by=by, meta_matches=len(rows) == 1 and rows[0][1] == expected,
                       status=status[0] if status else None,
                       status_matches=bool(status and rows and status[1] == rows[0][0]))
    return out


def _batch_drains(dsn: str, cfg: BenchConfig) -> dict[str, Any]:
    """cfg.batch_jobs members of one batch against as many plain jobs, drained the same way by each
    of cfg.workers, alternating which comes first, cfg.repeats times. The member-end bookkeeping is
    O(1) if the batch drains at the plain rate, within the spread."""
    res: dict[str, Any] = {"jobs": cfg.batch_jobs}
    for w in cfg.workers:
        runs: dict[str, list[dict[str, Any]]] = {c: [] for c in BATCH_CASES}
        for r in range(cfg.repeats):
            for case in (BATCH_CASES if r % 2 == 0 else tuple(reversed(BATCH_CASES))):
                runs[case].append(_batch_drain(dsn, case, w, cfg.batch_jobs))
                log.info("batch W=%d %-6s %8.0f jobs/s", w, case, runs[case][-1]["jobs_per_s"])
        rates = {c: [x["jobs_per_s"] for x in rs] for c, rs in runs.items()}
        plain, batch = _summary(rates["plain"]), _summary(rates["batch"])
        res[str(w)] = {"plain": {**plain, "samples": rates["plain"]}, "batch": {**batch, "samples": rates["batch"]},
                       "ratio": batch["median"] / plain["median"],
                       "within_spread": batch["median"] >= plain["min"],
                       "callbacks": [x["callbacks"] for x in runs["batch"]],
                       "callback_by": [x["by"] for x in runs["batch"]],
                       "meta_matches": all(x["meta_matches"] for x in runs["batch"]),
                       "status": sorted({x["status"] for x in runs["batch"]}),
                       "status_matches": all(x["status_matches"] for x in runs["batch"])}
        log.info("batch W=%d: members / plain %.2f; callbacks per batch %s, enqueued by %s", w,
                 res[str(w)]["ratio"], res[str(w)]["callbacks"], res[str(w)]["callback_by"])
    with _connect(dsn) as conn:
        _reset(conn)
        conn.execute("TRUNCATE pgq.batch_members, pgq.batch_counts, pgq.batches")
    return res


# Workloads 5 and 6: churn with pruning, and an old snapshot ---------------------------------------


# Workload "cancel": pgq.cancel's COMMIT to the running handler seeing it ------------------------

#: The lease of the cancel workload's jobs: no regular renewal comes during a sample (one is due at
#: a third of it), so only the pgq_cancel notification can tell the handler.
CANCEL_LEASE = 600.0
CANCEL_RUNTIMES = {"Worker": "a plain handler in a thread: ctx.lease_lost.wait() returns, ctx.cancelled true",
                   "AsyncWorker": "an async def handler: asyncio.CancelledError"}


def _cancel_worker(runtime: str, seen: dict[int, float], started: dict[int, float]) -> Any:
    """A worker of ``runtime`` whose handler ``hold`` notes when it starts and when it sees its
    job cancelled (time.time())."""
    from pgq_thin.worker import AsyncWorker, Worker

    def hold(job: Any, ctx: Any) -> None:
        started[job.id] = time.time()
        if ctx.lease_lost.wait(60) and ctx.cancelled:
            seen[job.id] = time.time()

    async def hold_async(job: Any, ctx: Any) -> None:
        started[job.id] = time.time()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            if ctx.cancelled:
                seen[job.id] = time.time()
            raise

    kind = Worker if runtime == "Worker" else AsyncWorker
    worker = kind(queues=[QUEUE], concurrency=4, name="bench-cancel", lease=CANCEL_LEASE)
    worker.handler("hold")(hold if runtime == "Worker" else hold_async)
    return worker


def _wait_until(condition: Callable[[], Any], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.0005)
    return True


def _cancel_samples(dsn: str, runtime: str, samples: int) -> dict[str, Any]:
    """One runtime's row of the cancel workload (_cancel_latency)."""
    with _connect(dsn) as conn:
        _reset(conn)
    seen: dict[int, float] = {}
    started: dict[int, float] = {}
    worker = _cancel_worker(runtime, seen, started)

    def run() -> None:
        if runtime == "Worker":
            worker.run(dsn, install_signal_handlers=False)
        else:
            asyncio.run(worker.run(dsn, install_signal_handlers=False))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    committed: dict[int, float] = {}
    try:
        with _connect(dsn) as conn:
            _wait_until(lambda: _listening_backends(conn) > 0, 30)
            for _ in range(samples):
                job_id = int(conn.execute("SELECT pgq.enqueue(queue => %s, kind => 'hold')",
                                          (QUEUE,)).fetchone()[0])  # type: ignore[index]
                if not _wait_until(lambda: job_id in started, 30):  # noqa: B023 - used in this iteration
                    continue
                conn.execute("SELECT pgq.cancel(%s)", (job_id,))
                committed[job_id] = time.time()  # autocommit: the COMMIT has returned
                _wait_until(lambda: job_id in seen, 5)  # noqa: B023 - used in this iteration
            cancelled = conn.execute("SELECT count(*) FROM pgq.jobs WHERE state = 'cancelled'").fetchone()
    finally:
        worker.stop()
        thread.join(timeout=30)
    lat = [(seen[j] - committed[j]) * 1000 for j in committed if j in seen]
    figures = {"p50_ms": _pct(lat, 50) if lat else None, "p95_ms": _pct(lat, 95) if lat else None,
               "max_ms": max(lat) if lat else None, "n": len(lat), "missing": len(committed) - len(lat),
               "cancelled": int(cancelled[0]) if cancelled else 0, "handler": CANCEL_RUNTIMES[runtime]}
    log.info("cancel %-12s p50 %s ms p95 %s ms (%d of %d seen)", runtime, figures["p50_ms"], figures["p95_ms"],
             len(lat), len(committed))
    return figures


def _cancel_latency(dsn: str, cfg: BenchConfig) -> dict[str, Any]:
    """Per runtime: ``cancel_samples`` jobs, each cancelled (pgq.cancel, autocommit: the time is
    taken when its COMMIT has returned) once its handler runs; the time until the handler sees it.
    The worker's path: NOTIFY pgq_cancel on its LISTEN connection, a renewal of that job at once
    (refused: the proof), then the handler is told."""
    results: dict[str, Any] = {runtime: _cancel_samples(dsn, runtime, cfg.cancel_samples)
                               for runtime in CANCEL_RUNTIMES}
    results["lease_s"] = CANCEL_LEASE
    return results


def _sizes(conn: psycopg.Connection) -> dict[str, float]:
    row = conn.execute(
        "SELECT pg_relation_size('pgq.jobs'), pg_indexes_size('pgq.jobs'), pg_total_relation_size('pgq.job_events'),"
        " (SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'pgq.jobs'::regclass),"
        " (SELECT count(*) FROM pgq.jobs)").fetchone()
    assert row is not None
    return {"jobs_table_bytes": row[0], "jobs_indexes_bytes": row[1], "events_total_bytes": row[2],
            "jobs_dead_tuples": row[3], "jobs_rows": row[4]}


def _churn(dsn: str, seconds: float, workers: int = 4, sample_every: float = 2.0) -> dict[str, Any]:
    """Producer, W claimers (batch 10 + complete_many) and a pruner run for ``seconds``;
    sizes are sampled as they go. Returns the throughput and the samples."""
    stop = threading.Event()
    done_count = [0] * workers
    sample_every = min(sample_every, max(seconds / 4, 0.2))

    def producer(_: int) -> None:
        with _connect(dsn) as conn:
            payloads = [Jsonb({"n": i}) for i in range(100)]
            while not stop.is_set():
                pending = conn.execute("SELECT count(*) FROM pgq.jobs WHERE state = 'pending'").fetchone()[0]  # type: ignore[index]
                if pending < 2000:
                    conn.execute(queries.ENQUEUE_MANY, {"queue": QUEUE, "kind": "noop", "payloads": payloads,
                                                        "run_at": None, "priority": 0, "max_attempts": None,
                                                        "tenant": None, "max_run_time": None,
                                                        "meta": None, "concurrency_key": None,
                                                        "depends_on": None, **NO_WORKFLOW}, prepare=True)
                else:
                    time.sleep(0.005)

    def consumer(i: int) -> None:
        with _connect(dsn) as conn:
            params = {"worker": f"churn-{i}", "queues": [QUEUE], "batch": 10, "lease": None, "kinds": None}
            while not stop.is_set():
                rows = conn.execute(queries.CLAIM, params, prepare=True).fetchall()
                if not rows:
                    time.sleep(0.005)
                    continue
                conn.execute(queries.COMPLETE_MANY, {"ids": [r[0] for r in rows], "attempts": [r[5] for r in rows]},
                             prepare=True)
                done_count[i] += len(rows)

    def pruner(_: int) -> None:
        with _connect(dsn) as conn:
            while not stop.wait(0.5):
                conn.execute(queries.PRUNE, {"older_than": "0 seconds", "max_jobs": 100000})

    samples: list[dict[str, float]] = []
    threads = [threading.Thread(target=producer, args=(0,), daemon=True),
               threading.Thread(target=pruner, args=(0,), daemon=True)]
    threads += [threading.Thread(target=consumer, args=(i,), daemon=True) for i in range(workers)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    with _connect(dsn) as conn:
        while True:
            elapsed = time.perf_counter() - started
            samples.append({"t": round(elapsed, 2), "done": sum(done_count), **_sizes(conn)})
            if elapsed >= seconds:
                break
            time.sleep(min(sample_every, max(0.0, seconds - elapsed)))
    stop.set()
    for t in threads:
        t.join(timeout=30)
    elapsed = time.perf_counter() - started
    return {"seconds": elapsed, "jobs_per_s": sum(done_count) / elapsed, "samples": samples}


def _churn_workload(dsn: str, cfg: BenchConfig) -> dict[str, Any]:
    with _connect(dsn) as conn:
        _reset(conn)
        conn.execute("VACUUM pgq.jobs")
    result = _churn(dsn, cfg.churn_seconds)
    first, last = result["samples"][0], result["samples"][-1]
    log.info("churn: %.0f jobs/s over %.0f s; jobs table %d -> %d kB, indexes %d -> %d kB", result["jobs_per_s"],
             result["seconds"], first["jobs_table_bytes"] // 1024, last["jobs_table_bytes"] // 1024,
             first["jobs_indexes_bytes"] // 1024, last["jobs_indexes_bytes"] // 1024)
    return result


def _snapshot_workload(dsn: str, cfg: BenchConfig) -> dict[str, Any]:
    with _connect(dsn) as conn:
        _reset(conn)
        conn.execute("VACUUM pgq.jobs")
    phases: dict[str, Any] = {}
    holder = psycopg.connect(dsn)
    try:
        holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM pgq.queues").fetchone()  # takes the snapshot
        phases["while an old snapshot is held"] = _churn(dsn, cfg.snapshot_seconds)
    finally:
        holder.rollback()
        holder.close()
    phases["after it ends"] = _churn(dsn, cfg.snapshot_seconds)
    for k, v in phases.items():
        log.info("old snapshot: %-30s %.0f jobs/s, dead tuples at the end %s", k, v["jobs_per_s"],
                 v["samples"][-1]["jobs_dead_tuples"])
    return phases


# Report -------------------------------------------------------------------------------------------


def _fmt_rate(s: dict[str, float]) -> str:
    return f"{s['median']:,.0f} ({s['min']:,.0f}–{s['max']:,.0f})"


def _markdown(res: dict[str, Any]) -> str:
    fs = f"fsync {res['fsync']}, synchronous_commit {res['synchronous_commit']}"
    load = res.get("load_average", {})
    lines = [f"pgq benchmark, started {res['started']}, finished {res.get('finished', '?')}, on "
             f"{res.get('server', 'a server')}: PostgreSQL {res['server_version']}, **{fs}**, {res['cpus']} CPUs, "
             f"load average {load.get('before', '?')} before the start and {load.get('after', '?')} at the end; "
             f"{res['config']['jobs']} jobs per drain, {res['config']['repeats']} repetitions (median (min–max))", ""]
    if "machine" in res:  # runs recorded before the machine was written down lack these
        lines += [f"Machine: {res['machine']}; the server and the benchmark's clients share it.", "",
                  f"Server settings: {res['server_settings']}.", ""]
    if "drain" in res:
        lines += [f"### Drain (jobs/s; pgbench: transactions/s; {fs})", "",
                  "Every drain: wall clock from starting its consumers to an outside observer counting N done "
                  f"jobs in the database (polled every {res.get('observer_poll_ms', OBSERVER_POLL * 1000):g} ms).", "",
                  "| system | W | jobs/s | × raw b1 | × raw b10 |", "|---|---:|---:|---:|---:|"]
        for w, systems in res["drain"].items():
            raw1 = systems.get("raw b1", {}).get("median")
            raw10 = systems.get("raw b10", {}).get("median")
            for name, s in systems.items():
                r1 = f"{s['median'] / raw1:.2f}" if raw1 else "–"
                r10 = f"{s['median'] / raw10:.2f}" if raw10 else "–"
                lines.append(f"| {name} | {w} | {_fmt_rate(s)} | {r1} | {r10} |")
        lines.append("")
    if "enqueue" in res:
        lines += [f"### Enqueue (one connection unless stated; {fs})", "", "| how | jobs/s |", "|---|---:|"]
        for k, s in res["enqueue"].items():
            lines.append(f"| {k} | {_fmt_rate(s)} |")
        e = res["enqueue"]
        lines += ["", f"enqueue_many / raw INSERT of 1000 rows: "
                      f"{e['enqueue_many (1000 per call)']['median'] / e['raw INSERT of 1000 rows']['median']:.2f}; "
                      f"single enqueue / raw single-row INSERT: "
                      f"{e['enqueue (one per call)']['median'] / e['raw single-row INSERT']['median']:.2f}"]
        if PRODUCERS_ON in e:
            lines += [f"NOTIFY's commit-lock cost, {PRODUCERS} producers: notify on / off: "
                      f"{e[PRODUCERS_ON]['median'] / e[PRODUCERS_OFF]['median']:.2f}"]
        lines += [""]
    if "latency" in res:
        lines += [f"### Enqueue COMMIT to handler start (worker with 4 idle slots; {fs})", "",
                  "| mode | poll_interval | worker idle before each job | p50 ms | p95 ms | p99 ms | max ms | n |",
                  "|---|---:|---|---:|---:|---:|---:|---:|"]
        for k, s in res["latency"].items():
            idle = (f"{s['idle'] * 1000:.0f} ms" if not s.get("spread")
                    else f"{s['idle']:g} s + random 0–{s['spread']:g} s")
            lines.append(f"| {k} | {s['poll_interval']:g} s | {idle} | {s['p50_ms']:.1f} | {s['p95_ms']:.1f} |"
                         f" {s['p99_ms']:.1f} | {s['max_ms']:.1f} | {s['n']} |")
        lines.append("")
    if "cancel" in res:
        c = res["cancel"]
        lines += [f"### pgq.cancel COMMIT to the running handler seeing it (worker with 4 slots, lease "
                  f"{c['lease_s']:g} s; {fs})", "",
                  "| runtime | the handler sees it by | p50 ms | p95 ms | max ms | n | not seen |",
                  "|---|---|---:|---:|---:|---:|---:|"]
        for k, x in c.items():
            if isinstance(x, dict):
                figures = " | ".join("–" if x[f] is None else f"{x[f]:.1f}" for f in ("p50_ms", "p95_ms", "max_ms"))
                lines.append(f"| {k} | {x['handler']} | {figures} | {x['n']} | {x['missing']} |")
        lines += ["", "pgq.cancel's commit sends NOTIFY pgq_cancel '<id>:<attempt>'; the worker's LISTEN connection "
                      "hears it, the worker renews that job at once (refused: the proof, since any login may "
                      "NOTIFY), then tells the handler. The lease is long, so no regular renewal helps. Without "
                      "LISTEN (pooled) the next renewal tells it, at a third of the lease.", ""]
    if "claim_latency" in res:
        lines += [f"### Claim latency (batch 1, one connection) against finished rows ({fs})", "",
                  "| finished rows | claim ms | complete ms | jobs table |", "|---:|---:|---:|---:|"]
        levels = list(res["claim_latency"].items())
        for k, s in levels:
            lines.append(f"| {int(k):,} | {s['claim_ms']['median']:.3f} | {s['complete_ms']['median']:.3f} |"
                         f" {s['jobs_table_bytes'] / 2**20:.1f} MiB |")
        base, top = levels[0][1]["claim_ms"]["median"], levels[-1][1]["claim_ms"]["median"]
        lines += ["", f"claim at {int(levels[-1][0]):,} / at {int(levels[0][0]):,}: {top / base:.2f}", ""]
    if "churn" in res:
        c = res["churn"]
        s0, s1 = c["samples"][0], c["samples"][-1]
        peak = max(s["jobs_table_bytes"] + s["jobs_indexes_bytes"] for s in c["samples"])
        lines += [f"### Churn with pruning (4 claimers batch 10, producer, prune every 0.5 s; {fs})", "",
                  f"{c['jobs_per_s']:,.0f} jobs/s over {c['seconds']:.0f} s; jobs table + indexes "
                  f"{(s0['jobs_table_bytes'] + s0['jobs_indexes_bytes']) / 2**20:.1f} → "
                  f"{(s1['jobs_table_bytes'] + s1['jobs_indexes_bytes']) / 2**20:.1f} MiB (peak {peak / 2**20:.1f}); "
                  f"events {s1['events_total_bytes'] / 2**20:.1f} MiB; "
                  f"dead tuples at the end {s1['jobs_dead_tuples']}", ""]
    if "many" in res:
        m = res["many"]
        cases = [(k, v) for k, v in m.items() if isinstance(v, dict)]
        lines += [f"### Claims beside idle queues and waiting tenants (batch 1, timed inside the server; {fs})", "",
                  "| case | claim ms | × the small case |", "|---|---:|---:|"]
        for i, (k, v) in enumerate(cases):
            ref = cases[i - i % 2][1]["claim_ms"]["median"]
            lines.append(f"| {k} | {v['claim_ms']['median']:.3f} | {v['claim_ms']['median'] / ref:.2f} |")
        lines += ["", f"pgq.stats() with the idle queues: {m['stats_ms_with_idle_queues']:.1f} ms (one row per queue)",
                  ""]
    if "limits" in res:
        lim = res["limits"]
        ref = lim["no limit"]["jobs_per_s"]["median"]
        lines += [f"### Drains on a limited queue ({lim['workers']} threads claiming batch 10, {lim['keys']} keys; "
                  f"{fs})", "",
                  "| queue | jobs | jobs/s | × no limit | most running of one key | fastest drain s (limit's floor) |"
                  " most claims in one second |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for k, v in lim.items():
            if isinstance(v, dict):
                lines.append(f"| {k} | {v['jobs']:,} | {_fmt_rate(v['jobs_per_s'])} |"
                             f" {v['jobs_per_s']['median'] / ref:.2f} | {v['most_running_per_key']} |"
                             f" {v['seconds']:.2f} ({v['min_seconds']:.2f}) | {v['busiest_second']} |")
        lines += ["", f"Most running of one key: the largest count a sampler saw (every 2 ms) during the drains "
                      f"(limit {KEY_MAX_RUNNING}). A rate limit of r a second hands out a burst of r, then one job "
                      f"per 1/r s, so n jobs take at least (n − r) / r s (the floor in brackets): the drains of "
                      f"{RATE_LIMIT}/s and of {FAST_RATE_LIMIT}/s (its bucket in 16 shards, spent side by side by the "
                      f"{lim['workers']} claimers) should be near their floors. Most claims in one second: by the "
                      f"claim events' times (pgq.job_events.at), written a little after the bucket's clock is read, so "
                      f"a second of events can hold one or two more than 2r (burst + a second's tokens) of the "
                      f"bucket's own clock.", ""]
    if "keyed" in res:
        kd = res["keyed"]
        lines += [f"### The Worker on a key-limited queue ({kd['jobs']:,} jobs over {kd['keys']} keys, handlers of "
                  f"{kd['sleep_ms']:g} ms, the Worker's defaults; {fs})", "",
                  "| keys' order | W | queue | jobs/s | × no limit | ceiling jobs/s | of ceiling |"
                  " most running of one key |",
                  "|---|---:|---|---:|---:|---:|---:|---:|"]
        refs = {(x["order"], x["workers"]): x["jobs_per_s"]["median"] for x in kd["rows"] if x["queue"] == "no limit"}
        for x in kd["rows"]:
            lines.append(f"| {x['order']} | {x['workers']} | {x['queue']} | {_fmt_rate(x['jobs_per_s'])} |"
                         f" {x['jobs_per_s']['median'] / refs[(x['order'], x['workers'])]:.2f} |"
                         f" {x['ceiling']:,.0f} | {x['of_ceiling']:.2f} | {x['most_running_per_key']} |")
        lines += ["", f"Ceiling: min(W, keys × limit) / handler time (W / handler time without a limit). Most "
                      f"running of one key: the most handlers of one key whose recorded (start, end) intervals "
                      f"overlap (limit {kd['limit']}). Interleaved: the keys take turns in the queue's order; "
                      f"blocks: each key's jobs in one run.", ""]
    if "batch" in res:
        b = res["batch"]
        lines += [f"### A batch's members drained beside the same plain jobs ({b['jobs']:,} jobs each, W threads "
                  f"claiming batch 10 + one complete_many; {fs})", "",
                  "| W | plain jobs/s | batch members jobs/s | × plain | batch median ≥ plain's slowest run |"
                  " callback jobs per batch (enqueued by) | callback's counts = the data |",
                  "|---:|---:|---:|---:|---|---|---|"]
        for w, x in b.items():
            if isinstance(x, dict):
                by = ", ".join(f"{c} ({how})" for c, how in zip(x["callbacks"], x.get("callback_by", [])))
                lines.append(f"| {w} | {_fmt_rate(x['plain'])} | {_fmt_rate(x['batch'])} | {x['ratio']:.2f} |"
                             f" {'yes' if x['within_spread'] else 'no'} | {by} |"
                             f" {'yes' if x['meta_matches'] and x['status_matches'] else 'no'} |")
        lines += ["", "The batch is opened before its members are enqueued (enqueue_many, 5,000 per call, "
                      "batch => id) and sealed before the drain; its callback goes to another queue. Each run "
                      "checks that exactly one callback job arrived, its meta.batch equal to the counts of the "
                      "members (all done), and pgq.batch_status naming it. Enqueued by: the last member's end "
                      "(end), or else the pgq.sweep() run after the drain (sweep).", ""]
    if "old_snapshot" in res:
        lines += [f"### Churn while a REPEATABLE READ snapshot is held, and after ({fs})", "",
                  "| phase | jobs/s | dead tuples at end | jobs table + indexes |", "|---|---:|---:|---:|"]
        for k, v in res["old_snapshot"].items():
            s = v["samples"][-1]
            lines.append(f"| {k} | {v['jobs_per_s']:,.0f} | {s['jobs_dead_tuples']} |"
                         f" {(s['jobs_table_bytes'] + s['jobs_indexes_bytes']) / 2**20:.1f} MiB |")
        lines.append("")
    lines += _targets(res, fs)
    return "\n".join(lines)


def _ratio(res: dict[str, Any], w: str, system: str, reference: str) -> float | None:
    drain = res.get("drain", {}).get(w, {})
    if system not in drain or reference not in drain:
        return None
    return float(drain[system]["median"] / drain[reference]["median"])


def _targets(res: dict[str, Any], fs: str) -> list[str]:
    """The issue's targets against this run's figures, each "met?" computed from them."""
    rows: list[tuple[str, str, bool | None]] = []

    def drain_row(label: str, system: str, reference: str, floor: float) -> None:
        ratios = {w: _ratio(res, w, system, reference) for w in res.get("drain", {})}
        got = {w: r for w, r in ratios.items() if r is not None}
        if got:
            rows.append((label, ", ".join(f"W = {w}: {r:.2f}" for w, r in got.items()),
                         all(r >= floor for r in got.values())))

    drain_row("batch-1 drain ≥ 0.8× raw b1", "pgq b1", "raw b1", 0.8)
    drain_row("batch-10 drain ≥ 0.95× raw b10", "pgq b10", "raw b10", 0.95)
    drain_row("batch-1 drain, completions with the next claim (complete_and_claim) ≥ 0.8× raw b1",
              "pgq b1 cc", "raw b1", 0.8)
    drain_row("batch-10 drain, completions with the next claim (complete_and_claim) ≥ 0.95× raw b10",
              "pgq b10 cc", "raw b10", 0.95)
    drain_row("worker defaults ≥ 1.3× raw b10", "pgq worker", "raw b10", 1.3)
    for w, x in res.get("batch", {}).items():
        if isinstance(x, dict):
            rows.append((f"a batch of {res['batch']['jobs']:,} members drains at the plain rate within the spread "
                         f"(W = {w}), one callback",
                         f"{x['ratio']:.2f}× plain ({_fmt_rate(x['batch'])} vs {_fmt_rate(x['plain'])}); callbacks "
                         f"{', '.join(map(str, x['callbacks']))}",
                         x["within_spread"] and all(c == 1 for c in x["callbacks"]) and x["meta_matches"]))
    e = res.get("enqueue", {})
    if e:
        bulk = e["enqueue_many (1000 per call)"]["median"]
        rows.append(("bulk enqueue ≥ 100,000 jobs/s",
                     f"{bulk:,.0f} jobs/s "
                     f"({bulk / e['raw INSERT of 1000 rows']['median']:.2f}× a raw 1,000-row INSERT)",
                     bulk >= 100_000))
        single = e["enqueue (one per call)"]["median"] / e["raw single-row INSERT"]["median"]
        rows.append(("single enqueue ≥ 0.9× raw INSERT", f"{single:.2f}", single >= 0.9))
    if "LISTEN" in res.get("latency", {}):
        lat = res["latency"]["LISTEN"]
        rows.append(("enqueue-to-start p50 < 5 ms with LISTEN",
                     f"{lat['p50_ms']:.1f} ms (p95 {lat['p95_ms']:.1f}, p99 {lat['p99_ms']:.1f})", lat["p50_ms"] < 5))
    for runtime, x in res.get("cancel", {}).items():
        if isinstance(x, dict) and x["p95_ms"] is not None:
            rows.append((f"a cancel reaches the running handler within a second ({runtime})",
                         f"p95 {x['p95_ms']:.1f} ms (p50 {x['p50_ms']:.1f}), {x['missing']} not seen",
                         x["p95_ms"] < 1000 and x["missing"] == 0))
    if res.get("claim_latency"):
        levels = list(res["claim_latency"].items())
        base, top = levels[0][1]["claim_ms"]["median"], levels[-1][1]["claim_ms"]["median"]
        rows.append((f"claim at {int(levels[-1][0]):,} finished rows ≤ 1.2× at {int(levels[0][0]):,}",
                     f"{top / base:.2f} ({top:.3f} vs {base:.3f} ms)", top / base <= 1.2))
    if "churn" in res:
        samples = res["churn"]["samples"]
        size = [x["jobs_table_bytes"] + x["jobs_indexes_bytes"] for x in samples]
        third = next(i for i, x in enumerate(samples) if x["t"] >= samples[-1]["t"] * 2 / 3)
        growth = size[-1] / max(size[third], 1)
        rows.append(("table + index size bounded under churn with pruning (here: the last third of the run "
                     "grows it by ≤ 10%)",
                     f"{size[third] / 2**20:.1f} MiB at {samples[third]['t']:.0f} s → {size[-1] / 2**20:.1f} MiB at "
                     f"{samples[-1]['t']:.0f} s (×{growth:.2f})", growth <= 1.1))
    if not rows:
        return []
    out = [f"### Against the targets (this run; {fs})", "", "| target | measured | met? |", "|---|---|---|"]
    out += [f"| {label} | {measured} | {'**yes**' if met else '**no**'} |" for label, measured, met in rows]
    return out + [""]


def _chart(res: dict[str, Any], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed (pip install ./tools brings it): no chart")
        return False
    panels = 2 if "churn" in res else 1
    fig, axes = plt.subplots(1, panels, figsize=(7 * panels, 4.8), squeeze=False)
    ax = axes[0][0]
    if "drain" in res:
        ws = list(res["drain"])
        names = list(next(iter(res["drain"].values())))
        width = 0.8 / len(names)
        for i, name in enumerate(names):
            med = [res["drain"][w][name]["median"] for w in ws]
            lo = [m - res["drain"][w][name]["min"] for m, w in zip(med, ws)]
            hi = [res["drain"][w][name]["max"] - m for m, w in zip(med, ws)]
            xs = [j + i * width for j in range(len(ws))]
            color = "0.6" if name.startswith("raw") or name == "pgbench" else None
            hatch = "//" if name.startswith("raw") else ("xx" if name == "pgbench" else None)
            ax.bar(xs, med, width, yerr=[lo, hi], label=name, color=color, hatch=hatch, edgecolor="black",
                   linewidth=0.4)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(ws))], [f"W = {w}" for w in ws])
        ax.set_ylabel("jobs/s (pgbench: tps)")
        ax.set_title("Drain throughput (median, min–max); grey = references")
        ax.legend(fontsize=7)
    if panels == 2:
        ax2 = axes[0][1]
        s = res["churn"]["samples"]
        t = [x["t"] for x in s]
        ax2.plot(t, [x["jobs_table_bytes"] / 2**20 for x in s], label="pgq.jobs heap")
        ax2.plot(t, [x["jobs_indexes_bytes"] / 2**20 for x in s], label="pgq.jobs indexes")
        ax2.plot(t, [x["events_total_bytes"] / 2**20 for x in s], label="pgq.job_events")
        ax2.set_xlabel("seconds")
        ax2.set_ylabel("MiB")
        ax2.set_title(f"Churn with pruning: {res['churn']['jobs_per_s']:,.0f} jobs/s")
        ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# Entry point --------------------------------------------------------------------------------------

#: The markers around the generated block of bench/README.md.
BENCH_BEGIN = "<!-- BEGIN bench.md: generated by pgq-thin bench --readme; do not edit -->"
BENCH_END = "<!-- END bench.md -->"


def update_readme(path: str, table: str) -> None:
    """Replace the block between BENCH_BEGIN and BENCH_END of the file at ``path`` with ``table``."""
    text = Path(path).read_text()
    if BENCH_BEGIN not in text or BENCH_END not in text:
        raise ValueError(f"{path} has no {BENCH_BEGIN!r} … {BENCH_END!r} block")
    head, rest = text.split(BENCH_BEGIN, 1)
    _, tail = rest.split(BENCH_END, 1)
    Path(path).write_text(f"{head}{BENCH_BEGIN}\n{table.strip()}\n{BENCH_END}{tail}")


def _machine() -> str:
    """What the run ran on: the CPU model and count, the memory and the operating system."""
    import platform

    model = memory = None
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
        with open("/proc/meminfo") as f:
            kib = next((int(line.split()[1]) for line in f if line.startswith("MemTotal:")), None)
            memory = None if kib is None else f"{kib / 1024 / 1024:.1f} GiB RAM"
    except OSError:
        pass
    parts = [f"{os.cpu_count()} CPUs" + (f" ({model})" if model else ""), memory,
             f"{platform.system()} {platform.release()}", f"Python {platform.python_version()}"]
    return ", ".join(p for p in parts if p)


#: The server settings a reader needs to compare a run with their own server.
REPORTED_SETTINGS = ("shared_buffers", "max_connections", "work_mem", "wal_level", "max_wal_size",
                     "checkpoint_timeout", "autovacuum_naptime", "jit")


def _server_settings(conn: psycopg.Connection[Any]) -> str:
    rows = conn.execute("SELECT name, current_setting(name) FROM unnest(%s::text[]) AS s(name)",
                        (list(REPORTED_SETTINGS),)).fetchall()
    return ", ".join(f"{name} {value}" for name, value in rows)


def _loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"

WORKLOADS = ("enqueue", "drain", "latency", "claim_latency", "churn", "old_snapshot", "many", "limits",
             "keyed", "batch", "cancel")


def run_bench(out_dir: str, dsn: str | None = None, quick: bool = False, *,
              workloads: Sequence[str] = WORKLOADS, systems: Sequence[str] = DRAIN_SYSTEMS,
              config: BenchConfig | None = None, jobs: int | None = None,
              workers: Sequence[int] | None = None, repeats: int | None = None,
              print_table: bool = True, fsync: bool = True, readme: str | None = None) -> int:
    """Run the benchmark; write bench.md, bench.json and bench.png into ``out_dir``; 0 on success.

    ``dsn`` None starts a throwaway PostgreSQL. A given ``dsn`` must name a scratch database: the
    benchmark installs pgq there, TRUNCATEs pgq.jobs and pgq.job_events, and creates the schema
    bench_raw and pgbench's tables. ``workloads`` picks a subset of WORKLOADS; ``systems`` a subset
    of DRAIN_SYSTEMS. ``jobs``, ``workers`` and ``repeats`` override the drain sizes. ``fsync``
    is the throwaway server's setting (on, as users run it, by default); with ``dsn`` the server's
    own settings are used, and every table states them. ``readme`` names a Markdown file (such as
    bench/README.md) whose block between BENCH_BEGIN and BENCH_END is replaced by bench.md."""
    cfg = config or (BenchConfig.quick() if quick else BenchConfig())
    if jobs is not None:
        cfg.jobs = jobs
    if workers is not None:
        cfg.workers = tuple(workers)
    if repeats is not None:
        cfg.repeats = repeats
    unknown = set(workloads) - set(WORKLOADS)
    if unknown:
        raise ValueError(f"unknown workloads {sorted(unknown)}; choose from {WORKLOADS}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    load_before = _loadavg()
    server = _Server(dsn, fsync=fsync)
    try:
        _prepare_database(server.dsn)
        with _connect(server.dsn) as conn:
            version = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
            fsync_now = conn.execute("SHOW fsync").fetchone()[0]  # type: ignore[index]
            sync_commit = conn.execute("SHOW synchronous_commit").fetchone()[0]  # type: ignore[index]
            settings = _server_settings(conn)
        res: dict[str, Any] = {"started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                               "server_version": version, "cpus": os.cpu_count(),
                               "machine": _machine(), "server_settings": settings,
                               "fsync": fsync_now, "synchronous_commit": sync_commit,
                               "server": "a throwaway PostgreSQL (pgq_thin.testing.server)" if dsn is None
                               else "the server given by dsn",
                               "load_average": {"before": load_before},
                               "observer_poll_ms": OBSERVER_POLL * 1000,
                               "config": {k: (list(v) if isinstance(v, tuple) else v)
                                          for k, v in cfg.__dict__.items()}}
        with tempfile.TemporaryDirectory() as tmp:
            if "drain" in workloads:
                _pgbench_init(server.dsn)
                res["drain"] = _drains(server.dsn, cfg, Path(tmp), systems)
        if "enqueue" in workloads:
            res["enqueue"] = _enqueue(server.dsn, cfg)
        if "latency" in workloads:
            res["latency"] = _latency(server.dsn, cfg)
        if "claim_latency" in workloads:
            res["claim_latency"] = _claim_latency(server.dsn, cfg)
        if "churn" in workloads:
            res["churn"] = _churn_workload(server.dsn, cfg)
        if "old_snapshot" in workloads:
            res["old_snapshot"] = _snapshot_workload(server.dsn, cfg)
        if "many" in workloads:
            res["many"] = _many_queues_and_tenants(server.dsn, cfg)
        if "limits" in workloads:
            res["limits"] = _limited_drains(server.dsn, cfg)
        if "keyed" in workloads:
            res["keyed"] = _keyed_drains(server.dsn, cfg)
        if "batch" in workloads:
            res["batch"] = _batch_drains(server.dsn, cfg)
        if "cancel" in workloads:
            res["cancel"] = _cancel_latency(server.dsn, cfg)
    finally:
        server.stop()
    res["finished"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    res["load_average"]["after"] = _loadavg()
    table = _markdown(res)
    (out / "bench.md").write_text(table + "\n")
    if readme is not None:
        update_readme(readme, table)
    (out / "bench.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    _chart(res, out / "bench.png")
    if print_table:
        print(table)
    return 0


# A/B: claims on a queue without schedules or timeouts, before and after migration 0004 ----------

#: The last migration before schedules, timeouts and progress (the "A" database stops there).
AB_BEFORE = "0002_cheaper_name_checks"
AB_AFTER = "0004_schedules_timeouts_progress"


#: The A/B's name for what `pgq-thin migrate` installs: every migration, then the function source.
HEAD = "head"
#: A side "git:REV" of the A/B: the migrations and the function source of that revision of this
#: checkout (git archive), applied as that revision's pgq_thin.migrate would: an A/B of two
#: function sources, say this branch's head against main's (``git:main head``).
GIT = "git:"


def _apply_revision(dsn: str, revision: str) -> list[str]:
    """Apply the migrations of git revision ``revision`` of the checkout this module runs from (or,
    installed, of the checkout the current directory is in), then its function source
    (sql/all_functions.sql, when it has one) in one transaction."""
    from yoyo import get_backend, read_migrations

    from pgq_thin.migrate import yoyo_url

    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        root = Path(subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                                   check=True).stdout.strip())
    with tempfile.TemporaryDirectory(prefix="pgq-ab-") as out:
        listed = subprocess.run(["git", "-C", str(root), "ls-tree", "--name-only", revision, "sql/"],
                                capture_output=True, text=True, check=True).stdout.split()
        paths = ["migrations"] + [p for p in listed if p == "sql/all_functions.sql"]
        archive = subprocess.run(["git", "-C", str(root), "archive", "--format=tar", revision, *paths],
                                 capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", out], input=archive.stdout, check=True)
        backend = get_backend(yoyo_url(dsn))
        try:
            migrations = read_migrations(str(Path(out) / "migrations"))
            with backend.lock():
                backend.apply_migrations_only(backend.to_apply(migrations))
            functions = Path(out) / "sql" / "all_functions.sql"
            if functions.exists():
                with backend.transaction():
                    backend.connection.execute(functions.read_text())
            return [m.id for m in migrations]
        finally:
            backend.connection.close()


def _migrate_to(dsn: str, last: str) -> list[str]:
    """Apply pgq's migrations up to and including ``last``, with the functions as those migrations
    wrote them (not the function source: a landed schema as it was); ``last`` = HEAD: what
    pgq_thin.migrate installs; ``last`` = git:REV: what that revision's would (_apply_revision).
    Returns the ids of the migrations the database then has."""
    from yoyo import get_backend, read_migrations

    from pgq_thin.migrate import migrations_dir, yoyo_url

    if last == HEAD:
        from pgq_thin import migrate

        migrate(dsn)
        return [m.id for m in read_migrations(str(migrations_dir()))]
    if last.startswith(GIT):
        return _apply_revision(dsn, last.removeprefix(GIT))
    backend = get_backend(yoyo_url(dsn))
    try:
        wanted = read_migrations(str(migrations_dir())).filter(lambda m: m.id <= last)
        with backend.lock():
            backend.apply_migrations_only(backend.to_apply(wanted))
        return [m.id for m in wanted]
    finally:
        backend.connection.close()


def _ab_databases(databases: Databases, before: str = AB_BEFORE, after: str = AB_AFTER) -> dict[str, str]:
    """Databases ab_a (migrated to ``before``) and ab_b (to ``after``) on one server: their DSNs."""
    dsns = {}
    expected = []
    for label, last in (("A", before), ("B", after)):
        dsns[label] = databases.create(f"ab_{label.lower()}")
        expected.append(_migrate_to(dsns[label], last)[-1])
    with _connect(dsns["A"]) as a, _connect(dsns["B"]) as b:
        newest = [c.execute("SELECT max(migration_id) FROM _yoyo_migration").fetchone()[0]  # type: ignore[index]
                  for c in (a, b)]
    if newest != expected:
        raise RuntimeError(f"A/B databases are not at {before} and {after}: {newest}")
    return dsns


def _ab_drain(dsn: str, workers: int, n: int, kinds: list[str] | None = None) -> float:
    """Load n jobs into a plain queue, drain them with claim(batch 1) + complete from ``workers``
    threads; jobs per second by the wall clock around the threads (connect and close included).
    ``kinds``: the claims name them (as a Worker names its handlers' kinds); None: they do not."""
    with _connect(dsn) as conn:
        conn.execute("TRUNCATE pgq.jobs, pgq.job_events")
        conn.execute("SELECT pgq.enqueue_many(%s, 'noop', ARRAY(SELECT jsonb_build_object('n', g)"
                     " FROM generate_series(1, %s) AS g))", (QUEUE, n))
        conn.execute("VACUUM ANALYZE pgq.jobs")
        conn.execute("VACUUM ANALYZE pgq.job_events")
    claim = ("SELECT id, attempt FROM pgq.claim(worker => %(worker)s::text, queues => %(queues)s::text[],"
             " batch => 1" + (", kinds => %(kinds)s::text[])" if kinds is not None else ")"))
    complete = "SELECT pgq.complete(id => %(id)s::bigint, attempt => %(attempt)s::integer)"

    def work(i: int) -> None:
        with _connect(dsn) as conn:
            params = {"worker": f"ab-{i}", "queues": [QUEUE], "kinds": kinds}
            while True:
                rows = conn.execute(claim, params, prepare=True).fetchall()
                if not rows:
                    return
                conn.execute(complete, {"id": rows[0][0], "attempt": rows[0][1]}, prepare=True)

    started = time.perf_counter()
    _run_threads(workers, work)
    elapsed = time.perf_counter() - started
    with _connect(dsn) as conn:
        done = conn.execute("SELECT count(*) FROM pgq.jobs WHERE state = 'done'").fetchone()[0]  # type: ignore[index]
    if done != n:
        raise RuntimeError(f"A/B drain: {done} jobs done, expected {n}")
    return n / elapsed


def schedules_timeouts_ab(*, jobs: int = 3000, workers: int = 4, repeats: int = 5,
                          fsync: bool = True, before: str = AB_BEFORE, after: str = AB_AFTER) -> dict[str, Any]:
    """The claim+complete rate of a queue without schedules or timeouts on a database migrated to
    AB_BEFORE (A) and one migrated to AB_AFTER (B), on one throwaway server, drained alternately
    (A B, then B A, ...) so that both see the same machine; with fsync on or off. Returns the
    rates, their medians and the ratio B/A of the medians. ``before`` / ``after`` name other
    migrations to compare (e.g. the last one before and the newest)."""
    # The throwaway server's settings, with fsync as asked (a later -c wins over -F).
    databases = Databases(postgres_args=f"{SERVER_SETTINGS} -c fsync={'on' if fsync else 'off'}")
    try:
        dsns = _ab_databases(databases, before, after)
        with _connect(dsns["A"]) as a:
            fsync_setting = a.execute("SHOW fsync").fetchone()[0]  # type: ignore[index]
            version = a.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
        for dsn in dsns.values():  # warm-up, not counted
            _ab_drain(dsn, workers, min(jobs, 500))
        rates: dict[str, list[float]] = {"A": [], "B": []}
        for r in range(repeats):
            for label in (("A", "B") if r % 2 == 0 else ("B", "A")):
                rates[label].append(_ab_drain(dsns[label], workers, jobs))
        med = {k: statistics.median(v) for k, v in rates.items()}
        return {"server_version": version, "fsync": fsync_setting, "jobs": jobs, "workers": workers,
                "repeats": repeats, "before": before, "after": after, "rates": rates,
                "median": med, "ratio_after_over_before": med["B"] / med["A"]}
    finally:
        databases.close()


#: The claim and complete of _ab_drain, n times in one server-side loop (each pair committed, as
#: in autocommit, but no round trips): what the functions themselves cost, with less noise than a
#: drain from client threads.
AB_SERVER_LOOP = """
DO $$
DECLARE r record;
BEGIN
    FOR i IN 1..%s LOOP
        SELECT c.id, c.attempt INTO r FROM pgq.claim('ab', ARRAY['bench'], 1) AS c;
        COMMIT;
        PERFORM pgq.complete(r.id, r.attempt);
        COMMIT;
    END LOOP;
END $$"""


def _server_loop_us(dsn: str, loop: str, jobs: int) -> float:
    """Load ``jobs`` jobs into a plain queue and time ``loop`` (AB_SERVER_LOOP or a variant) over
    them: microseconds per claim+complete pair."""
    with _connect(dsn) as conn:
        conn.execute("TRUNCATE pgq.jobs, pgq.job_events")
        conn.execute("SELECT pgq.enqueue_many(%s, 'noop', array_fill('{}'::jsonb, ARRAY[%s]))", (QUEUE, jobs))
        conn.execute("VACUUM ANALYZE pgq.jobs")
        started = time.perf_counter()
        conn.execute(loop % int(jobs))
        return (time.perf_counter() - started) / jobs * 1e6


def schedules_timeouts_ab_server(*, jobs: int = 1000, repeats: int = 12, before: str = AB_BEFORE,
                                 after: str = AB_AFTER) -> dict[str, Any]:
    """The same A/B as schedules_timeouts_ab, timed inside the server: jobs claim+complete pairs
    per DO loop (AB_SERVER_LOOP) on A (AB_BEFORE) and B (AB_AFTER), alternately; microseconds per
    pair and the ratio B/A of the medians."""
    databases = Databases()
    try:
        dsns = _ab_databases(databases, before, after)
        per_pair: dict[str, list[float]] = {"A": [], "B": []}
        for r in range(repeats + 1):  # the first round warms up and is not counted
            for label in (("A", "B") if r % 2 == 0 else ("B", "A")):
                us = _server_loop_us(dsns[label], AB_SERVER_LOOP, jobs)
                if r:
                    per_pair[label].append(us)
        med = {k: statistics.median(v) for k, v in per_pair.items()}
        best = {k: min(v) for k, v in per_pair.items()}  # the least disturbed run, on a loaded machine
        return {"jobs": jobs, "repeats": repeats, "before": before, "after": after,
                "us_per_claim_complete": per_pair, "median_us": med, "min_us": best,
                "ratio_after_over_before": med["B"] / med["A"], "ratio_of_mins": best["B"] / best["A"]}
    finally:
        databases.close()


def _backend_cpu_seconds(pid: int) -> float:
    """The CPU time (user + system) a local server process has used so far, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _server_loop_cpu_us(conn: psycopg.Connection, jobs: int) -> float:
    """Enqueue ``jobs`` jobs into the plain queue, then run AB_SERVER_LOOP over them on ``conn``:
    microseconds of its backend's CPU (from /proc, so the server must be local) per pair."""
    conn.execute("SELECT pgq.enqueue_many(%s, 'noop', array_fill('{}'::jsonb, ARRAY[%s]))", (QUEUE, jobs))
    conn.execute("VACUUM ANALYZE")
    pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
    used = _backend_cpu_seconds(pid)
    conn.execute(AB_SERVER_LOOP % int(jobs))
    return (_backend_cpu_seconds(pid) - used) / jobs * 1e6


def server_loop_cpu_ab(*, jobs: int = 3000, repeats: int = 12, before: str = AB_BEFORE,
                       after: str = AB_AFTER, fsync: bool = False) -> dict[str, Any]:
    """The server-side A/B of schedules_timeouts_ab_server, measured by the CPU time the backend
    running the loop used (from /proc, so the server must be local) instead of the wall clock: on
    a machine other processes load, the wall clock counts the time they took the CPU away, the
    backend's CPU time does not (resolution: one clock tick, 10 ms, over the whole loop).
    Microseconds of backend CPU per claim+complete pair, medians, minimums and the ratios B/A.
    ``fsync``: the server's fsync (each pair commits twice, as a worker's calls do)."""
    databases = Databases(postgres_args=f"{SERVER_SETTINGS} -c fsync={'on' if fsync else 'off'}")
    try:
        dsns = _ab_databases(databases, before, after)
        per_pair: dict[str, list[float]] = {"A": [], "B": []}
        for r in range(repeats + 1):  # the first round warms up and is not counted
            for label in (("A", "B") if r % 2 == 0 else ("B", "A")):
                with _connect(dsns[label]) as conn:
                    conn.execute("TRUNCATE pgq.jobs, pgq.job_events")
                    us = _server_loop_cpu_us(conn, jobs)
                if r:
                    per_pair[label].append(us)
        med = {k: statistics.median(v) for k, v in per_pair.items()}
        best = {k: min(v) for k, v in per_pair.items()}
        return {"jobs": jobs, "repeats": repeats, "before": before, "after": after, "fsync": fsync,
                "cpu_us_per_claim_complete": per_pair, "median_us": med, "min_us": best,
                "ratio_after_over_before": med["B"] / med["A"], "ratio_of_mins": best["B"] / best["A"]}
    finally:
        databases.close()


# A/B per concern: what a plain queue's claim pays for what other queues use (issue 25) -----------

#: Per concern, what the database holds besides the plain queue 'bench' (run again after each round's
#: TRUNCATE of the jobs): another queue that uses it, or (audit off) the plain queue without its
#: event log. The reference, "plain", holds nothing else.
CONCERNS: dict[str, list[str]] = {
    "plain": [],
    "limits": ["SELECT pgq.configure_queue('other', max_running => 5, key_max_running => 2, rate_limit => 1000)",
               "SELECT pgq.enqueue('other', 'k', concurrency_key => 'key-' || g % 50) FROM generate_series(1, 1000) g"],
    "fairness": ["SELECT pgq.configure_queue('other', fair => true)",
                 "SELECT pgq.enqueue('other', 'k', tenant => 't' || g % 100) FROM generate_series(1, 1000) g"],
    "schedules": ["SELECT pgq.schedule('s' || g, 'other', 'k', every => '1 hour') FROM generate_series(1, 100) g"
                  " WHERE NOT EXISTS (SELECT FROM pgq.schedules())"],
    "dependencies": ["SELECT pgq.enqueue('other', 'dependant', depends_on => ARRAY[pgq.enqueue('other', 'k')])"
                     " FROM generate_series(1, 500)"],
    "grants": ["SELECT pgq.configure_queue('other')",
               "SELECT pgq.grant_queue('other', 'pgq_worker', 'claim')"
               " WHERE NOT EXISTS (SELECT FROM pgq.queue_grants())"],
    "workflows": ["SELECT count(*) FROM pgq.enqueue_many('other', 'k', array_fill('{}'::jsonb, ARRAY[1000]),"
                  " batch => pgq.batch_open('other', 'callback'))",
                  "SELECT pgq.enqueue('other', 'k', notify_finished => true) FROM generate_series(1, 500)",
                  "SELECT pgq.enqueue('other', 'dependant', depends_on => ARRAY[pgq.enqueue('other', 'k')],"
                  " dependency_mode => 'all_ended') FROM generate_series(1, 500)"],
    "audit off": ["SELECT pgq.configure_queue('bench', audit => false)"],
}


def concerns_ab(*, jobs: int = 3000, repeats: int = 8, fsync: bool = True) -> dict[str, Any]:
    """What a plain queue pays for the features it does not use, in one run: one database per
    CONCERNS entry on one server (every one at this checkout's schema), the plain queue's
    AB_SERVER_LOOP (claim + complete, each committed) timed by the backend's CPU in each, the
    databases in a rotating order each round (the first round warms up). Microseconds of backend
    CPU per pair, medians and minimums, and the ratio of each median to the plain database's."""
    databases = Databases(postgres_args=f"{SERVER_SETTINGS} -c fsync={'on' if fsync else 'off'}")
    try:
        dsns = {}
        for i, name in enumerate(CONCERNS):
            dsns[name] = databases.create(f"concern_{i}")
            _migrate_to(dsns[name], HEAD)
        per_pair: dict[str, list[float]] = {k: [] for k in CONCERNS}
        names = list(CONCERNS)
        for r in range(repeats + 1):
            for name in names[r % len(names):] + names[:r % len(names)]:
                with _connect(dsns[name]) as conn:
                    conn.execute("TRUNCATE pgq.jobs, pgq.job_events, pgq.job_dependencies")
                    for statement in CONCERNS[name]:
                        conn.execute(statement)
                    us = _server_loop_cpu_us(conn, jobs)
                    done = conn.execute("SELECT count(*) FROM pgq.jobs WHERE queue = %s AND state = 'done'",
                                        (QUEUE,)).fetchone()[0]  # type: ignore[index]
                    if done != jobs:
                        raise RuntimeError(f"concern {name}: {done} of {jobs} jobs done")
                if r:
                    per_pair[name].append(us)
        med = {k: statistics.median(v) for k, v in per_pair.items()}
        return {"jobs": jobs, "repeats": repeats, "fsync": fsync, "cpu_us_per_claim_complete": per_pair,
                "median_us": med, "min_us": {k: min(v) for k, v in per_pair.items()},
                "ratio_to_plain": {k: med[k] / med["plain"] for k in med}}
    finally:
        databases.close()


# A/B: the claim before and after migration 0006 (kinds, list_jobs' and the kinds' indexes) ---------

OPERATORS_BEFORE = "0005_version"
OPERATORS_AFTER = "0006_operators_day"


def operators_day_ab(*, jobs: int = 3000, workers: int = 4, repeats: int = 5, fsync: bool = True) -> dict[str, Any]:
    """The claim+complete rate of a plain queue on a database migrated to 0005 (A) and one migrated
    to 0006 (B: claims with kinds => NULL, as before; and "B kinds": claims naming the job's kind,
    as a Worker does), one throwaway server, drained in turn (each repetition starts with another
    one); fsync on or off. Rates, medians and the ratios of the medians to A's."""
    # The throwaway server's settings, with fsync as asked (a later -c wins over -F).
    databases = Databases(postgres_args=f"{SERVER_SETTINGS} -c fsync={'on' if fsync else 'off'}")
    try:
        dsns = _ab_databases(databases, OPERATORS_BEFORE, OPERATORS_AFTER)
        with _connect(dsns["A"]) as a:
            fsync_setting = a.execute("SHOW fsync").fetchone()[0]  # type: ignore[index]
            version = a.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
        series: dict[str, tuple[str, list[str] | None]] = {"A": (dsns["A"], None), "B": (dsns["B"], None),
                                                            "B kinds": (dsns["B"], ["noop"])}
        for dsn, kinds in series.values():  # warm-up, not counted
            _ab_drain(dsn, workers, min(jobs, 500), kinds)
        rates: dict[str, list[float]] = {k: [] for k in series}
        labels = list(series)
        for r in range(repeats):
            for label in labels[r % 3:] + labels[:r % 3]:
                dsn, kinds = series[label]
                rates[label].append(_ab_drain(dsn, workers, jobs, kinds))
        med = {k: statistics.median(v) for k, v in rates.items()}
        return {"server_version": version, "fsync": fsync_setting, "jobs": jobs, "workers": workers,
                "repeats": repeats, "before": OPERATORS_BEFORE, "after": OPERATORS_AFTER, "rates": rates,
                "median": med, "ratio_B_over_A": med["B"] / med["A"],
                "ratio_B_kinds_over_A": med["B kinds"] / med["A"]}
    finally:
        databases.close()


def operators_day_ab_server(*, jobs: int = 1000, repeats: int = 8) -> dict[str, Any]:
    """operators_day_ab timed inside the server (AB_SERVER_LOOP; "B kinds" claims with kinds =>
    ARRAY['noop']): microseconds per claim+complete pair, medians, minimums and their ratios to A's."""
    databases = Databases()
    try:
        dsns = _ab_databases(databases, OPERATORS_BEFORE, OPERATORS_AFTER)
        with_kinds = AB_SERVER_LOOP.replace("ARRAY['bench'], 1)", "ARRAY['bench'], 1, kinds => ARRAY['noop'])")
        assert with_kinds != AB_SERVER_LOOP
        loops = {"A": (dsns["A"], AB_SERVER_LOOP), "B": (dsns["B"], AB_SERVER_LOOP), "B kinds": (dsns["B"], with_kinds)}
        per_pair: dict[str, list[float]] = {k: [] for k in loops}
        labels = list(loops)
        for r in range(repeats + 1):  # the first round warms up and is not counted
            for label in labels[r % 3:] + labels[:r % 3]:
                us = _server_loop_us(*loops[label], jobs)
                if r:
                    per_pair[label].append(us)
        med = {k: statistics.median(v) for k, v in per_pair.items()}
        best = {k: min(v) for k, v in per_pair.items()}
        return {"jobs": jobs, "repeats": repeats, "us_per_claim_complete": per_pair, "median_us": med,
                "min_us": best, "ratio_of_medians_to_A": {k: med[k] / med["A"] for k in med},
                "ratio_of_mins_to_A": {k: best[k] / best["A"] for k in best}}
    finally:
        databases.close()


if __name__ == "__main__":
    # python -m pgq_tools.bench [jobs workers repeats [before after]]: the A/B of two migrations
    # (default: AB_BEFORE and AB_AFTER), client drains with fsync on and off, then the server loop.
    import sys

    usage = ("usage: python -m pgq_tools.bench [JOBS WORKERS REPEATS [BEFORE AFTER]]\n"
             "       python -m pgq_tools.bench concerns [JOBS REPEATS]: what a plain queue pays for\n"
             "  the features other queues use (concerns_ab), fsync on and off\n"
             "  the A/B of two migrations (file names without .sql, or head: every migration and the\n"
             "  function source, or git:REV: those of a git revision of this checkout, e.g. git:main;\n"
             f"  default: {AB_BEFORE} {AB_AFTER}): client drains with fsync on and off,\n"
             "  then the server loop (its backend's CPU with fsync on and off)")
    args = sys.argv[1:]
    if args[:1] == ["concerns"]:  # concerns_ab, fsync on and off
        counts: dict[str, int] = dict(zip(("jobs", "repeats"), (int(x) for x in args[1:3])))
        for on in (True, False):
            print(json.dumps(concerns_ab(**counts, fsync=on), indent=1))
        sys.exit(0)
    if any(a in ("-h", "--help") for a in args):
        print(usage)
        sys.exit(0)
    if len(args) > 5 or not all(a.isdigit() and int(a) > 0 for a in args[:3]):
        print(usage, file=sys.stderr)
        sys.exit(2)
    sizes: dict[str, Any] = dict(zip(("jobs", "workers", "repeats"), (int(x) for x in args[:3])))
    pair: dict[str, Any] = dict(zip(("before", "after"), args[3:5]))
    for on in (True, False):
        result = schedules_timeouts_ab(**sizes, **pair, fsync=on)
        print(json.dumps(result, indent=1))
    print(json.dumps(schedules_timeouts_ab_server(**pair), indent=1))
    for on in (True, False):
        print(json.dumps(server_loop_cpu_ab(**pair, fsync=on), indent=1))
