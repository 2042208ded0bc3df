"""The pgq-thin command (also python -m pgq_thin). Each subcommand is one client call or a
small loop of them; errors print one line and exit non-zero."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import math
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any, NoReturn

import psycopg

from pgq_thin import __version__, queries
from pgq_thin.client import Client, bulk_calls, resolve_dsn
from pgq_thin.durations import format_duration, parse_duration
from pgq_thin.encryption import envelope_label
from pgq_thin.errors import BadArgument, JobNotFound, PermissionDenied, PgqError, WaitTimeout, translate
from pgq_thin.models import JobRecord, JobResult, QueueSettings, StepRecord, UnreadableJson, error_summary
from pgq_thin.worker import AsyncWorker, Worker

# What the command prints ---------------------------------------------------------------------------
# Everything pgq-thin prints goes through say() (or, cell by cell, through clean()): text from the
# database (errors, notes, payloads, worker names, other sessions' details) and from users (names
# in error messages) may hold terminal control sequences. A control character is shown as its
# escape (ESC as \x1b), never sent to the terminal: the C0 controls and DEL, the C1 controls
# (U+0080-U+009F, 8-bit CSI among them), the bidirectional overrides and isolates (which reorder
# what is shown) and the line and paragraph separators. Newlines and tabs stay where the layout
# has room for them (the lines of a traceback, the text of a message); inside one table cell or
# one line of a listing a newline is shown as \n and a tab as a space.

_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_UNSAFE_IN_A_LINE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": " "}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    return _ESCAPES.get(char) or (f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")


def clean(text: str, *, lines: bool = False) -> str:
    """``text`` safe to print: its control characters shown as escapes. ``lines``: newlines and
    tabs are kept (a Windows line end is a newline)."""
    if text.isprintable():
        return text
    if lines:
        return _UNSAFE.sub(_escape, text.replace("\r\n", "\n"))
    return _UNSAFE_IN_A_LINE.sub(_escape, text)


def say(text: object = "", *, err: bool = False, end: str = "\n", flush: bool = False, lines: bool = True) -> None:
    """Print ``text`` (to stderr with ``err``), cleaned: the one way pgq-thin prints. ``lines=False``
    for what must stay one line (an error message)."""
    print(clean(str(text), lines=lines), end=end, file=sys.stderr if err else sys.stdout, flush=flush)


class _CleanFormatter(logging.Formatter):
    """The worker command's log lines, cleaned (a job's error or kind comes from the database)."""

    def format(self, record: logging.LogRecord) -> str:
        return clean(super().format(record), lines=True)


# Arguments ---------------------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error in one line (exit 2): what was wrong and where the help is."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{clean(self.prog)}: error: {clean(message)} (see {clean(self.prog)} --help)\n")


def duration(text: str) -> timedelta:
    """'30s' / '500ms' / '5m' / '2h' / '7d' / '1h 30m' -> timedelta; a number needs its unit."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def job_id(text: str, what: str = "job") -> int:
    """A job id: a positive integer a bigint holds."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a {what} id: {text!r}") from None
    if not 0 < value < 2 ** 63:
        raise argparse.ArgumentTypeError(f"not a {what} id: {text!r} (ids are from 1 to 2^63-1)")
    return value


def batch_id(text: str) -> int:
    """A batch id (pgq.batch_open's): a positive integer a bigint holds."""
    return job_id(text, "batch")


def job_ids(text: str) -> list[int]:
    """Comma-separated job ids (--depends-on 1,2,3)."""
    parts = [part.strip() for part in text.split(",")]
    if not all(parts):
        raise argparse.ArgumentTypeError(f"not a comma-separated list of job ids: {text!r}")
    return [job_id(part) for part in parts]


def wait_seconds(text: str) -> float:
    """wait's --timeout: a number of seconds (0 or more), or a duration with its unit (30s, 5m)."""
    try:
        value = float(text)
    except ValueError:
        try:
            return parse_duration(text).total_seconds()
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number of seconds nor a duration (30s, 5m): {text!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds, got {text!r}")
    return value


def positive_seconds(text: str) -> float:
    """A number of seconds, more than 0 and at most a day (--watch)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not (math.isfinite(value) and 0 < value <= 86400):
        raise argparse.ArgumentTypeError(f"must be more than 0 and at most 86400 seconds, got {text!r}")
    return value


def before_time(text: str) -> datetime | timedelta:
    """retry's and cancel's --before: a time (ISO 8601, as --run-at takes it; without an offset, this
    machine's local time) or a duration with its unit, meaning that long ago by the database's clock."""
    try:
        return parse_duration(text)
    except ValueError:
        pass
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a time nor a duration: {text!r} (a time such as 2026-12-05T14:00 or "
                                         "2026-12-05T14:00:00+00:00, or how long ago, such as 30m, 2h or 7d)") from None
    return value if value.tzinfo is not None else value.astimezone()


def positive_count(text: str) -> int:
    """A number of jobs, 1 or more (--limit)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < 2 ** 63:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {text!r}")
    return value


def queue_list(text: str) -> list[str]:
    names = [q.strip() for q in text.split(",") if q.strip()]
    if not names:
        raise argparse.ArgumentTypeError("give at least one queue name")
    return names


def prefetch_setting(text: str) -> int | str:
    """``auto`` or a number (the Worker checks its range)."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be auto or a number, got {text!r}") from None


def _check_database(dsn: str, *, metrics: bool = False) -> None:
    """Connect once directly: an unreachable server then fails at once, with libpq's own message,
    instead of a pool (or a worker) retrying in the background; a database without pgq (or, with
    ``metrics``, without pgq.metrics()) is told what to run."""
    with psycopg.connect(dsn, connect_timeout=10, autocommit=True) as conn:
        if conn.execute(queries.SCHEMA_MISSING).fetchone() == (True,):
            raise PgqError('schema "pgq" does not exist', "3F000", _NOT_INSTALLED)
        if metrics and conn.execute(queries.METRICS_MISSING).fetchone() == (True,):
            raise PgqError("this database's pgq schema has no pgq.metrics() (migration 0010)", "42883",
                           "run pgq-thin migrate")


def _client(args: argparse.Namespace) -> Client:
    dsn = resolve_dsn(args.dsn)
    _check_database(dsn)
    return Client(dsn, min_size=1, max_size=2)


def _fmt(value: Any, lines: bool = False) -> str:
    """A value as the command shows it, cleaned (``lines``: it may take several lines)."""
    if value is None:
        return "-"
    if isinstance(value, timedelta):
        return format_duration(value)  # as the dashboard writes it: 1h, 3m 12s, 4.5s
    return clean(str(value), lines=lines)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A table: the first column and text columns left-aligned, columns of numbers (and "-" for
    none) right-aligned, with their headers."""
    cells = [[_fmt(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    right = [i > 0 and all(row[i] is None or _number(row[i]) for row in rows) for i in range(len(headers))]
    out = ["  ".join(h.rjust(w) if r else h.ljust(w) for h, w, r in zip(headers, widths, right)).rstrip(),
           "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(row, widths, right)).rstrip()
            for row in cells]
    return "\n".join(out)


# The hints pgq's functions give name SQL; a CLI user is told the command instead.
_RESOLVE_HINT = "Use pgq.resolve for outcome_unknown jobs."
_CLI_HINTS = {
    _RESOLVE_HINT: "Settle it with pgq-thin resolve {id} done|pending|failed|cancelled.",
    "No worker is claiming or sweeping: run pgq.sweep() and check the workers.":
        "No worker is claiming or sweeping: run pgq-thin sweep and check the workers.",
    "Find out what happened, then pgq.resolve(id, 'done' | 'pending' | 'failed' | 'cancelled').":
        "Find out what happened (pgq-thin jobs --state outcome_unknown lists them), then "
        "pgq-thin resolve ID done|pending|failed|cancelled.",
    "A queue is created by its first job or by pgq.configure_queue; pgq.stats() lists them.":
        "A queue is created by its first job; pgq-thin stats lists them.",
    "Use a name from pg_timezone_names, such as 'Europe/Paris' or 'UTC'.":
        "Use an IANA time zone name, such as Europe/Paris, or UTC.",
}
_NOT_INSTALLED = "pgq is not installed in this database: run pgq-thin migrate."


def _for_cli(exc: PgqError, job_id: int | None = None) -> PgqError:
    """The error with a hint for a command-line user: commands, not SQL."""
    hint = exc.hint
    if exc.sqlstate == "3F000" and '"pgq"' in exc.message:  # invalid_schema_name: no schema pgq
        hint = _NOT_INSTALLED
    elif hint == _RESOLVE_HINT and " is outcome_unknown," not in exc.message:
        hint = None  # pgq.retry of a job that is not outcome_unknown: resolve would refuse it too
    elif hint in _CLI_HINTS:
        hint = _CLI_HINTS[hint].replace("{id}", str(job_id) if job_id is not None else "ID")
    return type(exc)(exc.message, exc.sqlstate, hint)


# Commands ------------------------------------------------------------------------------------------

def cmd_migrate(args: argparse.Namespace) -> int:
    from pgq_thin.migrate import migrate, pending_migrations

    dsn = resolve_dsn(args.dsn)
    if args.list:
        pending = pending_migrations(dsn)
        say("\n".join(f"pending: {m}" for m in pending) if pending else "up to date: no pending migrations")
        return 0
    try:
        applied = migrate(dsn, lock_timeout=args.lock_timeout)
    except ValueError as exc:
        raise BadArgument(f"--{exc}".replace("lock_timeout", "lock-timeout", 1)) from None
    say((f"applied: {', '.join(applied)}" if applied else "up to date: no pending migrations")
        + "; functions installed")
    return 0


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not a JSON value")


#: The hint of every payload refused on the command line: what one looks like, quoted for the shell.
PAYLOAD_HINT = """a payload is a JSON object in single quotes, such as '{"to": "ada@example.com"}', or - to read it \
from stdin"""
#: JSON's names for what Python's json reads.
_JSON_TYPES = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean",
               type(None): "null"}


def _payload(text: str) -> dict[str, Any]:
    """The payload argument (or stdin for ``-``), parsed: text that is not JSON, and JSON that is
    not an object (pgq's payloads are objects), are usage errors (exit 2) with the same hint."""
    try:
        raw = sys.stdin.read() if text == "-" else text
        value = json.loads(raw, parse_constant=_not_json) if raw.strip() else {}
    except UnicodeDecodeError as exc:
        raise BadArgument(f"payload is not UTF-8 text: {exc}", hint=PAYLOAD_HINT) from None
    except RecursionError:
        raise BadArgument("payload is nested too deeply", hint=PAYLOAD_HINT) from None
    except ValueError as exc:  # json.JSONDecodeError; a number of more than 4300 digits
        raise BadArgument(f"payload is not valid JSON: {exc}", hint=PAYLOAD_HINT) from None
    if not isinstance(value, dict):
        raise BadArgument(f"payload must be a JSON object, got {_JSON_TYPES.get(type(value), 'JSON')}: "
                          f"{clean(raw.strip())[:40]}", hint=PAYLOAD_HINT)
    return value


def cmd_enqueue(args: argparse.Namespace) -> int:
    payload = _payload(args.payload)
    settings = {"run_at": args.run_at, "priority": args.priority, "max_attempts": args.max_attempts,
                "unique_key": args.unique_key, "tenant": args.tenant, "max_run_time": args.max_run_time,
                "concurrency_key": args.concurrency_key, "depends_on": args.depends_on,
                "dependency_mode": args.dependency_mode, "batch": args.batch,
                "notify_finished": args.notify_finished, "on_conflict": args.on_conflict,
                "start_by": args.start_by, "max_lifetime": args.max_lifetime, "tags": args.tag,
                "unique_for": args.unique_for}
    with _client(args) as client:
        if args.unique_key is None:
            job_id = client.enqueue(args.queue, args.kind, payload, **settings)
            existing = False
        else:
            # pgq.enqueue answers a live job's id for a key it holds, and then (on_conflict keep)
            # writes nothing: a transaction that wrote nothing has no transaction id. (With replace
            # it writes: the holder updated, or a new job after a running holder.)
            with client.pool.connection() as conn, conn.transaction():
                job_id = client.enqueue(args.queue, args.kind, payload, conn=conn, **settings)
                existing = conn.execute(queries.WROTE_NOTHING).fetchone() == (True,)
    say(job_id)
    if existing:
        say(f"pgq-thin: existing job {job_id} (unique key {args.unique_key}): nothing enqueued", err=True, lines=False)
    return 0


def cmd_signal(args: argparse.Namespace) -> int:
    payload = _payload(args.payload)
    with _client(args) as client:
        woken = client.signal(args.queue, args.name, payload)
    say(woken)
    if woken == 0:
        say(f"pgq-thin: no job of queue {_fmt(args.queue)} was waiting for {_fmt(args.name)} (or it was sent "
            "before: the first signal of a name wins)", err=True, lines=False)
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    module_name, _, attr = args.app.partition(":")
    if not module_name or not attr:
        raise BadArgument(f"--app must look like module:attribute, got {args.app!r}")
    sys.path.insert(0, ".")
    try:
        worker = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise PgqError(f"cannot load the worker {args.app!r}: {exc}") from None
    if not isinstance(worker, (Worker, AsyncWorker)):
        raise BadArgument(f"--app must name a pgq_thin Worker or AsyncWorker; {args.app!r} is a "
                          f"{type(worker).__name__}")
    logs = logging.StreamHandler()
    logs.setFormatter(_CleanFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO if not args.quiet else logging.WARNING, handlers=[logs])
    if args.metrics_port is not None:
        worker.metrics_port = args.metrics_port
        worker.metrics_host = args.metrics_host
        _require_extra("metrics", "prometheus_client", "--metrics-port")
    token = args.metrics_token or os.environ.get("PGQ_METRICS_TOKEN") or None
    if token is not None:
        try:
            worker.metrics_token = token
        except ValueError as exc:
            raise BadArgument(f"--metrics-token / $PGQ_METRICS_TOKEN: {exc}") from None
    settings: dict[str, Any] = {"queues": args.queues, "concurrency": args.concurrency, "prefetch": args.prefetch}
    if args.pooled:
        settings["pooled"] = True
    dsn = resolve_dsn(args.dsn)
    # A worker that cannot reach its database when it starts exits 1 with the reason; once it
    # runs, a lost connection is retried (a restart of the server is not the end of the worker).
    _check_database(dsn)
    try:
        if isinstance(worker, AsyncWorker):
            asyncio.run(worker.run(dsn, **settings))
        else:
            worker.run(dsn, **settings)
    except ValueError as exc:  # a setting out of range (run() checks them before it connects)
        raise BadArgument(str(exc)) from None
    return 1 if worker.stopped_at_once else 0  # a second signal: its running jobs were left to their leases


_STATS_HEADERS = ["queue", "paused", "pending", "scheduled", "waiting", "running", "expired", "done", "failed",
                  "cancelled", "unknown", "oldest ready"]


def _stats_row(r: Any) -> list[Any]:
    return [r.queue, "yes" if r.paused else "no", r.pending, r.scheduled, r.waiting, r.running, r.expired, r.done,
            r.failed, r.cancelled, r.outcome_unknown, r.oldest_ready_age]


_LIMITS_HEADERS = ["queue", "ready", "running", "held by max_running", "key limit", "rate limit", "key rate limit",
                   "next token in"]


def _limits_table(client: Client) -> str | None:
    """The queues with a limit and what each limit holds back now (pgq.queue_limits), or None
    when no queue has a limit."""
    rows = client.queue_limits()
    if not rows:
        return None
    now = datetime.now(timezone.utc)
    return _table(_LIMITS_HEADERS, [
        [r.queue, r.ready, r.running, r.held_by_max_running, r.held_by_key_limit, r.held_by_rate_limit,
         r.held_by_key_rate_limit, None if r.next_token_at is None else max(r.next_token_at - now, timedelta(0))]
        for r in rows])


def cmd_stats(args: argparse.Namespace) -> int:
    with _client(args) as client:
        if not args.watch:
            rows = client.stats()
            say(_table(_STATS_HEADERS, [_stats_row(r) for r in rows]) if rows else "no queues yet")
            if rows and (limits := _limits_table(client)) is not None:
                say("\nheld back by limits (due jobs each limit holds back now):\n" + limits)
            return 0
        previous: dict[str, int] = {}
        try:
            while True:
                rows = client.stats()
                sys.stdout.write("\x1b[2J\x1b[H" if sys.stdout.isatty() else "\n")
                say(f"pgq stats at {datetime.now():%H:%M:%S} (every {args.watch:g}s, Ctrl-C to stop)")
                table = []
                for r in rows:
                    rate = (r.done - previous[r.queue]) / args.watch if r.queue in previous else None
                    previous[r.queue] = r.done
                    table.append(_stats_row(r) + [None if rate is None else f"{rate:.1f}"])
                say(_table(_STATS_HEADERS + ["done/s"], table) if table else "no queues yet")
                sys.stdout.flush()
                time.sleep(args.watch)
        except KeyboardInterrupt:
            return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    with _client(args) as client:
        say(f"recovered {client.sweep(args.max_jobs)} job(s) with an expired lease or a timed-out attempt; "
            "fired the due schedules")
    return 0


def _when(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")


def cmd_schedule_add(args: argparse.Namespace) -> int:
    payload = _payload(args.payload)
    with _client(args) as client:
        s = client.schedule(args.name, args.queue, args.kind, cron=args.cron, every=args.every,
                            payload=payload, timezone=args.timezone, priority=args.priority,
                            max_attempts=args.max_attempts, tenant=args.tenant,
                            skip_if_running=args.skip_if_running, enabled=not args.disabled)
    say(f"schedule {s.name}: next run at {_when(s.next_run_at)}")
    return 0


def cmd_schedule_list(args: argparse.Namespace) -> int:
    with _client(args) as client:
        rows = client.schedules()
    headers = ["name", "queue", "kind", "when", "timezone", "enabled", "next run", "last run", "last job", "skipped"]
    say(_table(headers, [[s.name, s.queue, s.kind, s.cron if s.cron is not None else f"every {_fmt(s.every)}",
                            s.timezone, "yes" if s.enabled else "no", _when(s.next_run_at),
                            _when(s.last_run_at), s.last_job_id, s.skipped] for s in rows])
          if rows else "no schedules")
    return 0


def cmd_schedule_rm(args: argparse.Namespace) -> int:
    with _client(args) as client:
        if not client.unschedule(args.name):
            raise PgqError(f"no schedule named {args.name!r}")
    say(f"schedule {args.name}: removed")
    return 0


def cmd_batch_open(args: argparse.Namespace) -> int:
    payload = _payload(args.payload)
    with _client(args) as client:
        batch = client.batch_open(args.callback_queue, args.callback_kind, payload, run_when=args.run_when,
                                  joiners=args.joiner)
    say(batch)
    return 0


def cmd_batch_close(args: argparse.Namespace) -> int:
    with _client(args) as client:
        sealed = client.batch_close(args.id)
    say(f"batch {args.id}: " + ("closed: no members may be added; its callback comes once they have ended"
                                if sealed else "was already closed"))
    return 0


def cmd_batch_status(args: argparse.Namespace) -> int:
    with _client(args) as client:
        b = client.batch_status(args.id)
    callback = f"{b.callback_kind} into queue {b.callback_queue}, when {b.run_when.replace('_', ' ')}"
    rows = [("batch", b.batch_id), ("state", b.state), ("opened by", b.opened_by), ("callback", callback),
            ("callback job", b.callback_job_id if b.callback_job_id is not None else "not enqueued yet"),
            ("members", f"{b.members}: {b.unfinished} unfinished, {b.done} done, {b.failed} failed, "
                        f"{b.cancelled} cancelled"),
            ("created", _when(b.created_at)), ("closed", _when(b.sealed_at)), ("finished", _when(b.finished_at))]
    for name, value in rows:
        say(f"{name + ':':<14}{_fmt(value)}")
    return 0


def cmd_batch_cancel(args: argparse.Namespace) -> int:
    with _client(args) as client:
        cancelled = client.cancel_batch(args.id)
    say(f"batch {args.id}: cancelled, with its callback; {cancelled} member(s) that had not started cancelled "
        "now (at most 1000 a call: pgq-thin sweep cancels the rest)")
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    total = 0
    with _client(args) as client:
        while True:
            n = client.prune(args.older_than, args.batch)
            total += n
            if n:
                print(f"\rpruned {total} finished job(s)...", end="", file=sys.stderr, flush=True)  # ours: no data
            if n < args.batch or not args.all:
                break
    if total:
        say(err=True)
    say(f"pruned {total} finished job(s)")
    return 0


def _each_job(ids: Sequence[int], act: Any) -> int:
    """Act on every id, report each (errors on stderr), and fail when any failed."""
    failed = 0
    for job_id in ids:
        try:
            say(f"job {job_id}: {act(job_id)}", flush=True)
        except PgqError as exc:
            failed += 1
            say(f"pgq-thin: error: job {job_id}: {_for_cli(exc, job_id)}", err=True, flush=True, lines=False)
    if failed and len(ids) > 1:
        say(f"pgq-thin: {failed} of {len(ids)} jobs failed; the others were acted on", err=True)
    return 1 if failed else 0


#: The options of retry's and cancel's filter form.
_FILTER_OPTIONS = ("queue", "state", "kind", "tag", "before", "limit", "all")


def _by_filter(args: argparse.Namespace) -> bool:
    """Whether retry / cancel was given job ids (False) or a filter with --all (True); a usage error
    (exit 2) for neither, both, or a filter without --all or without --queue and --state."""
    given = [f"--{name}" for name in _FILTER_OPTIONS if getattr(args, name) not in (None, False)]
    command = args.parser.prog
    if args.ids:
        if given:
            args.parser.error(f"give job ids or a filter ({', '.join(given)}), not both")
        return False
    if not given:
        args.parser.error(f"give job ids, or --queue Q --state S --all: {command} --queue mail --state "
                          f"{args.filter_states[0]} --all")
    missing = [f"--{name}" for name in ("queue", "state") if getattr(args, name) is None]
    if missing:
        args.parser.error(f"a filter needs --queue and --state (missing: {' and '.join(missing)})")
    if not args.all:
        args.parser.error(f"a filter alone is not enough: {command} by filter acts on every job that matches, "
                          "so add --all to ask for that (--limit N caps how many)")
    return True


def _act_by_filter(args: argparse.Namespace, act: Any, done: str) -> int:
    """retry / cancel by filter: ``act(client, before, limit_rows)`` (pgq.retry_jobs or
    pgq.cancel_jobs) in calls of at most BULK_CALL jobs until one acts on none, or on --limit jobs
    in all (pgq_thin.client.bulk_calls). Only
    jobs from before the command started are acted on (--before, if earlier): a job that fails
    again after its retry, or is enqueued meanwhile, is left alone, so the loop ends. Prints the
    total."""
    total = 0
    with _client(args) as client:
        with client.pool.connection() as conn:
            row = conn.execute(queries.CLOCK).fetchone()
        assert row is not None
        before: datetime = row[0]
        if isinstance(args.before, timedelta):
            try:
                before -= args.before
            except OverflowError:
                raise BadArgument(f"--before: {format_duration(args.before)} ago is before the year 1") from None
        elif args.before is not None:
            before = min(before, args.before)
        try:
            for total in bulk_calls(lambda rows: act(client, before, rows), args.limit):
                print(f"\r{done} {total} job(s)...", end="", file=sys.stderr, flush=True)  # ours: no data
        except PgqError:
            if total:
                say(err=True)
                say(f"pgq-thin: {done} {total} job(s) before this error:", err=True)
            raise
    if total:
        say(err=True)
    what = (f"{args.state} job(s) of queue {args.queue}" + (f" of kind {args.kind}" if args.kind else "")
            + (f" tagged {', '.join(args.tag)}" if args.tag else ""))
    say(f"{done} {total} {what}" + (f" (--limit {args.limit} reached: more may match)"
                                    if args.limit is not None and total == args.limit else ""))
    return 0


def cmd_retry(args: argparse.Namespace) -> int:
    if _by_filter(args):
        return _act_by_filter(args, lambda client, before, rows: client.retry_jobs(
            args.queue, args.state, args.kind, finished_before=before, limit_rows=rows, tags=args.tag), "retried")
    with _client(args) as client:
        return _each_job(args.ids, lambda job_id: client.retry(job_id) and "pending again")


def cmd_cancel(args: argparse.Namespace) -> int:
    if _by_filter(args):
        return _act_by_filter(args, lambda client, before, rows: client.cancel_jobs(
            args.queue, args.state, args.kind, created_before=before, limit_rows=rows, tags=args.tag), "cancelled")
    with _client(args) as client:
        return _each_job(args.ids, lambda job_id: "cancelled" if client.cancel(job_id)
                         else "had already finished, unchanged")


def cmd_delete(args: argparse.Namespace) -> int:
    _by_filter(args)  # (delete takes no job ids: a filter with --all, or a usage error)
    return _act_by_filter(args, lambda client, before, rows: client.delete_jobs(
        args.queue, args.state, args.kind, before=before, limit_rows=rows, tags=args.tag), "deleted")


def cmd_resolve(args: argparse.Namespace) -> int:
    with _client(args) as client:
        return _each_job([args.id], lambda job_id: client.resolve(job_id, args.state)
                         and f"resolved as {args.state}")


def _when_short(value: datetime | None) -> str | None:
    return None if value is None else f"{value:%Y-%m-%d %H:%M:%S}"


def _error_line(text: str | None, width: int = 60) -> str | None:
    """An error in one cell: a traceback's exception line (models.error_summary), cut to ``width``."""
    line = error_summary(text)
    return line if line is None or len(line) <= width else line[:width - 1] + "…"


def cmd_jobs(args: argparse.Namespace) -> int:
    if args.batch is not None:
        others = [f"--{name}" for name in ("queue", "kind", "tag") if getattr(args, name)]
        if others:
            args.parser.error(f"--batch lists a batch's members (of one --state at most): {', '.join(others)} "
                              "does not go with it")
    with _client(args) as client:
        if args.batch is not None:
            rows = client.batch_jobs(args.batch, args.state, limit_rows=args.limit, before_id=args.before)
        else:
            rows = client.list_jobs(args.queue, args.state, args.kind, limit_rows=args.limit, before_id=args.before,
                                    tags=args.tag)
    if not rows:
        say("no jobs" + (f" of batch {args.batch}" if args.batch is not None else "")
            + (f" before id {args.before}" if args.before else "") + " match")
        return 0
    say(_table(["id", "queue", "kind", "state", "attempt", "run at", "created", "finished", "last error"],
                 [[j.id, j.queue, j.kind, j.state, f"{j.attempt}/{j.max_attempts}", _when_short(j.run_at),
                   _when_short(j.created_at), _when_short(j.finished_at), _error_line(j.last_error)] for j in rows]))
    if len(rows) == args.limit:
        say(f"(the newest {len(rows)}; older ones: the same command with --before {rows[-1].id})")
    return 0


def _json(value: Any) -> str:
    if value is None or isinstance(value, UnreadableJson):
        return "-" if value is None else str(value)
    return envelope_label(value) or json.dumps(value, ensure_ascii=False)  # an envelope: its key id, never more


#: Linked jobs (dependencies, dependants, parent, children, awaited) pgq-thin job shows of each relation.
LINKS_SHOWN = 100
#: Recorded steps pgq-thin job shows (pgq.job_steps' first page, by name).
STEPS_SHOWN = 100
#: The SQLSTATE of a call of a function the schema does not have (older than this pgq-thin).
UNDEFINED_FUNCTION = "42883"


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def _steps_of(client: Client, job_id: int) -> list[StepRecord] | None:
    """The job's recorded steps (pgq.job_steps, the first STEPS_SHOWN); None when the login may not read
    them (job_result's rule) or the schema has none (before migration 0022)."""
    try:
        return client.job_steps(job_id, STEPS_SHOWN)
    except (JobNotFound, PermissionDenied):
        return None
    except PgqError as exc:
        if exc.sqlstate == UNDEFINED_FUNCTION:
            return None
        raise


def _waits_for(j: JobRecord) -> str | None:
    """What a parked job waits for: a signal (until its timeout), or the jobs it awaits."""
    if j.state != "waiting":
        return None
    if j.wait_signal is not None:
        return f"signal {_fmt(j.wait_signal)}" + (f" until {j.wake_at}" if j.wake_at else " (no timeout)")
    if j.last_event == "awaiting_jobs":
        return f"{j.dependencies_left} awaited job(s) to end"
    return None


def cmd_job(args: argparse.Namespace) -> int:
    with _client(args) as client:
        j = client.get_job(args.id)
        history = client.job_history(args.id)
        steps = _steps_of(client, args.id)
        # Asked only of a job that has any (a schema before migration 0017 has neither function).
        linked = (j.depends_on or j.has_dependants or j.parent_id is not None or j.state == "waiting"
                  or any(isinstance(s.result, dict) and set(s.result) == {"job_id"} for s in steps or []))
        links = client.job_links(args.id, LINKS_SHOWN) if linked else []
        batch = client.batch_status(j.batch_id) if j.batch_id is not None else None
    say(f"job {j.id}: {j.state} (attempt {j.attempt} of {j.max_attempts}), queue {_fmt(j.queue)}, kind {_fmt(j.kind)}")
    fields = [("payload", _json(j.payload)), ("result", _json(j.result)), ("last error", j.last_error),
              ("priority", j.priority), ("tenant", j.tenant), ("tags", None if j.tags is None else ", ".join(j.tags)),
              ("unique key", j.unique_key),
              ("conc. key", j.concurrency_key),
              ("depends on", None if j.depends_on is None
               else ", ".join(map(str, j.depends_on)) + (f" ({j.dependency_mode})" if j.dependency_mode else "")),
              ("batch", j.batch_id), ("created at", j.created_at), ("enqueued by", j.enqueued_by),
              ("run at", j.run_at), ("claimed by", j.claimed_by),
              ("claimed at", j.claimed_at), ("login", j.session_role), ("lease until", j.lease_until),
              ("finished at", j.finished_at), ("workflow", j.workflow_id), ("start by", j.start_by),
              ("expires at", j.expires_at),
              ("waits for", _waits_for(j))]
    for name, value in fields:
        text = _fmt(value, lines=name == "last error")  # a traceback keeps its lines; the rest, one each
        say(f"{name:<12} {text}" if "\n" not in text else f"{name:<12} " + text.replace("\n", "\n" + " " * 13))
    for relation, title in (("dependency", "dependencies"), ("dependant", "dependants (jobs that wait for it)"),
                            ("parent", "parent (the job that spawned it)"), ("child", "children (the jobs it spawned)"),
                            ("awaiting", "awaiting (the jobs it waits for, not ended yet)")):
        rows = [link for link in links if link.relation == relation]
        if rows:
            say()
            say(title + (f" (the first {LINKS_SHOWN})" if len(rows) == LINKS_SHOWN else ""))
            say(_table(["id", "queue", "kind", "state"], [[r.job_id, r.queue, r.kind, r.state] for r in rows]))
    if batch is not None:
        say()
        say(f"batch {batch.batch_id}: {batch.state}, {batch.members} member(s): {batch.unfinished} unfinished, "
            f"{batch.done} done, {batch.failed} failed, {batch.cancelled} cancelled")
        callback = f"{_fmt(batch.callback_queue)}/{_fmt(batch.callback_kind)} when {batch.run_when}"
        say(f"callback     {callback}: " + (f"job {batch.callback_job_id}" if batch.callback_job_id is not None
                                           else "not enqueued yet"))
    if steps:
        say()
        say("steps" + (f" (the first {STEPS_SHOWN}, by name)" if len(steps) == STEPS_SHOWN else " (by name)"))
        say(_table(["name", "attempt", "recorded at", "result"],
                   [[s.name, s.attempt, _when_short(s.recorded_at), _cut(_json(s.result), 80)] for s in steps]))
    say()
    say("history (oldest first)")
    # A note of several lines (a failed attempt's traceback) is summed up in its row and printed
    # in full below the table, on lines of its own.
    blocks = [e for e in history if e.note is not None and "\n" in e.note.strip()]
    say(_table(["at", "attempt", "event", "worker", "login", "from", "to", "note"],
                 [[f"{e.at:%Y-%m-%d %H:%M:%S}", e.attempt, e.event if e.times == 1 else f"{e.event} x{e.times}",
                   e.worker, e.session_role, e.from_state, e.to_state,
                   f"{_error_line(e.note, 100)} (in full below)" if e in blocks else e.note]
                  for e in history]) if history else "no events (the queue's audit is off, or they were pruned)")
    for e in blocks:
        assert e.note is not None
        say(f"\n{e.event} at attempt {e.attempt} ({e.at:%Y-%m-%d %H:%M:%S}):")
        say("  " + _fmt(e.note.strip(), lines=True).replace("\n", "\n  "))
    return 0


#: pgq-thin wait's exit statuses besides 0 (done): 1 failed or cancelled (or an error, said on
#: stderr, with nothing on stdout), 3 not ended within --timeout; 2 stays a usage error.
WAIT_ENDED_BADLY = 1
WAIT_TIMED_OUT = 3


def _result_json(result: JobResult) -> str:
    """A job's result as one line of JSON (ASCII: safe to print, whatever the texts hold)."""
    value = result.result
    return json.dumps({
        "state": result.state,
        "result": str(value) if isinstance(value, UnreadableJson) else value,
        "last_error": result.last_error,
        "finished_at": None if result.finished_at is None else result.finished_at.isoformat(),
    })


def cmd_wait(args: argparse.Namespace) -> int:
    with _client(args) as client:
        try:
            result = client.wait(args.id, args.timeout)
        except WaitTimeout as exc:
            say(f"pgq-thin: {exc}", err=True, lines=False)
            return WAIT_TIMED_OUT
    say(_result_json(result))
    return 0 if result.state == "done" else WAIT_ENDED_BADLY


def cmd_grant(args: argparse.Namespace) -> int:
    with _client(args) as client:
        added = client.grant_queue(args.queue, args.role, args.privilege)
    say(f"{args.role} may {args.privilege} on queue {args.queue}" + ("" if added else " (already granted)"))
    return 0


def cmd_revoke(args: argparse.Namespace) -> int:
    with _client(args) as client:
        removed = client.revoke_queue(args.queue, args.role, args.privilege)
        still = {g.privilege for g in client.queue_grants(args.queue)}
    if not removed:
        say(f"{args.role} had no {args.privilege} grant on queue {args.queue}: unchanged")
    elif args.privilege in still:
        say(f"revoked: {args.role} may no longer {args.privilege} on queue {args.queue}")
    else:
        say(f"revoked; queue {args.queue} has no {args.privilege} grant left, so every holder of the pgq role "
              f"may {args.privilege} on it again")
    return 0


def cmd_grants(args: argparse.Namespace) -> int:
    with _client(args) as client:
        rows = client.queue_grants(args.queue)
    if not rows:
        say("no grants: every queue is open to every holder of the pgq roles" if args.queue is None
              else f"queue {args.queue} has no grants: it is open to every holder of the pgq roles")
        return 0
    say(_table(["queue", "privilege", "role", "granted at", "by"],
                 [[g.queue, g.privilege, g.role, _when_short(g.granted_at), g.granted_by] for g in rows]))
    return 0


def cmd_workers(args: argparse.Namespace) -> int:
    with _client(args) as client:
        rows = client.workers()
    if not rows:
        say("no live worker in the registry (workers of pgq-thin heartbeat into it; others call "
            "pgq.worker_heartbeat)")
        return 0
    say(_table(["worker", "login", "host", "pid", "queues", "kinds", "running", "started", "last seen"],
               [[w.worker, w.login, w.host, w.pid, ", ".join(w.queues) if w.queues else "(all)",
                 ", ".join(w.kinds) if w.kinds else "(any)", w.running, _when_short(w.started_at),
                 _when_short(w.last_seen)] for w in rows]))
    return 0


def _paused_kinds(settings: QueueSettings) -> str:
    return ", ".join(settings.paused_kinds) if settings.paused_kinds else "(none)"


def cmd_pause(args: argparse.Namespace) -> int:
    with _client(args) as client:
        settings = client.pause(args.queue, kind=args.kind)
    say(f"queue {args.queue}: paused" if args.kind is None
        else f"queue {args.queue}: kind {args.kind} paused (paused kinds: {_paused_kinds(settings)})")
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    with _client(args) as client:
        settings = client.resume(args.queue, kind=args.kind)
    say(f"queue {args.queue}: resumed" if args.kind is None
        else f"queue {args.queue}: kind {args.kind} resumed (paused kinds: {_paused_kinds(settings)})")
    return 0


_MARK = {"ok": "ok  ", "warning": "WARN", "critical": "CRIT"}


def cmd_doctor(args: argparse.Namespace) -> int:
    """The findings that are not ok (every one with --all), then one summary line."""
    with _client(args) as client:
        findings = client.health(args.max_snapshot_age, args.max_ready_age)
    for f in findings:
        if f.severity == "ok" and not args.all:
            continue
        say(f"[{_fmt(_MARK.get(f.severity, f.severity))}] {_fmt(f.check):<20} {_fmt(f.detail)}")
        if f.hint and f.severity != "ok":
            say(f"       {'':<20} hint: {_fmt(_CLI_HINTS.get(f.hint, f.hint))}")
    worst = {f.severity for f in findings}
    verdict = "critical" if "critical" in worst else "warning" if "warning" in worst else "ok"
    counts = ", ".join(f"{sum(f.severity == s for f in findings)} {s}" for s in ("critical", "warning", "ok"))
    shown = "" if args.all else "; --all lists every check"
    say(f"pgq health: {verdict} ({counts}{shown})")
    return 2 if verdict == "critical" else 0


class _NotInstalled(Exception):
    """A command needs what is not installed: pgq's development tools (tools/ in a checkout), or an
    extra (metrics, dashboard). main() prints it in one line and exits 2."""


def _require_extra(extra: str, module: str, what: str) -> None:
    try:
        importlib.import_module(module)
    except ImportError:
        raise _NotInstalled(f"{what} needs {module}: pip install 'pgq-thin[{extra}]'") from None


def port_number(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number from 0 to 65535, got {text!r}")
    return port


def cmd_metrics(args: argparse.Namespace) -> int:
    _require_extra("metrics", "prometheus_client", "pgq-thin metrics")
    from pgq_thin import metrics

    dsn = resolve_dsn(args.dsn)
    _check_database(dsn, metrics=True)  # a wrong address fails now
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        stop = metrics.serve(dsn, args.port, args.host, args.token or os.environ.get("PGQ_METRICS_TOKEN") or None)
    except OSError as exc:
        raise PgqError(f"cannot serve on {args.host}:{args.port}: {exc.strerror or exc}") from None
    say(f"pgq-thin metrics: serving http://{args.host}:{args.port}/metrics", err=True, flush=True)
    stopped = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stopped.set()) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        stopped.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        stop()
    return 0


#: How to install pgq's development tools (demo, bench, soak, lab): a distribution of their own
#: (tools/pyproject.toml), beside the library, from a checkout of pgq.
TOOLS_INSTALL = "pip install ./tools (from a checkout of pgq)"


def _require_tools(command: str) -> None:
    """pgq's development tools and what they need are installed; otherwise one line says what to install."""
    try:
        import pgq_tools
    except ModuleNotFoundError as exc:
        if exc.name != "pgq_tools":
            raise
        raise _NotInstalled(f"{command} is one of pgq's development tools, which are not installed: "
                            f"{TOOLS_INSTALL}") from None
    missing = pgq_tools.missing_requirements()
    if missing:
        raise _NotInstalled(f"{command} is one of pgq's development tools, whose requirements are not all "
                            f"installed (missing: {', '.join(missing)}): {TOOLS_INSTALL}")


def cmd_lab(args: argparse.Namespace) -> int:
    _require_tools("lab")
    from pgq_tools.lab import run_lab

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("pgq_tools.lab").setLevel(logging.INFO)
    return run_lab(args.out, args.dsn)


def cmd_soak(args: argparse.Namespace) -> int:
    _require_tools("soak")
    from pgq_tools.soak import run_old_snapshot_check, run_soak

    if args.old_snapshot is not None:
        return run_old_snapshot_check(args.old_snapshot, args.dsn)
    return run_soak(args.minutes, args.dsn, args.seed, print, workers=args.workers,
                    concurrency=args.concurrency, producers=args.producers, rate=args.rate,
                    keep_logs=args.keep_logs, failover=args.failover)


def cmd_bench(args: argparse.Namespace) -> int:
    _require_tools("bench")
    from pgq_tools.bench import run_bench

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    logging.getLogger("pgq_tools.bench").setLevel(logging.INFO)
    logging.getLogger("pgq_thin.worker").setLevel(logging.WARNING)
    options = {"workloads": args.workloads} if args.workloads else {}
    return run_bench(args.out, dsn=args.dsn, quick=args.quick, jobs=args.jobs, workers=args.workers,
                     repeats=args.repeats, fsync=args.fsync == "on", readme=args.readme, **options)


def cmd_demo(args: argparse.Namespace) -> int:
    _require_tools("demo")
    from pgq_tools.demo import run_demo

    return run_demo(dsn=args.dsn, jobs=args.jobs, workers=args.workers, concurrency=args.concurrency)


def cmd_dashboard(args: argparse.Namespace) -> int:
    from pgq_thin.dashboard import INSTALL, missing_requirements

    missing = missing_requirements()
    if missing:
        raise _NotInstalled(f"the dashboard needs the dashboard extra (missing: {', '.join(missing)}): {INSTALL}")
    from pgq_thin.async_client import AsyncClient
    from pgq_thin.dashboard.app import serve
    from pgq_thin.webguard import is_loopback

    token = args.token or os.environ.get("PGQ_DASHBOARD_TOKEN") or None
    dsn = resolve_dsn(args.dsn)
    _check_database(dsn)  # a wrong address fails now, not at the first page
    say(f"pgq dashboard on http://{args.host}:{args.port}/{' (token required)' if token else ''}", flush=True)
    if not token and not is_loopback(args.host):
        say(f"pgq-thin: warning: listening on {args.host} without a token: whoever reaches it can use "
            "the dashboard (and act, if its role may); pass --token or set $PGQ_DASHBOARD_TOKEN",
            err=True, flush=True)
    serve(lambda: AsyncClient(dsn, min_size=1, max_size=2), args.host, args.port, token)
    return 0


# The parser --------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="pgq-thin", description="pgq: a SQL-first PostgreSQL job queue.")
    parser.add_argument("--version", action="version", version=f"pgq-thin {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, func: Any, help_text: str, dsn: bool = True) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        if dsn:
            p.add_argument("--dsn", help="database URL (default: $PGQ_DSN, then $DATABASE_URL)")
        p.set_defaults(func=func)
        return p

    p = command("migrate", cmd_migrate, "apply pgq's pending migrations, then its functions (idempotent)")
    p.add_argument("--list", action="store_true", help="only list the pending migrations")
    p.add_argument("--lock-timeout", default="5s", metavar="DURATION",
                   help="how long each statement may wait for a lock, e.g. 5s, 500ms or 2m (default 5s); "
                        "one that waits longer fails, changes nothing, and can be run again")

    p = command("enqueue", cmd_enqueue, "add a job; prints its id")
    p.add_argument("queue")
    p.add_argument("kind")
    p.add_argument("payload", nargs="?", default="{}", help="a JSON object, or - to read it from stdin")
    p.add_argument("--run-at", type=datetime.fromisoformat, help="ISO time; default now")
    p.add_argument("--priority", type=int, default=0)
    p.add_argument("--max-attempts", type=int)
    p.add_argument("--unique-key", help="at most one live job of the queue holds this key (see --on-conflict)")
    p.add_argument("--on-conflict", choices=["keep", "replace"], default="keep",
                   help="with --unique-key held by a live job: keep it as it is and print its id (default), or "
                        "replace its payload, run time, priority and max attempts if it has not started (a "
                        "running one is left alone and a new job runs after it); debounce: replace with --run-at")
    p.add_argument("--tenant")
    p.add_argument("--max-run-time", type=duration, help="cap each attempt (e.g. 10m); default: the queue's")
    p.add_argument("--concurrency-key",
                   help="the job's key for the queue's per-key concurrency limit (pgq.set_key_limit)")
    p.add_argument("--depends-on", type=job_ids, metavar="ID,ID,...",
                   help="run the job only once these jobs are done (it waits meanwhile; cancelled if one "
                        "fails or is cancelled), or, with --dependency-mode all_ended, once each has ended")
    p.add_argument("--dependency-mode", choices=["all_done", "all_ended"], default="all_done",
                   help="with --depends-on: all_done (default: every one done; cancelled if one fails or is "
                        "cancelled) or all_ended (every one done, failed or cancelled, whatever the mix)")
    p.add_argument("--batch", type=batch_id, metavar="ID", help="a member of this open batch (pgq.batch_open)")
    p.add_argument("--notify-finished", action="store_true",
                   help="notify the job's end on the channel pgq_finished (pgq-thin wait returns at once)")
    p.add_argument("--start-by", type=datetime.fromisoformat, metavar="TIME",
                   help="ISO time: a job not claimed by then is cancelled, never handed out")
    p.add_argument("--max-lifetime", type=duration, metavar="DURATION",
                   help="a job still alive this long after its enqueue (e.g. 7d), across attempts, sleeps and waits, "
                        "fails")
    p.add_argument("--tag", action="append", metavar="TAG",
                   help="a tag of the job (repeat for more: --tag vip --tag eu), for the --tag filters")
    p.add_argument("--unique-for", type=duration, metavar="DURATION",
                   help="with --unique-key: a job of the key that ended done within DURATION (e.g. 1h) also holds "
                        "it (its id is printed, nothing is enqueued)")

    p = command("signal", cmd_signal, "send a signal to a queue: wakes its jobs waiting for it (pgq.signal; the "
                "first signal of a name wins); prints how many it woke")
    p.add_argument("queue")
    p.add_argument("name", help="the signal's name, e.g. approved:order-7")
    p.add_argument("payload", nargs="?", default="{}", help="a JSON object handed to each waiting job, or - to "
                   "read it from stdin")

    p = command("wait", cmd_wait, "wait for a job to end and print its result as JSON (state, result, "
                "last_error, finished_at); exits 0 when it is done, 1 when it failed or was cancelled (or "
                "on an error, said on stderr), 3 when it has not ended within --timeout, 2 on a usage error")
    p.add_argument("id", type=job_id)
    p.add_argument("--timeout", type=wait_seconds, metavar="SECONDS",
                   help="give up after this long (seconds, or a duration such as 5m); default: no limit")

    p = command("worker", cmd_worker, "run a worker until SIGTERM/SIGINT")
    p.add_argument("--app", required=True, help="module:attribute of a pgq_thin Worker or AsyncWorker")
    p.add_argument("--queues", type=queue_list, help="comma-separated queues (default: the app's)")
    p.add_argument("--concurrency", type=int, help="parallel jobs (default: the app's)")
    p.add_argument("--prefetch", type=prefetch_setting, metavar="N|auto",
                   help="claimed jobs that may wait for a slot, for bigger claims: auto (sized by the "
                        "jobs' run time) or N; 0 claims free slots only (default: the app's)")
    p.add_argument("--pooled", action="store_true",
                   help="behind a transaction-pooling proxy (PgBouncer pool_mode=transaction): no LISTEN, "
                        "no prepared statements, no session state; polls every 0.25 s")
    p.add_argument("--metrics-port", type=port_number, metavar="N",
                   help="serve the worker's Prometheus metrics on this port (needs pgq-thin[metrics])")
    p.add_argument("--metrics-host", default="127.0.0.1",
                   help="the address the metrics port binds (default 127.0.0.1; 0.0.0.0 for every interface)")
    p.add_argument("--metrics-token", help="require this bearer token on every scrape of the metrics port; "
                   "default $PGQ_METRICS_TOKEN; none: no token")
    p.add_argument("--quiet", action="store_true", help="log warnings only")

    p = command("metrics", cmd_metrics, "serve the queue's Prometheus metrics (an exporter; needs pgq-thin[metrics])")
    p.add_argument("--port", type=port_number, default=9187, help="the port to serve on (default 9187)")
    p.add_argument("--host", default="127.0.0.1",
                   help="the address to bind (default 127.0.0.1; 0.0.0.0 for every interface)")
    p.add_argument("--token", help="require this bearer token on every scrape (Authorization: Bearer TOKEN); "
                   "default $PGQ_METRICS_TOKEN; none: no token")

    p = command("stats", cmd_stats, "jobs per queue and state")
    p.add_argument("--watch", type=positive_seconds, nargs="?", const=2.0, metavar="SECONDS",
                   help="refresh every SECONDS (default 2) and show throughput")

    p = command("sweep", cmd_sweep, "recover jobs whose lease expired or timed out, and fire due schedules")
    p.add_argument("--max-jobs", type=int, default=1000)

    def actions(name: str, help_text: str, description: str) -> Callable[[str, Any, str], argparse.ArgumentParser]:
        """A command of several actions (schedule add|list|rm): what adds one, with its --dsn."""
        group = sub.add_parser(name, help=help_text, description=description).add_subparsers(
            dest=f"{name}_command", required=True, metavar="ACTION")

        def action(action_name: str, func: Any, text: str) -> argparse.ArgumentParser:
            sp = group.add_parser(action_name, help=text, description=text)
            sp.add_argument("--dsn", help="database URL (default: $PGQ_DSN, then $DATABASE_URL)")
            sp.set_defaults(func=func)
            return sp

        return action

    schedule_command = actions("schedule", "periodic jobs: add, list, rm", "periodic jobs (pgq.schedule)")

    sp = schedule_command("add", cmd_schedule_add, "create or replace a schedule; prints its next run")
    sp.add_argument("name")
    sp.add_argument("queue")
    sp.add_argument("kind")
    when = sp.add_mutually_exclusive_group(required=True)
    when.add_argument("--cron", metavar="EXPR", help="a 5-field cron expression or @hourly, @daily, ...")
    when.add_argument("--every", type=duration, help="an interval with its unit: fires at the multiples of "
                      "it since the epoch (e.g. 30s, 5m, 1h, 1h 30m; a bare number is refused)")
    sp.add_argument("--payload", default="{}", help="a JSON object, or - to read it from stdin")
    sp.add_argument("--timezone", default="UTC", help="the time zone the cron expression is read in (default UTC)")
    sp.add_argument("--priority", type=int, default=0)
    sp.add_argument("--max-attempts", type=int)
    sp.add_argument("--tenant")
    sp.add_argument("--skip-if-running", action="store_true",
                    help="skip an occurrence while the schedule's last job is pending or running")
    sp.add_argument("--disabled", action="store_true", help="create it disabled")
    schedule_command("list", cmd_schedule_list, "every schedule and its next run")
    sp = schedule_command("rm", cmd_schedule_rm, "delete a schedule (its jobs stay)")
    sp.add_argument("name")

    batch_command = actions("batch", "batches: open, close, status, cancel", "batches: jobs enqueued with --batch "
                            "ID, and one callback job once they have ended (pgq.batch_open)")

    sp = batch_command("open", cmd_batch_open, "open a batch; prints its id (add members with pgq-thin enqueue "
                       "--batch ID, then close it)")
    sp.add_argument("callback_queue", help="the queue of the callback job")
    sp.add_argument("callback_kind", help="the kind of the callback job")
    sp.add_argument("payload", nargs="?", default="{}", help="the callback's payload: a JSON object, or - to read "
                    "it from stdin")
    sp.add_argument("--run-when", choices=["all_ended", "all_done"], default="all_ended",
                    help="all_ended (default): the callback runs once every member has ended, however; all_done: "
                         "only if every member is done (otherwise it is enqueued cancelled)")
    sp.add_argument("--joiner", action="append", metavar="ROLE",
                    help="a role whose logins may add members too (a handler's login, say); repeat for several")
    for name, func, text in (
            ("close", cmd_batch_close, "close a batch: no members added after; its callback comes once they have "
             "ended (at once for an empty batch)"),
            ("status", cmd_batch_status, "a batch's state, its members counted by state and its callback job"),
            ("cancel", cmd_batch_cancel, "cancel a batch: its members that have not ended, and its callback")):
        batch_command(name, func, text).add_argument("id", type=batch_id, help="the batch's id (batch open printed it)")

    p = command("prune", cmd_prune, "delete finished jobs older than a duration (default: each queue's retention)")
    p.add_argument("--older-than", type=duration, help="e.g. 7d, 12h; default: the queue's retention")
    p.add_argument("--batch", type=int, default=10000, help="jobs per call (default 10000)")
    p.add_argument("--all", action="store_true", help="repeat until nothing is left to prune")

    for name, func, text, states, before in (
            ("retry", cmd_retry, "make failed or cancelled jobs pending again: the jobs named by id, or with "
             "--queue, --state and --all every job that matches (pgq.retry_jobs, 1000 a call)",
             ("failed", "cancelled"), "only jobs that finished before TIME"),
            ("cancel", cmd_cancel, "cancel jobs that have not finished: the jobs named by id, or with --queue, "
             "--state and --all every job that matches (pgq.cancel_jobs, 1000 a call)",
             ("waiting", "pending", "running", "outcome_unknown"), "only jobs created before TIME")):
        p = command(name, func, text)
        p.add_argument("ids", type=job_id, nargs="*", metavar="ID", help="the jobs to " + name)
        p.add_argument("--queue", help="by filter: the jobs of this queue")
        p.add_argument("--state", choices=states, help="by filter: the jobs in this state")
        p.add_argument("--kind", help="by filter: only jobs of this kind")
        p.add_argument("--tag", action="append", metavar="TAG",
                       help="by filter: only jobs holding this tag (repeat: jobs holding all of them)")
        p.add_argument("--before", type=before_time, metavar="TIME",
                       help=f"by filter: {before}: an ISO time (2026-12-05T14:00, local time without an offset) "
                            "or how long ago (30m, 2h, 7d); jobs from after the command started are left alone")
        p.add_argument("--limit", type=positive_count, metavar="N", help="by filter: at most N jobs in all "
                       "(default: every job that matches)")
        p.add_argument("--all", action="store_true",
                       help=f"{name} every job the filter matches (required with a filter)")
        p.set_defaults(parser=p, filter_states=states)

    p = command("delete", cmd_delete, "delete the jobs of a queue in one state (never a running one) with "
                "--queue, --state and --all (pgq.delete_jobs, 1000 a call); a pending or waiting job is "
                "cancelled first, so the jobs waiting for it and its batch see it end")
    p.add_argument("--queue", help="the jobs of this queue")
    p.add_argument("--state", choices=("pending", "waiting", "done", "failed", "cancelled"), help="in this state")
    p.add_argument("--kind", help="only jobs of this kind")
    p.add_argument("--tag", action="append", metavar="TAG",
                   help="only jobs holding this tag (repeat: jobs holding all of them)")
    p.add_argument("--before", type=before_time, metavar="TIME",
                   help="only jobs created (pending, waiting) or finished (done, failed, cancelled) before TIME: "
                        "an ISO time or how long ago (30m, 2h, 7d); jobs from after the command started are left alone")
    p.add_argument("--limit", type=positive_count, metavar="N", help="at most N jobs in all "
                   "(default: every job that matches)")
    p.add_argument("--all", action="store_true", help="delete every job the filter matches (required)")
    p.set_defaults(parser=p, filter_states=("done", "failed", "cancelled", "pending", "waiting"), ids=[])

    p = command("resolve", cmd_resolve, "settle an outcome_unknown job: done, pending (run it again), failed "
                "or cancelled")
    p.add_argument("id", type=job_id)
    p.add_argument("state", help="done, pending, failed or cancelled")

    p = command("jobs", cmd_jobs, "list jobs, newest first (pgq.list_jobs)")
    p.add_argument("--queue", help="only this queue's jobs")
    p.add_argument("--state", help="only jobs in this state: waiting, pending, running, done, failed, "
                   "cancelled, outcome_unknown")
    p.add_argument("--kind", help="only jobs of this kind")
    p.add_argument("--tag", action="append", metavar="TAG",
                   help="only jobs holding this tag (repeat: jobs holding all of them)")
    p.add_argument("--limit", type=int, default=50, help="at most this many (default 50, at most 1000)")
    p.add_argument("--before", type=job_id, metavar="ID", help="only jobs older than this id (the next page)")
    p.add_argument("--batch", type=batch_id, metavar="ID",
                   help="the members of this batch (pgq.batch_jobs; with --state: of that state only)")
    p.set_defaults(parser=p)

    p = command("job", cmd_job, "one job: its state, payload, result, last error, dependencies and dependants, "
                "workflow (parent, children, awaited jobs, the signal it waits for), batch, steps and attempt history")
    p.add_argument("id", type=job_id)

    for name, func, text in (("grant", cmd_grant, "let a role enqueue into, claim from, read or signal a queue (once a "
                              "queue has a grant of a privilege, only granted roles and pgq_admin have it)"),
                             ("revoke", cmd_revoke, "take back a grant of pgq-thin grant")):
        p = command(name, func, text)
        p.add_argument("queue")
        p.add_argument("role")
        p.add_argument("privilege", choices=["enqueue", "claim", "read", "signal"])

    p = command("grants", cmd_grants, "the per-queue grants (pgq.queue_grants)")
    p.add_argument("--queue", help="only this queue's grants")

    command("workers", cmd_workers, "the live workers: what each claims and runs (pgq.workers)")

    p = command("pause", cmd_pause, "stop workers claiming from a queue (or, with --kind, one kind of it)")
    p.add_argument("queue")
    p.add_argument("--kind", help="pause only this kind of the queue")

    p = command("resume", cmd_resume, "let workers claim from a queue (or, with --kind, one kind of it) again")
    p.add_argument("queue")
    p.add_argument("--kind", help="resume only this paused kind of the queue")

    p = command("doctor", cmd_doctor, "check pgq's health (pgq.health): the findings that are not ok, then one "
                "summary line; exits 2 on anything critical")
    p.add_argument("--all", action="store_true", help="list every check, the ok ones too")
    p.add_argument("--max-snapshot-age", type=duration, default=timedelta(minutes=5),
                   help="older transactions are critical (default 5m; half of it is a warning)")
    p.add_argument("--max-ready-age", type=duration, default=timedelta(minutes=5),
                   help="due jobs waiting longer are critical (default 5m; half of it is a warning)")

    p = command("dashboard", cmd_dashboard, "serve the web dashboard: queues, jobs, schedules, health, and "
                "retry, cancel, resolve, pause, resume (read-only as a pgq_monitor login)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    p.add_argument("--token", help="require this token on every request (Bearer or the login form); "
                   "default $PGQ_DASHBOARD_TOKEN; none: no token")

    p = command("lab", cmd_lab, "run the acceptance playbook's experiments and write the evidence package")
    p.add_argument("--out", required=True, help="the evidence directory to write (e.g. evidence/)")

    p = command("soak", cmd_soak, "chaos soak: producers, workers, kill -9, frozen workers, connection "
                "kills and a server restart; then checks every invariant", dsn=False)
    p.add_argument("--dsn", help="run on this server instead of a throwaway one (no restart then); "
                   "it creates the schema pgq_soak and kills its own connections")
    p.add_argument("--minutes", type=float, default=1.0, help="how long (default 1)")
    p.add_argument("--seed", type=int, help="random seed, for a repeatable run")
    p.add_argument("--workers", type=int, default=4, help="worker processes (default 4, at least 2)")
    p.add_argument("--concurrency", type=int, default=4, help="slots per worker (default 4)")
    p.add_argument("--producers", type=int, default=2, help="producer threads (default 2)")
    p.add_argument("--rate", type=float, default=150, help="jobs per second, all producers (default 150)")
    p.add_argument("--keep-logs", action="store_true",
                   help="keep the worker processes' logs (a failed run always keeps them)")
    p.add_argument("--old-snapshot", type=float, metavar="SECONDS",
                   help="instead: load while a REPEATABLE READ transaction holds a snapshot this long")
    p.add_argument("--failover", action="store_true",
                   help="on a throwaway primary with a synchronous standby (multi-host DSN): repeated "
                        "failovers (kill -9 of the primary, standby promoted) instead of the restart")

    p = command("bench", cmd_bench, "benchmark pgq against the raw SQL floor and pgbench, in the same run",
                dsn=False)
    p.add_argument("--out", required=True, help="where to write bench.md, bench.json and bench.png")
    p.add_argument("--dsn", help="a scratch database to use instead of a throwaway server "
                   "(its pgq tables are truncated)")
    p.add_argument("--quick", action="store_true", help="tiny sizes: seconds, to check it runs")
    p.add_argument("--jobs", type=int, help="jobs per drain")
    p.add_argument("--workers", type=lambda t: tuple(int(x) for x in t.split(",")),
                   help="worker counts, comma-separated (default 4,16)")
    p.add_argument("--repeats", type=int, help="repetitions per measurement")
    p.add_argument("--workloads", type=lambda t: tuple(w.strip() for w in t.split(",") if w.strip()),
                   help="comma-separated subset of enqueue,drain,latency,claim_latency,churn,old_snapshot,many,limits,"
                        "keyed")
    p.add_argument("--fsync", choices=("on", "off"), default="on",
                   help="the throwaway server's fsync (default on, as users run it; ignored with --dsn: "
                        "the tables state the server's own setting)")
    p.add_argument("--readme", metavar="FILE",
                   help="also replace FILE's generated block (e.g. bench/README.md) with bench.md")

    p = command("demo", cmd_demo, "the tour: a throwaway PostgreSQL (or --dsn), workers, a crash, a recovery")
    p.add_argument("--jobs", type=int, default=3000, help="how many jobs (default 3000)")
    p.add_argument("--workers", type=int, default=3, help="worker processes (default 3)")
    p.add_argument("--concurrency", type=int, default=4, help="slots per worker (default 4)")
    return parser


def main(argv: Sequence[str] | None = None, *, dsn: str | None = None) -> int:
    """Run the command ``argv`` (default: the process's arguments) and return its exit status.
    ``dsn``: the database of a command given no --dsn, before $PGQ_DSN and $DATABASE_URL (manage.py's
    pgq_... commands pass Django's database, pgq_thin.contrib.django)."""
    args = build_parser().parse_args(argv)
    if dsn is not None and getattr(args, "dsn", "") is None:
        args.dsn = dsn
    try:
        status = int(args.func(args) or 0)
        sys.stdout.flush()  # here, where a closed pipe is caught, rather than at the interpreter's exit
        return status
    except BadArgument as exc:  # refused before anything was sent: a usage error, as argparse's
        say(f"pgq-thin: error: {exc}", err=True, lines=False)
        return 2
    except PgqError as exc:
        say(f"pgq-thin: error: {_for_cli(exc)}", err=True, lines=False)
        return 1
    except _NotInstalled as exc:
        say(f"pgq-thin: {exc}", err=True, lines=False)
        return 2
    except psycopg.Error as exc:
        say(f"pgq-thin: error: {_for_cli(translate(exc))}", err=True, lines=False)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return _closed_pipe()


#: The exit status of a command ended by a closed pipe: a shell's for a program SIGPIPE ended.
CLOSED_PIPE = 128 + signal.SIGPIPE


def _closed_pipe() -> int:
    """Whoever read the output went away (``pgq-thin jobs | head -1``): end quietly, as Unix tools
    do, with no traceback, and keep the interpreter's last flush of stdout from failing again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout is not a file descriptor
        pass
    return CLOSED_PIPE


if __name__ == "__main__":
    sys.exit(main())
