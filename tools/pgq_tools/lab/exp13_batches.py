"""Experiment 13: batches and results (issue 26) under concurrent workers.

Two parts, each against pgq's own functions. (A) A batch of 1,000 members drained by 4 workers
behind barriers: 950 enqueued by the producer, 50 added by members' handlers while the batch is
open, 100 failing for good (max_attempts 1); the producer seals it with pgq.batch_close in a round
with members' ends. Exactly one callback, its meta's counts equal to the members' states in
pgq.jobs. (B) A fan-in: a dependant of 50 parts (dependency_mode 'all_ended', 5 parts failing)
whose handler reads every part's outcome through pgq.dependency_results, page by page."""

from __future__ import annotations

from typing import Any

from psycopg.types.json import Jsonb

from pgq_tools.lab.harness import Harness, Session, Step, Verdict, sqlv
from pgq_tools.lab.statements import CLAIM

NUMBER = 13
SLUG = "batches"
TITLE = "Batches and results: one callback with counts equal to the data; a fan-in that reads its inputs"
BASIS = (
    "“UPDATE, DELETE, SELECT FOR UPDATE ... will wait for the first updating transaction to commit or roll "
    "back ... the second updater can proceed with updating the originally found row” (Transaction Isolation, "
    "13.2.1, Read Committed): writers of one row take turns, each seeing the last committed version. "
    "“Transactions can be used to group multiple SQL statements so that they are all executed, or none are” "
    "(Transactions, 3.4). pgq keeps a batch's counts by state on the batch's row; a member's end updates them "
    "in the end's own transaction (in one of 16 shards), as does a member's enqueue; the seal updates the batch "
    "row, which enqueues hold FOR SHARE."
)
HYPOTHESIS = (
    "However the members' ends, the members added by handlers and the seal interleave, the callback is "
    "enqueued once, by the transaction of a member's end: the last ends take turns on the batch row, so when "
    "they overlap (each counted in its own shard) the last to commit sees the others' and enqueues it. Its "
    "meta carries the "
    "counts: they equal the members' states in pgq.jobs. No callback is seen while the batch is open or a "
    "member unfinished, none twice. A member cannot be added once the batch is sealed. A dependant "
    "in 'all_ended' mode is released when its last part ends, failed or not, and reads every part's state, "
    "result and error through pgq.dependency_results, fenced by its attempt."
)
PROCEDURE = (
    "(A) producer: pgq.batch_open(callback lab-batch-done/batch_done, run_when 'all_ended'); enqueue_many 950 "
    "members (max_attempts 1, batch => id; n = 1..950: n mod 10 = 5 fails, n mod 10 = 1 with n ≤ 500 adds a "
    "member). Rounds: worker-1..4 claim batch 10 behind a barrier, then end their i-th jobs together behind a "
    "barrier (pgq.complete; pgq.fail; or pgq.enqueue(batch => id) of a new member n = 951..1000, those with n mod "
    "10 = 5 failing, then pgq.complete, in one transaction); the observer counts callbacks and unfinished "
    "members after each end round. Once the 50 members were added, observer: pgq.batch_status; producer: "
    "pgq.batch_close in the next end round, beside the workers' ends; worker-1 tries to add one more member. "
    "After the drain: the callbacks, a sweep, the callbacks again, pgq.batch_status, the members' states "
    "counted in pgq.jobs, pgq.job_result of two members. (B) enqueue_many 50 parts (max_attempts 1; n mod 10 "
    "= 0 fails); a dependant depends_on all 50, dependency_mode 'all_ended'; worker-1..4 claim batch 5 and end parts "
    "together in rounds (pgq.complete with result {n, square}, or pgq.fail); a sweep; worker-1 claims the "
    "dependant and reads pgq.dependency_results in pages of 20 (after_id); worker-2 reads it with a stale "
    "attempt; worker-1 completes the dependant with the sum it computed; producer: pgq.job_result."
)
CONDITION = (
    "(A) 1,000 members (50 added by handlers), 900 done and 100 failed; batch_status 'open' with no callback "
    "before the seal; batch_close returned true; the add after it failed with 55000 naming batch; exactly one "
    "callback job, never seen early or twice (before or after the sweep), pending in lab-batch-done, its "
    "meta.batch = {id, members, done, failed, cancelled} counted from pgq.jobs, enqueued by the transaction of "
    "a member's end (not the sweep); batch_status "
    "'finished' with the same counts and the callback's id; pgq.job_result of a done and a failed member as "
    "recorded. (B) the dependant never pending with a part unfinished, pending after the "
    "parts ended (45 done, 5 failed); 50 rows in 3 pages (20, 20, 10) in id order, each part's state, result "
    "and error as its worker recorded it; the stale attempt refused with 55000; pgq.job_result of the "
    "dependant done with the handler's sum."
)

