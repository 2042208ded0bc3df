"""The dashboard's ASGI app (Starlette): server-rendered pages, a JSON API and the actions.

Every read and every action is one method of a pgq_thin Client, i.e. one call of a pgq function
with the request's values as bound parameters (no SQL is built from a request). The other
statements are the catalog question "may this role call pgq.retry, pgq.pause, ...?"
(queries.PRIVILEGES), asked to show a pgq_monitor login as read-only, and the workflow reads of the
job and batch pages (pgq.get_job's whole row, pgq.job_links, pgq.batch_status: the clients' own
queries.GET_JOB, JOB_LINKS and BATCH_STATUS), each one call of a pgq function too, over the
Client's pool, and the database clock (queries.CLOCK) that dates a "retry all shown" / "cancel
all shown" confirmation. pgq itself stays the authority: an action the role may not make is refused
by the database too. ``GET /metrics`` is pgq_thin.metrics.exposition over a pooled connection (the same
text as ``pgq-thin metrics``).

Security (pgq_thin.dashboard.guard, before any route): ``allowed_hosts`` (the loopback names when it
binds a loopback address) refuses other Host headers, against DNS rebinding; request bodies are
bounded (413); a POST whose Origin is not the dashboard's own is refused (403) whatever the token;
a ``token`` makes every request (but the login form and the static files) need
``Authorization: Bearer TOKEN`` or the session cookie the login form sets (401 otherwise: a page
answers with the login form), and wrong tokens are slowed down. Templates are autoescaped and the
Content-Security-Policy allows only the dashboard's own scripts and styles.
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, is_dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode

import jinja2
from psycopg.rows import dict_row
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from pgq_thin import __version__, queries
from pgq_thin.client import BULK_CALL, Client, bulk_calls
from pgq_thin.dashboard.guard import (
    COOKIE,
    SESSION_LIFETIME,
    BadJSON,
    Guard,
    Sessions,
    client_address,
    local,
    parse_json,
    wants_html,
)
from pgq_thin.durations import format_duration
from pgq_thin.errors import (
    ConnectionLost,
    InvalidArgument,
    JobNotFound,
    PermissionDenied,
    PgqError,
    WrongState,
    translated,
)
from pgq_thin.models import JobRecord, QueueSettings, error_summary, record
from pgq_thin.webguard import Throttle
from pgq_thin.webguard import allowed_hosts as allowed_hosts_of

__all__ = ["COOKIE", "create_app", "serve"]

log = logging.getLogger("pgq_thin.dashboard")

HERE = Path(__file__).parent
#: The pgq functions behind the actions, and the catalog question whether the role may call each.
ACTIONS = queries.ACTION_FUNCTIONS
PRIVILEGES = queries.PRIVILEGES
JOB_STATES = ("waiting", "pending", "running", "done", "failed", "cancelled", "outcome_unknown")
RESOLVE_STATES = ("done", "pending", "failed", "cancelled")
MAX_BIGINT = 2**63 - 1
#: What a page asks pgq.list_jobs for unless told otherwise.
PAGE_SIZE = 50
#: How many of a job's dependencies, and of its dependants, the job page and /api/jobs/{id} list
#: (pgq.job_links is asked for one more of each, to say when there are more).
LINKS_SHOWN = 100
#: pgq.get_job's columns of migration 0017 that the job page shows beside the JobRecord.
WORKFLOW_COLUMNS = ("dependency_mode", "batch_id")
#: "retry all shown" and "cancel all shown" (README, Dashboard): the list's states each acts on,
#: the most jobs one click acts on, and the jobs per call of pgq.retry_jobs / pgq.cancel_jobs.
BULK_STATES = {"retry_jobs": ("failed", "cancelled"),
               "cancel_jobs": ("waiting", "pending", "running", "outcome_unknown")}
BULK_MAX = 10000


class BadRequest(Exception):
    """A request value the dashboard cannot even pass to pgq (a job id that is not a number)."""


class NotFound(JobNotFound):
    """The dashboard's own "no such ..." (P0002, 404), for a function that answers no row."""


