#!/usr/bin/env python3
"""Renders docs/sql-api.md from docs/sql-api.md.in.

Every ```psql block of the template is run with psql against a throwaway database made from
sql/schema.sql, and replaced by a ```text block with the statements and psql's real output:

    ```psql            a fresh database
    ```psql continue   the same database (and its data) as the previous block

Each statement ends at a line ending in ";" (or is a psql meta-command such as \\echo); a
statement may start with "--" comment lines, which are shown as they are.

The script starts its own PostgreSQL server (pgq_thin.testing.server), builds a template database from
sql/schema.sql, runs the blocks (independent chains of blocks in parallel), writes
docs/sql-api.md and stops the server.

    python docs/generate_sql_api.py           rewrite docs/sql-api.md
    python docs/generate_sql_api.py --check   exit 1 if docs/sql-api.md is not what it would write

The output must not depend on the run: examples show no raw timestamps or random delays (they
compare, round or mask them in the SQL shown), so that --check can pass.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
TEMPLATE = DOCS / "sql-api.md.in"
OUTPUT = DOCS / "sql-api.md"
SCHEMA = ROOT / "sql" / "schema.sql"

sys.path.insert(0, str(ROOT))
from pgq_thin.testing import server as embedded  # noqa: E402

MARK = "@@@@pgq-doc-statement@@@@"
BLOCK = re.compile(r"```psql( continue)?\n(.*?)```", re.S)
TEMPLATE_DB = "doc_template"
PG_MAJOR = "15"  # the server version the page's output is for ("How to read the examples")


class Psql:
    """Runs psql scripts against databases of one server."""

    def __init__(self, server: embedded.ThrowawayPostgres) -> None:
        self.server = server
        psql = shutil.which("psql")
        if psql is None:
            raise SystemExit("psql is not on PATH")
        # psql writes results to stdout and errors to stderr: both go to one pipe, unbuffered, so
        # that an error shows up after the output of the statements before it.
        stdbuf = shutil.which("stdbuf")
        if stdbuf is None:
            raise SystemExit("stdbuf (coreutils) is not on PATH")
        self.command = [stdbuf, "-o0", "-e0", psql, "-X", "-q"]
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        self.env.update(PGTZ="UTC", PGDATESTYLE="ISO", PGCLIENTENCODING="UTF8",
                        LC_ALL="C.UTF-8", LANG="C.UTF-8")

    def run(self, database: str, script: str, *extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.command, "-d", self.server.dsn_for(database), *extra],
                              input=script, text=True, env=self.env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=300, cwd=ROOT)


def split_statements(block: str) -> list[str]:
    statements: list[str] = []
    current: list[str] = []
    for line in block.splitlines():
        if not current and not line.strip():
            continue
        current.append(line)
        stripped = line.strip()
        if stripped.startswith("\\") or (stripped.endswith(";") and not stripped.startswith("--")):
            statements.append("\n".join(current))
            current = []
    if current:
        raise SystemExit(f"unterminated statement in a psql block: {current}")
    return statements


def render_statement(statement: str) -> str:
    out: list[str] = []
    first = True
    for line in statement.splitlines():
        if first and line.startswith("--"):
            out.append(line)
        elif first:
            out.append("=> " + line)
            first = False
        else:
            out.append("   " + line)
    return "\n".join(out)


def run_chain(psql: Psql, database: str, blocks: list[str]) -> list[str]:
    """Runs blocks one after the other in a fresh database; returns each block's rendering."""
    created = psql.run("postgres", f"CREATE DATABASE {database} TEMPLATE {TEMPLATE_DB};",
                       "-v", "ON_ERROR_STOP=1")
    if created.returncode != 0:
        raise SystemExit(created.stdout)
    try:
        rendered = []
        for block in blocks:
            statements = split_statements(block)
            script = "\\set SHOW_CONTEXT never\n\\pset null '(null)'\n"
            script += "".join(f"\\echo {MARK}\n{s}\n" for s in statements)
            out = psql.run(database, script).stdout
            chunks = out.split(MARK + "\n")
            if chunks[0].strip() or len(chunks) != len(statements) + 1:
                raise SystemExit(f"unexpected psql output for block:\n{block}\n---\n{out}")
            parts = []
            for statement, chunk in zip(statements, chunks[1:]):
                chunk = chunk.rstrip("\n")
                parts.append(render_statement(statement) + ("\n" + chunk if chunk else ""))
            rendered.append("```text\n" + "\n\n".join(parts) + "\n```")
        return rendered
    finally:
        psql.run("postgres", f"DROP DATABASE IF EXISTS {database} WITH (FORCE);")


def render(template: str, jobs: int) -> tuple[str, int]:
    """The rendered page, and how many databases it took."""
    blocks = list(BLOCK.finditer(template))
    chains: list[list[str]] = []
    for m in blocks:
        if m.group(1):
            if not chains:
                raise SystemExit("the first psql block cannot continue a previous one")
            chains[-1].append(m.group(2))
        else:
            chains.append([m.group(2)])

    server = embedded.start()
    try:
        psql = Psql(server)
        version = psql.run("postgres", "SHOW server_version_num;", "-At").stdout.strip()
        if not version.startswith(PG_MAJOR):
            print(f"warning: the page is written for PostgreSQL {PG_MAJOR}, the server is {version}: "
                  "the output may differ (PGQ_PG_BIN?)", file=sys.stderr)
        created = psql.run("postgres", f"CREATE DATABASE {TEMPLATE_DB};", "-v", "ON_ERROR_STOP=1")
        if created.returncode != 0:
            raise SystemExit(created.stdout)
        built = psql.run(TEMPLATE_DB, "", "-1", "-v", "ON_ERROR_STOP=1", "-f", str(SCHEMA))
        if built.returncode != 0 or "ERROR" in built.stdout:
            raise SystemExit(f"sql/schema.sql failed:\n{built.stdout}")
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            futures = [pool.submit(run_chain, psql, f"doc_ex{i}", chain)
                       for i, chain in enumerate(chains, 1)]
            rendered = [text for f in futures for text in f.result()]
    finally:
        server.stop()

    pieces = iter(rendered)
    return BLOCK.sub(lambda _m: next(pieces), template), len(chains)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="do not write; exit 1 if docs/sql-api.md would change")
    parser.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1),
                        help="databases to run examples in at once (default: %(default)s)")
    args = parser.parse_args()

    started = time.monotonic()
    text, databases = render(TEMPLATE.read_text(encoding="utf-8"), max(1, args.jobs))
    elapsed = time.monotonic() - started
    current = OUTPUT.read_text(encoding="utf-8") if OUTPUT.exists() else ""
    relative = OUTPUT.relative_to(ROOT)
    if args.check:
        if text == current:
            print(f"{relative} is up to date ({databases} databases, {elapsed:.1f} s)")
            return 0
        diff = difflib.unified_diff(current.splitlines(keepends=True), text.splitlines(keepends=True),
                                    f"{relative} (current)", f"{relative} (generated)")
        sys.stdout.writelines(diff)
        print(f"\n{relative} is out of date: run python docs/generate_sql_api.py", file=sys.stderr)
        return 1
    if text != current:
        OUTPUT.write_text(text, encoding="utf-8")
        print(f"wrote {relative} ({databases} databases, {elapsed:.1f} s)")
    else:
        print(f"{relative} unchanged ({databases} databases, {elapsed:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
