"""Every statement the library sends is in pgq_thin/queries.py (its first line promises it): no other
module of the client, the worker, the dashboard, the metrics, the CLI or the test kit holds one.
The development tools (tools/pgq_tools/) keep their own SQL; the function source (sql/functions/,
run by pgq_thin.sqlsource) is SQL, not a statement written in Python.

Read from the source: an ``execute()`` (or ``executemany``, ``stream``, ``copy``) whose statement is
written where it is called (a string, an f-string, a concatenation, ``sql.SQL("...")``), and any
string, outside docstrings, that begins as a statement does."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "pgq_thin"
EXEMPT = ("queries.py", "tools/")
MODULES = sorted(p for p in PACKAGE.rglob("*.py") if not str(p.relative_to(PACKAGE)).startswith(EXEMPT))
STATEMENT = re.compile(r"\s*(SELECT\s|INSERT\s+INTO\s|UPDATE\s+\S+\s+SET\s|DELETE\s+FROM\s|WITH\s+\w+\s+AS\s"
                       r"|CREATE\s+(DATABASE|TABLE|ROLE|INDEX)|DROP\s+(DATABASE|TABLE|ROLE)|ALTER\s+(SYSTEM|ROLE|TABLE)"
                       r"|TRUNCATE\s|(LISTEN|NOTIFY)\s+(pgq\b|$)|SET\s+(ROLE|SESSION|LOCAL)\s|SHOW\s)", re.IGNORECASE)
RUNS = {"execute", "executemany", "stream", "copy"}


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _written_here(node: ast.expr) -> bool:
    """A statement spelled out at the call: not a name or an attribute (queries.X) holding it."""
    if isinstance(node, ast.Call):  # sql.SQL("...").format(...), sql.SQL("...")
        return any(_written_here(a) for a in node.args) or (
            isinstance(node.func, ast.Attribute) and _written_here(node.func.value))
    return isinstance(node, (ast.Constant, ast.JoinedStr, ast.BinOp))


def statements_outside_queries(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    docstrings = _docstrings(tree)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in RUNS
                and node.args and _written_here(node.args[0])):
            found.append((node.lineno, f"{node.func.attr}({ast.unparse(node.args[0])[:80]})"))
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
              and STATEMENT.match(node.value)):
            found.append((node.lineno, repr(node.value[:80])))
    return [f"line {line}: {what}" for line, what in sorted(found)]


def test_the_check_finds_a_statement_written_at_its_call(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text('"""SELECT in a docstring is prose."""\n'
                      'def f(conn, channel):\n'
                      '    conn.execute(f"LISTEN {channel}")\n'
                      '    conn.execute(sql.SQL("DROP DATABASE {}").format(x))\n'
                      '    log.info("LISTEN restored")\n'
                      'BUSY = """\n    SELECT 1"""\n')
    assert statements_outside_queries(module) == [
        "line 3: 'LISTEN '",
        "line 3: execute(f'LISTEN {channel}')",
        "line 4: 'DROP DATABASE {}'",
        "line 4: execute(sql.SQL('DROP DATABASE {}').format(x))",
        "line 6: '\\n    SELECT 1'",
    ]


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_module_sends_only_statements_of_queries_py(path: Path) -> None:
    assert statements_outside_queries(path) == []
