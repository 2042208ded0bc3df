"""pgq-thin demo: the tour. A throwaway PostgreSQL (unless --dsn), the migrations, a few thousand
jobs, several worker processes with a progress bar; one worker is killed mid-job (its job is
recovered after its lease, with a new attempt) and another is frozen mid-job until its lease has
expired and the job was finished by someone else (its late write is rejected by the fence)."""

from __future__ import annotations

import random
import shutil
import signal
import sys
import tempfile
import time
from datetime import timedelta
from typing import Any

from pgq_thin.client import Client
from pgq_thin.migrate import migrate
from pgq_thin.testing import server as embedded
from pgq_tools.fleet import Fleet, worker_command

QUEUE = "demo"
LEASE = timedelta(seconds=3)
#: What a run on a database of the user's own (--dsn) leaves there, said before and after it.
LEFT_BEHIND = (f"It leaves in that database pgq's schema (pgq-thin migrate's, with its roles pgq_admin, "
               f"pgq_worker, pgq_producer and pgq_monitor) and queue {QUEUE!r}: its settings (a "
               f"{LEASE.total_seconds():g}s lease) and its jobs with their history; pgq-thin prune removes finished "
               f"jobs older than the queue's retention, then SELECT pgq.drop_queue('{QUEUE}') removes the queue.")


def say(text: str) -> None:
    print(text, flush=True)


