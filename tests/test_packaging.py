"""What ``pip install pgq-thin`` brings: the wheel, built as a release is built (``python -m build``),
names psycopg, psycopg-pool and yoyo-migrations as its only run-time dependencies; everything else
(testing.postgresql, matplotlib, the dashboard's libraries) is in an extra."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel_metadata(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The METADATA lines of a wheel built from this checkout (no isolation: the venv's hatchling)."""
    out = tmp_path_factory.mktemp("dist")
    command = [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(ROOT)]
    built = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = out.glob("pgq_thin-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return archive.read(name).decode().splitlines()


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


def test_testing_postgresql_comes_with_the_testing_dev_and_test_extras_only(wheel_metadata: list[str]) -> None:
    extras = sorted(re.search(r"""extra\s*==\s*["']([^"']+)["']""", marker).group(1)  # type: ignore[union-attr]
                    for name, marker in _requirements(wheel_metadata) if name == "testing-postgresql")
    assert extras == ["bench", "dev", "test", "testing"]
