"""The acceptance lab: every experiment must PASS against the real pgq functions, and run_lab must
write the complete evidence package."""

from __future__ import annotations

import csv
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import ModuleType

import psycopg
import pytest

from pgq_tools.lab import (
    EXPERIMENTS,
    exp2_lock_modes,
    exp4_starvation,
    exp5_long_work,
    exp6_abandoned_claim,
    exp11_key_limits,
    exp13_batches,
    exp14_durable_kill,
    exp15_priority_aging,
    run_experiment,
    run_lab,
)
from pgq_tools.lab.harness import Harness, Step
from pgq_tools.lab.report import COMMON_FILES, STEP_COLUMNS, schema_line
from pgq_tools.lab.statements import TEMPLATES


@pytest.mark.parametrize("module", EXPERIMENTS, ids=lambda m: f"{m.NUMBER}-{m.SLUG}")
def test_experiment_passes(module: ModuleType, dsn: str) -> None:
    result = run_experiment(module, dsn)
    problems = [f"{c.label}: {c.observed}" for c in result.failures()]
    assert result.error is None, result.error
    assert result.passed, "\n".join(problems)
    assert result.verdict.observation, "an experiment must write its observation from the data"


@pytest.mark.slow
def test_run_lab_writes_the_evidence_package_with_a_pass_row_per_experiment(
        tmp_path: Path, pg_server, admin_dsn: str) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "evidence"
    rc = run_lab(str(out), dsn=pg_server.dsn_for("postgres"))
    failed = [line for line in (out / "acceptance.md").read_text().splitlines() if "FAIL" in line]
    assert rc == 0, "\n".join(failed)

    expected = list(COMMON_FILES) + [f"experiment-{m.NUMBER}-{m.SLUG}.{ext}" for m in EXPERIMENTS
                                     for ext in ("csv", "txt")]
    missing = [name for name in expected if not (out / name).is_file() or (out / name).stat().st_size == 0]
    assert not missing, f"missing or empty evidence files: {missing}"

    acceptance = (out / "acceptance.md").read_text()
    rows = [line for line in acceptance.splitlines() if re.match(r"^\| \d+ \|", line)]
    assert len(rows) == len(EXPERIMENTS) == 15
    assert all(line.rstrip().endswith("| PASS |") for line in rows), rows
    assert "not observed" not in acceptance and "not executed" not in acceptance.lower()
    assert re.search(r"PostgreSQL \d+", acceptance) and "duration" in acceptance

    with (out / "experiment-2-lock-modes.csv").open() as f:
        log = list(csv.DictReader(f))
    assert list(log[0]) == list(STEP_COLUMNS)
    assert any(re.fullmatch(r"blocked by worker-a \(.+\) then ok", r["outcome"]) for r in log)
    assert any("error 55P03" in r["outcome"] for r in log)

    assert "CREATE FUNCTION pgq.claim" in (out / "schema.sql").read_text()
    # The evidence list says what schema.sql is (pg_dump works in the test clusters).
    assert "pg_dump --schema-only --schema=pgq` of the migrated template" in acceptance
    assert "pgq.claim(worker =>" in (out / "claim.sql").read_text()
    assert "pgq.complete(id =>" in (out / "complete.sql").read_text()
    assert "pgq.sweep(max_jobs =>" in (out / "recover.sql").read_text()
    assert "enqueue_many" in (out / "seed.sql").read_text()
    assert "jobs_ready_idx" in (out / "query-plans.txt").read_text()
    assert ",rejected," in (out / "job-events.csv").read_text()
    assert "experiment-3-ordering" in (out / "final-jobs.csv").read_text()

    # The lab dropped every database it created.
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        left = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE 'pgq_lab_%'").fetchall()
    assert left == []


# Observations come from the data: fed another outcome, the text changes ---------------------------


