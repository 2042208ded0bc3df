"""pgq's function source: every pgq function, trigger function and function grant, written once in
``sql/functions/<concern>.sql`` as ``CREATE OR REPLACE``, and installed whole by every apply.

pgq's SQL has two parts. The versioned part (tables, types, columns, indexes, constraints, data, the
DROP of a function whose signature changed) is the yoyo migrations in ``migrations/``, each applied
once, in order. The function source is not versioned: every apply (``pgq_thin.migrate``, yoyo's
post-apply hook) runs all of it after the versioned migrations, in one transaction, so a function's
history is its file's ``git log`` and a change to it is an edit of that file. What the source does
not define any more is dropped by its last file (``cleanup.sql``), in the same transaction.

``sql/all_functions.sql`` (for psql, Flyway, sqitch, golang-migrate...) and ``sql/schema.sql`` (a
fresh install in one file) are generated from the migrations and this source by
``scripts/build_sql.py``; a test fails when either is stale.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg

__all__ = ["SOURCE_FILES", "function_source", "install_functions", "source_dir"]

#: The files of ``sql/functions/``, in the order they are applied. The order matters only to a
#: fresh install (``sql/schema.sql``): a function written in SQL (not PL/pgSQL) is checked when it
#: is created, so what it calls comes before it. The cleanup comes after every function and before
#: the grants, which write every function's catalog row (and so would make them all look defined).
SOURCE_FILES = (
    "checks.sql",        # argument checks: pgq._bad_argument, pgq._check_*
    "support.sql",       # the clock, notifications, backoff, attempt room, pgq.version
    "queues.sql",        # queue rows and settings: configure_queue, pause, resume, drop_queue
    "access.sql",        # who may act: the login binding, per-queue grants
    "fence.sql",         # the failover fence: timelines
    "counters.sql",      # the finished counters, folded
    "dependencies.sql",  # waiting jobs and their release or cancellation
    "batches.sql",       # batches: member counts and the one callback
    "ended.sql",         # the end of a job: the trigger that sets off all of the above
    "rates.sql",         # rate limits (GCRA buckets)
    "keys.sql",          # per-key concurrency limits
    "fairness.sql",      # fair queues: tenants by virtual time
    "enqueue.sql",       # pgq.enqueue, pgq.enqueue_many
    "claim.sql",         # pgq.claim
    "owner.sql",         # the fenced owner operations: renew, complete, fail, release, snooze, ...
    "recovery.sql",      # expired leases: pgq.sweep
    "cron.sql",          # cron expressions: pgq.cron_next
    "schedules.sql",     # periodic jobs
    "admin.sql",         # cancel, retry, resolve, prune
    "archive.sql",       # finished jobs of queues with archive on: moved, partitioned by day, dropped
    "edits.sql",         # a queued job edited: update_job
    "registry.sql",      # the live workers: worker_heartbeat, workers, queue_kinds
    "observe.sql",       # stats, metrics, jobs and their history
    "health.sql",        # pgq.health
    "steps.sql",         # durable execution: steps, the durable sleep
    "signals.sql",       # signals and the jobs that wait for them
    "workflows.sql",     # children, awaited; workflows; lifetimes
    "cleanup.sql",       # drops what the source no longer defines
    "grants.sql",        # which pgq role may call which function
)


def source_dir() -> Path:
    """Where the function source is: in the installed package, or in the source checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "_sql" / "functions", here.parent / "sql" / "functions"):
        if (candidate / SOURCE_FILES[0]).is_file():
            return candidate
    raise FileNotFoundError("pgq's function source (sql/functions) is missing from this installation")


def function_source() -> str:
    """The whole function source as one script: what every apply runs, in one transaction."""
    directory = source_dir()
    parts = []
    for name in SOURCE_FILES:
        text = (directory / name).read_text()
        parts.append(f"-- sql/functions/{name} " + "-" * max(0, 86 - len(name)) + "\n\n" + text.strip("\n") + "\n")
    return "\n".join(parts)


def install_functions(conn: psycopg.Connection[Any]) -> None:
    """Run the function source on ``conn`` in its current transaction (the caller commits)."""
    conn.execute(function_source())
