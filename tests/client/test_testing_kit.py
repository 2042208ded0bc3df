"""pgq_thin.testing, as a user's project meets it: the pytest plugin found through its entry point
in a fresh pytest process (pytester's runpytest_subprocess), its fixtures, and drain()."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import pgq_thin

USER_TESTS = '''
from datetime import datetime, timedelta, timezone

from pgq_thin.testing import drain
from pgq_thin.worker import Worker

worker = Worker(queues=["mail"], concurrency=2)
sent = []


@worker.handler("welcome")
def welcome(job, ctx):
    sent.append(job.payload["to"])
    return {"sent": job.payload["to"]}


@worker.handler("bounce")
def bounce(job, ctx):
    raise RuntimeError("smtp said no")


def test_a_job_is_run_and_its_result_stored(pgq_client):
    job_id = pgq_client.enqueue("mail", "welcome", {"to": "ada"})
    result = drain(worker)
    assert result.outcomes == {job_id: "done"}
    assert result[job_id].result == {"sent": "ada"}
    assert sent == ["ada"]
    assert pgq_client.get_job(job_id).state == "done"


def test_each_test_has_a_database_of_its_own_and_the_same_worker_drains_again(pgq_client):
    assert pgq_client.stats() == []  # nothing of the test before
    first = pgq_client.enqueue("mail", "welcome", {"to": "bob"})
    assert drain(worker).done == [first]
    second = pgq_client.enqueue("mail", "welcome", {"to": "cy"})
    assert drain(worker).done == [second]


def test_failures_and_retries_are_told_apart(pgq_client):
    last_try = pgq_client.enqueue("mail", "bounce", {}, max_attempts=1)
    again = pgq_client.enqueue("mail", "bounce", {}, max_attempts=3)
    later = pgq_client.enqueue("mail", "welcome", {"to": "dee"},
                               run_at=datetime.now(timezone.utc) + timedelta(hours=1))
    result = drain(worker)
    assert result.outcomes == {last_try: "failed", again: "retried"}  # the job due later did not run
    assert "smtp said no" in result[last_try].error and result.retried == [again]
    assert pgq_client.get_job(later).state == "pending"


def test_a_job_of_a_kind_the_worker_has_no_handler_for_is_left_alone(pgq_client):
    other = pgq_client.enqueue("mail", "newsletter", {})  # another worker's kind
    mine = pgq_client.enqueue("mail", "welcome", {"to": "eve"})
    assert drain(worker).outcomes == {mine: "done"}
    assert pgq_client.get_job(other).state == "pending" and pgq_client.get_job(other).attempt == 0


def test_the_dsn_fixture_is_a_migrated_database(pgq_dsn):
    import psycopg

    with psycopg.connect(pgq_dsn) as conn:
        assert conn.execute("SELECT pgq.version()").fetchone()[0].isdigit()
    assert drain(worker, dsn=pgq_dsn).jobs == {}


def test_a_drain_that_cannot_finish_says_what_was_left(pgq_client):
    import pytest
    from pgq_thin.testing import DrainTimeout
    from pgq_thin.worker import Worker

    stuck = Worker(queues=["slow"], concurrency=1)

    @stuck.handler("sleep")
    def sleep(job, ctx):
        ctx.lease_lost.wait(2)

    pgq_client.enqueue("slow", "sleep", {})
    with pytest.raises(DrainTimeout, match=r"slow: 0 due, 1 running"):
        drain(stuck, timeout=0.5)
'''


@pytest.mark.slow  # a pytest process and a throwaway server of its own
def test_a_users_tests_enqueue_drain_and_assert(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_user=USER_TESTS)
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=6)


@pytest.mark.slow  # a pytest process and a throwaway server of its own
def test_the_docs_example_test_passes_as_written(pytester: pytest.Pytester) -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "testing.md").read_text()
    example = page.split("```python\n", 1)[1].split("```", 1)[0]
    pytester.makepyfile(test_welcome=example)
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)


def test_with_pgq_test_dsn_the_databases_are_made_on_that_server(
        pytester: pytest.Pytester, admin_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from psycopg.conninfo import conninfo_to_dict

    port = conninfo_to_dict(admin_dsn)["port"]
    pytester.makepyfile(test_user=f'''
from psycopg.conninfo import conninfo_to_dict

def test_on_the_given_server(pgq_dsn, pgq_client):
    assert conninfo_to_dict(pgq_dsn)["port"] == "{port}"
    assert pgq_client.enqueue("q", "k") > 0
''')
    monkeypatch.setenv("PGQ_TEST_DSN", admin_dsn)
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


@pytest.mark.slow  # a pytest process and a throwaway server of its own
def test_the_plugin_starts_nothing_until_a_fixture_is_used(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_user='''
import os

def children():
    me = str(os.getpid())
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[1] == me:
                    found.append(pid)
        except OSError:
            pass
    return found

def test_plain():
    assert children() == []  # no server was started for a test that uses no pgq fixture

def test_then_one_that_uses_it(pgq_dsn):
    assert children() != []  # the throwaway server, started for this test
''')
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(passed=2)


def test_the_plugin_imports_only_the_runtime_dependencies() -> None:
    # What importing the plugin adds (a venv's *-nspkg.pth may import a namespace at start-up).
    code = ("import sys; before = set(sys.modules); import pgq_thin.testing.plugin; "
            "added = {m.split('.')[0] for m in set(sys.modules) - before}; "
            "print(sorted(added & {'testing', 'matplotlib', 'hypothesis', 'pg8000'}), 'psycopg' in added)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd="/")
    assert result.returncode == 0 and result.stdout == "[] True\n", result.stderr


def test_the_plugin_is_registered_as_a_pytest11_entry_point() -> None:
    from importlib.metadata import entry_points

    assert [e.value for e in entry_points(group="pytest11") if e.name == "pgq"] == ["pgq_thin.testing.plugin"]


@pytest.mark.slow  # a pytest process and a throwaway server of its own
@pytest.mark.skipif(not hasattr(pgq_thin, "AsyncWorker"),
                    reason="pgq_thin.AsyncWorker is built on branch issue-14w and not merged here yet")
def test_adrain_runs_an_async_workers_jobs(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_user='''
import asyncio
from pgq_thin import AsyncWorker
from pgq_thin.testing import adrain

worker = AsyncWorker(queues=["mail"], concurrency=2)

@worker.handler("welcome")
async def welcome(job, ctx):
    await asyncio.sleep(0)
    return {"to": job.payload["to"]}

def test_async(pgq_client):
    job_id = pgq_client.enqueue("mail", "welcome", {"to": "ada"})
    result = asyncio.run(adrain(worker))
    assert result.outcomes == {job_id: "done"} and result[job_id].result == {"to": "ada"}
''')
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert os.environ.get("PGQ_TEST_DSN") is None
