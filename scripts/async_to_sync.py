"""Write the thread runtime's parts from the asyncio ones: each part of the worker is written once,
for asyncio, in the file of its rules (pgq_thin/worker/claimer.py holds PollTimer and AsyncClaimer);
this script makes pgq_thin/worker/threads/<part>.py of it (Claimer), as psycopg makes its sync
code of its async code.

    python scripts/async_to_sync.py            # rewrite the generated files
    python scripts/async_to_sync.py --check    # exit 1, naming them, when one is stale

What it does to the source of each definition listed in PARTS (comments kept):
- ``async def`` / ``async with`` / ``async for`` lose ``async``; ``await`` goes;
- ``if ASYNC:`` keeps its ``else:`` branch (or nothing); a line ending with ``# ASYNC`` goes;
- the names of RENAMES (``AsyncClaimer`` -> ``Claimer``, ``AsyncClient`` -> ``Client``...) and the
  modules of MODULES (pgq_thin.worker.waits -> pgq_thin.worker.threads.waits: the same waiting
  primitives, blocking a thread) are replaced.
The generated file imports what its code uses: from the source's imports (renamed), from the
source module itself (its rules), and the other generated parts. tests/worker/test_worker_generated.py
fails while a generated file is stale.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "pgq_thin" / "worker"
TARGET = WORKER / "threads"

#: Each source module of pgq_thin/worker/ and the definitions the thread runtime is made of.
PARTS: dict[str, tuple[str, ...]] = {
    "owner": ("AsyncOwnerCalls",),
    "completer": ("AsyncCompleter",),
    "renewer": ("read_clock", "AsyncRenewer"),
    "listener": ("AsyncListener",),
    "executor": ("AsyncExecutor",),
    "slots": ("AsyncSlots",),
    "claimer": ("AsyncClaimer",),
    "heartbeat": ("AsyncHeartbeat",),
    "engine": ("AsyncRun",),
}

RENAMES = {
    "AsyncOwnerCalls": "OwnerCalls", "AsyncCompleter": "Completer", "AsyncRenewer": "Renewer",
    "AsyncListener": "Listener", "AsyncExecutor": "Executor", "AsyncSlots": "Slots", "AsyncClaimer": "Claimer",
    "AsyncRun": "Run", "AsyncHeartbeat": "Heartbeat",
    "AsyncClient": "Client", "AsyncConnection": "Connection", "AsyncConnectionPool": "ConnectionPool",
    "AsyncIterator": "Iterator", "asynccontextmanager": "contextmanager", "aclosing": "closing",
    "__aenter__": "__enter__", "__aexit__": "__exit__",
}
#: Where a generated part finds what its source imports from a module with a thread twin.
MODULES = {"pgq_thin.async_client": "pgq_thin.client", "pgq_thin.worker.waits": "pgq_thin.worker.threads.waits"}

HEADER = ("# Generated from pgq_thin/worker/{name}.py by scripts/async_to_sync.py: do not edit. Edit the\n"
          "# asyncio source, then run the script (tests/worker/test_worker_generated.py fails while this is stale).\n")

_NAME = re.compile(r"\b(" + "|".join(sorted(RENAMES, key=len, reverse=True)) + r")\b")
_STDLIB = set(sys.stdlib_module_names)


def _drop_async_blocks(lines: list[str]) -> list[str]:
    """``if ASYNC:`` blocks become their ``else:`` branch, dedented; ``# ASYNC`` lines go."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if stripped.endswith("# ASYNC"):
            i += 1
            continue
        if stripped == "if ASYNC:":
            indent = len(line) - len(line.lstrip())
            i += 1
            while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent):
                i += 1
            if i < len(lines) and lines[i].strip() == "else:" and len(lines[i]) - len(lines[i].lstrip()) == indent:
                i += 1
                while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent):
                    out.append(lines[i][4:] if lines[i].strip() else lines[i])
                    i += 1
            continue
        out.append(line)
        i += 1
    return out


def _sync(text: str) -> str:
    lines = _drop_async_blocks(text.split("\n"))
    text = "\n".join(lines)
    text = re.sub(r"\basync (def|with|for) ", r"\1 ", text)
    text = re.sub(r"\bawait ", "", text)
    text = re.sub(r"\(await ([^()]*)\)", r"\1", text)
    text = re.sub(r"\bAwaitable\[([^\[\]]*)\]", r"\1", text)  # what an awaitable gives
    return _NAME.sub(lambda m: RENAMES[m.group(1)], text)


