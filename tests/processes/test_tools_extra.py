"""Without pgq's development tools (tools/: the distribution pgq-tools, beside the library), or
without what they need, their commands say in one line what to install; without the testing extra,
pytest runs as before and a test that uses pgq's fixtures says what to install.

The environment without them is real: a directory holding every installed package of this venv
except the ones left out (pgq_tools, matplotlib, testing.postgresql) and their metadata, and a
Python started with -S (no site-packages) that has only that directory on its path (and the
directory this run's pgq_thin comes from, when that is a checkout rather than the venv)."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import pgq_thin
import pgq_tools
from pgq_thin.cli import TOOLS_INSTALL
from pgq_thin.testing.plugin import INSTALL
from pgq_tools import requirements

SITE = Path(sysconfig.get_paths()["purelib"])
#: Where this run's pgq_thin comes from: the venv (scripts/test.sh), or a checkout on PYTHONPATH.
LIBRARY = Path(pgq_thin.__file__).resolve().parent.parent
TOOLS = ["demo"], ["bench", "--out", "x"], ["soak"], ["lab", "--out", "x"]


def installed(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


#: The requirement checks read the tools' installed metadata (scripts/test.sh installs them).
needs_installed_tools = pytest.mark.skipif(not installed("pgq-tools"),
                                           reason="pgq-tools is not installed in this venv (scripts/test.sh "
                                                  "installs it): its metadata lists what the tools need")


def environment(tmp_path: Path, leave_out: tuple[str, ...]) -> Path:
    packages = tmp_path / "site"
    packages.mkdir()
    for entry in SITE.iterdir():
        if not entry.name.lower().startswith(leave_out):
            (packages / entry.name).symlink_to(entry)
    return packages


def run(packages: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    path = [packages] if LIBRARY == SITE.resolve() else [LIBRARY, packages]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, path))}
    return subprocess.run([sys.executable, "-S", *args], capture_output=True, text=True, timeout=120,
                          env=env, cwd=cwd)


@needs_installed_tools
def test_the_tools_name_what_they_need() -> None:
    assert sorted(requirements()) == ["matplotlib", "pgq-thin", "testing-postgresql"]


@pytest.mark.parametrize("command", TOOLS)
def test_a_tool_without_the_tools_installed_prints_one_line_saying_what_to_install(
        tmp_path: Path, command: list[str]) -> None:
    packages = environment(tmp_path, leave_out=("pgq_tools",))
    result = run(packages, "-m", "pgq_thin", *command, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert result.stderr == (f"pgq-thin: {command[0]} is one of pgq's development tools, which are not "
                             "installed: pip install ./tools (from a checkout of pgq)\n")
    assert TOOLS_INSTALL in result.stderr


@needs_installed_tools
def test_the_demo_runs_without_matplotlib(tmp_path: Path) -> None:
    """matplotlib draws the benchmark's chart only (issue 42): without it the demo is not refused.
    Two workers are the fewest it takes: one, and it answers so, past the tools' check."""
    packages = environment(tmp_path, leave_out=("matplotlib",))
    (packages / "pgq_tools").unlink()  # this run's tools (a checkout's tools/ on PYTHONPATH), the venv's metadata
    (packages / "pgq_tools").symlink_to(Path(pgq_tools.__file__).resolve().parent)
    result = run(packages, "-c", "from pgq_tools import missing_requirements as m; print(m())", cwd=tmp_path)
    assert result.returncode == 0 and result.stdout == "[]\n", result.stderr
    result = run(packages, "-m", "pgq_thin", "demo", "--workers", "1", cwd=tmp_path)
    assert (result.returncode, result.stdout) == (2, "pgq-thin: error: the demo needs at least 2 workers (one is "
                                                     "killed)\n"), result.stdout + result.stderr


@needs_installed_tools
@pytest.mark.parametrize("command", TOOLS)
@pytest.mark.parametrize(("leave_out", "missing"), [("testing", "testing-postgresql")])
def test_a_tool_without_what_the_tools_need_prints_one_line_saying_what_to_install(
        tmp_path: Path, command: list[str], leave_out: str, missing: str) -> None:
    packages = environment(tmp_path, leave_out=(leave_out,))
    result = run(packages, "-m", "pgq_thin", *command, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert result.stderr == (f"pgq-thin: {command[0]} is one of pgq's development tools, whose requirements are "
                             f"not all installed (missing: {missing}): {TOOLS_INSTALL}\n")


def test_without_the_testing_extra_pytest_runs_and_pgq_dsn_says_what_to_install(tmp_path: Path) -> None:
    packages = environment(tmp_path, leave_out=("testing", "pg8000"))
    (tmp_path / "test_user.py").write_text("def test_plain():\n    pass\n\n\n"
                                           "def test_with_the_kit(pgq_dsn):\n    pass\n")
    result = run(packages, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_user.py", cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 passed, 1 error" in result.stdout
    assert INSTALL in result.stdout


@needs_installed_tools
def test_the_same_environment_with_everything_passes_the_check(tmp_path: Path) -> None:
    packages = environment(tmp_path, leave_out=())
    result = run(packages, "-c", "from pgq_tools import missing_requirements as m; print(m())", cwd=tmp_path)
    assert result.returncode == 0 and result.stdout == "[]\n", result.stderr


def test_the_runtime_without_the_tools_still_works(tmp_path: Path, dsn: str) -> None:
    packages = environment(tmp_path, leave_out=("pgq_tools", "matplotlib"))
    result = run(packages, "-m", "pgq_thin", "enqueue", "q", "k", "--dsn", dsn, cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.strip().isdigit(), result.stderr
