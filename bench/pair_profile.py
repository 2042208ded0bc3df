"""Profile one pgq.claim + pgq.complete pair (batch 1, plain queue): pg_stat_statements track=all,
track_functions=all, backend CPU from /proc.
Usage: python bench/pair_profile.py on|off JOBS (PERF=1: also perf record -g of the backend)."""

import os
import sys
import time

import psycopg

from pgq_thin.migrate import migrate
from pgq_thin.testing.server import SERVER_SETTINGS, ThrowawayPostgres
from pgq_tools.bench import AB_SERVER_LOOP, _backend_cpu_seconds

fs, jobs = sys.argv[1], int(sys.argv[2])
args = (
    f"{SERVER_SETTINGS} -c fsync={fs} -c shared_preload_libraries=pg_stat_statements "
    "-c pg_stat_statements.track=all -c pg_stat_statements.track_planning=on -c track_functions=all"
)
with ThrowawayPostgres(postgres_args=args) as pg:
    dsn = pg.url("test")
    migrate(dsn)
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        print(c.execute("SELECT name, audit FROM pgq.queues").fetchall())

        def load():
            c.execute("TRUNCATE pgq.jobs, pgq.job_events")
            c.execute("SELECT pgq.enqueue_many('bench', 'noop', array_fill('{}'::jsonb, ARRAY[%s]))", (jobs,))
            c.execute("VACUUM ANALYZE pgq.jobs")

        load()
        c.execute(AB_SERVER_LOOP % 500)  # warm
        load()
        c.execute("SELECT pg_stat_statements_reset(); SELECT pg_stat_reset()")
        pid = c.execute("SELECT pg_backend_pid()").fetchone()[0]
        import signal
        import subprocess

        perf = (
            subprocess.Popen(
                ["perf", "record", "-g", "-F", "2000", "-o", f"perf-{fs}.data", "-p", str(pid)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            if os.environ.get("PERF")
            else None
        )
        time.sleep(1 if perf else 0)
        u = _backend_cpu_seconds(pid)
        t = time.perf_counter()
        c.execute(AB_SERVER_LOOP % jobs)
        u = _backend_cpu_seconds(pid) - u
        t = time.perf_counter() - t
        if perf:
            perf.send_signal(signal.SIGINT)
            perf.wait()
        print(f"fsync={fs} jobs={jobs} backend CPU/pair {u / jobs * 1e6:.1f} us, wall/pair {t / jobs * 1e6:.1f} us")
        time.sleep(0.6)
        for r in c.execute(
            """SELECT calls, round((total_exec_time*1000/%s)::numeric,2) AS us_per_pair,
               round((total_plan_time*1000/%s)::numeric,2) AS plan_us, rows, toplevel,
               left(regexp_replace(query, '\\s+', ' ', 'g'), 150)
               FROM pg_stat_statements WHERE calls>0 ORDER BY total_exec_time DESC LIMIT 30""",
            (jobs, jobs),
        ):
            print(r)
        print("-- functions (self/total us per pair)")
        for r in c.execute("""SELECT funcname, calls, round((self_time*1000/calls)::numeric,2),
               round((total_time*1000/calls)::numeric,2)
               FROM pg_stat_user_functions WHERE calls > 0 ORDER BY total_time DESC"""):
            print(r)
        print("-- rows written per pair")
        for r in c.execute("""SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del FROM pg_stat_user_tables
               WHERE n_tup_ins+n_tup_upd+n_tup_del>0"""):
            print(r)
