"""The client: one method per pgq SQL function, over a psycopg_pool.ConnectionPool.

Every method sends exactly one statement from pgq_thin.queries and returns what the function
returned, typed: pgq_thin.calls describes each (arguments, statement, result), and AsyncClient
sends the same descriptions over asyncio. Producers can pass ``conn=`` to enqueue inside their
own transaction, so the job is written atomically with their business data.
"""

from __future__ import annotations

import os
import re
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg
from psycopg_pool import ConnectionPool

from pgq_thin.calls import READING, Call, Interval, PgqCalls
from pgq_thin.errors import BadArgument, InvalidArgument, PgqError, translated
from pgq_thin.migrate import warn_if_schema_is_old

__all__ = ["Client", "Interval", "resolve_dsn"]

T = TypeVar("T")


def resolve_dsn(dsn: str | None = None) -> str:
    """The database to use: the argument, else $PGQ_DSN, else $DATABASE_URL. A URL of another
    database (mysql://...) is refused with BadArgument."""
    found = dsn or os.environ.get("PGQ_DSN") or os.environ.get("DATABASE_URL")
    if not found:
        raise PgqError("no database given: pass a DSN (--dsn) or set PGQ_DSN or DATABASE_URL")
    scheme = re.match(r"\s*([A-Za-z][A-Za-z0-9+.-]*)://", found)
    if scheme and scheme.group(1).lower() not in ("postgresql", "postgres"):
        raise BadArgument(f"pgq needs a PostgreSQL database, and the address is a {scheme.group(1)}:// URL: give "
                          "a postgresql:// URL (postgresql://user@host:5432/dbname) or libpq's key=value form "
                          "(host=... dbname=...)", "22023")
    if not found.isascii():
        try:
            found.encode()
        except UnicodeEncodeError:
            raise BadArgument("the database address is not text: it holds a lone surrogate (undecodable "
                              "bytes?)", "22023") from None
    return found


class Client(PgqCalls):
    """A pgq client: one method per pgq function (pgq_thin.calls describes each). Thread-safe:
    each call borrows a pooled connection (or uses ``conn=``)."""

    def __init__(
        self,
        dsn: str | None = None,
        *,
        pool: ConnectionPool | None = None,
        min_size: int = 1,
        max_size: int = 8,
        prepare: bool = True,
        pooled: bool = False,
    ) -> None:
        """Connect to ``dsn`` (or $PGQ_DSN / $DATABASE_URL), or use an existing ``pool`` whose
        connections are in autocommit mode. ``prepare=False`` turns server-side prepared
        statements off.

        ``pooled=True`` is the switch for a transaction-pooling proxy (PgBouncer with
        ``pool_mode = transaction``, where consecutive transactions of one connection may run on
        different server connections): no server-side prepared statements (psycopg's
        prepare_threshold=None as well), and no session state (the client sets none anyway: every
        call is one autocommit statement). Without it, such a proxy fails with a prepared-statement
        error, raised as a PgqError that names this switch."""
        self.pooled = pooled
        self._prepare = prepare and not pooled
        self._schema_seen: weakref.WeakSet[psycopg.Connection[Any]] = weakref.WeakSet()
        if pool is not None:
            self.pool = pool
            self._owns_pool = False
            self.dsn = pool.conninfo
        else:
            self.dsn = resolve_dsn(dsn)
            self.pool = ConnectionPool(
                self.dsn,
                min_size=min_size,
                max_size=max_size,
                kwargs={"autocommit": True, "context": READING, **({"prepare_threshold": None} if pooled else {})},
                name="pgq_thin",
                open=True,
            )
            self._owns_pool = True

    def close(self) -> None:
        if self._owns_pool:
            self.pool.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # The one place a statement is sent ----------------------------------------------------------

    @contextmanager
    def _cursor(self, conn: psycopg.Connection | None) -> Iterator[psycopg.Cursor[Any]]:
        with translated():
            if conn is not None:
                yield conn.cursor()
            else:
                with self.pool.connection() as pooled:
                    # Once per database and process; asked once per connection (not per call:
                    # reading conn.info.dsn costs about 130 Python calls).
                    if pooled not in self._schema_seen and warn_if_schema_is_old(pooled):
                        self._schema_seen.add(pooled)
                    yield pooled.cursor()

    def _send(self, call: Call[T]) -> T:
        """Send one call and read its result."""
        if call.conn is not None and not isinstance(call.conn, psycopg.Connection):
            raise InvalidArgument("conn must be a psycopg.Connection (an AsyncConnection goes with AsyncClient)")
        with self._cursor(call.conn) as cur:
            if call.rows is not None:
                cur.row_factory = call.rows
            cur.execute(call.query, call.params, prepare=self._prepare)
            return call.read(cur.fetchall())
