"""Experiment 6: abandoned claims and lease recovery.

First the two moments a worker can die: before its claim commits (worker-z is killed mid
transaction: the row is untouched) and after (worker-a claims two jobs with a 1 s lease and stops
answering). Before the lease ends nobody can claim them; after it ends one job is recovered by
pgq.sweep and the other by pgq.claim's own recovery, worker-b claims both with a new attempt, and
worker-a's late completions (and renew) are rejected and leave 'rejected' events."""

from __future__ import annotations

from pgq_tools.lab.harness import Harness, Session, Step, Verdict, sqlv
from pgq_tools.lab.statements import (
    CLAIM,
    COMPLETE,
    ENQUEUE_COHORT,
    EPOCH,
    EVENTS,
    JOB,
    RECOVER,
    RENEW,
    WAIT_LEASE_EXPIRY,
)

NUMBER = 6
SLUG = "abandoned-claim"
TITLE = "Abandoned claim: lease expiry, recovery, fenced late completion"
BASIS = (
    "“Row-level locks are released at transaction end or during savepoint rollback” (Explicit Locking, "
    "13.3.2) — a lock is not a durable lease. “The optional RETURNING clause causes UPDATE to compute and "
    "return value(s) based on each row actually updated.” (UPDATE) — an owner write whose predicate no "
    "longer matches updates nothing, and the caller can tell."
)
HYPOTHESIS = (
    "A worker dying before its claim commits leaves nothing behind (rollback). A committed claim survives "
    "its worker; only pgq's lease (database clock) returns it: after expiry, pgq.sweep or the next "
    "pgq.claim recovers it, the new claim increments the attempt (the fencing token), and the old "
    "attempt's complete/renew are rejected and recorded."
)
PROCEDURE = (
    "2 jobs. worker-z: BEGIN; pgq.claim; killed (pg_terminate_backend). worker-a: pgq.claim(lease 1 s) "
    "twice, then stops. worker-b: pgq.claim before expiry. Wait for the leases to expire (server-side "
    "sleep). pgq.sweep(max_jobs 1); worker-b: pgq.claim twice (the second expired job is recovered by the "
    "claim itself). worker-a: pgq.complete / pgq.renew with attempt 1. worker-b: pgq.complete."
)
CONDITION = (
    "After worker-z's death the job is pending at attempt 0 with no event; before expiry worker-b gets "
    "nothing; sweep recovers exactly 1; worker-b gets both jobs at attempt 2; worker-a's completions return "
    "false and its renew NULL, each leaving a 'rejected' event for attempt 1; worker-b's completions return "
    "true; each job ends done at attempt 2 with exactly one 'completed' event."
)

LEASE = "1 second"