BATCH_QUEUE = "lab-batch"
CALLBACK_QUEUE = "lab-batch-done"
MEMBERS = 950            # enqueued by the producer
SPAWNERS_UP_TO = 500     # members n ≤ this with n mod 10 = 1 add one member each (50)
PARTS = 50
PAGE = 20

OPEN = ("SELECT pgq.batch_open(callback_queue => %(queue)s::text, callback_kind => 'batch_done',"
        " callback_payload => '{\"report\": \"lab\"}'::jsonb, run_when => 'all_ended') AS id")
ENQUEUE_MEMBERS = (
    "SELECT id FROM pgq.enqueue_many(queue => %(queue)s::text, kind => 'member',"
    " payloads => ARRAY(SELECT jsonb_build_object('n', n, 'fail', mod(n, 10) = 5,"
    " 'spawn', mod(n, 10) = 1 AND n <= %(spawners)s::integer) FROM generate_series(1, %(n)s::integer) AS n),"
    " max_attempts => 1, batch => %(batch)s::bigint) AS t(id)"
)
COMPLETE_MEMBER = ("SELECT pgq.complete(id => %(id)s::bigint, attempt => %(attempt)s::integer,"
                   " result => jsonb_build_object('n', %(n)s::integer)) AS completed")
FAIL_FOR_GOOD = ("SELECT pgq.fail(id => %(id)s::bigint, attempt => %(attempt)s::integer,"
                 " error => %(error)s::text) AS state")
#: A member's handler adds a member to its own batch, then completes: one transaction.
ADD_MEMBER_AND_COMPLETE = (
    "WITH child AS MATERIALIZED (SELECT pgq.enqueue(queue => %(queue)s::text, kind => 'member',"
    " payload => jsonb_build_object('n', %(child)s::integer, 'fail', mod(%(child)s::integer, 10) = 5, 'spawn', false,"
    " 'parent', %(id)s::bigint), max_attempts => 1, batch => %(batch)s::bigint) AS id)"
    " SELECT child.id AS child, pgq.complete(id => %(id)s::bigint, attempt => %(attempt)s::integer,"
    " result => jsonb_build_object('n', %(n)s::integer, 'child', child.id)) AS completed FROM child"
)
LATE_MEMBER = ("SELECT pgq.enqueue(queue => %(queue)s::text, kind => 'member', payload => '{\"late\": true}'::jsonb,"
               " batch => %(batch)s::bigint) AS id")
CLOSE = "SELECT pgq.batch_close(id => %(batch)s::bigint) AS sealed"
STATUS = ("SELECT state, members, unfinished, done, failed, cancelled, callback_job_id, sealed_at IS NOT NULL"
          " AS sealed, finished_at IS NOT NULL AS finished FROM pgq.batch_status(id => %(batch)s::bigint)")
SAMPLE = ("SELECT count(*) FILTER (WHERE queue = %(callback_queue)s)::integer AS callbacks,"
          " count(*) FILTER (WHERE batch_id = %(batch)s AND state NOT IN ('done', 'failed', 'cancelled'))::integer"
          " AS unfinished FROM pgq.jobs WHERE queue IN (%(queue)s, %(callback_queue)s)")
MEMBER_STATES = ("SELECT state::text AS state, count(*)::integer AS n FROM pgq.jobs WHERE batch_id = %(batch)s"
                 " GROUP BY 1 ORDER BY 1")