def _step(name: str, *, rows: list | None = None, blocked_by: list[str] | None = None,  # type: ignore[type-arg]
          waits: list[str] | None = None, sqlstate: str | None = None, ms: float = 2.0) -> Step:
    t0 = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
    step = Step(seq=1, session="s", name=name, sql="-- test", started_at=t0, ended_at=t0 + timedelta(milliseconds=ms))
    step.columns, step.rows = ["id"], [(r,) for r in (rows or [])]
    if blocked_by:
        step.blocked_at, step.blocked_by, step.blocked_on = t0, blocked_by, "transactionid ShareLock"
    step.lock_waits = waits or []
    step.sqlstate = sqlstate
    return step


def test_experiment_2s_observation_says_blocked_when_pgq_claim_waited() -> None:
    def text(claim: Step) -> str:
        return " ".join(exp2_lock_modes.observation(
            1, _step("for_update", rows=[1], blocked_by=["worker-a"], ms=40), _step("skip", rows=[2]), claim,
            _step("nowait", sqlstate="55P03"), _step("after", rows=[1]),
            _step("table", rows=[3], blocked_by=["admin"], ms=30)))

    calm = text(_step("claim", rows=[2]))
    assert "pgq.claim returned [2] in 2.0 ms and did not wait on a lock" in calm
    waited = text(_step("claim", rows=[2], ms=9, waits=[
        "process 1 still waiting for ShareLock on transaction 7 after 1.0 ms",
        "process 1 acquired ShareLock on transaction 7 after 6.5 ms"]))
    assert "pgq.claim returned [2] in 9.0 ms and waited 6 ms on a lock" in waited
    assert "did not wait on a lock (ok); NOWAIT" not in waited


def test_experiment_4s_observation_counts_what_the_rounds_took() -> None:
    a = {"oldest": 5, "after": [5], "remaining": [5, 30], "blocked": 0, "rounds": 3, "calls": 6, "taken": 18,
         "newer": 18, "workers": 2, "batch": 3}
    b = {"rounds": 5, "oldest_round": 3, "min_depth": 30, "overtakes": 0, "originals": 30, "claimed_originals": 30,
         "locked_rounds": 2, "arrivals": 6}
    assert "(6 pgq.claim calls) took 18 jobs, 18 of them newer" in exp4_starvation.observation(a, b)[0]
    short = exp4_starvation.observation({**a, "calls": 4, "taken": 7, "newer": 7, "rounds": 2, "blocked": 1},
                                        {**b, "claimed_originals": 29, "locked_rounds": 1})
    assert "2 rounds of 2 SKIP LOCKED claims of up to 3 (4 pgq.claim calls) took 7 jobs, 7 of them newer" in short[0]
    assert "(1 calls waited on a lock)" in short[0]
    assert "29 of 30 originals" in short[1] and "locked for round 1 was" in short[1]


def test_experiment_11s_observation_reports_the_counts_it_saw() -> None:
    a = {"first": [(1, "a"), (2, "a")], "second": {"(none)": 4, "b": 2, "big": 4}, "third": 3,
         "third_state": "pending", "running": {"a": 2}}
    b = {"rounds": 10, "max_seen": {"big": 4, "p": 2}, "claims": 40, "jobs": 40, "over_rounds": 0, "blocked": 0,
         "workers": 4, "states": {"done": 40}}
    text = exp11_key_limits.observation(a, b)
    assert "job 3 (the third of key a) stayed pending" in text[0]
    assert "drained 40 jobs in 10 rounds (40 jobs claimed; 0 claim calls" in text[1] and "0 rounds over" in text[1]
    worse = exp11_key_limits.observation({**a, "third_state": "running"},
                                         {**b, "over_rounds": 3, "max_seen": {"p": 3}, "claims": 41})
    assert "stayed running" in worse[0]
    assert "(41 jobs claimed;" in worse[1] and "{'p': 3}; 3 rounds over a limit" in worse[1]


