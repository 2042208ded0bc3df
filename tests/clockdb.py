"""A module's pgq database with a settable clock, for tests of time rules (schedules, timeouts).

In the test database only (as superuser), pgq._now() reads pgq_test.clock when it holds a row,
and is statement_timestamp() otherwise (so does pgq._rate_clock(), clock_timestamp() otherwise).
``set_clock(conn, '2030-01-01 12:00+00')`` moves pgq's time; each test starts with the real clock
and empty pgq tables.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from sqlhelpers import fresh_database


@pytest.fixture(scope="module")
def clock_module_dsn(databases, template_db: str) -> Iterator[str]:
    for dsn in fresh_database(databases, template_db):
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE SCHEMA pgq_test")
            conn.execute("REVOKE ALL ON SCHEMA pgq_test FROM PUBLIC")
            conn.execute("CREATE TABLE pgq_test.clock (at timestamptz NOT NULL)")
            conn.execute("""CREATE OR REPLACE FUNCTION pgq._now() RETURNS timestamptz LANGUAGE sql STABLE
                            AS $$ SELECT coalesce((SELECT c.at FROM pgq_test.clock AS c), statement_timestamp()) $$""")
            # The rate limits' clock too (clock_timestamp() otherwise).
            conn.execute("""CREATE OR REPLACE FUNCTION pgq._rate_clock() RETURNS timestamptz LANGUAGE sql VOLATILE
                            AS $$ SELECT coalesce((SELECT c.at FROM pgq_test.clock AS c), clock_timestamp()) $$""")
        yield dsn


@pytest.fixture
def dsn(clock_module_dsn: str) -> Iterator[str]:
    with psycopg.connect(clock_module_dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                     "WHERE datname = current_database() AND pid <> pg_backend_pid()")
        conn.execute("SET lock_timeout = '10s'")
        conn.execute("TRUNCATE pgq.jobs, pgq.job_events, pgq.queues, pgq.grants, pgq.key_limits, pgq.key_rates, "
                     "pgq.rate_buckets, pgq.rate_slices, pgq.key_locks, pgq.job_dependants, pgq.batches, "
                     "pgq.batch_counts, pgq.batch_members, pgq.unique_successors, pgq.replace_slots, pgq.schedules, "
                     "pgq.tenants, pgq.steps, pgq.signals, pgq.signal_checks, pgq.signal_grants, pgq.finished_counts, "
                     "pgq.finished_deltas, pgq_test.clock "
                     "RESTART IDENTITY")
    yield clock_module_dsn


def set_clock(conn: psycopg.Connection, at: str | None) -> None:
    """pgq's time from now on: the instant ``at`` (text a timestamptz accepts), or None for real time."""
    conn.execute("DELETE FROM pgq_test.clock")
    if at is not None:
        conn.execute("INSERT INTO pgq_test.clock VALUES (%s::timestamptz)", (at,))
