"""The worker runtimes' code, A/B: N queued no-op jobs drained by a Worker or an AsyncWorker of one
source tree against another's, on one throwaway PostgreSQL (fsync on unless --fsync off), the
variants alternated within every round (each round starts with a different one).

    python bench/worker_ab.py --variant A=git:5e1aa62:worker --variant B=.:worker [--jobs 20000]
        [--workers 4,16] [--rounds 5] [--fsync on] [--keyed]

A variant is NAME=SOURCE:SHAPE. SOURCE is a directory holding ``pgq_thin`` (``.``: this checkout)
or ``git:REV`` (exported with git archive into a temporary directory). SHAPE is ``worker`` (a
Worker, plain no-op handlers), ``async-worker`` (an AsyncWorker, ``async def`` no-op handlers) or
``async-plain`` (an AsyncWorker, plain handlers: they run in its handler threads).

``--keyed``: bench/peers' keyed workload instead (16 keys taking turns, the queue's key_max_running
1, handlers that sleep 2 ms).

Every drain: the jobs are queued (pgq.enqueue_many into the queue ``bench``), VACUUM ANALYZE and a
CHECKPOINT; a fresh Python process (PYTHONPATH=SOURCE) imports pgq_thin, says READY and, told to
go, starts the worker with its defaults but ``concurrency=W``; the clock runs from "go" until an
outside observer (one more connection, polling every 5 ms) first counts N jobs done, as the main
benchmark's drains are timed. The schema is this checkout's (the variants differ in Python only).
Prints each variant's median (min-max) jobs/s per W and its ratio to the first variant.
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

from pgq_thin.migrate import migrate  # noqa: E402
from pgq_thin.testing.server import SERVER_SETTINGS, ThrowawayPostgres  # noqa: E402

QUEUE = "bench"
#: --keyed: the keys of the keyed workload (bench/peers' too), and its handlers' 2 ms.
KEYS = 16
KEYED_PAUSE = 0.002
OBSERVER_POLL = 0.005

CHILD = r"""
import asyncio, sys, time
shape, dsn, workers, pause = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
from pgq_thin.worker import AsyncWorker, Worker
import threading
print("READY", flush=True)
assert sys.stdin.readline().strip() == "go"
if shape == "worker":
    worker = Worker(queues=["bench"], concurrency=workers, name="ab")
    @worker.handler("noop")
    def noop(job, ctx):
        if pause:
            time.sleep(pause)
        return None
    threading.Thread(target=lambda: (sys.stdin.readline(), worker.stop()), daemon=True).start()
    worker.run(dsn, install_signal_handlers=False)
else:
    worker = AsyncWorker(queues=["bench"], concurrency=workers, name="ab")
    if shape == "async-worker":
        @worker.handler("noop")
        async def anoop(job, ctx):
            if pause:
                await asyncio.sleep(pause)
            return None
    else:
        @worker.handler("noop")
        def pnoop(job, ctx):
            if pause:
                time.sleep(pause)
            return None
    threading.Thread(target=lambda: (sys.stdin.readline(), worker.stop()), daemon=True).start()
    asyncio.run(worker.run(dsn, install_signal_handlers=False))
