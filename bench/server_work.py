"""The server's instructions per job for a worker's statements, counted by callgrind: exact and
repeatable on a shared machine, where a CPU time is not.

    python bench/server_work.py --variant base=git:36d922b --variant new=. [--jobs 4000]
        [--batch 500] [--mode split|combined|single] [--annotate DIR]

A variant is NAME=SOURCE: a directory holding ``pgq_thin``, ``migrations`` and ``sql`` (``.``: this
checkout) or ``git:REV`` (exported with git archive). Each variant gets a database of its own on one
throwaway PostgreSQL (fsync on, autovacuum off), migrated by the variant's ``pgq_thin.migrate``.
For each: N jobs are queued (pgq.enqueue_many), VACUUM ANALYZE, CHECKPOINT, and the server is
restarted under ``valgrind --tool=callgrind``. One session warms up (claims and completions that
find nothing: the fence check, the plans, prepared as psycopg prepares the worker's) and ends; a
second one warms up alike and then drains the N jobs the way the Worker does on a deep backlog:
``split`` (default) a pgq.claim of ``batch`` jobs then one pgq.complete_many of them, ``combined``
pgq.complete_and_claim carrying the previous batch's completions, ``single`` pgq.claim of 1 and
pgq.complete. Per job: the second session's instructions (Ir) less the first's, the WAL bytes and
records of the drain (pg_walinspect), the rows written per table. ``--annotate`` keeps the callgrind
files and writes callgrind_annotate's inclusive listing beside them.

Only that session is counted: the WAL writer, the checkpointer and the other processes are not
(with fsync on, the commits' WAL flushes are the session's own).
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from testing.common.database import Database

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pgq_thin.testing.server import SERVER_SETTINGS, ThrowawayPostgres, server_programs  # noqa: E402

QUEUE = "bench"
MIGRATE = "import sys; from pgq_thin.migrate import migrate; migrate(sys.argv[1])"
TABLES = ("jobs", "job_events", "finished_deltas")
CLAIM = ("SELECT id, attempt FROM pgq.claim(worker => %s::text, queues => %s::text[], batch => %s::integer,"
         " lease => NULL::interval, kinds => %s::text[])")
COMPLETE_MANY = "SELECT id FROM pgq.complete_many(ids => %s::bigint[], attempts => %s::integer[]) AS t(id)"
COMPLETE_AND_CLAIM = ("SELECT completed, id, attempt FROM pgq.complete_and_claim(ids => %s::bigint[],"
                      " attempts => %s::integer[], worker => %s::text, queues => %s::text[], batch => %s::integer,"
                      " lease => NULL::interval, kinds => %s::text[])")
COMPLETE = "SELECT pgq.complete(id => %s::bigint, attempt => %s::integer, result => NULL::jsonb)"


def source_dir(spec: str, scratch: Path) -> Path:
    if not spec.startswith("git:"):
        return (ROOT / spec).resolve()
    rev = spec[4:]
    target = scratch / rev.replace("/", "_")
    if not target.exists():
        target.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "pgq_thin", "migrations", "sql"],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target


def wrapper(directory: Path, real: str) -> str:
    """A postgres that runs under callgrind while ``directory/on`` exists (argv[0] stays the real
    program's path: postgres finds its installation from it)."""
    path = directory / "postgres"
    path.write_text("#!/bin/sh\n"
                    f"if [ -e {directory}/on ]; then exec valgrind -q --tool=callgrind --trace-children=no"
                    f" --callgrind-out-file={directory}/callgrind.%p {real} \"$@\"; fi\n"
                    f"exec {real} \"$@\"\n")
    path.chmod(0o755)
    return str(path)


def drain(conn: psycopg.Connection[Any], mode: str, batch: int) -> int:
    """Claim and complete until nothing is left, the Worker's way on a deep backlog; the jobs done."""
    done = 0
    carried: list[tuple[int, int]] = []
    while True:
        if mode == "single":
            row = conn.execute(CLAIM, ("w", [QUEUE], 1, None), prepare=True).fetchone()
            if row is None:
                return done
            assert conn.execute(COMPLETE, row, prepare=True).fetchone() == (True,)
            done += 1
        elif mode == "split":
            rows = conn.execute(CLAIM, ("w", [QUEUE], batch, None), prepare=True).fetchall()
            if not rows:
                return done
            ids = [r[0] for r in rows]
            got = conn.execute(COMPLETE_MANY, (ids, [r[1] for r in rows]), prepare=True).fetchall()
            assert len(got) == len(ids)
            done += len(ids)
        else:
            rows = conn.execute(COMPLETE_AND_CLAIM, ([c[0] for c in carried], [c[1] for c in carried], "w",
                                                     [QUEUE], batch, None), prepare=True).fetchall()
            assert len(rows[0][0]) == len(carried)
            done += len(carried)
            carried = [(r[1], r[2]) for r in rows if r[1] is not None]
            if not carried:
                return done


def measure(pg: ThrowawayPostgres, flag: Path, db: str, n: int, mode: str, batch: int,
            keep: Path | None, name: str) -> dict[str, Any]:
    dsn = pg.dsn_for(db)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE pgq.jobs, pgq.job_events, pgq.finished_deltas")
        conn.execute("SELECT pgq.configure_queue(%s)", (QUEUE,))  # (a --setup may have made it already)
        for start in range(0, n, 5000):
            conn.execute("SELECT pgq.enqueue_many(%s, 'noop', array_agg(jsonb_build_object('n', g)))"
                         " FROM generate_series(%s::integer, %s::integer) AS g",
                         (QUEUE, start, min(n, start + 5000) - 1))
        for table in TABLES:
            conn.execute(f"VACUUM ANALYZE pgq.{table}")
        conn.execute("CHECKPOINT")
    Database.terminate(pg, signal.SIGINT)  # a fast shutdown that keeps the data directory
    flag.touch()
    try:
        pg.start()
        # The same session's work without the drain: its start, warm-up and end, subtracted.
        idle = session(dsn, mode, batch, drain_jobs=False)[0]
        pid, done, lsn, end, before_tables = session(dsn, mode, batch, drain_jobs=True)
        with psycopg.connect(dsn, autocommit=True) as other:
            other.execute("SELECT pg_current_xact_id()")  # flushes the WAL up to `end`
            wal = other.execute("SELECT pg_wal_lsn_diff(%s, %s)", (end, lsn)).fetchone()[0]
            records = {r[0]: (r[1] / done, r[2] / done) for r in other.execute(
                "SELECT s.\"resource_manager/record_type\", count, record_size + fpi_size"
                " FROM pg_get_wal_stats(%s, %s, true) AS s WHERE count > 0 ORDER BY 3 DESC", (lsn, end))}
            after_tables = {r[0]: r[1:] for r in other.execute(STATS, (list(TABLES),))}
    finally:
        Database.terminate(pg, signal.SIGINT)
        flag.unlink()
        pg.start()
    ir = {}
    for which, p in (("idle", idle), ("drain", pid)):
        path = flag.parent / f"callgrind.{p}"
        text = path.read_text(errors="replace")
        ir[which] = next(int(line.split()[1]) for line in text.splitlines() if line.startswith(("summary:", "totals:")))
        if keep is not None:
            target = keep / f"{name}-{mode}-{which}.callgrind"
            shutil.copy(path, target)
            listing = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=99.8", str(target)],
                                     capture_output=True, text=True).stdout
            (keep / f"{name}-{mode}-{which}.inclusive.txt").write_text(listing)
    for d in flag.parent.glob("callgrind.*"):
        d.unlink()
    return {"ir": (ir["drain"] - ir["idle"]) / done, "wal": wal / done, "records": records, "done": done,
            "tables": {t: [(a - b) / done for a, b in zip(after_tables.get(t, (0,) * 4),
                                                          before_tables.get(t, (0,) * 4))]
                       for t in TABLES}}


