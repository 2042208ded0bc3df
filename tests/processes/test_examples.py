"""The examples in examples/ (bash + psql, and Node.js with pg) run against a throwaway database.

The durable workflow (psql_workflow.sh, node_workflow.mjs: the same order workflow): each test
enqueues an order, runs the example in drain mode as often as the workflow needs (it exits when the
job sleeps or waits: the worker holds nothing), sends the approval, and reads the outcome, the
steps, the children and the events from the database, and from the log how often each step's body
ran.

The workers: each test enqueues jobs with SQL, runs one example as a real subprocess and reads the
outcome from the database: which jobs are done, failed or pending again, with which attempt, and
what pgq.job_events recorded. The waiters (psql_wait_result.sh, node_wait_result.mjs): each test
runs one as a subprocess that enqueues a job with notify_finished and LISTENs; the test claims and
ends the job from its own connection, as a worker would, and reads what the waiter printed.
Node.js tests install `pg` from the npm registry into a temporary copy of the examples once per
session, and are skipped where `node` or `npm` is not installed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from sqlhelpers import events, job, one, wait_for

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TIMEOUT = 120

# A payload that tries every way of breaking out of SQL quoting or the worker's line framing.
NASTY = "it's a \"quote\" \\ ; DROP TABLE pgq.jobs; -- :'x' $1 \t tab \n newline \x1f sep | pipe"


@pytest.mark.parametrize("name", ["psql_worker.sh", "node_worker.mjs"])
def test_a_worker_example_says_in_its_first_lines_that_a_job_must_finish_within_its_lease(name: str) -> None:
    """They do not renew leases (issue 42): a copied worker must not run a long job twice unwarned."""
    first = " ".join(line.lstrip("#/ ") for line in (EXAMPLES / name).read_text().splitlines()[:8])
    assert "A job must finish within its lease" in first and "runs twice" in first
    assert "pgq.renew(id, attempt)" in first


@pytest.fixture(scope="session")
def node_example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the Node.js example with its dependencies installed (once per session)."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are not installed")
    directory = tmp_path_factory.mktemp("node_example")
    for name in ("package.json", "node_worker.mjs", "node_wait_result.mjs", "node_workflow.mjs"):
        shutil.copy(EXAMPLES / name, directory / name)
    proc = subprocess.run(
        ["npm", "install", "--no-audit", "--no-fund", "--loglevel=error"],
        cwd=directory, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, f"npm install failed:\n{proc.stdout}\n{proc.stderr}"
    return directory


@pytest.fixture(params=["psql", "node"])
def worker_command(request: pytest.FixtureRequest) -> list[str]:
    """The command that starts one example worker in drain mode."""
    if request.param == "psql":
        if shutil.which("psql") is None:
            pytest.skip("psql is not installed")
        return ["bash", str(EXAMPLES / "psql_worker.sh"), "--drain"]
    directory: Path = request.getfixturevalue("node_example")
    return ["node", str(directory / "node_worker.mjs"), "--drain"]


def worker_env(dsn: str, **settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["DATABASE_URL"] = dsn
    env.update(settings)
    return env


def run_worker(command: list[str], dsn: str, **settings: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, env=worker_env(dsn, **settings), capture_output=True,
                          text=True, timeout=TIMEOUT)


def enqueue(conn: psycopg.Connection, queue: str, payload: dict[str, Any], **options: Any) -> int:
    named = "".join(f", {name} => %({name})s" for name in options)
    return int(one(conn, f"SELECT pgq.enqueue(%(queue)s, 'demo', %(payload)s::jsonb{named})",
                   {"queue": queue, "payload": Jsonb(payload), **options}))


def test_a_worker_completes_good_jobs_and_fails_bad_ones(
        worker_command: list[str], conn: psycopg.Connection, dsn: str) -> None:
    # A long backoff: the retried job must not come due again while the worker drains the queue.
    conn.execute("SELECT pgq.configure_queue('examples', backoff_base => '1 hour', backoff_cap => '1 hour')")
    good = [enqueue(conn, "examples", {"n": n}) for n in range(5)]
    nasty = enqueue(conn, "examples", {"text": NASTY})
    retryable = enqueue(conn, "examples", {"fail": True, "text": NASTY})
    final = enqueue(conn, "examples", {"fail": True}, max_attempts=1)
    not_really = enqueue(conn, "examples", {"fail": "true"})  # a string, not true: completes
    elsewhere = enqueue(conn, "other", {"n": 99})

    proc = run_worker(worker_command, dsn, QUEUE="examples", WORKER="w-example", BATCH="3")
    assert proc.returncode == 0, proc.stderr
    # The log says what became of each failure, in words.
    assert f"job {retryable} attempt 1: failed; it will be retried after its backoff" in proc.stderr
    assert f"job {final} attempt 1: failed for good (no attempts left)" in proc.stderr

    for job_id in good + [nasty, not_really]:
        row = job(conn, job_id)
        assert (row["state"], row["attempt"], row["claimed_by"]) == ("done", 1, "w-example")
        assert events(conn, job_id) == [("claimed", 1, "pending", "running"),
                                        ("completed", 1, "running", "done")]
    # A failure with attempts left is pending again after the queue's backoff.
    row = job(conn, retryable)
    assert (row["state"], row["attempt"], row["max_attempts"]) == ("pending", 1, 25)
    assert one(conn, "SELECT run_at > now() FROM pgq.jobs WHERE id = %s", (retryable,))
    assert "asked to fail" in row["last_error"]
    assert events(conn, retryable) == [("claimed", 1, "pending", "running"),
                                       ("failed", 1, "running", "pending")]
    # The last allowed attempt failed: failed for good, with the reason kept.
    row = job(conn, final)
    assert (row["state"], row["attempt"]) == ("failed", 1)
    assert "asked to fail" in row["last_error"]
    assert row["finished_at"] is not None
    # Another queue is not this worker's business.
    assert (job(conn, elsewhere)["state"], job(conn, elsewhere)["attempt"]) == ("pending", 0)
    assert one(conn, "SELECT count(*) FROM pgq.job_events WHERE event = 'rejected'") == 0


def test_the_payload_reaches_the_database_byte_for_byte(
        worker_command: list[str], conn: psycopg.Connection, dsn: str) -> None:
    """The error text quotes the payload: it must come back exactly, whatever it holds."""
    job_id = enqueue(conn, "examples", {"fail": True, "text": NASTY}, max_attempts=1)
    proc = run_worker(worker_command, dsn, QUEUE="examples")
    assert proc.returncode == 0, proc.stderr
    error = job(conn, job_id)["last_error"]
    # Both examples quote the payload as JSON text (jsonb's or JSON.stringify's).
    decoded = one(conn, "SELECT substring(%s FROM '(\\{.*\\})')::jsonb ->> 'text'", (error,))
    assert decoded == NASTY
    assert one(conn, "SELECT count(*) FROM pgq.jobs") == 1


@pytest.mark.slow
def test_a_worker_whose_lease_ran_out_cannot_complete_the_job(
        worker_command: list[str], conn: psycopg.Connection, dsn: str) -> None:
    """The stale completion is fenced off by the attempt: the new owner keeps the job."""
    # The job outlasts its 1-second lease by 5 s: the thief below must claim it after the lease
    # ran out and before the worker completes; 2 s of room (sleep 3) was thin on a loaded machine.
    job_id = enqueue(conn, "examples", {"sleep": 6})
    worker = subprocess.Popen(worker_command, env=worker_env(dsn, QUEUE="examples", WORKER="slow",
                                                              LEASE="1 second"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: job(conn, job_id)["state"] == "running", "the worker claimed the job")
        wait_for(lambda: one(conn, "SELECT lease_until < now() FROM pgq.jobs WHERE id = %s",
                               (job_id,)), "the lease expired")
        stolen = one(conn, "SELECT attempt FROM pgq.claim('thief', ARRAY['examples'])")
        assert stolen == 2
        _, stderr = worker.communicate(timeout=TIMEOUT)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert worker.returncode == 0, stderr
    assert "not ours any more, completion rejected" in stderr

    row = job(conn, job_id)
    assert (row["state"], row["attempt"], row["claimed_by"]) == ("running", 2, "thief")
    assert events(conn, job_id) == [
        ("claimed", 1, "pending", "running"),
        ("lease_expired", 1, "running", "pending"),
        ("claimed", 2, "pending", "running"),
        ("rejected", 1, "running", None),
    ]
    note = one(conn, "SELECT note FROM pgq.job_events WHERE job_id = %s AND event = 'rejected'",
               (job_id,))
    assert note.startswith("complete from attempt 1 rejected")
    # The new owner's attempt is the valid one.
    assert one(conn, "SELECT pgq.complete(%s, 2)", (job_id,)) is True


@pytest.mark.slow
def test_a_stopping_worker_finishes_the_job_at_hand_and_releases_the_rest(
        worker_command: list[str], conn: psycopg.Connection, dsn: str) -> None:
    # SIGTERM must arrive while the first job runs (else the worker does the rest too): 5 s of
    # room, not 2, for a loaded machine between seeing the batch claimed and the signal.
    first = enqueue(conn, "examples", {"sleep": 5}, priority=10)
    rest = [enqueue(conn, "examples", {"n": n}) for n in range(2)]
    worker = subprocess.Popen(worker_command, env=worker_env(dsn, QUEUE="examples", BATCH="3"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: all(job(conn, i)["state"] == "running" for i in [first, *rest]),
                   "the worker claimed the batch")
        worker.send_signal(signal.SIGTERM)
        _, stderr = worker.communicate(timeout=TIMEOUT)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert worker.returncode == 0, stderr

    assert (job(conn, first)["state"], job(conn, first)["attempt"]) == ("done", 1)
    for job_id in rest:
        row = job(conn, job_id)
        # Given back unstarted: pending, and the attempt it used is not counted against it.
        assert (row["state"], row["attempt"], row["max_attempts"]) == ("pending", 1, 26)
        assert events(conn, job_id)[-1] == ("released", 1, "running", "pending")


def test_an_idle_polling_worker_stops_on_sigterm(
        worker_command: list[str], conn: psycopg.Connection, dsn: str) -> None:
    """Without --drain the worker polls; it picks up a job enqueued later, and SIGTERM ends it."""
    command = [arg for arg in worker_command if arg != "--drain"]
    worker = subprocess.Popen(command, env=worker_env(dsn, QUEUE="examples", POLL_INTERVAL="0.2"),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)
        job_id = enqueue(conn, "examples", {"n": 1})
        wait_for(lambda: job(conn, job_id)["state"] == "done", "the polling worker did the job")
        worker.send_signal(signal.SIGTERM)
        _, stderr = worker.communicate(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert worker.returncode == 0, stderr
    assert "exiting after 1 jobs" in stderr


def test_a_drained_worker_on_an_empty_queue_exits_at_once(
        worker_command: list[str], dsn: str) -> None:
    proc = run_worker(worker_command, dsn, QUEUE="nothing-here")
    assert proc.returncode == 0, proc.stderr
    assert "exiting after 0 jobs" in proc.stderr


def test_a_bad_setting_is_refused_by_pgq_and_the_worker_exits_non_zero(
        worker_command: list[str], dsn: str) -> None:
    proc = run_worker(worker_command, dsn, QUEUE="examples", BATCH="5000")
    assert proc.returncode != 0
    assert 'argument "batch" must be between 1 and 1000' in proc.stderr
    if worker_command[0] == "node":
        assert "(SQLSTATE 22023)" in proc.stderr


def test_the_node_worker_labels_a_connection_error_as_node_s_own_code(node_example: Path) -> None:
    proc = run_worker(["node", str(node_example / "node_worker.mjs"), "--drain"],
                      "postgresql://nobody@127.0.0.1:1/nowhere")
    assert proc.returncode == 1
    assert "(Node error code ECONNREFUSED)" in proc.stderr and "SQLSTATE" not in proc.stderr


def test_the_psql_worker_reads_its_database_from_pgq_dsn_first(dsn: str) -> None:
    if shutil.which("psql") is None:
        pytest.skip("psql is not installed")
    proc = run_worker(["bash", str(EXAMPLES / "psql_worker.sh"), "--drain"],
                      "postgresql://nobody@127.0.0.1:1/nowhere", PGQ_DSN=dsn)
    assert proc.returncode == 0, proc.stderr


def test_the_node_worker_reads_its_database_from_pgq_dsn_first(node_example: Path, dsn: str) -> None:
    proc = run_worker(["node", str(node_example / "node_worker.mjs"), "--drain"],
                      "postgresql://nobody@127.0.0.1:1/nowhere", PGQ_DSN=dsn)
    assert proc.returncode == 0, proc.stderr


# The waiters: enqueue with notify_finished, LISTEN pgq_finished, read pgq.job_result ---------------


@pytest.fixture(params=["psql", "node"])
def waiter_command(request: pytest.FixtureRequest) -> list[str]:
    """The command that starts one example waiter (arguments follow)."""
    if request.param == "psql":
        if shutil.which("psql") is None:
            pytest.skip("psql is not installed")
        return ["bash", str(EXAMPLES / "psql_wait_result.sh")]
    directory: Path = request.getfixturevalue("node_example")
    return ["node", str(directory / "node_wait_result.mjs")]


def start_waiter(command: list[str], dsn: str, *args: str, **settings: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*command, *args], env=worker_env(dsn, **settings),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(waiter: subprocess.Popen[str]) -> tuple[str, str]:
    try:
        return waiter.communicate(timeout=TIMEOUT)
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait()


def the_job_it_enqueued(conn: psycopg.Connection, queue: str) -> int:
    """The id of the one job in ``queue``, once the waiter (LISTENing since before) enqueued it."""
    return int(wait_for(lambda: one(conn, "SELECT max(id) FROM pgq.jobs WHERE queue = %s", (queue,)),
                        f"the waiter's job in {queue}"))


def claimed(conn: psycopg.Connection, queue: str) -> tuple[int, int]:
    row = conn.execute("SELECT id, attempt FROM pgq.claim('example-worker', ARRAY[%s::text])", (queue,)).fetchone()
    assert row is not None, f"nothing to claim in {queue}"
    return int(row[0]), int(row[1])


def printed(stdout: str) -> dict[str, Any]:
    lines = stdout.strip().splitlines()
    assert len(lines) == 1, stdout
    return dict(json.loads(lines[0]))


def test_a_waiter_prints_the_result_once_a_worker_completes_its_job(
        waiter_command: list[str], conn: psycopg.Connection, dsn: str) -> None:
    payload = {"text": NASTY, "n": 7}
    waiter = start_waiter(waiter_command, dsn, "--timeout", "60", QUEUE="results", KIND="report",
                          PAYLOAD=json.dumps(payload))
    try:
        job_id = the_job_it_enqueued(conn, "results")
        row = job(conn, job_id)
        assert (row["kind"], row["payload"], row["notify_finished"], row["state"]) == (
            "report", payload, True, "pending")
        # Another job's end on the channel is not the waiter's: it keeps waiting for its own.
        other = enqueue(conn, "results-other", {"n": 1}, notify_finished=True)
        other_id, other_attempt = claimed(conn, "results-other")
        assert other_id == other
        assert one(conn, "SELECT pgq.complete(%s, %s, '{\"other\": true}')", (other_id, other_attempt))
        # A worker completes the waiter's job, from another connection.
        claimed_id, attempt = claimed(conn, "results")
        assert claimed_id == job_id
        result = {"rows": 3, "text": NASTY}
        assert one(conn, "SELECT pgq.complete(%s, %s, %s)", (job_id, attempt, Jsonb(result))) is True
        stdout, stderr = finish(waiter)
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait()
    assert waiter.returncode == 0, stderr
    assert f"enqueued job {job_id} (queue results, kind report)" in stderr
    out = printed(stdout)
    finished_at = job(conn, job_id)["finished_at"]
    assert (out["id"], out["state"], out["result"], out["last_error"]) == (job_id, "done", result, None)
    assert one(conn, "SELECT %s::timestamptz = %s", (out["finished_at"], finished_at))


def test_a_waiter_whose_job_fails_for_good_prints_the_error_and_exits_1(
        waiter_command: list[str], conn: psycopg.Connection, dsn: str) -> None:
    waiter = start_waiter(waiter_command, dsn, "--timeout", "60", QUEUE="results")
    try:
        job_id = the_job_it_enqueued(conn, "results")
        claimed_id, attempt = claimed(conn, "results")
        assert one(conn, "SELECT pgq.fail(%s, %s, %s, retryable => false)",
                   (claimed_id, attempt, "no such report: " + NASTY)) == "failed"
        stdout, stderr = finish(waiter)
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait()
    assert waiter.returncode == 1, stderr
    assert f"job {job_id} ended failed" in stderr
    out = printed(stdout)
    assert (out["id"], out["state"], out["result"], out["last_error"]) == (
        job_id, "failed", None, "no such report: " + NASTY)


def test_a_waiter_sees_a_job_that_ended_before_it_listened(
        waiter_command: list[str], conn: psycopg.Connection, dsn: str) -> None:
    """--job ID LISTENs after the job's end was notified: its read after LISTEN finds the result."""
    job_id = enqueue(conn, "results", {"n": 1}, notify_finished=True)
    claimed_id, attempt = claimed(conn, "results")
    assert one(conn, "SELECT pgq.complete(%s, %s, '{\"early\": true}')", (claimed_id, attempt)) is True
    waiter = start_waiter(waiter_command, dsn, "--job", str(job_id))
    stdout, stderr = finish(waiter)
    assert waiter.returncode == 0, stderr
    assert printed(stdout)["result"] == {"early": True}
    assert "waiting" not in stderr


