"""A deterministic multi-session harness, in the manner of PostgreSQL's isolation tester.

Named *sessions* (one psycopg connection each, plus a dedicated thread) run named *steps* in the
order the experiment writes them. A step runs in its session's thread; the caller waits until the
step either finishes or is seen waiting on a lock through ``pg_blocking_pids()`` from a separate
*control* connection.

Waits too short for that polling to see are caught by the waiting backend itself: every session
runs with ``log_lock_waits = on``, ``deadlock_timeout = 1ms`` and ``client_min_messages = log``
(when the role may set them: a superuser), so a wait of 1 ms or more on any heavyweight lock sends
the session "still waiting for … after … ms" and "acquired … after … ms" messages, which the
step records (``Step.lock_waits``; ``Step.lock_wait`` counts them). The resolution is therefore
1 ms (``deadlock_timeout``'s unit) whatever the polling interval; without the privilege it is the
polling's (the first look after 20 ms, then every ``poll_interval``), and
``Session.wait_logging`` says which. A blocked step is recorded as "blocked" (with the sessions it waits for) and
the experiment goes on with its next step; ``wait()`` later collects the step once the blocker has
let go. ``round()`` starts several steps behind a barrier so that they really run together.

Sessions are autocommit: a ``BEGIN`` step opens a transaction that stays open across steps until a
``COMMIT`` or ``ROLLBACK`` step, exactly as in an isolation-tester spec. Every step is recorded with
its session, name, the SQL text sent (parameters rendered client-side, so the log is what the
server ran), wall-clock start and end (UTC), outcome and rows.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import psycopg
from psycopg import ClientCursor
from psycopg.pq import TransactionStatus

__all__ = ["Check", "Harness", "Session", "Step", "StepHung", "Verdict", "sqlv", "utcnow"]

#: How long a step may neither finish nor block before the harness calls it hung.
DEFAULT_STEP_TIMEOUT = 20.0


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def sqlv(value: Any) -> str:
    """A value as SQL shows it (true, false, NULL), lists and tuples item by item."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(sqlv(v) for v in value) + "]"
    if isinstance(value, tuple):
        return "(" + ", ".join(sqlv(v) for v in value) + ")"
    return str(value)


#: The server's log_lock_waits messages: "process N still waiting for <lock> after 1.1 ms" and
#: "process N acquired <lock> after 5.1 ms".
_WAITING = re.compile(r"still waiting for (.+?) after [\d.]+ ms")
_ACQUIRED = re.compile(r"acquired .+? after ([\d.]+) ms")

#: What every session sets so that the server reports each lock wait of 1 ms or more to it.
WAIT_LOGGING = ("SET log_lock_waits = on", "SET deadlock_timeout = '1ms'", "SET client_min_messages = log")


class StepHung(RuntimeError):
    """A step neither finished nor waited on a lock within its timeout."""


