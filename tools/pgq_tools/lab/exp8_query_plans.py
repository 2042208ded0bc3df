"""Experiment 8: the plans pgq.claim and pgq.sweep actually run, on a realistic table.

The statements live inside PL/pgSQL functions, so a top-level EXPLAIN only shows a Function Scan.
auto_explain with log_nested_statements logs the plan of every statement the functions execute,
as LOG messages sent to the client (client_min_messages = log); the lab captures them. Each call
runs inside BEGIN … ROLLBACK: once with plans only, once with ANALYZE and BUFFERS (which executes
the statement — hence the rollback)."""

from __future__ import annotations

import re
from typing import Any

from pgq_tools.lab.harness import Harness, Session, Step, Verdict
from pgq_tools.lab.statements import CLAIM, EPOCH, RECOVER

NUMBER = 8
SLUG = "query-plans"
TITLE = "Query plans of the claim and the sweep"
BASIS = (
    "“This command displays the execution plan that the PostgreSQL planner generates for the supplied "
    "statement.” “Keep in mind that the statement is actually executed when the ANALYZE option is used. […] "
    "If you wish to use EXPLAIN ANALYZE on an INSERT, UPDATE, DELETE, MERGE, CREATE TABLE AS, or EXECUTE "
    "statement without letting the command affect your data, use this approach: BEGIN; EXPLAIN ANALYZE …; "
    "ROLLBACK;” (EXPLAIN). auto_explain.log_nested_statements “causes nested statements (statements executed "
    "inside a function) to be considered for logging.” (auto_explain)"
)
HYPOTHESIS = (
    "On a table dominated by finished rows (100k done, 2k failed) with 5k scheduled jobs, the claim walks "
    "the partial index jobs_ready_idx and reads about batch rows; the expired-lease probe and the sweep "
    "read the partial index jobs_lease_idx and touch only expired leases. Plans are recorded, not assumed."
)
PROCEDURE = (
    "Fixture: 100,000 done + 2,000 failed rows (raw INSERT), 5,000 scheduled (run_at +1 h), 1,000 ready in "
    "'lab', 300 in 'mail' of which 200 claimed (lease 1 h), 50 running with expired leases (raw INSERT); "
    "VACUUM ANALYZE. With auto_explain (log_min_duration 0, log_nested_statements on): BEGIN; pgq.claim(batch "
    "10); ROLLBACK and BEGIN; pgq.sweep(); ROLLBACK — plans only, then again with ANALYZE, BUFFERS."
)
CONDITION = (
    "The claim's pick statement uses jobs_ready_idx and no sequential scan of pgq.jobs, reading at most "
    "batch rows per queue; the expired-lease probe and the recovery statement use jobs_lease_idx, reading at "
    "most the 50 expired rows; the rolled-back runs change nothing."
)

#: The fixture's rows are summarized in query-plans.txt rather than dumped into final-jobs.csv.
DUMP_JOBS = False

BATCH = 10
EXPIRED = 50

HISTORY = (
    "INSERT INTO pgq.jobs (queue, kind, payload, state, run_at, created_at, attempt, max_attempts,"
    " claimed_by, claimed_at, finished_at, last_event, last_error)"
    " SELECT 'lab', 'lab-history', jsonb_build_object('n', n), s.state::pgq.job_state, t, t, 1, 25,"
    " 'lab-history', t, t + interval '1 second', s.event, s.error"
    " FROM generate_series(1, 102000) AS n"
    " CROSS JOIN LATERAL (SELECT TIMESTAMPTZ '2025-01-01 00:00:00+00' + n * interval '1 second' AS t) AS x"
    " CROSS JOIN LATERAL (SELECT CASE WHEN n > 100000 THEN 'failed' ELSE 'done' END AS state,"
    " CASE WHEN n > 100000 THEN 'failed' ELSE 'completed' END AS event,"
    " CASE WHEN n > 100000 THEN 'synthetic failure' END AS error) AS s"
)
EXPIRED_LEASES = (
    "INSERT INTO pgq.jobs (queue, kind, payload, state, run_at, created_at, attempt, max_attempts,"
    " lease_until, claimed_by, claimed_at, last_event)"
    " SELECT 'mail', 'lab-crashed', jsonb_build_object('n', n), 'running', now() - interval '10 minutes',"
    " now() - interval '10 minutes', 1, 25, now() - interval '1 minute', 'lab-crashed-worker',"
    " now() - interval '2 minutes', 'claimed'"
    " FROM generate_series(1, %(n)s::integer) AS n"
)
ENQUEUE = (
    "SELECT count(*) AS enqueued FROM pgq.enqueue_many(queue => %(queue)s::text, kind => %(kind)s::text,"
    " payloads => array_fill('{}'::jsonb, ARRAY[%(n)s::integer]),"
    " run_at => coalesce(%(run_at)s::timestamptz, now() + interval '1 hour'))"
)
COUNTS = (
    "SELECT queue, kind, state::text AS state, count(*) AS n FROM pgq.jobs"
    " GROUP BY queue, kind, state ORDER BY queue, kind, state"
)

