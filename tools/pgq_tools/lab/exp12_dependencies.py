"""Experiment 12: job dependencies (pgq.enqueue's depends_on) under concurrency.

Four parts, each against pgq's own functions: (1) the race of a dependency's completion with the
enqueue of its dependant, held open in each order, then (2) run 60 times behind a barrier; (3) a
fan-in of 200 jobs completed by 4 concurrent workers with pgq.complete_many; (4) a chain of 100
whose head fails. Since issue 24 the enqueue locks none of the jobs it names: an end and an enqueue
that overlap do not wait for each other, and the sweep settles the dependant."""

from __future__ import annotations

from typing import Any

from pgq_tools.lab.harness import Harness, Verdict, sqlv
from pgq_tools.lab.statements import CLAIM, COMPLETE

NUMBER = 12
SLUG = "dependencies"
TITLE = "Job dependencies: release, cascade and the enqueue/complete race"
BASIS = (
    "“UPDATE, DELETE, SELECT FOR UPDATE ... will wait for the first updating transaction to commit or roll "
    "back ... the second updater can proceed with updating the originally found row ... the search condition "
    "of the command (the WHERE clause) is re-evaluated to see if the updated version of the row still matches” "
    "(Transaction Isolation, 13.2.1, Read Committed); and a statement of a READ COMMITTED transaction sees "
    "only what was committed before it began. pgq.enqueue reads its dependencies' states and locks none of "
    "them; an end looks its dependants up after it has locked its own row; each enqueue leaves a check per "
    "dependency that the sweep settles once it has committed."
)
HYPOTHESIS = (
    "A dependency's completion and its dependant's enqueue at the same moment never wait for each other. "
    "Held open in either order, neither sees the other: the dependant stays waiting until the next sweep, "
    "which moves it on (pending, or cancelled after a failure). Never lost (left waiting after the sweep), "
    "never early (pending while a dependency is not done). The completions of a fan-in's dependencies take "
    "turns on the dependant's row, so it is released exactly once; a failed head cancels a chain of 100 "
    "(less than one call's share of 1000) in its own transaction."
)
PROCEDURE = (
    "(1) worker-a completes job D1 in an open transaction; producer enqueues J1 depends_on [D1]; worker-a "
    "commits. producer enqueues J2 depends_on [D2] in an open transaction; worker-a completes D2; producer "
    "commits. Then a sweep. (2) 60 rounds, each: a fresh claimed job D; behind a barrier worker-a completes D "
    "(every third round: fails it, not retryable) while producer enqueues a dependant of D; observer reads "
    "the dependant (never pending with D not done); after the rounds, a sweep, and the observer reads them all. "
    "(3) enqueue_many 200 parts; enqueue the callback depends_on all 200; rounds of 4 workers, each claiming "
    "up to 10 parts and completing them with one pgq.complete_many, behind a barrier, until none is left; a "
    "reader after every round looks for the callback pending with a part not done; then a sweep. (4) a chain "
    "of 100 jobs, "
    "each depending on the previous; the head fails."
)
CONDITION = (
    "(1) Neither the producer's enqueue nor worker-a's completion waited for the other; J1 and J2 were "
    "waiting after both committed, and pending after one sweep. (2) No step waited for the other session; "
    "after the rounds and one sweep every dependant is pending after a completed round and cancelled after a "
    "failed one, none left waiting, and none was ever seen pending with its dependency not done. (3) All 200 "
    "parts are done, the callback is pending, released once (one dependencies_done event), and no sample "
    "saw it early. (4) All 100 are cancelled by the head's fail, the last one's last_error names its "
    "dependency and the head. pgq.job_dependencies is empty at the end."
)

ENQUEUE_DEPENDANT = ("SELECT pgq.enqueue(queue => %(queue)s::text, kind => 'dependant',"
                     " depends_on => %(deps)s::bigint[]) AS id")
