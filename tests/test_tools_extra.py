"""Without the dev extra, the development tools' commands say in one line what to install; without
the testing extra, pytest runs as before and a test that uses pgq's fixtures says what to install.

The environment without an extra is real: a directory holding every installed package of this
venv except the extra's distributions (matplotlib, testing.postgresql) and their metadata, and a
Python started with -S (no site-packages) that has only that directory on its path."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from pgq_thin.testing.plugin import INSTALL
from pgq_thin.tools import dev_requirements

SITE = Path(sysconfig.get_paths()["purelib"])


def environment(tmp_path: Path, leave_out: tuple[str, ...]) -> Path:
    packages = tmp_path / "site"
    packages.mkdir()
    for entry in SITE.iterdir():
        if not entry.name.lower().startswith(leave_out):
            (packages / entry.name).symlink_to(entry)
    return packages


def run(packages: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(packages)}
    return subprocess.run([sys.executable, "-S", *args], capture_output=True, text=True, timeout=120,
                          env=env, cwd=cwd)


def test_the_dev_extra_names_what_the_tools_need() -> None:
    assert dev_requirements() == ["matplotlib", "testing-postgresql"]


@pytest.mark.parametrize("command", [["demo"], ["bench", "--out", "x"], ["soak"], ["lab", "--out", "x"]])
@pytest.mark.parametrize(("leave_out", "missing"), [("matplotlib", "matplotlib"), ("testing", "testing-postgresql")])
def test_a_tool_without_the_dev_extra_prints_one_line_saying_what_to_install(
        tmp_path: Path, command: list[str], leave_out: str, missing: str) -> None:
    packages = environment(tmp_path, leave_out=(leave_out,))
    result = run(packages, "-m", "pgq_thin", *command, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert result.stderr == (f"pgq-thin: {command[0]} is a development tool and needs the dev extra "
                             f"(missing: {missing}): pip install 'pgq-thin[dev]'\n")


def test_without_the_testing_extra_pytest_runs_and_pgq_dsn_says_what_to_install(tmp_path: Path) -> None:
    packages = environment(tmp_path, leave_out=("testing", "pg8000"))
    (tmp_path / "test_user.py").write_text("def test_plain():\n    pass\n\n\n"
                                           "def test_with_the_kit(pgq_dsn):\n    pass\n")
    result = run(packages, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_user.py", cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 passed, 1 error" in result.stdout
    assert INSTALL in result.stdout


def test_the_same_environment_with_the_extra_passes_the_check(tmp_path: Path) -> None:
    packages = environment(tmp_path, leave_out=())
    result = run(packages, "-c", "from pgq_thin.tools import missing_dev_requirements as m; print(m())",
                 cwd=tmp_path)
    assert result.returncode == 0 and result.stdout == "[]\n", result.stderr


def test_the_runtime_without_the_extra_still_works(tmp_path: Path, dsn: str) -> None:
    packages = environment(tmp_path, leave_out=("matplotlib",))
    result = run(packages, "-m", "pgq_thin", "enqueue", "q", "k", "--dsn", dsn, cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.strip().isdigit(), result.stderr
