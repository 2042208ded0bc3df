"""Issue 40's held-snapshot target: the Worker's drain of 200,000 jobs while a REPEATABLE READ
snapshot is held through it is at least 0.8x the same drain without. For bench/README.md ("Drain
of 200,000 jobs while a REPEATABLE READ snapshot is held").

    .venv/bin/python bench/held_snapshot.py [--jobs 200000] [--rounds 2] [--systems "pgq worker,pgq b10"]
                                            [--workers 4,16] [--poll 0.1] [--statements]

One throwaway PostgreSQL (fsync on), pgq installed by this checkout, pgq_tools.bench's own loader,
consumers and clock (_timed_drain: from starting the consumers to an outside observer first counting
all N jobs done; the observer polls every ``--poll`` s, not _timed_drain's 0.005 s, whose counts
would keep one of the two CPUs busy through a drain of 200,000): ``pgq worker`` = the Worker with
its defaults and concurrency W; ``pgq b10`` = W threads of the SQL API, pgq.claim(batch => 10) + one
pgq.complete_many. Each drain runs twice, once as it is ("none") and once while another connection
holds a REPEATABLE READ transaction that read pgq.jobs (a count of the loaded jobs) after the load
and before the consumers start, and ends after the observer saw all N done ("held"); a drain
observed longer than ``--timeout`` s is reported by the jobs done by then (rate = done / timeout,
marked unfinished; the snapshot is then released and the rest drained unobserved). Every round runs
each (system, W) pair in both variants, the order of the two alternating between rounds. Prints
JSON: jobs/s per drain, medians, held/none ratio of medians. ``--statements``: the server loads
pg_stat_statements (track = all, so the statements inside pgq's functions count too), reset after
each load; each drain's result then carries its top statements by total time (calls, ms, shared
buffers, rows).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from typing import Any

import psycopg

from pgq_thin.testing.server import SERVER_SETTINGS, ThrowawayPostgres
from pgq_tools import bench


def observed_drain(dsn: str, system: str, workers: int, n: int, timeout: float,
                   holder: psycopg.Connection[Any] | None, poll: float) -> dict[str, Any]:
    """``bench._timed_drain``'s clock (consumers started to an outside observer first counting n
    done, polled every ``poll`` s), with the done count sampled every 5 s, and a
    ``timeout``: past it, the done count so far is the result (rate = done / timeout), the holder's
    snapshot is released and the consumers finish the rest unobserved."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            bench._consumers(dsn, system, workers, stop)
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    samples: list[tuple[float, int]] = []
    with bench._connect(dsn) as observer:
        thread = threading.Thread(target=run, daemon=True)
        started = time.perf_counter()
        thread.start()
        try:
            while True:
                done = bench._done_count(observer, system)
                elapsed = time.perf_counter() - started
                if not samples or elapsed - samples[-1][0] >= 5:
                    samples.append((round(elapsed, 1), done))
                if done >= n or elapsed > timeout or errors:
                    break
                time.sleep(poll)
            if holder is not None:
                holder.rollback()  # past a timeout: let the consumers finish the rest
            if done < n:  # wait for the threads of the SQL API (a Worker is stopped below)
                while bench._done_count(observer, system) < n and not errors:
                    time.sleep(0.1)
        finally:
            stop.set()
            thread.join(timeout=120)
    if errors:
        raise errors[0]
    return {"seconds": round(elapsed, 2), "done_in_time": done, "finished": done >= n,
            "jobs_per_s": round(done / elapsed, 1), "samples": samples}


TOP_STATEMENTS = """
    SELECT calls, round(total_exec_time)::bigint AS ms, shared_blks_hit + shared_blks_read AS buffers, rows,
           left(regexp_replace(query, '\\s+', ' ', 'g'), 100) AS query
    FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT 8"""