_DURATION = re.compile(r"^duration: ([\d.]+) ms\s+plan:\s*$")
_ACTUAL = re.compile(r"actual (?:time=[\d.]+\.\.[\d.]+ )?rows=(\d+(?:\.\d+)?) loops=(\d+)")  # PostgreSQL 18: rows=10.00


def _split(message: str) -> tuple[str, str]:
    """(query text, plan) of an auto_explain text-format message."""
    lines = message.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith("Query Text:")), 0)
    # The plan's top node is the first later line that is not indented and shows its cost.
    plan_at = next((i for i in range(start + 1, len(lines))
                    if not lines[i][:1].isspace() and "(cost=" in lines[i]), len(lines))
    return "\n".join(lines[start:plan_at]), "\n".join(lines[plan_at:])


def _kind(query: str) -> str:
    if "WITH picked AS" in query:
        return "claim: pick"
    if "WITH claimed AS" in query:
        return "claim: lease"
    if "WITH expired AS" in query:
        return "recovery of expired leases"
    # The claim reads its queues and probes for expired leases in one statement
    # (pgq._claim_queues, an SQL function the planner inlines into the claim's query).
    if "FROM pgq._claim_queues(" in query:
        return "claim: expired-lease probe"
    return "other"


def _uses(plan: str, index: str) -> bool:
    """Whether the plan reads `index` (index scan, index-only scan or bitmap index scan)."""
    return any(_scans_index(line, index) for line in plan.splitlines())


def _scans_index(line: str, index: str) -> bool:
    return f"using {index} " in line or f"Bitmap Index Scan on {index} " in line


def _index_rows(plan: str, index: str) -> list[int]:
    """Actual rows per loop of every scan of `index` in an ANALYZE plan."""
    rows = []
    for line in plan.splitlines():
        if _scans_index(line, index):
            m = _ACTUAL.search(line)
            if m:
                rows.append(round(float(m.group(1))))
    return rows


def _capture(h: Harness, session: Session, label: str, sql: str,
             params: dict[str, Any]) -> tuple[Step, list[dict[str, Any]]]:
    """Run one call inside BEGIN … ROLLBACK; return its step and the plans auto_explain logged. The
    lease floor a claim raises is a sequence, which the rollback leaves raised: it is lowered again
    first, so that each run finds the fixture's expired leases (written below it by hand)."""
    h.step(session, f"{label}_floor", "SELECT setval('pgq.lease_floor', 0)")
    h.step(session, f"{label}_begin", "BEGIN")
    mark = len(session.notices)
    step = h.step(session, label, sql, params)
    messages = [message for severity, message in session.notices[mark:] if severity == "LOG"]
    h.step(session, f"{label}_rollback", "ROLLBACK")
    stmts = []
    for msg in messages:
        query, plan = _split(msg)
        head = msg.splitlines()[0] if msg else ""
        m = _DURATION.match(head)
        stmts.append({"kind": _kind(query), "query": query, "plan": plan,
                      "duration_ms": float(m.group(1)) if m else None, "message": msg})
    return step, stmts


