"""Apply pgq's yoyo migrations: from Python (``pgq_thin.migrate(dsn)``) or ``pgq-thin migrate``.

The migrations ship inside the wheel (``pgq_thin/_migrations``); in a source checkout they are
read from the repository's ``migrations/`` directory.
"""

from __future__ import annotations

import logging
from pathlib import Path
from urllib.parse import quote

from psycopg.conninfo import conninfo_to_dict
from yoyo import get_backend, read_migrations

__all__ = ["migrate", "migrations_dir", "pending_migrations", "yoyo_url"]

log = logging.getLogger("pgq_thin.migrate")


def migrations_dir() -> Path:
    """Where the migration files are: in the installed package, or in the source checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "_migrations", here.parent / "migrations"):
        if candidate.is_dir() and any(candidate.glob("*.sql")):
            return candidate
    raise FileNotFoundError("pgq's migrations are missing from this installation")


def yoyo_url(dsn: str) -> str:
    """Turn any libpq connection string (URL or key=value) into yoyo's postgresql+psycopg URL."""
    params = conninfo_to_dict(dsn)
    user = quote(str(params.pop("user", "")), safe="")
    password = params.pop("password", None)
    host = str(params.pop("host", "") or "")
    port = params.pop("port", None)
    dbname = quote(str(params.pop("dbname", "") or ""), safe="")
    auth = user + (":" + quote(str(password), safe="") if password is not None else "")
    netloc = (auth + "@" if auth else "") + (host if "/" not in host else "")
    if port:
        netloc += f":{port}"
    query = dict(params)
    if "/" in host:  # a Unix socket directory
        query["host"] = host
    tail = "&".join(f"{k}={quote(str(v), safe='')}" for k, v in query.items())
    return f"postgresql+psycopg://{netloc}/{dbname}" + (f"?{tail}" if tail else "")


def pending_migrations(dsn: str) -> list[str]:
    """The ids of the migrations not yet applied to the database."""
    backend = get_backend(yoyo_url(dsn))
    try:
        return [m.id for m in backend.to_apply(read_migrations(str(migrations_dir())))]
    finally:
        backend.connection.close()


def migrate(dsn: str) -> list[str]:
    """Apply every pending migration under yoyo's lock; returns the ids applied (none: a no-op)."""
    backend = get_backend(yoyo_url(dsn))
    try:
        migrations = read_migrations(str(migrations_dir()))
        with backend.lock():
            todo = backend.to_apply(migrations)
            ids = [m.id for m in todo]
            if ids:
                log.info("applying migrations", extra={"migrations": ids})
                backend.apply_migrations(todo)
        return ids
    finally:
        backend.connection.close()
