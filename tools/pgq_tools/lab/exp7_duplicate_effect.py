"""Experiment 7: a retry repeats the business work; the effect's unique key catches it.

A synthetic effects table keyed by job_id (the seed's synthetic_effects) and, as a control, the same
table without a key. worker-a claims the job, writes the effect to both tables, and crashes before
pgq.complete (its backend is terminated). After the lease expires and pgq.sweep recovers the job,
worker-b claims it (attempt 2) and runs the same handler: the keyed insert fails with a unique
violation, the idempotent form (ON CONFLICT DO NOTHING) applies nothing, the unkeyed control
silently records the effect twice. worker-b then completes the job."""

from __future__ import annotations

from pgq_tools.lab.harness import Harness, Verdict, sqlv
from pgq_tools.lab.statements import (
    CLAIM,
    COMPLETE,
    ENQUEUE_COHORT,
    EPOCH,
    EVENTS,
    JOB,
    RECOVER,
    WAIT_LEASE_EXPIRY,
)

NUMBER = 7
SLUG = "duplicate-effect"
TITLE = "Duplicate effect after a crash before completion"
BASIS = (
    "“Unique constraints ensure that the data contained in a column, or a group of columns, is unique among "
    "all the rows in the table.” (Constraints, 5.4.3). “ON CONFLICT DO NOTHING simply avoids inserting a row "
    "as its alternative action.” (INSERT) — the database serializes access to queue rows; it cannot know "
    "whether work done outside the claim transaction happened before a crash."
)
HYPOTHESIS = (
    "pgq delivers at least once: a worker that crashes after its effect but before pgq.complete gets its job "
    "re-run by another attempt. The second execution is caught by a unique key on the effect (an error, or "
    "a no-op with ON CONFLICT DO NOTHING) instead of being applied twice; without a key it is applied twice."
)
PROCEDURE = (
    "CREATE TABLE lab_effects (job_id PRIMARY KEY REFERENCES pgq.jobs, first_worker, first_attempt) and an "
    "unkeyed lab_effect_log. worker-a: pgq.claim(lease 1 s); insert into both; killed before pgq.complete. "
    "Wait for expiry; pgq.sweep. worker-b: pgq.claim; plain INSERT (expect 23505); INSERT … ON CONFLICT "
    "(job_id) DO NOTHING RETURNING; insert into the log; pgq.complete."
)
CONDITION = (
    "The retry runs as attempt 2 by another worker; its keyed INSERT fails with SQLSTATE 23505 and the ON "
    "CONFLICT form returns no row; lab_effects holds exactly one row (worker-a, attempt 1) while the unkeyed "
    "log holds two; the job ends done at attempt 2, and the history shows the expired first attempt."
)

EFFECTS = (
    "CREATE TABLE lab_effects (job_id bigint PRIMARY KEY REFERENCES pgq.jobs (id),"
    " first_worker text NOT NULL, first_attempt integer NOT NULL,"
    " recorded_at timestamptz NOT NULL DEFAULT clock_timestamp())"
)
EFFECT_LOG = (
    "CREATE TABLE lab_effect_log (job_id bigint NOT NULL, worker text NOT NULL, attempt integer NOT NULL,"
    " recorded_at timestamptz NOT NULL DEFAULT clock_timestamp())"
)
APPLY = "INSERT INTO lab_effects (job_id, first_worker, first_attempt) VALUES (%(id)s, %(worker)s, %(attempt)s)"
APPLY_IDEMPOTENT = APPLY + " ON CONFLICT (job_id) DO NOTHING RETURNING job_id"
LOG = "INSERT INTO lab_effect_log (job_id, worker, attempt) VALUES (%(id)s, %(worker)s, %(attempt)s)"


