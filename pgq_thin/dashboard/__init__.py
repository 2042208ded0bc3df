"""pgq's web dashboard (``pgq-thin dashboard``): queues, jobs, schedules and health in a browser,
with retry, cancel, resolve, pause and resume. It is one more client of pgq's SQL functions: every
page reads them through a pgq_thin AsyncClient and every action is one call of a pgq function, run
as the dashboard's database login (a pgq_monitor login makes it read-only, a pgq_admin login lets
the actions work; the database refuses what the login may not do). ``pgq_thin.dashboard.app``
builds the ASGI app; it needs the ``dashboard`` extra (Starlette, Jinja2, uvicorn, and
prometheus_client for /metrics), which this module checks without importing them."""

from __future__ import annotations

import importlib.util

__all__ = ["INSTALL", "REQUIREMENTS", "missing_requirements"]

#: The modules the dashboard imports, and the packages that bring them.
REQUIREMENTS = {"starlette": "starlette", "jinja2": "jinja2", "uvicorn": "uvicorn",
                "prometheus_client": "prometheus_client"}
INSTALL = "pip install 'pgq-thin[dashboard]'"


def missing_requirements() -> list[str]:
    """The packages of the dashboard extra that are not installed."""
    return [package for module, package in REQUIREMENTS.items() if importlib.util.find_spec(module) is None]
