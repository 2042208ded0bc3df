"""Experiment 11: per-key concurrency under concurrent claimers.

A queue with key_max_running 2 and an override of 4 for the key "big" (pgq.set_key_limit). Part A:
the oldest three jobs share the key "a"; worker-a claims two (the key is full), then worker-b
claims a batch of 10, which must skip the third "a" job and fill the batch with other keys' jobs
and jobs without a key. Part B: four workers claim batches of 3 behind a barrier, round after round,
each round ending with the observer counting the running jobs per key and every worker
completing what it got, until the queue is drained."""

from __future__ import annotations

from collections import Counter

from pgq_tools.lab.harness import Harness, Verdict
from pgq_tools.lab.statements import COMPLETE, EPOCH

NUMBER = 11
SLUG = "key-limits"
TITLE = "Per-key concurrency under concurrent claimers"
BASIS = (
    "“FOR NO KEY UPDATE … the lock acquired … will block other transactions that attempt … FOR NO KEY "
    "UPDATE … on the same row” (SELECT, The Locking Clause): claims of one key-limited queue serialize on "
    "its pgq.queues row, so each sees the running jobs the previous one committed. “Each SQL command "
    "sees a snapshot of data … as of the start of the command” (Read Committed, 13.2.1): the count of a "
    "key's running jobs is taken after that lock is granted."
)
HYPOTHESIS = (
    "However many workers claim at the same instant, no key ever has more running jobs than its limit (2, "
    "or 4 for the overridden key); jobs without a key are not limited; a full key does not block the "
    "jobs behind it: a claim passes over its waiting jobs and takes other keys' jobs."
)
PROCEDURE = (
    "configure_queue(key_max_running 2); set_key_limit('big', 4). A: enqueue 3 jobs of key a, then 6 of b, "
    "6 of big and 4 without a key (all due, in that id order); worker-a claims batch 2, then worker-b "
    "claims batch 10. B: 4 × 10 jobs of keys p, q, big and no key; worker-a..d claim batch 3 behind a "
    "barrier in each round (a worker whose claim came back empty claims once more after the others); after "
    "each round the observer counts running jobs per key and each worker completes its jobs; until no job "
    "is pending (at most 20 rounds)."
)
CONDITION = (
    "A: worker-a gets the two oldest a jobs; worker-b's 10 contain no a job, 2 of b, 4 of big and the 4 "
    "without a key; the third a job stays pending at attempt 0. B: in every round no key's running count "
    "exceeds its limit (2; big 4), big reaches 4 and p and q 2, no job is claimed twice, and every "
    "job ends done."
)

CONFIGURE = ("SELECT name FROM pgq.configure_queue(queue => %(queue)s::text, key_max_running => 2,"
             " lease => '1 minute')")
OVERRIDE = "SELECT pgq.set_key_limit(queue => %(queue)s::text, key => 'big', max_running => 4)"
ENQUEUE_KEYED = (
    "SELECT id FROM pgq.enqueue_many(queue => %(queue)s::text, kind => 'keyed',"
    " payloads => ARRAY(SELECT jsonb_build_object('n', n) FROM generate_series(1, %(n)s::integer) AS n),"
    " run_at => %(run_at)s::timestamptz, concurrency_key => %(key)s::text) AS t(id)"
)
CLAIM_KEYED = (
    "SELECT c.id, c.attempt, j.concurrency_key AS key FROM pgq.claim(worker => %(worker)s::text,"
    " queues => ARRAY[%(queue)s::text], batch => %(batch)s::integer, lease => '1 minute') AS c"
    " JOIN pgq.jobs AS j USING (id)"
)
RUNNING_PER_KEY = (
    "SELECT coalesce(concurrency_key, '(none)') AS key, count(*)::integer AS running FROM pgq.jobs"
    " WHERE queue = %(queue)s AND state = 'running' GROUP BY 1 ORDER BY 1"
)
STATES = ("SELECT state::text AS state, count(*)::integer AS n FROM pgq.jobs WHERE queue = %(queue)s"
          " GROUP BY 1 ORDER BY 1")
LIMITS = {"big": 4}


def _limit(key: str) -> int | None:
    return None if key == "(none)" else LIMITS.get(key, 2)


def _enqueue(h: Harness, tag: str, queue: str, key: str | None, n: int) -> list[int]:
    return h.fixture(f"{tag}_enqueue_{n}_{key or 'nokey'}", ENQUEUE_KEYED,
                     {"queue": queue, "n": n, "run_at": EPOCH, "key": key}).col("id")


def _part_a(h: Harness, v: Verdict) -> dict:  # type: ignore[type-arg]
    q = "lab-keyed-a"
    h.fixture("A_configure_queue", CONFIGURE, {"queue": q})
    h.fixture("A_set_key_limit_big_4", OVERRIDE, {"queue": q})
    a_ids = _enqueue(h, "A", q, "a", 3)
    for key, n in (("b", 6), ("big", 6), (None, 4)):
        _enqueue(h, "A", q, key, n)
    wa, wb, obs = h.session("worker-a"), h.session("worker-b"), h.session("observer")
    first = h.step(wa, "A_worker-a_claim_2", CLAIM_KEYED, {"worker": "worker-a", "queue": q, "batch": 2}).dicts()
    second = h.step(wb, "A_worker-b_claim_10", CLAIM_KEYED, {"worker": "worker-b", "queue": q, "batch": 10}).dicts()
    third = h.step(obs, "A_third_a_job", "SELECT state::text AS state, attempt FROM pgq.jobs WHERE id = %(id)s",
                   {"id": a_ids[2]}).dicts()[0]
    running = {r["key"]: r["running"] for r in h.step(obs, "A_running_per_key", RUNNING_PER_KEY,
                                                      {"queue": q}).dicts()}
    keys_b = Counter(r["key"] or "(none)" for r in second)
    v.check("A: worker-a got the two oldest jobs, both of key a",
            [r["id"] for r in first] == a_ids[:2], f"got {[(r['id'], r['key']) for r in first]}, oldest a {a_ids}")
    v.check("A: worker-b's batch of 10 passed over the full key a and took 2 b, 4 big and the 4 without a key",
            len(second) == 10 and keys_b == Counter({"b": 2, "big": 4, "(none)": 4}),
            f"{len(second)} jobs: {dict(sorted(keys_b.items()))}")
    v.check("A: the third a job stayed pending at attempt 0",
            third == {"state": "pending", "attempt": 0}, f"state={third['state']} attempt={third['attempt']}")
    over = {k: n for k, n in running.items() if _limit(k) is not None and n > _limit(k)}
    v.check("A: no key is over its limit", not over, f"running per key {running}")
    return {"first": [(r["id"], r["key"]) for r in first], "second": dict(sorted(keys_b.items())),
            "third": a_ids[2], "third_state": third["state"], "running": running}


