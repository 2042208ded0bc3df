"""yoyo alone applies pgq's migrations (issue 42): a team that does not use Python (Go, Node) runs
yoyo's own command from a venv that holds yoyo and psycopg only, no pgq_thin, and gets the whole
schema, functions included, in a checkout's layout (migrations/ beside sql/) and in the installed
package's (pgq_thin/_migrations beside pgq_thin/_sql); a migrations directory copied alone stops
with one sentence saying what to run. Before, the post-apply hook imported pgq_thin and yoyo
stopped with ModuleNotFoundError.

The venv is made once per machine (under the user's cache directory, keyed by the Python version)
and reused; pip's own cache makes a new one quick."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg
import pytest

from pgq_thin.migrate import shipped_schema_version, yoyo_url

from catalogkit import assert_same_catalog, catalog
from sqlhelpers import one

ROOT = Path(__file__).resolve().parents[2]
#: What the venv holds: yoyo's command and a driver for its postgresql+psycopg:// URLs.
REQUIREMENTS = ["yoyo-migrations", "psycopg[binary]"]


def yoyo_only_venv() -> Path:
    """A venv that holds REQUIREMENTS only, made once: built aside, then renamed into place (two
    test processes making it at once both succeed; one keeps its own)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pgq-thin-tests"
    venv = cache / f"yoyo-only-py{sys.version_info.major}{sys.version_info.minor}"
    if (venv / "bin" / "yoyo").is_file():
        return venv
    cache.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix="yoyo-only-", dir=cache))
    subprocess.run([sys.executable, "-m", "venv", str(building)], check=True, timeout=300)
    subprocess.run([str(building / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    *REQUIREMENTS], check=True, timeout=600)
    try:
        building.rename(venv)
    except OSError:  # made meanwhile by another process
        shutil.rmtree(building, ignore_errors=True)
    return venv


@pytest.fixture(scope="module")
def venv() -> Path:
    made = yoyo_only_venv()
    imported = subprocess.run([str(made / "bin" / "python"), "-c", "import pgq_thin"], capture_output=True,
                              text=True, env=_clean_env(), cwd="/")
    assert "No module named 'pgq_thin'" in imported.stderr, "the venv must not hold pgq_thin"
    return made


def _clean_env() -> dict[str, str]:
    """This environment without what would let the venv import pgq_thin from the checkout."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}


def yoyo_apply(venv: Path, migrations: Path, dsn: str) -> subprocess.CompletedProcess[str]:
    # python -m yoyo: the venv's scripts' first lines name the directory it was built in.
    command = [str(venv / "bin" / "python"), "-m", "yoyo", "apply", "--batch", "--no-config-file",
               "--database", yoyo_url(dsn), str(migrations)]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=_clean_env(), cwd="/")


def a_job_runs(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        job_id = one(conn, "SELECT pgq.enqueue('mail', 'send', '{\"to\": \"ada\"}')")
        claimed = conn.execute("SELECT id, attempt FROM pgq.claim('w', '{mail}')").fetchall()
        assert [row[0] for row in claimed] == [job_id]
        assert one(conn, "SELECT pgq.complete(%s, %s)", claimed[0]) is True


def test_yoyo_without_pgq_thin_applies_the_whole_schema_from_a_checkout(venv: Path, dsn: str,
                                                                        empty_dsn: str) -> None:
    done = yoyo_apply(venv, ROOT / "migrations", empty_dsn)
    assert done.returncode == 0, done.stderr
    assert_same_catalog(catalog(dsn), catalog(empty_dsn))  # what pgq-thin migrate builds
    a_job_runs(empty_dsn)


def test_yoyo_without_pgq_thin_applies_the_schema_from_the_installed_layout(
        venv: Path, empty_dsn: str, tmp_path: Path) -> None:
    """The wheel force-includes migrations/ as pgq_thin/_migrations and sql/ as pgq_thin/_sql
    (pyproject.toml): the hook finds the function source there too."""
    package = tmp_path / "site-packages" / "pgq_thin"
    shutil.copytree(ROOT / "migrations", package / "_migrations")
    (package / "_sql").mkdir()
    shutil.copy(ROOT / "sql" / "all_functions.sql", package / "_sql" / "all_functions.sql")
    done = yoyo_apply(venv, package / "_migrations", empty_dsn)
    assert done.returncode == 0, done.stderr
    with psycopg.connect(empty_dsn) as conn:
        assert one(conn, "SELECT pgq.version()") == str(shipped_schema_version())
    a_job_runs(empty_dsn)


def test_migrations_copied_without_the_functions_stop_with_one_sentence_saying_what_to_run(
        venv: Path, empty_dsn: str, tmp_path: Path) -> None:
    shutil.copytree(ROOT / "migrations", tmp_path / "migrations")
    done = yoyo_apply(venv, tmp_path / "migrations", empty_dsn)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"pgq's migrations were applied, but its functions were not: {tmp_path / 'migrations'} has no "
        "sql/all_functions.sql beside it; apply that file from the same pgq release "
        "(psql -1 -v ON_ERROR_STOP=1 -f sql/all_functions.sql) or run `pgq-thin migrate`.")
