"""Experiment 14: a durable workflow killed at every step boundary and inside every step.

A job of five steps, each ``ctx.step(..., transaction=True)`` of a real pgq_thin Worker process
(concurrency 1, a 1-second lease), whose body writes one row of lab_step_runs in the transaction
that records the step. Each attempt stops at its place in turn (attempt 2k + 1 at step boundary
k: before step 1, between each two steps, after step 5; attempt 2n inside step n's transaction,
after its write, before its record) and the experiment kills its process with SIGKILL there; a
new worker process reclaims the job once the lease has passed, and runs the handler from the top."""

from __future__ import annotations

import functools
import os
import shutil
import sys
import tempfile
import time
from typing import Any

import psycopg

from pgq_tools.fleet import WorkerProcess
from pgq_tools.lab.durable_worker import QUEUE, STEPS
from pgq_tools.lab.harness import Harness, Verdict, sqlv

NUMBER = 14
SLUG = "durable-kill"
TITLE = "Durable steps killed at every step boundary and inside every step"
BASIS = (
    "“COMMIT commits the current transaction. All changes made by the transaction become visible to others and "
    "are guaranteed to be durable if a crash occurs” (COMMIT), and a transaction that has not committed when its "
    "session dies is rolled back (Transactions, 3.4: all or nothing). A row a transaction writes carries its "
    "transaction id, xmin (System Columns, 5.6)."
)
HYPOTHESIS = (
    "A step whose own write and pgq.record_step commit in one transaction is done exactly when its record "
    "exists: whatever instant the worker process dies, a later attempt finds every recorded step (pgq.get_step) "
    "and runs only the others, so each step's body takes effect once and the workflow ends done."
)
PROCEDURE = (
    f"configure_queue({QUEUE}, backoff 10 ms); enqueue(five_steps, max_attempts 20). Eleven times: start a worker "
    "process (python -m pgq_tools.lab.durable_worker: Worker(concurrency 1, lease 1 s), handler: ctx.step(step-n, "
    "body, transaction=True) for n = 1..5, the body INSERTs a lab_step_runs row); attempt 2k + 1 stops at step "
    "boundary k, attempt 2n inside step n's transaction (after its INSERT, before pgq.record_step), and writes a "
    "lab_stops row on a connection of its own; the experiment sees it and kills the process (SIGKILL). A twelfth "
    "process then runs the job to its end and is stopped with SIGTERM."
)
CONDITION = (
    "The worker process was killed by SIGKILL at each of the six step boundaries and inside each of the five "
    "steps, by attempts 1 to 11 in turn; each step's body committed exactly once (one lab_step_runs row per step), "
    "step n by attempt 2n + 1, its row and its record (pgq.steps) written by one transaction, and no write of an "
    "attempt killed inside a step committed; the job ended done at attempt 12 with the five recorded results; 11 "
    "lease_expired events; the last worker exited 0."
)