ADDED_BY_HANDLERS = ("SELECT count(*)::integer AS added FROM pgq.jobs WHERE batch_id = %(batch)s"
                     " AND payload ? 'parent'")
CALLBACKS = ("SELECT id, state::text AS state, queue, kind, payload, meta, xmin::text AS xmin FROM pgq.jobs"
             " WHERE queue = %(callback_queue)s ORDER BY id")
MEMBER_XMINS = "SELECT DISTINCT xmin::text AS xmin FROM pgq.jobs WHERE batch_id = %(batch)s"
JOB_RESULT = ("SELECT state, result, last_error, finished_at IS NOT NULL AS finished"
              " FROM pgq.job_result(id => %(id)s::bigint)")
SWEEP = "SELECT pgq.sweep() AS recovered"

ENQUEUE_PARTS = (
    "SELECT id FROM pgq.enqueue_many(queue => 'lab-fan', kind => 'part',"
    " payloads => ARRAY(SELECT jsonb_build_object('n', n, 'fail', mod(n, 10) = 0)"
    " FROM generate_series(1, %(n)s::integer) AS n), max_attempts => 1) AS t(id)"
)
ENQUEUE_GATHER = ("SELECT pgq.enqueue(queue => 'lab-fan-in', kind => 'gather', depends_on => %(deps)s::bigint[],"
                  " dependency_mode => 'all_ended') AS id")
COMPLETE_PART = ("SELECT pgq.complete(id => %(id)s::bigint, attempt => %(attempt)s::integer,"
                 " result => %(result)s::jsonb) AS completed")
GATHER_STATE = ("SELECT j.state::text AS state, (SELECT count(*) FROM pgq.jobs AS d WHERE d.id = ANY (j.depends_on)"
                " AND d.state NOT IN ('done', 'failed', 'cancelled'))::integer AS unfinished, j.last_event,"
                " j.xmin::text AS xmin FROM pgq.jobs AS j WHERE j.id = %(id)s")
PART_XMINS = "SELECT xmin::text AS xmin FROM pgq.jobs WHERE id = ANY (%(ids)s::bigint[])"
DEPENDENCY_RESULTS = (
    "SELECT dependency_id, state, result, last_error, finished_at IS NOT NULL AS finished"
    " FROM pgq.dependency_results(id => %(id)s::bigint, attempt => %(attempt)s::integer,"
    " limit_rows => %(limit)s::integer, after_id => %(after)s::bigint)"
)
COMPLETE_GATHER = ("SELECT pgq.complete(id => %(id)s::bigint, attempt => %(attempt)s::integer,"
                   " result => %(result)s::jsonb) AS completed")

def _claim(h: Harness, workers: list[Session], queue: str, batch: int, tag: str) -> dict[str, list[dict[str, Any]]]:
    steps = h.round(tag, [(w, f"{w.name}_{tag}", CLAIM, {"worker": w.name, "queues": [queue], "batch": batch,
                                                         "lease": "5 minutes"}) for w in workers])
    for s in steps:
        if not s.ok:
            raise RuntimeError(f"{s.session}'s claim failed: {s.outcome}")
    return {s.session: s.dicts() for s in steps}


