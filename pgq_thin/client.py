"""The client: one method per pgq SQL function, over a psycopg_pool.ConnectionPool.

Every method sends exactly one statement from pgq_thin.queries and returns what the function
returned, typed: pgq_thin.calls describes each (arguments, statement, result), and AsyncClient
sends the same descriptions over asyncio. Producers can pass ``conn=`` to enqueue inside their
own transaction, so the job is written atomically with their business data. Besides them,
``wait`` waits for a job to end (LISTEN pgq_finished and pgq.job_result).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import closing, contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg
from psycopg_pool import ConnectionPool

from pgq_thin import calls, encryption, queries
from pgq_thin.calls import READING, Call, Interval, PgqCalls, bulk_plan
from pgq_thin.encryption import KeyRing, key_ring
from pgq_thin.errors import BadArgument, InvalidArgument, PgqError, WaitTimeout, translated
from pgq_thin.migrate import warn_if_schema_is_old
from pgq_thin.models import JobResult

__all__ = ["BULK_CALL", "WAIT_POLL_INTERVAL", "BoundedCalls", "Bounds", "Client", "Interval", "bulk_calls",
           "resolve_dsn"]

T = TypeVar("T")

#: How often wait reads the job's result even without a notification: a job enqueued without
#: notify_finished, or waited for behind a transaction-pooling proxy (no LISTEN there), still
#: returns within this long of its end.
WAIT_POLL_INTERVAL = 1.0


#: Where an ORM keeps the psycopg connection to pass as ``conn=`` (docs/orm.md has the recipes).
DRIVER_CONNECTION = ("an ORM's transaction has one under it: SQLAlchemy's Connection.connection.driver_connection "
                     "(Session.connection() gives the Connection; with asyncio, await "
                     "AsyncConnection.get_raw_connection() then .driver_connection), Django's "
                     "django.db.connection.connection (after connection.ensure_connection())")


class Waiting:
    """One wait for a job's end, as both clients do it: the read of pgq.job_result, the payload of
    the job's notification, and the time left. Its arguments are checked when it is made."""

    def __init__(self, job_id: int, timeout: Interval | None, poll_interval: Interval,
                 keyring: KeyRing | None = None) -> None:
        self.job_id = job_id
        self.read = calls.job_result(job_id)  # checks job_id
        if keyring is not None:  # the result decrypted, as job_result's
            self.read = encryption.sealed(keyring, "job_result", self.read)
        self.payload = str(job_id)
        self.timeout = None if timeout is None else calls.seconds("timeout", timeout)
        self.poll = calls.seconds("poll_interval", poll_interval, positive=True)
        self.deadline = None if self.timeout is None else time.monotonic() + self.timeout
        self.last_read = -math.inf  # when it last read the result (time.monotonic())
        self.prompted = False  # whether a notification has made it read yet

    def notified(self, payload: str) -> bool:
        """Whether a notification with ``payload`` makes the wait read now: the first one naming
        the job at once (the job's end, usually), later ones only a poll interval after the last
        read, so that the wait reads at most once a poll interval however many come (any login may
        NOTIFY pgq_finished: a flood of them must not become a flood of reads). One that does not
        waits for the next read, which is a poll interval after the last one."""
        if payload != self.payload:
            return False
        if not self.prompted:
            self.prompted = True
            return True
        return time.monotonic() - self.last_read >= self.poll

    def on(self, conn: Any) -> Call[JobResult]:
        """The read of pgq.job_result, sent over ``conn`` (None: a pooled connection)."""
        return self.read if conn is None else dataclasses.replace(self.read, conn=conn)

    def pause(self, seen: JobResult) -> float:
        """How long to wait for a notification before reading again, after reading ``seen`` (not
        finished); WaitTimeout, naming its state, when the time is up."""
        self.last_read = time.monotonic()
        if self.deadline is None:
            return self.poll
        left = self.deadline - time.monotonic()
        if left <= 0:
            assert self.timeout is not None
            raise WaitTimeout(self.job_id, seen.state, self.timeout)
        return min(self.poll, left)

    @staticmethod
    def listen_kwargs(pool_kwargs: dict[str, Any] | None) -> dict[str, Any]:
        """The listening connection's arguments: the pool's (its login, its settings), autocommit."""
        return {**(pool_kwargs or {}), "autocommit": True}


