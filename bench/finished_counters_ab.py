"""What migration 0010's counter trigger costs a completion, measured inside one database: the
same server-side loop of pgq.complete calls with the trigger jobs_ended enabled (B) and
disabled (A), alternately, for bench/README.md ("Migration 0010: counters of finished jobs").

    .venv/bin/python bench/finished_counters_ab.py [--jobs 2000] [--repeats 10] [--fsync on|off]

The two-database A/B of the migrations (python -m pgq_tools.bench JOBS WORKERS REPEATS
0007_failover_fence 0010_finished_counters) measures the whole claim + complete; on a loaded
machine its spread is wider than what one INSERT costs. Here each round claims ``--jobs`` jobs
(one pgq.claim of the batch, not timed), then times one DO loop that completes them one by one,
each committed (as autocommit clients do): microseconds per completion, trigger on and off in
turn, on one throwaway PostgreSQL. The same for pgq.complete_many of batches of 10. Besides the
wall clock, the server process's CPU time per job (/proc/PID/schedstat; run it as root or as the
server's account): on a machine other processes load, the CPU time is the steadier of the two.
Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import psycopg

from pgq_thin.migrate import migrate
from pgq_thin.testing.server import SERVER_SETTINGS, ThrowawayPostgres

ONE_BY_ONE = """
DO $$
DECLARE r record;
BEGIN
    FOR r IN SELECT id, attempt FROM pgq.jobs WHERE state = 'running' ORDER BY id LOOP
        PERFORM pgq.complete(r.id, r.attempt);
        COMMIT;
    END LOOP;
END $$"""

BATCHES_OF_10 = """
DO $$
DECLARE r record;
BEGIN
    FOR r IN SELECT array_agg(id ORDER BY id) AS ids, array_agg(attempt ORDER BY id) AS attempts
             FROM pgq.jobs WHERE state = 'running' GROUP BY id / 10 LOOP
        PERFORM pgq.complete_many(r.ids, r.attempts);
        COMMIT;
    END LOOP;
END $$"""


def cpu_ns(pid: int) -> int:
    """The CPU time the server process ``pid`` has used (/proc/PID/schedstat, nanoseconds): the
    loop's own cost, which the other processes of a loaded machine do not inflate the way they
    stretch its wall-clock time."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


def round_us(conn: psycopg.Connection[Any], loop: str, jobs: int, trigger: bool) -> tuple[float, float]:
    conn.execute("TRUNCATE pgq.jobs, pgq.job_events, pgq.finished_deltas, pgq.finished_counts")
    conn.execute(f"ALTER TABLE pgq.jobs {'ENABLE' if trigger else 'DISABLE'} TRIGGER jobs_ended")
    conn.execute("SELECT pgq.enqueue_many('bench', 'noop', array_fill('{}'::jsonb, ARRAY[%s]))", (jobs,))
    claimed = 0
    while claimed < jobs:  # a claim takes at most 1000
        claimed += len(conn.execute("SELECT id FROM pgq.claim('ab', ARRAY['bench'], %s)",
                                    (min(1000, jobs - claimed),)).fetchall())
    conn.execute("VACUUM ANALYZE pgq.jobs")
    conn.execute("VACUUM pgq.finished_deltas")
    pid = conn.info.backend_pid
    cpu_before, started = cpu_ns(pid), time.perf_counter()
    conn.execute(loop)
    elapsed, cpu = time.perf_counter() - started, cpu_ns(pid) - cpu_before
    done = conn.execute("SELECT count(*) FROM pgq.jobs WHERE state = 'done'").fetchone()
    deltas = conn.execute("SELECT count(*) FROM pgq.finished_deltas").fetchone()
    assert done == (jobs,) and deltas == ((jobs if trigger else 0),), (done, deltas)
    return elapsed / jobs * 1e6, cpu / jobs / 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--fsync", choices=("on", "off"), default="on")
    args = parser.parse_args()
    server = ThrowawayPostgres(postgres_args=f"{SERVER_SETTINGS} -c fsync={args.fsync}")
    server.start()
    try:
        dsn = server.url()
        migrate(dsn)
        result: dict[str, Any] = {"jobs": args.jobs, "repeats": args.repeats, "loadavg_before": os.getloadavg()}
        with psycopg.connect(dsn, autocommit=True) as conn:
            result["server_version"] = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
            result["fsync"] = conn.execute("SHOW fsync").fetchone()[0]  # type: ignore[index]
            for name, loop, per in (("complete", ONE_BY_ONE, 1), ("complete_many_10", BATCHES_OF_10, 10)):
                us: dict[str, list[float]] = {"A trigger off": [], "B trigger on": []}
                cpu: dict[str, list[float]] = {"A trigger off": [], "B trigger on": []}
                for r in range(args.repeats + 1):  # the first round warms up and is not counted
                    for label in (list(us) if r % 2 == 0 else list(us)[::-1]):
                        wall, on_cpu = round_us(conn, loop, args.jobs, trigger=label.startswith("B"))
                        if r:
                            us[label].append(round(wall, 2))
                            cpu[label].append(round(on_cpu, 2))
                med = {k: statistics.median(v) for k, v in us.items()}
                low = {k: min(v) for k, v in us.items()}
                cpu_med = {k: statistics.median(v) for k, v in cpu.items()}
                result[name] = {"us_per_job": us, "median_us": med, "min_us": low,
                                "ratio_of_medians": med["B trigger on"] / med["A trigger off"],
                                "ratio_of_mins": low["B trigger on"] / low["A trigger off"],
                                "server_cpu_us_per_job": cpu, "median_cpu_us": cpu_med,
                                "cpu_us_added_per_job": cpu_med["B trigger on"] - cpu_med["A trigger off"],
                                "ratio_of_cpu_medians": cpu_med["B trigger on"] / cpu_med["A trigger off"],
                                "jobs_per_call": per}
        result["loadavg_after"] = os.getloadavg()
        print(json.dumps(result, indent=1))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
