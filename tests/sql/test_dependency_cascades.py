"""Cascades of job dependencies are bounded whatever the planner thinks (issue 24): the ends of one
transaction move on at most pgq._dependency_step() (1000) dependants, breadth first; the rest is
left to pgq.cascade_backlog, which every sweep works through, max_jobs at a time; a claim's
recovery of an expired lease moves none. Every dependant still ends cancelled (or released) exactly
once. And enqueue_many writes at most 10000 links per call. Real PostgreSQL, real sessions."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from pgq_tools.lab.harness import Harness

from dependencykit import backlog, enqueue, links, run, settle, state, written
from sqlhelpers import claim, expire_lease, job, one

STEP = 1000  # pgq._dependency_step()


def counts(conn: psycopg.Connection, queue: str) -> dict[str, int]:
    return dict(conn.execute("SELECT state::text, count(*) FROM pgq.jobs WHERE queue = %s GROUP BY 1",
                             (queue,)).fetchall())


def ends_recorded(conn: psycopg.Connection, queue: str, event: str) -> tuple[int, int]:
    """(jobs of the queue with that event, the most times one of them has it)."""
    row = conn.execute("SELECT count(*), coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM pgq.job_events AS e "
                       "JOIN pgq.jobs AS j ON j.id = e.job_id WHERE j.queue = %s AND e.event = %s "
                       "GROUP BY e.job_id) AS x", (queue, event)).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def fail(conn: psycopg.Connection, job_id: int) -> None:
    assert one(conn, "SELECT pgq.fail(%s, %s, 'boom', retryable => false)", (job_id, run(conn, job_id))) == "failed"


def test_a_failure_cancels_one_step_of_a_fan_out_and_the_sweeps_the_rest_exactly_once(conn: psycopg.Connection) -> None:
    head = enqueue(conn, queue="head")
    fan = [int(r[0]) for r in conn.execute(
        "SELECT pgq.enqueue_many('fan', 'k', array_fill('{}'::jsonb, ARRAY[2500]), depends_on => %s)", ([head],))]
    fail(conn, head)
    assert counts(conn, "fan") == {"cancelled": STEP, "waiting": 1500}
    assert [state(conn, i) for i in fan[:STEP]] == ["cancelled"] * STEP  # the first ones, in id order
    assert backlog(conn)[1] == 1
    assert one(conn, "SELECT pgq.sweep(600)") == 0
    assert counts(conn, "fan") == {"cancelled": STEP + 600, "waiting": 900}
    settle(conn)
    assert counts(conn, "fan") == {"cancelled": 2500}
    assert ends_recorded(conn, "fan", "dependency_ended") == (2500, 1)  # each once
    assert {job(conn, i)["last_error"] for i in (fan[0], fan[-1])} == \
        {f"pgq: cancelled: its dependency, job {head}, ended failed"}
    assert (links(conn), backlog(conn)) == (0, (0, 0))


def test_a_chain_is_cancelled_one_step_at_a_time_down_the_chain(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('chain', audit => false)")
    chain = [enqueue(conn, queue="chain")]
    for _ in range(2500):
        chain.append(enqueue(conn, [chain[-1]], queue="chain"))
    fail(conn, chain[0])
    assert [state(conn, i) for i in chain[1:STEP + 2]] == ["cancelled"] * STEP + ["waiting"]
    conn.execute("SELECT pgq.sweep(1000)")
    assert counts(conn, "chain") == {"failed": 1, "cancelled": 2 * STEP, "waiting": 500}
    settle(conn)
    assert counts(conn, "chain") == {"failed": 1, "cancelled": 2500}
    last = job(conn, chain[-1])["last_error"]
    assert last == (f"pgq: cancelled: its dependency, job {chain[-2]}, was cancelled because job {chain[0]}, "
                    "up its chain, ended failed")
    assert (links(conn), backlog(conn)) == (0, (0, 0))


def test_a_completion_releases_one_step_of_its_dependants_and_the_sweep_the_rest_once(conn: psycopg.Connection) -> None:
    head = enqueue(conn, queue="head")
    conn.execute("SELECT pgq.enqueue_many('fan', 'k', array_fill('{}'::jsonb, ARRAY[2500]), depends_on => %s)",
                 ([head],))
    assert one(conn, "SELECT pgq.complete(%s, %s)", (head, run(conn, head))) is True
    assert counts(conn, "fan") == {"pending": STEP, "waiting": 1500}
    settle(conn)
    assert counts(conn, "fan") == {"pending": 2500}
    assert ends_recorded(conn, "fan", "dependencies_done") == (2500, 1)
    assert (links(conn), backlog(conn)) == (0, (0, 0))


def test_a_cancellation_counts_the_links_it_deletes(conn: psycopg.Connection) -> None:
    """Each cancelled dependant deletes all its own links: one that waits for 600 jobs counts 600 of
    the step (but one call always moves at least one on)."""
    others = [int(r[0]) for r in conn.execute("SELECT pgq.enqueue_many('others', 'k', array_fill('{}'::jsonb, "
                                              "ARRAY[599]))")]
    head = enqueue(conn, queue="head")
    wide = [enqueue(conn, [head, *others], queue="wide") for _ in range(3)]
    fail(conn, head)
    assert [state(conn, w) for w in wide] == ["cancelled", "waiting", "waiting"]  # 600 + 600 > 1000
    settle(conn)
    assert [state(conn, w) for w in wide] == ["cancelled"] * 3 and links(conn) == 0


def test_a_release_after_a_cancellation_counts_one_more_of_the_step(conn: psycopg.Connection) -> None:
    """An all_ended dependant counts a cancelled dependency as ended: its release costs one of the
    step like any release, so after a cancellation that used the whole step it waits for the sweep
    (the model test once expected it released at once)."""
    others = [int(r[0]) for r in conn.execute("SELECT pgq.enqueue_many('others', 'k', array_fill('{}'::jsonb, "
                                              "ARRAY[999]))")]
    head = enqueue(conn, queue="head")
    wide = enqueue(conn, [head, *others], queue="wide")  # cancelled with head: 1000 links, the whole step
    ended = enqueue(conn, [head], queue="ended", dependency_mode="all_ended")
    fail(conn, head)
    assert [state(conn, wide), state(conn, ended)] == ["cancelled", "waiting"]
    assert backlog(conn)[1] == 1
    settle(conn)
    assert [state(conn, wide), state(conn, ended)] == ["cancelled", "pending"]
    assert job(conn, ended)["last_event"] == "dependencies_done"
    assert (links(conn), backlog(conn)) == (0, (0, 0))


def test_the_ends_of_one_transaction_share_one_step(conn: psycopg.Connection) -> None:
    heads = [enqueue(conn, queue="heads") for _ in range(3)]
    for h in heads:
        conn.execute("SELECT pgq.enqueue_many('fan', 'k', array_fill('{}'::jsonb, ARRAY[600]), depends_on => %s)",
                     ([h],))
    claimed = claim(conn, queues=["heads"], batch=3)
    assert conn.execute("SELECT count(*) FROM pgq.complete_many(%s, %s)",
                        ([c["id"] for c in claimed], [c["attempt"] for c in claimed])).fetchone() == (3,)
    assert counts(conn, "fan") == {"pending": STEP, "waiting": 800}
    settle(conn)
    assert counts(conn, "fan") == {"pending": 1800}


def test_no_session_setting_changes_the_step(conn: psycopg.Connection) -> None:
    """The step is the transaction's, kept where only pgq writes (pgq.cascade_budgets): the settings
    that once carried it, raised, lowered or not a count, change nothing (lowered: test_dependency_isolation)."""
    head = enqueue(conn, queue="head")
    conn.execute("SELECT pgq.enqueue_many('fan', 'k', array_fill('{}'::jsonb, ARRAY[1500]), depends_on => %s)",
                 ([head],))
    conn.execute("SET pgq.dependency_budget = '100000'")
    conn.execute("SET pgq.dependency_patience = '99999999999'")
    assert one(conn, "SELECT pgq.complete(%s, %s)", (head, run(conn, head))) is True
    assert counts(conn, "fan") == {"pending": STEP, "waiting": 500}
    conn.execute("SET pgq.dependency_budget = 'lots'")
    settle(conn)
    assert counts(conn, "fan") == {"pending": 1500}


def test_a_retried_dependency_leaves_its_earlier_dependants_to_its_earlier_end(conn: psycopg.Connection) -> None:
    head = enqueue(conn, queue="head")
    before = [int(r[0]) for r in conn.execute(
        "SELECT pgq.enqueue_many('fan', 'k', array_fill('{}'::jsonb, ARRAY[1200]), depends_on => %s)", ([head],))]
    fail(conn, head)  # cancels 1000; 200 are left to the backlog
    assert one(conn, "SELECT pgq.retry(%s)", (head,)) is True
    after = enqueue(conn, [head], queue="fan")  # waits for the retried run
    assert one(conn, "SELECT pgq.complete(%s, %s)", (head, run(conn, head))) is True
    assert state(conn, after) == "pending"
    assert [state(conn, i) for i in before[STEP:]] == ["waiting"] * 200  # not released by the second end
    settle(conn)
    assert [state(conn, i) for i in before] == ["cancelled"] * 1200  # by the first end, as if it had been whole
    assert links(conn) == 0


# Claims never work for the graph, nor wait on it ----------------------------------------------------

@pytest.fixture
def h(dsn: str) -> Iterator[Harness]:
    harness = Harness(dsn, experiment="cascades", step_timeout=10)
    yield harness
    harness.close()


def test_a_claims_recovery_of_an_expired_lease_leaves_the_cascade_to_the_sweep(h: Harness,
                                                                               conn: psycopg.Connection) -> None:
    head = enqueue(conn, queue="head", max_attempts=1)
    run(conn, head)
    fan = [int(r[0]) for r in conn.execute(
        "SELECT pgq.enqueue_many('fan', 'k', array_fill('{}'::jsonb, ARRAY[3000]), depends_on => %s)", ([head],))]
    expire_lease(conn, head)
    other = enqueue(conn, queue="other")
    # A producer's transaction enqueues more dependants of the head and stays open; another holds a
    # dependant's row (an admin's cancel, uncommitted).
    producer, admin, worker = h.session("producer"), h.session("admin"), h.session("worker")
    h.step(producer, "begin", "BEGIN")
    assert h.step(producer, "enqueue", "SELECT count(*) FROM pgq.enqueue_many('fan', 'k', "
                  "array_fill('{}'::jsonb, ARRAY[1000]), depends_on => %s)", ([head],)).ok
    h.step(admin, "begin", "BEGIN")
    assert h.step(admin, "cancel", "SELECT pgq.cancel(%s)", (fan[0],)).ok
    claimed = h.step(worker, "claim", "SELECT id FROM pgq.claim('w', ARRAY['other'])")
    assert claimed.ok and not claimed.blocked and not claimed.lock_wait, claimed.outcome
    assert claimed.rows == [(other,)]
    assert state(conn, head) == "failed"  # recovered by the claim, its last attempt used
    assert counts(conn, "fan") == {"waiting": 3000}  # the claim moved none of them on
    assert backlog(conn)[1] == 1
    assert h.step(admin, "commit", "COMMIT").ok and h.step(producer, "commit", "COMMIT").ok
    settle(conn)
    assert counts(conn, "fan") == {"cancelled": 4000}
    assert job(conn, fan[0])["last_event"] == "cancelled"  # the admin's, not the cascade's
    assert ends_recorded(conn, "fan", "dependency_ended") == (3999, 1)


def test_a_sweep_skips_a_dependant_another_transaction_holds_and_a_later_one_takes_it(
        h: Harness, conn: psycopg.Connection) -> None:
    head, other = enqueue(conn, queue="head"), enqueue(conn, queue="head")
    held = enqueue(conn, [head, other], queue="fan")
    free = enqueue(conn, [head], queue="fan")
    conn.execute("SELECT pgq.sweep()")  # the enqueues' checks
    attempt = run(conn, head)
    # A step of 0 for this end: it leaves it all to the backlog.
    step = "CREATE OR REPLACE FUNCTION pgq._dependency_step() RETURNS integer LANGUAGE sql STABLE AS 'SELECT {}'"
    conn.execute(step.format(0))
    assert one(conn, "SELECT pgq.complete(%s, %s)", (head, attempt)) is True
    conn.execute(step.format(STEP))
    holder, sweeper = h.session("holder"), h.session("sweeper")
    h.step(holder, "begin", "BEGIN")
    assert h.step(holder, "lock", "SELECT id FROM pgq.jobs WHERE id = %s FOR NO KEY UPDATE", (held,)).ok
    swept = h.step(sweeper, "sweep", "SELECT pgq.sweep()")
    assert swept.ok and not swept.blocked and not swept.lock_wait, swept.outcome
    assert (state(conn, free), job(conn, held)["dependencies_left"]) == ("pending", 2)
    assert h.step(holder, "commit", "COMMIT").ok
    conn.execute("SELECT pgq.sweep()")
    assert (job(conn, held)["dependencies_left"], backlog(conn)) == (1, (0, 0))


# enqueue_many's links -------------------------------------------------------------------------------

def test_enqueue_many_writes_at_most_10000_links_per_call(conn: psycopg.Connection) -> None:
    deps = [int(r[0]) for r in conn.execute("SELECT pgq.enqueue_many('deps', 'k', array_fill('{}'::jsonb, "
                                            "ARRAY[10000]))")]
    assert len(conn.execute("SELECT pgq.enqueue_many('q', 'k', array_fill('{}'::jsonb, ARRAY[1000]), "
                            "depends_on => %s)", (deps[:10],)).fetchall()) == 1000  # 10000 links: the limit
    before = written(conn)
    for payloads, named in ((1000, 11), (1000, 10000), (2, 5001)):
        with pytest.raises(psycopg.errors.InvalidParameterValue) as refused:
            conn.execute("SELECT pgq.enqueue_many('q', 'k', array_fill('{}'::jsonb, ARRAY[%s]), depends_on => %s)",
                         (payloads, deps[:named]))
        assert refused.value.diag.message_primary == (
            f'pgq: argument "depends_on" names {named} jobs for {payloads} payloads: {named * payloads} links, '
            'and one call writes at most 10000 (payloads x jobs named)')
        assert "Split the payloads" in (refused.value.diag.message_hint or "")
    assert written(conn) == before
    # The same whatever the states of the jobs named (all done here).
    conn.execute("UPDATE pgq.jobs SET state = 'done', finished_at = now() WHERE queue = 'deps'")
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        conn.execute("SELECT pgq.enqueue_many('q', 'k', array_fill('{}'::jsonb, ARRAY[1000]), depends_on => %s)",
                     (deps[:11],))


# 100,000 whatever the statistics (slow) --------------------------------------------------------------

def reads(conn: psycopg.Connection) -> int:
    """Rows and index entries this transaction has read from pgq's tables so far."""
    return int(one(conn, "SELECT coalesce(sum(coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)), 0) "
                         "FROM pg_stat_xact_user_tables WHERE schemaname = 'pgq'"))


