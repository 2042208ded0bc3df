"""The archive (migration 0031, docs/operations.md "Archived history"): a day of finished jobs retired by
dropping its partition, and what a queue that does not archive pays for the feature. fsync on.

    .venv/bin/python bench/archive_drop.py [ROWS] [ROUNDS]     (defaults 10000000 and 7; ROUNDS 0: no A/B)

Part 1: one server; a queue with archive on and retention 10 days; the day partition of three
days ago made by the owner code (pgq._archive_partition), filled with ROWS finished jobs (INSERT ...
SELECT generate_series, straight into the archive; then VACUUM ANALYZE of it, what autovacuum does
in the days before its drop); 20,000 jobs in pgq.jobs (10,000 pending,
10,000 done in a queue without archive). First the reference: a plain table holding a copy of that
day with the same two indexes, dropped (DROP TABLE and its commit, timed the same way). Then the
retention is set to 2 days and one pgq.sweep()
is timed, the call and its commit (the files go at commit): it drops that day. pgq.jobs'
n_dead_tup and n_tup_del are read before and after (pg_stat_force_next_flush, a new snapshot;
autovacuum of pgq.jobs off meanwhile so that only this moves them).

Part 2 (A/B, same server, same run): database A migrated with the base commit's source (2f25220,
read with `git archive`), database B with this checkout's; the same plain queue (no archive) in
each. Per round, alternating which goes first: 5,000 jobs enqueued and drained (claim batch 10 +
complete_many, one connection), 50 pgq.sweep(), 500 pgq.get_job of a done job and 500 of an
unknown id, 200 pgq.list_jobs('q', 'done'). Medians per step, and B/A.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

from pgq_thin.migrate import migrate
from pgq_thin.testing.server import SERVER_SETTINGS, ThrowawayPostgres

ROOT = Path(__file__).resolve().parents[1]
BASE = "2f25220"
ROWS = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000_000
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 7

FILL = """
INSERT INTO pgq.archive (id, queue, kind, payload, priority, state, run_at, created_at, attempt, max_attempts,
                         finished_at, last_event, attempt_skip, attempt_offset, has_dependants, notify_finished,
                         claimed_by, claimed_at, result, enqueued_by)
SELECT 1000000000 + g, 'archived', 'k', '{"n": 1}', 0, 'done', d, d, 1, 25,
       d + (g %% 86000) * interval '1 second', 'completed', 0, 0, false, false, 'w', d, '{"ok": true}', 'bench'
FROM (SELECT %(day)s::timestamptz AS d) AS x, generate_series(1, %(rows)s) AS g
"""


def hot_stats(c: psycopg.Connection) -> tuple[int, int]:
    """pgq.jobs' n_dead_tup and n_tup_del, flushed and read in a new snapshot."""
    c.execute("SELECT pg_stat_force_next_flush()")
    c.execute("SELECT pg_stat_clear_snapshot()")
    row = c.execute("SELECT n_dead_tup, n_tup_del FROM pg_stat_user_tables"
                    " WHERE relid = 'pgq.jobs'::regclass").fetchone()
    return row[0], row[1]


def drop_a_day(dsn: str) -> None:
    c = psycopg.connect(dsn, autocommit=True)
    c.execute("SELECT pgq.configure_queue('archived', archive => true, retention => '10 days', audit => false)")
    c.execute("SELECT pgq.enqueue_many('plain', 'k', array_fill('{}'::jsonb, ARRAY[10000]))")
    c.execute("SELECT pgq.enqueue_many('done', 'k', array_fill('{}'::jsonb, ARRAY[10000]))")
    while rows := c.execute("SELECT id, attempt FROM pgq.claim('w', ARRAY['done'], 1000)").fetchall():
        c.execute("SELECT pgq.complete_many(%s, %s)", ([r[0] for r in rows], [r[1] for r in rows]))
    c.execute("VACUUM pgq.jobs")
    day = c.execute("SELECT ((now() AT TIME ZONE 'UTC')::date - 3)").fetchone()[0]
    c.execute("SELECT pgq._archive_partition(%s)", (day,))
    started = time.perf_counter()
    c.execute(FILL, {"day": f"{day} 00:00:00+00", "rows": ROWS})
    # What autovacuum does to a day's partition in the days before its retention ends (a drop
    # waits at most 100 ms for a running autovacuum, then leaves the day to the next sweep).
    c.execute(f"VACUUM ANALYZE pgq.archive_{day:%Y%m%d}")
    c.execute("CHECKPOINT")
    print(f"filled the day {day} with {ROWS:,} finished jobs in {time.perf_counter() - started:.1f} s;",
          "partition", c.execute("SELECT pg_size_pretty(pg_total_relation_size(%s))",
                                 (f"pgq.archive_{day:%Y%m%d}",)).fetchone()[0])
    c.execute("SELECT pgq.sweep()")  # today's and tomorrow's partitions; nothing to drop yet (10 days)
    # The reference: a plain table holding a copy of that day (same rows, same two indexes), dropped
    # the same way (a DROP TABLE and its commit), before the sweep's drop.
    c.execute(f"CREATE TABLE public.ref AS SELECT * FROM pgq.archive_{day:%Y%m%d}")
    c.execute("CREATE INDEX ON public.ref (id)")
    c.execute("CREATE INDEX ON public.ref (queue, state, id)")
    c.execute("VACUUM ANALYZE public.ref")
    c.execute("CHECKPOINT")
    c.execute("BEGIN")
    started = time.perf_counter()
    c.execute("DROP TABLE public.ref")
    statement = time.perf_counter() - started
    c.execute("COMMIT")
    took = time.perf_counter() - started
    print(f"reference, DROP TABLE of a plain copy: {took * 1000:.0f} ms ({statement * 1000:.0f} ms the statement, "
          f"{(took - statement) * 1000:.0f} ms its commit)")
    c.execute("CHECKPOINT")
    c.execute("ALTER TABLE pgq.jobs SET (autovacuum_enabled = off)")  # so that n_dead_tup moves only by us
    before = hot_stats(c)
    c.execute("SELECT pgq.configure_queue('archived', retention => '2 days')")
    c.execute("BEGIN")
    started = time.perf_counter()
    c.execute("SELECT pgq.sweep()")
    statement = time.perf_counter() - started
    c.execute("COMMIT")
    took = time.perf_counter() - started
    after = hot_stats(c)
    c.execute("ALTER TABLE pgq.jobs RESET (autovacuum_enabled)")
    left = c.execute("SELECT count(*) FROM pgq.archive WHERE finished_at < now() - interval '2 days'").fetchone()[0]
    print(f"pgq.sweep() that dropped it: {took * 1000:.0f} ms ({statement * 1000:.0f} ms the call, "
          f"{(took - statement) * 1000:.0f} ms its commit); archived jobs of that day left: {left};"
          f" pgq.jobs (n_dead_tup, n_tup_del) before {before}, after {after}")
    c.close()