def run(h: Harness) -> Verdict:
    v = Verdict()
    h.fixture("enqueue_1000_ready", ENQUEUE, {"queue": "lab", "kind": "lab-ready", "n": 1000, "run_at": EPOCH})
    h.fixture("enqueue_5000_scheduled", ENQUEUE, {"queue": "lab", "kind": "lab-scheduled", "n": 5000, "run_at": None})
    h.fixture("enqueue_300_mail", ENQUEUE, {"queue": "mail", "kind": "lab-mail", "n": 300, "run_at": EPOCH})
    h.fixture("claim_200_mail", "SELECT count(*) AS claimed FROM pgq.claim(worker => 'lab-seed-worker',"
              " queues => ARRAY['mail'], batch => 200, lease => interval '1 hour')")
    h.fixture("insert_102000_finished", HISTORY)
    h.fixture("insert_50_expired_leases", EXPIRED_LEASES, {"n": EXPIRED})
    # Leases written into the past by hand lie below the lease floor the seed claim raised; a
    # worker's crash leaves them above it (the claim's probe reads from the floor up).
    h.fixture("lower_the_lease_floor", "SELECT setval('pgq.lease_floor', 0)")
    h.fixture("vacuum_analyze", "VACUUM (ANALYZE) pgq.jobs")
    obs = h.session("observer")
    counts_before = h.step(obs, "counts_before", COUNTS).dicts()
    events_before = h.step(obs, "events_before", "SELECT count(*) FROM pgq.job_events").value

    p = h.session("planner")
    for setting in ("LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0",
                    "SET auto_explain.log_nested_statements = on", "SET auto_explain.log_format = text",
                    "SET auto_explain.log_analyze = off", "SET client_min_messages = log"):
        s = h.step(p, "setup", setting)
        if not s.ok:
            raise RuntimeError(f"{setting}: {s.outcome} (auto_explain needs a superuser, or "
                               "session_preload_libraries = 'auto_explain')")
    claim_params = {"worker": "lab-plan", "queues": None, "batch": BATCH, "lease": None}
    runs = []
    runs.append(("pgq.claim — plan as chosen (no ANALYZE), rolled back",)
                + _capture(h, p, "claim_plan", CLAIM, claim_params))
    runs.append(("pgq.sweep — plan as chosen (no ANALYZE), rolled back",)
                + _capture(h, p, "sweep_plan", RECOVER, {"max_jobs": 1000}))
    for setting in ("SET auto_explain.log_analyze = on", "SET auto_explain.log_buffers = on",
                    "SET auto_explain.log_timing = on"):
        h.step(p, "setup", setting)
    runs.append(("pgq.claim — ANALYZE, BUFFERS, rolled back",) + _capture(h, p, "claim_analyze", CLAIM, claim_params))
    runs.append(("pgq.sweep — ANALYZE, BUFFERS, rolled back",)
                + _capture(h, p, "sweep_analyze", RECOVER, {"max_jobs": 1000}))
    counts_after = h.step(obs, "counts_after", COUNTS).dicts()
    events_after = h.step(obs, "events_after", "SELECT count(*) FROM pgq.job_events").value
    version = h.step(obs, "server_version", "SELECT version()").value

    def stmts(kind: str, analyze: bool | None = None) -> list[dict]:  # type: ignore[type-arg]
        out = []
        for title, _step, found in runs:
            if analyze is None or ("ANALYZE," in title) == analyze:
                out += [s for s in found if s["kind"] == kind]
        return out

    pick, probe = stmts("claim: pick"), stmts("claim: expired-lease probe")
    lease = stmts("claim: lease")
    recover = stmts("recovery of expired leases")
    seq = "Seq Scan on jobs"
    v.check("the claim's pick statement was captured and uses jobs_ready_idx, with no sequential scan of pgq.jobs",
            len(pick) == 2 and all(_uses(s["plan"], "jobs_ready_idx") and seq not in s["plan"] for s in pick),
            f"{len(pick)} captured; " + "; ".join(_scans(s["plan"]) for s in pick[:1]))
    v.check("the claim's lease statement was captured and reads its picks through jobs_pkey",
            len(lease) == 2 and all(_uses(s["plan"], "jobs_pkey") and seq not in s["plan"] for s in lease),
            f"{len(lease)} captured; " + "; ".join(_scans(s["plan"]) for s in lease[:1]))
    # Each of the two claims (plans only, then ANALYZE) runs its queues-and-probe statement twice:
    # with queues => NULL, the queues are read again once the expired leases are recovered.
    v.check("the claim's expired-lease probe uses jobs_lease_idx",
            len(probe) == 4 and all(_uses(s["plan"], "jobs_lease_idx") and seq not in s["plan"] for s in probe),
            f"{len(probe)} captured; " + "; ".join(_scans(s["plan"]) for s in probe[:1]))
    v.check("the recovery statement (sweep, and the claim's own recovery) uses jobs_lease_idx, no sequential scan",
            len(recover) == 4 and all(_uses(s["plan"], "jobs_lease_idx") and seq not in s["plan"] for s in recover),
            f"{len(recover)} captured; " + "; ".join(_scans(s["plan"]) for s in recover[:1]))
    ready_rows = [r for s in stmts("claim: pick", True) for r in _index_rows(s["plan"], "jobs_ready_idx")]
    lease_rows = [r for s in stmts("recovery of expired leases", True)
                  for r in _index_rows(s["plan"], "jobs_lease_idx")]
    v.check(f"ANALYZE: the claim read at most batch ({BATCH}) rows per queue from jobs_ready_idx",
            bool(ready_rows) and max(ready_rows) <= BATCH,
            f"rows per loop {ready_rows}, on {sum(r['n'] for r in counts_before):,} rows")
    v.check(f"ANALYZE: recovery read at most the {EXPIRED} expired leases from jobs_lease_idx (not the 200 live ones)",
            bool(lease_rows) and max(lease_rows) <= EXPIRED, f"rows {lease_rows}")
    claim_rows = [len(step.rows) for title, step, _ in runs if title.startswith("pgq.claim")]
    sweep_vals = [step.value for title, step, _ in runs if title.startswith("pgq.sweep")]
    v.check("the captured calls did their work (claim returned batch rows, sweep recovered the expired leases)",
            claim_rows == [BATCH, BATCH] and sweep_vals == [EXPIRED, EXPIRED],
            f"claim returned {claim_rows} rows, sweep returned {sweep_vals}")
    v.check("the rolled-back runs changed nothing (jobs by state and job_events unchanged)",
            counts_before == counts_after and events_before == events_after,
            f"{sum(r['n'] for r in counts_after)} jobs; job_events {events_before} -> {events_after}")

    text = [f"# Query plans of pgq.claim and pgq.sweep, captured by auto_explain ({version})", "",
            "Fixture (pgq.jobs by queue, kind, state):"]
    text += [f"  {r['queue']:<6} {r['kind']:<14} {r['state']:<10} {r['n']:>7}" for r in counts_before]
    text += ["", "Each call ran inside BEGIN … ROLLBACK. pgq.claim uses plan_cache_mode = force_generic_plan, so the",
             "plans below are the generic plans it executes ($n are its parameters).", ""]
    for title, step, found in runs:
        text += ["=" * 100, f"== {title}", f"== {step.sql}", f"== returned {len(step.rows)} row(s): "
                 + (str(step.value) if step.columns and step.columns[0] == 'recovered'
                    else f"{[r[0] for r in step.rows]}"),
                 "=" * 100]
        for plan in found:
            text += ["", f"-- [{plan['kind']}] duration {plan['duration_ms']} ms", plan["query"], plan["plan"]]
        text.append("")
    v.extra["query-plans.txt"] = "\n".join(text) + "\n"

    v.observe(("Claim pick: " + _scans(pick[0]["plan"]) + ".") if pick else "Claim pick: not captured.")
    v.observe(("Expired-lease probe: " + _scans(probe[0]["plan"]) + ".") if probe else "Probe: not captured.")
    v.observe(("Recovery (sweep): " + _scans(recover[0]["plan"]) + ".") if recover else "Recovery: not captured.")
    v.observe(f"ANALYZE rows per loop: jobs_ready_idx {ready_rows}, jobs_lease_idx {lease_rows}, on "
              f"{sum(r['n'] for r in counts_before):,} rows; claim returned {claim_rows}, sweep {sweep_vals}; "
              "rolled back: " + ("nothing changed." if counts_before == counts_after and events_before == events_after
                                 else "CHANGES LEFT."))
    # Recorded, not judged: how the recovery UPDATE joins the locked ids back to pgq.jobs.
    removed = [int(m) for s in stmts("recovery of expired leases", True)
               for m in re.findall(r"Rows Removed by Join Filter: (\d+)", s["plan"])]
    if removed:
        v.observe(f"The recovery UPDATE joined its {EXPIRED} locked ids back to pgq.jobs by a nested loop "
                  f"with a join filter: rows removed by join filter {removed}, for {EXPIRED} rows recovered "
                  f"(estimated rows for the expired-lease scan: {_estimates(recover, 'jobs_lease_idx')}).")
    return v


def _estimates(found: list[dict], index: str) -> list[int]:  # type: ignore[type-arg]
    """The planner's row estimates for the scans of `index` in the ANALYZE runs' plans."""
    out = []
    for s in found:
        for line in s["plan"].splitlines():
            m = re.search(r"\(cost=[\d.]+\.\.[\d.]+ rows=(\d+)", line)
            if m and "actual" in line and _scans_index(line, index):
                out.append(int(m.group(1)))
    return out


def _scans(plan: str) -> str:
    """The scan nodes of a plan, one phrase each."""
    scans = []
    for line in plan.splitlines():
        node = line.strip().removeprefix("->").strip()
        if re.match(r"(Parallel )?(Seq|Index|Index Only|Bitmap Heap|Bitmap Index) Scan", node):
            scans.append(node.split("  (")[0])
    return ", ".join(dict.fromkeys(scans)) or "no scan nodes"