def test_a_waiter_on_a_cancelled_job_exits_1(
        waiter_command: list[str], conn: psycopg.Connection, dsn: str) -> None:
    job_id = enqueue(conn, "results", {"n": 1}, notify_finished=True)
    waiter = start_waiter(waiter_command, dsn, "--job", str(job_id), "--timeout", "60")
    try:
        # Cancelled while the waiter may or may not be listening yet: either way it sees the end.
        assert one(conn, "SELECT pgq.cancel(%s)", (job_id,)) is True
        stdout, stderr = finish(waiter)
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait()
    assert waiter.returncode == 1, stderr
    assert printed(stdout)["state"] == "cancelled"


def test_a_waiter_that_times_out_names_the_job_and_its_state(
        waiter_command: list[str], conn: psycopg.Connection, dsn: str) -> None:
    job_id = enqueue(conn, "results", {"n": 1}, notify_finished=True)
    waiter = start_waiter(waiter_command, dsn, "--job", str(job_id), "--timeout", "0.3")
    stdout, stderr = finish(waiter)
    assert waiter.returncode == 3, stderr
    assert stdout == ""
    assert f"job {job_id} is still pending" in stderr


def test_a_waiter_refuses_a_bad_job_id_and_reports_an_unknown_one(
        waiter_command: list[str], dsn: str) -> None:
    waiter = start_waiter(waiter_command, dsn, "--job", "12; DROP TABLE pgq.jobs")
    _, stderr = finish(waiter)
    assert waiter.returncode == 2 and "--job takes a job id" in stderr
    # An id the login may not read is answered as unknown (P0002): an error, exit status 1 with
    # nothing on stdout (a job that ended badly prints its outcome).
    waiter = start_waiter(waiter_command, dsn, "--job", "999999", "--timeout", "5")
    stdout, stderr = finish(waiter)
    assert waiter.returncode == 1 and stdout == "", stderr
    assert "no job with id 999999" in stderr