def _part_b(h: Harness, v: Verdict) -> dict:  # type: ignore[type-arg]
    q = "lab-keyed-b"
    h.fixture("B_configure_queue", CONFIGURE, {"queue": q})
    h.fixture("B_set_key_limit_big_4", OVERRIDE, {"queue": q})
    ids: list[int] = []
    for key in ("p", "q", "big", None):
        ids += _enqueue(h, "B", q, key, 10)
    workers = [h.session(f"worker-{c}2") for c in "abcd"]
    obs = h.session("observer-b")
    max_seen: Counter[str] = Counter()
    over_rounds, claimed, blocked, rounds = 0, [], 0, 0
    for r in range(1, 21):
        rounds = r
        steps = h.round(f"B{r}", [(w, f"B{r}_{w.name}_claim", CLAIM_KEYED,
                                   {"worker": w.name, "queue": q, "batch": 3}) for w in workers])
        blocked += sum(s.lock_wait for s in steps)  # (not a brief relation-extension wait)
        # A claim that found the keys it met held by other claims (tried locks) came back empty: the
        # worker claims once more after the others, as its next poll would, so that every worker
        # has a claim in each round whatever the scheduling (and a key can reach its limit).
        steps += [h.step(s.session, f"B{r}_{s.session}_claim_again", CLAIM_KEYED,
                         {"worker": s.session, "queue": q, "batch": 3}) for s in list(steps) if not s.dicts()]
        running = {x["key"]: x["running"] for x in h.step(obs, f"B{r}_running_per_key", RUNNING_PER_KEY,
                                                          {"queue": q}).dicts()}
        for k, n in running.items():
            max_seen[k] = max(max_seen[k], n)
        over = {k: n for k, n in running.items() if _limit(k) is not None and n > _limit(k)}
        over_rounds += bool(over)
        got = [row for s in steps for row in s.dicts()]
        claimed += [row["id"] for row in got]
        h.note(f"B{r}: claimed " + ", ".join(f"{s.session} {[(x['id'], x['key']) for x in s.dicts()]}" for s in steps)
               + f"; running per key {running}")
        for s in steps:
            for row in s.dicts():
                h.step(s.session, f"B{r}_{s.session}_complete_{row['id']}", COMPLETE,
                       {"id": row["id"], "attempt": row["attempt"]})
        if not got and h.step(obs, f"B{r}_pending_left", "SELECT count(*)::integer FROM pgq.jobs"
                              " WHERE queue = %(queue)s AND state = 'pending'", {"queue": q}).value == 0:
            break
    states = {x["state"]: x["n"] for x in h.step(obs, "B_final_states", STATES, {"queue": q}).dicts()}
    v.check("B: in no round did a key have more running jobs than its limit (2; big 4)",
            over_rounds == 0,
            f"{over_rounds} of {rounds} rounds over; most running per key {dict(sorted(max_seen.items()))}")
    v.check("B: the overridden key big reached its own limit of 4, the others 2",
            max_seen["big"] == 4 and max_seen["p"] == 2 and max_seen["q"] == 2,
            f"most running per key {dict(sorted(max_seen.items()))}")
    v.check("B: no job was claimed twice, and every job ended done",
            len(claimed) == len(set(claimed)) == len(ids) and states == {"done": len(ids)},
            f"{len(claimed)} claims of {len(set(claimed))} distinct jobs ({len(ids)} enqueued); final states {states}")
    return {"rounds": rounds, "max_seen": dict(sorted(max_seen.items())), "claims": len(claimed),
            "jobs": len(ids), "over_rounds": over_rounds, "blocked": blocked, "workers": len(workers),
            "states": states}


def run(h: Harness) -> Verdict:
    v = Verdict()
    a = _part_a(h, v)
    b = _part_b(h, v)
    for sentence in observation(a, b):
        v.observe(sentence)
    return v


def observation(a: dict, b: dict) -> list[str]:  # type: ignore[type-arg]
    """The observation, from the two parts' captured figures only (a test feeds it others)."""
    return [
        f"A: worker-a's claim of 2 returned {a['first']}; worker-b's claim of 10 returned {a['second']} "
        f"(per key); job {a['third']} (the third of key a) stayed {a['third_state']}; running per key after "
        f"both: {a['running']}.",
        f"B: {b['workers']} workers claiming batches of 3 behind a barrier drained {b['jobs']} jobs in "
        f"{b['rounds']} rounds ({b['claims']} jobs claimed; {b['blocked']} claim calls seen waiting on a lock, "
        f"as claims of a key-limited queue take turns on its queue row); the most running per key after any "
        f"round was {b['max_seen']}; "
        f"{b['over_rounds']} rounds over a limit; final states {b['states']}.",
    ]
