"""Experiment 5: long work outside the claim transaction vs the anti-pattern of holding it open.

Mode A (pgq's way): worker-a's pgq.claim commits at once (autocommit), then the synthetic work runs
(a local sleep), then pgq.complete. Mode B (the anti-pattern): BEGIN; pgq.claim; work; pgq.complete;
COMMIT. During the work, in each mode: the session's state in pg_stat_activity, pgq.stats() as a
monitor sees it, a lock probe on the claimed row (a plain FOR NO KEY UPDATE, as an admin call
would take), and another claimant. The row-lock hold time is measured from the step timestamps."""

from __future__ import annotations

import time

from pgq_thin.tools.lab.harness import Harness, Verdict, sqlv
from pgq_thin.tools.lab.statements import CLAIM, COMPLETE, ENQUEUE_COHORT, EPOCH

NUMBER = 5
SLUG = "long-work"
TITLE = "Long work outside the claim transaction vs holding it open"
BASIS = (
    "“Row-level locks are released at transaction end or during savepoint rollback, just like table-level "
    "locks.” “Row-level locks do not affect data querying; they block only writers and lockers to the same "
    "row.” (Explicit Locking, 13.3.2). FOR UPDATE locks rows “until the current transaction ends.”"
)
HYPOTHESIS = (
    "Committing the claim before the work keeps the row-lock lifetime to the claim statement; ownership is "
    "then carried by state = 'running', the lease and the attempt. Holding the claim transaction open "
    "for the work stretches the lock to the work's duration, blocks every writer or locker of that row, "
    "hides the claim from monitoring, and gains nothing."
)
PROCEDURE = (
    "Two queues of 3 jobs. Mode A: worker-a pgq.claim (autocommit); background work 600 ms; meanwhile "
    "observer reads pg_stat_activity and pgq.stats(), prober runs SELECT … FOR NO KEY UPDATE on the row, "
    "worker-b claims; then worker-a pgq.complete. Mode B: the same inside BEGIN … COMMIT."
)
CONDITION = (
    "A: worker-a is 'idle' (no transaction) during the work, the probe is not blocked, the row lock lasts "
    "only the claim statement (< 1/5 of the work), stats show the job running. B: worker-a is 'idle in "
    "transaction', the probe is reported blocked by worker-a and finishes only after the COMMIT, the lock "
    "lasts at least the work, stats still show the job pending. Both: worker-b is never blocked and never "
    "gets worker-a's job; pgq.complete returns true."
)

WORK_SECONDS = 0.6
ACTIVITY = "SELECT state, xact_start IS NOT NULL AS in_transaction FROM pg_stat_activity WHERE pid = %(pid)s"
STATS = "SELECT pending, running FROM pgq.stats() WHERE queue = %(queue)s"
PROBE = "SELECT id FROM pgq.jobs WHERE id = %(id)s FOR NO KEY UPDATE"


def _mode(h: Harness, v: Verdict, mode: str, queue: str, hold_open: bool) -> dict:  # type: ignore[type-arg]
    jobs = h.fixture(f"{mode}_enqueue", ENQUEUE_COHORT,
                     {"queue": queue, "kind": "synthetic", "cohort": mode, "n": 3, "run_at": EPOCH}).col("id")
    a = h.session(f"worker-a-{mode}")
    b = h.session(f"worker-b-{mode}")
    obs = h.session(f"observer-{mode}")
    prober = h.session(f"prober-{mode}")
    first = h.step(a, f"{mode}_a_begin", "BEGIN") if hold_open else None
    claim = h.step(a, f"{mode}_a_claim", CLAIM, {"worker": a.name, "queues": [queue], "batch": 1, "lease": "30 seconds"})
    row = claim.dicts()[0]
    work = h.start(a, f"{mode}_a_work", fn=lambda: time.sleep(WORK_SECONDS),
                   describe=f"synthetic work: sleep {WORK_SECONDS}s"
                   + (" inside the open claim transaction" if hold_open else " after the claim committed"))
    activity = h.step(obs, f"{mode}_obs_activity", ACTIVITY, {"pid": a.pid}).dicts()[0]
    stats = h.step(obs, f"{mode}_obs_stats", STATS, {"queue": queue}).dicts()[0]
    probe = h.step(prober, f"{mode}_probe_row_lock", PROBE, {"id": row["id"]})
    probe_blocked = probe.blocked and not probe.done
    other = h.step(b, f"{mode}_b_claim", CLAIM, {"worker": b.name, "queues": [queue], "batch": 1, "lease": "30 seconds"})
    h.wait(work)
    done = h.step(a, f"{mode}_a_complete", COMPLETE, {"id": row["id"], "attempt": row["attempt"]})
    end = h.step(a, f"{mode}_a_commit", "COMMIT") if hold_open else done
    h.wait(probe)
    lock_start = (first or claim).started_at
    lock_end = end.ended_at if hold_open else claim.ended_at
    assert lock_start and lock_end and work.duration_ms is not None
    hold_ms = (lock_end - lock_start).total_seconds() * 1000
    work_ms = work.duration_ms
    other_ids = other.col("id") if other.ok else []
    result = {"job": row["id"], "hold_ms": hold_ms, "work_ms": work_ms, "state": activity["state"],
              "probe": probe, "probe_blocked": probe_blocked, "stats": stats, "other": other, "other_ids": other_ids,
              "completed": done.value, "end": end}
    return result


