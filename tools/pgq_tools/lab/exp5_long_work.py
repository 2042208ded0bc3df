"""Experiment 5: long work outside the claim transaction vs the anti-pattern of holding it open.

Mode A (pgq's way): worker-a's pgq.claim commits at once (autocommit), then the synthetic work runs
(a local sleep), then pgq.complete. Mode B (the anti-pattern): BEGIN; pgq.claim; work; pgq.complete;
COMMIT. During the work, in each mode: the session's state in pg_stat_activity, pgq.stats() as a
monitor sees it, a lock probe on the claimed row (a plain FOR NO KEY UPDATE, as an admin call
would take), and another claimant. How long the probe was blocked is what the server reports
(log_lock_waits: "acquired … after N ms"; see the harness), not a span between step timestamps."""

from __future__ import annotations

import time

from pgq_tools.lab.harness import Harness, Verdict, sqlv
from pgq_tools.lab.statements import CLAIM, COMPLETE, ENQUEUE_COHORT, EPOCH

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
    "A: worker-a is 'idle' (no transaction) during the work, the probe run during the work waits on no "
    "lock at all (no wait of 1 ms or more reported by the server, none seen by polling), stats show the job "
    "running. B: worker-a is 'idle in transaction', the probe is reported blocked by worker-a and finishes "
    "only after the COMMIT, stats still show the job pending. Both: worker-b is never blocked and never "
    "gets worker-a's job; pgq.complete returns true."
)

WORK_SECONDS = 0.6
ACTIVITY = "SELECT state, xact_start IS NOT NULL AS in_transaction FROM pg_stat_activity WHERE pid = %(pid)s"
STATS = "SELECT pending, running FROM pgq.stats() WHERE queue = %(queue)s"
PROBE = "SELECT id FROM pgq.jobs WHERE id = %(id)s FOR NO KEY UPDATE"


def _mode(h: Harness, v: Verdict, mode: str, queue: str, hold_open: bool) -> dict:  # type: ignore[type-arg]
    h.fixture(f"{mode}_enqueue", ENQUEUE_COHORT,
              {"queue": queue, "kind": "synthetic", "cohort": mode, "n": 3, "run_at": EPOCH})
    a = h.session(f"worker-a-{mode}")
    b = h.session(f"worker-b-{mode}")
    obs = h.session(f"observer-{mode}")
    prober = h.session(f"prober-{mode}")
    if hold_open:
        h.step(a, f"{mode}_a_begin", "BEGIN")
    claim = h.step(a, f"{mode}_a_claim", CLAIM,
                   {"worker": a.name, "queues": [queue], "batch": 1, "lease": "30 seconds"})
    row = claim.dicts()[0]
    work = h.start(a, f"{mode}_a_work", fn=lambda: time.sleep(WORK_SECONDS),
                   describe=f"synthetic work: sleep {WORK_SECONDS}s"
                   + (" inside the open claim transaction" if hold_open else " after the claim committed"))
    activity = h.step(obs, f"{mode}_obs_activity", ACTIVITY, {"pid": a.pid}).dicts()[0]
    stats = h.step(obs, f"{mode}_obs_stats", STATS, {"queue": queue}).dicts()[0]
    probe = h.step(prober, f"{mode}_probe_row_lock", PROBE, {"id": row["id"]})
    other = h.step(b, f"{mode}_b_claim", CLAIM,
                   {"worker": b.name, "queues": [queue], "batch": 1, "lease": "30 seconds"})
    h.wait(work)
    done = h.step(a, f"{mode}_a_complete", COMPLETE, {"id": row["id"], "attempt": row["attempt"]})
    end = h.step(a, f"{mode}_a_commit", "COMMIT") if hold_open else done
    h.wait(probe)
    assert work.duration_ms is not None and probe.started_at and work.ended_at
    other_ids = other.col("id") if other.ok else []
    return {"job": row["id"], "work_ms": work.duration_ms, "state": activity["state"], "probe": probe,
            "probe_during_work": probe.started_at < work.ended_at, "stats": stats, "other": other,
            "other_ids": other_ids, "completed": done.value, "end": end, "hold_open": hold_open,
            "wait_logging": prober.wait_logging}


def run(h: Harness, *, a_holds_open: bool = False) -> Verdict:
    """``a_holds_open`` makes mode A use the anti-pattern (for the test that its checks catch it)."""
    v = Verdict()
    a = _mode(h, v, "A", "outside", hold_open=a_holds_open)
    b = _mode(h, v, "B", "inside", hold_open=True)
    pa, pb = a["probe"], b["probe"]

    v.check("A: during the work worker-a had no open transaction (pg_stat_activity state 'idle')",
            a["state"] == "idle", f"state '{a['state']}'")
    v.check("A: another session locking the claimed row during the work did not wait at all",
            a["probe_during_work"] and pa.ok and not pa.lock_wait and pa.lock_wait_ms == 0,
            f"{pa.outcome}; waited {pa.lock_wait_ms:.1f} ms on a lock (server-reported"
            f"{'' if a['wait_logging'] else ' unavailable: polling only'}), {pa.duration_ms:.1f} ms in all; "
            f"probe {'during' if a['probe_during_work'] else 'NOT during'} the work")
    v.check("A: monitoring saw the claimed job as running", a["stats"]["running"] == 1,
            f"pgq.stats(): pending {a['stats']['pending']}, running {a['stats']['running']}")
    v.check("B: during the work worker-a sat 'idle in transaction'", b["state"] == "idle in transaction",
            f"state '{b['state']}'")
    v.check("B: another session locking the claimed row was blocked by worker-a until its COMMIT",
            b["probe_during_work"] and pb.lock_wait and pb.blocked_by == ["worker-a-B"] and pb.ended_at is not None
            and b["end"].started_at is not None and pb.ended_at >= b["end"].started_at,
            f"{pb.outcome}; waited {pb.lock_wait_ms:.0f} ms on the lock; the work took {b['work_ms']:.0f} ms")
    v.check("B: monitoring could not see the claim (job still pending, none running)",
            b["stats"]["running"] == 0,
            f"pgq.stats(): pending {b['stats']['pending']}, running {b['stats']['running']}")
    for m, r in (("A", a), ("B", b)):
        v.check(f"{m}: the other claimant was not blocked and got another job",
                r["other"].ok and not r["other"].lock_wait and r["other_ids"] and r["job"] not in r["other_ids"],
                f"{r['other'].outcome}; got {r['other_ids']} (worker-a holds {r['job']})")
        v.check(f"{m}: worker-a's pgq.complete returned true", r["completed"] is True,
                f"returned {sqlv(r['completed'])}")
    for sentence in observation(a, b):
        v.observe(sentence)
    return v


def observation(a: dict, b: dict) -> list[str]:  # type: ignore[type-arg]
    """The observation, from the two modes' captured data only."""
    out = []
    for m, r in (("A", a), ("B", b)):
        how = "work inside the open claim transaction" if r["hold_open"] else "claim committed, then the work"
        p = r["probe"]
        waited = (f"waited {p.lock_wait_ms:.1f} ms for worker-a's lock" if p.lock_wait
                  else "did not wait (no lock wait of 1 ms or more reported)")
        out.append(f"{m} ({how}, {r['work_ms']:.0f} ms of work): worker-a '{r['state']}'; another session's "
                   f"SELECT … FOR NO KEY UPDATE of job {r['job']} during the work {waited}, {p.duration_ms:.1f} ms "
                   f"in all ({p.outcome}); pgq.stats() running={r['stats']['running']} "
                   f"pending={r['stats']['pending']}; worker-b got {r['other_ids']} ({r['other'].outcome}).")
    return out
