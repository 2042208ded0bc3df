"""What ``pip install pgq-thin`` brings: the wheel, built as a release is built (``python -m build``),
holds the library only (pgq's development tools are a distribution of their own, tools/) and names
psycopg, psycopg-pool and yoyo-migrations as its only run-time dependencies; everything else
(testing.postgresql, the dashboard's libraries) is in an extra."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel built from this checkout (no isolation: the venv's hatchling)."""
    out = tmp_path_factory.mktemp("dist")
    command = [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(ROOT)]
    built = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    (made,) = out.glob("pgq_thin-*.whl")
    return made


@pytest.fixture(scope="module")
def wheel_metadata(wheel: Path) -> list[str]:
    """The METADATA lines of the wheel."""
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return archive.read(name).decode().splitlines()


def test_the_wheel_holds_the_library_and_no_development_tool(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        modules = sorted(n for n in archive.namelist()
                         if n.endswith(".py") and not n.startswith("pgq_thin/_migrations/"))  # yoyo's hook
    library = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "pgq_thin").rglob("*.py"))
    assert modules == library
    assert not [m for m in modules if re.search(r"(^|/)(tools|pgq_tools|bench|demo|soak|lab|fleet)(/|[._])", m)]
    assert not (ROOT / "pgq_thin" / "tools").exists()
    # The Django app's admin page is a template, not a module: shipped all the same.
    with zipfile.ZipFile(wheel) as archive:
        assert "pgq_thin/contrib/django/templates/pgq/changelist.html" in archive.namelist()


def _requirements(metadata: list[str]) -> list[tuple[str, str]]:
    """(distribution name, marker) of each Requires-Dist line."""
    found = []
    for line in metadata:
        if line.startswith("Requires-Dist:"):
            requirement, _, marker = line.removeprefix("Requires-Dist:").partition(";")
            match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
            assert match, line
            found.append((re.sub(r"[-_.]+", "-", match.group(1)).lower(), marker.strip()))
    return found


def test_the_bare_wheel_depends_on_psycopg_psycopg_pool_and_yoyo_only(wheel_metadata: list[str]) -> None:
    bare = sorted(name for name, marker in _requirements(wheel_metadata) if not marker)
    assert bare == ["psycopg", "psycopg-pool", "yoyo-migrations"]


def test_testing_postgresql_comes_with_the_testing_and_test_extras_only(wheel_metadata: list[str]) -> None:
    extras = sorted(re.search(r"""extra\s*==\s*["']([^"']+)["']""", marker).group(1)  # type: ignore[union-attr]
                    for name, marker in _requirements(wheel_metadata) if name == "testing-postgresql")
    assert extras == ["test", "testing"]


def test_no_extra_names_the_tools_or_what_only_they_need(wheel_metadata: list[str]) -> None:
    extras = {line.removeprefix("Provides-Extra:").strip() for line in wheel_metadata
              if line.startswith("Provides-Extra:")}
    assert extras == {"testing", "metrics", "otel", "encryption", "dashboard", "django", "docs", "test"}
    assert not [name for name, _ in _requirements(wheel_metadata) if name in ("matplotlib", "pgq-tools")]
