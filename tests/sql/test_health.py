"""pgq.health and pgq-thin doctor: each finding provoked for real."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import psycopg

from healthkit import findings
from sqlhelpers import claim, expire_lease, wait_for


def test_a_quiet_queue_is_healthy_and_doctor_exits_zero(dsn: str, conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.enqueue('q', 'k')")
    found = findings(conn)
    assert {sev for rows in found.values() for sev, _ in rows} == {"ok"}
    assert {"expired_leases", "ready_age", "outcome_unknown", "blocked_sessions", "oldest_snapshot",
            "dead_tuples", "index_size"} <= set(found)
    doctor = subprocess.run([sys.executable, "-m", "pgq_thin", "doctor", "--dsn", dsn],
                            capture_output=True, text=True, timeout=60)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert "pgq health: ok" in doctor.stdout


def test_an_expired_lease_nobody_recovered_is_reported(dsn: str, conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.enqueue('q', 'k')")
    [c] = claim(conn)
    conn.execute("UPDATE pgq.jobs SET lease_until = now() - interval '10 minutes' WHERE id = %s", (c["id"],))
    [(severity, detail)] = findings(conn)["expired_leases"]
    assert severity == "critical" and "1 running job(s) past their lease" in detail
    doctor = subprocess.run([sys.executable, "-m", "pgq_thin", "doctor", "--dsn", dsn],
                            capture_output=True, text=True, timeout=60)
    assert doctor.returncode == 2 and "[CRIT] expired_leases" in doctor.stdout
    expire_lease(conn, c["id"])
    assert findings(conn)["expired_leases"][0][0] == "warning"  # expired just now: not critical yet


def test_an_old_due_job_is_reported_per_queue(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.enqueue('slow', 'k', run_at => now() - interval '10 minutes')")
    conn.execute("SELECT pgq.enqueue('fast', 'k')")
    [(severity, detail)] = findings(conn)["ready_age"]
    assert severity == "critical" and detail.startswith("queue slow:")
    assert findings(conn, ready="15 minutes")["ready_age"][0][0] == "warning"
    assert findings(conn, ready="30 minutes")["ready_age"][0][0] == "ok"


def test_outcome_unknown_jobs_are_reported(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.enqueue('q', 'k')")
    [c] = claim(conn)
    conn.execute("SELECT pgq.mark_unknown(%s, %s, 'timeout')", (c["id"], c["attempt"]))
    [(severity, detail)] = findings(conn)["outcome_unknown"]
    assert severity == "warning" and "1 job(s) in outcome_unknown" in detail


def test_a_held_snapshot_is_reported(dsn: str, conn: psycopg.Connection) -> None:
    with psycopg.connect(dsn) as holder:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM pgq.jobs")  # takes the snapshot, then sits idle
        holder_pid = holder.info.backend_pid
        # Reported once the snapshot is older than the threshold (waited for, not slept for).
        wait_for(lambda: any(sev == "critical" and f"pid {holder_pid} " in d
                             for sev, d in findings(conn, snapshot="1 second").get("idle_in_transaction", [])),
                 "the held snapshot to be reported")
        holder.rollback()
    assert findings(conn, snapshot="1 second")["oldest_snapshot"][0][0] == "ok"


def test_a_blocked_session_is_reported(dsn: str, conn: psycopg.Connection) -> None:
    job_id = conn.execute("SELECT pgq.enqueue('q', 'k')").fetchone()[0]
    with psycopg.connect(dsn) as locker, psycopg.connect(dsn, autocommit=True) as waiter:
        locker.execute("SELECT 1 FROM pgq.jobs WHERE id = %s FOR UPDATE", (job_id,))
        blocked = threading.Thread(target=lambda: waiter.execute("SELECT pgq.cancel(%s)", (job_id,)))
        blocked.start()
        deadline = time.monotonic() + 10
        rows: list[tuple[str, str]] = []
        while time.monotonic() < deadline:
            rows = findings(conn)["blocked_sessions"]
            if rows[0][0] != "ok":
                break
            time.sleep(0.05)
        assert rows[0][0] == "warning" and f"pid {waiter.info.backend_pid} has waited" in rows[0][1], rows
        assert f"for pid(s) {locker.info.backend_pid}" in rows[0][1]
        locker.rollback()
        blocked.join(timeout=10)
    assert findings(conn)["blocked_sessions"][0][0] == "ok"
