"""Experiment 3: ordering, with one worker and then three workers behind a barrier.

24 jobs whose run_at order differs from their id order (with ties broken by id) and two of
higher priority. Before every claim (or round of claims) an observer snapshots the claimable jobs
in pgq's documented total order (priority DESC, run_at, id); the claim (or the round's claims)
must return the top of that snapshot."""

from __future__ import annotations

from collections import Counter

from pgq_tools.lab.harness import Harness, Verdict
from pgq_tools.lab.statements import CLAIM, COMPLETE, EVENTS, READY_SNAPSHOT

NUMBER = 3
SLUG = "ordering"
TITLE = "Ordering: one worker, then three workers behind a barrier"
BASIS = (
    "“When using LIMIT, it is a good idea to use an ORDER BY clause that constrains the result rows into a "
    "unique order. Otherwise you will get an unpredictable subset of the query's rows.” (SELECT, LIMIT "
    "Clause). “With SKIP LOCKED, any selected rows that cannot be immediately locked are skipped.” (SELECT, "
    "The Locking Clause) — PostgreSQL promises no round-robin among workers."
)
HYPOTHESIS = (
    "pgq.claim orders by the total order priority DESC, run_at, id over immutable ranking fields, so with "
    "no row locked the next claim is the top-ranked job; k concurrent single-job claims take exactly the "
    "top k, each worker one distinct job (which worker gets which rank is not defined)."
)
PROCEDURE = (
    "24 jobs: run_at = epoch + ((7n mod 12) s) (order ≠ id order, ties by id), priority 1 for n = 10, 20. "
    "Part A: worker-a claims 6 times, each after a snapshot. Part B: 6 rounds; per round a snapshot, then "
    "worker-a/b/c each call pgq.claim(batch 1) released together by a barrier; then each completes its job."
)
CONDITION = (
    "Every single-worker claim equals rank 1 of its snapshot; every round's three claims are distinct and "
    "equal the snapshot's ranks 1–3 as a set; no claim waits on a lock (none seen by polling, none of 1 ms "
    "or more reported by the server); all 24 jobs done, each claimed once (pgq.job_events)."
)

ENQUEUE_24 = (
    "SELECT pgq.enqueue(queue => 'lab', kind => 'synthetic', payload => jsonb_build_object('n', n),"
    " run_at => TIMESTAMPTZ '2025-01-01 09:00:00+00' + ((n * 7) % 12) * interval '1 second',"
    " priority => CASE WHEN n % 10 = 0 THEN 1 ELSE 0 END) AS id"
    " FROM generate_series(1, 24) AS n ORDER BY n"
)

WORKERS = ("worker-a", "worker-b", "worker-c")


def _claim_params(worker: str) -> dict:  # type: ignore[type-arg]
    return {"worker": worker, "queues": ["lab"], "batch": 1, "lease": "30 seconds"}


