"""The docs site (mkdocs.yml, docs/) builds with ``mkdocs build --strict``: a warning, a broken
link or a missing anchor fails the build, and so this test. The Python API reference it renders
shows the clients' methods with their parameters and results (``Client.enqueue ... -> int``),
which the methods made from pgq_thin.calls only show through docs/hooks/griffe_calls.py."""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def text(page: Path) -> str:
    """A built page as text: tags dropped, entities decoded, blank runs collapsed."""
    body = page.read_text(encoding="utf-8")
    body = body[body.find("<article"):]
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", "", body)))


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def test_the_site_builds_strictly_with_every_page_in_the_nav(site: Path) -> None:
    for page in ("tutorial", "python", "workflows", "limits", "schedules", "operations", "upgrading",
                 "pgbouncer-failover", "other-languages", "api", "sql-api", "fence", "reliability",
                 "security", "scaling", "performance", "coming-from"):
        assert (site / page / "index.html").is_file(), page


def test_the_api_reference_shows_the_clients_methods_with_their_signatures(site: Path) -> None:
    api = text(site / "api" / "index.html")
    client, async_client = api.split("pgq_thin.AsyncClient ¶", 1)
    enqueue = client.split("enqueue( queue: str, kind: str,", 1)[1].split("pgq.enqueue:", 1)[0]
    assert "priority: int = 0" in enqueue and enqueue.rstrip().endswith("-> int"), enqueue
    assert "batch_status(batch_id: int) -> BatchStatus" in client
    assert "enqueue async ¶ enqueue( queue: str, kind: str," in async_client  # labelled async
    assert "Call[" not in api


def test_the_examples_page_includes_the_workers_from_examples(site: Path) -> None:
    page = text(site / "other-languages" / "index.html")
    first = (ROOT / "examples" / "psql_worker.sh").read_text().splitlines()[1]
    assert html.unescape(first) in page
