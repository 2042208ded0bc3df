"""Experiment 4: the starvation probe, and a high-depth run.

Part A: the oldest job is row-locked by a holder while worker-b and worker-c claim batches; after
every round the seed's skip-probe snapshot is taken. Once the holder lets go, the next claim must
return the oldest job.

Part B: an original cohort of 30 jobs, 6 new jobs arriving before every round (so the depth never
drains), three workers claiming batches of 2 per round, and the cohort's oldest job locked for the
first two rounds. Every original job must progress; the new arrivals must never overtake an
eligible original."""

from __future__ import annotations

import math

from pgq_tools.lab.harness import Harness, Verdict
from pgq_tools.lab.statements import CLAIM, COMPLETE, ENQUEUE_COHORT, EPOCH, READY_SNAPSHOT

NUMBER = 4
SLUG = "starvation"
TITLE = "Starvation probe and high-depth progress"
BASIS = (
    "“With SKIP LOCKED, any selected rows that cannot be immediately locked are skipped. Skipping locked "
    "rows provides an inconsistent view of the data” (SELECT, The Locking Clause). “If lock contention is "
    "a concern, then SKIP LOCKED can be added to the CTE to prevent multiple commands from updating the "
    "same row. However, then a final UPDATE without SKIP LOCKED or LIMIT will be needed to ensure that no "
    "matching rows were overlooked.” (UPDATE, Examples) — skipping is not a promise of eventual service."
)
HYPOTHESIS = (
    "A locked oldest job is skipped (newer jobs progress) but not lost: it stays pending at attempt 0 and, "
    "as the top of the total order, is the next job claimed once unlocked. With a constantly refilled "
    "queue the original cohort still drains, because newer arrivals rank behind it."
)
PROCEDURE = (
    "A: 20 jobs; holder: BEGIN; SELECT … FOR UPDATE on the oldest; 3 rounds of worker-b + worker-c "
    "claiming batches of 3 behind a barrier (skip-probe snapshot before each, completes after); holder "
    "ROLLBACK; worker-b claims 1. B: 30 original jobs; before each round a producer enqueues 6 new jobs; "
    "worker-a/b/c claim batches of 2 behind a barrier and complete; the oldest original is locked for "
    "rounds 1–2; repeat until the originals are done (at most 12 rounds)."
)
CONDITION = (
    "A: the locked job is never returned while locked, stays pending/attempt 0, every round takes the top "
    "6 unlocked jobs, and the first claim after release returns it. B: the locked original is claimed in "
    "the first round after release; every original is done within ⌈30/6⌉ rounds of free capacity; no new "
    "job is claimed while an eligible original waits; the depth never falls below 30."
)


def _ids(step) -> list[int]:  # type: ignore[no-untyped-def]
    return step.col("id") if step.ok else []


def _complete_all(h: Harness, steps, tag: str) -> None:  # type: ignore[no-untyped-def]
    for s in steps:
        for row in s.dicts():
            h.step(s.session, f"{tag}_{s.session}_complete_{row['id']}", COMPLETE,
                   {"id": row["id"], "attempt": row["attempt"]})


