"""docs/tutorial.md ("Your first worker") runs as written: its shell steps, its worker module and
its transactional enqueue, in order, against a fresh database without pgq (the install step is
the one thing left out: this test's pgq_thin is the one installed). Each block is read from the page,
so a change to the tutorial that breaks a step breaks this test."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from sqlhelpers import one, wait_for

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = ROOT / "docs" / "tutorial.md"


def step(number: int) -> str:
    """The text of step ``number`` (its heading ``## N. ...`` up to the next heading)."""
    page = TUTORIAL.read_text(encoding="utf-8")
    return re.split(r"\n## ", page.split(f"\n## {number}. ", 1)[1], maxsplit=1)[0]


def blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def shell(script: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run a block of the tutorial with bash; ``pgq-thin`` is this interpreter's pgq_thin."""
    prelude = f'set -e\npgq-thin() {{ "{sys.executable}" -m pgq_thin "$@"; }}\n'
    return subprocess.run(["bash", "-c", prelude + script], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.slow  # a worker process and several commands
def test_the_tutorial_runs_as_written(empty_dsn: str, tmp_path: Path) -> None:
    env = {**os.environ, "DATABASE_URL": empty_dsn,
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("PGQ_DSN", None)
    # 2. Install the schema (the export names the reader's database: here, the test's).
    migrate = "\n".join(line for line in blocks(step(2), "sh")[0].splitlines() if not line.startswith("export "))
    done = shell(migrate + "\n" + migrate, env, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    # 3. Enqueue a job, from the command line and from psql.
    done = shell(blocks(step(3), "sh")[0], env, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[0].strip() == "1"
    # 4. The worker module.
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "__init__.py").write_text("")
    (tmp_path / "myapp" / "jobs.py").write_text(blocks(step(4), "python")[0])
    # 5. Run it, and see it done.
    command = blocks(step(5), "sh")[0].strip()
    assert command.startswith("pgq-thin worker ")
    worker = subprocess.Popen([sys.executable, "-m", "pgq_thin", *command.split()[1:]], env=env, cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        with psycopg.connect(empty_dsn, autocommit=True) as conn:
            def done_jobs() -> int:
                return int(one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'done'"))

            wait_for(lambda: done_jobs() == 2 or worker.poll() is not None, "the worker to run both jobs")
            assert worker.poll() is None
            looked = shell(blocks(step(5), "sh")[1], env, tmp_path)
            assert looked.returncode == 0, looked.stdout + looked.stderr
            assert '"sent": true' in looked.stdout
            wait_for(lambda: done_jobs() == 3, "the worker to run the job enqueued while it runs")
            # 6. Enqueue with your own data: the job is in the transaction of the user's row.
            done = subprocess.run([sys.executable, "-c", blocks(step(6), "python")[0]], env=env, cwd=tmp_path,
                                  capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stdout + done.stderr
            wait_for(lambda: done_jobs() == 4, "the job enqueued with the user's row")
            assert one(conn, "SELECT count(*) FROM users") == 1
            assert one(conn, "SELECT payload->>'user_id' FROM pgq.jobs WHERE id = 4") == "45"
        worker.send_signal(signal.SIGINT)
        output = worker.communicate(timeout=60)[0]
        assert worker.returncode == 0, output
        assert "welcoming user 42 (job 1, attempt 1)" in output
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
