"""Experiment 15: priority aging with a bound, under a constant flood of higher-priority jobs.

Two queues get the same arrivals, round after round: 8 priority-10 jobs per round (more than the
claimers take) and one priority-0 job every 4th round (to round 33). Three workers claim batches of 2 from each
queue behind a barrier once per round and complete what they got; one round is one claim interval,
and pgq's clock (pgq._now(), read from a table of the lab database) moves a fixed step per round:
no wall-clock sleep, the same run every time. Queue `aging` has `max_wait` 60 s: every
priority-0 job must be claimed no later than max_wait plus one round after it came due. Queue
`strict` has none: strict priority, whose priority-0 jobs the flood starves (the control)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pgq_tools.lab.harness import Harness, Verdict

NUMBER = 15
SLUG = "priority-aging"
TITLE = "Priority aging: a bound on the wait under a flood of higher-priority jobs"
BASIS = (
    "“If sorting is not chosen, the rows will be returned in an unspecified order” and “ORDER BY ... DESC "
    "... LIMIT” picks the first rows of the requested order (SELECT, ORDER BY and LIMIT Clauses): a claim "
    "in the order priority DESC alone serves a lower priority only when no higher one is due. “B-tree "
    "indexes ... can produce output in sorted order” (Indexes and ORDER BY): the first entry of each "
    "priority level of the ready index is that level's oldest job."
)
HYPOTHESIS = (
    "Under a flood of priority-10 jobs larger than the claimers take, strict priority starves the "
    "priority-0 jobs; with max_wait, a job due for longer than max_wait is claimed before any job of "
    "higher priority (aged ones: lowest priority first), so no priority-0 job starts later than max_wait "
    "plus one claim interval after it came due, however long the flood lasts."
)
PROCEDURE = (
    "Queues `aging` (max_wait 60 s) and `strict` (none). pgq's clock starts at a fixed time and moves "
    "10 s per round (one round = one claim interval). Each of 40 rounds: a producer enqueues 8 "
    "priority-10 jobs into each queue, and in rounds 1, 5, 9, … 33 one priority-0 job into each (due "
    "at once); worker-a/b/c claim batches of 2 from `aging` behind a barrier, then from `strict`, and "
    "complete what they got (pgq.complete_many)."
)
CONDITION = (
    "Every claim round takes 6 jobs from each queue (the flood exceeds the claimers); in `aging` every "
    "priority-0 job is claimed within 60 s + 10 s of its run_at (its claimed_at - run_at, both pgq's "
    "clock); in `strict` none is claimed during the flood (the control shows the starvation); no job is "
    "claimed twice."
)

STEP_SECONDS = 10
MAX_WAIT_SECONDS = 60
ROUNDS = 40
FLOOD = 8
LOW_EVERY = 4
BATCH = 2
#: The last round with a priority-0 arrival: each has max_wait + one round left to be claimed in.
LAST_LOW = ROUNDS - MAX_WAIT_SECONDS // STEP_SECONDS - 1
T0 = "2031-01-01 00:00:00+00"

#: The lab database's clock: pgq._now() reads pgq_lab_clock.at (the lab's role owns pgq's functions:
#: it migrated the template). The experiment's database is dropped after the run.
INSTALL_CLOCK = (
    "CREATE TABLE public.pgq_lab_clock (at timestamptz NOT NULL);"
    " INSERT INTO public.pgq_lab_clock VALUES (%(at)s::timestamptz);"
    " CREATE OR REPLACE FUNCTION pgq._now() RETURNS timestamptz LANGUAGE sql STABLE"
    " AS $$ SELECT coalesce((SELECT c.at FROM public.pgq_lab_clock AS c), statement_timestamp()) $$"
)
MOVE_CLOCK = ("UPDATE public.pgq_lab_clock SET at = %(at)s::timestamptz + make_interval(secs => %(s)s)"
              " RETURNING at")
CONFIGURE = ("SELECT name, max_wait FROM pgq.configure_queue(queue => %(queue)s::text,"
             " max_wait => %(max_wait)s::interval)")
ENQUEUE = (
    "SELECT id FROM pgq.enqueue_many(queue => %(queue)s::text, kind => 'synthetic',"
    " payloads => ARRAY(SELECT jsonb_build_object('round', %(round)s::integer, 'n', n)"
    " FROM generate_series(1, %(n)s::integer) AS n),"
    " priority => %(priority)s::integer, run_at => pgq._now()) AS t(id)"
)
CLAIM = (
    "SELECT id, attempt, priority FROM pgq.claim(worker => %(worker)s::text, queues => %(queues)s::text[],"
    " batch => %(batch)s::integer, lease => '1 day')"
)
COMPLETE_MANY = "SELECT count(*) AS completed FROM pgq.complete_many(%(ids)s::bigint[], %(attempts)s::integer[])"
WAITS = (
    "SELECT id, queue, state::text AS state, claimed_at - run_at AS wait FROM pgq.jobs"
    " WHERE priority = 0 ORDER BY queue, id"
)


def run(h: Harness) -> Verdict:
    v = Verdict()
    h.fixture("install_lab_clock", INSTALL_CLOCK, {"at": T0})
    h.fixture("configure_aging", CONFIGURE, {"queue": "aging", "max_wait": f"{MAX_WAIT_SECONDS} seconds"})
    h.fixture("configure_strict", CONFIGURE, {"queue": "strict", "max_wait": None})
    producer = h.session("producer")
    workers = [h.session(w) for w in ("worker-a", "worker-b", "worker-c")]
    full_rounds = {"aging": 0, "strict": 0}
    claimed: list[int] = []
    for r in range(1, ROUNDS + 1):
        h.step(producer, f"R{r}_clock", MOVE_CLOCK, {"at": T0, "s": r * STEP_SECONDS})
        for queue in ("aging", "strict"):
            h.step(producer, f"R{r}_{queue}_flood", ENQUEUE,
                   {"queue": queue, "round": r, "n": FLOOD, "priority": 10})
            if r % LOW_EVERY == 1 and r <= LAST_LOW:
                h.step(producer, f"R{r}_{queue}_low", ENQUEUE, {"queue": queue, "round": r, "n": 1, "priority": 0})
        for queue in ("aging", "strict"):
            steps = h.round(f"R{r}_{queue}", [(w, f"R{r}_{queue}_{w.name}_claim", CLAIM,
                                               {"worker": w.name, "queues": [queue], "batch": BATCH})
                                              for w in workers])
            rows = [row for s in steps for row in (s.dicts() if s.ok else [])]
            claimed += [row["id"] for row in rows]
            full_rounds[queue] += len(rows) == BATCH * len(workers)
            low = [row["id"] for row in rows if row["priority"] == 0]
            if low:
                h.note(f"R{r} {queue}: claimed priority-0 job(s) {low}")
            for s in steps:
                got = s.dicts() if s.ok else []
                if got:
                    h.step(s.session, f"R{r}_{queue}_{s.session}_complete", COMPLETE_MANY,
                           {"ids": [g["id"] for g in got], "attempts": [g["attempt"] for g in got]})
    waits = h.step(h.session("observer"), "priority_0_waits", WAITS).dicts()
    facts: dict[str, Any] = {
        "rounds": ROUNDS, "full": full_rounds, "claimed": len(claimed), "distinct": len(set(claimed)),
        "aging": [row["wait"] for row in waits if row["queue"] == "aging"],
        "strict": [row["wait"] for row in waits if row["queue"] == "strict"],
    }
    bound = timedelta(seconds=MAX_WAIT_SECONDS + STEP_SECONDS)
    aging_waits: list[timedelta | None] = facts["aging"]
    v.check("every claim round took a full 6 jobs from each queue (the flood exceeds the claimers)",
            full_rounds == {"aging": ROUNDS, "strict": ROUNDS}, f"full rounds: {full_rounds} of {ROUNDS}")
    v.check("aging: every priority-0 job was claimed within max_wait + one round of its run_at",
            bool(aging_waits) and all(w is not None and w <= bound for w in aging_waits),
            f"waits {[_s(w) for w in aging_waits]} (bound {_s(bound)})")
    v.check("strict (control): no priority-0 job was claimed during the flood",
            bool(facts["strict"]) and all(w is None for w in facts["strict"]),
            f"waits {[_s(w) for w in facts['strict']]}")
    v.check("no job was claimed twice", facts["claimed"] == facts["distinct"],
            f"{facts['claimed']} claims, {facts['distinct']} distinct jobs")
    v.observe(observation(facts))
    return v


def _s(wait: timedelta | None) -> str:
    return "never" if wait is None else f"{wait.total_seconds():g}s"


def observation(facts: dict[str, Any]) -> str:
    """The observation, from the captured figures only (a test feeds it others)."""
    aging = facts["aging"]
    longest = max((w for w in aging if w is not None), default=None)
    unclaimed = sum(w is None for w in aging)
    strict_claimed = sum(w is not None for w in facts["strict"])
    return (
        f"Over {facts['rounds']} rounds of {STEP_SECONDS} s, {facts['full']['aging']} claim rounds of `aging` and "
        f"{facts['full']['strict']} of `strict` took a full {BATCH * 3} jobs; in `aging` (max_wait "
        f"{MAX_WAIT_SECONDS} s) {len(aging) - unclaimed} of {len(aging)} priority-0 jobs were claimed, the "
        f"longest after {_s(longest)} (waits {[_s(w) for w in aging]}); in `strict` {strict_claimed} of "
        f"{len(facts['strict'])} were; {facts['claimed']} claims of {facts['distinct']} distinct jobs."
    )
