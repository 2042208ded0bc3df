"""Every read an operator repeats is independent of the history (issue 40): pgq.stats (the
dashboard's overview and pgq-thin stats), the rest of the overview (pgq.health, queue settings),
pgq.metrics, list_jobs, get_job and job_result read as many pages with 60,000 finished jobs in the
table as with none. Counted, not timed: the shared buffers each call touches (EXPLAIN (ANALYZE,
BUFFERS) of the call: a function's own reads are counted in its node), with the statistics stale
(just after the history arrived) and fresh (after ANALYZE)."""

from __future__ import annotations

import psycopg

from plankit import capture, plan_of
from sqlhelpers import claim, one

READS = {
    "stats": "SELECT * FROM pgq.stats()",
    "metrics": "SELECT * FROM pgq.metrics()",
    "health": "SELECT * FROM pgq.health()",
    "queue_settings": "SELECT * FROM pgq.queue_settings()",
    "list_jobs pending": "SELECT * FROM pgq.list_jobs('q', 'pending', limit_rows => 50)",
    "list_jobs done": "SELECT * FROM pgq.list_jobs('q', 'done', limit_rows => 50)",
    "list_jobs failed of a kind": "SELECT * FROM pgq.list_jobs('q', 'failed', 'k', limit_rows => 50)",
    "get_job": "SELECT * FROM pgq.get_job(%(id)s)",
    "job_result": "SELECT * FROM pgq.job_result(%(id)s)",
}


def pages(conn: psycopg.Connection, sql: str, params: dict) -> int:
    """The shared buffers the statement's execution touches: the fewest of four runs after a
    first. A run that plans again (autovacuum's ANALYZE of the new rows invalidates the cached
    plans at a moment of its own) reads the catalogs besides; a read of the history would be in
    every run."""
    counts = []
    for _ in range(5):
        [[plan]] = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, params).fetchone()
        top = plan["Plan"]
        counts.append(int(top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0)))
    return min(counts[1:])


def all_pages(conn: psycopg.Connection, params: dict) -> dict[str, int]:
    return {name: pages(conn, sql, params) for name, sql in READS.items()}