def _part_a(h: Harness, v: Verdict) -> dict[str, Any]:
    producer, obs = h.session("producer"), h.session("observer")
    workers = [h.session(f"worker-{i}") for i in range(1, 5)]
    h.fixture("configure_members", "SELECT name FROM pgq.configure_queue(queue => %(queue)s::text, audit => false)",
              {"queue": BATCH_QUEUE})
    batch = h.step(producer, "producer_batch_open", OPEN, {"queue": CALLBACK_QUEUE}).value
    first = h.step(producer, "producer_enqueue_members", ENQUEUE_MEMBERS,
                   {"queue": BATCH_QUEUE, "n": MEMBERS, "spawners": SPAWNERS_UP_TO, "batch": batch}).col("id")
    ids = {"queue": BATCH_QUEUE, "callback_queue": CALLBACK_QUEUE, "batch": batch}

    added, next_child, rounds, end_rounds = 0, MEMBERS + 1, 0, 0
    spawners = sum(1 for n in range(1, MEMBERS + 1) if n % 10 == 1 and n <= SPAWNERS_UP_TO)
    close: Step | None = None
    close_round, late, status_open = "", None, None
    early, twice, errors, samples = 0, 0, [], 0
    recorded: dict[int, tuple[str, Any]] = {}  # member id -> (state, result or error)
    while rounds < 200:
        rounds += 1
        claimed = _claim(h, workers, BATCH_QUEUE, 10, f"A_claim_{rounds}")
        if not any(claimed.values()):
            break
        for i in range(max(len(jobs) for jobs in claimed.values())):
            items: list[tuple[Session | str, str, str, Any]] = []
            for w in workers:
                if i >= len(claimed[w.name]):
                    continue
                job = claimed[w.name][i]
                n, tag = job["payload"]["n"], f"A_{w.name}_end_{job['id']}"
                params = {"id": job["id"], "attempt": job["attempt"], "n": n}
                if job["payload"].get("fail"):
                    error = f"member {n} failed on purpose"
                    items.append((w, tag + "_fail", FAIL_FOR_GOOD, {**params, "error": error}))
                    recorded[job["id"]] = ("failed", error)
                elif job["payload"].get("spawn"):
                    items.append((w, tag + "_add_member", ADD_MEMBER_AND_COMPLETE,
                                  {**params, **ids, "child": next_child}))
                    next_child += 1
                    recorded[job["id"]] = ("done", None)  # (its result also names the child)
                else:
                    items.append((w, tag + "_complete", COMPLETE_MEMBER, params))
                    recorded[job["id"]] = ("done", {"n": n})
            if close is None and added == spawners:
                items.append((producer, "producer_batch_close", CLOSE, ids))
            end_rounds += 1
            steps = h.round(f"A_end_{rounds}_{i + 1}", items)
            for s in steps:
                if not s.ok:
                    errors.append(f"{s.name}: {s.outcome}")
                elif s.name.endswith("_add_member"):
                    added += 1
                elif s.name == "producer_batch_close":
                    close, close_round = s, f"A_end_{rounds}_{i + 1}"
            if close is not None and late is None:
                late = h.step(workers[0], "A_worker-1_add_member_after_close", LATE_MEMBER, ids)
            if close is None and added == spawners and status_open is None:
                status_open = h.step(obs, "A_obs_status_before_close", STATUS, ids).dicts()[0]
            sample = h.step(obs, f"A_obs_sample_{end_rounds}", SAMPLE, ids).dicts()[0]
            samples += 1
            twice += sample["callbacks"] > 1
            early += sample["callbacks"] > 0 and (close is None or sample["unfinished"] > 0)
    if close is None:  # (not reached with these sizes: the close rides with the ends)
        close = h.step(producer, "producer_batch_close_after_drain", CLOSE, ids)
        late = h.step(workers[0], "A_worker-1_add_member_after_close", LATE_MEMBER, ids)

    states = {r["state"]: r["n"] for r in h.step(obs, "A_obs_member_states", MEMBER_STATES, ids).dicts()}
    by_handlers = h.step(obs, "A_obs_members_added_by_handlers", ADDED_BY_HANDLERS, ids).value
    # The last end enqueues the callback (the last ends take turns on the batch row); a sweep after
    # the drain must find nothing left to do.
    before_sweep = h.step(obs, "A_obs_callbacks_before_sweep", CALLBACKS, ids).dicts()
    xmins = set(h.step(obs, "A_obs_member_xmins", MEMBER_XMINS, ids).col("xmin"))
    h.step(obs, "A_obs_sweep", SWEEP)
    callbacks = h.step(obs, "A_obs_callbacks", CALLBACKS, ids).dicts()
    status = h.step(obs, "A_obs_status_after_drain", STATUS, ids).dicts()[0]
    by = ("the transaction of a member's end" if len(before_sweep) == 1 and before_sweep[0]["xmin"] in xmins
          else "the sweep" if not before_sweep and len(callbacks) == 1 else "neither")
    done_member = next(i for i, (s, r) in sorted(recorded.items()) if s == "done" and r is not None)
    failed_member = next(i for i, (s, _) in sorted(recorded.items()) if s == "failed")
    results = {i: h.step(producer, f"A_producer_job_result_{i}", JOB_RESULT, {"id": i}).dicts()[0]
               for i in (done_member, failed_member)}

    members = sum(states.values())
    counted = {"id": batch, "members": members, "done": states.get("done", 0), "failed": states.get("failed", 0),
               "cancelled": states.get("cancelled", 0)}
    cb = callbacks[0] if len(callbacks) == 1 else None
    meta = (cb["meta"] or {}).get("batch") if cb else None
    v.check("A: 1,000 members, 50 of them added by members' handlers while the batch was open; 900 done, 100 "
            "failed for good",
            members == MEMBERS + spawners == 1000 and by_handlers == added == spawners == 50
            and states == {"done": 900, "failed": 100} and not errors,
            f"{members} members ({len(first)} by the producer, {by_handlers} by handlers); states {states}; "
            f"{len(errors)} failed steps {errors[:3]}")
    v.check("A: before the seal, batch_status said open with every member counted and no callback",
            status_open is not None and status_open["state"] == "open" and status_open["callback_job_id"] is None
            and status_open["members"] == 1000 and not status_open["sealed"],
            f"status before the close: {status_open}")
    v.check("A: batch_close sealed it (true) in a round with members' ends, and a member's handler adding one "
            "more after the seal got 55000 naming batch",
            close is not None and close.ok and close.value is True and late is not None and late.sqlstate == "55000"
            and "batch" in (late.message or ""),
            f"close: {close.outcome if close else 'not run'} → {sqlv(close.value) if close else ''} ({close_round}); "
            f"late add: {late.outcome if late else 'not run'}")
    v.check("A: exactly one callback job, never seen while the batch was open or a member unfinished, never two "
            "(before or after a sweep)",
            len(callbacks) == 1 and len(before_sweep) <= 1 and early == 0 and twice == 0,
            f"{len(before_sweep)} callback(s) after the drain, {len(callbacks)} after a sweep; {samples} samples: "
            f"{early} early, {twice} with two or more")
    v.check("A: the callback's meta.batch equals the members' states counted in pgq.jobs",
            meta == counted, f"meta.batch {meta}; counted {counted}")
    v.check("A: the callback is the batch's (queue, kind, payload, pending), enqueued by the transaction of a "
            "member's end, not by the sweep",
            cb is not None and (cb["queue"], cb["kind"], cb["payload"], cb["state"])
            == (CALLBACK_QUEUE, "batch_done", {"report": "lab"}, "pending")
            and by == "the transaction of a member's end",
            f"callback {cb and {k: cb[k] for k in ('id', 'queue', 'kind', 'payload', 'state')}}, enqueued by {by}")
    expected_status = {"state": "finished", "members": members, "unfinished": 0, "done": counted["done"],
                       "failed": counted["failed"], "cancelled": counted["cancelled"],
                       "callback_job_id": cb["id"] if cb else None, "sealed": True, "finished": True}
    v.check("A: batch_status after the drain: finished, the same counts, the callback's id",
            status == expected_status, f"{status}")
    r_done, r_failed = results[done_member], results[failed_member]
    v.check("A: pgq.job_result gave the producer a done member's result and a failed member's error",
            (r_done["state"], r_done["result"], r_done["finished"]) == ("done", recorded[done_member][1], True)
            and (r_failed["state"], r_failed["last_error"], r_failed["finished"])
            == ("failed", recorded[failed_member][1], True),
            f"job {done_member}: {r_done}; job {failed_member}: {r_failed}")
    return {"batch": batch, "members": members, "by_producer": len(first), "by_handlers": by_handlers,
            "states": states, "rounds": rounds, "end_rounds": end_rounds, "close": close.outcome if close else None,
            "close_value": close.value if close else None, "close_round": close_round,
            "late": late.outcome if late else None, "before_sweep": len(before_sweep), "callbacks": len(callbacks),
            "early": early, "twice": twice, "samples": samples, "meta": meta, "by": by, "status": status["state"]}


