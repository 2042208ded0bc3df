"""A queue that uses none of durable execution (issue 39) is no slower: the schema and functions of
one source tree against another's, on one throwaway PostgreSQL (fsync on unless --fsync off), one
database each, rounds alternated (each round starts with the other).

    python bench/durable_ab.py --before git:main --after . [--jobs 5000] [--rounds 7] [--fsync on]

A source is a directory holding ``pgq_thin``, ``migrations`` and ``sql`` (``.``: this checkout) or
``git:REV`` (exported with git archive); each database is migrated by its own source's
``pgq_thin.migrate``, in a process of its own. Per round and database, timed inside the server (no
client round trip), one COMMIT per call as a worker or producer makes them:

- enqueue: ``jobs`` calls of pgq.enqueue('bench', 'noop'), each its own transaction;
- claim + complete: the same jobs claimed one at a time and completed (the benchmark's
  AB_SERVER_LOOP), each call its own transaction;
- sweep: 100 calls of pgq.sweep() and of pgq.settle_dependencies() on the drained queue.

Prints each measure's median (min-max) per call for both, and the ratio after/before of the medians.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pgq_thin.testing.server import SERVER_SETTINGS, Databases, ThrowawayPostgres  # noqa: E402

ENQUEUE = """DO $$ BEGIN FOR i IN 1..%s LOOP PERFORM pgq.enqueue('bench', 'noop'); COMMIT; END LOOP; END $$"""
PAIRS = """DO $$ DECLARE r record; BEGIN FOR i IN 1..%s LOOP
    SELECT c.id, c.attempt INTO r FROM pgq.claim('ab', ARRAY['bench'], 1) AS c; COMMIT;
    PERFORM pgq.complete(r.id, r.attempt); COMMIT; END LOOP; END $$"""
SWEEPS = """DO $$ BEGIN FOR i IN 1..%s LOOP PERFORM pgq.sweep(); COMMIT; PERFORM pgq.settle_dependencies(); COMMIT;
    END LOOP; END $$"""


def source_dir(spec: str, scratch: Path) -> Path:
    if not spec.startswith("git:"):
        return (ROOT / spec).resolve()
    rev = spec[4:]
    target = scratch / rev.replace("/", "_")
    target.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "pgq_thin", "migrations", "sql"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target


def migrate_with(source: Path, dsn: str) -> str:
    """Migrates dsn with source's pgq_thin; returns the schema version it installed."""
    subprocess.run([sys.executable, "-c", "import sys; from pgq_thin import migrate; migrate(sys.argv[1])", dsn],
                   cwd=str(source), env={"PYTHONPATH": str(source), "PATH": "/usr/bin:/bin"}, check=True)
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT pgq.version()").fetchone()
        assert row is not None
        return str(row[0])


def timed(conn: psycopg.Connection, sql: str, calls: int) -> float:
    """Microseconds per call of the loop `sql` over `calls` calls."""
    started = time.perf_counter()
    conn.execute(sql % calls)
    return (time.perf_counter() - started) / calls * 1e6


def round_of(dsn: str, jobs: int) -> dict[str, float]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE pgq.jobs, pgq.job_events, pgq.finished_deltas")
        conn.execute("VACUUM ANALYZE pgq.jobs")
        conn.execute("CHECKPOINT")
        out = {"enqueue": timed(conn, ENQUEUE, jobs)}
        conn.execute("VACUUM ANALYZE pgq.jobs")
        out["claim + complete"] = timed(conn, PAIRS, jobs) / 2
        row = conn.execute("SELECT count(*) FILTER (WHERE state = 'done'), count(*) FROM pgq.jobs").fetchone()
        assert row == (jobs, jobs), row  # every job claimed and completed once
        out["sweep + settle"] = timed(conn, SWEEPS, 100) / 2
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default="git:main")
    parser.add_argument("--after", default=".")
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--fsync", choices=("on", "off"), default="on")
    args = parser.parse_args()
    began = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    with tempfile.TemporaryDirectory(prefix="pgq-ab-") as scratch, \
            ThrowawayPostgres(postgres_args=f"{SERVER_SETTINGS} -c fsync={args.fsync}") as pg:
        databases = Databases(pg.url("postgres"))
        sides = {"before": args.before, "after": args.after}
        dsns, versions = {}, {}
        for label, spec in sides.items():
            dsns[label] = databases.create(label)
            versions[label] = migrate_with(source_dir(spec, Path(scratch)), dsns[label])
        samples: dict[tuple[str, str], list[float]] = {}
        for r in range(args.rounds + 1):  # the first round warms up and is not counted
            for label in (("before", "after") if r % 2 == 0 else ("after", "before")):
                for what, us in round_of(dsns[label], args.jobs).items():
                    if r:
                        samples.setdefault((what, label), []).append(us)
            print(f"round {r} done", file=sys.stderr, flush=True)
    ended = time.strftime("%H:%M:%S UTC", time.gmtime())
    print(f"durable A/B, {began} to {ended}, fsync {args.fsync}, {args.jobs:,} jobs x {args.rounds} rounds "
          f"(+1 warm-up); before {args.before} (schema {versions['before']}), after {args.after} "
          f"(schema {versions['after']}); microseconds per call, median (min-max)")
    for what in ("enqueue", "claim + complete", "sweep + settle"):
        before, after = samples[(what, "before")], samples[(what, "after")]
        print(f"  {what:18s} before {statistics.median(before):8.1f} ({min(before):.1f}-{max(before):.1f})"
              f"  after {statistics.median(after):8.1f} ({min(after):.1f}-{max(after):.1f})"
              f"  after/before {statistics.median(after) / statistics.median(before):.3f}")


if __name__ == "__main__":
    main()