#: Where attempt a (1..KILLS) is killed: boundary (a - 1) / 2 when a is odd, inside step a / 2 when even.
PLACES = [("boundary", (a - 1) // 2) if a % 2 else ("inside", a // 2) for a in range(1, 2 * STEPS + 2)]
KILLS = len(PLACES)  # 11: six boundaries (0: before step 1, 5: after step 5) and five steps
TABLES = ("CREATE TABLE lab_step_runs (job_id bigint NOT NULL, step integer NOT NULL, attempt integer NOT NULL,"
          " pid integer NOT NULL); CREATE TABLE lab_stops (job_id bigint NOT NULL, attempt integer NOT NULL,"
          " place text NOT NULL, step integer NOT NULL, pid integer NOT NULL)")
CONFIGURE = (f"SELECT name FROM pgq.configure_queue(queue => '{QUEUE}', backoff_base => '10 milliseconds',"
             " backoff_cap => '10 milliseconds')")
ENQUEUE = (f"SELECT pgq.enqueue(queue => '{QUEUE}', kind => 'five_steps', payload => %(payload)s::jsonb,"
           " max_attempts => 20) AS id")
STOP = "SELECT place, step, pid FROM lab_stops WHERE job_id = %(id)s AND attempt = %(attempt)s"
RUNS = "SELECT step, attempt, pid, xmin::text AS xmin FROM lab_step_runs WHERE job_id = %(id)s ORDER BY step, attempt"
RECORDS = ("SELECT name, attempt, result, xmin::text AS xmin FROM pgq.steps WHERE job_id = %(id)s"
           " ORDER BY name")
JOB = "SELECT state::text AS state, attempt, result FROM pgq.jobs WHERE id = %(id)s"
EXPIRED = "SELECT count(*) FROM pgq.job_events WHERE job_id = %(id)s AND event = 'lease_expired'"

#: How long the experiment waits for a worker process to reach a boundary, or the job to end.
PATIENCE = 30.0


def _child_env() -> dict[str, str]:
    """The worker process imports pgq_thin and pgq_tools as this process does."""
    path = [p for p in sys.path if p]
    return {"PYTHONPATH": os.pathsep.join(path), "PYTHONUNBUFFERED": "1"}


def _until(dsn: str, sql: str, params: dict[str, Any], timeout: float = PATIENCE) -> Any:
    """The first row ``sql`` returns, polled every 20 ms; None after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            row = conn.execute(sql, params).fetchone()
            if row is not None or time.monotonic() > deadline:
                return row
            time.sleep(0.02)


def _killed(process: WorkerProcess) -> int | None:
    """kill -9 the process and reap it: its exit status (-9)."""
    process.kill()
    return process.process.returncode


def observation(kills: list[dict[str, Any]], runs: list[dict[str, Any]], final: dict[str, Any],
                expired: int, last_exit: int | None) -> str:
    killed = ", ".join(f"attempt {k['attempt']} {k['place']} {sqlv(k['step'])} (exit {sqlv(k['exit'])})"
                       for k in kills)
    per_step = {n: [r["attempt"] for r in runs if r["step"] == n] for n in range(1, STEPS + 1)}
    ran = "; ".join(f"step-{n} committed {len(a)}x (attempts {a})" for n, a in per_step.items())
    return (f"The worker process was killed {len(kills)} times: {killed}. {ran}. The job ended {final.get('state')} "
            f"at attempt {final.get('attempt')} with {len((final.get('result') or {}).get('steps', []))} step "
            f"results; {expired} lease_expired events; the last worker exited {sqlv(last_exit)}.")


def run(h: Harness) -> Verdict:
    v = Verdict()
    for statement in TABLES.split("; "):
        h.fixture("create_table", statement)
    h.fixture("configure_queue", CONFIGURE)
    job_id = h.fixture("enqueue_workflow", ENQUEUE, {"payload": f'{{"kills": {KILLS}}}'}).value
    operator, obs = h.session("operator"), h.session("observer")
    logs = tempfile.mkdtemp(prefix="pgq-lab-14-")
    started: list[WorkerProcess] = []

    def spawn(n: int) -> WorkerProcess:
        command = [sys.executable, "-m", "pgq_tools.lab.durable_worker", h.dsn, f"lab-durable-{n}"]
        process = WorkerProcess(command, os.path.join(logs, f"worker-{n}.log"), env=_child_env())
        started.append(process)
        return process

    kills: list[dict[str, Any]] = []
    last_exit: int | None = None
    try:
        for attempt, (place, step) in enumerate(PLACES, 1):
            process = spawn(attempt)
            h.step(operator, f"start_worker_{attempt}", fn=lambda: started[-1].pid,
                   describe=f"start worker process {attempt}")
            seen = h.step(operator, f"wait_stop_{attempt}", timeout=PATIENCE + 5,
                          fn=functools.partial(_until, h.dsn, STOP, {"id": job_id, "attempt": attempt}),
                          describe=f"wait for attempt {attempt} to stop {place} step {step}")
            h.step(operator, f"kill_worker_{attempt}", fn=functools.partial(_killed, process),
                   describe=f"kill -9 worker process {attempt}")
            stop = seen.value
            kills.append({"attempt": attempt, "place": None if stop is None else stop[0],
                          "step": None if stop is None else stop[1],
                          "pid_matches": stop is not None and stop[2] == process.pid,
                          "exit": process.process.returncode})
            if stop is None:
                h.note(f"attempt {attempt} never stopped {place} step {step}; its worker's log:\n"
                       f"{process.log_text()[-3000:]}")
                break
        if len(kills) == KILLS and all(k["place"] is not None for k in kills):
            last = spawn(KILLS + 1)
            h.step(operator, "start_worker_last", fn=lambda: last.pid, describe="start the last worker process")
            h.step(operator, "wait_done", timeout=PATIENCE + 5, describe="wait for the job to end",
                   fn=lambda: _until(h.dsn, "SELECT state FROM pgq.jobs WHERE id = %(id)s AND state IN "
                                            "('done', 'failed', 'cancelled')", {"id": job_id}))
            h.step(operator, "stop_last", fn=lambda: last.stop(timeout=20), describe="SIGTERM the last worker")
            last_exit = last.process.returncode
            if last_exit != 0:
                h.note(f"the last worker's log:\n{last.log_text()[-3000:]}")
    finally:
        for process in started:
            process.close()
        shutil.rmtree(logs, ignore_errors=True)

    runs = h.step(obs, "obs_step_runs", RUNS, {"id": job_id}).dicts()
    records = h.step(obs, "obs_step_records", RECORDS, {"id": job_id}).dicts()
    final = (h.step(obs, "obs_job", JOB, {"id": job_id}).dicts() or [{}])[0]
    expired = h.step(obs, "obs_lease_expired", EXPIRED, {"id": job_id}).value
    for r in runs:
        h.note(f"step-{r['step']} ran in attempt {r['attempt']} (pid {r['pid']}, xmin {r['xmin']})")

    v.check("the worker process was killed (SIGKILL) at each of the six step boundaries and inside each of the five "
            "steps, by attempts 1 to 11 in turn",
            [(k["attempt"], k["place"], k["step"], k["exit"]) for k in kills]
            == [(a, place, step, -9) for a, (place, step) in enumerate(PLACES, 1)]
            and all(k["pid_matches"] for k in kills),
            "; ".join(f"attempt {k['attempt']}: {sqlv(k['place'])} {sqlv(k['step'])}, exit {sqlv(k['exit'])}"
                      for k in kills))
    v.check("each step's body committed exactly once, step n by attempt 2n + 1",
            [(r["step"], r["attempt"]) for r in runs] == [(n, 2 * n + 1) for n in range(1, STEPS + 1)],
            f"committed runs (step, attempt): {[(r['step'], r['attempt']) for r in runs]}")
    v.check("no write of an attempt killed inside a step's transaction committed",
            not any(r["attempt"] % 2 == 0 for r in runs),
            f"attempts with a committed write: {sorted({r['attempt'] for r in runs})}")
    xmins = {f"step-{r['step']}": r["xmin"] for r in runs}
    v.check("each step's write and its record were committed by one transaction",
            len(records) == STEPS and all(xmins.get(rec["name"]) == rec["xmin"] for rec in records),
            f"records {[(rec['name'], rec['attempt'], rec['xmin']) for rec in records]}, runs' xmin {xmins}")
    expected = [{"step": n, "attempt": 2 * n + 1} for n in range(1, STEPS + 1)]
    v.check("the workflow ended done at attempt 12 with the five recorded results",
            final.get("state") == "done" and final.get("attempt") == KILLS + 1
            and (final.get("result") or {}).get("steps") == expected,
            f"{final.get('state')} at attempt {final.get('attempt')}, result {final.get('result')}")
    v.check("each killed attempt's lease expired and the next attempt reclaimed the job (11 lease_expired)",
            expired == KILLS, f"{expired} lease_expired events")
    v.check("the last worker shut down cleanly (exit 0)", last_exit == 0, f"exit {sqlv(last_exit)}")
    v.observe(observation(kills, runs, final, expired, last_exit))
    return v