def _part_a(h: Harness, v: Verdict) -> dict:  # type: ignore[type-arg]
    jobs = h.fixture("A_enqueue_20_jobs", ENQUEUE_COHORT,
                     {"queue": "probe", "kind": "synthetic", "cohort": "probe", "n": 20, "run_at": EPOCH}).col("id")
    oldest = jobs[0]
    holder = h.session("holder")
    workers = [h.session("worker-b"), h.session("worker-c")]
    obs = h.session("observer")
    h.step(holder, "A_holder_begin", "BEGIN")
    h.step(holder, "A_holder_lock_oldest", "SELECT id FROM pgq.jobs WHERE id = %(id)s FOR UPDATE", {"id": oldest})
    returned_locked, rounds_ok, blocked, batch_overflow, calls, taken = 0, 0, 0, 0, 0, []
    blocked_how: list[str] = []
    rounds = 3
    for r in range(1, rounds + 1):
        snap = h.step(obs, f"A{r}_skip_probe", READY_SNAPSHOT, {"queue": "probe"})
        order = snap.col("id")
        h.note(f"A{r} skip-probe snapshot (pending, in claim order): {order}")
        steps = h.round(f"A{r}", [(w, f"A{r}_{w.name}_claim", CLAIM,
                                   {"worker": w.name, "queues": ["probe"], "batch": 3, "lease": "30 seconds"})
                                  for w in workers])
        got = [j for s in steps for j in _ids(s)]
        calls += len(steps)
        taken += got
        blocked += sum(s.lock_wait for s in steps)
        blocked_how += [f"{s.name}: {s.outcome}" for s in steps if s.blocked or s.logged_waits]
        batch_overflow += sum(len(_ids(s)) > 3 for s in steps)
        returned_locked += oldest in got
        expected = [j for j in order if j != oldest][:6]
        rounds_ok += sorted(got) == sorted(expected) and len(set(got)) == len(got)
        h.note(f"A{r} claims: " + ", ".join(f"{s.session} {_ids(s)}" for s in steps)
               + f"; expected (top 6 unlocked) {expected}")
        _complete_all(h, steps, f"A{r}")
    before = h.step(obs, "A_oldest_before_release",
                    "SELECT state::text AS state, attempt FROM pgq.jobs WHERE id = %(id)s",
                    {"id": oldest}).dicts()[0]
    remaining = h.step(obs, "A_skip_probe_final", READY_SNAPSHOT, {"queue": "probe"}).col("id")
    h.note(f"A skip-probe before release: {remaining}")
    h.step(holder, "A_holder_release", "ROLLBACK")
    nxt = h.step(workers[0], "A_claim_after_release", CLAIM,
                 {"worker": "worker-b", "queues": ["probe"], "batch": 1, "lease": "30 seconds"})

    v.check("A: the locked oldest job was never returned while locked",
            returned_locked == 0, f"returned in {returned_locked} of {rounds} rounds ({calls} claim calls returned "
            f"{len(taken)} jobs)")
    v.check("A: while skipped it stayed pending at attempt 0",
            before == {"state": "pending", "attempt": 0}, f"state={before['state']} attempt={before['attempt']}")
    v.check("A: each round claimed exactly the top 6 unlocked jobs of its skip-probe snapshot, no batch over 3",
            rounds_ok == rounds and batch_overflow == 0,
            f"{rounds_ok}/{rounds} rounds matched; {batch_overflow} oversized batches")
    v.check("A: no claimant waited on a lock (the held row lock is skipped, not waited for)", blocked == 0,
            f"{blocked} of {calls} claims waited on a lock" + (f"; waits seen: {blocked_how}" if blocked_how else ""))
    v.check("A: after release the next claim returned the oldest job",
            _ids(nxt) == [oldest], f"returned {_ids(nxt)}, oldest {oldest}")
    return {"oldest": oldest, "after": _ids(nxt), "remaining": remaining, "blocked": blocked, "rounds": rounds,
            "calls": calls, "taken": len(taken), "newer": sum(j > oldest for j in taken),
            "workers": len(workers), "batch": 3}


