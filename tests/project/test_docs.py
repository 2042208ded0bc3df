"""docs/sql-api.md documents exactly the public functions of schema pgq.

Every function of schema pgq whose name does not start with "_" must have a section headed
"### pgq.<name>" in docs/sql-api.md, and every such section must name a function that exists.
The page itself is generated (python docs/generate_sql_api.py; --check tells whether it is up
to date); that takes a while, so this test does not regenerate it.
"""

from __future__ import annotations

import re
from pathlib import Path

import psycopg

DOC = Path(__file__).resolve().parents[2] / "docs" / "sql-api.md"
HEADING = re.compile(r"^### pgq\.([A-Za-z_][A-Za-z0-9_]*)\s*$", re.M)


def public_functions(conn: psycopg.Connection) -> set[str]:
    rows = conn.execute(
        """SELECT p.proname FROM pg_catalog.pg_proc AS p
           WHERE p.pronamespace = 'pgq'::regnamespace AND left(p.proname, 1) <> '_'"""
    ).fetchall()
    return {name for (name,) in rows}


def documented_functions() -> list[str]:
    return HEADING.findall(DOC.read_text(encoding="utf-8"))


def test_every_public_function_has_a_section(conn: psycopg.Connection) -> None:
    missing = public_functions(conn) - set(documented_functions())
    assert not missing, f"public functions without a '### pgq.<name>' section in {DOC.name}: {sorted(missing)}"


def test_every_documented_function_exists(conn: psycopg.Connection) -> None:
    unknown = set(documented_functions()) - public_functions(conn)
    assert not unknown, f"sections of {DOC.name} for functions that do not exist: {sorted(unknown)}"


def test_each_function_is_documented_once() -> None:
    headings = documented_functions()
    twice = sorted({name for name in headings if headings.count(name) > 1})
    assert not twice, f"functions with more than one section: {twice}"


def test_the_page_has_the_templates_sections() -> None:
    """A cheap staleness check: a section added to the template needs a regeneration."""
    template = DOC.with_name("sql-api.md.in").read_text(encoding="utf-8")
    assert HEADING.findall(template) == documented_functions(), "run: python docs/generate_sql_api.py"
