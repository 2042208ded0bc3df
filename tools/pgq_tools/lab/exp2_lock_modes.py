"""Experiment 2: blocking FOR UPDATE vs SKIP LOCKED vs NOWAIT on a locked oldest job.

worker-a holds a row lock on the oldest job (raw FOR UPDATE: this experiment is about PostgreSQL's
locking clauses themselves). worker-b then runs the seed's candidate query three ways, and pgq.claim:
the plain FOR UPDATE waits (detected through pg_blocking_pids), SKIP LOCKED and pgq.claim take the
next job at once, NOWAIT fails at once with 55P03. Finally a table lock, which SKIP LOCKED does not
skip, makes pgq.claim wait."""

from __future__ import annotations

from pgq_tools.lab.harness import Harness, Step, Verdict
from pgq_tools.lab.statements import CLAIM, ENQUEUE_COHORT, EPOCH

NUMBER = 2
SLUG = "lock-modes"
TITLE = "Blocking FOR UPDATE vs SKIP LOCKED vs NOWAIT"
BASIS = (
    "“To prevent the operation from waiting for other transactions to commit, use either the NOWAIT or "
    "SKIP LOCKED option. With NOWAIT, the statement reports an error, rather than waiting, if a selected "
    "row cannot be locked immediately. With SKIP LOCKED, any selected rows that cannot be immediately "
    "locked are skipped. […] Note that NOWAIT and SKIP LOCKED apply only to the row-level lock(s) — the "
    "required ROW SHARE table-level lock is still taken in the ordinary way.” (SELECT, The Locking Clause)"
)
HYPOTHESIS = (
    "With the oldest job row-locked, a plain FOR UPDATE candidate query waits for the holder, SKIP LOCKED "
    "(and pgq.claim, which uses it) moves on to the next job, NOWAIT errors; a table-level lock still "
    "makes pgq.claim wait."
)
PROCEDURE = (
    "4 jobs. worker-a: BEGIN; SELECT … WHERE id = <oldest> FOR UPDATE. worker-b: the seed's candidate "
    "query with FOR UPDATE (blocks; worker-a ROLLBACK releases it), then — job re-locked — with SKIP "
    "LOCKED, pgq.claim, and FOR UPDATE NOWAIT. worker-a ROLLBACK; pgq.claim. admin: BEGIN; LOCK TABLE "
    "pgq.jobs IN EXCLUSIVE MODE; worker-b: pgq.claim (blocks); admin ROLLBACK."
)
CONDITION = (
    "FOR UPDATE is reported blocked by worker-a and returns the oldest job only after worker-a's "
    "transaction ends; SKIP LOCKED and pgq.claim return the second job without blocking; NOWAIT fails "
    "with SQLSTATE 55P03 without blocking; after release pgq.claim returns the oldest job; pgq.claim is "
    "reported blocked by the table lock and completes after it is released."
)

CANDIDATE = (
    "SELECT id FROM pgq.jobs WHERE queue = 'lab' AND state = 'pending'"
    " ORDER BY priority DESC, run_at, id LIMIT 1 FOR UPDATE"
)
LOCK_ONE = "SELECT id FROM pgq.jobs WHERE id = %(id)s FOR UPDATE"