def _plain(value: Any) -> Any:
    """JSON for the API: datetimes as ISO 8601, intervals as seconds."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if is_dataclass(value) and not isinstance(value, type):
        return {k: _plain(v) for k, v in asdict(value).items()}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _json(data: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(_plain(data), status_code=status)


def _status_of(exc: Exception) -> int:
    if isinstance(exc, (BadRequest, InvalidArgument)):
        return 400
    if isinstance(exc, PermissionDenied):
        return 403
    if isinstance(exc, JobNotFound):
        return 404
    if isinstance(exc, WrongState):
        return 409
    if isinstance(exc, ConnectionLost):
        return 503
    return 500


def _error_body(exc: Exception) -> dict[str, Any]:
    if isinstance(exc, PgqError):
        return {"error": exc.message, "sqlstate": exc.sqlstate, "hint": exc.hint}
    return {"error": str(exc), "sqlstate": None, "hint": None}


def _job_id(text: str, what: str = "job") -> int:
    """A job's (or a batch's) id from the path: 400 unless it is a bigint, 1 or more."""
    try:
        value = int(text)
    except ValueError:
        raise BadRequest(f"{what} id must be a number, got {text[:40]!r}") from None
    if not 1 <= value <= MAX_BIGINT:
        raise BadRequest(f"{what} id must be between 1 and {MAX_BIGINT}, got {value}")
    return value


def _optional_int(params: Any, name: str) -> int | None:
    text = params.get(name)
    if text in (None, ""):
        return None
    try:
        return int(text)
    except ValueError:
        raise BadRequest(f"{name} must be a number, got {text[:40]!r}") from None


def _optional_text(params: Any, name: str) -> str | None:
    text = params.get(name)
    return None if text in (None, "") else str(text)


def _settings_text(q: QueueSettings) -> str:
    """A queue's settings in a few words for the overview: fair, caps, lease, limits, grants."""
    parts = ["fair" if q.fair else "fifo"]
    if q.max_running:
        parts.append(f"max {q.max_running} running")
    parts.append(f"lease {_ago(q.lease)}")
    if q.max_run_time is not None:
        parts.append(f"max run {_ago(q.max_run_time)}")
    parts.append(f"{q.max_attempts} attempts")
    if q.restricted:
        parts.append("grants: " + ", ".join(q.restricted))
    return " · ".join(parts)


#: A duration or an age for the pages, as the CLI writes it: 4.5s, 3m 12s, 1h, 2h 5m, 3d 4h.
_ago = format_duration


def _when(value: datetime | None) -> str:
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M:%S %Z").strip()


def _pretty(value: Any) -> str:
    return json.dumps(_plain(value), indent=2, sort_keys=True, ensure_ascii=False)


def _templates() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,  # every value is escaped: a payload's "<script>" shows as text
        undefined=jinja2.StrictUndefined,
    )
    env.filters.update(ago=_ago, when=_when, pretty=_pretty, error_line=error_summary)  # a traceback's exception
    return env