def _part_b(h: Harness, v: Verdict) -> dict:  # type: ignore[type-arg]
    originals = h.fixture("B_enqueue_original_cohort", ENQUEUE_COHORT,
                          {"queue": "deep", "kind": "synthetic", "cohort": "original", "n": 30,
                           "run_at": EPOCH}).col("id")
    oldest = originals[0]
    holder = h.session("holder-b")
    producer = h.session("producer")
    workers = [h.session(w) for w in ("worker-a2", "worker-b2", "worker-c2")]
    obs = h.session("observer-b")
    h.step(holder, "B_holder_begin", "BEGIN")
    h.step(holder, "B_holder_lock_oldest", "SELECT id FROM pgq.jobs WHERE id = %(id)s FOR UPDATE", {"id": oldest})
    locked_rounds = 2
    claimed_round: dict[int, int] = {}
    overtakes, min_depth, rounds = 0, None, 0
    for r in range(1, 13):
        rounds = r
        new = h.step(producer, f"B{r}_enqueue_6_new", ENQUEUE_COHORT,
                     {"queue": "deep", "kind": "synthetic", "cohort": "new", "n": 6, "run_at": None}
                     ).col("id")
        snap = h.step(obs, f"B{r}_snapshot", READY_SNAPSHOT, {"queue": "deep"}).dicts()
        depth = len(snap)
        min_depth = depth if min_depth is None else min(min_depth, depth)
        steps = h.round(f"B{r}", [(w, f"B{r}_{w.name}_claim", CLAIM,
                                   {"worker": w.name, "queues": ["deep"], "batch": 2, "lease": "30 seconds"})
                                  for w in workers])
        got = [j for s in steps for j in _ids(s)]
        got_orig = [j for j in got if j in originals]
        got_new = [j for j in got if j not in originals]
        for j in got_orig:
            claimed_round[j] = r
        locked = oldest if r <= locked_rounds else None
        waiting_orig = [row["id"] for row in snap if row["cohort"] == "original" and row["id"] != locked
                        and row["id"] not in got]
        if got_new and waiting_orig:
            overtakes += 1
        h.note(f"B{r}: +{len(new)} new, depth {depth} before claims; claimed originals {got_orig} new {got_new}; "
               f"originals still pending {len([x for x in originals if x not in claimed_round])}"
               + (f"; job {oldest} locked" if locked else ""))
        _complete_all(h, steps, f"B{r}")
        if r == locked_rounds:
            h.step(holder, "B_holder_release", "ROLLBACK")
        if len(claimed_round) == len(originals):
            break
    ages = h.step(obs, "B_original_ages",
                  "SELECT j.id, e.at - j.created_at AS wait FROM pgq.jobs j JOIN pgq.job_events e "
                  "ON e.job_id = j.id AND e.event = 'claimed' WHERE j.id = ANY(%(ids)s::bigint[]) ORDER BY j.id",
                  {"ids": originals}).dicts()
    for row in ages:
        h.note(f"B original job {row['id']}: claimed in round {claimed_round.get(row['id'])}, "
               f"waited {row['wait'].total_seconds():.3f}s from enqueue")
    v.check("B: the locked original was claimed in the first round after its release",
            claimed_round.get(oldest) == locked_rounds + 1,
            f"claimed in round {claimed_round.get(oldest)}; released after round {locked_rounds}")
    v.check("B: every original job progressed (claimed) while new jobs kept arriving",
            len(claimed_round) == len(originals) and max(claimed_round.values(), default=99) <= math.ceil(30 / 6),
            f"{len(claimed_round)}/{len(originals)} originals claimed by round {max(claimed_round.values(), default=0)}"
            f" (bound {math.ceil(30 / 6)}; {rounds} rounds run)")
    v.check("B: no new job was claimed while an eligible original was waiting",
            overtakes == 0, f"{overtakes} round(s) with an overtake")
    v.check("B: the queue depth stayed high (never below 30 claimable jobs before a round)",
            min_depth is not None and min_depth >= 30, f"minimum depth {min_depth}")
    return {"rounds": rounds, "oldest_round": claimed_round.get(oldest), "min_depth": min_depth,
            "overtakes": overtakes, "originals": len(originals), "claimed_originals": len(claimed_round),
            "locked_rounds": locked_rounds, "arrivals": 6}


def run(h: Harness) -> Verdict:
    v = Verdict()
    a = _part_a(h, v)
    b = _part_b(h, v)
    for sentence in observation(a, b):
        v.observe(sentence)
    return v


def observation(a: dict, b: dict) -> list[str]:  # type: ignore[type-arg]
    """The observation, from the two parts' captured figures only (a test feeds it others)."""
    locked = f"rounds 1–{b['locked_rounds']}" if b["locked_rounds"] > 1 else "round 1"
    return [
        f"A: with job {a['oldest']} row-locked, {a['rounds']} rounds of {a['workers']} SKIP LOCKED claims of up to "
        f"{a['batch']} ({a['calls']} pgq.claim calls) took {a['taken']} jobs, {a['newer']} of them newer than it "
        f"({a['blocked']} calls waited on a lock); the skip-probe before release still listed {a['remaining']}; "
        f"the first claim after release returned {a['after']}.",
        f"B: with {b['arrivals']} arrivals per round the depth never fell below {b['min_depth']}; "
        f"{b['claimed_originals']} of {b['originals']} originals were claimed within {b['rounds']} rounds; the "
        f"original locked for {locked} was claimed in round {b['oldest_round']}; {b['overtakes']} rounds where "
        f"a new job overtook a waiting original.",
    ]