ENQUEUE_ONE = "SELECT pgq.enqueue(queue => %(queue)s::text, kind => %(kind)s::text) AS id"
ENQUEUE_PARTS = ("SELECT id FROM pgq.enqueue_many(queue => 'lab-parts', kind => 'part',"
                 " payloads => array_fill('{}'::jsonb, ARRAY[%(n)s::integer])) AS t(id)")
FAIL = ("SELECT pgq.fail(id => %(id)s::bigint, attempt => %(attempt)s::integer, error => 'boom',"
        " retryable => false) AS state")
CLAIM_AND_COMPLETE_MANY = (
    "WITH c AS MATERIALIZED (SELECT id, attempt FROM pgq.claim(worker => %(worker)s::text,"
    " queues => ARRAY['lab-parts'], batch => 10))"
    " SELECT count(*) AS completed FROM pgq.complete_many("
    "coalesce((SELECT array_agg(id ORDER BY id) FROM c), '{}'), coalesce((SELECT array_agg(attempt ORDER BY id)"
    " FROM c), '{}'))"
)
STATE = ("SELECT id, state::text AS state, last_event, last_error, dependencies_left, xmin::text AS xmin"
         " FROM pgq.jobs WHERE id = %(id)s")
EARLY = ("SELECT count(*) AS early FROM pgq.jobs AS j WHERE j.id = %(id)s AND j.state = 'pending' AND EXISTS ("
         "SELECT FROM pgq.jobs AS d WHERE d.id = ANY (j.depends_on) AND d.state <> 'done')")
LINKS = "SELECT count(*) AS links FROM pgq.job_dependencies"
RELEASES = ("SELECT count(*) AS releases FROM pgq.job_events WHERE job_id = %(id)s"
            " AND event = 'dependencies_done'")
XMINS = "SELECT xmin::text AS xmin FROM pgq.jobs WHERE id = ANY (%(ids)s::bigint[])"
SWEEP = "SELECT pgq.sweep() AS recovered"


def _claim_one(h: Harness, session: Any, name: str, queue: str) -> tuple[int, int]:
    rows = h.step(session, name, CLAIM, {"worker": session.name, "queues": [queue], "batch": 1,
                                         "lease": "5 minutes"}).dicts()
    return rows[0]["id"], rows[0]["attempt"]