print("STOPPED", flush=True)
"""


def source_dir(spec: str, scratch: Path) -> Path:
    if not spec.startswith("git:"):
        return (ROOT / spec).resolve()
    rev = spec[4:]
    target = scratch / rev.replace("/", "_")
    if not target.exists():
        target.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "pgq_thin", "migrations", "sql"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target


def load(dsn: str, n: int, keyed: bool) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE pgq.jobs, pgq.job_events")
        if keyed:  # KEYS keys taking turns in the queue's order, at most one running per key
            conn.execute("SELECT pgq.configure_queue(%s, key_max_running => 1)", (QUEUE,))
            conn.execute("SELECT count(pgq.enqueue(%s, 'noop', jsonb_build_object('n', g),"
                         " concurrency_key => 'key-' || (g %% %s))) FROM generate_series(1, %s) AS g",
                         (QUEUE, KEYS, n))
        for start in range(0, 0 if keyed else n, 5000):
            conn.execute("SELECT pgq.enqueue_many(%s, 'noop', array_agg(jsonb_build_object('n', g)))"
                         " FROM generate_series(%s::integer, %s::integer) AS g",
                         (QUEUE, start, min(n, start + 5000) - 1))
        conn.execute("VACUUM ANALYZE pgq.jobs")
        conn.execute("VACUUM ANALYZE pgq.job_events")
        conn.execute("CHECKPOINT")


def drain(dsn: str, source: Path, shape: str, workers: int, n: int, keyed: bool = False) -> float:
    load(dsn, n, keyed)
    child = subprocess.Popen([sys.executable, "-c", CHILD, shape, dsn, str(workers),
                              str(KEYED_PAUSE if keyed else 0)], cwd=str(source),
                             env={"PYTHONPATH": str(source), "PATH": "/usr/bin:/bin"},
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None
    if child.stdout.readline().strip() != "READY":
        raise RuntimeError("the drain's process did not start")
    with psycopg.connect(dsn, autocommit=True) as observer:
        started = time.perf_counter()
        child.stdin.write("go\n")
        child.stdin.flush()
        while True:
            done = observer.execute("SELECT count(*) FROM pgq.jobs WHERE state = 'done'", prepare=True).fetchone()
            elapsed = time.perf_counter() - started
            if done is not None and done[0] >= n:
                break
            if child.poll() is not None or elapsed > 600:
                raise RuntimeError(f"{shape} from {source}: {done} of {n} done after {elapsed:.1f} s")
            time.sleep(OBSERVER_POLL)
    child.stdin.write("stop\n")
    child.stdin.flush()
    child.wait(timeout=60)
    return n / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", action="append", required=True, help="NAME=SOURCE:SHAPE")
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--workers", default="4,16")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--fsync", choices=("on", "off"), default="on")
    parser.add_argument("--keyed", action="store_true",
                        help=f"the keyed workload: {KEYS} keys, key_max_running 1, handlers of 2 ms")
    args = parser.parse_args()
    widths = [int(w) for w in args.workers.split(",")]
    began = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    with tempfile.TemporaryDirectory(prefix="pgq-ab-") as scratch, \
            ThrowawayPostgres(postgres_args=f"{SERVER_SETTINGS} -c fsync={args.fsync}") as pg:
        variants = []
        for spec in args.variant:
            name, _, rest = spec.partition("=")
            source, _, shape = rest.rpartition(":")
            variants.append((name, source_dir(source, Path(scratch)), shape))
        dsn = pg.url("test")
        migrate(dsn)
        samples: dict[tuple[str, int], list[float]] = {(v[0], w): [] for v in variants for w in widths}
        for r in range(args.rounds):
            order = variants[r % len(variants):] + variants[:r % len(variants)]
            for w in widths:
                for name, source, shape in order:
                    rate = drain(dsn, source, shape, w, args.jobs, args.keyed)
                    samples[(name, w)].append(rate)
                    print(f"round {r + 1} W {w} {name}: {rate:,.0f} jobs/s", file=sys.stderr, flush=True)
    ended = time.strftime("%H:%M:%S UTC", time.gmtime())
    what = f"keyed ({KEYS} keys, limit 1, 2 ms handlers)" if args.keyed else "no-op"
    print(f"worker A/B, {began} to {ended}, fsync {args.fsync}, {args.jobs:,} {what} jobs, {args.rounds} rounds")
    for w in widths:
        first = statistics.median(samples[(variants[0][0], w)])
        for name, _source, shape in variants:
            s = samples[(name, w)]
            print(f"W {w:2d} {name:10s} {shape:13s} {statistics.median(s):9,.0f} ({min(s):,.0f}-{max(s):,.0f}) "
                  f"jobs/s  x{statistics.median(s) / first:.3f}")


if __name__ == "__main__":
    main()
