"""Experiment 10: a hung handler ended by its execution timeout.

A job with max_run_time 1 s is claimed with a 1-minute lease by worker-a, whose handler hangs
while its renewer keeps renewing (the case a lease alone cannot catch). The lease never passes
the deadline; at the deadline renew answers NULL; the sweep ends the attempt as timed_out;
worker-b claims attempt 2 and completes it; worker-a's late completion is refused."""

from __future__ import annotations

from pgq_tools.lab.harness import Harness, Verdict, sqlv
from pgq_tools.lab.statements import CLAIM, COMPLETE, EVENTS, RECOVER, RENEW

NUMBER = 10
SLUG = "hung-handler"
TITLE = "Hung handler ended by its execution timeout"
BASIS = (
    "“statement_timestamp() returns the start time of the current statement” (Date/Time Functions, 9.9.5): "
    "one clock, the database server's, for every claim and renew. An UPDATE whose WHERE clause no longer "
    "matches changes nothing (UPDATE), so a fenced write by an ended attempt is refused."
)
HYPOTHESIS = (
    "A lease renewed forever holds a job forever. With max_run_time, pgq.claim and pgq.renew never lease "
    "past claimed_at + max_run_time, so the attempt's lease expires at its deadline even while its renewer "
    "runs; the existing recovery then ends it as timed_out and retries it, and the fence refuses the hung "
    "attempt's late outcome."
)
PROCEDURE = (
    "configure_queue(backoff 10 ms); enqueue(max_run_time 1 s). worker-a: pgq.claim(lease 1 minute), then "
    "pgq.renew every 0.3 s (the handler hangs) until renew answers NULL. sweeper: pgq.sweep. worker-b: "
    "pgq.claim (after the backoff), pgq.complete. worker-a: pgq.complete with attempt 1."
)
CONDITION = (
    "The claim's lease_until equals its deadline (claimed_at + 1 s), not claimed_at + 1 minute; no renew "
    "returns a lease past the deadline; the renew at/after the deadline returns NULL; the sweep recovers 1 job "
    "with event timed_out and last_error 'timed out after 00:00:01'; worker-b gets attempt 2 and completes; "
    "worker-a's completion returns false and is logged as rejected; the attempt ended within 1.5 s of its claim."
)

ENQUEUE = ("SELECT pgq.enqueue(queue => 'lab-hung', kind => 'hangs', payload => '{}',"
           " max_run_time => '1 second', max_attempts => 3) AS id")
CONFIGURE = ("SELECT name FROM pgq.configure_queue(queue => 'lab-hung', backoff_base => '10 milliseconds',"
             " backoff_cap => '10 milliseconds')")
JOB = ("SELECT state::text AS state, attempt, last_event, last_error, claimed_at, deadline, lease_until"
       " FROM pgq.jobs WHERE id = %(id)s")
CLAIM_DEADLINE = ("SELECT id, attempt, lease_until, deadline FROM pgq.claim(worker => %(worker)s::text,"
                  " queues => ARRAY['lab-hung'], batch => 1, lease => '1 minute')")


