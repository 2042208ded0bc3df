"""Apply pgq's SQL: from Python (``pgq_thin.migrate(dsn)``) or ``pgq-thin migrate``.

An apply is the versioned migrations not applied yet (yoyo, ``migrations/``: tables, columns,
indexes, data; each once, in order, in a transaction of its own), then the whole function source
(``sql/functions/``, see ``pgq_thin.sqlsource``) in one transaction, every time: so a release that
changes only functions is installed by the same command. Every statement waits at most
``lock_timeout`` for a lock (5 s by default): an apply never queues the workers' statements behind
it for longer; one that times out changed nothing in its step and can be run again.

The migrations ship inside the wheel (``pgq_thin/_migrations``); in a source checkout they are
read from the repository's ``migrations/`` directory.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
from psycopg.conninfo import conninfo_to_dict
from yoyo import get_backend, read_migrations

from pgq_thin import queries
from pgq_thin.durations import Interval, to_timedelta
from pgq_thin.sqlsource import install_functions

__all__ = ["NewerSchema", "migrate", "migrations_dir", "pending_migrations", "shipped_schema_version",
           "warn_if_schema_is_old", "yoyo_url"]

log = logging.getLogger("pgq_thin.migrate")
#: The longest lock_timeout PostgreSQL takes (an int of milliseconds).
MAX_LOCK_TIMEOUT_MS = 2**31 - 1


def migrations_dir() -> Path:
    """Where the migration files are: in the installed package, or in the source checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "_migrations", here.parent / "migrations"):
        if candidate.is_dir() and any(candidate.glob("*.sql")):
            return candidate
    raise FileNotFoundError("pgq's migrations are missing from this installation")


def shipped_schema_version() -> int:
    """The number of the newest migration this installation ships: what pgq.version() returns in a
    database that has every one of them applied."""
    numbers = [int(match.group(1)) for path in migrations_dir().glob("*.sql")
               if (match := re.match(r"(\d+)_", path.name))]
    return max(numbers)


_schema_checked: set[str] = set()
_schema_checked_lock = threading.Lock()


def schema_warning(installed: str | None) -> str | None:
    """The warning for a database whose pgq.version() returned ``installed`` (None: pgq is not
    installed), or None when its schema is at least as new as the shipped migrations."""
    shipped = shipped_schema_version()
    if installed is None:
        return f"pgq is not installed in this database: run `pgq-thin migrate` (migrations up to {shipped})"
    if installed.isdigit() and int(installed) >= shipped:
        return None
    return (f"this database's pgq schema (version {installed}) is older than the migrations this pgq-thin "
            f"ships (up to {shipped}): run `pgq-thin migrate`")


def warn_if_schema_is_old(conn: psycopg.Connection[Any]) -> bool:
    """Once per database and process: log a warning when the schema that ``conn`` (an autocommit
    connection) sees is older than the migrations this installation ships. True once that
    database has been checked (a caller may stop asking), False when it could not be yet."""
    database = conn.info.dsn
    if database in _schema_checked:
        return True
    if not conn.autocommit:
        return False
    with _schema_checked_lock:
        if database in _schema_checked:
            return True
        try:
            row = conn.execute(queries.VERSION).fetchone()
        except psycopg.Error as exc:
            return schema_read(database, exc)
        return schema_read(database, None if row is None else str(row[0]))


async def awarn_if_schema_is_old(conn: psycopg.AsyncConnection[Any]) -> bool:
    """warn_if_schema_is_old for an AsyncConnection (AsyncClient)."""
    database = conn.info.dsn
    if database in _schema_checked:
        return True
    if not conn.autocommit:
        return False
    try:
        row = await (await conn.execute(queries.VERSION)).fetchone()
    except psycopg.Error as exc:
        return schema_read(database, exc)
    with _schema_checked_lock:
        if database in _schema_checked:  # another task or thread read it meanwhile
            return True
        return schema_read(database, None if row is None else str(row[0]))


def schema_read(database: str, installed: str | psycopg.Error | None) -> bool:
    """Account what pgq.version() answered for ``database`` (an error: none yet when pgq is not
    installed); warn when the schema is older than ours. False when it could not be read."""
    if isinstance(installed, psycopg.Error):
        if not isinstance(installed, (psycopg.errors.UndefinedFunction, psycopg.errors.InvalidSchemaName)):
            return False  # e.g. the connection broke: look again on the next one
        installed = None
    _schema_checked.add(database)
    message = schema_warning(installed)
    if message:
        log.warning(message)
    return True


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


class NewerSchema(RuntimeError):
    """The database has migrations applied that this installation does not ship: its functions
    are newer than this installation's source, which must not replace them."""


