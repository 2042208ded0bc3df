"""The plans pgq's functions actually run, captured with auto_explain (log_nested_statements) after
every function was called 8 times in the session, so the cached plans in use (generic for claim
and recovery, which force them) are the ones shown.

The table holds 1M done rows, 100k scheduled rows, 1k exhausted rows of the highest priority and
20k due rows. ANALYZE runs before any job is claimed, so the statistics believe nothing is running:
the stale-statistics case that follows a quiet period or an outage.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import psycopg
import pytest

from plankit import WARMUP, assert_no_seq_scan_on_jobs, capture, plan_of
from sqlhelpers import LOWER_LEASE_FLOOR, claim

# The module's fixture builds a database of 1.1 million jobs (about 13 s).
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def big_dsn(databases, template_db: str) -> Iterator[str]:
    name = databases.new_name()
    dsn = databases.create(name, template_db)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO pgq.queues (name) VALUES ('q')")
        conn.execute("""
            INSERT INTO pgq.jobs (queue, kind, state, attempt, max_attempts, run_at, created_at,
                                  finished_at, last_event)
            SELECT 'q', 'k', 'done', 1, 25, now() - interval '2 hours', now() - interval '2 hours',
                   now() - interval '1 hour', 'completed'
            FROM generate_series(1, 1000000)""")
        conn.execute("""
            INSERT INTO pgq.jobs (queue, kind, run_at, max_attempts)
            SELECT 'q', 'k', now() + interval '1 day' + g * interval '1 second', 25
            FROM generate_series(1, 100000) AS g""")
        conn.execute("""
            INSERT INTO pgq.jobs (queue, kind, priority, attempt, max_attempts, run_at)
            SELECT 'q', 'k', 1000, 3, 3, now() - interval '1 hour' FROM generate_series(1, 1000)""")
        conn.execute("""
            INSERT INTO pgq.jobs (queue, kind, run_at, max_attempts)
            SELECT 'q', 'k', now() - interval '1 minute' + g * interval '1 millisecond', 25
            FROM generate_series(1, 20000) AS g""")
        conn.execute("VACUUM ANALYZE pgq.jobs")
        conn.execute("ANALYZE pgq.queues")
    try:
        yield dsn
    finally:
        databases.drop(name)


@pytest.fixture
def session(big_dsn: str) -> Iterator[psycopg.Connection]:
    """A superuser session with auto_explain loaded but not yet logging."""
    with psycopg.connect(big_dsn, autocommit=True) as conn:
        conn.execute("LOAD 'auto_explain'")
        conn.execute("SET auto_explain.log_min_duration = -1")
        yield conn


def running_jobs(conn: psycopg.Connection, n: int) -> list[tuple[int, int]]:
    got: list[tuple[int, int]] = []
    while len(got) < n:
        got += [(c["id"], c["attempt"]) for c in claim(conn, batch=min(1000, n - len(got)))]
    return got


def test_claim_uses_jobs_ready_idx_and_reads_rows_in_proportion_to_the_batch(session):
    for _ in range(WARMUP):
        assert len(claim(session, batch=10)) == 10
    rows, plans = capture(session, "SELECT * FROM pgq.claim('w', batch => 10)")
    assert len(rows) == 10
    assert_no_seq_scan_on_jobs(plans)
    main = plan_of(plans, "WITH picked AS")
    # One pick reads jobs_ready_idx; the per-kind branch (claim's kinds, NULL here) is in the same
    # plan (through jobs_ready_idx or jobs_kind_ready_idx, as the planner likes) but never runs.
    picks = [s for s in main.job_scans if s.index == "jobs_ready_idx" and s.rows > 0]
    assert len(picks) == 1, main.text
    assert picks[0].rows <= 10, main.text  # not the 100k scheduled, 1k exhausted or 1M done rows
    idle = [s for s in main.job_scans
            if s.index in ("jobs_ready_idx", "jobs_kind_ready_idx") and s not in picks]
    assert all(s.rows == 0 for s in idle), main.text
    others = [s for s in main.job_scans if s.index not in ("jobs_ready_idx", "jobs_kind_ready_idx")]
    assert all(s.index == "jobs_pkey" and s.rows == 0 for s in others), main.text  # (the fair and keyed picks: none)
    # The lease, a statement of its own, reads the 10 picks by primary key.
    lease = plan_of(plans, "WITH claimed AS")
    assert lease.job_scans and all(s.index == "jobs_pkey" for s in lease.job_scans), lease.text
    assert sum(s.rows for s in lease.job_scans) == 10, lease.text
    # Generic: the plan refers to the function's variables as parameters, not as constants.
    assert re.search(r"unnest\(\$\d+\)", main.text), main.text
    probe = plan_of(plans, "FROM pgq._claim_queues(")  # (an SQL function: inlined into the claim's query)
    # The expired-lease probe, and (queues => NULL) the skip scan for the queues with pending
    # jobs: one entry of the ready index per such queue (one queue here), not every job.
    assert [s.index for s in probe.job_scans][:1] == ["jobs_lease_idx"], probe.text
    skip = probe.job_scans[1:]
    assert skip and all(s.index in ("jobs_ready_idx", "jobs_kind_ready_idx") and s.rows <= 2 for s in skip), \
        probe.text


def test_claim_and_sweep_recover_expired_leases_through_jobs_lease_idx_in_batches(session):
    running = running_jobs(session, 3000)
    session.execute("UPDATE pgq.jobs SET lease_until = now() - interval '1 minute' "
                    "WHERE id = ANY(%s)", ([i for i, _ in running],))
    session.execute(LOWER_LEASE_FLOOR)  # moved into the past by hand: below the claims' floor
    for _ in range(WARMUP):
        assert session.execute("SELECT pgq.sweep(10)").fetchone() == (10,)

    (swept,), plans = capture(session, "SELECT pgq.sweep(100)")
    assert swept == (100,)
    assert_no_seq_scan_on_jobs(plans)
    recovery = plan_of(plans, "WITH expired AS")
    scans = recovery.job_scans
    assert [s.index for s in scans] == ["jobs_lease_idx", "jobs_pkey"], recovery.text
    assert scans[0].rows <= 100 and scans[1].rows <= 100, recovery.text
    join_filtered = [int(x) for x in re.findall(r"Rows Removed by Join Filter: (\d+)", recovery.text)]
    assert sum(join_filtered) <= 100, recovery.text  # no pass over every expired lease per row

    # The claim folds recovery in: 100 more recovered, through the same plan shape.
    rows, plans = capture(session, "SELECT * FROM pgq.claim('w', batch => 5)")
    assert len(rows) == 5
    assert_no_seq_scan_on_jobs(plans)
    recovery = plan_of(plans, "WITH expired AS")
    assert [s.index for s in recovery.job_scans] == ["jobs_lease_idx", "jobs_pkey"], recovery.text
    assert all(s.rows <= 100 for s in recovery.job_scans), recovery.text


@pytest.mark.parametrize("call,marker", [
    ("SELECT pgq.complete(%s, %s)", "WITH completed AS"),
    ("SELECT pgq.renew(%s, %s)", "UPDATE pgq.jobs AS j"),
    ("SELECT pgq.fail(%s, %s, 'e')", "WITH failed AS"),
    ("SELECT pgq.release(%s, %s)", "WITH released AS"),
    ("SELECT pgq.snooze(%s, %s, '1 hour')", "WITH snoozed AS"),
    ("SELECT pgq.mark_unknown(%s, %s, 'n')", "WITH marked AS"),
])
def test_owner_operations_find_the_job_by_its_primary_key(session, call, marker):
    jobs = running_jobs(session, WARMUP + 1)
    for job_id, attempt in jobs[:WARMUP]:
        session.execute(call, (job_id, attempt))
    _, plans = capture(session, call, jobs[WARMUP])
    assert_no_seq_scan_on_jobs(plans)
    write = plan_of(plans, marker)
    assert [s.index for s in write.job_scans] == ["jobs_pkey"], write.text
    assert write.job_scans[0].rows <= 1


def test_complete_many_finds_the_jobs_by_their_primary_key(session):
    jobs = running_jobs(session, 10 * (WARMUP + 1))
    for i in range(WARMUP):
        batch = jobs[i * 10:(i + 1) * 10]
        session.execute("SELECT * FROM pgq.complete_many(%s, %s)",
                        ([j for j, _ in batch], [a for _, a in batch]))
    batch = jobs[WARMUP * 10:]
    rows, plans = capture(session, "SELECT * FROM pgq.complete_many(%s, %s)",
                          ([j for j, _ in batch], [a for _, a in batch]))
    assert len(rows) == 10
    assert_no_seq_scan_on_jobs(plans)
    write = plan_of(plans, "WITH wanted AS")
    assert write.job_scans and all(s.index == "jobs_pkey" and s.rows <= 10 for s in write.job_scans), write.text
    # The pairs are read once, by the locking step: the completing UPDATE joins what that step
    # locked. (Joined to the pairs again, the generic plan, which expects 10, scanned every pair
    # once per completed job: quadratic in a call's size, 36 s for a call of 20,000 jobs.)
    assert write.text.count("CTE Scan on wanted") == 1, write.text


def test_complete_many_with_stale_pairs_reads_only_those_jobs_by_their_primary_key(session):
    # The rejected path (a pair whose attempt is no longer running) runs two more statements; under
    # the function's forced generic plans they must still read the named jobs only.
    jobs = running_jobs(session, 10 * (WARMUP + 1))
    for i in range(WARMUP + 1):
        batch = jobs[i * 10:(i + 1) * 10]
        ids, attempts = [j for j, _ in batch], [a for _, a in batch]
        attempts[0] -= 1  # one stale pair per call
        rows, plans = capture(session, "SELECT * FROM pgq.complete_many(%s, %s)", (ids, attempts))
    assert sorted(r[0] for r in rows) == sorted(ids[1:])
    assert_no_seq_scan_on_jobs(plans)
    scans = [s for p in plans for s in p.job_scans]
    assert scans and all(s.index == "jobs_pkey" and s.rows <= 10 for s in scans), "\n".join(p.text for p in plans)


def test_a_key_limited_claim_reads_a_bounded_head_then_other_keys_by_their_index(session):
    """The extra step of a key-limited queue (pgq._keyed_pick), whose work is bounded however the
    jobs fall (issue 25): the head of the queue read from jobs_ready_idx, at most batch + 16 rows
    whatever their keys; when keys at their limit hold it, the other keys walked one probe each
    (jobs_key_ready_idx) and their first jobs read there; the running jobs counted through
    jobs_lease_idx; the picks locked by primary key. The full key's 199 waiting jobs
    at the head are never read past."""
    session.execute("SELECT pgq.configure_queue('kq', key_max_running => 1)")
    try:
        # 200 jobs of key 'hot' at the head of the queue, 2000 of 400 other keys behind them.
        session.execute("SELECT pgq.enqueue_many('kq', 'k', array_fill('{}'::jsonb, ARRAY[200]), "
                        "run_at => now() - interval '1 hour', concurrency_key => 'hot')")
        session.execute("""SELECT pgq.enqueue('kq', 'k', run_at => now() - interval '30 minutes',
                                              concurrency_key => 'key-' || g % 400)
                           FROM generate_series(1, 2000) AS g""")
        session.execute("ANALYZE pgq.jobs")
        for _ in range(WARMUP):  # each fills 10 keys; 'hot' is full after the first
            assert len(claim(session, queues=["kq"], batch=10)) == 10
        rows, plans = capture(session, "SELECT * FROM pgq.claim('w', '{kq}', batch => 10)")
        assert len(rows) == 10
        assert_no_seq_scan_on_jobs(plans)
        everything = "\n".join(p.text for p in plans)
        heads = [p for p in plans if "LIMIT head" in p.query]
        assert len(heads) == 1, [p.query[:60] for p in plans]
        [scan] = heads[0].job_scans
        assert scan.index == "jobs_ready_idx" and scan.rows <= 10 + 16, heads[0].text
        # The walk and the other keys' first jobs: jobs_key_ready_idx only, a few rows per key.
        walks = [s for p in plans if "WITH RECURSIVE walk" in p.query or "CROSS JOIN LATERAL" in p.query
                 and "concurrency_key = w.key" in p.query for s in p.job_scans]
        assert walks and all(s.index == "jobs_key_ready_idx" for s in walks), everything
        assert sum(s.rows for s in walks) <= 3 * (10 + 16) + 80, everything  # (the 80 keys the warm-up filled)
        counts = [s for p in plans if "lease_until IS NOT NULL" in p.query and "concurrency_key" in p.query
                  for s in p.job_scans]
        assert counts and all(s.index == "jobs_lease_idx" for s in counts), everything  # (the running jobs)
        # Nothing reads the table beyond that: every scan of pgq.jobs in the claim is bounded.
        assert all(s.rows <= 1000 for p in plans for s in p.job_scans), everything
    finally:
        session.execute("DELETE FROM pgq.jobs WHERE queue = 'kq'")
        session.execute("DELETE FROM pgq.queues WHERE name = 'kq'")