STATS = ("SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del FROM pg_stat_user_tables"
         " WHERE schemaname = 'pgq' AND relname = ANY (%s)")


def session(dsn: str, mode: str, batch: int, drain_jobs: bool) -> tuple[int, int, str, str, dict[str, Any]]:
    """One session under callgrind: the warm-up, then (``drain_jobs``) the drain. Its pid, the jobs
    done, the WAL positions around the drain and the table statistics before it."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        # Warm up: the fence check, the plans (prepared after psycopg's 5 executions, as the
        # worker's are), the catalog caches.
        for _ in range(6):
            assert conn.execute(CLAIM, ("w", ["nothing"], batch, None), prepare=True).fetchall() == []
            assert conn.execute(COMPLETE_MANY, ([], []), prepare=True).fetchall() == []
            conn.execute(COMPLETE_AND_CLAIM, ([], [], "w", ["nothing"], batch, None), prepare=True).fetchall()
            conn.execute(COMPLETE, (0, 1), prepare=True).fetchall()
        if not drain_jobs:
            return pid, 0, "", "", {}
        with psycopg.connect(dsn, autocommit=True) as other:
            other.execute("SELECT pg_stat_clear_snapshot()")
            before_tables = {r[0]: r[1:] for r in other.execute(STATS, (list(TABLES),))}
            lsn = other.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
        done = drain(conn, mode, batch)
        end = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
        conn.execute("SELECT pg_stat_force_next_flush()")
    time.sleep(0.5)
    return pid, done, lsn, end, before_tables


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", action="append", required=True, help="NAME=SOURCE")
    parser.add_argument("--jobs", type=int, default=4000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--mode", default="split", help="split, combined or single (comma-separated: several)")
    parser.add_argument("--setup", action="append", default=[],
                        help="NAME=SQL: run SQL in variant NAME's database after its migration (an ablation)")
    parser.add_argument("--annotate", help="keep the callgrind files and their inclusive listings here")
    args = parser.parse_args()
    keep = Path(args.annotate) if args.annotate else None
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="pgq-work-"))
    valgrind_dir = scratch / "valgrind"
    valgrind_dir.mkdir()
    valgrind_dir.chmod(0o777)
    scratch.chmod(0o755)
    programs = server_programs()
    settings = f"{SERVER_SETTINGS} -c fsync=on -c autovacuum=off"
    try:
        with ThrowawayPostgres(postgres_args=settings, initdb=programs["initdb"],
                               postgres=wrapper(valgrind_dir, programs["postgres"])) as pg:
            version = psycopg.connect(pg.dsn_for("postgres")).execute("SHOW server_version").fetchone()[0]
            variants = []
            for spec in args.variant:
                name, _, source = spec.partition("=")
                db = f"work_{name}"
                with psycopg.connect(pg.dsn_for("postgres"), autocommit=True) as admin:
                    admin.execute(f'CREATE DATABASE "{db}"')
                directory = source_dir(source, scratch)
                subprocess.run([sys.executable, "-c", MIGRATE, pg.dsn_for(db)], cwd=str(directory),
                               env={"PYTHONPATH": str(directory), "PATH": "/usr/bin:/bin"}, check=True)
                with psycopg.connect(pg.dsn_for(db), autocommit=True) as conn:
                    conn.execute("CREATE EXTENSION pg_walinspect")
                    for setup in args.setup:
                        if setup.partition("=")[0] == name:
                            conn.execute(setup.partition("=")[2])
                variants.append((name, db))
            print(f"server instructions per job (callgrind), PostgreSQL {version}, {args.jobs:,} jobs,"
                  f" batch {args.batch}")
            for mode in args.mode.split(","):
                base = None
                for name, db in variants:
                    r = measure(pg, valgrind_dir / "on", db, args.jobs, mode, args.batch, keep, name)
                    base = base or r
                    print(f"{mode:9s} {name:10s} {r['ir']:10,.0f} Ir/job (x{r['ir'] / base['ir']:.3f})  "
                          f"WAL {r['wal']:6.0f} B/job (x{r['wal'] / base['wal']:.3f})", flush=True)
                    for t in TABLES:
                        v = r["tables"][t]
                        print(f"    {t:16s} ins {v[0]:.2f} upd {v[1]:.2f} (hot {v[2]:.2f}) del {v[3]:.2f}")
                    print("    WAL records/job: " + ", ".join(f"{k} {c:.2f} ({b:.0f} B)"
                                                           for k, (c, b) in list(r["records"].items())[:10]))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
