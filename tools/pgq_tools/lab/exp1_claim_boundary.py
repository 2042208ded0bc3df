"""Experiment 1: the claim's transaction boundary.

worker-a opens a transaction, calls pgq.claim and pauses before COMMIT. While the claim is
uncommitted, an observer reads the row (not blocked, still pending) and worker-b's pgq.claim gets
another job without waiting. After COMMIT the row is running, owned by worker-a, and later claims
ignore it."""

from __future__ import annotations

from pgq_tools.lab.harness import Harness, Session, Step, Verdict
from pgq_tools.lab.statements import CLAIM, ENQUEUE_COHORT, EPOCH, EVENTS, JOB

NUMBER = 1
SLUG = "claim-boundary"
TITLE = "Claim transaction boundary"
BASIS = (
    "“FOR UPDATE causes the rows retrieved by the SELECT statement to be locked as though for update. "
    "This prevents them from being locked, modified or deleted by other transactions until the current "
    "transaction ends.” “Row-level locks do not affect data querying; they block only writers and lockers "
    "to the same row.” (Explicit Locking, 13.3.2). “The optional RETURNING clause causes UPDATE to compute "
    "and return value(s) based on each row actually updated.” (UPDATE)"
)
HYPOTHESIS = (
    "pgq.claim locks and updates its row in one statement, so an uncommitted claim hides the row from "
    "other claimants (SKIP LOCKED) without blocking them or readers; once committed, state = 'running' "
    "takes over and the claim predicate no longer matches the row."
)
PROCEDURE = (
    "3 jobs. worker-a: BEGIN; pgq.claim (pause). observer: read the row. worker-b: pgq.claim. "
    "worker-a: COMMIT. observer: read the row. worker-b: pgq.claim twice more."
)
CONDITION = (
    "worker-b is not blocked and does not get worker-a's job while it is uncommitted; the observer reads "
    "it as pending/attempt 0 without blocking; after COMMIT it is running at attempt 1 for worker-a and "
    "no later claim returns it; it has exactly one 'claimed' event."
)


def _ids(step) -> list[int]:  # type: ignore[no-untyped-def]
    return step.col("id") if step.ok else []


def run(h: Harness) -> Verdict:
    v = Verdict()
    jobs = h.fixture("enqueue_3_jobs", ENQUEUE_COHORT,
                     {"queue": "lab", "kind": "synthetic", "cohort": "exp1", "n": 3, "run_at": EPOCH}).col("id")
    a, b, obs = h.session("worker-a"), h.session("worker-b"), h.session("observer")

    def claim(session: Session, name: str) -> Step:
        return h.step(session, name, CLAIM,
                      {"worker": session.name, "queues": ["lab"], "batch": 1, "lease": "30 seconds"})

    h.step(a, "a_begin", "BEGIN")
    a_claim = claim(a, "a_claim")
    held = a_claim.value
    during = h.step(obs, "obs_read_during", JOB, {"id": held})
    b_during = claim(b, "b_claim_during")
    commit = h.step(a, "a_commit", "COMMIT")
    after = h.step(obs, "obs_read_after", JOB, {"id": held})
    b_after1 = claim(b, "b_claim_after_1")
    b_after2 = claim(b, "b_claim_after_2")
    events = h.step(obs, "obs_events", EVENTS, {"ids": [held]})

    v.check("worker-a's claim (uncommitted) returned the oldest job",
            a_claim.ok and held == jobs[0], f"returned {_ids(a_claim)}, oldest is {jobs[0]}")
    d = during.dicts()[0] if during.rows else {}
    v.check("the observer's plain read was not blocked and saw the committed state (pending, attempt 0)",
            not during.blocked and d.get("state") == "pending" and d.get("attempt") == 0,
            f"{during.outcome}; state={d.get('state')} attempt={d.get('attempt')}")
    v.check("worker-b's concurrent pgq.claim was not blocked",
            b_during.ok and not b_during.lock_wait, f"{b_during.outcome} in {b_during.duration_ms:.1f} ms")
    v.check("worker-b did not get the uncommitted claim's job (it got the next one)",
            held not in _ids(b_during) and _ids(b_during) == [jobs[1]],
            f"worker-b got {_ids(b_during)}; held by worker-a: {held}")
    x = after.dicts()[0] if after.rows else {}
    v.check("after COMMIT the row is running, attempt 1, claimed by worker-a, with a lease",
            commit.ok and x.get("state") == "running" and x.get("attempt") == 1
            and x.get("claimed_by") == "worker-a" and x.get("lease_until") is not None,
            f"state={x.get('state')} attempt={x.get('attempt')} claimed_by={x.get('claimed_by')} "
            f"lease_until={x.get('lease_until')}")
    v.check("later claims ignore the committed row",
            held not in _ids(b_after1) + _ids(b_after2) and _ids(b_after1) == [jobs[2]] and _ids(b_after2) == [],
            f"next claims returned {_ids(b_after1)} then {_ids(b_after2) or 'nothing'}")
    claimed = [e for e in events.dicts() if e["event"] == "claimed"]
    v.check("the job was claimed exactly once", len(claimed) == 1,
            f"{len(claimed)} 'claimed' event(s): "
            + ", ".join(f"attempt {e['attempt']} by {e['worker']}" for e in claimed))

    v.observe(f"While worker-a's pgq.claim of job {held} was uncommitted, the observer read it as "
              f"{d.get('state')}/attempt {d.get('attempt')} ({during.outcome}) and worker-b's pgq.claim returned "
              f"job {_ids(b_during) or 'nothing'} in {b_during.duration_ms:.1f} ms ({b_during.outcome}).")
    v.observe(f"After COMMIT job {held} was {x.get('state')} (attempt {x.get('attempt')}, claimed_by "
              f"{x.get('claimed_by')}); the next two claims returned {_ids(b_after1) or 'nothing'} and "
              f"{_ids(b_after2) or 'nothing'}; job {held} has {len(claimed)} 'claimed' event.")
    return v
