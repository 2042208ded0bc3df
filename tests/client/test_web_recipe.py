"""The web-app recipe of docs/web-apps.md (examples/starlette_app.py, shown there verbatim): an
AsyncWorker started by a Starlette app's lifespan, against a real PostgreSQL, through Starlette's
TestClient (which runs the lifespan): a request's enqueue is run by the app's own worker, and the
app's shutdown lets a running job finish before it returns."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import psycopg
from starlette.testclient import TestClient

from sqlhelpers import one, wait_for

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "starlette_app.py"
DOC = ROOT / "docs" / "web-apps.md"


def recipe() -> ModuleType:
    if "starlette_app" not in sys.modules:
        spec = importlib.util.spec_from_file_location("starlette_app", EXAMPLE)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["starlette_app"] = module
        spec.loader.exec_module(module)
    return sys.modules["starlette_app"]


def state(conn: psycopg.Connection, job_id: int) -> str:
    return str(one(conn, "SELECT state FROM pgq.jobs WHERE id = %s", (job_id,)))


def test_the_docs_show_the_tested_recipe() -> None:
    text = EXAMPLE.read_text(encoding="utf-8")
    assert f"```python\n{text}```" in DOC.read_text(encoding="utf-8")


def test_a_request_enqueues_and_the_apps_own_worker_runs_the_job(dsn: str, conn: psycopg.Connection) -> None:
    with TestClient(recipe().make_app(dsn)) as http:
        answer = http.post("/signup", json={"user_id": 42})
        assert answer.status_code == 202
        job_id = answer.json()["job_id"]
        wait_for(lambda: state(conn, job_id) == "done", "the app's worker to run the job")
    assert one(conn, "SELECT payload FROM pgq.jobs WHERE id = %s", (job_id,)) == {"user_id": 42}


def test_the_apps_shutdown_lets_a_running_job_finish_and_leaves_no_worker_behind(
        dsn: str, conn: psycopg.Connection) -> None:
    with TestClient(recipe().make_app(dsn)) as http:
        job_id = http.post("/signup", json={"user_id": 7}).json()["job_id"]
        wait_for(lambda: state(conn, job_id) == "running", "the app's worker to start the job")
    # The lifespan's exit returned only after the graceful stop: the job ran to its end, and the
    # worker's sessions are gone.
    assert state(conn, job_id) == "done"
    wait_for(lambda: one(conn, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                               " AND application_name LIKE 'pgq-%%'") == 0,
             "the worker's closed sessions to end (a backend exits just after its client closes)")
