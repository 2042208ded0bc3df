"""Experiment 9: a schedule firing under concurrent sweepers and claimers.

One schedule fires every second (pgq.schedule, every => '1 second'). In each of 6 rounds the
lab sleeps on the server until the schedule is due, then 6 sessions (3 calling pgq.sweep, 3
calling pgq.claim) start together behind a barrier. Then no session calls anything for 2.5 s
(missed occurrences) and one last round runs. Every occurrence must become exactly one job."""

from __future__ import annotations

from typing import Any

from pgq_tools.lab.harness import Harness, Session, Step, Verdict, sqlv
from pgq_tools.lab.statements import CLAIM, RECOVER

NUMBER = 9
SLUG = "schedule-firing"
TITLE = "Schedule firing under concurrent sweepers and claimers"
BASIS = (
    "“With SKIP LOCKED, any selected rows that cannot be immediately locked are skipped.” (SELECT, The "
    "Locking Clause.) In READ COMMITTED, a locking statement that finds a row updated by a transaction that "
    "has committed meanwhile “will … re-evaluate its WHERE clause” on the updated version (Transaction "
    "Isolation, 13.2.1)."
)
HYPOTHESIS = (
    "pgq fires a due schedule under FOR NO KEY UPDATE SKIP LOCKED and moves next_run_at past now in the "
    "transaction that enqueues the occurrence: a concurrent session either skips the locked schedule or, "
    "after the commit, finds it no longer due. So any number of claimers and sweepers enqueue each "
    "(schedule, fire time) at most once, and missed occurrences collapse into the latest one."
)
PROCEDURE = (
    "pgq.schedule('lab-tick', every => '1 second'). 6 rounds: sleep on the server until next_run_at, "
    "then sweeper-1..3 (pgq.sweep) and claimer-1..3 (pgq.claim, batch 1) start behind a barrier. Then a "
    "2.5 s pause without calls, and a 7th round. Observer: the schedule's jobs, grouped by run_at."
)
CONDITION = (
    "No (schedule, run_at) has more than one job; each round enqueued exactly one new occurrence (7 jobs); "
    "every job's run_at is a whole second and the rounds' run_at increase; the last round enqueued only the "
    "latest of the missed occurrences (next_run_at after now); no session failed or waited on a lock."
)

ROUNDS = 6
WAIT_DUE = ("SELECT pg_sleep(greatest(0, extract(epoch FROM next_run_at - clock_timestamp()) + 0.02))"
            " FROM pgq.schedules WHERE name = %(name)s")
SCHEDULE = ("SELECT name, every, next_run_at FROM pgq.schedule(name => %(name)s, queue => %(queue)s,"
            " kind => 'tick', every => %(every)s::interval)")
FIRED = ("SELECT run_at, count(*) AS jobs, min(id) AS first_id FROM pgq.jobs WHERE schedule = %(name)s"
         " GROUP BY run_at ORDER BY run_at")
STATE = ("SELECT next_run_at, last_run_at, last_job_id, next_run_at > clock_timestamp() AS next_after_now"
         " FROM pgq.schedules WHERE name = %(name)s")


def run(h: Harness) -> Verdict:
    v = Verdict()
    name = "lab-tick"
    h.fixture("schedule_every_second", SCHEDULE, {"name": name, "queue": "lab", "every": "1 second"})
    sweepers = [h.session(f"sweeper-{i}") for i in (1, 2, 3)]
    claimers = [h.session(f"claimer-{i}") for i in (1, 2, 3)]
    obs = h.session("observer")

    def one_round(label: str) -> list[Step]:
        items: list[tuple[Session | str, str, str, Any]] = [
            (s, f"{label}_{s.name}", RECOVER, {"max_jobs": 100}) for s in sweepers]
        items += [(c, f"{label}_{c.name}", CLAIM,
                   {"worker": c.name, "queues": ["lab"], "batch": 1, "lease": "1 minute"})
                  for c in claimers]
        return h.round(label, items)

    all_steps: list[Step] = []
    counts: list[int] = []
    for r in range(1, ROUNDS + 1):
        h.step(obs, f"wait_due_{r}", WAIT_DUE, {"name": name})
        all_steps += one_round(f"round_{r}")
        counts.append(sum(f["jobs"] for f in h.step(obs, f"fired_after_round_{r}", FIRED, {"name": name}).dicts()))
    h.step(obs, "pause_2_5_s", "SELECT pg_sleep(2.5)")
    all_steps += one_round("round_after_pause")
    last = h.step(obs, "state_after_pause", STATE, {"name": name}).dicts()[0]
    fired = h.step(obs, "fired_final", FIRED, {"name": name}).dicts()
    counts.append(sum(f["jobs"] for f in fired))
    for f in fired:
        h.note(f"occurrence {f['run_at']:%H:%M:%S.%f}: {f['jobs']} job(s), first id {f['first_id']}")

    run_ats = [f["run_at"] for f in fired]
    failed = [s for s in all_steps if not s.ok]
    waited = [s for s in all_steps if s.lock_wait]  # (a brief relation-extension wait is not a lock)
    dupes = [f for f in fired if f["jobs"] != 1]
    v.check("no (schedule, fire time) has more than one job", not dupes and bool(fired),
            f"{len(fired)} fire times, job counts {sqlv([f['jobs'] for f in fired])}")
    v.check(f"each of the {ROUNDS + 1} rounds enqueued exactly one new occurrence",
            counts == list(range(1, ROUNDS + 2)), f"jobs after each round: {sqlv(counts)}")
    v.check("every run_at is a whole second, in increasing order",
            all(t.microsecond == 0 for t in run_ats) and run_ats == sorted(set(run_ats)),
            ", ".join(f"{t:%H:%M:%S.%f}" for t in run_ats))
    gap = (run_ats[-1] - run_ats[-2]).total_seconds() if len(run_ats) >= 2 else 0.0
    v.check("after the 2.5 s pause only the latest missed occurrence was enqueued, and next_run_at is after now",
            gap >= 2 and last["next_after_now"] and last["last_run_at"] == run_ats[-1],
            f"the last two fire times are {gap:.0f} s apart; next_run_at {last['next_run_at']:%H:%M:%S} "
            f"(after now: {sqlv(last['next_after_now'])})")
    v.check("no sweeper or claimer failed or waited on a lock", not failed and not waited,
            f"{len(all_steps)} concurrent calls; failed: {[s.name for s in failed]}; "
            f"waited: {[s.name for s in waited]}")
    v.observe(f"{len(all_steps)} calls in {ROUNDS + 1} rounds of 3 pgq.sweep + 3 pgq.claim behind a barrier enqueued "
              f"{sum(f['jobs'] for f in fired)} jobs for {len(fired)} fire times (jobs per fire time: "
              f"{sqlv(sorted({f['jobs'] for f in fired}))}); cumulative jobs after each round {sqlv(counts)}; "
              f"the round after the 2.5 s pause added one job, {gap:.0f} s after the previous fire time.")
    return v