def _part_b(h: Harness, v: Verdict) -> dict[str, Any]:
    producer, obs = h.sessions["producer"], h.sessions["observer"]
    workers = [h.sessions[f"worker-{i}"] for i in range(1, 5)]
    parts = h.fixture("B_enqueue_parts", ENQUEUE_PARTS, {"n": PARTS}).col("id")
    gather = h.step(producer, "B_producer_enqueue_dependant", ENQUEUE_GATHER, {"deps": parts}).value
    recorded: dict[int, tuple[str, Any, Any]] = {}  # part id -> (state, result, last_error)
    early, rounds = 0, 0
    while rounds < 50:
        rounds += 1
        claimed = _claim(h, workers, "lab-fan", 5, f"B_claim_{rounds}")
        if not any(claimed.values()):
            break
        for i in range(max(len(jobs) for jobs in claimed.values())):
            items: list[tuple[Session | str, str, str, Any]] = []
            for w in workers:
                if i >= len(claimed[w.name]):
                    continue
                job = claimed[w.name][i]
                n, tag = job["payload"]["n"], f"B_{w.name}_end_{job['id']}"
                if job["payload"]["fail"]:
                    error = f"part {n} failed on purpose"
                    items.append((w, tag + "_fail", FAIL_FOR_GOOD, {"id": job["id"], "attempt": job["attempt"],
                                                                    "error": error}))
                    recorded[job["id"]] = ("failed", None, error)
                else:
                    result = {"n": n, "square": n * n}
                    items.append((w, tag + "_complete", COMPLETE_PART, {"id": job["id"], "attempt": job["attempt"],
                                                                        "result": Jsonb(result)}))
                    recorded[job["id"]] = ("done", result, None)
            h.round(f"B_end_{rounds}_{i + 1}", items)
        seen = h.step(obs, f"B_obs_dependant_{rounds}", GATHER_STATE, {"id": gather}).dicts()[0]
        early += seen["state"] == "pending" and seen["unfinished"] > 0
    before_sweep = h.step(obs, "B_obs_dependant_before_sweep", GATHER_STATE, {"id": gather}).dicts()[0]
    part_xmins = set(h.step(obs, "B_obs_part_xmins", PART_XMINS, {"ids": parts}).col("xmin"))
    h.step(obs, "B_obs_sweep", SWEEP)
    released = h.step(obs, "B_obs_dependant", GATHER_STATE, {"id": gather}).dicts()[0]
    by = ("the last part's end" if before_sweep["state"] == "pending" and before_sweep["xmin"] in part_xmins
          else "the sweep")

    # The dependant's handler: claim it, read its inputs page by page, check them, complete.
    w1, w2 = workers[0], workers[1]
    got = h.step(w1, "B_worker-1_claim_dependant", CLAIM, {"worker": w1.name, "queues": ["lab-fan-in"], "batch": 1,
                                                            "lease": "5 minutes"}).dicts()
    rows: list[dict[str, Any]] = []
    pages: list[int] = []
    stale: Step | None = None
    total: dict[str, Any] | None = None
    outcome: dict[str, Any] | None = None
    if got and got[0]["id"] == gather:
        attempt = got[0]["attempt"]
        after = None
        while len(pages) < 10:
            page = h.step(w1, f"B_worker-1_dependency_results_{len(pages) + 1}", DEPENDENCY_RESULTS,
                          {"id": gather, "attempt": attempt, "limit": PAGE, "after": after}).dicts()
            pages.append(len(page))
            rows += page
            if len(page) < PAGE:
                break
            after = page[-1]["dependency_id"]
        stale = h.step(w2, "B_worker-2_dependency_results_stale_attempt", DEPENDENCY_RESULTS,
                       {"id": gather, "attempt": attempt + 1, "limit": PAGE, "after": None})
        total = {"sum_of_squares": sum(r["result"]["square"] for r in rows if r["state"] == "done"),
                 "failed": sorted(r["dependency_id"] for r in rows if r["state"] == "failed")}
        h.step(w1, "B_worker-1_complete_dependant", COMPLETE_GATHER,
               {"id": gather, "attempt": attempt, "result": Jsonb(total)})
        outcome = h.step(producer, "B_producer_job_result", JOB_RESULT, {"id": gather}).dicts()[0]

    read = {r["dependency_id"]: (r["state"], r["result"], r["last_error"]) for r in rows}
    mismatched = [i for i in parts if read.get(i) != recorded.get(i)]
    failed = sum(1 for s, _, _ in recorded.values() if s == "failed")
    v.check("B: the 'all_ended' dependant was never pending with a part unfinished, and was pending once all 50 "
            "had ended, 5 of them failed",
            early == 0 and released["state"] == "pending" and released["unfinished"] == 0 and len(recorded) == PARTS
            and failed == 5,
            f"{len(recorded)} parts ended ({failed} failed) in {rounds} rounds of 4 workers; the dependant "
            f"{released['state']} ({released['last_event']}), released by {by}; {early} early sightings")
    v.check(f"B: its handler read all {PARTS} parts through pgq.dependency_results in pages of {PAGE}, in id "
            "order, each part's state, result and error as its worker recorded them",
            [r["dependency_id"] for r in rows] == sorted(parts) and pages == [20, 20, 10] and not mismatched
            and all(r["finished"] for r in rows),
            f"{len(rows)} rows in pages {pages}; {len(mismatched)} differ from what the workers recorded "
            f"{mismatched[:3]}")
    v.check("B: pgq.dependency_results refused a stale attempt with 55000",
            stale is not None and stale.sqlstate == "55000", f"{stale.outcome if stale else 'not run'}")
    v.check("B: the producer read the dependant's result (the handler's sum) through pgq.job_result",
            outcome is not None and outcome["state"] == "done" and outcome["result"] == total
            and total is not None and total["sum_of_squares"] == sum(
                r[1]["square"] for r in recorded.values() if r[0] == "done"),
            f"job_result: {outcome}; the handler computed {total}")
    return {"gather": gather, "parts": PARTS, "failed": failed, "rounds": rounds, "released": released["state"],
            "by": by, "early": early, "pages": pages, "rows": len(rows), "mismatched": len(mismatched),
            "stale": stale.outcome if stale else None, "result": outcome["result"] if outcome else None}


