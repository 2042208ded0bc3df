"""Prometheus metrics of the queue, read from pgq's SQL functions: ``exposition(conn)`` gives the
text a scrape answers (the dashboard's ``GET /metrics`` serves it), ``serve(dsn, port)`` runs the
exporter alone (``pgq-thin metrics``). Needs the ``metrics`` extra (prometheus_client):
``pip install 'pgq-thin[metrics]'``; nothing imports it until a metric is asked for.

One scrape is three statements, whatever the finished history holds: ``SELECT * FROM pgq.metrics()``
(per queue: jobs by live state, expired leases, the oldest due job's age, and the counters of
finished jobs kept by migration 0010's trigger, never a count of finished rows),
``pgq.health()`` (the findings, counted by check and severity) and ``pgq.queue_limits()`` (what
the limits hold back, for the queues that have a limit).

- ``pgq_jobs{queue,state}`` (gauge): jobs now, for the states a job waits or runs in: ``pending``
  (due now), ``scheduled`` (due later), ``running``, ``outcome_unknown``, ``waiting`` (for its
  dependencies). Finished jobs are not a gauge (that is a count over the history): see the counter.
- ``pgq_jobs_finished_total{queue,state}`` (counter): jobs that reached ``done``, ``failed`` or
  ``cancelled``, from the data (pgq.finished_counts): the same after an exporter restart, not
  lowered by pgq.prune, exact under concurrent completions. A job retried after it failed and
  then done counts once as failed and once as done.
- ``pgq_oldest_ready_age_seconds{queue}``: how long the oldest due job has waited (0: none due).
- ``pgq_expired_leases{queue}``: running jobs past their lease (dead workers, nobody sweeping).
- ``pgq_queue_paused{queue}``: 1 while the queue is paused.
- ``pgq_jobs_held_back{queue,limit}``: due jobs a limit holds back now, for the queues with a
  limit (pgq.queue_limits): ``limit`` is ``max_running``, ``key_limit``, ``rate_limit`` or
  ``key_rate_limit`` (each counts what that limit alone holds back).
- ``pgq_health_findings{check,severity}``: pgq.health()'s findings per check and severity; every
  check reported gets all three severities (ok, warning, critical), 0 where none, so that an
  alert on ``severity="critical"`` sees a series before anything goes wrong.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import astuple
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.rows import tuple_row

from pgq_thin import queries
from pgq_thin.errors import PgqError
from pgq_thin.models import HealthFinding, QueueLimits, QueueMetrics

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

__all__ = ["INSTALL_HINT", "LIVE_STATES", "FINISHED_STATES", "QueueCollector", "exposition", "registry",
           "require_prometheus_client", "rows_of", "serve", "text_of"]

log = logging.getLogger("pgq_thin.metrics")

#: What to install when prometheus_client is missing.
INSTALL_HINT = "the metrics need prometheus_client: pip install 'pgq-thin[metrics]'"

#: The states of pgq_jobs (columns of pgq.metrics()), and of pgq_jobs_finished_total.
LIVE_STATES = ("pending", "scheduled", "running", "outcome_unknown", "waiting")
FINISHED_STATES = ("done", "failed", "cancelled")
SEVERITIES = ("ok", "warning", "critical")

METRICS_SQL = queries.METRICS  # the columns in QueueMetrics' order
HEALTH_SQL = queries.HEALTH_FINDINGS
#: The limits of pgq_jobs_held_back, in the order of LIMITS_SQL's columns.
LIMITS = ("max_running", "key_limit", "rate_limit", "key_rate_limit")
LIMITS_SQL = queries.LIMITS_HELD_BACK

#: The rows of one scrape: pgq.metrics(), the health findings, the limits (see ``read``).
Rows = tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], list[tuple[Any, ...]]]


def require_prometheus_client() -> None:
    """Raise PgqError with INSTALL_HINT when prometheus_client is not installed."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError as exc:
        raise PgqError(INSTALL_HINT) from exc


def read(conn: psycopg.Connection[Any]) -> Rows:
    """The rows of one scrape: pgq.metrics(), the health findings by (check, severity) and what
    the limits hold back per queue, read in one transaction (its own, or a savepoint of the
    caller's), as tuples whatever the connection's row factory."""
    with conn.transaction(), conn.cursor(row_factory=tuple_row) as cur:
        queues = cur.execute(METRICS_SQL).fetchall()
        findings = cur.execute(HEALTH_SQL).fetchall()
        limits = cur.execute(LIMITS_SQL).fetchall()
    return queues, findings, limits


def rows_of(queues: Sequence[QueueMetrics], findings: Sequence[HealthFinding], limits: Sequence[QueueLimits]) -> Rows:
    """The rows of one scrape from a client's answers (``metrics()``, ``health()``,
    ``queue_limits()``), as ``read`` gets them from its statements: for a reader that goes through
    a client, the dashboard's ``/metrics`` (three calls, not one transaction)."""
    counted = Counter((f.check, f.severity) for f in findings)
    return ([astuple(q) for q in queues], [(check, severity, n) for (check, severity), n in sorted(counted.items())],
            [(q.queue, q.held_by_max_running, q.held_by_key_limit, q.held_by_rate_limit, q.held_by_key_rate_limit)
             for q in limits])