class Dashboard:
    """The routes, over one Client."""

    def __init__(self, client: Client, token: str | None, sessions: Sessions, throttle: Throttle) -> None:
        self.client = client
        self.token = token
        self.sessions = sessions
        self.throttle = throttle
        self.templates = _templates()

    # What the role may do -------------------------------------------------------------------------

    def permissions(self) -> dict[str, Any]:
        """current_user and, per action, whether the role may call its pgq function."""
        with translated(), self.client.pool.connection() as conn:
            cur = conn.execute(PRIVILEGES)
            names = [d.name for d in cur.description or ()]
            row = cur.fetchone()
        values = dict(zip(names, row or ()))
        can = {name: bool(values.get(name)) for name in ACTIONS}
        missing = [name for name in ACTIONS if values.get(name) is None]  # functions a schema predates
        return {"role": values.get("current_user"), "can": can, "read_only": not any(can.values()),
                "missing": missing}

    def _refused(self, action: str) -> JSONResponse | None:
        perms = self.permissions()
        if perms["can"][action]:
            return None
        if action in perms["missing"]:
            return _json({"error": f"this database's pgq schema has no {ACTIONS[action]}: it predates the "
                                   "migration that adds it (run pgq-thin migrate)", "sqlstate": "42883",
                          "hint": None}, 501)
        return _json({"error": f"read-only: the dashboard's database role {perms['role']} may not call "
                               f"{ACTIONS[action]} (a pgq_monitor login is read-only; connect as a pgq_admin "
                               "login to act)", "sqlstate": "42501", "hint": None}, 403)

    # Pages -----------------------------------------------------------------------------------------

    def render(self, request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
        if "perms" not in context:
            try:
                context["perms"] = self.permissions()
            except PgqError:
                context["perms"] = {"role": "?", "can": dict.fromkeys(ACTIONS, False), "read_only": True,
                                    "missing": []}
        context.setdefault("path", request.url.path)
        html = self.templates.get_template(template).render(
            version=__version__, login=self.token is not None, **context)
        return HTMLResponse(html, status_code=status)

    def page(self, template: str, build: Callable[[Request], dict[str, Any]]) -> Callable[[Request], Response]:
        """A page: ``build`` reads what it shows; a pgq error becomes the error page."""

        def endpoint(request: Request) -> Response:
            try:
                context = build(request)
            except (PgqError, BadRequest) as exc:
                return self.render(request, "error.html", _status_of(exc), **_error_body(exc))
            return self.render(request, template, **context)

        return endpoint

    def overview(self, request: Request) -> dict[str, Any]:
        findings = self.client.health()
        settings = {q.name: _settings_text(q) for q in self.client.queue_settings()}
        return {"queues": self.client.stats(), "settings": settings,
                "findings": [f for f in findings if f.severity != "ok"], "worst": _worst(findings)}

    def jobs(self, request: Request) -> dict[str, Any]:
        params = request.query_params
        queue, state, kind = (_optional_text(params, n) for n in ("queue", "state", "kind"))
        limit = _optional_int(params, "limit") or PAGE_SIZE
        before_id = _optional_int(params, "before_id")
        jobs = self.client.list_jobs(queue, state, kind, limit, before_id)
        filters = {k: v for k, v in (("queue", queue), ("state", state), ("kind", kind)) if v}
        if limit != PAGE_SIZE:
            filters["limit"] = str(limit)
        more = None
        if len(jobs) == limit:
            more = "/jobs?" + urlencode({**filters, "before_id": jobs[-1].id})
        first = "/jobs?" + urlencode(filters) if before_id is not None else None
        stats = self.client.stats()
        return {"jobs": jobs, "queue": queue or "", "state": state or "", "kind": kind or "", "more": more,
                "first": first, "queues": [q.queue for q in stats], "states": JOB_STATES,
                "bulk": self.bulk_button(stats, queue, state, kind) if jobs else None}

    # "retry all shown", "cancel all shown" (README, Dashboard) --------------------------------------
    # "All shown" is every job the list's filter matches (one queue, one state, maybe a kind), on
    # every page, as of the moment the page was made: the confirmation states how many, dated by the
    # database clock, and the click acts on at most that many (at most BULK_MAX), oldest first, and
    # only on jobs that finished (retry) or were created (cancel) before that moment.

    def bulk_button(self, stats: Sequence[Any], queue: str | None, state: str | None,
                    kind: str | None) -> dict[str, Any] | None:
        """The list's "retry all shown" / "cancel all shown" button (its URL, body and confirmation),
        or None when the filter is not one queue and one state it applies to, or matches nothing."""
        action = next((a for a, states in BULK_STATES.items() if state in states), None)
        if action is None or queue is None or state is None:
            return None
        count, exact = self.matching(stats, queue, state, kind)
        if count == 0:
            return None
        [[as_of]] = [list(row.values()) for row in self._rows(queries.CLOCK, {})]
        verb = "retry" if action == "retry_jobs" else "cancel"
        acted = min(count, BULK_MAX)
        jobs = f"{state} job{'s' if count != 1 else ''} of queue {queue}" + (f" of kind {kind}" if kind else "")
        shown = f"{count}" if exact else f"more than {BULK_MAX}"
        confirm = (f"{verb.capitalize()} all {count} {jobs}?" if count <= BULK_MAX else
                   f"{verb.capitalize()} the {acted} oldest of the {shown} {jobs}? (at most {BULK_MAX} a click)")
        body = {"queue": queue, "state": state, "kind": kind, "before": as_of.isoformat(), "max_jobs": acted}
        return {"action": action, "url": f"/api/jobs/{verb}-all", "label": f"{verb} all shown ({shown})",
                "confirm": confirm, "body": json.dumps(body), "count": count}

    def matching(self, stats: Sequence[Any], queue: str, state: str, kind: str | None) -> tuple[int, bool]:
        """How many jobs of ``queue`` are in ``state`` (of ``kind``), and whether that is exact: from
        pgq.stats without a kind; with one, counted through pgq.list_jobs, BULK_CALL a page, up to
        BULK_MAX and a page more (not exact past BULK_MAX: "more than BULK_MAX")."""
        if kind is None:
            row = next((s for s in stats if s.queue == queue), None)
            if row is None:
                return 0, True
            return int(row.pending + row.scheduled if state == "pending" else getattr(row, state)), True
        count, before_id = 0, None
        while count <= BULK_MAX:
            page = self.client.list_jobs(queue, state, kind, BULK_CALL, before_id)
            count += len(page)
            if len(page) < BULK_CALL:
                return count, True
            before_id = page[-1].id
        return count, False

    def job(self, request: Request) -> dict[str, Any]:
        job_id = _job_id(request.path_params["id"])
        job, workflow = self.job_record(job_id)
        return {"job": job, "workflow": workflow, "links": self.job_links(job_id),
                "history": self.client.job_history(job_id), "resolve_states": RESOLVE_STATES}

    def batch(self, request: Request) -> dict[str, Any]:
        return {"batch": self.batch_status(_job_id(request.path_params["id"], "batch"))}

    def schedules(self, request: Request) -> dict[str, Any]:
        return {"schedules": self.client.schedules()}

    def health(self, request: Request) -> dict[str, Any]:
        findings = self.client.health()
        return {"findings": findings, "worst": _worst(findings)}

    # Workflows (issue 26): a job's dependencies, dependants and batch; a batch --------------------
    # Read with the clients' statements (queries.JOB_LINKS, BATCH_STATUS, and GET_JOB for pgq.get_job's
    # whole row), over the Client's pool: the dashboard's login, as every other page.

    def _rows(self, query: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        with translated(), self.client.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            cur.execute(query, params)
            return cur.fetchall()

    def job_record(self, job_id: int) -> tuple[JobRecord, dict[str, Any]]:
        """pgq.get_job's row (P0002 when unknown or not readable): the JobRecord, and its workflow
        columns (None on a schema before migration 0017)."""
        [row] = self._rows(queries.GET_JOB, {"id": job_id})
        return record(JobRecord, row), {name: row.get(name) for name in WORKFLOW_COLUMNS}

    def job_links(self, job_id: int) -> dict[str, Any] | None:
        """The first LINKS_SHOWN dependencies and dependants (id order) from pgq.job_links, and
        whether there are more of each; None when the schema has no pgq.job_links (before 0017)."""
        try:
            rows = self._rows(queries.JOB_LINKS, {"id": job_id, "limit_rows": LINKS_SHOWN + 1})
        except PgqError as exc:
            if exc.sqlstate == "42883":  # undefined_function: the database is not migrated to 0017 yet
                return None
            raise
        links: dict[str, Any] = {}
        for relation, name in (("dependency", "dependencies"), ("dependant", "dependants")):
            of = [{k: r[k] for k in ("job_id", "queue", "kind", "state")} for r in rows if r["relation"] == relation]
            links[name], links[f"more_{name}"] = of[:LINKS_SHOWN], len(of) > LINKS_SHOWN
        return links

    def batch_status(self, batch_id: int) -> dict[str, Any]:
        """pgq.batch_status's row: to the login that opened the batch, pgq_monitor and pgq_admin
        (P0002 for anyone else, and for an unknown id)."""
        rows = self._rows(queries.BATCH_STATUS, {"batch_id": batch_id})
        if not rows:
            raise NotFound(f"pgq: no batch with id {batch_id}", "P0002")
        return rows[0]

    def login_form(self, request: Request) -> Response:
        if self.token is None:
            return RedirectResponse("/", status_code=303)
        return self._login_page(request, local(request.query_params.get("next")), None, 200)

    def login_required(self, request: Request, next_path: str) -> Response:
        """A page asked for without the token: 401, with the login form (back to the page once in)."""
        return self._login_page(request, next_path, None, 401)

    def _login_page(self, request: Request, next_path: str, error: str | None, status: int) -> HTMLResponse:
        perms: dict[str, Any] = {"role": None, "can": dict.fromkeys(ACTIONS, False), "read_only": True, "missing": []}
        return self.render(request, "login.html", status, next=next_path, error=error, perms=perms)

    async def login(self, request: Request) -> Response:
        """The login form: the right token starts a session (a random id in the cookie); wrong ones
        are slowed down per client address (429 while it must wait; the token is not checked then)."""
        if self.token is None:
            return RedirectResponse("/", status_code=303)
        form = parse_qs((await request.body()).decode("utf-8", "replace"))  # at most LOGIN_BODY_LIMIT
        token = (form.get("token") or [""])[0]
        next_path = local((form.get("next") or ["/"])[0])
        address = client_address(request)
        if self.throttle.wait(address) > 0:
            seconds = self.throttle.retry_after(address)
            page = self._login_page(request, next_path, f"Too many wrong tokens: try again in {seconds} s.", 429)
            page.headers["retry-after"] = str(seconds)
            return page
        if not hmac.compare_digest(token.encode(), self.token.encode()):
            self.throttle.failed(address)
            return self._login_page(request, next_path, "That is not the dashboard's token.", 401)
        self.throttle.succeeded(address)
        response = RedirectResponse(next_path, status_code=303)
        response.set_cookie(COOKIE, self.sessions.create(), max_age=int(self.sessions.lifetime), httponly=True,
                            samesite="strict", secure=request.url.scheme == "https", path="/")
        return response

    def logout(self, request: Request) -> Response:
        """Ends this browser's session: its cookie no longer works, wherever it was copied to."""
        self.sessions.revoke(request.cookies.get(COOKIE))
        response = RedirectResponse("/login" if self.token is not None else "/", status_code=303)
        response.delete_cookie(COOKIE, path="/")
        return response

    # The JSON API ----------------------------------------------------------------------------------

    def api(self, build: Callable[[Request], Any]) -> Callable[[Request], Response]:
        """An API endpoint: ``build`` answers; errors become {"error", "sqlstate", "hint"} with a status."""

        def endpoint(request: Request) -> Response:
            try:
                answer = build(request)
            except (PgqError, BadRequest) as exc:
                return _json(_error_body(exc), _status_of(exc))
            return answer if isinstance(answer, Response) else _json(answer)

        return endpoint

    def api_queues(self, request: Request) -> Any:
        return {"queues": self.client.stats(), "settings": self.client.queue_settings()}

    def api_jobs(self, request: Request) -> Any:
        params = request.query_params
        limit = _optional_int(params, "limit") or PAGE_SIZE
        jobs = self.client.list_jobs(_optional_text(params, "queue"), _optional_text(params, "state"),
                                     _optional_text(params, "kind"), limit, _optional_int(params, "before_id"))
        return {"jobs": jobs, "next_before_id": jobs[-1].id if len(jobs) == limit else None}

    def api_job(self, request: Request) -> Any:
        """The job (pgq.get_job's row), its history, and its links (see job_links; null before 0017)."""
        job_id = _job_id(request.path_params["id"])
        job, workflow = self.job_record(job_id)
        return {"job": {**_plain(job), **_plain(workflow)}, "history": self.client.job_history(job_id),
                "links": self.job_links(job_id)}

    def api_batch(self, request: Request) -> Any:
        """pgq.batch_status's row: state, counts by state, the callback and its job id once enqueued."""
        return {"batch": self.batch_status(_job_id(request.path_params["id"], "batch"))}

    def api_health(self, request: Request) -> Any:
        findings = self.client.health()
        return {"status": _worst(findings), "findings": findings}

    def api_schedules(self, request: Request) -> Any:
        return {"schedules": self.client.schedules()}

    def job_action(self, action: str) -> Callable[[Request], Awaitable[Response]]:
        """POST /api/jobs/{id}/retry|cancel|resolve: one call of the pgq function, then the job."""

        async def endpoint(request: Request) -> Response:
            body = await request.body()  # read here; the pgq calls run in the thread pool, as sync routes do
            return await run_in_threadpool(self.api(lambda r: self._job_action(action, r, body)), request)

        return endpoint

    def _job_action(self, action: str, request: Request, body: bytes) -> Any:
        job_id = _job_id(request.path_params["id"])
        refused = self._refused(action)
        if refused is not None:
            return refused
        if action == "resolve":
            ok = self.client.resolve(job_id, _resolve_state(body))
        elif action == "retry":
            ok = self.client.retry(job_id)
        else:
            ok = self.client.cancel(job_id)
        answer: dict[str, Any] = {"ok": ok, "job": self.client.get_job(job_id)}
        if not ok:
            answer["detail"] = f"job {job_id} had already finished: nothing to {action}"
        return answer

    def bulk_action(self, action: str) -> Callable[[Request], Awaitable[Response]]:
        """POST /api/jobs/retry-all | cancel-all: pgq.retry_jobs | pgq.cancel_jobs with the body's
        filter, in calls of at most BULK_CALL, until one acts on none or ``max_jobs`` are acted on
        (pgq_thin.client.bulk_calls)."""

        async def endpoint(request: Request) -> Response:
            body = await request.body()
            return await run_in_threadpool(self.api(lambda r: self._bulk_action(action, body)), request)

        return endpoint

    def _bulk_action(self, action: str, body: bytes) -> Any:
        refused = self._refused(action)
        if refused is not None:
            return refused
        queue, state, kind, before, max_jobs = _bulk_filter(body)
        if before is None:  # the jobs there when the request came: a job that fails again is not retried twice
            [[before]] = [list(row.values()) for row in self._rows(queries.CLOCK, {})]
        act = self.client.retry_jobs if action == "retry_jobs" else self.client.cancel_jobs
        done = "retried" if action == "retry_jobs" else "cancelled"
        total = 0
        try:
            for so_far in bulk_calls(lambda rows: act(queue, state, kind, before, rows), max_jobs):
                total = so_far
        except PgqError as exc:
            if not total:
                raise
            raise type(exc)(f"{exc.message} (after {total} job(s) were {done})", exc.sqlstate, exc.hint) from exc
        return {"ok": True, "count": total,
                "detail": f"{done} {total} {state} job(s) of queue {queue}" + (f" of kind {kind}" if kind else "")}

    def queue_action(self, action: str) -> Callable[[Request], Response]:
        """POST /api/queues/{name}/pause|resume."""

        def build(request: Request) -> Any:
            refused = self._refused(action)
            if refused is not None:
                return refused
            name = request.path_params["name"]
            settings = self.client.pause(name) if action == "pause" else self.client.resume(name)
            return {"ok": True, "queue": settings}

        return self.api(build)

    def metrics(self, request: Request) -> Response:
        """The queue metrics in the Prometheus text format (pgq_thin.metrics, over a pooled connection)."""
        from pgq_thin.metrics import exposition

        try:
            with translated(), self.client.pool.connection() as conn:
                body, content_type = exposition(conn)
        except PgqError as exc:
            return _json(_error_body(exc), _status_of(exc))
        return Response(body, media_type=content_type)

    def healthz(self, request: Request) -> Response:
        """Liveness: the process answers and the database does (pgq.version())."""
        try:
            return _json({"status": "ok", "pgq_version": self.client.version()})
        except PgqError as exc:
            return _json({"status": "unavailable", **_error_body(exc)}, 503)


def _resolve_state(body: bytes) -> str:
    try:
        data = parse_json(body)
    except BadJSON as exc:
        raise BadRequest(f'{exc}: {{"state": "done" | "pending" | "failed" | "cancelled"}}') from None
    if not isinstance(data, dict) or not isinstance(data.get("state"), str):
        raise BadRequest('the body must be {"state": "done" | "pending" | "failed" | "cancelled"}')
    return str(data["state"])


_BULK_BODY = ('{"queue": "...", "state": "...", "kind": "..." | null, "before": "an ISO 8601 time with its offset" '
              f'| null, "max_jobs": 1 to {BULK_MAX}}}')


def _bulk_filter(body: bytes) -> tuple[str, str, str | None, datetime | None, int]:
    """retry-all's and cancel-all's body: the filter, the time the jobs are from before, and the most
    to act on; BadRequest (400) naming what is wrong (the values themselves pgq checks)."""
    try:
        data = parse_json(body)
    except BadJSON as exc:
        raise BadRequest(f"{exc}: {_BULK_BODY}") from None
    if not isinstance(data, dict):
        raise BadRequest(f"the body must be {_BULK_BODY}")
    for name in ("queue", "state"):
        if not isinstance(data.get(name), str):
            raise BadRequest(f'"{name}" must be a string: {_BULK_BODY}')
    if data.get("kind") is not None and not isinstance(data["kind"], str):
        raise BadRequest(f'"kind" must be a string or null: {_BULK_BODY}')
    before = data.get("before")
    if before is not None:
        try:
            before = datetime.fromisoformat(before) if isinstance(before, str) else None
        except ValueError:
            before = None
        if before is None or before.tzinfo is None:
            raise BadRequest(f'"before" must be an ISO 8601 time with its offset, or null, got {data["before"]!r:.60}')
    max_jobs = data.get("max_jobs")
    if type(max_jobs) is not int or not 1 <= max_jobs <= BULK_MAX:
        raise BadRequest(f'"max_jobs" (the most jobs to act on) must be a number from 1 to {BULK_MAX}, '
                         f'got {max_jobs!r:.40}')
    return data["queue"], data["state"], data.get("kind"), before, max_jobs


def _worst(findings: Sequence[Any]) -> str:
    severities = {f.severity for f in findings}
    return "critical" if "critical" in severities else "warning" if "warning" in severities else "ok"


async def _not_found(request: Request, exc: Exception) -> Response:
    body = {"error": f"no such page: {request.url.path[:200]}", "sqlstate": None, "hint": None}
    if wants_html(request):
        return HTMLResponse("<!doctype html><title>Not found</title><p>Not found. <a href=\"/\">pgq dashboard</a>",
                            status_code=404)
    return JSONResponse(body, status_code=404)


async def _server_error(request: Request, exc: Exception) -> Response:
    log.exception("dashboard error on %s %s", request.method, request.url.path, exc_info=exc)
    return JSONResponse({"error": "internal error (see the dashboard's log)", "sqlstate": None, "hint": None},
                        status_code=500)


def create_app(client: Client, *, token: str | None = None, allowed_hosts: Sequence[str] | None = None,
               session_lifetime: float = SESSION_LIFETIME) -> Starlette:
    """The dashboard over ``client``. ``token``: require it (Bearer or a login's session cookie) on
    every request; ``allowed_hosts``: the Host names to answer (None: any); ``session_lifetime``:
    how long a login lasts, in seconds (12 hours)."""
    sessions, throttle = Sessions(session_lifetime), Throttle()
    d = Dashboard(client, token, sessions, throttle)
    routes = [
        Route("/", d.page("index.html", d.overview)),
        Route("/jobs", d.page("jobs.html", d.jobs)),
        Route("/jobs/{id}", d.page("job.html", d.job)),
        Route("/batches/{id}", d.page("batch.html", d.batch)),
        Route("/schedules", d.page("schedules.html", d.schedules)),
        Route("/health", d.page("health.html", d.health)),
        Route("/login", d.login_form, methods=["GET"]),
        Route("/login", d.login, methods=["POST"]),
        Route("/logout", d.logout, methods=["POST"]),
        Route("/healthz", d.healthz),
        Route("/metrics", d.metrics),
        Route("/api/queues", d.api(d.api_queues)),
        Route("/api/jobs", d.api(d.api_jobs)),
        Route("/api/jobs/retry-all", d.bulk_action("retry_jobs"), methods=["POST"]),
        Route("/api/jobs/cancel-all", d.bulk_action("cancel_jobs"), methods=["POST"]),
        Route("/api/jobs/{id}", d.api(d.api_job)),
        Route("/api/batches/{id}", d.api(d.api_batch)),
        Route("/api/health", d.api(d.api_health)),
        Route("/api/schedules", d.api(d.api_schedules)),
        Route("/api/jobs/{id}/retry", d.job_action("retry"), methods=["POST"]),
        Route("/api/jobs/{id}/cancel", d.job_action("cancel"), methods=["POST"]),
        Route("/api/jobs/{id}/resolve", d.job_action("resolve"), methods=["POST"]),
        Route("/api/queues/{name}/pause", d.queue_action("pause"), methods=["POST"]),
        Route("/api/queues/{name}/resume", d.queue_action("resume"), methods=["POST"]),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    middleware = [Middleware(Guard, token=token, login_page=d.login_required, sessions=sessions, throttle=throttle,
                             allowed_hosts=allowed_hosts)]
    return Starlette(routes=routes, middleware=middleware,
                     exception_handlers={404: _not_found, 500: _server_error, Exception: _server_error})


def serve(client: Client, host: str = "127.0.0.1", port: int = 8080, token: str | None = None) -> None:
    """Serve the dashboard with uvicorn until SIGINT/SIGTERM."""
    import uvicorn

    app = create_app(client, token=token, allowed_hosts=allowed_hosts_of(host))  # loopback: its names only
    uvicorn.run(app, host=host, port=port, log_level="info", server_header=False)