def _segment(lines: list[str], node: ast.stmt) -> str:
    start = (node.decorator_list[0].lineno if getattr(node, "decorator_list", None) else node.lineno) - 1
    while start > 0 and lines[start - 1].startswith("#"):
        start -= 1
    assert node.end_lineno is not None
    return "\n".join(lines[start:node.end_lineno])


def _used_names(code: str) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:  # a string annotation
                names |= {n.id for n in ast.walk(ast.parse(node.value, mode="eval")) if isinstance(n, ast.Name)}
            except SyntaxError:
                pass
    return names


def _order(name: str) -> tuple[int, str]:
    """ruff's isort order of the names of one from-import: CONSTANTS, Classes, the rest."""
    if name.isupper() and len(name) > 1:
        return 0, name
    return (1, name) if name[:1].isupper() else (2, name)


def _imports(tree: ast.Module, name: str, code: str) -> str:
    used = _used_names(code)
    plain: dict[str, set[str]] = {}  # section -> "import x" modules
    froms: dict[str, dict[str, set[str]]] = {}  # section -> module -> names
    source_module = f"pgq_thin.worker.{name}"

    def section(module: str) -> str:
        top = module.split(".")[0]
        return "0" if top in _STDLIB else "2" if top == "pgq_thin" else "1"

    def add_from(module: str, imported: str) -> None:
        froms.setdefault(section(module), {}).setdefault(module, set()).add(imported)

    for node in tree.body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in used:
                    plain.setdefault(section(alias.name), set()).add(alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module != "__future__":
            for alias in node.names:
                renamed = RENAMES.get(alias.name, alias.name)
                if renamed not in used:
                    continue
                module = MODULES.get(node.module, node.module)
                part = node.module.rsplit(".", 1)[1] if node.module.startswith("pgq_thin.worker.") else ""
                if alias.name in PARTS.get(part, ()):
                    module = f"pgq_thin.worker.threads.{part}"  # another generated part
                add_from(module, renamed)
    defined = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))}
    defined |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    converted = set(PARTS[name])
    for own in sorted(defined - converted):
        if own in used:
            add_from(source_module, own)
    out = ["from __future__ import annotations"]
    for sec in ("0", "1", "2"):
        block = [f"import {m}" for m in sorted(plain.get(sec, ()))]
        for module in sorted(froms.get(sec, {})):
            names = ", ".join(sorted(froms[sec][module], key=_order))
            line = f"from {module} import {names}"
            if len(line) > 120:
                inner = "".join(f"    {n},\n" for n in sorted(froms[sec][module], key=_order))
                line = f"from {module} import (\n{inner})"
            block.append(line)
        if block:
            out.append("\n".join(block))
    return "\n\n".join(out)


def generate(name: str) -> str:
    """The generated thread twin of pgq_thin/worker/<name>.py."""
    text = (WORKER / f"{name}.py").read_text()
    tree = ast.parse(text)
    lines = text.split("\n")
    wanted = PARTS[name]
    nodes = {n.name: n for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))}
    code = "\n\n\n".join(_sync(_segment(lines, nodes[w])) for w in wanted)
    made = [RENAMES.get(w, w) for w in wanted]
    doc = (f'"""The thread runtime\'s {", ".join(made)}: made of the asyncio {", ".join(wanted)}\n'
           f'(pgq_thin.worker.{name}), blocking a thread instead of awaiting."""')
    exports = "__all__ = [" + ", ".join(f'"{m}"' for m in sorted(made)) + "]"
    return f"{HEADER.format(name=name)}{doc}\n\n{_imports(tree, name, code)}\n\n{exports}\n\n\n{code}\n"


def main() -> int:
    check = "--check" in sys.argv[1:]
    stale = []
    for name in PARTS:
        path = TARGET / f"{name}.py"
        made = generate(name)
        if path.exists() and path.read_text() == made:
            continue
        stale.append(str(path.relative_to(ROOT)))
        if not check:
            path.write_text(made)
    if check and stale:
        print("stale (run scripts/async_to_sync.py): " + ", ".join(stale), file=sys.stderr)
        return 1
    if not check and stale:
        print("written: " + ", ".join(stale))
    return 0


if __name__ == "__main__":
    sys.exit(main())