def run(h: Harness) -> Verdict:
    v = Verdict()
    h.fixture("configure_queue", CONFIGURE)
    job_id = h.fixture("enqueue_hanging_job", ENQUEUE).value
    a, b, sweeper, obs = h.session("worker-a"), h.session("worker-b"), h.session("sweeper"), h.session("observer")

    claimed = h.step(a, "a_claim", CLAIM_DEADLINE, {"worker": "worker-a"}).dicts()[0]
    claimed_at = h.step(obs, "obs_after_claim", JOB, {"id": job_id}).dicts()[0]["claimed_at"]
    renews = []
    for i in range(1, 11):  # the hung handler's renewer: at most ~3 s of renewing
        h.step(a, f"a_handler_hangs_{i}", "SELECT pg_sleep(0.3)")
        r = h.step(a, f"a_renew_{i}", RENEW, {"id": job_id, "attempt": 1})
        renews.append(r.value)
        if r.value is None:
            break
    swept = h.step(sweeper, "sweep", RECOVER, {"max_jobs": 10})
    after = h.step(obs, "obs_after_sweep", JOB, {"id": job_id}).dicts()[0]
    h.step(obs, "wait_backoff", "SELECT pg_sleep(0.05)")
    b_claim = h.step(b, "b_claim", CLAIM,
                     {"worker": "worker-b", "queues": ["lab-hung"], "batch": 1, "lease": "1 minute"}).dicts()
    b_done = h.step(b, "b_complete", COMPLETE, {"id": job_id, "attempt": 2}) if b_claim else None
    late = h.step(a, "a_late_complete", COMPLETE, {"id": job_id, "attempt": 1})
    final = h.step(obs, "obs_final", JOB, {"id": job_id}).dicts()[0]
    events = h.step(obs, "obs_events", EVENTS, {"ids": [job_id]}).dicts()
    for e in events:
        h.note(f"event {e['id']}: attempt {e['attempt']} {e['event']} by {e['worker']} "
               f"{e['from_state']}->{e['to_state']} at {e['at']:%H:%M:%S.%f} {e['note'] or ''}")

    deadline = claimed["deadline"]
    timed_out = next((e for e in events if e["event"] == "timed_out"), None)
    leases = [x for x in renews if x is not None]
    v.check("the claim's lease ends at the deadline (claimed_at + 1 s), not after the 1-minute lease",
            claimed["lease_until"] == deadline and (deadline - claimed_at).total_seconds() == 1,
            f"lease_until {claimed['lease_until']:%H:%M:%S.%f}, deadline {deadline:%H:%M:%S.%f}, "
            f"claimed_at {claimed_at:%H:%M:%S.%f}")
    v.check("no renew leased past the deadline, and the renew after it answered NULL",
            all(x <= deadline for x in leases) and bool(renews) and renews[-1] is None,
            f"renews returned {sqlv([None if x is None else f'{x:%H:%M:%S.%f}' for x in renews])}")
    v.check("the sweep ended the attempt as timed_out with 'timed out after 00:00:01'",
            swept.value == 1 and after["last_event"] == "timed_out" and after["state"] == "pending"
            and after["last_error"] == "timed out after 00:00:01" and timed_out is not None,
            f"sweep returned {swept.value}; job {after['state']}, {after['last_event']}, {after['last_error']!r}")
    v.check("worker-b claimed attempt 2 and completed it",
            [r["attempt"] for r in b_claim] == [2] and b_done is not None and b_done.value is True,
            f"worker-b got {[(r['id'], r['attempt']) for r in b_claim]}, complete returned "
            f"{sqlv(b_done.value if b_done else None)}")
    v.check("worker-a's late completion was refused and logged as rejected",
            late.value is False and any(e["event"] == "rejected" and e["attempt"] == 1 for e in events),
            f"returned {sqlv(late.value)}; events {[e['event'] for e in events]}")
    ended = (timed_out["at"] - claimed_at).total_seconds() if timed_out else None
    v.check("the hung attempt ended within 1.5 s of its claim", ended is not None and ended < 1.5,
            f"timed_out {ended if ended is None else round(ended, 3)} s after the claim")
    v.observe(f"worker-a claimed job {job_id} at {claimed_at:%H:%M:%S.%f} with a 1-minute lease; lease_until = "
              f"deadline = {deadline:%H:%M:%S.%f}. Its renewer's {len(renews)} renews returned "
              f"{sqlv([None if x is None else f'{x:%H:%M:%S.%f}' for x in renews])}. pgq.sweep recovered "
              f"{swept.value} ({after['last_event']}: {after['last_error']}), "
              f"{ended if ended is None else round(ended, 3)} s after the claim; worker-b completed attempt 2; "
              f"worker-a's late pgq.complete returned {sqlv(late.value)}; final state {final['state']} at attempt "
              f"{final['attempt']}.")
    return v