#: Jobs per call of pgq.retry_jobs / pgq.cancel_jobs when the CLI or the dashboard acts by filter.
BULK_CALL = 1000


def bulk_calls(act: Callable[[int], int], most: int | None = None, per_call: int = BULK_CALL) -> Iterator[int]:
    """Acting on many jobs by filter (pgq.retry_jobs, pgq.cancel_jobs): ``act(limit_rows)`` as
    pgq_thin.calls.bulk_plan says (calls of at most ``per_call`` rows, until one acts on none or
    ``most`` jobs, None: no cap, are acted on); yields the running total after each call that acted."""
    plan, total = bulk_plan(most, per_call), 0
    try:
        rows = next(plan)
        while True:
            acted = act(rows)
            if acted:
                total += acted
                yield total
            rows = plan.send(acted)
    except StopIteration:
        return


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


@dataclass(frozen=True)
class Bounds:
    """How long a bounded call may wait for a lock and run, in seconds (Client.bounded)."""

    lock_timeout: float
    statement_timeout: float

    @classmethod
    def of(cls, lock_timeout: Interval, statement_timeout: Interval) -> Bounds:
        """The bounds ``bounded`` was given (seconds, timedeltas or durations such as ``"500ms"``),
        each more than 0; a BadArgument naming the one that is not."""
        return cls(calls.seconds("lock_timeout", lock_timeout, positive=True),
                   calls.seconds("statement_timeout", statement_timeout, positive=True))

    def params(self) -> dict[str, str]:
        return {"lock_timeout": f"{max(1, round(self.lock_timeout * 1000))}ms",
                "statement_timeout": f"{max(1, round(self.statement_timeout * 1000))}ms"}


def bounded_rows(conn: Any, call: Call[Any], bounds: Bounds, prepare: bool) -> Any:
    """Queue ``call`` on ``conn`` (in pipeline mode) in a transaction of its own, bounded by
    ``bounds``: BEGIN, SET LOCAL lock_timeout and statement_timeout, the call, COMMIT. The cursor,
    whose rows are read once the pipeline has synced (one round trip for the four)."""
    conn.execute(queries.BEGIN, prepare=prepare)
    conn.execute(queries.CALL_BOUNDS, bounds.params(), prepare=prepare)
    cur = conn.cursor()
    if call.rows is not None:
        cur.row_factory = call.rows
    cur.execute(call.query, call.params, prepare=prepare)
    conn.execute(queries.COMMIT, prepare=prepare)
    return cur


