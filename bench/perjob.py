"""Per-job work of a Worker drain, counted rather than timed: on a shared machine the wall clock is
noise, what the server and the worker do per job is not.

    python bench/perjob.py --variant base=git:36d922b --variant new=. [--jobs 20000] [--workers 4,16]
        [--rounds 3] [--shape worker] [--statements] [--profile]

A variant is NAME=SOURCE[:SHAPE]: SOURCE a directory holding ``pgq_thin``, ``migrations`` and
``sql`` (``.``: this checkout) or ``git:REV`` (exported with git archive); SHAPE ``worker``
(default) or ``async-worker``, as in bench/worker_ab.py. Each variant gets a database of its own on
one throwaway PostgreSQL (fsync on, autovacuum off so that no vacuum lands in one drain and not
another), migrated by the variant's own ``pgq_thin.migrate``: its schema and its Python are both
the variant's. The variants alternate within every round.

Every drain: N no-op jobs queued (pgq.enqueue_many), VACUUM ANALYZE, CHECKPOINT; then a fresh
process of the variant's Worker (its defaults but ``concurrency=W``) drains them; an outside
connection waits (polling every 20 ms) until all are done, then the worker is stopped and its
process ends (its backends exit, and their statistics reach the server). Per job:

- ``wal B``: WAL bytes (pg_current_wal_lsn before and after), and with pg_walinspect the WAL records
  per kind (heap inserts, updates, HOT updates, btree leaf inserts, commits...);
- ``commits``: pg_stat_database's xact_commit delta of the variant's database (the observer's
  commits subtracted);
- ``tuples``: pg_stat_user_tables' inserted, updated (of which HOT) and deleted rows, per table;
- ``server ms``: the CPU time (user + system) of the postmaster and all its processes, ended ones
  included (the postmaster's cutime/cstime), less the observer's backend;
- ``worker ms``: the worker process's CPU time (time.process_time, all its threads) from "go" to the
  moment it is told to stop;
- with ``--statements``: pg_stat_statements (track all) per statement: calls, rows, WAL bytes and
  buffers per job, and which calls the worker made (so the claim and completion batch sizes);
- with ``--profile``: the worker process under cProfile: function calls per job and the top
  functions by own time (slows the worker: the batch sizes shift; for the breakdown only).

Prints a table per W: each variant's median over the rounds, and the ratio to the first.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pgq_thin.testing.server import SERVER_SETTINGS, ThrowawayPostgres  # noqa: E402

QUEUE = "bench"
POLL = 0.02
TICKS = os.sysconf("SC_CLK_TCK")

CHILD = r"""
import asyncio, json, sys, threading, time
shape, dsn, workers, profile = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
from pgq_thin.worker import AsyncWorker, Worker
print("READY", flush=True)
assert sys.stdin.readline().strip() == "go"
stats = {}
profilers = []
if profile:  # one cProfile per thread (a profiler sees only the thread that enables it)
    import cProfile
    profiling = True
    def enable():
        profiler = cProfile.Profile()
        profilers.append(profiler)
        profiler.enable()
        return profiler
    thread_run = threading.Thread.run
    def profiled_run(self):
        profiler = enable()
        try:
            thread_run(self)
        finally:
            profiler.disable()
    threading.Thread.run = profiled_run
    enable()
import resource
def usage():
    u = resource.getrusage(resource.RUSAGE_SELF)
    return [u.ru_utime, u.ru_stime, u.ru_nvcsw, u.ru_nivcsw]
start = usage()

def stopper(worker):
    sys.stdin.readline()
    stats["usage"] = [b - a for a, b in zip(start, usage())]
    stats["cpu"] = stats["usage"][0] + stats["usage"][1]
    for profiler in profilers:
        profiler.disable()
    worker.stop()

if shape == "worker":
    worker = Worker(queues=["bench"], concurrency=workers, name="perjob")
    @worker.handler("noop")
    def noop(job, ctx):
        return None
    threading.Thread(target=stopper, args=(worker,), daemon=True).start()
    worker.run(dsn, install_signal_handlers=False)
else:
    worker = AsyncWorker(queues=["bench"], concurrency=workers, name="perjob")
    @worker.handler("noop")
    async def anoop(job, ctx):
        return None
    threading.Thread(target=stopper, args=(worker,), daemon=True).start()
    asyncio.run(worker.run(dsn, install_signal_handlers=False))
if profile:
    import pstats
    ps = pstats.Stats(profilers[0])
    for profiler in profilers[1:]:
        try:
            ps.add(profiler)
        except TypeError:  # a profiler that saw nothing
            pass
    stats["calls"] = ps.total_calls
    if len(sys.argv) > 5:
        ps.dump_stats(sys.argv[5])
    top = sorted(ps.stats.items(), key=lambda kv: -kv[1][2])[:25]
    stats["top"] = [[f"{k[0].rsplit('/', 2)[-1]}:{k[1]}:{k[2]}", v[1], round(v[2], 4), round(v[3], 4)] for k, v in top]
