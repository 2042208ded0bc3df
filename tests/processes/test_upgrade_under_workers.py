"""An upgrade while workers run: `pgq-thin worker` processes of the previous landed release (its code
exported from git) drain a queue while `pgq-thin migrate` of this checkout brings the schema to the
newest version. Nothing is lost, nothing is completed twice, no worker exits; and the migration
takes no lock that waits for a reader of any pgq table but pgq.jobs (a session holding ACCESS
SHARE on each of them, as any reader does, stays open through it: an ACCESS EXCLUSIVE lock, which
a table rewrite needs, would wait for it and fail the migrate after its lock_timeout). Migrations
0018 and 0019 create tables (0019 also renames the trigger of pgq.jobs); 0017 added columns to
pgq.jobs, which takes ACCESS EXCLUSIVE on it for an instant (tests/sql/test_upgrades.py holds that it
gives up behind a reader of pgq.jobs)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from pgq_tools import fleet

from sqlhelpers import fresh_database, one, wait_for

ROOT = Path(__file__).resolve().parents[2]
#: The newest commit of main before the schema version this checkout installs (migration 0018, at
#: 0017 there): the release whose workers are running when users upgrade to this one.
PREVIOUS = "8110847e7fee28baf8cf6e8d076bab1398593922"
#: Jobs of 0.1 s on 3 workers x 4 slots: about 10 s of draining, the migration in the middle of it.
JOBS, MORE = 1200, 300


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous release's files (git archive of PREVIOUS): its pgq_thin, migrations and apps."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.fail("this test needs the repository's git history (a clone, not an export): "
                    f"it runs the workers of commit {PREVIOUS}")
    out = tmp_path_factory.mktemp("previous")
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", PREVIOUS],
                             capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive.stdout, check=True)
    return out


def _old(previous: Path) -> dict[str, str]:
    """The environment that makes `python -m pgq_thin` the previous release's code."""
    return {"PYTHONPATH": str(previous), "PYTHONUNBUFFERED": "1"}


@pytest.fixture
def old_dsn(databases, previous_release: Path) -> Iterator[str]:
    """A database migrated by the previous release, as its users have it."""
    for dsn in fresh_database(databases, "template1"):
        subprocess.run([sys.executable, "-c", "import sys; from pgq_thin import migrate; migrate(sys.argv[1])", dsn],
                       cwd=previous_release, env={**os.environ, **_old(previous_release)}, check=True)
        yield dsn


@pytest.mark.slow
def test_workers_of_the_previous_release_drain_a_queue_while_it_is_migrated(
        old_dsn: str, previous_release: Path, tmp_path: Path) -> None:
    with psycopg.connect(old_dsn, autocommit=True) as conn:
        assert one(conn, "SELECT pgq.version()") == "17"
        # the old functions, not this source's
        assert one(conn, "SELECT to_regprocedure('pgq.retry_jobs(text, text, text, timestamptz, integer)') IS NULL")
        conn.execute("SELECT pgq.enqueue_many('upgrade', 'work', "
                     "array_fill('{\"seconds\": 0.1}'::jsonb, ARRAY[%s]))", (JOBS,))
        apps = previous_release / "tests" / "apps"
        workers = fleet.Fleet(tmp_path)
        try:
            for i in range(3):
                workers.start(f"old-{i}", [sys.executable, "-m", "pgq_thin", "worker", "--app", "steady:worker",
                                           "--dsn", old_dsn, "--queues", "upgrade", "--concurrency", "4"],
                              env=_old(previous_release), cwd=apps)
            wait_for(lambda: one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'done'") >= 100,
                     "the old workers to finish 100 jobs", timeout=120)
            started = one(conn, "SELECT clock_timestamp()")

            # A reader holds ACCESS SHARE on every pgq table but pgq.jobs through the whole migration.
            with psycopg.connect(old_dsn) as reader:
                for (table,) in reader.execute("SELECT c.oid::regclass::text FROM pg_class AS c "
                                               "WHERE c.relnamespace = 'pgq'::regnamespace AND c.relkind = 'r' "
                                               "AND c.relname <> 'jobs'"):
                    reader.execute(f"LOCK TABLE {table} IN ACCESS SHARE MODE")
                migrated = subprocess.run([sys.executable, "-m", "pgq_thin", "migrate", "--dsn", old_dsn],
                                          cwd=ROOT, capture_output=True, text=True, timeout=300)
                assert migrated.returncode == 0, migrated.stdout + migrated.stderr
                assert "0018" in migrated.stdout
                reader.rollback()
            ended = one(conn, "SELECT clock_timestamp()")
            newest = max(p.stem for p in (ROOT / "migrations").glob("*.sql"))  # (every migration since 0013 ran)
            assert one(conn, "SELECT pgq.version()") == str(int(newest[:4]))
            assert newest[:4] in migrated.stdout
            assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE claimed_at BETWEEN %s AND %s",
                       (started, ended)) > 0, "no job was claimed while the migration ran: it proved nothing"
            assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'pending'") > 0, \
                "the workers drained the queue during the migration: none is left for the new functions"

            # The old workers go on with the new functions: the rest, and jobs enqueued after.
            conn.execute("SELECT pgq.enqueue_many('upgrade', 'work', array_fill('{}'::jsonb, ARRAY[%s]))", (MORE,))
            wait_for(lambda: one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'done'") == JOBS + MORE,
                     "the old workers to finish every job", timeout=300)
            for name, worker in workers.procs.items():
                assert worker.alive, f"{name} exited:\n{worker.log_text()}"
        finally:
            workers.stop(timeout=60)
            workers.close()
        for name, worker in workers.procs.items():
            assert worker.process.returncode == 0, f"{name}:\n{worker.log_text()}"
            assert "Traceback" not in worker.log_text(), worker.log_text()
        assert one(conn, "SELECT count(*) FROM pgq.jobs") == JOBS + MORE
        assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'done'") == JOBS + MORE
        # Nothing completed twice: one completion per job, and no attempt beyond the first.
        assert conn.execute("SELECT job_id, count(*) FROM pgq.job_events WHERE event = 'completed' "
                            "GROUP BY job_id HAVING count(*) <> 1").fetchall() == []
        assert one(conn, "SELECT count(*) FROM pgq.job_events WHERE event = 'completed'") == JOBS + MORE
        assert one(conn, "SELECT max(attempt) FROM pgq.jobs") == 1
