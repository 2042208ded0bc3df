"""Backend CPU of pgq.complete alone (batch 1, plain queue 'bench'): claim N jobs one per transaction,
then time (backend CPU from /proc) N completes, one per transaction, in a DO loop. Variants are SQL
applied on the same server between rounds, alternated.
Usage: python bench/complete_ab.py on|off N ROUNDS (from the repository, its venv).
"C" is the cut proposed on bench/README.md ("Where a claim + complete's server CPU goes"), not
shipped; "X" variants take a guarantee away and only price it."""

import statistics
import sys
import time
from pathlib import Path

import psycopg

from pgq_thin.migrate import migrate
from pgq_thin.testing.server import SERVER_SETTINGS, ThrowawayPostgres
from pgq_tools.bench import _backend_cpu_seconds

fs, n, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
CLAIM = """DO $$ BEGIN FOR i IN 1..%s LOOP PERFORM pgq.claim('ab', ARRAY['bench'], 1); COMMIT; END LOOP; END $$"""
COMPLETE = """DO $$ DECLARE r record; BEGIN
  FOR r IN SELECT id, attempt FROM pgq.jobs WHERE state = 'running' ORDER BY id LOOP
  PERFORM pgq.complete(r.id, r.attempt); COMMIT; END LOOP; END $$"""
src = Path(__file__).resolve().parents[1] / "sql" / "functions"


def fn(path, name):  # the CREATE OR REPLACE FUNCTION statement of `name` in a file, up to its closing $$;
    t = (src / path).read_text()
    i = t.index(f"CREATE OR REPLACE FUNCTION {name}(")
    j = t.index("$$;", t.index("AS $$", i) + 5) + 3
    return t[i:j]


base_complete = fn("owner.sql", "pgq.complete")
base_trigger = fn("ended.sql", "pgq._job_ended")
variants = {"A current": [base_complete, base_trigger]}
TRIG_ORIG = (
    "DROP TRIGGER jobs_ended ON pgq.jobs; "
    "CREATE TRIGGER jobs_ended AFTER UPDATE OF state ON pgq.jobs FOR EACH ROW WHEN "
    "((new.state = ANY (ARRAY['done'::pgq.job_state, 'failed'::pgq.job_state, 'cancelled'::pgq.job_state])) "
    "AND old.state IS DISTINCT FROM new.state) EXECUTE FUNCTION pgq._job_ended()"
)
TRIG_C = TRIG_ORIG.replace(
    "AND old.state IS DISTINCT FROM new.state)",
    "AND old.state IS DISTINCT FROM new.state AND new.last_event IS DISTINCT FROM 'completed')",
)
assert TRIG_C != TRIG_ORIG
c = base_complete.replace(
    "    SET search_path = pgq, pg_temp\n", "    SET search_path = pgq, pg_temp\n    SET enable_seqscan = off\n"
)
c = c.replace("    changed integer;\n", "    changed integer;\n    done_queue text;\n    waited_for boolean;\n")
c = c.replace(
    "    SELECT count(*) INTO changed FROM completed;\n    IF changed > 0 THEN\n",
    """    SELECT count(*), min(c.queue) INTO changed, done_queue FROM completed AS c;
    IF changed > 0 THEN
        INSERT INTO pgq.finished_deltas (queue, state) VALUES (done_queue, 'done')
        RETURNING EXISTS (SELECT FROM pgq.job_dependencies AS d WHERE d.depends_on = complete.id) INTO waited_for;
        IF waited_for OR (current_setting('transaction_isolation') <> 'read committed'
                          AND transaction_timestamp() <> statement_timestamp()) THEN
            PERFORM pgq._dependency_ended(complete.id, 'running', 'done', waited_for, false);
        END IF;
""",
)
assert "done_queue, 'done'" in c
variants["A current"] = [base_complete, base_trigger, TRIG_ORIG]
variants["C counted in complete, trigger skips it"] = [c, base_trigger, TRIG_C]
variants["X trigger disabled"] = [
    base_complete,
    base_trigger,
    TRIG_ORIG,
    "ALTER TABLE pgq.jobs DISABLE TRIGGER jobs_ended",
]
ON = "ALTER TABLE pgq.jobs ENABLE TRIGGER jobs_ended"
AUDIT = "UPDATE pgq.queues SET audit = %s WHERE name = 'bench'"
for k in variants:
    variants[k] += [AUDIT % "true"] + ([ON] if k != "X trigger disabled" else [])
no_set = base_trigger.replace("    SET enable_seqscan = off\n", "")
no_search_path = base_complete.replace("    SET search_path = pgq, pg_temp\n", "")
assert no_set != base_trigger and no_search_path != base_complete
variants["B trigger without SET"] = [base_complete, no_set, TRIG_ORIG, ON, AUDIT % "true"]
variants["X complete without SET search_path"] = [no_search_path, base_trigger, TRIG_ORIG, ON, AUDIT % "true"]
variants["X audit off"] = [base_complete, base_trigger, TRIG_ORIG, ON, AUDIT % "false"]
args = f"{SERVER_SETTINGS} -c fsync={fs}"
with ThrowawayPostgres(postgres_args=args) as pg:
    dsn = pg.url("test")
    migrate(dsn)
    res = {k: [] for k in variants}
    with psycopg.connect(dsn, autocommit=True) as c:
        for r in range(rounds + 1):
            keys = list(variants)
            keys = keys[r % len(keys) :] + keys[: r % len(keys)]
            for k in keys:
                for stmt in variants[k]:
                    c.execute(stmt)
                c.execute("TRUNCATE pgq.jobs, pgq.job_events, pgq.finished_deltas")
                c.execute("SELECT pgq.enqueue_many('bench', 'noop', array_fill('{}'::jsonb, ARRAY[%s]))", (n,))
                c.execute("VACUUM ANALYZE pgq.jobs")
                c.execute(CLAIM % n)
                pid = c.execute("SELECT pg_backend_pid()").fetchone()[0]
                u = _backend_cpu_seconds(pid)
                t = time.perf_counter()
                c.execute(COMPLETE)
                u = _backend_cpu_seconds(pid) - u
                t = time.perf_counter() - t
                assert c.execute("SELECT count(*) FROM pgq.jobs WHERE state='done'").fetchone()[0] == n
                deltas = c.execute("SELECT count(*) FROM pgq.finished_deltas").fetchone()[0]
                assert deltas == (0 if k == "X trigger disabled" else n), (k, deltas)  # every end counted once
                if r:
                    res[k].append(u / n * 1e6)
        for stmt in variants["A current"]:
            c.execute(stmt)
    a = statistics.median(res["A current"])
    print(f"fsync={fs} n={n} rounds={rounds}: backend CPU per complete, median (min) us")
    for k, v in res.items():
        print(f"  {k:40s} {statistics.median(v):7.1f} ({min(v):6.1f})  B/A {statistics.median(v) / a:.3f}")