class Progress:
    """A one-line progress bar on stderr (a line per 10% when stderr is not a terminal)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.tty = sys.stderr.isatty()
        self.shown = -1
        self.started = time.monotonic()

    def update(self, done: int) -> None:
        pct = done * 100 // max(self.total, 1)
        rate = done / max(time.monotonic() - self.started, 1e-9)
        if self.tty:
            bar = "#" * (pct // 4) + "." * (25 - pct // 4)
            sys.stderr.write(f"\r  [{bar}] {done}/{self.total} done  {rate:,.0f} jobs/s ")
            sys.stderr.flush()
        elif pct // 10 != self.shown // 10:
            sys.stderr.write(f"  {done}/{self.total} done ({pct}%)\n")
            sys.stderr.flush()
        self.shown = pct

    def end(self) -> None:
        if self.tty:
            sys.stderr.write("\n")


def _row(client: Client, sql: str, params: tuple[Any, ...] = ()) -> Any:
    with client.pool.connection() as conn:
        return conn.execute(sql, params).fetchone()


def _history(client: Client, job_id: int) -> list[str]:
    with client.pool.connection() as conn:
        rows = conn.execute(
            "SELECT event, attempt, coalesce(worker, '-'), coalesce(note, '') FROM pgq.job_events"
            " WHERE job_id = %s ORDER BY id", (job_id,)).fetchall()
    return [f"      {event:<14} attempt {attempt}  {worker:<14} {note}" for event, attempt, worker, note in rows]


def run_demo(dsn: str | None = None, jobs: int = 3000, workers: int = 3, concurrency: int = 4) -> int:
    if workers < 2:
        say("pgq-thin: error: the demo needs at least 2 workers (one is killed)")
        return 2
    server = None
    fleet = None
    log_dir: str | None = None
    keep_logs = False  # a failed run keeps the workers' logs, and says where
    try:
        if dsn is None:
            say("1. Starting a throwaway PostgreSQL (removed at the end)...")
            server = embedded.start()
            dsn = server.url()
        else:
            say(f"1. Using the database you gave (--dsn); the demo's jobs go to queue {QUEUE!r}. {LEFT_BEHIND}")
        applied = migrate(dsn)
        say(f"2. Migrations: {', '.join(applied) if applied else 'already up to date'}.")

        with Client(dsn, max_size=2) as client:
            client.configure_queue(QUEUE, lease=LEASE, backoff_base=0.2, backoff_cap=1.0)
            crash_id = client.enqueue(QUEUE, "demo.slow", {"seconds": 30}, priority=10)
            ids = client.enqueue_many(QUEUE, "demo.work",
                                      [{"n": i, "ms": random.randint(1, 8)} for i in range(jobs)])
            first, last = ids[0], ids[-1]
            say(f"3. Enqueued {jobs} short jobs (ids {first}..{last}) and job {crash_id}, a slow one (30 s, "
                f"claimed first): its worker will be killed while it runs. Every claim holds a job for a "
                f"lease of {LEASE.total_seconds():g}s, renewed while its worker is alive.")

            log_dir = tempfile.mkdtemp(prefix="pgq-demo-")
            fleet = Fleet(log_dir)
            started = time.monotonic()
            for i in range(1, workers + 1):
                name = f"demo-worker-{i}"
                fleet.start(name, worker_command("pgq_tools.demo_app:worker", dsn, queues=[QUEUE],
                                                 concurrency=concurrency), env={"PGQ_DEMO_WORKER": name})
            say(f"4. Started {workers} worker processes x {concurrency} slots (their logs in {log_dir}, "
                "removed at the end).")

            progress = Progress(jobs)
            freeze_id = None
            frozen: str | None = None
            killed: str | None = None
            step = "kill"
            deadline = time.monotonic() + 180
            notes: list[str] = []
            while time.monotonic() < deadline:
                done = _row(client, "SELECT count(*) FROM pgq.jobs WHERE id BETWEEN %s AND %s AND state = 'done'",
                            (first, last))[0]
                progress.update(done)
                if step == "kill":
                    row = _row(client, "SELECT claimed_by, attempt FROM pgq.jobs WHERE id = %s AND state = 'running'",
                               (crash_id,))
                    if row:
                        time.sleep(0.3)  # let it get properly under way
                        killed = row[0]
                        fleet[killed].signal(signal.SIGKILL)
                        pid = fleet[killed].pid
                        notes.append(f"   killed {killed} (pid {pid}, kill -9) while it ran job {crash_id}, "
                                     f"attempt {row[1]}")
                        step = "killed"
                elif step == "killed":
                    # A claim the killed worker sent just before it died may still commit: wait
                    # until its server sessions are gone, so that it cannot take the next job.
                    if not _row(client, "SELECT count(*) FROM pg_stat_activity WHERE application_name"
                                        " IN (%s, %s)", (f"pgq-worker {killed}", f"pgq-listen {killed}"))[0]:
                        freeze_id = client.enqueue(QUEUE, "demo.slow", {"seconds": 4}, priority=10)
                        notes.append(f"   enqueued job {freeze_id}, a slow one (4 s, claimed next): its worker "
                                     "will be frozen while it runs")
                        step = "freeze"
                elif step == "freeze":
                    row = _row(client, "SELECT claimed_by, attempt FROM pgq.jobs WHERE id = %s AND state = 'running'",
                               (freeze_id,))
                    if row and row[0] != killed:
                        time.sleep(0.3)
                        frozen = row[0]
                        fleet[frozen].freeze()
                        pid = fleet[frozen].pid
                        notes.append(f"   froze {frozen} (pid {pid}, SIGSTOP) while it ran job {freeze_id}, "
                                     f"attempt {row[1]}")
                        step = "thaw"
                elif step == "thaw":
                    row = _row(client, "SELECT state::text, attempt, claimed_by FROM pgq.jobs WHERE id = %s",
                               (freeze_id,))
                    if row[0] == "done":
                        assert frozen is not None
                        fleet[frozen].thaw()
                        notes.append(f"   job {freeze_id} was recovered and finished by {row[2]} (attempt {row[1]}); "
                                     f"thawed {frozen}")
                        step = "rejected"
                elif step == "rejected":
                    if _row(client, "SELECT count(*) FROM pgq.job_events WHERE job_id = %s AND event = 'rejected'",
                            (freeze_id,))[0]:
                        step = "finish"
                if step == "finish" and done == jobs and _row(
                        client, "SELECT state = 'done' FROM pgq.jobs WHERE id = %s", (crash_id,))[0]:
                    break
                time.sleep(0.1)
            progress.end()
            elapsed = time.monotonic() - started
            fleet.stop()
            say("5. What happened:")
            for line in notes:
                say(line)

            crash = _row(client, "SELECT state::text, attempt, claimed_by FROM pgq.jobs WHERE id = %s", (crash_id,))
            say(f"   job {crash_id} (its worker was killed): {crash[0]} at attempt {crash[1]} by {crash[2]}; history:")
            for line in _history(client, crash_id):
                say(line)
            if freeze_id is not None:
                say(f"   job {freeze_id} (its worker was frozen past its lease); history:")
                for line in _history(client, freeze_id):
                    say(line)

            done, attempts, retried = _row(
                client, "SELECT count(*) FILTER (WHERE state = 'done'), coalesce(sum(attempt), 0),"
                        " count(*) FILTER (WHERE attempt > 1) FROM pgq.jobs WHERE id BETWEEN %s AND %s",
                (first, last))
            rejected = _row(client, "SELECT count(*) FROM pgq.job_events AS e JOIN pgq.jobs AS j ON j.id = e.job_id"
                                    " WHERE j.queue = %s AND e.event = 'rejected'", (QUEUE,))[0]
            say("6. Summary:")
            say(f"   jobs done        {done}/{jobs} (+ the slow job: {crash[0]})")
            say(f"   attempts         {attempts} for the {jobs} short jobs: {retried} needed more than one. Each "
                "claim is an attempt; the jobs the killed or frozen worker held (running, or claimed and "
                "waiting for a slot) were claimed again after their lease")
            say(f"   stale writes     {rejected} rejected by the fence")
            say(f"   elapsed          {elapsed:.1f}s, {jobs / elapsed:,.0f} jobs/s")
            ok = (done == jobs and crash[0] == "done" and crash[1] >= 2 and rejected >= 1 and step == "finish")
            say("   result           OK: every job done, the crash recovered, the stale write rejected" if ok
                else f"   result           FAILED (stopped at step {step!r}); the workers' logs are kept in "
                     f"{log_dir}")
            keep_logs = not ok
            return 0 if ok else 1
    finally:
        if fleet is not None:
            fleet.stop()
        if log_dir is not None and not keep_logs:
            shutil.rmtree(log_dir, ignore_errors=True)
        if server is not None:
            server.stop()
            say("7. Stopped the throwaway PostgreSQL.")
        elif dsn is not None:
            say(f"7. {LEFT_BEHIND}")