# The durable workflow (issue 39): psql_workflow.sh and node_workflow.mjs ---------------------------

@pytest.fixture(params=["psql", "node"])
def workflow_command(request: pytest.FixtureRequest) -> list[str]:
    """The command that runs one example workflow worker in drain mode."""
    if request.param == "psql":
        if shutil.which("psql") is None:
            pytest.skip("psql is not installed")
        return ["bash", str(EXAMPLES / "psql_workflow.sh"), "--drain"]
    directory: Path = request.getfixturevalue("node_example")
    return ["node", str(directory / "node_workflow.mjs"), "--drain"]


def ran(log: str, step: str) -> int:
    """How many times a step's body ran, by the workers' log lines."""
    return sum(1 for line in log.splitlines() if line.endswith(f": step {step} ran"))


def test_the_workflow_runs_each_step_once_and_parks_while_it_sleeps_waits_and_awaits_its_children(
        workflow_command: list[str], conn: psycopg.Connection, dsn: str) -> None:
    order = one(conn, "SELECT pgq.enqueue('orders', 'fulfil_order', '{\"order\": 7}')")
    settings = {"COOL_OFF": "1 second", "WORKER": "w-flow"}
    logs = ""

    def work() -> None:
        nonlocal logs
        proc = run_worker(workflow_command, dsn, **settings)
        assert proc.returncode == 0, proc.stderr
        logs += proc.stderr

    work()  # the reservation, then the durable sleep: the job sleeps, the worker drains and exits
    row = job(conn, order)
    assert (row["state"], row["lease_until"], row["last_event"]) == ("pending", None, "snoozed")
    assert one(conn, "SELECT run_at > now() FROM pgq.jobs WHERE id = %s", (order,))
    wait_for(lambda: one(conn, "SELECT run_at <= now() FROM pgq.jobs WHERE id = %s", (order,)),
             "the cool-off to pass")
    work()  # awake: it waits for the approval, holding nothing
    row = job(conn, order)
    assert (row["state"], row["wait_signal"], row["lease_until"]) == ("waiting", "approved:7", None)
    assert one(conn, "SELECT pgq.signal('orders', 'approved:7', '{\"by\": \"ann\"}')") == 1
    work()  # approved: two children, awaited; they run, the order is released, invoiced and done
    row = job(conn, order)
    assert row["state"] == "done", row
    assert row["result"] == {"order": 7, "approved_by": "ann",
                             "packed": [{"item": 1, "packed": True}, {"item": 2, "packed": True}]}
    # Four attempts ran the handler from the top; the three that parked gave their attempt back.
    assert (row["attempt"], row["max_attempts"]) == (4, 25 + 3)
    assert (ran(logs, "reserve"), ran(logs, "invoice")) == (1, 1)
    names = [r[0] for r in conn.execute("SELECT name FROM pgq.job_steps(%s)", (order,))]
    assert names == ["cool-off", "invoice", "pack-1", "pack-2", "reserve", "signal:approved:7"]
    children = conn.execute("SELECT kind, state, workflow_id, parent_id FROM pgq.jobs WHERE id <> %s ORDER BY id",
                            (order,)).fetchall()
    assert children == [("pack_item", "done", order, order)] * 2
    assert [e[0] for e in events(conn, order)] == [
        "claimed", "snoozed", "claimed", "awaiting_signal", "signalled", "claimed", "awaiting_jobs",
        "dependencies_done", "claimed", "completed"]
    assert one(conn, "SELECT count(*) FROM pgq.job_events WHERE event = 'rejected'") == 0