def run(h: Harness) -> Verdict:
    v = Verdict()
    a = _part_a(h, v)
    b = _part_b(h, v)
    for sentence in observation(a, b):
        v.observe(sentence)
    return v


def observation(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """The observation, from the two parts' captured figures only (a test feeds it others)."""
    return [
        f"A: batch {a['batch']} got {a['members']} members ({a['by_producer']} from the producer, "
        f"{a['by_handlers']} added by members' handlers while it was open), drained by 4 workers in "
        f"{a['rounds']} claim rounds and {a['end_rounds']} end rounds; member states {a['states']}. "
        f"batch_close in round {a['close_round'] or '(after the drain)'}: {a['close']} → {sqlv(a['close_value'])}; "
        f"a handler's add after it: {a['late']}. Callback jobs: {a['before_sweep']} after the drain, "
        f"{a['callbacks']} after a sweep ({a['early']} early and {a['twice']} double sightings in {a['samples']} "
        f"samples), enqueued by {a['by']}, meta.batch {a['meta']}; batch_status {a['status']}.",
        f"B: {b['parts']} parts ({b['failed']} failed) ended in {b['rounds']} rounds of 4 workers; the 'all_ended' "
        f"dependant {b['gather']} was {b['released']} after them, released by {b['by']}, {b['early']} early "
        f"sightings; its handler read {b['rows']} dependency results in pages {b['pages']}, {b['mismatched']} "
        f"differing from what the parts' workers recorded; a stale attempt: {b['stale']}; pgq.job_result gave the "
        f"producer {b['result']}.",
    ]
