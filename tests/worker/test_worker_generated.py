"""The thread runtime's parts are generated from the asyncio ones (scripts/async_to_sync.py): the
generated files are current, each says so in its first line, and no asyncio source imports the
thread runtime."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "pgq_thin" / "worker"

sys.path.insert(0, str(ROOT / "scripts"))
import async_to_sync  # noqa: E402


def test_every_generated_thread_part_is_what_the_script_makes_of_its_asyncio_source() -> None:
    for name in async_to_sync.PARTS:
        path = WORKER / "threads" / f"{name}.py"
        assert path.read_text() == async_to_sync.generate(name), (
            f"{path.relative_to(ROOT)} is stale: run python scripts/async_to_sync.py")


def test_the_check_fails_on_a_stale_generated_file_and_names_it(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "async_to_sync.py"), "--check"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    target = WORKER / "threads" / "owner.py"
    kept = target.read_text()
    try:
        target.write_text(kept.replace("repeat.after(exc)", "repeat.after(exc)  # edited by hand"))
        proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "async_to_sync.py"), "--check"],
                              capture_output=True, text=True, cwd=ROOT)
    finally:
        target.write_text(kept)
    assert proc.returncode == 1 and "pgq_thin/worker/threads/owner.py" in proc.stderr


def test_each_generated_file_says_it_is_generated_and_from_what() -> None:
    for name in async_to_sync.PARTS:
        first = (WORKER / "threads" / f"{name}.py").read_text().splitlines()[0]
        assert first == f"# Generated from pgq_thin/worker/{name}.py by scripts/async_to_sync.py: do not edit. Edit the"


def test_no_asyncio_file_imports_the_thread_runtime() -> None:
    """The asyncio sources and the rules both runtimes share never import the thread runtime
    (pgq_thin/worker/threads/, threaded.py); only the Worker and the package's face do."""
    importing = sorted(path.name for path in WORKER.glob("*.py")
                       if re.search(r"^(from|import) pgq_thin\.worker\.(threads|threaded)\b", path.read_text(), re.M))
    assert importing == ["__init__.py", "threaded.py"]
