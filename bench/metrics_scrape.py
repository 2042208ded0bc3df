"""What one Prometheus scrape of the queue metrics costs with 1M finished jobs stored, for
bench/README.md ("A metrics scrape with 1M finished jobs").

    .venv/bin/python bench/metrics_scrape.py [--finished 1000000] [--repeats 20]

On a throwaway PostgreSQL (fsync on): 10 queues holding ``--finished`` finished jobs (done, failed
and cancelled, 8:1:1, each moved there by an UPDATE from running, so the counters' trigger saw
every one), 1,000 due jobs, 1,000 scheduled ones, 50 running and 10 outcome_unknown; then VACUUM
ANALYZE. Times, each the median (and min-max) of ``--repeats``:

- folding the million deltas the load left (pgq._fold_finished, 100,000 a call, until none is
  left: what the first scrapes or sweeps do once), then VACUUM ANALYZE (as autovacuum would);
- a scrape (pgq_thin.metrics.exposition: pgq.metrics(), pgq.health(), the text format, in one
  transaction, over one autocommit connection);
- its two statements alone, pgq.metrics() and pgq.health();
- a scrape after 10,000 jobs finished since the last fold (it folds them), 5 times, and its
  statements timed apart (the fold, pgq.metrics(), pgq.health()) after another 10,000;
- pgq.stats() on the same data, the reference: what a scrape that counted the stored rows would read.

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import psycopg

from pgq_thin.metrics import exposition
from pgq_thin.migrate import migrate
from pgq_thin.testing.server import SERVER_SETTINGS, ThrowawayPostgres


def timed(call: Callable[[], Any], repeats: int) -> dict[str, float]:
    ms = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        ms.append((time.perf_counter() - started) * 1e3)
    return {"median_ms": round(statistics.median(ms), 3), "min_ms": round(min(ms), 3), "max_ms": round(max(ms), 3)}


def load(conn: psycopg.Connection[Any], finished: int) -> None:
    per_queue = finished // 10
    for q in range(10):
        name = f"queue_{q}"
        conn.execute("SELECT pgq.configure_queue(%s)", (name,))
        # Running first (as claimed), then moved to their final state by one UPDATE: the trigger
        # counts each, as it would count a completion.
        conn.execute("""INSERT INTO pgq.jobs (queue, kind, state, max_attempts, attempt, lease_until, claimed_at,
                                              claimed_by, last_event)
                        SELECT %s, 'k', 'running', 25, 1, now() + interval '1 hour', now(), 'bench', 'claimed'
                        FROM generate_series(1, %s)""", (name, per_queue))
        conn.execute("""UPDATE pgq.jobs
                        SET state = (CASE WHEN id %% 10 = 0 THEN 'failed' WHEN id %% 10 = 1 THEN 'cancelled'
                                          ELSE 'done' END)::pgq.job_state,
                            lease_until = NULL, finished_at = now(), last_event = 'completed'
                        WHERE queue = %s AND state = 'running'""", (name,))
        conn.execute("SELECT pgq.enqueue_many(%s, 'k', array_fill('{}'::jsonb, ARRAY[100]),"
                     " run_at => now() - interval '1 minute')", (name,))
        conn.execute("SELECT pgq.enqueue_many(%s, 'k', array_fill('{}'::jsonb, ARRAY[100]),"
                     " run_at => now() + interval '1 hour')", (name,))
        claimed = conn.execute("SELECT id, attempt FROM pgq.claim('bench', ARRAY[%s], 6)", (name,)).fetchall()
        conn.execute("SELECT pgq.mark_unknown(%s, %s, 'bench')", claimed[0])
    conn.execute("VACUUM ANALYZE pgq.jobs")


def finish_more(conn: psycopg.Connection[Any], n: int) -> None:
    """n more jobs reach done (one UPDATE; the trigger writes n deltas), not folded yet."""
    conn.execute("""INSERT INTO pgq.jobs (queue, kind, state, max_attempts, attempt, lease_until, claimed_at,
                                          last_event)
                    SELECT 'queue_0', 'k', 'running', 25, 1, now() + interval '1 hour', now(), 'claimed'
                    FROM generate_series(1, %s)""", (n,))
    conn.execute("""UPDATE pgq.jobs SET state = 'done', lease_until = NULL, finished_at = now(),
                                        last_event = 'completed'
                    WHERE queue = 'queue_0' AND state = 'running' AND claimed_by IS NULL""")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--finished", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    server = ThrowawayPostgres(postgres_args=f"{SERVER_SETTINGS} -c fsync=on")
    server.start()
    try:
        dsn = server.url()
        migrate(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            started = time.perf_counter()
            load(conn, args.finished)
            loaded_s = time.perf_counter() - started
            deltas = conn.execute("SELECT count(*) FROM pgq.finished_deltas").fetchone()[0]  # type: ignore[index]
            folds: list[float] = []
            while True:  # the backlog of the load, folded as successive scrapes or sweeps would
                started = time.perf_counter()
                folded = conn.execute("SELECT pgq._fold_finished()").fetchone()[0]  # type: ignore[index]
                if not folded:
                    break
                folds.append((time.perf_counter() - started) * 1e3)
            conn.execute("VACUUM ANALYZE")  # what autovacuum does after the load and the folds
            stored = int(conn.execute("SELECT sum(done + failed + cancelled) FROM pgq.stats()").fetchone()[0])  # type: ignore[index]
            counted = int(conn.execute("SELECT sum(done_total + failed_total + cancelled_total)"
                                       " FROM pgq.metrics()").fetchone()[0])  # type: ignore[index]
            if stored != counted:
                raise RuntimeError(f"the counters say {counted}, the table holds {stored}")
            result: dict[str, Any] = {
                "server_version": conn.execute("SHOW server_version").fetchone()[0],  # type: ignore[index]
                "fsync": conn.execute("SHOW fsync").fetchone()[0],  # type: ignore[index]
                "finished_rows": stored, "jobs_rows": conn.execute("SELECT count(*) FROM pgq.jobs").fetchone()[0],  # type: ignore[index]
                "load_s": round(loaded_s, 1), "loadavg_before": os.getloadavg(),
                "catching_up_the_load's_deltas": {"deltas": deltas, "folds": len(folds),
                                                   "ms_per_fold_median": round(statistics.median(folds), 1),
                                                   "ms_per_fold_max": round(max(folds), 1)},
            }
            exposition(conn)  # warm
            result["scrape"] = timed(lambda: exposition(conn), args.repeats)
            result["pgq_metrics"] = timed(lambda: conn.execute("SELECT * FROM pgq.metrics()").fetchall(), args.repeats)
            result["pgq_health"] = timed(lambda: conn.execute("SELECT * FROM pgq.health()").fetchall(), args.repeats)
            parts: dict[str, list[float]] = {"scrape": [], "of_which_the_fold": [], "then_metrics": [],
                                             "then_health": []}
            for _ in range(min(args.repeats, 5)):
                finish_more(conn, 10_000)
                with conn.transaction():  # the scrape's transaction, its statements timed apart
                    for part, sql in (("of_which_the_fold", "SELECT pgq._fold_finished()"),
                                      ("then_metrics", "SELECT * FROM pgq.metrics()"),
                                      ("then_health", "SELECT * FROM pgq.health()")):
                        parts[part].append(timed(lambda sql=sql: conn.execute(sql).fetchall(), 1)["median_ms"])
                finish_more(conn, 10_000)
                parts["scrape"].append(timed(lambda: exposition(conn), 1)["median_ms"])
            result["after_10k_finished_since_the_last_fold"] = {
                k: {"median_ms": round(statistics.median(v), 3), "min_ms": min(v), "max_ms": max(v)}
                for k, v in parts.items()}
            result["reference_pgq_stats"] = timed(lambda: conn.execute("SELECT * FROM pgq.stats()").fetchall(),
                                                  max(3, args.repeats // 4))
            result["loadavg_after"] = os.getloadavg()
        print(json.dumps(result, indent=1))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