@dataclass(eq=False)
class Step:
    """One executed (or executing) step and everything observed about it."""

    seq: int
    session: str
    name: str
    sql: str
    kind: str = "sql"  # sql | fixture | local | control
    round: str = ""
    template: str = ""  # the name of the lab statement it instantiates (claim, complete, ...)
    started_at: datetime | None = None
    ended_at: datetime | None = None
    blocked_at: datetime | None = None
    blocked_by: list[str] = field(default_factory=list)
    blocked_on: str = ""  # the lock it was seen waiting for (pg_locks: locktype, mode, relation)
    #: The lock-wait messages the server sent the step's session while it ran (log_lock_waits).
    lock_waits: list[str] = field(default_factory=list)
    columns: list[str] = field(default_factory=list)
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    rowcount: int = -1
    sqlstate: str | None = None
    message: str | None = None
    future: Future[None] | None = field(default=None, repr=False)

    @property
    def done(self) -> bool:
        return self.ended_at is not None

    @property
    def blocked(self) -> bool:
        return self.blocked_at is not None

    @property
    def logged_waits(self) -> list[str]:
        """The locks the server reported this step waiting for (1 ms or more), as "<mode> on <what>"."""
        return [m.group(1) for m in map(_WAITING.search, self.lock_waits) if m]

    @property
    def lock_wait(self) -> bool:
        """Waited on a lock other than a relation-extension lock — a row, transaction or table
        lock, what SKIP LOCKED is about — either seen in pg_blocking_pids() or reported by the
        server (log_lock_waits). A brief 'extend' wait (two sessions growing the same table at
        once) is physical contention, recorded but not counted here."""
        if any(" on extension of relation " not in w for w in self.logged_waits):
            return True
        if not self.blocked:
            return False
        waits = [w for w in self.blocked_on.split("; ") if w]
        return not (waits and all(w.startswith("extend") for w in waits))

    @property
    def lock_wait_ms(self) -> float:
        """How long the server says this step waited for locks: the sum of its "acquired … after
        N ms" reports; for a step seen blocked without one (the lock never came), its whole run;
        else 0 (no wait of 1 ms or more, when wait logging is on)."""
        acquired = [float(m.group(1)) for m in map(_ACQUIRED.search, self.lock_waits) if m]
        if acquired:
            return sum(acquired)
        return self.waited_ms

    @property
    def ok(self) -> bool:
        return self.done and self.sqlstate is None

    @property
    def value(self) -> Any:
        """The first column of the first row (None when there is no row)."""
        return self.rows[0][0] if self.rows else None

    def col(self, name: str) -> list[Any]:
        i = self.columns.index(name)
        return [r[i] for r in self.rows]

    def dicts(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, r)) for r in self.rows]

    @property
    def duration_ms(self) -> float | None:
        if self.started_at is None or self.ended_at is None:
            return None
        return (self.ended_at - self.started_at).total_seconds() * 1000

    @property
    def waited_ms(self) -> float:
        """For a step seen blocked: its whole run, start to end (it waited from the start); else 0."""
        if self.blocked_at is None or self.duration_ms is None:
            return 0.0
        return self.duration_ms

    @property
    def outcome(self) -> str:
        on = f" ({self.blocked_on})" if self.blocked_on else ""
        prefix = f"blocked by {','.join(self.blocked_by)}{on} then " if self.blocked else ""
        if not self.blocked and self.logged_waits:
            prefix = f"waited {self.lock_wait_ms:.1f} ms on {'; '.join(self.logged_waits)} then "
        if not self.done:
            return "blocked" if self.blocked else "running"
        if self.sqlstate is not None:
            return f"{prefix}error {self.sqlstate}: {self.message}"
        return f"{prefix}ok"


@dataclass
class Check:
    label: str
    passed: bool
    observed: str


@dataclass
class Verdict:
    """What an experiment concluded: its checks, and its observation written from the data."""

    checks: list[Check] = field(default_factory=list)
    observation: list[str] = field(default_factory=list)
    extra: dict[str, str] = field(default_factory=dict)  # e.g. {"query-plans.txt": "..."}

    def check(self, label: str, passed: bool, observed: str) -> bool:
        self.checks.append(Check(label, bool(passed), observed))
        return bool(passed)

    def observe(self, sentence: str) -> None:
        self.observation.append(sentence)

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)


class Session:
    """A named connection with its own thread: its steps run one after another, in order."""

    def __init__(self, harness: Harness, name: str, *, autocommit: bool = True) -> None:
        self.harness = harness
        self.name = name
        self.conn = psycopg.connect(harness.dsn, autocommit=autocommit,
                                    application_name=f"pgq-lab {name}"[:63])
        self.pid: int = self.conn.info.backend_pid
        #: (severity, message) of every notice and LOG message the server sent this session. The
        #: Diagnostic object is only valid inside the handler, so its fields are copied there.
        self.notices: list[tuple[str, str]] = []
        self.conn.add_notice_handler(
            lambda d: self.notices.append((d.severity_nonlocalized or d.severity or "", d.message_primary or "")))
        #: Whether the server reports this session's lock waits of 1 ms or more (WAIT_LOGGING needs
        #: a role that may set log_lock_waits and deadlock_timeout: a superuser).
        self.wait_logging = True
        for setting in WAIT_LOGGING:
            try:
                self.conn.execute(setting)
            except psycopg.Error:
                self.wait_logging = False
                if not autocommit:
                    self.conn.rollback()
        if not self.wait_logging:
            self.conn.execute("RESET client_min_messages")
        if not autocommit:
            self.conn.commit()
        self.alive = True
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"lab-{name}")

    @property
    def in_transaction(self) -> bool:
        return self.conn.info.transaction_status in (TransactionStatus.INTRANS, TransactionStatus.INERROR)

    def submit(self, step: Step, action: str | Callable[[], Any],
               barrier: threading.Barrier | None) -> None:
        step.future = self._pool.submit(self._run, step, action, barrier)

    def _run(self, step: Step, action: str | Callable[[], Any],
             barrier: threading.Barrier | None) -> None:
        if barrier is not None:
            barrier.wait(timeout=DEFAULT_STEP_TIMEOUT)
        mark = len(self.notices)
        step.started_at = utcnow()
        try:
            if callable(action):
                result = action()
                if result is not None:
                    step.columns, step.rows = ["result"], [(result,)]
            else:
                cur = self.conn.execute(action)
                step.rowcount = cur.rowcount
                if cur.description is not None:
                    step.columns = [d.name for d in cur.description]
                    step.rows = cur.fetchall()
        except psycopg.Error as exc:
            step.sqlstate = exc.sqlstate
            step.message = (exc.diag.message_primary if exc.diag else None) or str(exc).strip()
        finally:
            step.ended_at = utcnow()
            step.lock_waits = [m for sev, m in self.notices[mark:]
                               if sev == "LOG" and (_WAITING.search(m) or _ACQUIRED.search(m))]

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.conn.close()
        self.alive = False