def _unknown_applied(backend: Any, migrations: Any) -> list[str]:
    """The migrations the database has applied that ``migrations`` does not hold (a newer pgq's)."""
    known = {m.hash for m in migrations}
    backend.ensure_internal_schema_updated()
    rows = backend.execute(queries.APPLIED_MIGRATIONS.format(table=backend.migration_table_quoted)).fetchall()
    return sorted(str(row[0]) for row in rows if row[1] not in known)


def migrate(dsn: str, lock_timeout: Interval = "5s") -> list[str]:
    """Apply every pending migration, then the function source, under yoyo's lock; returns the ids
    of the migrations applied (none: only the functions were installed again, a no-op when they
    had not changed). Refuses (NewerSchema) a database that a newer pgq migrated."""
    setting = queries.SET_LOCK_TIMEOUT.format(timeout=_interval(lock_timeout))
    backend = get_backend(yoyo_url(dsn))
    try:
        migrations = read_migrations(str(migrations_dir()))
        backend.execute(setting)
        # yoyo applies each migration on a connection of its own (backend.copy()): those get the
        # same lock_timeout, so the landed migrations, which set none, wait a bounded time too.
        copy = backend.copy

        def bounded_copy() -> Any:
            migration_backend = copy()
            migration_backend.execute(setting)
            return migration_backend

        backend.copy = bounded_copy
        with backend.lock():
            newer = _unknown_applied(backend, migrations)
            if newer:
                raise NewerSchema(f"this database has migrations this pgq-thin does not ship ({', '.join(newer)}): "
                                  f"a newer pgq migrated it; upgrade pgq-thin instead of migrating with this one")
            todo = backend.to_apply(migrations)
            ids = [m.id for m in todo]
            if ids:
                log.info("applying migrations", extra={"migrations": ids})
                backend.apply_migrations_only(todo)
            with backend.transaction():
                backend.connection.execute(queries.STALE_FUNCTIONS_TABLE)
                install_functions(backend.connection)
            _drop_stale(backend.connection)
        return ids
    finally:
        backend.connection.close()


#: How long the apply waits for the statements running when its new functions committed, before it
#: drops the stale functions anyway.
STALE_WAIT = timedelta(seconds=60)


def _drop_stale(conn: Any) -> None:
    """Drops the functions the source no longer defines, once every statement that was running when
    the new functions committed has ended (at most STALE_WAIT), so that an older worker's call in
    flight across an upgrade finishes on the functions it began with instead of failing (42883)."""
    stale = [fn for (fn,) in conn.execute(queries.STALE_FUNCTIONS).fetchall()]
    conn.execute(queries.DROP_STALE_FUNCTIONS_TABLE)
    conn.commit()
    if not stale:
        return
    running = set(conn.execute(queries.RUNNING_STATEMENTS).fetchall())
    conn.commit()
    deadline = time.monotonic() + STALE_WAIT.total_seconds()
    while running and time.monotonic() < deadline:
        time.sleep(0.01)
        running &= set(conn.execute(queries.RUNNING_STATEMENTS).fetchall())
        conn.commit()
    if running:
        log.warning("dropping functions the source no longer defines while statements that began before the "
                    "upgrade still run", extra={"pids": sorted(pid for pid, _ in running)})
    for fn in stale:
        log.info("dropping a function the source no longer defines", extra={"function": fn})
        conn.execute(queries.DROP_FUNCTION.format(function=fn))
    conn.commit()


def _interval(value: Interval) -> str:
    """A lock_timeout as PostgreSQL reads it: its own form with a unit ('5s', '500ms', '1min'; '0': no
    limit) as it is, else a duration as the rest of pgq takes one ('5m', '1h 30m', a timedelta, a
    number of seconds: pgq_thin.durations) in milliseconds; ValueError otherwise (a bare '5' would be
    5 ms to PostgreSQL)."""
    if isinstance(value, str) and re.fullmatch(r"\d+(\.\d+)?\s*(ms|s|min)|0", value.strip()):
        return value.strip()
    try:
        ms = to_timedelta(value) / timedelta(milliseconds=1)
    except (TypeError, ValueError):
        ms = math.nan
    if not 0 <= ms <= MAX_LOCK_TIMEOUT_MS:
        raise ValueError(f"lock_timeout must be a duration with its unit, such as '5s', '500ms' or '2m', from 0 "
                         f"(no limit) to {MAX_LOCK_TIMEOUT_MS // 86_400_000} days, got {value!r:.60}")
    return f"{max(1, round(ms)) if ms else 0}ms"