def run(h: Harness) -> Verdict:
    v = Verdict()
    jobs = h.fixture("enqueue_4_jobs", ENQUEUE_COHORT,
                     {"queue": "lab", "kind": "synthetic", "cohort": "exp2", "n": 4, "run_at": EPOCH}).col("id")
    oldest, second, third = jobs[0], jobs[1], jobs[2]
    a, b, admin = h.session("worker-a"), h.session("worker-b"), h.session("admin")
    claim_params = {"worker": "worker-b", "queues": ["lab"], "batch": 1, "lease": "30 seconds"}

    # Variant 1: the blocking control.
    h.step(a, "a_begin", "BEGIN")
    h.step(a, "a_lock_oldest", LOCK_ONE, {"id": oldest})
    h.step(b, "b_begin", "BEGIN")
    blocking = h.step(b, "b_for_update", CANDIDATE)
    blocked_seen = blocking.blocked and not blocking.done
    release1 = h.step(a, "a_rollback", "ROLLBACK")
    h.wait(blocking)
    h.step(b, "b_rollback", "ROLLBACK")

    # Variant 2: SKIP LOCKED, raw and through pgq.claim.
    h.step(a, "a_begin_2", "BEGIN")
    h.step(a, "a_lock_oldest_2", LOCK_ONE, {"id": oldest})
    skip = h.step(b, "b_skip_locked", CANDIDATE + " SKIP LOCKED")
    pgq_claim = h.step(b, "b_pgq_claim", CLAIM, claim_params)

    # Variant 3: NOWAIT.
    nowait = h.step(b, "b_nowait", CANDIDATE + " NOWAIT")
    h.step(a, "a_rollback_2", "ROLLBACK")
    after_release = h.step(b, "b_pgq_claim_after_release", CLAIM, claim_params)

    # Variant 4: a table-level lock is not skipped.
    h.step(admin, "admin_begin", "BEGIN")
    h.step(admin, "admin_lock_table", "LOCK TABLE pgq.jobs IN EXCLUSIVE MODE")
    table_blocked = h.step(b, "b_pgq_claim_table_locked", CLAIM, claim_params)
    table_blocked_seen = table_blocked.blocked and not table_blocked.done
    table_release = h.step(admin, "admin_rollback", "ROLLBACK")
    h.wait(table_blocked)

    assert release1.ended_at and table_release.started_at
    v.check("plain FOR UPDATE waited, reported blocked by worker-a",
            blocked_seen and blocking.blocked_by == ["worker-a"],
            f"{blocking.outcome}; waited {blocking.waited_ms:.0f} ms")
    v.check("plain FOR UPDATE returned the oldest job only after worker-a's transaction ended",
            blocking.ok and blocking.value == oldest and blocking.ended_at is not None
            and release1.started_at is not None and blocking.ended_at >= release1.started_at,
            f"returned {blocking.value} at {blocking.ended_at:%H:%M:%S.%f}; worker-a ROLLBACK at "
            f"{release1.started_at:%H:%M:%S.%f}")
    v.check("SKIP LOCKED returned the second job without blocking",
            skip.ok and not skip.lock_wait and skip.value == second,
            f"{skip.outcome}; returned {skip.value} in {skip.duration_ms:.1f} ms")
    v.check("pgq.claim skipped the locked oldest job without blocking",
            pgq_claim.ok and not pgq_claim.lock_wait and pgq_claim.col("id") == [second],
            f"{pgq_claim.outcome}; returned {pgq_claim.col('id') if pgq_claim.ok else '-'} in "
            f"{pgq_claim.duration_ms:.1f} ms")
    v.check("NOWAIT failed at once with 55P03 lock_not_available",
            nowait.sqlstate == "55P03" and not nowait.lock_wait,
            f"{nowait.outcome} after {nowait.duration_ms:.1f} ms")
    v.check("once the lock was released pgq.claim returned the oldest job",
            after_release.ok and after_release.col("id") == [oldest],
            f"returned {after_release.col('id') if after_release.ok else after_release.outcome}")
    v.check("a table-level lock is not skipped: pgq.claim was reported blocked by admin, then completed",
            table_blocked_seen and table_blocked.blocked_by == ["admin"] and table_blocked.ok
            and table_blocked.col("id") == [third] and table_blocked.ended_at is not None
            and table_blocked.ended_at >= table_release.started_at,
            f"{table_blocked.outcome}; waited {table_blocked.waited_ms:.0f} ms; returned "
            f"{table_blocked.col('id') if table_blocked.ok else '-'}")

    for sentence in observation(oldest, blocking, skip, pgq_claim, nowait, after_release, table_blocked):
        v.observe(sentence)
    return v


def _waited(step: Step) -> str:
    return (f"waited {step.lock_wait_ms:.0f} ms on a lock ({step.outcome})" if step.lock_wait
            else f"did not wait on a lock ({step.outcome})")


def observation(oldest: int, blocking: Step, skip: Step, pgq_claim: Step, nowait: Step, after_release: Step,
                table_blocked: Step) -> list[str]:
    """The observation, from the captured steps only (a test feeds it other outcomes)."""
    claimed = pgq_claim.col("id") if pgq_claim.ok else "-"
    return [
        f"With job {oldest} row-locked by worker-a: FOR UPDATE {_waited(blocking)} and returned {blocking.value}; "
        f"SKIP LOCKED returned {skip.value} in {skip.duration_ms:.1f} ms and {_waited(skip)}; pgq.claim returned "
        f"{claimed} in {pgq_claim.duration_ms:.1f} ms and {_waited(pgq_claim)}; NOWAIT: {nowait.outcome}.",
        f"After release pgq.claim returned {after_release.col('id') if after_release.ok else '-'}. "
        f"Under LOCK TABLE … IN EXCLUSIVE MODE pgq.claim {_waited(table_blocked)}.",
    ]
