"""pgq's development tools: the demo (``pgq-thin demo``), the benchmark (``bench``), the chaos soak
(``soak``) and the acceptance lab (``lab``), and the worker-process fleet they start (``fleet``).

They are not part of the library: they are a distribution of their own, ``pgq-tools`` (this
folder's pyproject.toml), installed beside the library from a checkout of pgq
(``pip install . ./tools``). ``pgq-thin demo`` and the other tools' commands say in one line what
to install when the tools, or what they need (``missing_requirements``), are missing.
"""

from __future__ import annotations

import importlib.metadata
import re

from pgq_thin import __version__

__all__ = ["DISTRIBUTION", "OPTIONAL", "__version__", "missing_requirements", "requirements"]

#: The tools' distribution (tools/pyproject.toml).
DISTRIBUTION = "pgq-tools"
#: What the tools go on without, and what is left out then: no tool refuses to run for want of it.
OPTIONAL = {"matplotlib": "the benchmark's chart (bench.png)"}

_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?")
_EXTRA = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")


def _requires(distribution: str, extra: str | None) -> list[tuple[str, list[str]]]:
    """(name, extras named) of each requirement of ``distribution``: its bare ones (``extra``
    None), or those of its extra ``extra``. Empty when it is not installed."""
    try:
        listed = importlib.metadata.requires(distribution) or []
    except importlib.metadata.PackageNotFoundError:
        return []
    found = []
    for requirement in listed:
        spec, _, marker = requirement.partition(";")
        named = _EXTRA.search(marker)
        if (named.group(1) if named else None) != extra:
            continue
        match = _NAME.match(spec)
        if match:
            found.append((match.group(1), [e.strip() for e in (match.group(2) or "").split(",") if e.strip()]))
    return found


def requirements() -> list[str]:
    """The distributions the tools need, as their installed metadata lists them: each requirement
    of pgq-tools and what the extras it names bring (``pgq-thin[testing]``: testing.postgresql).
    Empty when the tools run from a checkout without being installed."""
    names = []
    for name, extras in _requires(DISTRIBUTION, None):
        names.append(name)
        for extra in extras:
            names += [n for n, _ in _requires(name, extra)]
    return names


def missing_requirements() -> list[str]:
    """The distributions the tools need that are not installed (the OPTIONAL ones left out)."""
    missing = []
    for name in requirements():
        if name in OPTIONAL:
            continue
        try:
            importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
    return missing