def one_drain(dsn: str, system: str, workers: int, n: int, held: bool, timeout: float,
              poll: float, statements: bool) -> dict[str, Any]:
    """Load n jobs, drain them with ``system`` (a REPEATABLE READ snapshot held through it when
    ``held``), check the done count."""
    with bench._connect(dsn) as conn:
        bench._reset(conn)
        bench._set_mode(conn, True)
        bench._load_pgq(conn, n)
        conn.execute("CHECKPOINT")
        if statements:
            conn.execute("SELECT pg_stat_statements_reset()")
    holder = None
    if held:
        holder = psycopg.connect(dsn)
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        seen = holder.execute("SELECT count(*) FROM pgq.jobs WHERE state = 'pending'").fetchone()
        assert seen == (n,), seen
    try:
        result = observed_drain(dsn, system, workers, n, timeout, holder, poll)
    finally:
        if holder is not None:
            holder.rollback()
            holder.close()
    with bench._connect(dsn) as conn:
        done = bench._done_count(conn, system)
        if statements:
            result["statements"] = [dict(zip(("calls", "ms", "buffers", "rows", "query"), row))
                                    for row in conn.execute(TOP_STATEMENTS)]
    if done != n:
        raise RuntimeError(f"{system}: {done} jobs done, expected {n}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", default="4,16")
    parser.add_argument("--systems", default="pgq worker,pgq b10")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds a drain is observed; past it, the jobs done so far give its rate")
    parser.add_argument("--poll", type=float, default=0.1,
                        help="seconds between the observer's counts (each a count(*) of the done jobs: "
                             "at 200,000 jobs ~30 ms, so bench.OBSERVER_POLL's 0.005 s would keep one "
                             "of two CPUs counting)")
    parser.add_argument("--statements", action="store_true",
                        help="count each drain's statements with pg_stat_statements (track = all)")
    args = parser.parse_args()
    workers = [int(w) for w in args.workers.split(",")]
    systems = args.systems.split(",")
    wall = time.perf_counter()
    statements = (" -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all"
                  if args.statements else "")
    server = ThrowawayPostgres(postgres_args=f"{SERVER_SETTINGS} -c fsync=on{statements}")
    server.start()
    try:
        dsn = server.url()
        bench._prepare_database(dsn)
        if args.statements:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        with psycopg.connect(dsn, autocommit=True) as conn:
            settings = {k: conn.execute(f"SHOW {k}").fetchone()[0]  # type: ignore[index]
                        for k in ("server_version", "fsync", "synchronous_commit", "shared_buffers")}
        result: dict[str, Any] = {"jobs": args.jobs, "rounds": args.rounds, "poll": args.poll, "settings": settings,
                                  "cpus": os.cpu_count(), "loadavg_before": os.getloadavg(), "drains": []}
        rates: dict[str, dict[str, list[float]]] = {}
        for r in range(args.rounds):
            for system in systems:
                for w in workers:
                    key = f"{system} W{w}"
                    for held in ((False, True) if r % 2 == 0 else (True, False)):
                        started = time.perf_counter()
                        drain = one_drain(dsn, system, w, args.jobs, held, args.timeout, args.poll,
                                          args.statements)
                        variant = "held" if held else "none"
                        rates.setdefault(key, {"none": [], "held": []})[variant].append(drain["jobs_per_s"])
                        drain.update({"round": r, "drain": key, "variant": variant,
                                      "s_with_load": round(time.perf_counter() - started, 1),
                                      "loadavg": os.getloadavg()})
                        result["drains"].append(drain)
                        print(json.dumps(drain), flush=True)
        result["summary"] = {
            k: {"none": v["none"], "held": v["held"], "median_none": statistics.median(v["none"]),
                "median_held": statistics.median(v["held"]),
                "held_over_none": round(statistics.median(v["held"]) / statistics.median(v["none"]), 2)}
            for k, v in rates.items()}
        result["loadavg_after"] = os.getloadavg()
        result["wall_s"] = round(time.perf_counter() - wall, 1)
        print(json.dumps(result, indent=1))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
