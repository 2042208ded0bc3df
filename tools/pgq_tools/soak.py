"""pgq-thin soak: the chaos soak (TESTING.md 20) and the old-snapshot run (TESTING.md 21).

``run_soak``: producer threads enqueue jobs while worker processes (pgq_tools.soak_app) run them,
each execution writing one row to a synthetic effects ledger. Meanwhile the soak kill -9s workers
(and starts new ones), freezes workers (SIGSTOP) past their lease and thaws them, terminates
client connections (pg_terminate_backend), and restarts the server once in immediate mode
(SIGQUIT, then start on the same data directory; not with --dsn). Then it stops the chaos, drains
the queue with healthy workers, and checks from the database:

- no job lost: every id an enqueue acknowledged is in pgq.jobs;
- none completed twice: at most one 'completed' event per job;
- every job terminal (done, failed or cancelled) after the drain;
- no two live owners: each attempt's live interval, by the database clock (from its 'claimed'
  event to the event that took the job out of its hands: completed, failed, released, ... or
  lease_expired, which comes at or after its lease end), overlaps no other attempt's of the job;
- at least once: every done job has a ledger row of the attempt that completed it, and no
  attempt was executed twice (at most one ledger row per (job, attempt));
- duplicate effects (more than one ledger row for a job) only where the earlier attempt's lease
  expired: each such attempt has a 'lease_expired' event in pgq.job_events.

``run_old_snapshot``: a steady load while a REPEATABLE READ transaction holds a snapshot; it reports
claim latency and pgq.jobs' dead tuples before, during and after, and checks that claims keep
working and that dead tuples fall once the snapshot ends and a VACUUM runs.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
import psycopg.conninfo

from pgq_thin.client import Client
from pgq_thin.migrate import migrate
from pgq_thin.testing import server as embedded
from pgq_thin.testing.topology import ReplicatedPair
from pgq_tools.fleet import WorkerProcess, stop_processes, worker_command
from pgq_tools.soak_app import QUEUE

__all__ = ["SoakCounts", "old_snapshot_problems", "run_old_snapshot", "run_old_snapshot_check", "run_soak",
           "soak_report"]

LEASE_SECONDS = 2.0
PRODUCER_APP = "pgq-soak-producer"
PrintFn = Callable[[str], Any]

_LEDGER_DDL = """
CREATE SCHEMA IF NOT EXISTS pgq_soak;
CREATE TABLE IF NOT EXISTS pgq_soak.effects (
    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id  bigint NOT NULL,
    attempt integer NOT NULL,
    worker  text NOT NULL,
    token   text NOT NULL UNIQUE,
    at      timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS effects_job_idx ON pgq_soak.effects (job_id, attempt);
"""


def _connect(dsn: str, patience: float = 30.0) -> psycopg.Connection[Any]:
    """A fresh autocommit connection, retried while the server restarts."""
    deadline = time.monotonic() + patience
    while True:
        try:
            return psycopg.connect(dsn, autocommit=True, connect_timeout=5, application_name="pgq-soak")
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _fetch(cursor: psycopg.Cursor[Any]) -> Any:
    """The one row a query returns (an aggregate's, say)."""
    row = cursor.fetchone()
    assert row is not None, "the query returned no row"
    return row


def _one(dsn: str, sql: str, params: tuple[Any, ...] = ()) -> Any:
    with _connect(dsn) as conn:
        row = conn.execute(sql, params).fetchone()
        return None if row is None else row[0]


@dataclass
class _Fleet:
    """The worker processes. A killed worker is replaced by a new one with a new name."""

    dsn: str
    log_dir: str
    concurrency: int
    procs: dict[int, WorkerProcess] = field(default_factory=dict)  # slot -> process
    generation: int = 0
    frozen: dict[int, float] = field(default_factory=dict)  # slot -> monotonic time to thaw

    def start(self, slot: int) -> None:
        self.generation += 1
        name = f"soak-w{slot}-g{self.generation}"
        self.procs[slot] = WorkerProcess(
            worker_command("pgq_tools.soak_app:worker", self.dsn, queues=[QUEUE], concurrency=self.concurrency),
            os.path.join(self.log_dir, f"{name}.log"),
            env={"PGQ_SOAK_WORKER": name, "PGQ_SOAK_LEASE": str(LEASE_SECONDS),
                 "PGQ_SOAK_CONCURRENCY": str(self.concurrency)})

    def kill(self, slot: int) -> None:
        self.procs[slot].kill()
        self.frozen.pop(slot, None)

    def freeze(self, slot: int, seconds: float) -> None:
        self.procs[slot].freeze()
        self.frozen[slot] = time.monotonic() + seconds

    def thaw_due(self, everything: bool = False) -> None:
        now = time.monotonic()
        for slot, until in list(self.frozen.items()):
            if everything or until <= now:
                self.procs[slot].thaw()
                del self.frozen[slot]

    def revive_dead(self) -> int:
        """Start a replacement for each worker that exited on its own; returns how many."""
        dead = [slot for slot, proc in self.procs.items() if not proc.alive]
        for slot in dead:
            self.start(slot)
        return len(dead)

    def stop(self) -> None:
        self.thaw_due(everything=True)
        stop_processes(self.procs.values())


class _Producers:
    """Threads that enqueue jobs (singly and in batches) and keep the ids acknowledged."""

    def __init__(self, dsn: str, threads: int, rate: float, rng: random.Random) -> None:
        self.dsn = dsn
        self.rate = rate  # jobs per second, all threads together
        self.acknowledged: list[int] = []
        self.errors = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._seeds = [rng.randrange(2**32) for _ in range(threads)]
        self._threads = [threading.Thread(target=self._run, args=(s,), daemon=True) for s in self._seeds]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)

    def _payload(self, rng: random.Random) -> dict[str, Any]:
        # Most jobs are quick; a few outlive their lease and rely on renewal.
        if rng.random() < 0.02:
            return {"ms": int(LEASE_SECONDS * 1500)}
        return {"ms": rng.randint(1, 30)}

    def _run(self, seed: int) -> None:
        rng = random.Random(seed)
        per_thread = self.rate / len(self._threads)
        dsn = psycopg.conninfo.make_conninfo(self.dsn, application_name=PRODUCER_APP)
        with Client(dsn, min_size=1, max_size=1) as client:
            while not self._stop.is_set():
                n = 1 if rng.random() < 0.5 else rng.randint(2, 20)
                try:
                    if n == 1:
                        ids = [client.enqueue(QUEUE, "soak.work", self._payload(rng))]
                    else:
                        ids = client.enqueue_many(QUEUE, "soak.work", [self._payload(rng) for _ in range(n)])
                except Exception:  # noqa: BLE001 - a lost connection: the outcome is unknown, not counted
                    with self._lock:
                        self.errors += 1
                    self._stop.wait(0.3)
                    continue
                with self._lock:
                    self.acknowledged.extend(ids)
                self._stop.wait(rng.expovariate(per_thread / n))


@dataclass
class SoakCounts:
    jobs: int = 0
    acknowledged: int = 0
    kills: int = 0
    freezes: int = 0
    connection_kills: int = 0
    restarts: int = 0
    failovers: int = 0
    reclaims: int = 0
    rejected: int = 0
    executions: int = 0
    duplicates: int = 0
    explained: int = 0
    unexplained: int = 0
    lost: int = 0
    completed_twice: int = 0
    not_terminal: int = 0
    double_owners: int = 0
    attempts: int = 0
    overlapping_attempts: int = 0
    closest_handover_ms: float | None = None
    attempts_without_end: int = 0
    executed_twice: int = 0
    not_executed: int = 0
    failed_jobs: int = 0
    states: dict[str, int] = field(default_factory=dict)


def _terminate_connections(dsn: str, rng: random.Random) -> int:
    """pg_terminate_backend of a random share of the soak's workers' and producers' connections
    (all of them now and then). Only the soak's own: they are recognised by application_name, so
    that with --dsn no other client of the database is touched."""
    with _connect(dsn) as conn:
        pids = [r[0] for r in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
            " AND (application_name LIKE 'pgq-worker soak-%%' OR application_name LIKE 'pgq-listen soak-%%'"
            "      OR application_name = %s)", (PRODUCER_APP,)).fetchall()]
        if not pids:
            return 0
        chosen = pids if rng.random() < 0.2 else rng.sample(pids, max(1, len(pids) // 4))
        return sum(1 for pid in chosen
                   if _fetch(conn.execute("SELECT pg_terminate_backend(%s)", (pid,)))[0])


def _check(dsn: str, acknowledged: list[int], counts: SoakCounts) -> list[str]:
    """The invariants, from the database. Returns the problems found (empty: all hold)."""
    problems: list[str] = []
    with _connect(dsn) as conn:
        conn.execute("CREATE TEMP TABLE acked (id bigint PRIMARY KEY)")
        with conn.cursor().copy("COPY acked (id) FROM STDIN") as copy:
            for job_id in acknowledged:
                copy.write_row((job_id,))
        counts.acknowledged = len(acknowledged)
        counts.jobs = _fetch(conn.execute("SELECT count(*) FROM pgq.jobs WHERE queue = %s", (QUEUE,)))[0]
        counts.states = dict(conn.execute(
            "SELECT state::text, count(*) FROM pgq.jobs WHERE queue = %s GROUP BY 1 ORDER BY 1",
            (QUEUE,)).fetchall())
        counts.failed_jobs = counts.states.get("failed", 0)
        counts.lost = _fetch(conn.execute(
            "SELECT count(*) FROM acked AS a WHERE NOT EXISTS (SELECT FROM pgq.jobs AS j WHERE j.id = a.id)"
        ))[0]
        counts.completed_twice = _fetch(conn.execute(
            "SELECT count(*) FROM (SELECT e.job_id FROM pgq.job_events AS e WHERE e.event = 'completed'"
            " GROUP BY e.job_id HAVING count(*) > 1) AS x"))[0]
        counts.not_terminal = _fetch(conn.execute(
            "SELECT count(*) FROM pgq.jobs WHERE queue = %s AND state NOT IN ('done', 'failed', 'cancelled')",
            (QUEUE,)))[0]
        counts.reclaims = _fetch(conn.execute(
            "SELECT count(*) FROM pgq.job_events AS e JOIN pgq.jobs AS j ON j.id = e.job_id"
            " WHERE j.queue = %s AND e.event = 'lease_expired'", (QUEUE,)))[0]
        counts.rejected = _fetch(conn.execute(
            "SELECT count(*) FROM pgq.job_events AS e JOIN pgq.jobs AS j ON j.id = e.job_id"
            " WHERE j.queue = %s AND e.event = 'rejected'", (QUEUE,)))[0]
        counts.executions = _fetch(conn.execute("SELECT count(*) FROM pgq_soak.effects"))[0]
        counts.executed_twice = _fetch(conn.execute(
            "SELECT count(*) FROM (SELECT job_id, attempt FROM pgq_soak.effects"
            " GROUP BY job_id, attempt HAVING count(*) > 1) AS x"))[0]
        # Two live owners: the live interval of every attempt, by the database clock, from its
        # 'claimed' event to the first event of that attempt that moved the job out of 'running'
        # (a 'rejected' write moves nothing). For an attempt whose lease expired that end is the
        # recovery, at or after the lease end: the intervals can only be too long, so an overlap
        # they miss is not there. No two attempts of one job may overlap.
        conn.execute("""
            CREATE TEMP TABLE attempt_live AS
            SELECT e.job_id, e.attempt,
                   min(e.at) FILTER (WHERE e.event = 'claimed') AS live_from,
                   min(e.at) FILTER (WHERE e.from_state = 'running' AND e.to_state IS DISTINCT FROM 'running'
                                       AND e.event <> 'rejected') AS live_to
            FROM pgq.job_events AS e JOIN pgq.jobs AS j ON j.id = e.job_id
            WHERE j.queue = %s
            GROUP BY e.job_id, e.attempt
            HAVING count(*) FILTER (WHERE e.event = 'claimed') > 0""", (QUEUE,))
        counts.attempts, counts.attempts_without_end = _fetch(conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE live_to IS NULL) FROM attempt_live"))
        counts.overlapping_attempts, closest = _fetch(conn.execute("""
            SELECT count(*) FILTER (WHERE b.live_from < coalesce(a.live_to, 'infinity')
                                      AND a.live_from < coalesce(b.live_to, 'infinity')),
                   min(extract(epoch FROM b.live_from - a.live_to) * 1000) FILTER (WHERE b.attempt = a.attempt + 1)
            FROM attempt_live AS a JOIN attempt_live AS b ON b.job_id = a.job_id AND b.attempt > a.attempt"""))
        counts.closest_handover_ms = None if closest is None else float(closest)
        counts.double_owners = counts.overlapping_attempts + counts.executed_twice
        if counts.overlapping_attempts:
            for job_id, a1, a2 in conn.execute("""
                    SELECT a.job_id, a.attempt, b.attempt FROM attempt_live AS a JOIN attempt_live AS b
                      ON b.job_id = a.job_id AND b.attempt > a.attempt
                    WHERE b.live_from < coalesce(a.live_to, 'infinity')
                      AND a.live_from < coalesce(b.live_to, 'infinity')
                    ORDER BY 1, 2 LIMIT 5""").fetchall():
                problems.append(f"two live owners: job {job_id} attempts {a1} and {a2} overlap while both live")
        # At least once: the attempt that completed a done job executed it (wrote its ledger row).
        counts.not_executed = _fetch(conn.execute("""
            SELECT count(*) FROM pgq.job_events AS e JOIN pgq.jobs AS j ON j.id = e.job_id
            WHERE j.queue = %s AND j.state = 'done' AND e.event = 'completed'
              AND NOT EXISTS (SELECT FROM pgq_soak.effects AS f WHERE f.job_id = e.job_id AND f.attempt = e.attempt)""",
            (QUEUE,)))[0]
        # A duplicate effect: a ledger row of a job that has more than one, other than the row of
        # the attempt that completed the job (or, for a job not done, its last attempt). Each is
        # explained when pgq.job_events shows that attempt's lease expired (the job was recovered
        # from it): the soak cancels nothing, so no other way to lose a job exists here.
        counts.duplicates, counts.explained = _fetch(conn.execute("""
            WITH multi AS (
                SELECT job_id FROM pgq_soak.effects GROUP BY job_id HAVING count(DISTINCT attempt) > 1
            ), final AS (
                SELECT m.job_id,
                       coalesce((SELECT max(e.attempt) FROM pgq.job_events AS e
                                 WHERE e.job_id = m.job_id AND e.event = 'completed'),
                                (SELECT max(f.attempt) FROM pgq_soak.effects AS f WHERE f.job_id = m.job_id))
                           AS attempt
                FROM multi AS m
            ), dup AS (
                SELECT DISTINCT f.job_id, f.attempt
                FROM pgq_soak.effects AS f JOIN final AS l ON l.job_id = f.job_id
                WHERE f.attempt <> l.attempt
            )
            SELECT count(*),
                   count(*) FILTER (WHERE EXISTS (
                       SELECT FROM pgq.job_events AS e
                       WHERE e.job_id = d.job_id AND e.attempt = d.attempt
                         AND e.event = 'lease_expired'))
            FROM dup AS d"""))
        counts.unexplained = counts.duplicates - counts.explained
        if counts.unexplained:
            for job_id, attempt in conn.execute("""
                    SELECT f.job_id, f.attempt FROM pgq_soak.effects AS f
                    WHERE f.job_id IN (SELECT job_id FROM pgq_soak.effects GROUP BY job_id
                                       HAVING count(DISTINCT attempt) > 1)
                      AND NOT EXISTS (SELECT FROM pgq.job_events AS e WHERE e.job_id = f.job_id
                                      AND e.attempt = f.attempt AND e.event IN ('lease_expired', 'completed'))
                    ORDER BY 1, 2 LIMIT 5""").fetchall():
                events = _fetch(conn.execute("SELECT string_agg(event || '@' || attempt, ' ' ORDER BY id)"
                                      " FROM pgq.job_events WHERE job_id = %s", (job_id,)))[0]
                problems.append(f"unexplained duplicate: job {job_id} attempt {attempt}; events: {events}")
    if counts.lost:
        problems.append(f"{counts.lost} acknowledged job(s) missing from pgq.jobs")
    if counts.completed_twice:
        problems.append(f"{counts.completed_twice} job(s) completed more than once")
    if counts.not_terminal:
        problems.append(f"{counts.not_terminal} job(s) not terminal after the drain")
    if counts.executed_twice:
        problems.append(f"{counts.executed_twice} (job, attempt) pair(s) executed twice")
    if counts.attempts_without_end:
        problems.append(f"{counts.attempts_without_end} attempt(s) never ended after the drain")
    if counts.attempts == 0:
        problems.append("no attempt intervals recorded (is the queue's audit on?): the owner check proves nothing")
    if counts.not_executed:
        problems.append(f"{counts.not_executed} done job(s) without an execution of the completing attempt")
    if counts.unexplained:
        problems.append(f"{counts.unexplained} duplicate effect(s) not explained by an expired lease")
    return problems


def _prepare(dsn: str, migrate_dsn: str | None = None) -> None:
    migrate(migrate_dsn or dsn)  # (yoyo reads one host: a multi-host DSN is migrated on the primary)
    with _connect(dsn) as conn:
        conn.execute(_LEDGER_DDL)
        conn.execute("TRUNCATE pgq_soak.effects")
        conn.execute("SELECT pgq.configure_queue(%s, lease => %s::interval, max_attempts => 1000,"
                     " backoff_base => '100 ms', backoff_cap => '1 s', audit => true)",
                     (QUEUE, f"{LEASE_SECONDS} seconds"))
        left = _fetch(conn.execute("SELECT count(*) FROM pgq.jobs WHERE queue = %s", (QUEUE,)))[0]
        if left:
            raise RuntimeError(f"queue {QUEUE!r} already holds {left} job(s): the soak needs it empty "
                               "(use a fresh database, or prune/delete those jobs)")


def run_soak(minutes: float = 1.0, dsn: str | None = None, seed: int | None = None,
             print_fn: PrintFn = print, workers: int = 4, concurrency: int = 4,
             producers: int = 2, rate: float = 150.0, keep_logs: bool = False, failover: bool = False) -> int:
    """The chaos soak. Returns 0 when every invariant held, 1 otherwise (2 for bad arguments).
    ``rate`` is the producers' target in jobs per second. ``dsn`` None: a throwaway server
    (started with $PGQ_PG_BIN's programs when set), restarted once mid-run. The workers' logs are
    removed at the end unless ``keep_logs`` or the run failed. ``failover``: a throwaway primary
    with a synchronous standby instead, everyone on a multi-host DSN, and instead of the restart
    FAILOVERS failovers (the primary killed with -9, the standby promoted, a new standby made of
    the new primary)."""
    return soak_report(minutes, dsn, seed, print_fn, workers, concurrency, producers, rate, keep_logs, failover)[0]


#: How many failovers ``soak --failover`` makes, spread over the chaos.
FAILOVERS = 3


def soak_report(minutes: float = 1.0, dsn: str | None = None, seed: int | None = None,
                print_fn: PrintFn = print, workers: int = 4, concurrency: int = 4,
                producers: int = 2, rate: float = 150.0, keep_logs: bool = False,
                failover: bool = False) -> tuple[int, SoakCounts]:
    """run_soak, also returning the counts (for the tests)."""
    counts = SoakCounts()
    if minutes <= 0 or workers < 2 or concurrency < 1 or producers < 1 or rate <= 0:
        print_fn("pgq-thin soak: error: needs minutes > 0, at least 2 workers, and concurrency, producers "
                 "and rate > 0")
        return 2, counts
    if failover and dsn is not None:
        print_fn("pgq-thin soak: error: --failover runs on a throwaway primary and standby of its own, not --dsn")
        return 2, counts
    # The pool's complaints about connections the chaos broke are expected: keep them quiet.
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
    seed = seed if seed is not None else random.randrange(2**31)
    rng = random.Random(seed)
    server = None
    pair: ReplicatedPair | None = None
    migrate_dsn: str | None = None
    fleet = None
    prod = None
    log_dir: str | None = None
    try:
        if failover:
            pair = ReplicatedPair(synchronous=True)
            dsn, migrate_dsn = pair.dsn("test"), pair.primary.dsn_for("test")
            print_fn(f"soak: throwaway primary and synchronous standby ({embedded.server_version()}), seed {seed}, "
                     f"{minutes:g} min of chaos with {FAILOVERS} failovers")
        elif dsn is None:
            server = embedded.start()
            dsn = server.url()
            print_fn(f"soak: throwaway {embedded.server_version()}, seed {seed}, {minutes:g} min of chaos")
        else:
            print_fn(f"soak: your database (--dsn), queue {QUEUE!r}, seed {seed}, {minutes:g} min of chaos; "
                     "the server restart is skipped (no control over your server)")
        try:
            _prepare(dsn, migrate_dsn)
        except RuntimeError as exc:
            print_fn(f"pgq-thin soak: error: {exc}")
            return 2, counts
        log_dir = tempfile.mkdtemp(prefix="pgq-soak-")
        fleet = _Fleet(dsn, log_dir, concurrency)
        for slot in range(workers):
            fleet.start(slot)
        prod = _Producers(dsn, producers, rate, rng)
        prod.start()
        print_fn(f"soak: {workers} workers x {concurrency} slots, {producers} producers (~{rate:g} jobs/s), "
                 f"lease {LEASE_SECONDS:g}s; worker logs in {log_dir}"
                 + (" (kept)" if keep_logs else " (removed at the end unless the run fails)"))

        started = time.monotonic()
        chaos_end = started + minutes * 60
        restart_at = started + minutes * 60 * rng.uniform(0.35, 0.6) if server is not None else None
        failover_at = [started + minutes * 60 * (k + rng.uniform(0.3, 0.7)) / FAILOVERS
                       for k in range(FAILOVERS)] if pair is not None else []
        next_action = started + rng.uniform(1.0, 2.0)
        while time.monotonic() < chaos_end:
            fleet.thaw_due()
            now = time.monotonic()
            if restart_at is not None and now >= restart_at:
                assert server is not None
                server.crash()
                time.sleep(rng.uniform(0.5, 2.0))  # the clients notice the server is gone
                server.start()
                counts.restarts += 1
                restart_at = None
                print_fn(f"soak: t={now - started:.0f}s server restarted in immediate mode (SIGQUIT)")
            elif failover_at and now >= failover_at[0]:
                assert pair is not None
                failover_at.pop(0)
                pair.fail_over()  # kill -9, pg_promote(), a new synchronous standby
                counts.failovers += 1
                print_fn(f"soak: t={now - started:.0f}s failover {counts.failovers}: primary killed (-9), standby "
                         f"promoted ({time.monotonic() - now:.1f}s with the new standby)")
            elif now >= next_action:
                action = rng.choices(["kill", "freeze", "connections"], weights=[3, 2, 3])[0]
                running = [s for s, p in fleet.procs.items() if p.alive and s not in fleet.frozen]
                if action == "kill" and len(running) > 1:
                    slot = rng.choice(running)
                    fleet.kill(slot)
                    counts.kills += 1
                    fleet.start(slot)  # a new worker with a new name takes its place
                elif action == "freeze" and len(running) > 1:
                    fleet.freeze(rng.choice(running), LEASE_SECONDS + rng.uniform(0.5, 2.0))
                    counts.freezes += 1
                else:
                    try:
                        counts.connection_kills += _terminate_connections(dsn, rng)
                    except psycopg.Error:
                        pass  # the server is restarting
                next_action = now + rng.uniform(0.5, 2.5)
            fleet.revive_dead()
            time.sleep(0.05)

        prod.stop()
        fleet.thaw_due(everything=True)
        print_fn(f"soak: chaos over after {time.monotonic() - started:.0f}s; draining with healthy workers")
        fleet.revive_dead()
        drain_deadline = time.monotonic() + 120
        while time.monotonic() < drain_deadline:
            left = _one(dsn, "SELECT count(*) FROM pgq.jobs WHERE queue = %s"
                             " AND state NOT IN ('done', 'failed', 'cancelled')", (QUEUE,))
            if left == 0:
                break
            fleet.revive_dead()
            time.sleep(0.5)
        fleet.stop()
        fleet = None

        problems = _check(dsn, prod.acknowledged, counts)
        c = counts
        print_fn("soak: results")
        print_fn(f"  jobs                   {c.jobs} ({c.acknowledged} acknowledged, "
                 f"{prod.errors} enqueue call(s) failed in the chaos); states: "
                 + ", ".join(f"{k} {v}" for k, v in c.states.items()))
        print_fn(f"  executions             {c.executions} ledger rows")
        print_fn(f"  worker kills (-9)      {c.kills}")
        print_fn(f"  worker freezes         {c.freezes} (SIGSTOP past the lease)")
        print_fn(f"  connection kills       {c.connection_kills}")
        if pair is not None:
            print_fn(f"  failovers              {c.failovers} (kill -9 of the primary, standby promoted); "
                     f"fence moves {_one(dsn, 'SELECT moves FROM pgq.fence')}")
        else:
            print_fn(f"  server restarts        {c.restarts}" + ("" if server is not None else " (skipped: --dsn)"))
        print_fn(f"  reclaims               {c.reclaims} (lease_expired events)")
        print_fn(f"  stale writes rejected  {c.rejected}")
        print_fn(f"  duplicate effects      {c.duplicates}: {c.explained} explained, {c.unexplained} unexplained")
        handover = "-" if c.closest_handover_ms is None else f"{c.closest_handover_ms:.3f} ms"
        print_fn(f"  two live owners        {c.overlapping_attempts} overlapping live attempts among {c.attempts} "
                 f"attempt intervals (database clock; closest hand-over {handover}); {c.executed_twice} attempts "
                 "executed twice")
        print_fn(f"  at least once          {c.not_executed} done jobs without an execution of their "
                 "completing attempt")
        print_fn(f"  lost {c.lost}, completed twice {c.completed_twice}, not terminal {c.not_terminal}")
        for problem in problems:
            print_fn(f"  FAILED: {problem}")
        print_fn("soak: OK, every invariant held" if not problems else "soak: FAILED")
        if problems or keep_logs:
            print_fn(f"soak: the worker logs are kept in {log_dir}")
            keep_logs = True
        return (0 if not problems else 1), counts
    finally:
        if prod is not None:
            prod.stop()
        if fleet is not None:
            fleet.stop()
        if log_dir is not None and not keep_logs:
            shutil.rmtree(log_dir, ignore_errors=True)
        if server is not None:
            server.stop()
        if pair is not None:
            pair.close()


# The old-snapshot run --------------------------------------------------------------------------------


def _dead_tuples(dsn: str) -> int:
    with _connect(dsn) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        return int(_fetch(conn.execute("SELECT coalesce(n_dead_tup, 0) FROM pg_stat_user_tables"
                                " WHERE schemaname = 'pgq' AND relname = 'jobs'"))[0])


def _vacuum(dsn: str) -> None:
    with _connect(dsn) as conn:
        conn.execute("VACUUM pgq.jobs")


@dataclass
class PhaseFigures:
    name: str
    claims: int = 0
    latencies: list[float] = field(default_factory=list)
    dead_tuples: list[int] = field(default_factory=list)

    def line(self) -> str:
        lat = sorted(self.latencies) or [0.0]
        p50 = statistics.median(lat) * 1000
        p95 = lat[min(len(lat) - 1, int(len(lat) * 0.95))] * 1000
        dead = self.dead_tuples or [0]
        return (f"  {self.name:<8} claims {self.claims:>6}  claim latency p50 {p50:6.2f} ms  p95 {p95:6.2f} ms"
                f"  max {max(lat) * 1000:7.2f} ms  dead tuples start {dead[0]:>6} end {dead[-1]:>6} max {max(dead):>6}")


def run_old_snapshot(seconds: float = 20.0, dsn: str | None = None, print_fn: PrintFn = print,
                     rate: float = 300.0) -> dict[str, PhaseFigures]:
    """A steady load (enqueue, claim, complete) measured before, during and after a REPEATABLE
    READ transaction holds a snapshot for ``seconds``. The claims are made by this process (so
    their latency is measured where it happens). After the snapshot ends, VACUUM pgq.jobs runs
    (autovacuum would too, later). Returns the figures of each phase."""
    server = None
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
    try:
        if dsn is None:
            server = embedded.start()
            dsn = server.url()
        _prepare(dsn)
        print_fn(f"old snapshot: {embedded.server_version() if server else 'your database'}, "
                 f"~{rate:g} jobs/s, snapshot held {seconds:g}s")
        phases = {name: PhaseFigures(name) for name in ("before", "during", "after")}
        with Client(dsn, min_size=2, max_size=2) as client:
            def load(phase: PhaseFigures, duration: float) -> None:
                end = time.monotonic() + duration
                next_sample = 0.0
                while time.monotonic() < end:
                    client.enqueue_many(QUEUE, "soak.work", [{"ms": 0}] * max(1, int(rate / 20)))
                    while True:
                        t0 = time.perf_counter()
                        jobs = client.claim("old-snapshot", [QUEUE], batch=10)
                        phase.latencies.append(time.perf_counter() - t0)
                        if not jobs:
                            break
                        client.complete_many([j.id for j in jobs], [j.attempt for j in jobs])
                        phase.claims += len(jobs)
                    if time.monotonic() >= next_sample:
                        phase.dead_tuples.append(_dead_tuples(dsn))
                        next_sample = time.monotonic() + 1.0
                    time.sleep(0.05)
                phase.dead_tuples.append(_dead_tuples(dsn))

            load(phases["before"], max(3.0, seconds / 4))
            with _connect(dsn) as holder:
                holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                held = _fetch(holder.execute("SELECT count(*) FROM pgq.jobs"))[0]
                print_fn(f"  a REPEATABLE READ transaction took its snapshot ({held} jobs visible to it)")
                load(phases["during"], seconds)
                before_vacuum = _dead_tuples(dsn)
                _vacuum(dsn)
                print_fn(f"  VACUUM while the snapshot is held: dead tuples {before_vacuum} -> {_dead_tuples(dsn)}"
                         " (it may remove nothing the snapshot could still see)")
                phases["during"].dead_tuples.append(_dead_tuples(dsn))
                holder.execute("COMMIT")
            print_fn("  the snapshot ended; VACUUM pgq.jobs")
            _vacuum(dsn)
            load(phases["after"], max(3.0, seconds / 4))
        for phase in phases.values():
            print_fn(phase.line())
        return phases
    finally:
        if server is not None:
            server.stop()


def old_snapshot_problems(phases: dict[str, PhaseFigures]) -> list[str]:
    """The functional checks of the old-snapshot run (no timing thresholds): claims work before,
    during and after the snapshot; the VACUUM run while it was held left dead tuples behind, and
    the one after it ended removed most of them."""
    problems = [f"no claim succeeded {name} the snapshot" for name, phase in phases.items() if phase.claims == 0]
    held = phases["during"].dead_tuples[-1] if phases["during"].dead_tuples else 0
    after = phases["after"].dead_tuples[0] if phases["after"].dead_tuples else 0
    if held == 0:
        problems.append("no dead tuples piled up under the snapshot: the run proves nothing")
    elif after >= held / 2:
        problems.append(f"dead tuples did not fall after the snapshot ended: {held} held, {after} after VACUUM")
    return problems


def run_old_snapshot_check(seconds: float = 20.0, dsn: str | None = None, print_fn: PrintFn = print) -> int:
    """run_old_snapshot, then its checks: 0 when they hold, 1 otherwise (for pgq-thin soak --old-snapshot)."""
    problems = old_snapshot_problems(run_old_snapshot(seconds, dsn, print_fn))
    for problem in problems:
        print_fn(f"  FAILED: {problem}")
    print_fn("old snapshot: OK, claims kept working and dead tuples recovered" if not problems
             else "old snapshot: FAILED")
    return 0 if not problems else 1