def test_experiment_13s_observation_reports_the_callbacks_and_counts_it_saw() -> None:
    a = {"batch": 1, "members": 1000, "by_producer": 950, "by_handlers": 50, "states": {"done": 900, "failed": 100},
         "rounds": 26, "end_rounds": 250, "close": "ok", "close_value": True, "close_round": "A_end_14_3",
         "late": "error 55000: batch 1 is sealed", "before_sweep": 1, "callbacks": 1, "early": 0, "twice": 0,
         "samples": 250, "meta": {"id": 1, "members": 1000}, "by": "the transaction of a member's end",
         "status": "finished"}
    b = {"gather": 2000, "parts": 50, "failed": 5, "rounds": 4, "released": "pending", "by": "the last part's end",
         "early": 0, "pages": [20, 20, 10], "rows": 50, "mismatched": 0, "stale": "error 55000: not yours",
         "result": {"sum_of_squares": 1}}
    text = exp13_batches.observation(a, b)
    assert "batch 1 got 1000 members (950 from the producer, 50 added by members' handlers" in text[0]
    assert "Callback jobs: 1 after the drain, 1 after a sweep (0 early and 0 double" in text[0]
    assert "enqueued by the transaction of a member's end" in text[0]
    assert "read 50 dependency results in pages [20, 20, 10], 0 differing" in text[1]
    worse_a = {**a, "before_sweep": 0, "callbacks": 2, "twice": 3, "by": "neither", "close_round": "",
               "close_value": False}
    worse = exp13_batches.observation(worse_a, {**b, "rows": 40, "pages": [20, 20], "mismatched": 7})
    assert "Callback jobs: 0 after the drain, 2 after a sweep (0 early and 3 double" in worse[0]
    assert "enqueued by neither" in worse[0] and "(after the drain)" in worse[0] and "→ false" in worse[0]
    assert "read 40 dependency results in pages [20, 20], 7 differing" in worse[1]


def test_experiment_14s_observation_reports_the_kills_and_the_runs_it_saw() -> None:
    kills = [{"attempt": a, "place": place, "step": step, "exit": -9}
             for a, (place, step) in enumerate(exp14_durable_kill.PLACES, 1)]
    runs = [{"step": n, "attempt": 2 * n + 1} for n in range(1, 6)]
    final = {"state": "done", "attempt": 12, "result": {"steps": [{}] * 5}}
    text = exp14_durable_kill.observation(kills, runs, final, 11, 0)
    assert "killed 11 times: attempt 1 boundary 0 (exit -9), attempt 2 inside 1 (exit -9)" in text
    assert "step-3 committed 1x (attempts [7])" in text and "ended done at attempt 12 with 5 step results" in text
    assert "11 lease_expired events; the last worker exited 0." in text
    worse = exp14_durable_kill.observation(kills[:2], [*runs, {"step": 3, "attempt": 6}], {"state": "failed",
                                           "attempt": 20, "result": None}, 2, None)
    assert "killed 2 times" in worse and "step-3 committed 2x (attempts [7, 6])" in worse
    assert "ended failed at attempt 20 with 0 step results" in worse
    assert "2 lease_expired events; the last worker exited NULL" in worse


def test_experiment_15s_observation_reports_the_waits_it_saw() -> None:
    facts = {"rounds": 40, "full": {"aging": 40, "strict": 40}, "claimed": 480, "distinct": 480,
             "aging": [timedelta(seconds=60)] * 9, "strict": [None] * 9}
    text = exp15_priority_aging.observation(facts)
    assert "9 of 9 priority-0 jobs were claimed, the longest after 60s" in text and "in `strict` 0 of 9 were" in text
    worse = exp15_priority_aging.observation({**facts, "aging": [timedelta(seconds=80), None], "claimed": 481})
    assert "1 of 2 priority-0 jobs were claimed, the longest after 80s (waits ['80s', 'never'])" in worse
    assert "481 claims of 480 distinct jobs" in worse