def run(h: Harness) -> Verdict:
    v = Verdict()
    ids = h.fixture("enqueue_24_jobs", ENQUEUE_24).col("id")
    sessions = {w: h.session(w) for w in WORKERS}
    obs = h.session("observer")
    initial = h.step(obs, "snapshot_initial", READY_SNAPSHOT, {"queue": "lab"}).col("id")
    h.note(f"id order:          {ids}")
    h.note(f"total order (snapshot before the run): {initial}")

    # Part A: one worker.
    single_ok, single_lines = 0, []
    for i in range(1, 7):
        snap = h.step(obs, f"A{i}_snapshot", READY_SNAPSHOT, {"queue": "lab"}).col("id")
        c = h.step(sessions["worker-a"], f"A{i}_claim", CLAIM, _claim_params("worker-a"))
        claimed = c.col("id") if c.ok else []
        good = c.ok and not c.lock_wait and claimed == snap[:1]
        single_ok += good
        single_lines.append(f"A{i}: expected rank 1 = {snap[:1]}, worker-a got {claimed} {'ok' if good else 'WRONG'}")
        for row in c.dicts():
            h.step(sessions["worker-a"], f"A{i}_complete", COMPLETE, {"id": row["id"], "attempt": row["attempt"]})
    for line in single_lines:
        h.note(line)

    # Part B: three workers behind a barrier, one claim each per round.
    rounds_ok, blocked, extend_waits, concurrent, lines = 0, 0, 0, 0, []
    per_worker: Counter[str] = Counter()
    ranks_won: dict[str, Counter[int]] = {w: Counter() for w in WORKERS}
    for r in range(1, 7):
        snap = h.step(obs, f"B{r}_snapshot", READY_SNAPSHOT, {"queue": "lab"}).col("id")
        steps = h.round(f"B{r}", [(sessions[w], f"B{r}_{w}_claim", CLAIM, _claim_params(w)) for w in WORKERS])
        got = {s.session: (s.col("id") if s.ok else []) for s in steps}
        flat = [j for js in got.values() for j in js]
        concurrent += len(steps)
        blocked += sum(s.lock_wait for s in steps)
        extend_waits += sum((s.blocked or bool(s.logged_waits)) and not s.lock_wait for s in steps)
        good = (all(s.ok and len(got[s.session]) == 1 for s in steps)
                and len(set(flat)) == 3 and set(flat) == set(snap[:3]))
        rounds_ok += good
        ranks = {w: (snap.index(js[0]) + 1 if js and js[0] in snap else None) for w, js in got.items()}
        for w, rank in ranks.items():
            per_worker[w] += bool(got[w])
            if rank:
                ranks_won[w][rank] += 1
        lines.append(f"B{r}: expected ranks 1-3 = {snap[:3]}; "
                     + ", ".join(f"{w} got {got[w]} (rank {ranks[w]})" for w in WORKERS)
                     + (" ok" if good else " WRONG"))
        for s in steps:
            for row in s.dicts():
                h.step(sessions[s.session], f"B{r}_{s.session}_complete", COMPLETE,
                       {"id": row["id"], "attempt": row["attempt"]})
    for line in lines:
        h.note(line)

    events = h.step(obs, "events", EVENTS, {"ids": ids}).dicts()
    claims = Counter(e["job_id"] for e in events if e["event"] == "claimed")
    done = Counter(e["job_id"] for e in events if e["event"] == "completed")

    v.check("one worker: every claim returned rank 1 of the snapshot taken just before it",
            single_ok == 6, f"{single_ok}/6 claims matched rank 1")
    v.check("three workers: every round's claims were distinct and equal ranks 1–3 of the pre-round snapshot",
            rounds_ok == 6, f"{rounds_ok}/6 rounds matched")
    v.check("no claim waited on a lock", blocked == 0,
            f"{blocked} of {concurrent} concurrent claims waited on a lock ({extend_waits} brief relation-extension "
            "waits)")
    v.check("all 24 jobs were claimed exactly once and completed",
            sorted(claims) == sorted(ids) and set(claims.values()) == {1} and sorted(done) == sorted(ids),
            f"{len(claims)} jobs claimed (max {max(claims.values(), default=0)} claims per job), {len(done)} completed")

    v.observe(f"Total order before the run (priority DESC, run_at, id): {initial}; id order was {ids}.")
    v.observe(f"One worker: {single_ok}/6 claims equal to rank 1 of the preceding snapshot. Three workers "
              f"behind a barrier: {rounds_ok}/6 rounds returned exactly ranks 1–3, {blocked} claims waited on a lock. "
              f"Worker distribution (not a criterion): "
              + ", ".join(f"{w} {per_worker[w]}" for w in WORKERS)
              + "; ranks won per worker: "
              + "; ".join(f"{w} " + ", ".join(f"rank {k}×{n}" for k, n in sorted(ranks_won[w].items()))
                          for w in WORKERS)
              + ".")
    return v