class BoundedCalls(PgqCalls):
    """The calls of a client, each sent bounded (Client.bounded)."""

    def __init__(self, client: Client, bounds: Bounds) -> None:
        self.client = client
        self.bounds = bounds

    @property
    def keyring(self) -> KeyRing | None:
        """The client's key ring (pgq_thin.encryption): its calls encrypt and decrypt as its own."""
        return self.client.keyring

    def _send(self, call: Call[T]) -> T:
        return self.client._send(call, self.bounds)


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
        keys: Mapping[str, bytes] | None = None,
        encrypt_with: str | None = None,
    ) -> None:
        """Connect to ``dsn`` (or $PGQ_DSN / $DATABASE_URL), or use an existing ``pool`` whose
        connections are in autocommit mode. ``prepare=False`` turns server-side prepared
        statements off.

        ``pooled=True`` is the switch for a transaction-pooling proxy (PgBouncer with
        ``pool_mode = transaction``, where consecutive transactions of one connection may run on
        different server connections): no server-side prepared statements (psycopg's
        prepare_threshold=None as well), and no session state (the client sets none anyway: every
        call is one autocommit statement). Without it, such a proxy fails with a prepared-statement
        error, raised as a PgqError that names this switch.

        ``keys`` (key id -> 32 bytes) and ``encrypt_with`` (the id of the one that encrypts): the
        payloads this client enqueues (enqueue, enqueue_many, update_job, schedule, batch_open's
        callback_payload, spawn) and the results it completes with are stored encrypted, and the
        results it reads (job_result, wait) decrypted with any key of the ring (docs/encryption.md;
        the extra ``pgq-thin[encryption]``). BadKey, naming the argument, for a key it refuses."""
        self.keyring = key_ring(keys, encrypt_with)
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

    def wait(self, job_id: int, timeout: Interval | None = None, *,
             poll_interval: Interval = WAIT_POLL_INTERVAL) -> JobResult:
        """Wait for the job to end (done, failed or cancelled) and return its pgq.job_result (state,
        result, last error, end); WaitTimeout (a PgqError and a TimeoutError, naming the job and its
        state) when it has not ended within ``timeout`` (None: no limit; 0: look once).

        It listens on the channel pgq_finished on a connection of its own, then reads the result
        (so an end between the enqueue and the LISTEN is not missed), and reads it again on each
        notification naming the job (a job enqueued with ``notify_finished=True``), and every
        ``poll_interval``; after the first notification's read, at most once a ``poll_interval``
        whatever is notified (any login may NOTIFY). That connection is made with the pool's conninfo
        and kwargs (a pool's ``configure`` callback is not run on it). Behind a transaction-pooling
        proxy (``pooled=True``) there is no LISTEN: it reads every ``poll_interval`` over the pool.
        The job must be one this login enqueued, or of a queue it may read (JobNotFound otherwise)."""
        waiting = Waiting(job_id, timeout, poll_interval, self.keyring)
        with self._finished_listener(waiting) as conn:
            while True:
                seen = self._send(waiting.on(conn))
                if seen.finished:
                    return seen
                pause = waiting.pause(seen)
                if conn is None:
                    time.sleep(pause)
                    continue
                with translated(), closing(conn.notifies(timeout=pause)) as notifies:
                    for notify in notifies:
                        if waiting.notified(notify.payload):
                            break

    @contextmanager
    def _finished_listener(self, waiting: Waiting) -> Iterator[psycopg.Connection[Any] | None]:
        """A connection of its own LISTENing on pgq_finished (None behind a pooling proxy)."""
        if self.pooled:
            yield None
            return
        pool = self.pool
        # A pool's conninfo and kwargs may be functions that make them (psycopg_pool 3.3).
        conninfo = pool.conninfo() if callable(pool.conninfo) else pool.conninfo
        kwargs = pool.kwargs() if callable(pool.kwargs) else pool.kwargs
        with translated():
            conn = pool.connection_class.connect(conninfo, **waiting.listen_kwargs(kwargs))
        try:
            with translated():
                conn.execute(queries.LISTEN_FINISHED)
            yield conn
        finally:
            conn.close()

    def bounded(self, lock_timeout: Interval, statement_timeout: Interval) -> BoundedCalls:
        """This client's calls, each in a transaction of its own that waits at most
        ``lock_timeout`` (seconds, a timedelta or ``"500ms"``) for a lock and runs at most
        ``statement_timeout`` (SET LOCAL; one
        round trip still). The worker's own renewals and completions go this way: a row another
        transaction holds makes the call fail with 55P03 (57014 past the statement's bound), never
        hang. A call with ``conn=`` runs in the caller's transaction, unbounded."""
        return BoundedCalls(self, Bounds.of(lock_timeout, statement_timeout))

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

    def _send(self, call: Call[T], bounds: Bounds | None = None) -> T:
        """Send one call and read its result (``bounds``: in a transaction of its own, bounded)."""
        if call.conn is not None and not isinstance(call.conn, psycopg.Connection):
            raise InvalidArgument(f"conn must be a psycopg.Connection, got {type(call.conn).__name__} (an "
                                  f"AsyncConnection goes with AsyncClient); {DRIVER_CONNECTION}")
        if bounds is not None and call.conn is None:
            with self._cursor(None) as pooled:
                conn = pooled.connection
                try:
                    with conn.pipeline():
                        cur = bounded_rows(conn, call, bounds, self._prepare)
                except psycopg.Error:
                    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                        conn.execute(queries.ROLLBACK)
                    raise
                return call.read(cur.fetchall())
        with self._cursor(call.conn) as cur:
            if call.rows is not None:
                cur.row_factory = call.rows
            cur.execute(call.query, call.params, prepare=self._prepare)
            return call.read(cur.fetchall())
