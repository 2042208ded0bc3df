"""The dashboard's ASGI app (Starlette): server-rendered pages, a JSON API and the actions.

It goes through an AsyncClient only: every read and every action is one awaited method of it, i.e.
one call of a pgq function with the request's values as bound parameters (no SQL is built from a
request, and none is written here). Besides pgq's functions it asks two questions through the
client: ``privileges()``, which of pgq's admin functions the login may call, once per page, to
grey the buttons of a pgq_monitor login and say it is read-only; and ``clock()``, the database's
clock, which dates a "retry all shown" / "cancel all shown" / "delete all shown" confirmation. An action asks nothing
first: it is the call, and the database is the authority: a login that may not make it gets
PostgreSQL's refusal (42501), answered 403 with its message, and nothing changes. ``GET /metrics``
is the Prometheus text of pgq_thin.metrics, from the client's ``metrics()``, ``health()`` and
``queue_limits()`` (the same text as ``pgq-thin metrics``).

The AsyncClient is made by the ``connect`` function given to ``create_app``, once per server start,
in the server's event loop (its connections belong to that loop), and closed when the server stops.

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
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import asdict, is_dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode

import jinja2
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from pgq_thin import __version__
from pgq_thin.async_client import AsyncClient
from pgq_thin.calls import bulk_plan, seconds
from pgq_thin.client import BULK_CALL
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
from pgq_thin.durations import Interval, format_duration, parse_duration
from pgq_thin.encryption import envelope_label
from pgq_thin.errors import (
    ConnectionLost,
    InvalidArgument,
    JobNotFound,
    PermissionDenied,
    PgqError,
    WrongState,
)
from pgq_thin.metrics import rows_of, text_of
from pgq_thin.models import Privileges, QueueSettings, error_summary
from pgq_thin.webguard import Throttle
from pgq_thin.webguard import allowed_hosts as allowed_hosts_of

__all__ = ["COOKIE", "create_app", "serve"]

log = logging.getLogger("pgq_thin.dashboard")

HERE = Path(__file__).parent
#: Where a server's AsyncClient is kept: its lifespan state, which Starlette gives each request.
CLIENT = "pgq_client"
#: A route's function.
Endpoint = Callable[[Request], Awaitable[Response]]
JOB_STATES = ("waiting", "pending", "running", "done", "failed", "cancelled", "outcome_unknown")
RESOLVE_STATES = ("done", "pending", "failed", "cancelled")
MAX_BIGINT = 2**63 - 1
#: What a page asks pgq.list_jobs for unless told otherwise.
PAGE_SIZE = 50
#: How many of a job's dependencies, and of its dependants, the job page and /api/jobs/{id} list
#: (pgq.job_links is asked for one more of each, to say when there are more).
LINKS_SHOWN = 100
#: The job's columns of migrations 0017 and 0022 that the job page shows apart (None on an older
#: schema): its dependency mode and batch; its workflow, parent, the signal it waits for and until
#: when, its start_by and expires_at.
WORKFLOW_COLUMNS = ("dependency_mode", "batch_id", "workflow_id", "parent_id", "wait_signal", "wake_at",
                    "start_by", "expires_at", "dependencies_left", "last_event", "state")
#: How many of a job's recorded steps the job page and /api/jobs/{id} list (pgq.job_steps' first
#: page, by name; asked for one more, to say when there are more).
STEPS_SHOWN = 100
#: What a page shows when it could not ask what the login may do: nothing may be done.
UNKNOWN_PERMISSIONS: dict[str, Any] = {"role": "?", "can": {}, "read_only": True, "missing": []}
#: "retry all shown", "cancel all shown" and "delete all shown" (docs/dashboard.md): the list's
#: states each acts on (never a running job deleted), its verb and what it did, and the most jobs
#: one click acts on (in calls of BULK_CALL jobs of pgq.retry_jobs / cancel_jobs / delete_jobs).
BULK_STATES = {"retry_jobs": ("failed", "cancelled"),
               "cancel_jobs": ("waiting", "pending", "running", "outcome_unknown"),
               "delete_jobs": ("pending", "waiting", "done", "failed", "cancelled")}
BULK_VERBS = {"retry_jobs": ("retry", "retried"), "cancel_jobs": ("cancel", "cancelled"),
              "delete_jobs": ("delete", "deleted")}
BULK_MAX = 10000


class BadRequest(Exception):
    """A request value the dashboard cannot even pass to pgq (a job id that is not a number)."""


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


#: A batch page's members at a time (pgq.batch_jobs' limit_rows).
MEMBERS_SHOWN = 50


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


def _tags(params: Any) -> list[str] | None:
    """The list's ``tags`` filter: tags separated by commas (blanks around them dropped); None when
    there are none. pgq checks the tags themselves (22023, naming ``tags``)."""
    text = params.get("tags")
    tags = [t.strip() for t in str(text or "").split(",") if t.strip()]
    return tags or None


def _settings_text(q: QueueSettings) -> str:
    """A queue's settings in a few words for the overview: paused kinds, fair, caps, lease, limits,
    priority aging (max_wait), sequences (key_sequence), archive, grants."""
    parts = ["kinds paused: " + ", ".join(q.paused_kinds)] if q.paused_kinds else []
    parts.append("fair" if q.fair else "fifo")
    if q.max_running:
        parts.append(f"max {q.max_running} running")
    parts.append(f"lease {_ago(q.lease)}")
    if q.max_run_time is not None:
        parts.append(f"max run {_ago(q.max_run_time)}")
    if q.max_wait is not None:
        parts.append(f"aging after {_ago(q.max_wait)}")
    if q.key_sequence is not None:
        parts.append(f"sequence: {q.key_sequence}")
    if q.archive:
        parts.append("archive")  # finished jobs moved into pgq.archive by the sweep
    parts.append(f"{q.max_attempts} attempts")
    if q.restricted:
        parts.append("grants: " + ", ".join(q.restricted))
    return " · ".join(parts)


#: A duration or an age for the pages, as the CLI writes it: 4.5s, 3m 12s, 1h, 2h 5m, 3d 4h.
_ago = format_duration


def _when(value: datetime | None) -> str:
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M:%S %Z").strip()


def _pretty(value: Any) -> str:
    """A value as indented JSON; an encrypted payload or result as "[encrypted, key k2]"."""
    return envelope_label(value) or json.dumps(_plain(value), indent=2, sort_keys=True, ensure_ascii=False)


def _templates() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,  # every value is escaped: a payload's "<script>" shows as text
        undefined=jinja2.StrictUndefined,
    )
    env.filters.update(ago=_ago, when=_when, pretty=_pretty, error_line=error_summary)  # a traceback's exception
    return env


class Dashboard:
    """The routes. Each request's AsyncClient is its server's (``_client``)."""

    def __init__(self, token: str | None, sessions: Sessions, throttle: Throttle) -> None:
        self.token = token
        self.sessions = sessions
        self.throttle = throttle
        self.templates = _templates()

    # What the login may do: asked once per page, to show it; an action is refused by the database -----

    async def permissions(self, client: AsyncClient) -> dict[str, Any]:
        """current_user and, per action, whether the login may call its pgq function (a page's buttons)."""
        return _permissions(await client.privileges())

    # Pages -----------------------------------------------------------------------------------------

    async def render(self, request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
        """A page, with what the login may do (one question to the database)."""
        try:
            perms = await self.permissions(_client(request))
        except PgqError:
            perms = UNKNOWN_PERMISSIONS
        return self.html(request, template, status, perms=perms, **context)

    def html(self, request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
        context.setdefault("path", request.url.path)
        html = self.templates.get_template(template).render(
            version=__version__, login=self.token is not None, **context)
        return HTMLResponse(html, status_code=status)

    def page(self, template: str, build: Callable[[Request, AsyncClient], Awaitable[dict[str, Any]]]) -> Endpoint:
        """A page: ``build`` reads what it shows; a pgq error becomes the error page."""

        async def endpoint(request: Request) -> Response:
            try:
                context = await build(request, _client(request))
            except (PgqError, BadRequest) as exc:
                return await self.render(request, "error.html", _status_of(exc), **_error_body(exc))
            return await self.render(request, template, **context)

        return endpoint

    async def overview(self, request: Request, client: AsyncClient) -> dict[str, Any]:
        findings = await client.health()
        settings = {q.name: _settings_text(q) for q in await client.queue_settings()}
        queues = await client.stats()
        # The throughput chart's first point: pgq.stats' finished counters (every job that ended
        # done, failed or cancelled; a prune does not lower them). pgq keeps no history of them.
        finished = sum(q.done + q.failed + q.cancelled for q in queues)
        return {"queues": queues, "settings": settings, "finished": finished,
                "findings": [f for f in findings if f.severity != "ok"], "worst": _worst(findings)}

    async def jobs(self, request: Request, client: AsyncClient) -> dict[str, Any]:
        params = request.query_params
        queue, state, kind = (_optional_text(params, n) for n in ("queue", "state", "kind"))
        tags = _tags(params)
        limit = _optional_int(params, "limit") or PAGE_SIZE
        before_id = _optional_int(params, "before_id")
        jobs = await client.list_jobs(queue, state, kind, limit, before_id, tags)
        filters = {k: v for k, v in (("queue", queue), ("state", state), ("kind", kind),
                                     ("tags", ",".join(tags or []))) if v}
        if limit != PAGE_SIZE:
            filters["limit"] = str(limit)
        more = None
        if len(jobs) == limit:
            more = "/jobs?" + urlencode({**filters, "before_id": jobs[-1].id})
        first = "/jobs?" + urlencode(filters) if before_id is not None else None
        stats = await client.stats()
        return {"jobs": jobs, "queue": queue or "", "state": state or "", "kind": kind or "",
                "tags": ", ".join(tags or []), "more": more, "first": first, "queues": [q.queue for q in stats],
                "states": JOB_STATES, "bulk": await self.bulk_buttons(client, stats, queue, state, kind, tags)
                if jobs else []}

    # "retry all shown", "cancel all shown", "delete all shown" (docs/dashboard.md) -------------------
    # "All shown" is every job the list's filter matches (one queue, one state, maybe a kind and tags), on
    # every page, as of the moment the page was made: the confirmation states how many, dated by the
    # database clock, and the click acts on at most that many (at most BULK_MAX), oldest first, and
    # only on jobs that finished (retry; delete of a finished state) or were created (cancel; delete
    # of pending or waiting jobs) before that moment.

    async def bulk_buttons(self, client: AsyncClient, stats: Sequence[Any], queue: str | None, state: str | None,
                           kind: str | None, tags: list[str] | None) -> list[dict[str, Any]]:
        """The list's "retry all shown" / "cancel all shown" / "delete all shown" buttons that apply
        to its state (their URL, body and confirmation): none when the filter is not one queue and
        one state, or matches nothing."""
        actions = [a for a, states in BULK_STATES.items() if state in states]
        if not actions or queue is None or state is None:
            return []
        count, exact = await self.matching(client, stats, queue, state, kind, tags)
        if count == 0:
            return []
        as_of = await client.clock()
        acted = min(count, BULK_MAX)
        jobs = f"{state} job{'s' if count != 1 else ''} of queue {queue}" + _of(kind, tags)
        shown = f"{count}" if exact else f"more than {BULK_MAX}"
        body = json.dumps({"queue": queue, "state": state, "kind": kind, "tags": tags, "before": as_of.isoformat(),
                           "max_jobs": acted})
        buttons = []
        for action in actions:
            verb = BULK_VERBS[action][0]
            confirm = (f"{verb.capitalize()} all {count} {jobs}?" if count <= BULK_MAX else
                       f"{verb.capitalize()} the {acted} oldest of the {shown} {jobs}? (at most {BULK_MAX} a click)")
            if action == "delete_jobs":
                confirm += " They are gone for good, with their history."
            buttons.append({"action": action, "url": f"/api/jobs/{verb}-all", "label": f"{verb} all shown ({shown})",
                            "confirm": confirm, "body": body, "count": count})
        return buttons

    async def matching(self, client: AsyncClient, stats: Sequence[Any], queue: str, state: str,
                       kind: str | None, tags: list[str] | None = None) -> tuple[int, bool]:
        """How many jobs of ``queue`` are in ``state`` (of ``kind``, holding ``tags``), and whether
        that is exact: from pgq.stats without a kind or tags for a live state; otherwise counted through
        pgq.list_jobs, BULK_CALL a page, up to BULK_MAX and a page more (not exact past BULK_MAX:
        "more than BULK_MAX")."""
        # Finished states are counted by pages too: pgq.stats' done, failed and cancelled are the
        # finished counters (every job that ever finished so), not the jobs still stored.
        if kind is None and tags is None and state not in ("done", "failed", "cancelled"):
            row = next((s for s in stats if s.queue == queue), None)
            if row is None:
                return 0, True
            return int(row.pending + row.scheduled if state == "pending" else getattr(row, state)), True
        count, before_id = 0, None
        while count <= BULK_MAX:
            page = await client.list_jobs(queue, state, kind, BULK_CALL, before_id, tags)
            count += len(page)
            if len(page) < BULK_CALL:
                return count, True
            before_id = page[-1].id
        return count, False

    async def job(self, request: Request, client: AsyncClient) -> dict[str, Any]:
        job_id = _job_id(request.path_params["id"])
        job = await client.get_job(job_id)
        return {"job": job, "workflow": _workflow(job), "links": await self.job_links(client, job_id),
                "steps": await self.job_steps(client, job_id),
                "history": await client.job_history(job_id), "resolve_states": RESOLVE_STATES}

    async def batch(self, request: Request, client: AsyncClient) -> dict[str, Any]:
        """The batch's counts and callback, and its members newest first (pgq.batch_jobs; ?state=
        picks one state, e.g. the failed ones; ?before= the next page), MEMBERS_SHOWN at a time."""
        batch_id = _job_id(request.path_params["id"], "batch")
        params = request.query_params
        state = params.get("state") or None
        before = _optional_int(params, "before")
        status = await client.batch_status(batch_id)
        try:
            members = await client.batch_jobs(batch_id, state, MEMBERS_SHOWN, before)
        except PgqError as exc:
            if exc.sqlstate != "42883":  # a schema older than 0026: no member list
                raise
            members = None
        return {"batch": status, "members": members, "member_state": state, "members_shown": MEMBERS_SHOWN}

    async def schedules(self, request: Request, client: AsyncClient) -> dict[str, Any]:
        return {"schedules": await client.schedules()}

    async def workers(self, request: Request, client: AsyncClient) -> dict[str, Any]:
        """The live workers of the registry (pgq.workers); None when the schema has none (before 0026)."""
        try:
            return {"workers": await client.workers()}
        except PgqError as exc:
            if exc.sqlstate != "42883":
                raise
            return {"workers": None}

    async def health(self, request: Request, client: AsyncClient) -> dict[str, Any]:
        findings = await client.health()
        return {"findings": findings, "worst": _worst(findings)}

    # Workflows (issue 26): a job's dependencies, dependants and batch; a batch --------------------

    async def job_links(self, client: AsyncClient, job_id: int) -> dict[str, Any] | None:
        """The first LINKS_SHOWN dependencies and dependants (id order) from pgq.job_links, and
        whether there are more of each; None when the schema has no pgq.job_links (before 0017)."""
        try:
            rows = await client.job_links(job_id, LINKS_SHOWN + 1)
        except PgqError as exc:
            if exc.sqlstate == "42883":  # undefined_function: the database is not migrated to 0017 yet
                return None
            raise
        links: dict[str, Any] = {}
        for relation, name in (("dependency", "dependencies"), ("dependant", "dependants"), ("parent", "parent"),
                               ("child", "children"), ("awaiting", "awaiting")):
            of = [{"job_id": r.job_id, "queue": r.queue, "kind": r.kind, "state": r.state}
                  for r in rows if r.relation == relation]
            links[name], links[f"more_{name}"] = of[:LINKS_SHOWN], len(of) > LINKS_SHOWN
        return links

    async def job_steps(self, client: AsyncClient, job_id: int) -> dict[str, Any] | None:
        """The first STEPS_SHOWN recorded steps (pgq.job_steps, by name) and whether there are more;
        None when the dashboard's login may not read them (pgq.job_result's rule) or the schema has
        no pgq.job_steps (before 0022)."""
        try:
            rows = await client.job_steps(job_id, STEPS_SHOWN + 1)
        except (JobNotFound, PermissionDenied):
            return None
        except PgqError as exc:
            if exc.sqlstate == "42883":  # undefined_function: the database is not migrated to 0022 yet
                return None
            raise
        return {"rows": [{"name": r.name, "attempt": r.attempt, "result": r.result, "recorded_at": r.recorded_at}
                         for r in rows[:STEPS_SHOWN]], "more": len(rows) > STEPS_SHOWN}

    # The login form --------------------------------------------------------------------------------

    def login_form(self, request: Request) -> Response:
        if self.token is None:
            return RedirectResponse("/", status_code=303)
        return self._login_page(request, local(request.query_params.get("next")), None, 200)

    def login_required(self, request: Request, next_path: str) -> Response:
        """A page asked for without the token: 401, with the login form (back to the page once in)."""
        return self._login_page(request, next_path, None, 401)

    def _login_page(self, request: Request, next_path: str, error: str | None, status: int) -> HTMLResponse:
        perms: dict[str, Any] = {"role": None, "can": {}, "read_only": True, "missing": []}
        return self.html(request, "login.html", status, next=next_path, error=error, perms=perms)

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

    def api(self, build: Callable[[Request, AsyncClient], Awaitable[Any]], action: str | None = None) -> Endpoint:
        """An API endpoint: ``build`` answers; errors become {"error", "sqlstate", "hint"} with a
        status. ``action``: the pgq function the endpoint calls, named when the database refuses it."""

        async def endpoint(request: Request) -> Response:
            try:
                answer = await build(request, _client(request))
            except (PgqError, BadRequest) as exc:
                return _refusal(exc, action)
            return answer if isinstance(answer, Response) else _json(answer)

        return endpoint

    async def api_queues(self, request: Request, client: AsyncClient) -> Any:
        return {"queues": await client.stats(), "settings": await client.queue_settings()}

    async def api_jobs(self, request: Request, client: AsyncClient) -> Any:
        params = request.query_params
        limit = _optional_int(params, "limit") or PAGE_SIZE
        jobs = await client.list_jobs(_optional_text(params, "queue"), _optional_text(params, "state"),
                                      _optional_text(params, "kind"), limit, _optional_int(params, "before_id"),
                                      _tags(params))
        return {"jobs": jobs, "next_before_id": jobs[-1].id if len(jobs) == limit else None}

    async def api_job(self, request: Request, client: AsyncClient) -> Any:
        """The job (pgq.get_job's row), its history, its links (see job_links; null before 0017) and
        its steps (see job_steps; null before 0022, or for a login that may not read them)."""
        job_id = _job_id(request.path_params["id"])
        return {"job": await client.get_job(job_id), "history": await client.job_history(job_id),
                "links": await self.job_links(client, job_id), "steps": await self.job_steps(client, job_id)}

    async def api_batch(self, request: Request, client: AsyncClient) -> Any:
        """pgq.batch_status's row: state, counts by state, the callback and its job id once enqueued."""
        return {"batch": await client.batch_status(_job_id(request.path_params["id"], "batch"))}

    async def api_health(self, request: Request, client: AsyncClient) -> Any:
        findings = await client.health()
        return {"status": _worst(findings), "findings": findings}

    async def api_schedules(self, request: Request, client: AsyncClient) -> Any:
        return {"schedules": await client.schedules()}

    async def api_workers(self, request: Request, client: AsyncClient) -> Any:
        return {"workers": await client.workers()}

    def job_action(self, action: str) -> Endpoint:
        """POST /api/jobs/{id}/retry|cancel|resolve: one call of the pgq function, then the job."""

        async def build(request: Request, client: AsyncClient) -> Any:
            job_id = _job_id(request.path_params["id"])
            if action == "resolve":
                ok = await client.resolve(job_id, _resolve_state(await request.body()))
            elif action == "retry":
                ok = await client.retry(job_id)
            else:
                ok = await client.cancel(job_id)
            answer: dict[str, Any] = {"ok": ok, "job": await client.get_job(job_id)}
            if not ok:
                answer["detail"] = f"job {job_id} had already finished: nothing to {action}"
            return answer

        return self.api(build, action)

    def bulk_action(self, action: str) -> Endpoint:
        """POST /api/jobs/retry-all | cancel-all | delete-all: pgq.retry_jobs | cancel_jobs |
        delete_jobs with the body's filter, in calls of at most BULK_CALL, until one acts on none or
        ``max_jobs`` are acted on (pgq_thin.calls.bulk_plan)."""

        async def build(request: Request, client: AsyncClient) -> Any:
            queue, state, kind, tags, before, max_jobs = _bulk_filter(await request.body())
            if before is None:  # the jobs there when the request came: a job that fails again is not retried twice
                before = await client.clock()
            elif isinstance(before, timedelta):  # that long ago by the database's clock
                ago = before
                try:
                    before = await client.clock() - ago
                except OverflowError:
                    raise BadRequest(f'"before": {format_duration(ago)} ago is before the year 1') from None
            act = {"retry_jobs": client.retry_jobs, "cancel_jobs": client.cancel_jobs,
                   "delete_jobs": client.delete_jobs}[action]
            done = BULK_VERBS[action][1]
            plan, total = bulk_plan(max_jobs, BULK_CALL), 0
            try:
                rows = next(plan)
                while True:
                    acted = await act(queue, state, kind, before, rows, tags)
                    total += acted
                    rows = plan.send(acted)
            except StopIteration:
                pass
            except PgqError as exc:
                if not total:
                    raise
                raise type(exc)(f"{exc.message} (after {total} job(s) were {done})", exc.sqlstate, exc.hint) from exc
            return {"ok": True, "count": total,
                    "detail": f"{done} {total} {state} job(s) of queue {queue}" + _of(kind, tags)}

        return self.api(build, action)

    def queue_action(self, action: str) -> Endpoint:
        """POST /api/queues/{name}/pause|resume."""

        async def build(request: Request, client: AsyncClient) -> Any:
            name = request.path_params["name"]
            settings = await (client.pause(name) if action == "pause" else client.resume(name))
            return {"ok": True, "queue": settings}

        return self.api(build, action)

    async def metrics(self, request: Request) -> Response:
        """The queue metrics in the Prometheus text format (pgq_thin.metrics, from the client's answers)."""
        client = _client(request)
        try:
            rows = rows_of(await client.metrics(), await client.health(), await client.queue_limits())
            body, content_type = text_of(rows)
        except PgqError as exc:
            return _json(_error_body(exc), _status_of(exc))
        return Response(body, media_type=content_type)

    async def healthz(self, request: Request) -> Response:
        """Liveness: the process answers and the database does (pgq.version())."""
        try:
            return _json({"status": "ok", "pgq_version": await _client(request).version()})
        except PgqError as exc:
            return _json({"status": "unavailable", **_error_body(exc)}, 503)


def _client(request: Request) -> AsyncClient:
    """The AsyncClient of the server this request came to (made by its lifespan)."""
    client = getattr(request.state, CLIENT, None)  # Starlette copies the lifespan's state into each request
    if not isinstance(client, AsyncClient):
        raise RuntimeError("the dashboard's app must run with its lifespan (it makes the AsyncClient): "
                           "serve it with an ASGI server, or enter Starlette's TestClient")
    return client


def _permissions(privileges: Privileges) -> dict[str, Any]:
    """What a page shows of what the login may do."""
    can = {name: bool(may) for name, may in privileges.functions.items()}
    return {"role": privileges.role, "can": can, "read_only": privileges.read_only, "missing": privileges.missing}


def _workflow(job: Any) -> dict[str, Any]:
    return {name: getattr(job, name, None) for name in WORKFLOW_COLUMNS}


def _refusal(exc: Exception, action: str | None) -> JSONResponse:
    """An error's answer. For an action (``action``: its pgq function), what the database refused
    is said as such: a function the schema does not have yet (42883) is 501 naming it; a call the
    login may not make (42501) is 403 with PostgreSQL's message, and a hint of what to do."""
    body = _error_body(exc)
    if action is not None and isinstance(exc, PgqError):
        if exc.sqlstate == "42883":  # undefined_function: the schema predates the migration that adds it
            return _json({"error": f"this database's pgq schema has no pgq.{action}: it predates the migration "
                                   "that adds it (run pgq-thin migrate)", "sqlstate": "42883", "hint": None}, 501)
        if isinstance(exc, PermissionDenied) and exc.hint is None:
            body["hint"] = (f"read-only: the dashboard's database login may not call pgq.{action} (a pgq_monitor "
                            "login is read-only; connect the dashboard as a pgq_admin login to act)")
    return _json(body, _status_of(exc))


def _resolve_state(body: bytes) -> str:
    try:
        data = parse_json(body)
    except BadJSON as exc:
        raise BadRequest(f'{exc}: {{"state": "done" | "pending" | "failed" | "cancelled"}}') from None
    if not isinstance(data, dict) or not isinstance(data.get("state"), str):
        raise BadRequest('the body must be {"state": "done" | "pending" | "failed" | "cancelled"}')
    return str(data["state"])


_BULK_BODY = ('{"queue": "...", "state": "...", "kind": "..." | null, "tags": ["...", ...] | null, '
              '"before": "an ISO 8601 time with its offset" | "a duration such as 1h (that long ago)" | null, '
              f'"max_jobs": 1 to {BULK_MAX}}}')


def _of(kind: str | None, tags: list[str] | None) -> str:
    """What a bulk button's words add for a kind and tags: " of kind K tagged a, b"."""
    return (f" of kind {kind}" if kind else "") + (f" tagged {', '.join(tags)}" if tags else "")


def _bulk_filter(body: bytes) -> tuple[str, str, str | None, list[str] | None, datetime | timedelta | None, int]:
    """retry-all's, cancel-all's and delete-all's body: the filter, the time the jobs are from before (a time, or
    a duration as the CLI's --before takes it: that long before the database's clock now), and the
    most to act on; BadRequest (400) naming what is wrong (the values themselves pgq checks)."""
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
    tags = data.get("tags")
    if tags is not None and not (isinstance(tags, list) and all(isinstance(t, str) for t in tags)):
        raise BadRequest(f'"tags" must be a list of strings or null: {_BULK_BODY}')
    before = data.get("before")
    if before is not None:
        try:
            before = _before(before)
        except ValueError as exc:
            raise BadRequest(f'"before" must be an ISO 8601 time with its offset, a duration such as "1h" (that '
                             f'long ago), or null, got {data["before"]!r:.60}{exc}') from None
    max_jobs = data.get("max_jobs")
    if type(max_jobs) is not int or not 1 <= max_jobs <= BULK_MAX:
        raise BadRequest(f'"max_jobs" (the most jobs to act on) must be a number from 1 to {BULK_MAX}, '
                         f'got {max_jobs!r:.40}')
    return data["queue"], data["state"], data.get("kind"), tags, before, max_jobs


def _before(value: Any) -> datetime | timedelta:
    """A bulk body's "before": a duration (``"1h"``, as the CLI's --before) or a time with its
    offset; ValueError (its text: why the duration is not one, when it looks like one) otherwise."""
    if not isinstance(value, str):
        raise ValueError("")
    try:
        return parse_duration(value)
    except ValueError as exc:
        if re.fullmatch(r"\s*\d+(\.\d+)?\s*[a-z]*\s*", value):  # meant as a duration: say why it is not one
            raise ValueError(f" ({exc})") from None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError("") from None
    if moment.tzinfo is None:
        raise ValueError(" (without an offset)")
    return moment


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


def create_app(connect: Callable[[], AsyncClient], *, token: str | None = None,
               allowed_hosts: Sequence[str] | None = None, session_lifetime: Interval = SESSION_LIFETIME) -> Starlette:
    """The dashboard over the AsyncClient ``connect()`` makes (called when the server starts, in its
    event loop; the client is opened then and closed when the server stops). ``token``: require
    it (Bearer or a login's session cookie) on every request; ``allowed_hosts``: the Host names to
    answer (None: any); ``session_lifetime``: how long a login lasts (seconds, a timedelta or a
    duration such as ``"8h"``; 12 hours)."""
    sessions, throttle = Sessions(seconds("session_lifetime", session_lifetime, positive=True)), Throttle()
    d = Dashboard(token, sessions, throttle)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Any]]:
        client = connect()
        await client.open()
        try:
            yield {CLIENT: client}
        finally:
            await client.close()

    routes = [
        Route("/", d.page("index.html", d.overview)),
        Route("/jobs", d.page("jobs.html", d.jobs)),
        Route("/jobs/{id}", d.page("job.html", d.job)),
        Route("/batches/{id}", d.page("batch.html", d.batch)),
        Route("/schedules", d.page("schedules.html", d.schedules)),
        Route("/workers", d.page("workers.html", d.workers)),
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
        Route("/api/jobs/delete-all", d.bulk_action("delete_jobs"), methods=["POST"]),
        Route("/api/jobs/{id}", d.api(d.api_job)),
        Route("/api/batches/{id}", d.api(d.api_batch)),
        Route("/api/health", d.api(d.api_health)),
        Route("/api/schedules", d.api(d.api_schedules)),
        Route("/api/workers", d.api(d.api_workers)),
        Route("/api/jobs/{id}/retry", d.job_action("retry"), methods=["POST"]),
        Route("/api/jobs/{id}/cancel", d.job_action("cancel"), methods=["POST"]),
        Route("/api/jobs/{id}/resolve", d.job_action("resolve"), methods=["POST"]),
        Route("/api/queues/{name}/pause", d.queue_action("pause"), methods=["POST"]),
        Route("/api/queues/{name}/resume", d.queue_action("resume"), methods=["POST"]),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    middleware = [Middleware(Guard, token=token, login_page=d.login_required, sessions=sessions, throttle=throttle,
                             allowed_hosts=allowed_hosts)]
    return Starlette(routes=routes, middleware=middleware, lifespan=lifespan,
                     exception_handlers={404: _not_found, 500: _server_error, Exception: _server_error})


def serve(connect: Callable[[], AsyncClient], host: str = "127.0.0.1", port: int = 8080,
          token: str | None = None) -> None:
    """Serve the dashboard with uvicorn until SIGINT/SIGTERM (``connect``: as create_app's)."""
    import uvicorn

    app = create_app(connect, token=token, allowed_hosts=allowed_hosts_of(host))  # loopback: its names only
    uvicorn.run(app, host=host, port=port, log_level="info", server_header=False)
