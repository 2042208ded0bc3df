"""pgq in a Django project (docs/django.md): add ``"pgq_thin.contrib.django"`` to INSTALLED_APPS.

- ``enqueue(queue, kind, payload, ...)``: Client.enqueue's parameters, on Django's own connection
  (``using``: a database alias), so that inside ``transaction.atomic()`` the job commits and rolls
  back with the caller's rows;
- ``dsn()``: the database pgq's manage.py commands use: ``settings.PGQ_DSN`` if set, else the
  database ``settings.PGQ_DATABASE`` names (default ``"default"``), as a libpq conninfo;
- manage.py ``pgq_migrate``, ``pgq_worker``, ``pgq_stats``, ``pgq_jobs``, ``pgq_job``,
  ``pgq_workers``, ``pgq_doctor`` and ``pgq_cli`` (any pgq-thin command): the pgq-thin CLI on that
  database;
- read-only admin pages of pgq's jobs and queues, read through pgq's functions.
"""

from __future__ import annotations

import inspect
from typing import Any

import psycopg
from psycopg import pq
from psycopg.conninfo import make_conninfo

from pgq_thin import calls
from pgq_thin.errors import InvalidArgument
from pgq_thin.tasks import _send

__all__ = ["database_alias", "dsn", "enqueue"]


def database_alias(using: str | None = None) -> str:
    """The Django database pgq uses: ``using``, else ``settings.PGQ_DATABASE``, else "default"."""
    from django.conf import settings

    return using or getattr(settings, "PGQ_DATABASE", None) or "default"


def _libpq_keywords() -> frozenset[str]:
    return frozenset(option.keyword.decode() for option in pq.Conninfo.get_defaults())


def dsn(using: str | None = None) -> str:
    """The conninfo of pgq's commands: ``settings.PGQ_DSN`` if set (and ``using`` is not given),
    else the Django database's own connection parameters (NAME, USER, PASSWORD, HOST, PORT and the
    libpq keys of OPTIONS, such as sslmode)."""
    from django.conf import settings
    from django.db import connections

    explicit = getattr(settings, "PGQ_DSN", None)
    if explicit and using is None:
        return str(explicit)
    connection = connections[database_alias(using)]
    if connection.vendor != "postgresql":
        raise InvalidArgument(f"the Django database {database_alias(using)!r} is {connection.vendor}, not "
                              "PostgreSQL: set PGQ_DATABASE to a PostgreSQL alias, or PGQ_DSN")
    keywords = _libpq_keywords()
    params = {key: value for key, value in connection.get_connection_params().items()
              if key in keywords and isinstance(value, (str, int))}
    return make_conninfo("", **params)


def enqueue(queue: str, kind: str, payload: dict[str, Any] | None = None, *, using: str | None = None,
            **options: Any) -> int:
    """Client.enqueue on Django's own connection (``using``: a database alias; default
    ``settings.PGQ_DATABASE`` or "default"): inside ``transaction.atomic()`` the job is part of the
    transaction, committed or rolled back with the caller's rows; outside, Django's autocommit
    commits it at once. Returns the job's id. The keyword arguments are Client.enqueue's (run_at,
    priority, max_attempts, unique_key, ...), checked as it checks them: a bad one raises the
    same error before anything is sent."""
    from django.db import connections

    if "conn" in options:
        raise InvalidArgument("pgq_thin.contrib.django.enqueue runs on Django's connection: give using=ALIAS, "
                              "not conn (Client.enqueue takes conn)")
    call = calls.enqueue(queue, kind, payload, **options)  # checks the arguments before any connection
    connection = connections[database_alias(using)]
    connection.ensure_connection()
    raw = connection.connection
    if not isinstance(raw, psycopg.Connection):
        raise InvalidArgument(f"the Django database {database_alias(using)!r} is not on psycopg 3 (its "
                              f"connection is a {type(raw).__module__}.{type(raw).__name__}): use Django's "
                              "postgresql backend with psycopg 3 installed")
    return _send(raw, call)


# help(enqueue) and inspect.signature show Client.enqueue's parameters, with using= for its conn=.
_described = inspect.signature(calls.enqueue, eval_str=True)
enqueue.__signature__ = _described.replace(  # type: ignore[attr-defined]
    parameters=[*(p for name, p in _described.parameters.items() if name != "conn"),
                inspect.Parameter("using", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=str | None)],
    return_annotation=int)
