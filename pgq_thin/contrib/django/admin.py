"""Read-only admin pages of pgq's jobs and queues (docs/django.md). Their lists are read through
pgq's functions on Django's connection, with the login's rights: pgq.list_jobs (filtered by queue,
state and kind, newest first, 100 a page) and pgq.stats (one row per queue). Nothing can be added,
changed or deleted here: the add, change, delete and history pages answer 403."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db import connections, transaction
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from pgq_thin import calls
from pgq_thin.contrib.django import database_alias
from pgq_thin.contrib.django.models import Job, Queue
from pgq_thin.durations import format_duration
from pgq_thin.errors import PgqError
from pgq_thin.tasks import _send

#: Jobs on a page of the jobs list (pgq.list_jobs's limit_rows).
PAGE = 100

#: The states the jobs list filters by (pgq.job_state).
STATES = ("waiting", "pending", "running", "outcome_unknown", "done", "failed", "cancelled")


def _read(call: calls.Call[Any]) -> Any:
    """``call`` on Django's connection to pgq's database, in a savepoint (a refused read leaves the
    request's transaction usable)."""
    alias = database_alias()
    with transaction.atomic(using=alias):
        connection = connections[alias]
        connection.ensure_connection()
        return _send(connection.connection, call)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if hasattr(value, "total_seconds"):
        return format_duration(value)
    if hasattr(value, "isoformat"):
        return f"{value:%Y-%m-%d %H:%M:%S}"
    return str(value)


def _last_line(error: str | None) -> str | None:
    """A traceback's last line (the exception), cut to 120 characters."""
    lines = (error or "").strip().splitlines()
    return lines[-1][:120] if lines else None


class ReadOnlyAdmin(admin.ModelAdmin):
    """A list read through a pgq function, and no way to add, change or delete."""

    headers: Sequence[str] = ()

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def add_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        raise PermissionDenied

    def change_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        raise PermissionDenied

    def delete_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        raise PermissionDenied

    def history_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        raise PermissionDenied

    def rows(self, request: HttpRequest, context: dict[str, Any]) -> list[Sequence[Any]]:
        raise NotImplementedError

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not self.has_view_or_change_permission(request):
            raise PermissionDenied
        context: dict[str, Any] = {**self.admin_site.each_context(request), "opts": self.model._meta,
                                   "title": f"pgq {self.model._meta.verbose_name_plural}",
                                   "headers": self.headers, "error": None, **(extra_context or {})}
        try:
            context["rows"] = [[_cell(v) for v in row] for row in self.rows(request, context)]
        except PgqError as exc:  # a bad filter, a queue this login may not read, no pgq installed
            context["rows"], context["error"] = [], str(exc)
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "pgq/changelist.html", context)


@admin.register(Job)
class JobAdmin(ReadOnlyAdmin):
    headers = ("id", "queue", "kind", "state", "attempt", "max attempts", "priority", "run at", "created",
               "finished", "last error")
    list_display = ("id", "queue", "kind", "state", "attempt", "run_at")
    list_filter = ("queue", "state", "kind")

    def rows(self, request: HttpRequest, context: dict[str, Any]) -> list[Sequence[Any]]:
        chosen = {name: request.GET.get(name) or None for name in ("queue", "state", "kind")}
        before = request.GET.get("before") or None
        context["filters"] = {"queue": chosen["queue"] or "", "state": chosen["state"] or "",
                              "kind": chosen["kind"] or "", "states": STATES,
                              "queues": [q.queue for q in _read(calls.stats())]}
        if before is not None and not before.isdigit():
            raise PgqError(f"before must be a job id, got {before[:40]!r}")
        jobs = _read(calls.list_jobs(limit_rows=PAGE, before_id=int(before) if before else None, **chosen))
        if len(jobs) == PAGE:
            following = {**{k: v for k, v in chosen.items() if v}, "before": jobs[-1].id}
            context["older"] = "?" + urlencode(following)
        return [(j.id, j.queue, j.kind, j.state, j.attempt, j.max_attempts, j.priority, j.run_at, j.created_at,
                 j.finished_at, _last_line(j.last_error))
                for j in jobs]


@admin.register(Queue)
class QueueAdmin(ReadOnlyAdmin):
    headers = ("queue", "paused", "waiting", "pending", "scheduled", "running", "expired", "done", "failed",
               "cancelled", "unknown", "oldest ready")
    list_display = ("name", "paused")

    def rows(self, request: HttpRequest, context: dict[str, Any]) -> list[Sequence[Any]]:
        return [(q.queue, q.paused, q.waiting, q.pending, q.scheduled, q.running, q.expired, q.done, q.failed,
                 q.cancelled, q.outcome_unknown, q.oldest_ready_age) for q in _read(calls.stats())]