def run(h: Harness) -> Verdict:
    v = Verdict()
    a = _mode(h, v, "A", "outside", hold_open=False)
    b = _mode(h, v, "B", "inside", hold_open=True)

    v.check("A: during the work worker-a had no open transaction (pg_stat_activity state 'idle')",
            a["state"] == "idle", f"state '{a['state']}'")
    v.check("A: the row-lock probe was not blocked", not a["probe"].lock_wait and a["probe"].ok,
            f"{a['probe'].outcome} in {a['probe'].duration_ms:.1f} ms")
    v.check("A: the row lock lasted only the claim statement (< 1/5 of the work)",
            a["hold_ms"] < a["work_ms"] / 5, f"lock held {a['hold_ms']:.1f} ms, work {a['work_ms']:.0f} ms")
    v.check("A: monitoring saw the claimed job as running", a["stats"]["running"] == 1,
            f"pgq.stats(): pending {a['stats']['pending']}, running {a['stats']['running']}")
    v.check("B: during the work worker-a sat 'idle in transaction'", b["state"] == "idle in transaction",
            f"state '{b['state']}'")
    v.check("B: the row-lock probe was reported blocked by worker-a and finished only after its COMMIT",
            b["probe_blocked"] and b["probe"].blocked_by == ["worker-a-B"] and b["probe"].ended_at is not None
            and b["end"].started_at is not None and b["probe"].ended_at >= b["end"].started_at,
            f"{b['probe'].outcome}; waited {b['probe'].waited_ms:.0f} ms")
    v.check("B: the row lock lasted at least the work", b["hold_ms"] >= b["work_ms"],
            f"lock held {b['hold_ms']:.0f} ms, work {b['work_ms']:.0f} ms")
    v.check("B: monitoring could not see the claim (job still pending, none running)",
            b["stats"]["running"] == 0, f"pgq.stats(): pending {b['stats']['pending']}, running {b['stats']['running']}")
    for m, r in (("A", a), ("B", b)):
        v.check(f"{m}: the other claimant was not blocked and got another job",
                r["other"].ok and not r["other"].lock_wait and r["other_ids"] and r["job"] not in r["other_ids"],
                f"{r['other'].outcome}; got {r['other_ids']} (worker-a holds {r['job']})")
        v.check(f"{m}: worker-a's pgq.complete returned true", r["completed"] is True, f"returned {sqlv(r['completed'])}")

    v.observe(f"A (claim committed, then {a['work_ms']:.0f} ms of work): row lock held {a['hold_ms']:.1f} ms; "
              f"worker-a '{a['state']}'; lock probe {a['probe'].outcome} ({a['probe'].duration_ms:.1f} ms); "
              f"stats running={a['stats']['running']}; worker-b got {a['other_ids']} ({a['other'].outcome}).")
    v.observe(f"B (work inside the claim transaction): row lock held {b['hold_ms']:.0f} ms; worker-a "
              f"'{b['state']}'; lock probe {b['probe'].outcome}, waited {b['probe'].waited_ms:.0f} ms; stats "
              f"running={b['stats']['running']} pending={b['stats']['pending']}; worker-b got {b['other_ids']} "
              f"({b['other'].outcome}). Hold-time ratio B/A: {b['hold_ms'] / max(a['hold_ms'], 0.001):.0f}×.")
    return v
