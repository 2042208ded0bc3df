"""What migration 0010's counter trigger costs a completion, measured inside one database: the
same server-side loop of pgq.complete calls with the trigger jobs_count_finished enabled (B) and
disabled (A), alternately, for bench/README.md ("Migration 0010: counters of finished jobs").

    .venv/bin/python bench/finished_counters_ab.py [--jobs 2000] [--repeats 10] [--fsync on|off]

The two-database A/B of the migrations (python -m pgq_thin.tools.bench JOBS WORKERS REPEATS
0007_failover_fence 0010_finished_counters) measures the whole claim + complete; on a loaded
machine its spread is wider than what one INSERT costs. Here each round claims ``--jobs`` jobs
(one pgq.claim of the batch, not timed), then times one DO loop that completes them one by one,
each committed (as autocommit clients do): microseconds per completion, trigger on and off in
turn, on one throwaway PostgreSQL. The same for pgq.complete_many of batches of 10. Prints JSON.
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


def round_us(conn: psycopg.Connection[Any], loop: str, jobs: int, trigger: bool) -> float:
    conn.execute("TRUNCATE pgq.jobs, pgq.job_events, pgq.finished_deltas, pgq.finished_counts")
    conn.execute(f"ALTER TABLE pgq.jobs {'ENABLE' if trigger else 'DISABLE'} TRIGGER jobs_count_finished")
    conn.execute("SELECT pgq.enqueue_many('bench', 'noop', array_fill('{}'::jsonb, ARRAY[%s]))", (jobs,))
    claimed = conn.execute("SELECT count(*) FROM pgq.claim('ab', ARRAY['bench'], %s)", (jobs,)).fetchone()
    assert claimed == (jobs,), claimed
    conn.execute("VACUUM ANALYZE pgq.jobs")
    conn.execute("VACUUM pgq.finished_deltas")
    started = time.perf_counter()
    conn.execute(loop)
    elapsed = time.perf_counter() - started
    done = conn.execute("SELECT count(*) FROM pgq.jobs WHERE state = 'done'").fetchone()
    deltas = conn.execute("SELECT count(*) FROM pgq.finished_deltas").fetchone()
    assert done == (jobs,) and deltas == ((jobs if trigger else 0),), (done, deltas)
    return elapsed / jobs * 1e6


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
                for r in range(args.repeats + 1):  # the first round warms up and is not counted
                    for label in (list(us) if r % 2 == 0 else list(us)[::-1]):
                        value = round_us(conn, loop, args.jobs, trigger=label.startswith("B"))
                        if r:
                            us[label].append(round(value, 2))
                med = {k: statistics.median(v) for k, v in us.items()}
                low = {k: min(v) for k, v in us.items()}
                result[name] = {"us_per_job": us, "median_us": med, "min_us": low,
                                "ratio_of_medians": med["B trigger on"] / med["A trigger off"],
                                "ratio_of_mins": low["B trigger on"] / low["A trigger off"],
                                "jobs_per_call": per}
        result["loadavg_after"] = os.getloadavg()
        print(json.dumps(result, indent=1))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
