"""Issue 37's A/B on a queue that uses none of it: one server (fsync on), one schema (this
checkout's), two variants of the functions on the hot path applied between rounds, alternated:

- A: 5e1aa62's pgq.enqueue, pgq.enqueue_many, pgq.complete_many and trigger of a job's end (the
  queue's writer lock an advisory lock; complete_many's own batch counting told to the trigger by
  a session setting);
- B: this checkout's (the writer lock the queue's row FOR KEY SHARE, the dedup answered before it;
  complete_many's mark a row of pgq.turns, written only when it ends batch members).

Workloads, each on plain jobs of one queue: the backend CPU of one enqueue (a server-side loop of
JOBS enqueues, each committed) and of one job's drain (a server-side loop of claim(batch 10) +
complete_many, each round committed), from /proc (it moves less with the machine's load than the
wall clock does; each round's B is also set over the A next to it), P
producers (threads, one connection each) enqueueing single jobs (autocommit: a commit per job),
P = 1 and 8, and a drain by W = 4 threads of claim(batch 10) + one complete_many per claim, by the
wall clock. The median per variant and B/A.
Usage: python bench/isolation_ab.py BASE_CHECKOUT on|off JOBS ROUNDS [cpu] (fsync; "cpu": the backend
CPU of an enqueue alone; from the repository, its venv)."""

import statistics
import sys
import threading
import time
from pathlib import Path

import psycopg

from pgq_thin.migrate import migrate
from pgq_thin.testing.server import SERVER_SETTINGS, ThrowawayPostgres
from pgq_tools.bench import _backend_cpu_seconds

base, fsync, jobs, rounds = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
cpu_only = sys.argv[5:] == ["cpu"]
here = Path(__file__).resolve().parents[1] / "sql" / "functions"


def fn(root: Path, path: str, name: str) -> str:
    """The CREATE OR REPLACE FUNCTION statement of ``name`` in a file, up to its closing $$;"""
    t = (root / path).read_text()
    i = t.index(f"CREATE OR REPLACE FUNCTION {name}(")
    return t[i:t.index("$$;", t.index("AS $$", i) + 5) + 3]


old = base / "sql" / "functions"
VARIANTS = {
    "A 5e1aa62": [fn(old, "enqueue.sql", "pgq.enqueue"), fn(old, "enqueue.sql", "pgq.enqueue_many"),
                  fn(old, "owner.sql", "pgq.complete_many"),
                  fn(old, "counters.sql", "pgq._count_finished").replace("pgq._count_finished()", "pgq._job_ended()")],
    "B this": [fn(here, "enqueue.sql", "pgq.enqueue"), fn(here, "enqueue.sql", "pgq.enqueue_many"),
               fn(here, "owner.sql", "pgq.complete_many"), fn(here, "ended.sql", "pgq._job_ended")],
}


def threads(n: int, work) -> float:
    """Runs work(i) in n threads behind a barrier; the wall-clock seconds from the barrier to the last end."""
    barrier = threading.Barrier(n + 1)
    ts = [threading.Thread(target=lambda i=i: (barrier.wait(), work(i))) for i in range(n)]
    for t in ts:
        t.start()
    barrier.wait()
    started = time.perf_counter()
    for t in ts:
        t.join()
    return time.perf_counter() - started


LOOP = "DO $$ BEGIN FOR i IN 1..%s LOOP PERFORM pgq.enqueue('ab', 'k'); COMMIT; END LOOP; END $$"
DRAIN = """DO $$ DECLARE ids bigint[]; atts integer[]; BEGIN LOOP
    SELECT array_agg(c.id), array_agg(c.attempt) INTO ids, atts FROM pgq.claim('ab', ARRAY['ab'], 10) AS c;
    EXIT WHEN ids IS NULL;
    PERFORM pgq.complete_many(ids, atts);
    COMMIT;
  END LOOP; END $$"""


