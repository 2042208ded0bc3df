"""Backend CPU of one claim + complete pair (bench's AB_SERVER_LOOP, batch 1, plain queue 'bench'): A, the
functions as they are; B, pgq.claim with _lease_jobs' statement inlined as its own RETURN QUERY (one
PL/pgSQL call, one executor start and one tuplestore fewer per claim). B is created on the server
only (sql/functions/claim.sql is not changed): a measurement for cut 1 of bench/README.md's "Cuts
proposed for claim.sql". Usage: python bench/claim_inline_ab.py on|off N ROUNDS."""

import statistics
import sys
from pathlib import Path

import psycopg

from pgq_thin.migrate import migrate
from pgq_thin.testing.server import SERVER_SETTINGS, ThrowawayPostgres
from pgq_tools.bench import AB_SERVER_LOOP, _backend_cpu_seconds

fs, n, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
src = (Path(__file__).resolve().parents[1] / "sql" / "functions" / "claim.sql").read_text()


def fn(name: str) -> str:  # the CREATE OR REPLACE FUNCTION statement of `name`, up to its closing $$;
    i = src.index(f"CREATE OR REPLACE FUNCTION {name}(")
    return src[i : src.index("$$;", src.index("AS $$", i) + 5) + 3]


claim = fn("pgq.claim")
lease = fn("pgq._lease_jobs")
body = lease[lease.index("    RETURN QUERY\n") : lease.index("END\n$$;")]
body = body.replace("_lease_jobs.picked", "(fair_ids || keyed_ids)").replace("_lease_jobs.", "claim.")
call = claim[claim.index("    RETURN QUERY SELECT * FROM pgq._lease_jobs(") :]
call = call[: call.index(";\n") + 2]
inlined = claim.replace(call, body)
assert inlined != claim and "_lease_jobs" not in inlined.split("AS $$", 1)[1]
variants = {"A current": claim, "B claim with _lease_jobs inlined": inlined}
with ThrowawayPostgres(postgres_args=f"{SERVER_SETTINGS} -c fsync={fs}") as pg:
    dsn = pg.url("test")
    migrate(dsn)
    res: dict[str, list[float]] = {k: [] for k in variants}
    with psycopg.connect(dsn, autocommit=True) as c:
        for r in range(rounds + 1):
            for k in list(variants) if r % 2 == 0 else list(variants)[::-1]:
                c.execute(variants[k])
                c.execute("TRUNCATE pgq.jobs, pgq.job_events, pgq.finished_deltas")
                c.execute("SELECT pgq.enqueue_many('bench', 'noop', array_fill('{}'::jsonb, ARRAY[%s]))", (n,))
                c.execute("VACUUM ANALYZE pgq.jobs")
                pid = c.execute("SELECT pg_backend_pid()").fetchone()[0]
                u = _backend_cpu_seconds(pid)
                c.execute(AB_SERVER_LOOP % n)
                u = _backend_cpu_seconds(pid) - u
                done = c.execute("SELECT count(*) FROM pgq.jobs WHERE state = 'done'").fetchone()[0]
                events = c.execute("SELECT count(*) FROM pgq.job_events").fetchone()[0]
                assert (done, events) == (n, 2 * n), (k, done, events)  # every job claimed and completed once
                if r:
                    res[k].append(u / n * 1e6)
        c.execute(claim)
    a = statistics.median(res["A current"])
    print(f"fsync={fs} n={n} rounds={rounds}: backend CPU per claim+complete pair, median (min) us")
    for k, v in res.items():
        print(f"  {k:36s} {statistics.median(v):7.1f} ({min(v):6.1f})  B/A {statistics.median(v) / a:.3f}")
