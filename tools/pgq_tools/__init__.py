"""pgq's development tools: the demo (``pgq-thin demo``), the benchmark (``bench``), the chaos soak
(``soak``) and the acceptance lab (``lab``), and the worker-process fleet they start (``fleet``).

They ship in the wheel but are not part of the library: they need the ``dev`` extra
(``pip install 'pgq-thin[dev]'``), and their commands say so in one line when it is missing.
"""

from __future__ import annotations

import importlib.metadata
import re

__all__ = ["INSTALL", "dev_requirements", "missing_dev_requirements"]

INSTALL = "pip install 'pgq-thin[dev]'"


def dev_requirements() -> list[str]:
    """The distributions the dev extra names, as pgq-thin's installed metadata lists them (none
    when pgq-thin runs from a source tree without being installed)."""
    try:
        requires = importlib.metadata.requires("pgq-thin") or []
    except importlib.metadata.PackageNotFoundError:
        return []
    names = []
    for requirement in requires:
        name, _, marker = requirement.partition(";")
        if re.search(r"""extra\s*==\s*["']dev["']""", marker):
            found = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", name)
            if found:
                names.append(found.group(1))
    return names


def missing_dev_requirements() -> list[str]:
    """The dev extra's distributions that are not installed."""
    missing = []
    for name in dev_requirements():
        try:
            importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
    return missing
