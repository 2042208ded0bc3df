"""pg_partman on finished history, tried here (docs/scaling.md): a range-partitioned copy of pgq.jobs
by finished_at, managed by pg_partman (Debian's postgresql-15-partman, 4.7.x), daily partitions,
retention by dropping partitions; finished jobs moved into it in one statement.

    apt-get install postgresql-15-partman && .venv/bin/python bench/partman_trial.py

Prints what it sees; needs the system's PostgreSQL 15 (the embedded 18 has no pg_partman).
"""

from __future__ import annotations

import time

import psycopg

from pgq_thin.migrate import migrate
from pgq_thin.testing.server import ThrowawayPostgres

PARTITIONS = ("SELECT inhrelid::regclass::text FROM pg_inherits"
              " WHERE inhparent = 'pgq_history.jobs'::regclass ORDER BY 1")
ROWS = "SELECT tableoid::regclass::text, count(*) FROM pgq_history.jobs GROUP BY 1 ORDER BY 1"


def main() -> None:
    server = ThrowawayPostgres()
    try:
        dsn = server.url()
        migrate(dsn)
        c = psycopg.connect(dsn, autocommit=True)
        c.execute("CREATE SCHEMA partman")
        c.execute("CREATE EXTENSION pg_partman SCHEMA partman")
        print("pg_partman", c.execute("SELECT extversion FROM pg_extension WHERE extname = 'pg_partman'").fetchone())
        c.execute("CREATE SCHEMA pgq_history")
        c.execute("CREATE TABLE pgq_history.jobs (LIKE pgq.jobs) PARTITION BY RANGE (finished_at)")
        c.execute("SELECT partman.create_parent(p_parent_table => 'pgq_history.jobs', p_control => 'finished_at',"
                  " p_type => 'native', p_interval => 'daily', p_premake => 2,"
                  " p_start_partition => (now() - interval '3 days')::text)")
        c.execute("UPDATE partman.part_config SET retention = '2 days', retention_keep_table = false"
                  " WHERE parent_table = 'pgq_history.jobs'")
        print("partitions", [r[0] for r in c.execute(PARTITIONS)])
        c.execute("SELECT pgq.enqueue_many('q', 'k', array_fill('{}'::jsonb, ARRAY[3000]))")
        while rows := c.execute("SELECT id, attempt FROM pgq.claim('w', batch => 1000)").fetchall():
            c.execute("SELECT pgq.complete_many(%s, %s)", ([r[0] for r in rows], [r[1] for r in rows]))
        c.execute("UPDATE pgq.jobs SET finished_at = now() - (id % 3) * interval '1 day'")  # three days of history
        started = time.perf_counter()
        c.execute("WITH moved AS (DELETE FROM pgq.jobs WHERE state IN ('done', 'failed', 'cancelled') RETURNING *)"
                  " INSERT INTO pgq_history.jobs SELECT * FROM moved")
        print(f"moved 3000 finished jobs in {time.perf_counter() - started:.3f} s:", c.execute(ROWS).fetchall())
        started = time.perf_counter()
        c.execute("SELECT partman.run_maintenance('pgq_history.jobs')")
        print(f"run_maintenance {time.perf_counter() - started:.3f} s; partitions now",
              [r[0] for r in c.execute(PARTITIONS)])
        print("rows", c.execute(ROWS).fetchall())
    finally:
        server.stop()


if __name__ == "__main__":
    main()