print("STATS " + json.dumps(stats), flush=True)
"""

MIGRATE = "import sys; from pgq_thin.migrate import migrate; migrate(sys.argv[1])"


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


def child_env(source: Path) -> dict[str, str]:
    return {"PYTHONPATH": str(source), "PATH": "/usr/bin:/bin"}


def server_cpu(postmaster: int, exclude: int) -> float:
    """CPU seconds of the postmaster and every process of it, ended ones included, less ``exclude``'s."""
    def fields(pid: int) -> list[str]:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    own = fields(postmaster)
    total = sum(int(x) for x in own[11:15])  # utime stime cutime cstime
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == postmaster:
            continue
        try:
            f = fields(int(pid))
        except OSError:
            continue
        if int(f[1]) == postmaster:  # ppid
            ticks = int(f[11]) + int(f[12])
            total += -ticks if int(pid) == exclude else ticks
    return total / TICKS


TABLES = ("jobs", "job_events", "finished_deltas", "queues")


def snapshot(conn: psycopg.Connection[Any], postmaster: int, observer_pid: int, statements: bool) -> dict[str, Any]:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute("SELECT pg_current_wal_lsn()::text, xact_commit FROM pg_stat_database"
                       " WHERE datname = current_database()").fetchone()
    assert row is not None
    tables = {name: list(r) for name, *r in conn.execute(
        "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del FROM pg_stat_user_tables"
        " WHERE schemaname = 'pgq' AND relname = ANY (%s)", (list(TABLES),))}
    return {"lsn": row[0], "commits": row[1], "tables": tables, "cpu": server_cpu(postmaster, observer_pid)}


def load(conn: psycopg.Connection[Any], n: int) -> None:
    conn.execute("TRUNCATE pgq.jobs, pgq.job_events, pgq.finished_deltas")
    for start in range(0, n, 5000):
        conn.execute("SELECT pgq.enqueue_many(%s, 'noop', array_agg(jsonb_build_object('n', g)))"
                     " FROM generate_series(%s::integer, %s::integer) AS g", (QUEUE, start, min(n, start + 5000) - 1))
    conn.execute("VACUUM ANALYZE pgq.jobs")
    conn.execute("VACUUM ANALYZE pgq.job_events")
    conn.execute("VACUUM ANALYZE pgq.finished_deltas")
    conn.execute("CHECKPOINT")


