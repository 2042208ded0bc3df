"""The exceptions pgq_thin raises. Each keeps the server's SQLSTATE and message.

Losing ownership of a job is not an error: owner operations answer False / None. These are for
bad input (InvalidArgument), unknown ids (JobNotFound), admin calls on a job in the wrong state
(WrongState; LeaseLost, a handler's transaction whose completion was refused), missing privileges
(PermissionDenied), an unreachable server (ConnectionLost), and
a job that did not finish within Client.wait's timeout (WaitTimeout), and encrypted payloads a key
ring cannot open (Undecryptable; UnknownKey, its key is not in the ring) or a key it refuses (BadKey).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

__all__ = [
    "BadArgument",
    "BadArgumentType",
    "BadKey",
    "ConnectionLost",
    "InvalidArgument",
    "JobNotFound",
    "LeaseLost",
    "PermissionDenied",
    "PgqError",
    "Undecryptable",
    "UnknownKey",
    "WaitTimeout",
    "WrongState",
    "translate",
    "translated",
]


class PgqError(Exception):
    """A database error, with the server's SQLSTATE, message and hint."""

    def __init__(self, message: str, sqlstate: str | None = None, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.sqlstate = sqlstate
        self.hint = hint

    def __str__(self) -> str:
        text = self.message
        if self.sqlstate:
            text = f"{text} [SQLSTATE {self.sqlstate}]"
        if self.hint:
            text = f"{text} (hint: {self.hint})"
        return text


class InvalidArgument(PgqError):
    """An argument was NULL where a value is required (22004) or out of range (22023, class 22)."""


class BadArgument(InvalidArgument):
    """The client refused an argument before sending anything (SQLSTATE 22023, as the server's own
    checks): a text it cannot send (a lone surrogate, a NUL), a number out of range, an interval
    no timedelta holds, a payload JSON cannot carry. Nothing was sent, nothing changed."""


class BadArgumentType(BadArgument, TypeError):
    """An argument of the wrong type (a str where a list of names goes, a float for an integer):
    a BadArgument, and a TypeError too."""


class BadKey(BadArgument, ValueError):
    """A key ring refused ``keys`` or ``encrypt_with`` (a key not 32 bytes, an id not in the ring,
    one given without the other): a BadArgument naming the argument, and a ValueError too. Nothing
    was sent."""


class Undecryptable(PgqError):
    """An encrypted payload or result (the envelope of docs/encryption.md) that the key ring cannot
    open: altered (its tag does not authenticate), malformed, or of another envelope version."""


class UnknownKey(Undecryptable):
    """The envelope's key (``kid``) is not in the key ring: never given, or dropped (erasure). The
    message names the kid and the ring's ids, never a key."""

    def __init__(self, kid: object, kids: list[str]) -> None:
        super().__init__(f"the envelope was encrypted with key {kid!r}, which is not in the key ring (it has: "
                         f"{', '.join(map(repr, kids)) or 'none'})", None,
                         "give that key in keys=, or the value is erased for good if the key was deleted")
        self.kid = kid
        self.kids = kids

    def __reduce__(self) -> tuple[type[UnknownKey], tuple[object, list[str]]]:
        return type(self), (self.kid, self.kids)


class JobNotFound(PgqError):
    """An admin call named a job that does not exist (P0002)."""


class WrongState(PgqError):
    """An admin call on a job in a state it does not apply to (55000)."""


class LeaseLost(WrongState):
    """The job is no longer this attempt's (its lease expired and another attempt took it, it was
    cancelled, or its max_run_time ran out): JobContext.transaction() raises it when the
    completion at the end of its block is refused, after rolling back everything the block wrote.
    A WrongState, as the refusal of pgq.dependency_results to an attempt that is no longer the
    job's is (its ``sqlstate`` is None: the refusal is pgq.complete's answer false, or what the
    worker knows already, not a server error)."""


class PermissionDenied(PgqError):
    """The role may not call this function, or a queue's grants do not admit the login (42501)."""


class ConnectionLost(PgqError):
    """The server could not be reached or the connection broke (class 08, or no SQLSTATE)."""


class WaitTimeout(PgqError, TimeoutError):
    """Client.wait (AsyncClient.wait, ``pgq-thin wait``) gave up: the job had not finished within the
    timeout. ``job_id`` and ``state`` (its state at the last look) are in the message and as
    attributes. Also a TimeoutError. The job itself is unchanged: wait again, or cancel it."""

    def __init__(self, job_id: int, state: str, timeout: float) -> None:
        super().__init__(f"job {job_id} did not finish within {timeout:g}s: it is {state}")
        self.job_id = job_id
        self.state = state
        self.timeout = timeout

    def __reduce__(self) -> tuple[type[WaitTimeout], tuple[int, str, float]]:
        return type(self), (self.job_id, self.state, self.timeout)


#: invalid_sql_statement_name (the prepared statement does not exist), duplicate_prepared_statement.
PREPARED_STATEMENT_ERRORS = ("26000", "42P05")


def translate(exc: psycopg.Error) -> PgqError:
    """Map a psycopg error to the pgq_thin exception for its SQLSTATE."""
    diag = exc.diag
    sqlstate = exc.sqlstate
    message = " ".join((diag.message_primary or str(exc)).split())
    hint = diag.message_hint or None
    cls: type[PgqError]
    if sqlstate is None:
        # No SQLSTATE: a client-side error (a bad parameter, say) unless the connection failed.
        lost = isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError))
        cls = ConnectionLost if lost else PgqError
    elif sqlstate in PREPARED_STATEMENT_ERRORS and "prepared statement" in message:
        # A named prepared statement is missing or already there: consecutive transactions ran on
        # different server connections, as behind a transaction-pooling proxy.
        return PgqError(f"{message}: behind a transaction-pooling proxy (PgBouncer pool_mode = transaction) "
                        "server-side prepared statements do not work", sqlstate,
                        "connect with pooled=True: Client(pooled=True), Worker(pooled=True) or "
                        "`pgq-thin worker --pooled`")
    elif sqlstate.startswith("08") or sqlstate in ("57P01", "57P02", "57P03"):
        cls = ConnectionLost  # connection exceptions; admin shutdown, crash shutdown, cannot connect now
    elif sqlstate.startswith("22"):
        cls = InvalidArgument
    elif sqlstate == "P0002":
        cls = JobNotFound
    elif sqlstate == "55000":
        cls = WrongState
    elif sqlstate == "42501":
        cls = PermissionDenied
    else:
        cls = PgqError
    return cls(message, sqlstate, hint)


@contextmanager
def translated() -> Iterator[None]:
    """Around sending a statement: a psycopg error becomes the pgq_thin exception for its
    SQLSTATE, and arguments that cannot be sent (a payload json cannot serialise) InvalidArgument."""
    try:
        yield
    except psycopg.Error as exc:
        raise translate(exc) from exc
    except TypeError as exc:
        raise InvalidArgument(f"cannot send the arguments: {exc}") from exc
    except RecursionError as exc:  # a jsonb value nested deeper than Python's json reads
        raise PgqError("a JSON value of the result is nested too deeply for Python's json to read", None,
                       "the connections pgq_thin opens read it as an UnreadableJson: give a pool of your own "
                       "kwargs={'context': pgq_thin.calls.READING}") from exc