def run(h: Harness) -> Verdict:
    v = Verdict()
    jobs = h.fixture("enqueue_2_jobs", ENQUEUE_COHORT,
                     {"queue": "lab", "kind": "synthetic", "cohort": "exp6", "n": 2, "run_at": EPOCH}).col("id")
    j1, j2 = jobs
    z, a, b, obs = h.session("worker-z"), h.session("worker-a"), h.session("worker-b"), h.session("observer")

    def claim(session: Session, name: str) -> Step:
        return h.step(session, name, CLAIM, {"worker": session.name, "queues": ["lab"], "batch": 1, "lease": LEASE})

    # The worker dies before its claim commits.
    h.step(z, "z_begin", "BEGIN")
    z_claim = claim(z, "z_claim_uncommitted")
    h.kill(z, "z_killed_mid_transaction")
    after_z = h.step(obs, "obs_job_after_z_died", JOB, {"id": j1}).dicts()[0]
    z_events = h.step(obs, "obs_events_after_z_died", EVENTS, {"ids": [j1]}).rows

    # The worker dies (stops answering) after its claim committed.
    a1 = claim(a, "a_claim_1")
    a2 = claim(a, "a_claim_2")
    a_rows = a1.dicts() + a2.dicts()
    early = claim(b, "b_claim_before_expiry")
    h.step(obs, "wait_for_lease_expiry", WAIT_LEASE_EXPIRY, {"ids": jobs})
    swept = h.step(obs, "sweep", RECOVER, {"max_jobs": 1})
    after_sweep = [h.step(obs, f"obs_job_{j}_after_sweep", JOB, {"id": j}).dicts()[0] for j in jobs]
    b1 = claim(b, "b_claim_1")
    b2 = claim(b, "b_claim_2")
    b_rows = b1.dicts() + b2.dicts()
    late = [h.step(a, f"a_late_complete_{r['id']}", COMPLETE, {"id": r["id"], "attempt": r["attempt"]}) for r in a_rows]
    late_renew = h.step(a, f"a_late_renew_{j1}", RENEW, {"id": j1, "attempt": 1})
    b_done = [h.step(b, f"b_complete_{r['id']}", COMPLETE, {"id": r["id"], "attempt": r["attempt"]}) for r in b_rows]
    final = [h.step(obs, f"obs_job_{j}_final", JOB, {"id": j}).dicts()[0] for j in jobs]
    events = h.step(obs, "obs_events", EVENTS, {"ids": jobs}).dicts()
    for e in events:
        h.note(f"event {e['id']}: job {e['job_id']} attempt {e['attempt']} {e['event']} by {e['worker']} "
               f"{e['from_state']}->{e['to_state']} at {e['at']:%H:%M:%S.%f} {e['note'] or ''}")

    rejected = [e for e in events if e["event"] == "rejected"]
    expired = {e["job_id"]: e for e in events if e["event"] == "lease_expired"}
    completed = [e for e in events if e["event"] == "completed"]
    v.check("a worker killed before its claim committed left the job pending at attempt 0, with no event",
            z_claim.col("id") == [j1] and after_z["state"] == "pending" and after_z["attempt"] == 0 and not z_events,
            f"worker-z had claimed {z_claim.col('id') if z_claim.ok else '-'}; after the kill: {after_z['state']}, "
            f"attempt {after_z['attempt']}, {len(z_events)} events")
    v.check("worker-a's committed claims took both jobs at attempt 1",
            sorted(r["id"] for r in a_rows) == jobs and {r["attempt"] for r in a_rows} == {1},
            ", ".join(f"job {r['id']} attempt {r['attempt']} lease_until {r['lease_until']:%H:%M:%S.%f}"
                      for r in a_rows))
    v.check("before the leases expired, nobody could claim the abandoned jobs",
            early.ok and early.rows == [],
            f"worker-b's claim returned {early.col('id') if early.ok else early.outcome}")
    v.check("after expiry pgq.sweep(max_jobs 1) recovered exactly one job (the earliest lease)",
            swept.value == 1 and after_sweep[0]["state"] == "pending" and after_sweep[1]["state"] == "running",
            f"sweep returned {swept.value}; job {j1} {after_sweep[0]['state']}, job {j2} {after_sweep[1]['state']}")
    # Ordered by event id (one sequence, so no clock comparison): j1's recovery by the sweep, then
    # j2's recovery, then worker-b's first claim — all of j2's recovery happened inside that claim.
    b_first = next((e for e in events if e["event"] == "claimed" and e["worker"] == "worker-b"), None)
    j2_recovered_by_claim = (j1 in expired and j2 in expired and b_first is not None
                             and expired[j1]["id"] < expired[j2]["id"] < b_first["id"]
                             and after_sweep[1]["state"] == "running")
    sweeps = [st for st in h.steps if st.template == "recover"]
    v.check("the other expired job was recovered by worker-b's pgq.claim itself",
            j2_recovered_by_claim and len(sweeps) == 1,
            f"job {j2} was {after_sweep[1]['state']} after the sweep; its lease_expired event id "
            f"{expired.get(j2, {}).get('id')} (at {expired.get(j2, {}).get('at')}), job {j1}'s "
            f"{expired.get(j1, {}).get('id')}, worker-b's first 'claimed' event id "
            f"{b_first['id'] if b_first else None} (at {b_first['at'] if b_first else None}); "
            f"{len(sweeps)} pgq.sweep call(s) in the run")
    v.check("worker-b claimed both jobs with a new attempt (2)",
            sorted(r["id"] for r in b_rows) == jobs and {r["attempt"] for r in b_rows} == {2},
            ", ".join(f"job {r['id']} attempt {r['attempt']}" for r in b_rows))
    v.check("worker-a's late completions were rejected (false)", [s.value for s in late] == [False, False],
            f"returned {sqlv([s.value for s in late])}")
    v.check("worker-a's late renew was rejected (NULL)", late_renew.ok and late_renew.value is None,
            f"returned {sqlv(late_renew.value)}")
    v.check("each rejection is visible in pgq.job_events as 'rejected' for attempt 1",
            len(rejected) == 3 and {e["attempt"] for e in rejected} == {1},
            "; ".join(f"job {e['job_id']} attempt {e['attempt']}: {e['note']}" for e in rejected))
    v.check("worker-b's completions were accepted", [s.value for s in b_done] == [True, True],
            f"returned {sqlv([s.value for s in b_done])}")
    v.check("each job ended done at attempt 2 with exactly one 'completed' event (by worker-b)",
            all(f["state"] == "done" and f["attempt"] == 2 for f in final)
            and sorted(e["job_id"] for e in completed) == jobs and {e["worker"] for e in completed} == {"worker-b"},
            ", ".join(f"job {f['id']} {f['state']} attempt {f['attempt']}" for f in final)
            + "; completed events (job, attempt, worker): "
            + ", ".join(sqlv((e["job_id"], e["attempt"], e["worker"])) for e in completed))

    facts = {"j1": j1, "j2": j2, "after_z": after_z, "z_events": len(z_events), "a_ids": [r["id"] for r in a_rows],
             "early": early.col("id") if early.ok else "-", "swept": swept.value, "sweeps": len(sweeps),
             "j2_by_claim": j2_recovered_by_claim, "j2_after_sweep": after_sweep[1]["state"],
             "b_rows": [(r["id"], r["attempt"]) for r in b_rows], "late": [s.value for s in late],
             "late_renew": late_renew.value, "rejected": len(rejected), "b_done": [s.value for s in b_done],
             "final": [(f["id"], f["state"], f["attempt"]) for f in final]}
    for sentence in observation(facts):
        v.observe(sentence)
    return v