def test_the_workflow_fails_the_order_when_its_approval_times_out(
        workflow_command: list[str], conn: psycopg.Connection, dsn: str) -> None:
    order = one(conn, "SELECT pgq.enqueue('orders', 'fulfil_order', '{\"order\": 8}')")
    settings = {"COOL_OFF": "1 millisecond", "APPROVAL_TIMEOUT": "1 second"}
    proc = run_worker(workflow_command, dsn, **settings)
    assert proc.returncode == 0, proc.stderr
    wait_for(lambda: one(conn, "SELECT run_at <= now() FROM pgq.jobs WHERE id = %s", (order,)), "the cool-off")
    proc = run_worker(workflow_command, dsn, **settings)
    assert proc.returncode == 0, proc.stderr
    assert job(conn, order)["state"] == "waiting"
    # The timeout fires in a settle (a Python worker calls pgq.settle_dependencies every second).
    wait_for(lambda: one(conn, "SELECT wake_at <= now() FROM pgq.jobs WHERE id = %s", (order,)), "the timeout")
    assert one(conn, "SELECT pgq.settle_dependencies()") == 1
    proc = run_worker(workflow_command, dsn, **settings)
    assert proc.returncode == 0, proc.stderr
    assert "no approval in time" in proc.stderr
    row = job(conn, order)
    assert (row["state"], row["last_error"]) == ("failed", "not approved in time")
    assert one(conn, "SELECT pgq.signal('orders', 'approved:8')") == 0
