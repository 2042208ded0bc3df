"""The test folders hold no package (no __init__.py): pytest imports each test module by its base
name, so two modules of one name in two folders fail the whole run's collection."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_module_has_a_name_of_its_own() -> None:
    names = Counter(p.name for p in TESTS.rglob("test_*.py") if "__pycache__" not in p.parts)
    assert [name for name, n in names.items() if n > 1] == []