def test_experiment_5s_observation_reports_the_probes_measured_wait() -> None:
    def mode(probe: Step, hold_open: bool) -> dict:  # type: ignore[type-arg]
        return {"job": 1, "work_ms": 600.0, "state": "idle in transaction" if hold_open else "idle", "probe": probe,
                "stats": {"running": 0 if hold_open else 1, "pending": 3 if hold_open else 2},
                "other": _step("other", rows=[2]), "other_ids": [2], "hold_open": hold_open}

    blocked = _step("probe", rows=[1], blocked_by=["worker-a-B"], ms=590, waits=[
        "process 9 still waiting for ShareLock on transaction 8 after 1.0 ms",
        "process 9 acquired ShareLock on transaction 8 after 587.3 ms"])
    a_text, b_text = exp5_long_work.observation(mode(_step("probe", rows=[1]), False), mode(blocked, True))
    assert "did not wait (no lock wait of 1 ms or more reported)" in a_text
    assert "waited 587.3 ms for worker-a's lock" in b_text
    # Mode A with a wait: the sentence says so.
    a_text, _ = exp5_long_work.observation(mode(blocked, False), mode(blocked, True))
    assert a_text.startswith("A (claim committed, then the work") and "waited 587.3 ms" in a_text


def test_experiment_6s_observation_says_who_recovered_the_other_job() -> None:
    facts = {"j1": 1, "j2": 2, "after_z": {"state": "pending", "attempt": 0}, "z_events": 0, "a_ids": [1, 2],
             "early": [], "swept": 1, "sweeps": 1, "j2_by_claim": True, "j2_after_sweep": "running",
             "b_rows": [(1, 2), (2, 2)], "late": [False, False], "late_renew": None, "rejected": 3,
             "b_done": [True, True], "final": [(1, "done", 2), (2, "done", 2)]}
    by_claim = exp6_abandoned_claim.observation(facts)[0]
    assert "worker-b's pgq.claim recovered job 2" in by_claim and "(1 sweep call(s) in the run)" in by_claim
    other = exp6_abandoned_claim.observation({**facts, "j2_by_claim": False, "sweeps": 2, "swept": 2,
                                              "j2_after_sweep": "pending"})[0]
    assert "recovered job 2" not in other and "NOT recovered by worker-b's claim" in other
    assert "pgq.sweep recovered 2 (2 sweep call(s) in the run)" in other


def test_experiment_4s_observation_matches_its_step_log(dsn: str) -> None:
    """The counts in the sentence are the counts of the steps it ran."""
    result = run_experiment(exp4_starvation, dsn)
    part_a = [s for s in result.steps if s.template == "claim" and s.round.startswith("A")]
    taken = sum(len(s.rows) for s in part_a)
    text = " ".join(result.verdict.observation)
    assert f"({len(part_a)} pgq.claim calls) took {taken} jobs" in text, text


def test_experiment_5_fails_when_mode_a_holds_its_claim_transaction_open(dsn: str) -> None:
    """The anti-pattern in the mode meant to avoid it must fail its checks."""
    with Harness(dsn, experiment="5-anti-pattern", templates=TEMPLATES) as h:
        verdict = exp5_long_work.run(h, a_holds_open=True)
    failed = {c.label for c in verdict.checks if not c.passed}
    assert "A: another session locking the claimed row during the work did not wait at all" in failed, verdict.checks
    assert "A: during the work worker-a had no open transaction (pg_stat_activity state 'idle')" in failed
    assert not verdict.passed


def test_the_evidence_list_says_whether_schema_sql_is_a_dump_or_the_shipped_copy() -> None:
    assert "pg_dump --schema-only" in schema_line("pg_dump")
    shipped = schema_line("shipped")
    assert "shipped" in shipped and "not a dump" in shipped and "pg_dump --schema-only" not in shipped
