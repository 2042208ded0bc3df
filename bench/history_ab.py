"""Issue 40's history target: every read an operator repeats costs the same at 10,000,000 finished
jobs as with none (within 1.2x). For bench/README.md ("History of 10,000,000 finished jobs, A/B").

    .venv/bin/python bench/history_ab.py [--history 10000000] [--backlog 20000] [--rounds 8]
                                         [--settings "-c wal_compression=lz4"] [--finished-queues 4]

One throwaway PostgreSQL (fsync on), two databases migrated by this checkout:

- A: a live backlog of ``--backlog`` pending jobs in queue q0 (plus 200 jobs claimed and completed
  through the API, so that A has finished jobs to read too: in q0, or with ``--finished-queues 4``
  50 in each of q0..q3, the queues that hold B's history, so that a page of every queue's done
  jobs reads as many queues in A as in B);
- B: the same, and ``--history`` finished jobs, inserted and vacuumed before the backlog
  (``--layout gaps``, the default: the backlog lands in the room the history's pages have left,
  one or two jobs a page) or after it (``--layout own``: the backlog in pages of its own), over queues
  q0..q3: 80% done, 15% failed, 5% cancelled, finished_at spread over the last 6 days (inside the
  default retention of 7 days), created_at up to a minute before, results and errors of a
  realistic size; pgq.finished_counts raised by the same numbers (what the trigger would have
  counted). INSERT ... SELECT generate_series in chunks of 500,000, each committed.

Then VACUUM ANALYZE and CHECKPOINT of both, and each read, timed call by call on open connections
(the CLI opens its own, as a user's does), in ``--rounds`` rounds that alternate which database
goes first: pgq.stats(); the dashboard's overview page (GET /) and the poll its chart makes
(GET /api/queues), through the real app in Starlette's TestClient; ``pgq-thin stats`` (cli.main,
in process, its output discarded); list_jobs (first page: no filter, state pending, state done,
queue q0 + state done); get_job and job_result of a job completed through the API; claim + complete
of the backlog (pairs, one connection). Medians per read and the B/A ratio of medians; the
plans of the reads over 1.2x are printed (auto_explain of the statements their pgq function runs,
analyzed, sent as notices), the WAL written per call (the cluster's, median over the batches), and
the HOT share of the updates the reads made. Prints JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo
from starlette.testclient import TestClient

from pgq_thin import AsyncClient, Client
from pgq_thin.cli import main as cli_main
from pgq_thin.dashboard.app import create_app
from pgq_thin.migrate import migrate
from pgq_thin.testing.server import SERVER_SETTINGS, ThrowawayPostgres

CHUNK = 500_000

# One chunk of history: jobs [lo, hi) of the series, spread over four queues and three end states.
HISTORY = """
INSERT INTO pgq.jobs (queue, kind, payload, state, run_at, created_at, attempt, max_attempts,
                      claimed_by, claimed_at, finished_at, result, last_error, last_event)
SELECT 'q' || (g %% 4), 'kind' || (g %% 7), jsonb_build_object('n', g, 'to', 'user' || g || '@example.com'),
       s.state, f.at - interval '2 seconds', f.at - interval '1 minute' * random(),
       CASE WHEN s.state = 'cancelled' THEN 0 WHEN s.state = 'failed' THEN 3 ELSE 1 END, 3,
       CASE WHEN s.state = 'cancelled' THEN NULL ELSE 'worker-' || (g %% 16) END,
       CASE WHEN s.state = 'cancelled' THEN NULL ELSE f.at - interval '1 second' END,
       f.at,
       CASE WHEN s.state = 'done' THEN jsonb_build_object('ok', true, 'n', g) END,
       CASE WHEN s.state = 'failed' THEN 'ConnectionError: smtp said no (attempt 3 of 3)' END,
       CASE s.state WHEN 'done' THEN 'completed' WHEN 'failed' THEN 'failed' ELSE 'cancelled' END
FROM generate_series(%(lo)s::bigint, %(hi)s::bigint - 1) AS g
CROSS JOIN LATERAL (SELECT (CASE WHEN g %% 20 < 16 THEN 'done' WHEN g %% 20 < 19 THEN 'failed'
                                 ELSE 'cancelled' END)::pgq.job_state AS state) AS s