def run(h: Harness) -> Verdict:
    v = Verdict()
    a, producer, obs = h.session("worker-a"), h.session("producer"), h.session("observer")
    h.fixture("configure_parts", "SELECT name FROM pgq.configure_queue(queue => 'lab-parts', audit => false)")
    h.fixture("configure_chain", "SELECT name FROM pgq.configure_queue(queue => 'lab-chain', audit => false)")

    # (1) The race held open, in each order.
    h.fixture("enqueue_d1", ENQUEUE_ONE, {"queue": "lab-deps", "kind": "dependency"})
    d1, d1_attempt = _claim_one(h, a, "a_claim_d1", "lab-deps")
    h.step(a, "a_begin", "BEGIN")
    h.step(a, "a_complete_d1_uncommitted", COMPLETE, {"id": d1, "attempt": d1_attempt})
    enq1 = h.step(producer, "producer_enqueue_j1", ENQUEUE_DEPENDANT, {"queue": "lab-after", "deps": [d1]})
    h.step(a, "a_commit", "COMMIT")
    h.wait(enq1)
    j1 = h.step(obs, "obs_j1", STATE, {"id": enq1.value}).dicts()[0]

    h.fixture("enqueue_d2", ENQUEUE_ONE, {"queue": "lab-deps", "kind": "dependency"})
    d2, d2_attempt = _claim_one(h, a, "a_claim_d2", "lab-deps")
    h.step(producer, "producer_begin", "BEGIN")
    enq2 = h.step(producer, "producer_enqueue_j2_uncommitted", ENQUEUE_DEPENDANT, {"queue": "lab-after", "deps": [d2]})
    done2 = h.step(a, "a_complete_d2", COMPLETE, {"id": d2, "attempt": d2_attempt})
    h.step(producer, "producer_commit", "COMMIT")
    h.wait(done2)
    j2 = h.step(obs, "obs_j2", STATE, {"id": enq2.value}).dicts()[0]
    h.step(obs, "obs_sweep_held_open", SWEEP)
    j1_after = h.step(obs, "obs_j1_after_sweep", STATE, {"id": enq1.value}).dicts()[0]
    j2_after = h.step(obs, "obs_j2_after_sweep", STATE, {"id": enq2.value}).dicts()[0]

    v.check("an enqueue during an uncommitted completion did not wait for it; its job was pending after the "
            "next sweep",
            not enq1.blocked and not enq1.lock_wait and enq1.ok and j1["state"] == "waiting"
            and j1_after["state"] == "pending",
            f"{enq1.outcome}; job {enq1.value} was {j1['state']}, then {j1_after['state']}")
    v.check("a completion during an uncommitted enqueue did not wait for it; the job was pending after the "
            "next sweep",
            not done2.blocked and not done2.lock_wait and done2.value is True and j2["state"] == "waiting"
            and j2_after["state"] == "pending" and j2_after["last_event"] == "dependencies_done",
            f"{done2.outcome}; job {enq2.value} was {j2['state']}, then {j2_after['state']} "
            f"({j2_after['last_event']})")

    # (2) The race, 60 times behind a barrier.
    rounds, wrong, blocked, early_race = 60, [], 0, 0
    raced: list[tuple[int, int, bool]] = []
    for r in range(1, rounds + 1):
        h.fixture(f"enqueue_race_dep_{r}", ENQUEUE_ONE, {"queue": "lab-race", "kind": "dependency"})
        dep, attempt = _claim_one(h, a, f"a_claim_race_{r}", "lab-race")
        failing = r % 3 == 0
        ender = (FAIL if failing else COMPLETE), {"id": dep, "attempt": attempt}
        steps = h.round(f"race_{r}", [(a, f"a_end_{r}", ender[0], ender[1]),
                                      (producer, f"producer_enqueue_{r}", ENQUEUE_DEPENDANT,
                                       {"queue": "lab-race-after", "deps": [dep]})])
        blocked += sum(s.lock_wait for s in steps)
        early_race += h.step(obs, f"obs_race_early_{r}", EARLY, {"id": steps[1].value}).value
        if not all(s.ok for s in steps):
            wrong.append((r, dep, "error", "", [s.outcome for s in steps]))
        else:
            raced.append((steps[1].value, dep, failing))
    settled_in_round = 0
    for dependant_id, _, _ in raced:
        settled_in_round += h.step(obs, f"obs_race_before_sweep_{dependant_id}", STATE,
                                   {"id": dependant_id}).dicts()[0]["state"] != "waiting"
    h.step(obs, "obs_sweep_races", SWEEP)
    for dependant_id, dep, failing in raced:
        dependant = h.step(obs, f"obs_race_{dependant_id}", STATE, {"id": dependant_id}).dicts()[0]
        expected = "cancelled" if failing else "pending"
        if dependant["state"] != expected:
            wrong.append((dependant_id, dep, dependant["state"], expected, []))
    h.note(f"race rounds: {rounds}; steps that waited for the other session: {blocked}; dependants moved on "
           f"by the round itself: {settled_in_round}, by the sweep after: {len(raced) - settled_in_round}")
    v.check(f"in {rounds} barrier rounds of completion (or failure) against enqueue, no step waited for the "
            "other, and after one sweep every dependant ended right (pending, or cancelled after a failure), "
            "none left waiting, none early",
            not wrong and blocked == 0 and early_race == 0,
            f"{len(wrong)} wrong: {wrong[:3]}; {blocked} of {2 * rounds} steps waited for the other; "
            f"{early_race} early sightings; {settled_in_round} moved on in the round, "
            f"{len(raced) - settled_in_round} by the sweep")

    # (3) A fan-in of 200 completed by 4 concurrent workers.
    parts = h.fixture("enqueue_parts", ENQUEUE_PARTS, {"n": 200}).col("id")
    callback = h.fixture("enqueue_callback", ENQUEUE_DEPENDANT, {"queue": "lab-callback", "deps": parts}).value
    workers = [h.session(f"part-worker-{i}") for i in range(1, 5)]
    completed, early, fan_rounds = 0, 0, 0
    while completed < 200 and fan_rounds < 50:
        fan_rounds += 1
        steps = h.round(f"fan_in_{fan_rounds}", [(w, f"{w.name}_claim_complete_{fan_rounds}",
                                                  CLAIM_AND_COMPLETE_MANY, {"worker": w.name}) for w in workers])
        completed += sum(s.value or 0 for s in steps if s.ok)
        early += h.step(obs, f"obs_early_{fan_rounds}", EARLY, {"id": callback}).value
    before_sweep = h.step(obs, "obs_callback_before_sweep", STATE, {"id": callback}).dicts()[0]
    part_xmins = set(h.step(obs, "obs_part_xmins", XMINS, {"ids": parts}).col("xmin"))
    h.step(obs, "obs_sweep_fan_in", SWEEP)
    cb = h.step(obs, "obs_callback", STATE, {"id": callback}).dicts()[0]
    releases = h.step(obs, "obs_callback_releases", RELEASES, {"id": callback}).value
    by = ("the last completion's transaction" if before_sweep["state"] == "pending"
          and before_sweep["xmin"] in part_xmins else "the sweep")
    v.check("the fan-in's callback waited for all 200 parts, then was released once, never early",
            completed == 200 and cb["state"] == "pending" and releases == 1 and early == 0,
            f"{completed} parts completed in {fan_rounds} rounds of 4 workers; callback {cb['state']}, "
            f"{releases} release event(s), released by {by}; {early} early sightings")

    # (4) A chain of 100 whose head fails.
    chain = [h.fixture("enqueue_chain_head", ENQUEUE_ONE, {"queue": "lab-chain", "kind": "step"}).value]
    for i in range(100):
        chain.append(h.fixture(f"enqueue_chain_{i + 1}", ENQUEUE_DEPENDANT,
                               {"queue": "lab-chain", "deps": [chain[-1]]}).value)
    head, head_attempt = _claim_one(h, a, "a_claim_chain_head", "lab-chain")
    failed = h.step(a, "a_fail_chain_head", FAIL, {"id": head, "attempt": head_attempt})
    cancelled = h.step(obs, "obs_chain", "SELECT count(*) AS cancelled FROM pgq.jobs WHERE queue = 'lab-chain'"
                       " AND state = 'cancelled' AND last_event = 'dependency_ended'").value
    last = h.step(obs, "obs_chain_last", STATE, {"id": chain[-1]}).dicts()[0]
    v.check("the head's failure cancelled all 100 jobs of its chain, the last naming its dependency and the head",
            failed.value == "failed" and cancelled == 100 and f"job {chain[-2]}," in (last["last_error"] or "")
            and f"because job {head}," in (last["last_error"] or ""),
            f"fail returned {sqlv(failed.value)}; {cancelled} cancelled; the last one's last_error: "
            f"{last['last_error']!r}")

    links = h.step(obs, "obs_links", LINKS).value
    v.check("no dependency link is left", links == 0, f"{links} rows in pgq.job_dependencies")
    v.observe(f"Held open: the enqueue of job {enq1.value} did not wait for worker-a's uncommitted completion "
              f"of job {d1} ({enq1.outcome}), and worker-a's completion of job {d2} did not wait for the "
              f"producer's uncommitted enqueue of job {enq2.value} ({done2.outcome}); both dependants were "
              f"{j1['state']} and {j2['state']} after the commits, {j1_after['state']} and {j2_after['state']} "
              f"after one sweep. {rounds} barrier rounds: {blocked} steps waited for the other session, "
              f"{settled_in_round} dependants moved on in the round and {len(raced) - settled_in_round} by the "
              f"sweep, {len(wrong)} in the wrong state, {early_race} early. Fan-in: 200 parts by 4 workers in "
              f"{fan_rounds} rounds, callback {cb['state']} after {releases} release, by {by}, {early} early "
              f"sightings. Chain: {cancelled} of 100 cancelled by the head's failure. {links} links left.")
    return v