def cpu_us(su: psycopg.Connection, sql: str) -> float:
    """Microseconds of su's backend CPU per job that ``sql`` takes."""
    pid = su.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
    used = _backend_cpu_seconds(pid)
    su.execute(sql)
    return (_backend_cpu_seconds(pid) - used) / jobs * 1e6


def enqueue_round(dsn: str, producers: int) -> float:
    conns = [psycopg.connect(dsn, autocommit=True) for _ in range(producers)]

    def work(i: int) -> None:
        for _ in range(jobs // producers):
            conns[i].execute("SELECT pgq.enqueue('ab', 'k')", prepare=True)

    seconds = threads(producers, work)
    for c in conns:
        c.close()
    return jobs // producers * producers / seconds


def drain_round(dsn: str, workers: int) -> float:
    conns = [psycopg.connect(dsn, autocommit=True) for _ in range(workers)]

    def work(i: int) -> None:
        while True:
            rows = conns[i].execute("SELECT id, attempt FROM pgq.claim(%s, ARRAY['ab'], 10)", (f"w{i}",),
                                    prepare=True).fetchall()
            if not rows:
                return
            conns[i].execute("SELECT count(*) FROM pgq.complete_many(%s, %s)",
                             ([r[0] for r in rows], [r[1] for r in rows]), prepare=True)

    seconds = threads(workers, work)
    for c in conns:
        c.close()
    return jobs / seconds


with ThrowawayPostgres(postgres_args=f"{SERVER_SETTINGS} -c fsync={fsync}") as pg:  # (a later -c wins over -F)
    dsn = pg.url()
    migrate(dsn)
    results: dict[tuple[str, str], list[float]] = {}
    with psycopg.connect(dsn, autocommit=True) as su:
        su.execute("SELECT pgq.configure_queue('ab', audit => false)")
        for r in range(rounds):
            for name in (list(VARIANTS) if r % 2 == 0 else list(reversed(VARIANTS))):
                su.execute("\n".join(VARIANTS[name]))
                su.execute("TRUNCATE pgq.jobs, pgq.finished_deltas")
                results.setdefault(("enqueue CPU", name), []).append(cpu_us(su, LOOP % jobs))
                su.execute("VACUUM ANALYZE pgq.jobs")
                results.setdefault(("drain CPU", name), []).append(cpu_us(su, DRAIN))
                if cpu_only:
                    continue
                for producers in (1, 8):
                    su.execute("TRUNCATE pgq.jobs, pgq.finished_deltas")
                    rate = enqueue_round(dsn, producers)
                    results.setdefault((f"enqueue P={producers}", name), []).append(rate)
                su.execute("TRUNCATE pgq.jobs, pgq.finished_deltas")
                su.execute("SELECT count(*) FROM pgq.enqueue_many('ab', 'k', array_fill('{}'::jsonb, ARRAY[%s]))",
                           (jobs,))
                su.execute("VACUUM ANALYZE pgq.jobs")
                results.setdefault(("drain W=4 b10", name), []).append(drain_round(dsn, 4))
                assert su.execute("SELECT count(*) FROM pgq.jobs WHERE state = 'done'").fetchone() == (jobs,)
    for workload in ("enqueue CPU", "drain CPU"):  # each round's B over the A next to it
        pairs = list(zip(results[(workload, "A 5e1aa62")], results[(workload, "B this")]))
        print(f"{workload}, B/A per round:", [round(b / a, 3) for a, b in pairs],
              "median", round(statistics.median(b / a for a, b in pairs), 3))
    for workload in dict.fromkeys(w for w, _ in results):
        a, b = (statistics.median(results[(workload, v)]) for v in VARIANTS)
        unit = "us/job" if "CPU" in workload else "jobs/s"
        print(f"{workload:16} A {a:8.1f} {unit}  B {b:8.1f} {unit}  B/A {b / a:.3f}  "
              f"(A {[round(x) for x in results[(workload, 'A 5e1aa62')]]}, "
              f"B {[round(x) for x in results[(workload, 'B this')]]})")