CROSS JOIN LATERAL (SELECT now() - interval '6 days' * (1 - g::float8 / %(total)s) AS at) AS f
"""

COUNTERS = """
INSERT INTO pgq.finished_counts (queue, state, total)
SELECT queue, state, count(*) FROM pgq.jobs WHERE state IN ('done', 'failed', 'cancelled')
  AND id <= %(upto)s GROUP BY queue, state
ON CONFLICT (queue, state) DO UPDATE SET total = pgq.finished_counts.total + excluded.total
"""


def enqueue_backlog(conn: psycopg.Connection[Any], backlog: int) -> None:
    conn.execute("SELECT pgq.enqueue_many('q0', 'noop', array_fill('{}'::jsonb, ARRAY[%s]))", (backlog,))


def fill(dsn: str, history: int, backlog: int, layout: str, finished_queues: int = 1) -> dict[str, Any]:
    """Migrate ``dsn``, insert ``history`` finished jobs and the backlog (``layout`` "gaps": the
    backlog after the history, so that it lands in the space the history's pages have left;
    "own": the backlog first, in pages of its own), then finish 200 jobs through the API: of the
    backlog, or (``finished_queues`` > 1) as many from each of q0, q1... (the backlog's, and jobs
    enqueued into the others for it)."""
    started = time.perf_counter()
    migrate(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for q in range(4):
            conn.execute("SELECT pgq.configure_queue(%s)", (f"q{q}",))
        if layout == "own":
            enqueue_backlog(conn, backlog)
        for lo in range(0, history, CHUNK):
            conn.execute(HISTORY, {"lo": lo, "hi": min(lo + CHUNK, history), "total": history})
        if history:
            upto = conn.execute("SELECT max(id) FROM pgq.jobs").fetchone()[0]  # type: ignore[index]
            conn.execute(COUNTERS, {"upto": upto})
        filled = time.perf_counter() - started
        if layout == "gaps":
            # The free space map learns of the room the history's pages have left (fillfactor 90 and
            # each page's tail) from a vacuum: an autovacuum may run during the fill or not, this one does.
            conn.execute("VACUUM pgq.jobs")
            enqueue_backlog(conn, backlog)
    with Client(dsn, max_size=1) as client:
        each = 200 // finished_queues
        for q in range(finished_queues):
            if q:
                client.enqueue_many(f"q{q}", "noop", [{}] * each)
            for job in client.claim("setup", [f"q{q}"], batch=each):
                client.complete(job.id, job.attempt, {"ok": True})
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
        conn.execute("CHECKPOINT")
        size = conn.execute("SELECT pg_size_pretty(pg_total_relation_size('pgq.jobs'))").fetchone()[0]  # type: ignore[index]
        states: dict[str, int] = dict(conn.execute("SELECT state::text, count(*) FROM pgq.jobs GROUP BY 1").fetchall())
        pages = conn.execute(PENDING_PAGES).fetchone()[0]  # type: ignore[index]
    return {"fill_s": round(filled, 1), "total_s": round(time.perf_counter() - started, 1),
            "jobs_table": size, "states": states, "heap_pages_holding_pending_jobs": pages}


#: How many heap pages the pending jobs are spread over (a count by state reads one per job).
PENDING_PAGES = "SELECT count(DISTINCT (ctid::text::point)[0]) FROM pgq.jobs WHERE state = 'pending'"
#: The WAL the cluster wrote since an LSN (one batch of calls of one database: the rounds run one at a time).
WAL_LSN = "SELECT pg_current_wal_insert_lsn()"
WAL_SINCE = "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), %s)"
#: The updates of pgq.jobs so far, and how many of them were HOT (the new version in the same page).
UPDATES = "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = 'pgq.jobs'::regclass"


class Reads:
    """The reads of one database, each a callable that does one call."""

    def __init__(self, dsn: str, stack: contextlib.ExitStack) -> None:
        self.dsn = dsn
        self.client = stack.enter_context(Client(dsn, max_size=1))
        self.http = stack.enter_context(TestClient(create_app(lambda: AsyncClient(dsn, max_size=2))))
        self.conn = stack.enter_context(psycopg.connect(dsn, autocommit=True))
        self.finished_id = self.conn.execute(FINISHED_ID).fetchone()[0]  # type: ignore[index]

    def ops(self) -> dict[str, Callable[[], Any]]:
        c, fid = self.client, self.finished_id

        def page(path: str) -> Callable[[], Any]:
            def get() -> None:
                response = self.http.get(path)
                assert response.status_code == 200, (path, response.status_code, response.text[:300])
            return get

        def cli_stats() -> None:
            with contextlib.redirect_stdout(io.StringIO()):
                assert cli_main(["stats", "--dsn", self.dsn]) == 0

        def claim_complete() -> None:
            [job] = c.claim("bench", ["q0"])
            assert c.complete(job.id, job.attempt)

        return {
            "pgq.stats()": lambda: self.conn.execute("SELECT * FROM pgq.stats()").fetchall(),
            "client.stats()": c.stats,
            "dashboard GET / (overview)": page("/"),
            "dashboard GET /api/queues": page("/api/queues"),
            "pgq-thin stats (cli.main)": cli_stats,
            "list_jobs()": lambda: c.list_jobs(),
            "list_jobs(state=pending)": lambda: c.list_jobs(state="pending"),
            "list_jobs(state=done)": lambda: c.list_jobs(state="done"),
            "list_jobs(q0, done)": lambda: c.list_jobs("q0", "done"),
            "get_job(finished)": lambda: c.get_job(fid),
            "job_result(finished)": lambda: c.job_result(fid),
            "claim + complete": claim_complete,
        }


#: calls per round: the CLI opens a connection each time (tens of ms); the rest take about 1 ms.
CALLS = {"pgq-thin stats (cli.main)": 5, "dashboard GET / (overview)": 10, "claim + complete": 100}

#: The finished job whose get_job and job_result are timed: the newest done job of q0.
FINISHED_ID = "SELECT max(id) FROM pgq.jobs WHERE state = 'done' AND queue = 'q0'"

EXPLAIN = {
    "pgq.stats()": "SELECT * FROM pgq.stats()",
    "client.stats()": "SELECT * FROM pgq.stats()",
    "list_jobs()": "SELECT * FROM pgq.list_jobs()",
    "list_jobs(state=pending)": "SELECT * FROM pgq.list_jobs(state => 'pending')",
    "list_jobs(state=done)": "SELECT * FROM pgq.list_jobs(state => 'done')",
    "list_jobs(q0, done)": "SELECT * FROM pgq.list_jobs('q0', 'done')",
    "dashboard GET / (overview)": "SELECT * FROM pgq.health()",
    "dashboard GET /api/queues": "SELECT * FROM pgq.queue_settings()",
    "get_job(finished)": f"SELECT * FROM pgq.get_job(({FINISHED_ID}))",
    "job_result(finished)": f"SELECT * FROM pgq.job_result(({FINISHED_ID}))",
}


def nested_plans(dsn: str, sql: str) -> list[str]:
    """The plans of the statements ``sql`` runs inside pgq's functions (auto_explain, its
    analyze and buffers, sent to this session as notices)."""
    notes: list[str] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.add_notice_handler(lambda d: notes.append(d.message_primary or ""))
        for setting in ("LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0",
                        "SET auto_explain.log_nested_statements = on", "SET auto_explain.log_analyze = on",
                        "SET auto_explain.log_buffers = on", "SET auto_explain.log_level = notice",
                        "SET client_min_messages = notice"):
            conn.execute(setting)
        conn.execute(sql).fetchall()
    return notes


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--history", type=int, default=10_000_000)
    parser.add_argument("--backlog", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--calls", type=int, default=30, help="calls per read per round (some reads differ)")
    parser.add_argument("--layout", choices=("gaps", "own"), default="gaps",
                        help="B's backlog enqueued after the history (gaps, default) or before it (own)")
    parser.add_argument("--finished-queues", type=int, choices=(1, 2, 4), default=1,
                        help="the 200 jobs finished through the API in both databases: in q0 only (1, default), "
                             "or spread over q0..q3 (4), the queues B's history is in")
    parser.add_argument("--settings", default="",
                        help="more server settings, as postgres takes them (e.g. \"-c wal_compression=lz4\")")
    args = parser.parse_args()
    wall = time.perf_counter()
    server = ThrowawayPostgres(postgres_args=f"{SERVER_SETTINGS} -c fsync=on -c max_wal_size=8GB {args.settings}")
    server.start()
    try:
        admin = server.url()
        with psycopg.connect(admin, autocommit=True) as conn:
            for name in ("hist_a", "hist_b"):
                conn.execute(f"CREATE DATABASE {name}")
            fsync = conn.execute("SHOW fsync").fetchone()[0]  # type: ignore[index]
            version = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
        dsns = {"A": make_conninfo(admin, dbname="hist_a"), "B": make_conninfo(admin, dbname="hist_b")}
        result: dict[str, Any] = {"history": args.history, "backlog": args.backlog, "rounds": args.rounds,
                                  "fsync": fsync, "server_version": version, "cpus": os.cpu_count(),
                                  "settings": args.settings}
        result["layout"] = args.layout
        result["finished_queues"] = args.finished_queues
        result["fill"] = {"A": fill(dsns["A"], 0, args.backlog, args.layout, args.finished_queues),
                          "B": fill(dsns["B"], args.history, args.backlog, args.layout, args.finished_queues)}
        print(json.dumps(result["fill"]), flush=True)
        result["loadavg_before"] = os.getloadavg()
        times: dict[str, dict[str, list[float]]] = {}
        with contextlib.ExitStack() as stack:
            reads = {k: Reads(dsn, stack) for k, dsn in dsns.items()}
            ops = {k: r.ops() for k, r in reads.items()}
            for name in ops["A"]:
                for k in "AB":  # warm up: caches, prepared statements
                    for _ in range(3):
                        ops[k][name]()
            updates_before = {k: r.conn.execute(UPDATES).fetchone() for k, r in reads.items()}
            wal = stack.enter_context(psycopg.connect(admin, autocommit=True))
            wal_bytes: dict[str, dict[str, list[float]]] = {}
            for r in range(args.rounds):
                for name in ops["A"]:
                    for k in ("AB" if r % 2 == 0 else "BA"):
                        op, calls = ops[k][name], CALLS.get(name, args.calls)
                        lsn = wal.execute(WAL_LSN).fetchone()[0]  # type: ignore[index]
                        for _ in range(calls):
                            t = time.perf_counter()
                            op()
                            times.setdefault(name, {"A": [], "B": []})[k].append((time.perf_counter() - t) * 1e3)
                        written = wal.execute(WAL_SINCE, (lsn,)).fetchone()[0]  # type: ignore[index]
                        wal_bytes.setdefault(name, {"A": [], "B": []})[k].append(written / calls)
            result["loadavg_after"] = os.getloadavg()
            time.sleep(1)  # the statistics collector's delay (PostgreSQL 15: up to 0.5 s)
            result["updates_during_reads"] = {}
            for k, rd in reads.items():
                rd.conn.execute("SELECT pg_stat_clear_snapshot()")
                (upd0, hot0), (upd1, hot1) = updates_before[k], rd.conn.execute(UPDATES).fetchone()  # type: ignore[misc]
                result["updates_during_reads"][k] = {"updates": upd1 - upd0, "hot": hot1 - hot0}
                pages = rd.conn.execute(PENDING_PAGES).fetchone()[0]  # type: ignore[index]
                result["fill"][k]["heap_pages_holding_pending_jobs_after"] = pages
            table = {}
            for name, per in times.items():
                med = {k: statistics.median(v) for k, v in per.items()}
                table[name] = {"A_ms": round(med["A"], 3), "B_ms": round(med["B"], 3),
                               "ratio": round(med["B"] / med["A"], 2), "calls": len(per["A"]),
                               "A_wal_bytes_per_call": round(statistics.median(wal_bytes[name]["A"])),
                               "B_wal_bytes_per_call": round(statistics.median(wal_bytes[name]["B"])),
                               "A_p90_ms": round(statistics.quantiles(per["A"], n=10)[-1], 3),
                               "B_p90_ms": round(statistics.quantiles(per["B"], n=10)[-1], 3)}
            result["reads"] = table
            result["over_1.2"] = [n for n, t in table.items() if t["ratio"] > 1.2]
            print(json.dumps(table, indent=1), flush=True)
            plans = {}
            for name in result["over_1.2"]:
                if name in EXPLAIN:
                    for k in "AB":
                        try:
                            plans[f"{name} {k}"] = nested_plans(dsns[k], EXPLAIN[name])
                        except psycopg.Error as exc:  # the measurements stand without it
                            plans[f"{name} {k}"] = [f"no plan: {exc}"]
            result["plans"] = plans
        result["wall_s"] = round(time.perf_counter() - wall, 1)
        print(json.dumps(result, indent=1))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
