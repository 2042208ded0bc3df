"""The plans of pgq.list_jobs and of a claim that names its kinds, captured with auto_explain (as in
test_sql_plans) on a table with 1M finished rows: a page reads about a page of rows, whatever the
finished history; a kinds claim reads its kinds' jobs only, past 100k due jobs of another kind."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from plankit import WARMUP, assert_no_seq_scan_on_jobs, capture, plan_of

pytestmark = pytest.mark.slow

LIMIT = 20


@pytest.fixture(scope="module")
def big_dsn(databases, template_db: str) -> Iterator[str]:
    name = databases.new_name()
    dsn = databases.create(name, template_db)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO pgq.queues (name) VALUES ('q'), ('bulk')")
        # Queue q's own history first (the oldest ids): 100 done and 30 failed jobs.
        conn.execute("""
            INSERT INTO pgq.jobs (queue, kind, state, attempt, max_attempts, run_at, created_at,
                                  finished_at, last_event, last_error)
            SELECT 'q', 'k', CASE WHEN g <= 100 THEN 'done' ELSE 'failed' END::pgq.job_state, 1, 25,
                   now() - interval '3 hours', now() - interval '3 hours', now() - interval '2 hours',
                   CASE WHEN g <= 100 THEN 'completed' ELSE 'failed' END, CASE WHEN g > 100 THEN 'boom' END
            FROM generate_series(1, 130) AS g""")
        # Then 1M finished rows of another queue: every newer id is someone else's history.
        conn.execute("""
            INSERT INTO pgq.jobs (queue, kind, state, attempt, max_attempts, run_at, created_at,
                                  finished_at, last_event)
            SELECT 'bulk', 'k', 'done', 1, 25, now() - interval '2 hours', now() - interval '2 hours',
                   now() - interval '1 hour', 'completed'
            FROM generate_series(1, 1000000)""")
        # Queue q's due work: 100k jobs of a kind nobody in these tests claims by name, ahead of
        # 200 jobs of kind 'mine' in the total order.
        conn.execute("""
            INSERT INTO pgq.jobs (queue, kind, priority, run_at, max_attempts)
            SELECT 'q', 'other', 100, now() - interval '1 minute', 25 FROM generate_series(1, 100000)""")
        conn.execute("""
            INSERT INTO pgq.jobs (queue, kind, run_at, max_attempts)
            SELECT 'q', 'mine', now() - interval '1 minute', 25 FROM generate_series(1, 200)""")
        conn.execute("VACUUM ANALYZE pgq.jobs")
        conn.execute("ANALYZE pgq.queues")
    try:
        yield dsn
    finally:
        databases.drop(name)


@pytest.fixture
def session(big_dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(big_dsn, autocommit=True) as conn:
        conn.execute("LOAD 'auto_explain'")
        conn.execute("SET auto_explain.log_min_duration = -1")
        yield conn


@pytest.mark.parametrize("filters", [
    {},
    {"queue": "q"},
    {"state": "failed"},
    {"queue": "q", "state": "failed"},
    {"queue": "q", "state": "done"},
    {"state": "done"},
    {"queue": "q", "state": "pending", "kind": "mine"},
    {"state": "running"},
])
def test_a_page_of_list_jobs_reads_a_page_of_rows_through_an_index(session, filters) -> None:
    args = ", ".join([f"{k} => %({k})s" for k in filters] + [f"limit_rows => {LIMIT}"])
    sql = f"SELECT id FROM pgq.list_jobs({args})"
    for _ in range(WARMUP):
        session.execute(sql, filters).fetchall()
    rows, plans = capture(session, sql, filters)
    expected = session.execute(
        "SELECT id FROM pgq.jobs WHERE (%(queue)s::text IS NULL OR queue = %(queue)s)"
        " AND (%(state)s::text IS NULL OR state::text = %(state)s)"
        " AND (%(kind)s::text IS NULL OR kind = %(kind)s) ORDER BY id DESC LIMIT %(limit)s",
        {"queue": None, "state": None, "kind": None, **filters, "limit": LIMIT}).fetchall()
    assert rows == expected and (rows or filters == {"state": "running"})
    assert_no_seq_scan_on_jobs(plans)
    if not filters:  # a walk of jobs_pkey backwards (issue 40): a page of rows, whatever the queues
        page = plan_of(plans, "_list_newest.below")
        assert [s.index for s in page.job_scans] == ["jobs_pkey"], page.text
        assert page.job_scans[0].rows <= LIMIT and "Sort  (" not in page.text, page.text
        return
    page = plan_of(plans, "FROM pgq.queues AS q")
    scans = page.job_scans
    assert scans and {s.index for s in scans} <= {"jobs_list_idx", "jobs_lease_idx"}, page.text
    # At most a page per (queue, state) branch, not the 1M rows of bulk's history nor q's 100k due jobs.
    assert sum(s.rows for s in scans) <= LIMIT * 6 * 2, page.text
    assert "Rows Removed by Filter" not in page.text or all(
        int(n) <= LIMIT for n in __import__("re").findall(r"Rows Removed by Filter: (\d+)", page.text)), page.text


def test_a_claim_that_names_its_kinds_reads_only_their_jobs_through_jobs_kind_ready_idx(session) -> None:
    claim = "SELECT * FROM pgq.claim('w', '{q}', batch => 10, kinds => '{mine,absent}')"
    for _ in range(WARMUP):
        got = session.execute(claim).fetchall()
        assert len(got) == 10
    rows, plans = capture(session, claim)
    assert len(rows) == 10 and {r[2] for r in rows} == {"mine"}
    assert_no_seq_scan_on_jobs(plans)
    main = plan_of(plans, "WITH picked AS")
    picks = [s for s in main.job_scans if s.index in ("jobs_kind_ready_idx", "jobs_ready_idx")]
    assert picks and all(s.index == "jobs_kind_ready_idx" for s in picks if s.rows), main.text
    assert sum(s.rows for s in picks) <= 10, main.text  # not the 100k 'other' jobs ahead of them
    # Without kinds the same claim takes the 'other' jobs first, through jobs_ready_idx as before.
    for _ in range(WARMUP):
        session.execute("SELECT * FROM pgq.claim('w', '{q}', batch => 10)").fetchall()
    rows, plans = capture(session, "SELECT * FROM pgq.claim('w', '{q}', batch => 10)")
    assert {r[2] for r in rows} == {"other"}
    main = plan_of(plans, "WITH picked AS")
    used = [s for s in main.job_scans if s.rows and s.index in ("jobs_kind_ready_idx", "jobs_ready_idx")]
    assert [s.index for s in used] == ["jobs_ready_idx"] and used[0].rows <= 10, main.text


def test_bulk_retry_and_cancel_read_one_call_of_rows_through_jobs_list_idx(session) -> None:
    """pgq.retry_jobs, pgq.cancel_jobs (issue 27) and pgq.delete_jobs (issue 41) read their (queue,
    state) in id order through jobs_list_idx, at most a call's rows: never the 1M finished rows of
    another queue, nor the jobs of other states. Each runs in a transaction rolled back, leaving the table as it was."""
    cases = [
        ("SELECT pgq.retry_jobs('q', 'failed', limit_rows => 20)", "retry_jobs.finished_before", 20, 20),
        ("SELECT pgq.retry_jobs('bulk', 'failed')", "retry_jobs.finished_before", 0, 0),
        ("SELECT pgq.retry_jobs('q', 'failed', finished_before => now())", "retry_jobs.finished_before", 30, 30),
        ("SELECT pgq.cancel_jobs('q', 'pending', limit_rows => 20)", "cancel_jobs.created_before", 20, 20),
        ("SELECT pgq.cancel_jobs('bulk', 'waiting')", "cancel_jobs.created_before", 0, 0),
        # pgq.delete_jobs (issue 41) the same: a pending job is cancelled first, then deleted.
        ("SELECT pgq.delete_jobs('q', 'failed', limit_rows => 20)", "delete_jobs.before", 20, 20),
        ("SELECT pgq.delete_jobs('bulk', 'failed')", "delete_jobs.before", 0, 0),
        ("SELECT pgq.delete_jobs('q', 'done', before => now(), limit_rows => 50)", "delete_jobs.before", 50, 50),
        ("SELECT pgq.delete_jobs('q', 'pending', limit_rows => 20)", "delete_jobs.before", 20, 20),
    ]
    for sql, marker, count, most in cases:
        for _ in range(WARMUP):
            session.execute("BEGIN")
            session.execute(sql)
            session.execute("ROLLBACK")
        session.execute("BEGIN")
        try:
            rows, plans = capture(session, sql)
        finally:
            session.execute("ROLLBACK")
        assert rows == [(count,)], sql
        assert_no_seq_scan_on_jobs(plans)
        loop = plan_of(plans, marker)
        scans = loop.job_scans
        assert [s.index for s in scans] == ["jobs_list_idx"], loop.text
        assert sum(s.rows for s in scans) <= most, loop.text