class Harness:
    """Sessions, steps, barriers and the step log of one experiment, on one database."""

    def __init__(self, dsn: str, experiment: str = "", *, poll_interval: float = 0.005,
                 step_timeout: float = DEFAULT_STEP_TIMEOUT,
                 templates: dict[str, str] | None = None) -> None:
        self.dsn = dsn
        self.experiment = experiment
        self.poll_interval = poll_interval
        self.step_timeout = step_timeout
        self.templates = templates or {}
        self.control = psycopg.connect(dsn, autocommit=True, application_name="pgq-lab control")
        self.sessions: dict[str, Session] = {}
        self.steps: list[Step] = []
        self.transcript: list[tuple[datetime, str]] = []
        self.started_at = utcnow()
        self._seq = itertools.count(1)
        self._renderer = ClientCursor(self.control)

    # Sessions ----------------------------------------------------------------------------------

    def session(self, name: str, *, autocommit: bool = True) -> Session:
        if name in self.sessions and self.sessions[name].alive:
            raise ValueError(f"session {name!r} already exists")
        s = Session(self, name, autocommit=autocommit)
        self.sessions[name] = s
        return s

    def _session(self, session: Session | str) -> Session:
        return self.sessions[session] if isinstance(session, str) else session

    def name_of(self, pid: int) -> str:
        for s in self.sessions.values():
            if s.pid == pid:
                return s.name
        return f"pid {pid}"

    # Steps -------------------------------------------------------------------------------------

    def render(self, sql: str, params: Any = None) -> str:
        """The statement with its parameters rendered as literals: exactly what is sent."""
        if params is None:
            return sql
        return self._renderer.mogrify(sql, params)

    def _new_step(self, session: Session, name: str, sql: str, params: Any, kind: str,
                  round_name: str = "") -> Step:
        step = Step(seq=next(self._seq), session=session.name, name=name,
                    sql=self.render(sql, params), kind=kind, round=round_name,
                    template=self.templates.get(sql, ""))
        self.steps.append(step)
        return step

    def start(self, session: Session | str, name: str, sql: str | None = None, params: Any = None,
              *, fn: Callable[[], Any] | None = None, describe: str = "", kind: str | None = None) -> Step:
        """Start a step in its session's thread and return at once (a background step)."""
        s = self._session(session)
        if not s.alive:
            raise RuntimeError(f"session {s.name} is gone")
        if fn is not None:
            step = self._new_step(s, name, f"-- local: {describe or name}", None, kind or "local")
            s.submit(step, fn, None)
        else:
            assert sql is not None
            step = self._new_step(s, name, sql, params, kind or "sql")
            s.submit(step, step.sql, None)
        return step

    def step(self, session: Session | str, name: str, sql: str | None = None, params: Any = None,
             *, fn: Callable[[], Any] | None = None, describe: str = "", kind: str | None = None,
             timeout: float | None = None) -> Step:
        """Run a step: return when it finished, or as soon as it is seen blocked on a lock."""
        step = self.start(session, name, sql, params, fn=fn, describe=describe, kind=kind)
        self._settle(step, self.step_timeout if timeout is None else timeout)
        return step

    def fixture(self, name: str, sql: str, params: Any = None) -> Step:
        """A set-up statement (recorded in seed.sql); it must succeed."""
        if "fixture" not in self.sessions:
            self.session("fixture")
        step = self.step("fixture", name, sql, params, kind="fixture")
        if not step.ok:
            raise RuntimeError(f"fixture {name} failed: {step.outcome}")
        return step

    def _blockers(self, pid: int) -> tuple[list[int], str]:
        """The pids a backend waits for (pg_blocking_pids) and the locks it waits on (pg_locks)."""
        row = self.control.execute(
            "SELECT pg_blocking_pids(%(pid)s), (SELECT string_agg(concat_ws(' ', locktype, mode,"
            " relation::regclass::text), '; ') FROM pg_locks WHERE pid = %(pid)s AND NOT granted)",
            {"pid": pid}).fetchone()
        if not row or not row[0]:
            return [], ""
        return list(row[0]), row[1] or ""

    def _mark_blocked(self, step: Step, blockers: list[int], waits: str) -> None:
        step.blocked_at = utcnow()
        step.blocked_by = [self.name_of(p) for p in blockers]
        step.blocked_on = waits

    def _settle(self, step: Step, timeout: float) -> None:
        assert step.future is not None
        pid = self.sessions[step.session].pid
        deadline = time.monotonic() + timeout
        wait = min(0.02, timeout)
        while True:
            try:
                step.future.result(timeout=wait)
                return
            except FutureTimeout:
                pass
            if step.kind != "local":
                blockers, waits = self._blockers(pid)
                if blockers:
                    self._mark_blocked(step, blockers, waits)
                    return
            if time.monotonic() > deadline:
                raise StepHung(f"{self.experiment}: step {step.name} ({step.session}) neither finished "
                               f"nor blocked within {timeout:.1f}s")
            wait = self.poll_interval

    def wait(self, step: Step, timeout: float | None = None) -> Step:
        """Wait for a blocked or background step to finish."""
        assert step.future is not None
        try:
            step.future.result(timeout=self.step_timeout if timeout is None else timeout)
        except FutureTimeout:
            raise StepHung(f"{self.experiment}: step {step.name} ({step.session}) did not finish") from None
        return step

    def round(self, name: str, items: Sequence[tuple[Session | str, str, str, Any]],
              timeout: float | None = None) -> list[Step]:
        """Run one step per session behind a barrier (all start together); wait for all of them.

        Any step seen waiting on a lock meanwhile is marked blocked (and still waited for)."""
        sessions = [self._session(s) for s, _, _, _ in items]
        if len({s.name for s in sessions}) != len(sessions):
            raise ValueError("a round takes one step per session")
        barrier = threading.Barrier(len(items))
        steps = []
        for s, (_, step_name, sql, params) in zip(sessions, items):
            step = self._new_step(s, step_name, sql, params, "sql", round_name=name)
            s.submit(step, step.sql, barrier)
            steps.append(step)
        deadline = time.monotonic() + (self.step_timeout if timeout is None else timeout)
        pending = list(zip(steps, sessions))
        while pending:
            still = []
            for step, s in pending:
                assert step.future is not None
                if step.future.done():
                    step.future.result()
                    continue
                if not step.blocked:
                    blockers, waits = self._blockers(s.pid)
                    if blockers:
                        self._mark_blocked(step, blockers, waits)
                still.append((step, s))
            pending = still
            if pending:
                if time.monotonic() > deadline:
                    raise StepHung(f"{self.experiment}: round {name} did not finish")
                time.sleep(self.poll_interval)
        return steps

    def kill(self, session: Session | str, name: str = "") -> Step:
        """Terminate a session's backend from the control connection, as a crash would."""
        s = self._session(session)
        step = self._new_step(s, name or f"{s.name}_crash",
                              f"SELECT pg_terminate_backend({s.pid})", None, "control")
        step.started_at = utcnow()
        row = self.control.execute(step.sql).fetchone()
        step.columns, step.rows = ["pg_terminate_backend"], [tuple(row) if row else (None,)]
        # Wait until the backend is really gone, so that its transaction has ended.
        for _ in range(2000):
            if not self.control.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (s.pid,)).fetchone():
                break
            time.sleep(0.005)
        step.ended_at = utcnow()
        try:
            s.close()
        except Exception:  # noqa: BLE001 - the connection is broken on purpose
            s.alive = False
        return step

    def note(self, text: str) -> None:
        """A line for the experiment's transcript (snapshots, per-round tables, ...)."""
        self.transcript.append((utcnow(), text))

    def close(self) -> None:
        # Cancel whatever is still running (a step left blocked by a failed experiment).
        for s in self.sessions.values():
            if s.alive:
                try:
                    self.control.execute("SELECT pg_cancel_backend(%s)", (s.pid,))
                except psycopg.Error:
                    pass
        for s in self.sessions.values():
            if s.alive:
                try:
                    s.close()
                except Exception:  # noqa: BLE001
                    s.alive = False
        self.control.close()

    def __enter__(self) -> Harness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