def run(h: Harness) -> Verdict:
    v = Verdict()
    h.fixture("create_lab_effects", EFFECTS)
    h.fixture("create_lab_effect_log", EFFECT_LOG)
    job = h.fixture("enqueue_1_job", ENQUEUE_COHORT,
                    {"queue": "lab", "kind": "synthetic", "cohort": "exp7", "n": 1, "run_at": EPOCH}).value
    a, b, obs = h.session("worker-a"), h.session("worker-b"), h.session("observer")

    first = h.step(a, "a_claim", CLAIM, {"worker": "worker-a", "queues": ["lab"], "batch": 1, "lease": "1 second"})
    a_attempt = first.dicts()[0]["attempt"]
    a_effect = h.step(a, "a_apply_effect", APPLY, {"id": job, "worker": "worker-a", "attempt": a_attempt})
    h.step(a, "a_log_effect", LOG, {"id": job, "worker": "worker-a", "attempt": a_attempt})
    h.kill(a, "a_crash_before_complete")
    h.step(obs, "wait_for_lease_expiry", WAIT_LEASE_EXPIRY, {"ids": [job]})
    swept = h.step(obs, "sweep", RECOVER, {"max_jobs": 100})
    retry = h.step(b, "b_claim", CLAIM, {"worker": "worker-b", "queues": ["lab"], "batch": 1, "lease": "30 seconds"})
    b_attempt = retry.dicts()[0]["attempt"] if retry.rows else None
    dup = h.step(b, "b_apply_effect", APPLY, {"id": job, "worker": "worker-b", "attempt": b_attempt})
    idem = h.step(b, "b_apply_effect_idempotent", APPLY_IDEMPOTENT,
                  {"id": job, "worker": "worker-b", "attempt": b_attempt})
    h.step(b, "b_log_effect", LOG, {"id": job, "worker": "worker-b", "attempt": b_attempt})
    done = h.step(b, "b_complete", COMPLETE, {"id": job, "attempt": b_attempt})
    effects = h.step(obs, "obs_effects",
                     "SELECT job_id, first_worker, first_attempt FROM lab_effects ORDER BY job_id").dicts()
    log = h.step(obs, "obs_effect_log",
                 "SELECT job_id, worker, attempt FROM lab_effect_log ORDER BY recorded_at").dicts()
    final = h.step(obs, "obs_job_final", JOB, {"id": job}).dicts()[0]
    events = h.step(obs, "obs_events", EVENTS, {"ids": [job]}).dicts()
    history = [(e["event"], e["attempt"], e["worker"]) for e in events]
    h.note(f"attempt history of job {job}: {history}")

    v.check("worker-a applied the effect (attempt 1) and crashed before completing",
            a_effect.ok and a_attempt == 1, f"effect insert {a_effect.outcome}; attempt {a_attempt}")
    v.check("after the lease expired the job was recovered and re-run by worker-b as attempt 2",
            swept.value == 1 and retry.col("id") == [job] and b_attempt == 2,
            f"sweep recovered {swept.value}; "
            f"worker-b claimed {retry.col('id') if retry.ok else '-'} at attempt {b_attempt}")
    v.check("the retry's keyed effect insert was detected as a duplicate (23505 unique_violation)",
            dup.sqlstate == "23505", dup.outcome)
    v.check("the idempotent form (ON CONFLICT DO NOTHING) applied nothing",
            idem.ok and idem.rows == [], f"{idem.outcome}; {len(idem.rows)} row(s) returned")
    v.check("the keyed effect exists exactly once, from the first attempt",
            effects == [{"job_id": job, "first_worker": "worker-a", "first_attempt": 1}],
            "lab_effects = " + ", ".join(sqlv(tuple(e.values())) for e in effects))
    v.check("control: without a unique key the effect was silently recorded twice",
            len(log) == 2 and [r["attempt"] for r in log] == [1, 2],
            "lab_effect_log (worker, attempt) = " + ", ".join(sqlv((r["worker"], r["attempt"])) for r in log))
    v.check("the job ended done at attempt 2, its history showing the expired first attempt",
            done.value is True and final["state"] == "done" and final["attempt"] == 2
            and history[:1] == [("claimed", 1, "worker-a")] and ("lease_expired", 1, "worker-a") in history
            and ("completed", 2, "worker-b") in history,
            f"pgq.complete returned {sqlv(done.value)}; final {final['state']} at attempt {final['attempt']}; "
            "history " + ", ".join(sqlv(e) for e in history))

    v.observe(f"worker-a (attempt {a_attempt}) applied the effect and was killed before pgq.complete; after expiry "
              f"pgq.sweep recovered {swept.value} and worker-b re-ran job {job} as attempt {b_attempt}.")
    v.observe(f"The retry's keyed INSERT: {dup.outcome}; ON CONFLICT DO NOTHING returned {len(idem.rows)} rows; "
              f"lab_effects holds {len(effects)} row ({effects[0]['first_worker'] if effects else '-'}, attempt "
              f"{effects[0]['first_attempt'] if effects else '-'}); the unkeyed control holds {len(log)} rows. "
              "History (event, attempt, worker): " + ", ".join(sqlv(e) for e in history) + ".")
    return v