def build(conn: psycopg.Connection, shape: str, n: int) -> int:
    """A head job and n waiting dependants: a chain (each waits for the one before) or a fan-out
    (all wait for the head), written directly (the cascade is under test, not the enqueue)."""
    head = enqueue(conn, queue="big")
    conn.execute(
        "INSERT INTO pgq.jobs (queue, kind, payload, state, depends_on, dependencies_left, max_attempts) "
        "SELECT 'big', 'k', '{}', 'waiting', ARRAY[CASE WHEN %(shape)s = 'chain' THEN %(head)s + g - 1 "
        "ELSE %(head)s END], 1, 25 FROM generate_series(1, %(n)s) AS g ORDER BY g",
        {"shape": shape, "head": head, "n": n})
    conn.execute("INSERT INTO pgq.job_dependencies (depends_on, job_id) "
                 "SELECT j.depends_on[1], j.id FROM pgq.jobs AS j WHERE j.queue = 'big' AND j.state = 'waiting'")
    # (The flag releases before 15 needed for a job's end to look for its dependants.)
    conn.execute("UPDATE pgq.jobs SET has_dependants = true WHERE queue = 'big' AND id IN "
                 "(SELECT d.depends_on FROM pgq.job_dependencies AS d)")
    assert one(conn, "SELECT count(*) FROM pgq.job_dependencies AS d JOIN pgq.jobs AS j "
                     "ON j.id = d.depends_on AND j.queue = 'big'") == n
    return head