def base_source() -> Path:
    out = Path(tempfile.mkdtemp(prefix="pgq_base_"))
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", BASE, "pgq_thin", "migrations", "sql"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    return out


def ab(server: ThrowawayPostgres) -> None:
    admin = psycopg.connect(server.url(), autocommit=True)
    for name in ("a_base", "b_branch"):
        admin.execute(f"CREATE DATABASE {name}")
    base = base_source()
    subprocess.run([sys.executable, "-c", f"from pgq_thin.migrate import migrate; migrate({server.url('a_base')!r})"],
                   check=True, env={**os.environ, "PYTHONPATH": str(base)})
    migrate(server.url("b_branch"))
    conns = {"A": psycopg.connect(server.url("a_base"), autocommit=True),
             "B": psycopg.connect(server.url("b_branch"), autocommit=True)}
    for c in conns.values():
        c.execute("SELECT pgq.configure_queue('q', audit => true)")
    times: dict[tuple[str, str], list[float]] = {}

    def timed(side: str, step: str, fn) -> None:
        started = time.perf_counter()
        fn()
        times.setdefault((side, step), []).append(time.perf_counter() - started)

    def drain(c: psycopg.Connection) -> None:
        c.execute("SELECT pgq.enqueue_many('q', 'k', array_fill('{}'::jsonb, ARRAY[5000]))")
        while rows := c.execute("SELECT id, attempt FROM pgq.claim('w', ARRAY['q'], 10)").fetchall():
            c.execute("SELECT pgq.complete_many(%s, %s)", ([r[0] for r in rows], [r[1] for r in rows]))

    def repeat(c: psycopg.Connection, sql: str, n: int, params=None) -> None:
        for _ in range(n):
            c.execute(sql, params).fetchall()

    def one_round(side: str, c: psycopg.Connection) -> None:
        timed(side, "enqueue+drain 5000", lambda: drain(c))
        timed(side, "50 sweeps", lambda: repeat(c, "SELECT pgq.sweep()", 50))
        done = c.execute("SELECT max(id) FROM pgq.jobs WHERE state = 'done'").fetchone()[0]
        timed(side, "500 get_job (done)", lambda: repeat(c, "SELECT * FROM pgq.get_job(%s)", 500, (done,)))
        timed(side, "500 get_job (unknown: P0002)", lambda: repeat_missing(c))
        timed(side, "200 list_jobs done", lambda: repeat(c, "SELECT * FROM pgq.list_jobs('q', 'done')", 200))

    for r in range(ROUNDS):
        for side in ("AB" if r % 2 == 0 else "BA"):
            one_round(side, conns[side])
    print(f"A/B, {ROUNDS} rounds, medians (s): step, A base {BASE}, B this branch, B/A")
    for step in dict.fromkeys(s for _, s in times):
        a, b = statistics.median(times[("A", step)]), statistics.median(times[("B", step)])
        print(f"  {step:32s} {a:8.4f} {b:8.4f} {b / a:6.3f}")
    for c in conns.values():
        c.close()
    admin.close()


def repeat_missing(c: psycopg.Connection) -> None:
    for _ in range(500):
        try:
            c.execute("SELECT * FROM pgq.get_job(%s)", (10 ** 12,))
        except psycopg.errors.NoDataFound:
            pass


def main() -> None:
    started = time.perf_counter()
    with ThrowawayPostgres(postgres_args=f"{SERVER_SETTINGS} -c fsync=on -c max_wal_size=4GB") as server:
        print("server", psycopg.connect(server.url()).execute("SHOW server_version").fetchone()[0],
              "fsync", psycopg.connect(server.url()).execute("SHOW fsync").fetchone()[0])
        migrate(server.url())
        drop_a_day(server.url())
        if ROUNDS:
            ab(server)
    print(f"ran {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