def drain(pg: ThrowawayPostgres, db: str, source: Path, shape: str, workers: int, n: int, statements: bool,
          profile: bool, callgrind: Path | None = None) -> dict[str, Any]:
    dsn = pg.dsn_for(db)
    postmaster = pg.child_process.pid
    with psycopg.connect(dsn, autocommit=True) as conn:
        load(conn, n)
        observer_pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        conn.execute("SELECT pg_stat_force_next_flush()")
        if statements:
            conn.execute("SELECT pg_stat_statements_reset()")
        dump = [os.environ["PERJOB_PROFILE_OUT"]] if profile and "PERJOB_PROFILE_OUT" in os.environ else []
        valgrind = ["valgrind", "-q", "--tool=callgrind", f"--callgrind-out-file={callgrind}"] if callgrind else []
        child = subprocess.Popen([*valgrind, sys.executable, "-c", CHILD, shape, dsn, str(workers),
                                  "1" if profile else "0",
                                  *dump],
                                 cwd=str(source), env=child_env(source), stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        assert child.stdin is not None and child.stdout is not None
        if child.stdout.readline().strip() != "READY":
            raise RuntimeError("the drain's process did not start")
        before = snapshot(conn, postmaster, observer_pid, statements)
        perf = None
        if os.environ.get("PERJOB_PERF"):  # a sampled profile of the server's processes (perf, cpu-clock)
            perf = subprocess.Popen(["perf", "record", "-q", "-e", "cpu-clock", "-F", "4000", "-g",
                                     "-p", str(postmaster),
                                     "-o", os.environ["PERJOB_PERF"]], stderr=subprocess.DEVNULL)
            time.sleep(1)
        polls = 0
        started = time.perf_counter()
        child.stdin.write("go\n")
        child.stdin.flush()
        while True:
            polls += 1
            done = conn.execute("SELECT count(*) FROM pgq.jobs WHERE state = 'done'").fetchone()[0]
            if done >= n:
                break
            if child.poll() is not None or time.perf_counter() - started > 600:
                raise RuntimeError(f"{shape} from {source}: {done} of {n} done")
            time.sleep(POLL)
        elapsed = time.perf_counter() - started
        if perf is not None:
            perf.send_signal(2)
            perf.wait()
        child.stdin.write("stop\n")
        child.stdin.flush()
        out = child.communicate(timeout=120)[0]
        stats = json.loads(next(line for line in out.splitlines() if line.startswith("STATS "))[6:])
        deadline = time.monotonic() + 10
        while conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                           " AND pid <> pg_backend_pid()").fetchone()[0] and time.monotonic() < deadline:
            time.sleep(0.05)  # the worker's backends end (and flush their statistics)
        after = snapshot(conn, postmaster, observer_pid, statements)
        result: dict[str, Any] = {
            "jobs_s": n / elapsed,
            "wal": conn.execute("SELECT pg_wal_lsn_diff(%s, %s)", (after["lsn"], before["lsn"])).fetchone()[0] / n,
            # the observer's own commits: one per poll, and pg_stat_clear_snapshot's and the lsn reads
            "commits": (after["commits"] - before["commits"] - polls - 3) / n,
            "server_ms": (after["cpu"] - before["cpu"]) * 1000 / n,
            "worker_ms": stats["cpu"] * 1000 / n,
            "worker_user_ms": stats["usage"][0] * 1000 / n,
            "worker_switches": (stats["usage"][2] + stats["usage"][3]) / n,
            "tables": {t: [(a - b) / n for a, b in zip(after["tables"].get(t, [0] * 4),
                                                       before["tables"].get(t, [0] * 4))]
                       for t in TABLES},
        }
        conn.execute("SELECT pg_current_xact_id()")  # a commit: the WAL up to `after` is flushed, and readable
        result["records"] = {f"{rm}/{rec}": (count / n, size / n) for rm, rec, count, size in conn.execute(
            "SELECT split_part(s.\"resource_manager/record_type\", '/', 1),"
            " split_part(s.\"resource_manager/record_type\", '/', 2), count, record_size + fpi_size"
            " FROM pg_get_wal_stats(%s, %s, true) AS s WHERE count > 0", (before["lsn"], after["lsn"]))}
        if statements:
            result["statements"] = [list(r) for r in conn.execute(
                "SELECT left(regexp_replace(query, '\\s+', ' ', 'g'), 110), calls, rows, wal_bytes, shared_blks_hit,"
                " shared_blks_dirtied, round(total_exec_time::numeric, 1)"
                " FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
                " ORDER BY total_exec_time DESC LIMIT 40")]
        if callgrind is not None:
            text = callgrind.read_text(errors="replace")
            result["ir_total"] = next(int(line.split()[1]) for line in text.splitlines()
                                      if line.startswith(("summary:", "totals:")))
            if os.environ.get("PERJOB_KEEP"):  # keep the last big drain's file (for callgrind_annotate)
                shutil.copy(callgrind, os.environ["PERJOB_KEEP"])
            callgrind.unlink()
        if profile:
            result["calls"] = stats["calls"] / n
            result["top"] = stats["top"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", action="append", required=True, help="NAME=SOURCE[:SHAPE]")
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--workers", default="4,16")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--statements", action="store_true", help="pg_stat_statements per statement")
    parser.add_argument("--profile", action="store_true", help="the worker under cProfile")
    parser.add_argument("--callgrind", action="store_true",
                        help="the worker process under callgrind: its instructions per job, from a drain of N less"
                             " one of N/10 (the worker is then ~50x slower: the other figures are not comparable)")
    parser.add_argument("--json", help="write every sample here")
    args = parser.parse_args()
    widths = [int(w) for w in args.workers.split(",")]
    settings = f"{SERVER_SETTINGS} -c fsync=on -c autovacuum=off"
    if args.statements:
        settings += " -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all"
    began = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="pgq-perjob-") as scratch, ThrowawayPostgres(postgres_args=settings) as pg:
        version = psycopg.connect(pg.dsn_for("postgres")).execute("SHOW server_version").fetchone()[0]
        variants = []
        for spec in args.variant:
            name, _, rest = spec.partition("=")
            source, shape = rest, "worker"
            for known in ("worker", "async-worker"):
                if rest.endswith(":" + known):
                    source, shape = rest[: -len(known) - 1], known
            db = f"perjob_{name}"
            with psycopg.connect(pg.dsn_for("postgres"), autocommit=True) as admin:
                admin.execute(f'CREATE DATABASE "{db}"')
            directory = source_dir(source, Path(scratch))
            subprocess.run([sys.executable, "-c", MIGRATE, pg.dsn_for(db)], cwd=str(directory),
                           env=child_env(directory), check=True)
            with psycopg.connect(pg.dsn_for(db), autocommit=True) as conn:
                conn.execute("CREATE EXTENSION pg_walinspect")
                if args.statements:
                    conn.execute("CREATE EXTENSION pg_stat_statements")
            variants.append((name, directory, shape, db))
        samples: dict[tuple[str, int], list[dict[str, Any]]] = {(v[0], w): [] for v in variants for w in widths}
        for r in range(args.rounds):
            order = variants[r % len(variants):] + variants[:r % len(variants)]
            for w in widths:
                for name, directory, shape, db in order:
                    if args.callgrind:
                        out = Path(scratch) / "callgrind.out"
                        small = drain(pg, db, directory, shape, w, args.jobs // 10, False, False, out)
                        s = drain(pg, db, directory, shape, w, args.jobs, args.statements, args.profile, out)
                        s["worker_ir"] = (s["ir_total"] - small["ir_total"]) / (args.jobs - args.jobs // 10)
                        print(f"round {r + 1} W {w} {name}: worker {s['worker_ir']:,.0f} Ir/job", file=sys.stderr)
                    else:
                        s = drain(pg, db, directory, shape, w, args.jobs, args.statements, args.profile)
                    samples[(name, w)].append(s)
                    print(f"round {r + 1} W {w} {name}: {s['jobs_s']:,.0f} jobs/s, server {s['server_ms']:.4f} ms,"
                          f" worker {s['worker_ms']:.4f} ms (user {s['worker_user_ms']:.4f},"
                          f" {s['worker_switches']:.2f} switches), wal {s['wal']:.0f} B, commits {s['commits']:.3f}",
                          file=sys.stderr, flush=True)
    ended = time.strftime("%H:%M:%S UTC", time.gmtime())
    load_after = os.getloadavg()
    print(f"per-job work, {began} to {ended}, PostgreSQL {version}, fsync on, autovacuum off, {args.jobs:,} no-op jobs,"
          f" {args.rounds} rounds, load {load_before[0]:.1f} before, {load_after[0]:.1f} after")
    if args.json:
        Path(args.json).write_text(json.dumps({f"{k[0]} W{k[1]}": v for k, v in samples.items()}, indent=1))
    for w in widths:
        print(f"\nW {w}")
        base = None
        for name, _d, shape, _db in variants:
            s = samples[(name, w)]
            row = {key: statistics.median(x[key] for x in s)
                   for key in ("jobs_s", "wal", "commits", "server_ms", "worker_ms", "worker_user_ms",
                               "worker_switches")}
            if base is None:
                base = row
            if "worker_ir" in s[0]:
                ir = statistics.median(x["worker_ir"] for x in s)
                base_ir = base.setdefault("worker_ir", ir)
                each = ", ".join(f"{x['worker_ir']:,.0f}" for x in s)
                print(f"  {name:10s} {shape:12s} worker {ir:,.0f} Ir/job (x{ir / base_ir:.3f})"
                      f" (callgrind; samples {each})")
                continue
            print(f"  {name:10s} {shape:12s} server {row['server_ms']:.4f} ms"
                  f" (x{row['server_ms'] / base['server_ms']:.2f})"
                  f"  worker {row['worker_ms']:.4f} ms (x{row['worker_ms'] / base['worker_ms']:.2f}; user"
                  f" {row['worker_user_ms']:.4f}, {row['worker_switches']:.2f} context switches)"
                  f"  wal {row['wal']:.0f} B (x{row['wal'] / base['wal']:.2f})  commits {row['commits']:.3f}"
                  f"  [{row['jobs_s']:,.0f} jobs/s: noise]")
            for t in TABLES:
                vals = [statistics.median(x["tables"][t][i] for x in s) for i in range(4)]
                if any(vals):
                    print(f"      {t:16s} ins {vals[0]:.3f} upd {vals[1]:.3f} (hot {vals[2]:.3f}) del {vals[3]:.3f}")
            last = s[-1]
            recs = sorted(last["records"].items(), key=lambda kv: -kv[1][1])
            print("      wal records/job (last round): "
                  + ", ".join(f"{k} {c:.2f} ({b:.0f} B)" for k, (c, b) in recs[:12]))
            if "statements" in last:
                for q, calls, rows, wal, hit, dirtied, ms in last["statements"]:
                    print(f"      {calls:7d} calls {rows:7d} rows wal {wal / args.jobs:7.1f} B/job"
                          f" hit {hit / args.jobs:6.2f}"
                          f" dirt {dirtied / args.jobs:5.2f} {ms:8.1f} ms  {q}")
            if "calls" in last:
                print(f"      python calls/job {last['calls']:.1f}")
                for fn, calls, tottime, cumtime in last["top"]:
                    print(f"        {fn:60s} {calls:8d} {tottime:8.4f} {cumtime:8.4f}")


if __name__ == "__main__":
    main()