def test_the_reads_an_operator_repeats_do_not_grow_with_the_finished_history(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.enqueue_many('q', 'k', array_fill('{}'::jsonb, ARRAY[60]))")
    conn.execute("SELECT pgq.enqueue('q', 'k', run_at => now() + interval '1 hour')")
    running = claim(conn, queues=["q"], batch=10, lease="1 hour")
    finished = claim(conn, queues=["q"], batch=10, lease="1 hour")
    for job in finished:
        assert one(conn, "SELECT pgq.complete(%s, %s, '{\"ok\": 1}')", (job["id"], job["attempt"]))
    params = {"id": finished[0]["id"]}
    before = all_pages(conn, params)
    counts = "SELECT queue, pending, scheduled, running, expired, done, failed, cancelled, waiting FROM pgq.stats()"
    stats_before = conn.execute(counts).fetchall()

    conn.execute("""
        INSERT INTO pgq.jobs (queue, kind, state, attempt, max_attempts, run_at, created_at, finished_at,
                              last_event, result)
        SELECT 'q', 'k', (ARRAY['done', 'failed', 'cancelled'])[1 + g % 3]::pgq.job_state, 1, 25,
               now() - interval '2 hours', now() - interval '2 hours', now() - interval '1 hour',
               'completed', '{"ok": 1}'
        FROM generate_series(1, 60000) AS g""")
    stale = all_pages(conn, params)
    conn.execute("VACUUM ANALYZE pgq.jobs")
    fresh = all_pages(conn, params)

    # A btree over 60,000 more rows may be a level deeper: a probe reads one page more. The table
    # itself is about 900 pages: a read of the history would touch hundreds.
    # pgq.health reads catalogs and statistics besides (about 500 pages) and grew by about 50 here:
    # bounded, not a read of the history, but not proven flat either (see the report of issue 40).
    for name in READS:
        slack = 64 if name == "health" else 12
        assert stale[name] <= before[name] + slack, (name, before[name], stale[name])
        assert fresh[name] <= before[name] + slack, (name, before[name], fresh[name])
    # pgq.stats answers what it answered: its finished counts are the counters (finished since the
    # counters began), which rows written behind pgq's back do not change.
    assert conn.execute(counts).fetchall() == stats_before
    assert stats_before == [("q", 40, 1, len(running), 0, len(finished), 0, 0, 0)]


def test_stats_reads_no_heap_page_per_pending_job_when_the_backlog_is_spread(conn: psycopg.Connection) -> None:
    """bench/README.md measured pgq.stats 1.7-16x slower with a backlog spread one job a page over
    the history's pages: it counted the pending jobs through jobs_list_idx and read each one's heap
    page for run_at. Through jobs_ready_idx (which holds run_at) an all-visible page is not read:
    the call touches fewer pages than hold pending jobs."""
    conn.execute("SELECT pgq.enqueue_many('q', 'k', array_fill('{}'::jsonb, ARRAY[3000]))")
    # One pending job left on each heap page, the others finished (their new versions elsewhere).
    conn.execute("UPDATE pgq.jobs SET state = 'cancelled', finished_at = now()"
                 " WHERE id NOT IN (SELECT min(id) FROM pgq.jobs GROUP BY (ctid::text::point)[0])")
    conn.execute("VACUUM (ANALYZE) pgq.jobs")
    spread = one(conn, "SELECT count(DISTINCT (ctid::text::point)[0]) FROM pgq.jobs WHERE state = 'pending'")
    assert spread >= 20 and one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'pending'") == spread
    assert one(conn, "SELECT pending FROM pgq.stats()") == spread
    spread_pages = pages(conn, READS["stats"], {})
    # The same number of pending jobs, side by side on fresh pages: what the call reads besides.
    conn.execute("UPDATE pgq.jobs SET state = 'cancelled', finished_at = now() WHERE state = 'pending'")
    conn.execute("SELECT pgq.enqueue_many('q', 'k', array_fill('{}'::jsonb, ARRAY[%s]))", (spread,))
    conn.execute("VACUUM (ANALYZE) pgq.jobs")
    assert one(conn, "SELECT count(DISTINCT (ctid::text::point)[0]) FROM pgq.jobs WHERE state = 'pending'") <= 3
    assert one(conn, "SELECT pending FROM pgq.stats()") == spread
    # (Through jobs_list_idx the spread layout cost one heap page per pending job more: 140 against
    # 72 here. What is left is the index's own leaf pages, which held 3,000 jobs' entries.)
    assert spread_pages - pages(conn, READS["stats"], {}) < spread // 2


def test_an_unfiltered_page_reads_about_a_page_however_many_queues_and_states_hold_jobs(
        conn: psycopg.Connection) -> None:
    """bench/README.md measured list_jobs() without a filter 1.25-1.47x slower at 10M finished jobs
    in 4 queues than with none: it read the first page of every (queue, state) pair (450 rows for a
    page of 50, 309 buffers against 109). A page without a filter reads about a page's rows: as
    many buffers with 24 queues' jobs of 6 states (and 2 archive partitions) as with one queue's."""
    conn.execute("SELECT pgq.enqueue_many('q', 'k', array_fill('{}'::jsonb, ARRAY[60]))")
    conn.execute("VACUUM ANALYZE pgq.jobs")
    sql = "SELECT * FROM pgq.list_jobs(limit_rows => 50)"
    one_queue = pages(conn, sql, {})
    assert len(conn.execute(sql).fetchall()) == 50

    conn.execute("INSERT INTO pgq.queues (name) SELECT 'q' || n FROM generate_series(1, 23) AS n")
    conn.execute("SELECT pgq.configure_queue('q1', archive => true)")
    # Each (queue, state) pair holds more than a page: 24 queues x 6 states x 60 jobs, interleaved.
    conn.execute("""
        INSERT INTO pgq.jobs (queue, kind, state, attempt, max_attempts, run_at, created_at, finished_at,
                              last_event, lease_until, claimed_by, claimed_at)
        SELECT CASE WHEN g % 24 = 0 THEN 'q' ELSE 'q' || g % 24 END, 'k', s.state, 1, 25,
               now() - interval '2 hours',
               now() - interval '2 hours',
               CASE WHEN s.state IN ('done', 'failed', 'cancelled') THEN now() - interval '1 day' * (g / 24 % 2) END,
               'enqueued', CASE WHEN s.state = 'running' THEN now() + interval '1 hour' END,
               CASE WHEN s.state = 'running' THEN 'w' END, CASE WHEN s.state = 'running' THEN now() END
        FROM generate_series(1, 24 * 60 * 6) AS g,
             LATERAL (SELECT (ARRAY['waiting', 'pending', 'running', 'done', 'failed',
                                    'cancelled'])[1 + g / 24 % 6]::pgq.job_state AS state) AS s""")
    # q1's finished jobs in the archive, over two day partitions.
    assert one(conn, "SELECT pgq._archive_jobs(array_agg(id)) FROM pgq.jobs WHERE queue = 'q1'"
                     " AND state IN ('done', 'failed', 'cancelled')") == 3 * 60
    assert one(conn, "SELECT count(DISTINCT tableoid) FROM pgq.archive") == 2
    assert one(conn, "SELECT count(*) FROM (SELECT DISTINCT queue, state FROM pgq.jobs) AS p") == 24 * 6 - 3
    conn.execute("VACUUM ANALYZE pgq.jobs")
    conn.execute("ANALYZE pgq.archive")
    many = pages(conn, sql, {})
    # The plan (generic, as the function has it): one backward walk by id of pgq.jobs and of each
    # archive partition, merged; no sort of what the queues' pages hold.
    conn.execute("LOAD 'auto_explain'")
    rows, plans = capture(conn, sql)
    assert len(rows) == 50
    page = plan_of(plans, "_list_newest.below")
    assert "Merge Append" in page.text and "Sort  (" not in page.text, page.text
    assert [(s.index, s.rows <= 50) for s in page.job_scans] == [("jobs_pkey", True)], page.text
    assert page.text.count("Index Scan Backward using archive_") == 2, page.text
    # The same slack as above: an index a level deeper, a partition's first page.
    assert many <= one_queue + 12, (one_queue, many)