class QueueCollector:
    """A prometheus_client collector of the queue metrics: each ``collect()`` reads them with
    ``source()``, which returns the rows of ``read()``."""

    def __init__(self, source: Callable[[], Rows]) -> None:
        self.source = source

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        queues, findings, limits = self.source()
        jobs = GaugeMetricFamily("pgq_jobs", "Jobs now, by queue and state (pending: due now; scheduled: due later).",
                                 labels=["queue", "state"])
        finished = CounterMetricFamily("pgq_jobs_finished", "Jobs that reached done, failed or cancelled, by "
                                       "queue and state (kept in the database: survives restarts and pruning).",
                                       labels=["queue", "state"])
        oldest = GaugeMetricFamily("pgq_oldest_ready_age_seconds", "How long the oldest due job of the queue "
                                   "has waited (0: none due).", labels=["queue"])
        expired = GaugeMetricFamily("pgq_expired_leases", "Running jobs past their lease, not yet recovered.",
                                    labels=["queue"])
        paused = GaugeMetricFamily("pgq_queue_paused", "1 while the queue is paused.", labels=["queue"])
        for (queue, is_paused, pending, scheduled, running, n_expired, unknown, age,
             done, failed, cancelled, waiting) in queues:
            for state, n in zip(LIVE_STATES, (pending, scheduled, running, unknown, waiting)):
                jobs.add_metric([queue, state], n)
            for state, n in zip(FINISHED_STATES, (done, failed, cancelled)):
                finished.add_metric([queue, state], n)
            oldest.add_metric([queue], age.total_seconds() if age is not None else 0.0)
            expired.add_metric([queue], n_expired)
            paused.add_metric([queue], 1 if is_paused else 0)
        health = GaugeMetricFamily("pgq_health_findings", "pgq.health() findings by check and severity.",
                                   labels=["check", "severity"])
        counts: dict[str, dict[str, int]] = {}
        for check, severity, n in findings:
            counts.setdefault(check, dict.fromkeys(SEVERITIES, 0))[severity] = n
        for check, by_severity in counts.items():
            for severity, n in by_severity.items():
                health.add_metric([check, severity], n)
        held = GaugeMetricFamily("pgq_jobs_held_back", "Due jobs a limit holds back now, by queue and limit "
                                 "(max_running, key_limit, rate_limit, key_rate_limit).", labels=["queue", "limit"])
        for row in limits:
            for limit, n in zip(LIMITS, row[1:]):
                held.add_metric([row[0], limit], n)
        yield from (jobs, finished, oldest, expired, paused, health, held)


def registry(source: Callable[[], Rows]) -> CollectorRegistry:
    """A registry of its own (not prometheus_client's global one) holding a QueueCollector."""
    require_prometheus_client()
    from prometheus_client import CollectorRegistry

    made = CollectorRegistry(auto_describe=False)
    made.register(QueueCollector(source))
    return made


def exposition(conn: psycopg.Connection[Any]) -> tuple[bytes, str]:
    """The Prometheus text exposition of the queue metrics, read through ``conn`` now, and its
    content type: what a ``GET /metrics`` answers. Database errors propagate (psycopg's);
    without prometheus_client, PgqError with INSTALL_HINT."""
    require_prometheus_client()  # before the statements: nothing is read for a scrape that cannot be answered
    return text_of(read(conn))


def text_of(rows: Rows) -> tuple[bytes, str]:
    """The Prometheus text exposition of one scrape's rows (``read``, ``rows_of``), and its content
    type; without prometheus_client, PgqError with INSTALL_HINT."""
    require_prometheus_client()
    from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

    return generate_latest(registry(lambda: rows)), CONTENT_TYPE_LATEST


class _Reader:
    """The exporter's connection: one, opened on first use and again after an error; scrapes
    (served by threads) take turns on it."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.conn: psycopg.Connection[Any] | None = None
        self.lock = threading.Lock()

    def __call__(self) -> Rows:
        with self.lock:
            try:
                if self.conn is None or self.conn.closed:
                    self.conn = psycopg.connect(self.dsn, autocommit=True, application_name="pgq-thin metrics",
                                                connect_timeout=5)
                return read(self.conn)
            except psycopg.Error:
                if self.conn is not None:
                    self.conn.close()
                    self.conn = None
                raise


def serve(dsn: str, port: int = 9187, host: str = "127.0.0.1", token: str | None = None) -> Callable[[], None]:
    """Start the exporter alone: an HTTP server (pgq_thin.exporter's, in a daemon thread) whose
    every scrape of ``/metrics`` reads the metrics from ``dsn``; with ``token`` a scrape needs
    ``Authorization: Bearer TOKEN``. A scrape the database does not answer gets an HTTP 500 and the
    error is logged. Returns a function that stops the server."""
    require_prometheus_client()
    from pgq_thin import exporter

    reader = _Reader(dsn)

    def source() -> Rows:
        try:
            return reader()
        except psycopg.Error as exc:
            log.warning("scrape failed: %s", str(exc).strip())
            raise

    server, thread = exporter.serve(registry(source), port, host, token)

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
        with reader.lock:
            if reader.conn is not None:
                reader.conn.close()

    return stop