@pytest.mark.slow
@pytest.mark.parametrize("statistics", ["fresh", "analyzed", "empty_when_analyzed"])
@pytest.mark.parametrize("shape", ["chain", "fan_out"])
def test_a_cascade_of_100000_is_bounded_per_call_whatever_the_statistics(conn: psycopg.Connection, shape: str,
                                                                         statistics: str) -> None:
    n, sweep_jobs = 100_000, 25_000
    tables = ", ".join(t for t in ("pgq.jobs", "pgq.job_dependencies", "pgq.cascade_backlog",
                                   "pgq.overlap_checks") if one(conn, "SELECT to_regclass(%s) IS NOT NULL", (t,)))
    for table in tables.split(", "):  # no autovacuum run changes the statistics under the test
        conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
    if statistics == "empty_when_analyzed":
        conn.execute(f"VACUUM ANALYZE {tables}")  # the planner is told the tables are empty
    conn.execute("SELECT pgq.configure_queue('big', audit => false)")
    head = build(conn, shape, n)
    if statistics == "analyzed":
        conn.execute(f"ANALYZE {tables}")
    conn.execute("SET statement_timeout = '120s'")  # a safety net only: the bound is on reads
    attempt = run(conn, head)
    with conn.transaction():
        start = reads(conn)
        assert one(conn, "SELECT pgq.fail(%s, %s, 'boom', retryable => false)", (head, attempt)) == "failed"
        read = reads(conn) - start
    assert counts(conn, "big") == {"failed": 1, "cancelled": STEP, "waiting": n - STEP}
    # About 6 (fan-out) or 8 (chain) rows and index entries per dependant moved on, whatever the
    # statistics: a plan that read the rest of the graph (or every link) would read 100,000s.
    assert read <= 10 * STEP, f"the failing call read {read} rows and index entries"
    sweeps: list[int] = []
    while backlog(conn) != (0, 0):
        with conn.transaction():
            start = reads(conn)
            conn.execute("SELECT pgq.sweep(%s)", (sweep_jobs,))
            sweeps.append(reads(conn) - start)
        assert len(sweeps) <= n // sweep_jobs + 2, counts(conn, "big")
    assert max(sweeps) <= 15 * sweep_jobs, f"rows read per sweep: {sweeps}"  # about 7 or 11 per dependant
    assert counts(conn, "big") == {"failed": 1, "cancelled": n}
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE queue = 'big' AND state = 'cancelled' "
                     "AND last_event = 'dependency_ended' AND finished_at IS NOT NULL") == n
    assert one(conn, "SELECT count(*) FROM pgq.finished_deltas WHERE queue = 'big' AND state = 'cancelled'") + \
        one(conn, "SELECT coalesce(sum(total), 0) FROM pgq.finished_counts WHERE queue = 'big' "
                  "AND state = 'cancelled'") == n  # each end counted once
    assert links(conn) == 0