def observation(f: dict) -> list[str]:  # type: ignore[type-arg]
    """The observation, from the captured facts only (a test feeds it others)."""
    if f["j2_by_claim"]:
        other = (f"worker-b's pgq.claim recovered job {f['j2']} (its lease_expired event falls between the "
                 f"sweep's and worker-b's first claim)")
    else:
        other = f"job {f['j2']} was NOT recovered by worker-b's claim (it was {f['j2_after_sweep']} after the sweep)"
    return [
        f"worker-z killed mid-claim: job {f['j1']} stayed {f['after_z']['state']}/attempt {f['after_z']['attempt']} "
        f"with {f['z_events']} events. worker-a claimed {f['a_ids']} (attempt 1, lease {LEASE}) and stopped; "
        f"worker-b's claim before expiry returned {f['early']}; after expiry pgq.sweep recovered {f['swept']} "
        f"({f['sweeps']} sweep call(s) in the run) and {other}; worker-b got {f['b_rows']} (job, attempt).",
        f"worker-a's late pgq.complete returned {sqlv(f['late'])}, pgq.renew {sqlv(f['late_renew'])}; "
        f"{f['rejected']} 'rejected' events for attempt 1; worker-b's completions returned {sqlv(f['b_done'])}; "
        "final: " + ", ".join(f"job {i} {st} at attempt {att}" for i, st, att in f["final"]) + ".",
    ]
