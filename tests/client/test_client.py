"""The Python client: each method calls its pgq function and returns a typed result."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from datetime import datetime, timedelta, timezone

import psycopg
import pytest

from pgq_thin import Client, InvalidArgument, Job, JobNotFound, QueueSettings, QueueStats, WrongState
from pgq_thin.client import bulk_calls, resolve_dsn
from pgq_thin.errors import PermissionDenied, PgqError, WaitTimeout
from pgq_thin.migrate import shipped_schema_version

from clientkit import clients, counting
from sqlhelpers import expire_lease, job


@pytest.fixture
def client(dsn: str):
    with Client(dsn) as c:
        yield c


def test_enqueue_claim_complete_round_trip_returns_typed_job(client: Client, conn: psycopg.Connection) -> None:
    job_id = client.enqueue("emails", "send", {"to": "a@example.com"}, priority=5, tenant="acme")
    [claimed] = client.claim("w1", ["emails"])
    assert isinstance(claimed, Job)
    assert (claimed.id, claimed.kind, claimed.payload, claimed.priority, claimed.attempt, claimed.tenant) == (
        job_id, "send", {"to": "a@example.com"}, 5, 1, "acme")
    assert client.complete(claimed.id, claimed.attempt, {"sent": True}) is True
    assert job(conn, job_id)["result"] == {"sent": True}
    assert job(conn, job_id)["state"] == "done"


def test_enqueue_joins_the_callers_transaction(client: Client, dsn: str, conn: psycopg.Connection) -> None:
    with psycopg.connect(dsn) as tx:
        job_id = client.enqueue("q", "k", {"n": 1}, conn=tx)
        tx.rollback()
    assert conn.execute("SELECT count(*) FROM pgq.jobs WHERE id = %s", (job_id,)).fetchone()[0] == 0
    with psycopg.connect(dsn) as tx:
        kept = client.enqueue("q", "k", {"n": 2}, conn=tx)
        tx.commit()
    assert job(conn, kept)["payload"] == {"n": 2}


def test_enqueue_many_returns_ids_in_payload_order(client: Client, conn: psycopg.Connection) -> None:
    ids = client.enqueue_many("q", "k", [{"n": i} for i in range(50)])
    assert len(ids) == 50
    assert [job(conn, i)["payload"]["n"] for i in ids] == list(range(50))


def test_enqueue_unique_key_returns_the_live_job(client: Client) -> None:
    first = client.enqueue("q", "k", unique_key="report-42")
    assert client.enqueue("q", "k", unique_key="report-42") == first


def test_enqueue_in_the_future_is_not_claimed_yet(client: Client) -> None:
    client.enqueue("q", "k", run_at=datetime.now(timezone.utc) + timedelta(hours=1))
    assert client.claim("w1", ["q"]) == []


def test_renew_fail_release_snooze_mark_unknown(client: Client, conn: psycopg.Connection) -> None:
    ids = client.enqueue_many("q", "k", [{}, {}, {}, {}])
    jobs = {j.id: j for j in client.claim("w1", ["q"], batch=4, lease=60)}
    a, b, c, d = (jobs[i] for i in ids)
    new_lease = client.renew(a.id, a.attempt, lease=timedelta(minutes=5))
    assert new_lease is not None and new_lease > a.lease_until
    assert client.fail(a.id, a.attempt, "boom", retry_in=30) == "pending"
    assert client.release(b.id, b.attempt) is True
    snoozed = client.snooze(c.id, c.attempt, 120)
    assert snoozed is not None and snoozed > datetime.now(timezone.utc) + timedelta(seconds=100)
    assert client.mark_unknown(d.id, d.attempt, "timeout after sending") is True
    assert job(conn, d.id)["state"] == "outcome_unknown"
    assert client.resolve(d.id, "done") is True
    assert job(conn, d.id)["state"] == "done"


def test_stale_owner_gets_not_yours_answers(client: Client, conn: psycopg.Connection) -> None:
    client.enqueue("q", "k")
    [old] = client.claim("w1", ["q"], lease=60)
    expire_lease(conn, old.id)
    [new] = client.claim("w2", ["q"])
    assert new.attempt == old.attempt + 1
    assert client.renew(old.id, old.attempt) is None
    assert client.complete(old.id, old.attempt) is False
    assert client.fail(old.id, old.attempt, "late") is None
    assert client.release(old.id, old.attempt) is False
    assert client.snooze(old.id, old.attempt, 10) is None
    assert client.mark_unknown(old.id, old.attempt, "late") is False
    assert client.complete_many([old.id], [old.attempt]) == []
    assert client.complete_many([new.id], [new.attempt]) == [new.id]


def test_complete_and_claim_returns_the_ids_completed_and_the_jobs_claimed(client: Client,
                                                                          conn: psycopg.Connection) -> None:
    ids = client.enqueue_many("q", "k", [{"n": i} for i in range(3)])
    first = client.claim("w1", ["q"], batch=2)
    got = client.complete_and_claim([j.id for j in first], [j.attempt for j in first], "w1", ["q"], batch=5)
    assert sorted(got.completed) == ids[:2] and [j.id for j in got.jobs] == ids[2:]
    assert got.jobs[0].payload == {"n": 2} and got.jobs[0].attempt == 1
    last = client.complete_and_claim([got.jobs[0].id], [got.jobs[0].attempt], "w1", ["q"])
    assert last.completed == [ids[2]] and last.jobs == []
    assert [job(conn, i)["state"] for i in ids] == ["done", "done", "done"]


def test_sweep_recovers_expired_leases(client: Client, conn: psycopg.Connection) -> None:
    client.enqueue("q", "k")
    [claimed] = client.claim("w1", ["q"])
    expire_lease(conn, claimed.id)
    assert client.sweep() == 1
    assert job(conn, claimed.id)["state"] == "pending"


def test_admin_calls(client: Client, conn: psycopg.Connection) -> None:
    job_id = client.enqueue("q", "k")
    assert client.cancel(job_id) is True
    assert client.cancel(job_id) is False
    assert client.retry(job_id) is True
    assert job(conn, job_id)["state"] == "pending"
    paused = client.pause("q")
    assert isinstance(paused, QueueSettings) and paused.paused
    assert client.claim("w1", ["q"]) == []
    assert client.resume("q").paused is False
    assert client.pause("q", kind="slow").paused_kinds == ["slow"]
    assert client.resume("q", kind="slow").paused_kinds is None
    with pytest.raises(InvalidArgument, match='"kind"'):
        client.pause("q", kind="not a name")
    settings = client.configure_queue("q", lease=timedelta(seconds=90), max_attempts=3, audit=False)
    assert (settings.lease, settings.max_attempts, settings.audit) == (timedelta(seconds=90), 3, False)
    settings = client.configure_queue("q", retention_failed=timedelta(days=30), retention_cancelled=0)
    assert (settings.retention_failed, settings.retention_cancelled) == (timedelta(days=30), timedelta(0))
    with pytest.raises(InvalidArgument, match="retention_failed"):
        client.configure_queue("q", retention_failed=timedelta(seconds=-1))
    [claimed] = client.claim("w1", ["q"])
    client.complete(claimed.id, claimed.attempt)
    conn.execute("UPDATE pgq.jobs SET finished_at = now() - interval '2 days' WHERE id = %s", (job_id,))
    assert client.prune(older_than=timedelta(days=1)) == 1
    assert client.version() == str(shipped_schema_version())


def test_stats_are_typed_per_queue(client: Client) -> None:
    client.enqueue_many("a", "k", [{}, {}])
    client.enqueue("b", "k", run_at=datetime.now(timezone.utc) + timedelta(hours=1))
    stats = {s.queue: s for s in client.stats()}
    assert isinstance(stats["a"], QueueStats)
    assert (stats["a"].pending, stats["a"].scheduled) == (2, 0)
    assert (stats["b"].pending, stats["b"].scheduled) == (0, 1)


def test_errors_keep_the_sqlstate_and_message(client: Client) -> None:
    with pytest.raises(InvalidArgument) as bad:
        client.enqueue("bad queue!", "k")
    assert bad.value.sqlstate == "22023" and "queue" in bad.value.message
    with pytest.raises(InvalidArgument) as null:
        client.fail(1, 1, None)  # type: ignore[arg-type]
    assert null.value.sqlstate == "22004"
    with pytest.raises(JobNotFound) as missing:
        client.cancel(123456)
    assert missing.value.sqlstate == "P0002"
    job_id = client.enqueue("q", "k")
    with pytest.raises(WrongState) as wrong:
        client.retry(job_id)
    assert wrong.value.sqlstate == "55000"


def test_permission_denied_maps_to_its_exception(dsn: str) -> None:
    from psycopg_pool import ConnectionPool

    with ConnectionPool(dsn, min_size=1, max_size=1, kwargs={"autocommit": True},
                        configure=lambda c: c.execute("SET ROLE pgq_producer"), open=True) as pool:
        client = Client(pool=pool)
        assert client.enqueue("q", "k") > 0
        with pytest.raises(PermissionDenied) as denied:
            client.claim("w1")
        assert denied.value.sqlstate == "42501"


def test_dsn_comes_from_the_environment(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGQ_DSN", raising=False)
    monkeypatch.setenv("DATABASE_URL", dsn)
    with Client() as client:
        assert client.version() == str(shipped_schema_version())
    # PGQ_DSN wins over DATABASE_URL.
    monkeypatch.setenv("PGQ_DSN", "postgresql://nobody@127.0.0.1:1/none")
    assert resolve_dsn() == "postgresql://nobody@127.0.0.1:1/none"


def test_get_job_and_job_history_for_operators(client: Client) -> None:
    job_id = client.enqueue("q", "k", {"n": 1})
    [claimed] = client.claim("w1", ["q"])
    client.complete(claimed.id, claimed.attempt, {"ok": 1})
    record = client.get_job(job_id)
    assert (record.state, record.attempt, record.result, record.last_event) == ("done", 1, {"ok": 1}, "completed")
    assert [(e.event, e.from_state, e.to_state) for e in client.job_history(job_id)] == [
        ("claimed", "pending", "running"), ("completed", "running", "done")]
    with pytest.raises(JobNotFound):
        client.get_job(987654)


def test_per_queue_grants_and_the_logins_of_a_job_from_python(client: Client, conn: psycopg.Connection) -> None:
    login = conn.execute("SELECT session_user").fetchone()[0]  # type: ignore[index]
    job_id = client.enqueue("payments", "charge", {"order": 7})
    [claimed] = client.claim("w1", ["payments"])
    client.complete(claimed.id, claimed.attempt)
    assert client.get_job(job_id).session_role == login
    assert [e.session_role for e in client.job_history(job_id)] == [login, login]
    assert client.grant_queue("payments", "pgq_worker", "claim") is True
    assert client.grant_queue("payments", "pgq_worker", "claim") is False
    [grant] = client.queue_grants("payments")
    assert (grant.queue, grant.privilege, grant.role, grant.granted_by) == ("payments", "claim", "pgq_worker", login)
    assert client.queue_grants() == [grant]
    with pytest.raises(InvalidArgument, match='argument "privilege"'):
        client.grant_queue("payments", "pgq_worker", "delete")
    assert client.revoke_queue("payments", "pgq_worker", "claim") is True
    assert client.queue_grants("payments") == []


def test_fair_mode_caps_and_health_from_python(client: Client) -> None:
    settings = client.configure_queue("f", fair=True, max_running=2)
    assert (settings.fair, settings.max_running) == (True, 2)
    tenant = client.set_tenant_weight("f", "acme", 3)
    assert (tenant.tenant, tenant.weight) == ("acme", 3)
    client.enqueue_many("f", "k", [{}] * 5, tenant="acme")
    assert len(client.claim("w1", ["f"], batch=5)) == 2
    checks = {f.check: f.severity for f in client.health()}
    assert checks["expired_leases"] == "ok" and checks["ready_age"] == "ok"


def test_per_key_concurrency_from_python(client: Client) -> None:
    settings = client.configure_queue("keyed", key_max_running=1)
    assert (settings.key_max_running, settings.key_limited) == (1, True)
    assert client.set_key_limit("keyed", "big", 2) == 2
    first = client.enqueue("keyed", "k", concurrency_key="small")
    client.enqueue("keyed", "k", concurrency_key="small")
    client.enqueue_many("keyed", "k", [{}] * 3, concurrency_key="big")
    assert client.get_job(first).concurrency_key == "small"
    assert len(client.claim("w1", ["keyed"], batch=10)) == 3  # small: 1, big: 2
    assert client.set_key_limit("keyed", "big", None) == 1
    with pytest.raises(InvalidArgument) as err:
        client.enqueue("keyed", "k", concurrency_key=5)  # type: ignore[arg-type]
    assert '"concurrency_key"' in str(err.value)
    with pytest.raises(InvalidArgument) as sql_err:
        client.set_key_limit("keyed", "", 1)
    assert sql_err.value.sqlstate == "22023" and '"key"' in str(sql_err.value)


def test_schedules_timeouts_and_progress_from_python(client: Client, conn: psycopg.Connection) -> None:
    from pgq_thin import Schedule

    s = client.schedule("nightly", "reports", "build", every=timedelta(hours=1), payload={"r": 1},
                        skip_if_running=True)
    assert isinstance(s, Schedule)
    assert (s.name, s.queue, s.kind, s.every, s.cron, s.payload, s.skip_if_running) == (
        "nightly", "reports", "build", timedelta(hours=1), None, {"r": 1}, True)
    assert s.next_run_at.minute == 0 and s.next_run_at.second == 0 and s.next_run_at > datetime.now(timezone.utc)
    assert [x.name for x in client.schedules()] == ["nightly"]
    # Fire it by moving next_run_at into the past (as superuser): the next sweep enqueues one job.
    conn.execute("UPDATE pgq.schedules SET next_run_at = next_run_at - interval '1 hour'")
    client.sweep()
    (fired,) = client.schedules()
    assert fired.last_job_id is not None and fired.next_run_at == s.next_run_at
    assert client.get_job(fired.last_job_id).schedule == "nightly"
    with pytest.raises(InvalidArgument) as info:
        client.schedule("bad", "q", "k", every=0.5)
    assert info.value.sqlstate == "22023" and 'argument "every"' in str(info.value)
    assert client.unschedule("nightly") is True and client.unschedule("nightly") is False

    settings = client.configure_queue("reports", max_run_time=timedelta(minutes=5))
    assert settings.max_run_time == timedelta(minutes=5)
    assert settings.next_schedule_at is None  # its one schedule was removed above
    other = client.enqueue("reports", "build", max_run_time=2)
    many = client.enqueue_many("reports", "build", [{}], max_run_time=timedelta(seconds=3))
    jobs = {j.id: j for j in client.claim("w", ["reports"], batch=3, lease=60)}
    assert set(jobs) == {fired.last_job_id, other, *many}
    assert jobs[other].deadline is not None
    assert (jobs[other].deadline - jobs[other].lease_until) == timedelta(0)
    assert jobs[fired.last_job_id].deadline - jobs[fired.last_job_id].lease_until == timedelta(minutes=4)
    assert client.get_job(other).max_run_time == timedelta(seconds=2)
    assert client.configure_queue("reports", max_run_time=0).max_run_time is None

    j = jobs[many[0]]
    assert j.progress is None
    assert client.progress(j.id, j.attempt, {"done": 10}) is True
    assert client.progress(j.id, j.attempt + 1, {"done": 11}) is False
    assert client.get_job(j.id).progress == {"done": 10}
    assert client.fail(j.id, j.attempt, "boom", retry_in=0.001) == "pending"
    conn.execute("UPDATE pgq.jobs SET run_at = now() - interval '1 second' WHERE id = %s", (j.id,))
    (again,) = client.claim("w", ["reports"])
    assert (again.id, again.attempt, again.progress) == (j.id, 2, {"done": 10})


def test_either_client_warns_once_when_the_schema_is_older_than_its_migrations(
        empty_dsn: str, client_kind: str, caplog: pytest.LogCaptureFixture) -> None:
    from yoyo import get_backend, read_migrations

    from pgq_thin.migrate import migrations_dir, yoyo_url

    backend = get_backend(yoyo_url(empty_dsn))
    try:  # the schema as it was before pgq.version() told the migration number
        backend.apply_migrations(read_migrations(str(migrations_dir())).filter(lambda m: m.id < "0005"))
    finally:
        backend.connection.close()
    with caplog.at_level(logging.WARNING, logger="pgq_thin"), clients(client_kind, empty_dsn) as client:
        assert client.version() == "0.1.0"
        client.stats()
        with clients(client_kind, empty_dsn) as other:
            other.stats()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [f"this database's pgq schema (version 0.1.0) is older than the migrations this "
                        f"pgq-thin ships (up to {shipped_schema_version()}): run `pgq-thin migrate`"]


def test_either_client_says_nothing_about_an_up_to_date_schema(
        dsn: str, client_kind: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="pgq_thin"), clients(client_kind, dsn) as client:
        client.stats()
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_a_wait_reads_at_most_once_a_poll_interval_for_notifications_whatever_is_notified(
        dsn: str, client_kind: str, conn: psycopg.Connection) -> None:
    """Any login may NOTIFY pgq_finished with a job's id: a flood of them costs a waiting client
    one read a poll interval, after the first notification's (it was one read per notification)."""
    job_id = int(conn.execute("SELECT pgq.enqueue('q', 'k', '{}', notify_finished => true)").fetchone()[0])
    reads: Counter[str] = Counter()
    waited = threading.Event()
    sent = [0]

    def flood() -> None:
        with psycopg.connect(dsn, autocommit=True) as forger:
            while not waited.is_set() and sent[0] < 200_000:  # bounded in time (the wait) and count
                forger.execute("SELECT pg_notify('pgq_finished', %s)", (str(job_id),))
                sent[0] += 1

    with clients(client_kind, dsn) as client:
        counting(client, reads, lambda query: "job_result" if "pgq.job_result" in query else None)
        forger = threading.Thread(target=flood, daemon=True)
        forger.start()
        try:
            with pytest.raises(WaitTimeout):
                client.wait(job_id, timeout=1.5, poll_interval=0.5)
        finally:
            waited.set()
            forger.join(timeout=10)
    assert sent[0] > 100  # a flood, not a trickle
    # The first read, the first notification's, then one a poll interval (0.5 s of 1.5 s) at most.
    assert 2 <= reads["job_result"] <= 1 + 1 + 3, reads


def test_a_bounded_call_on_a_row_another_transaction_holds_fails_within_its_lock_timeout(
        dsn: str, client_kind: str, conn: psycopg.Connection) -> None:
    """client.bounded(...): the call runs in a transaction of its own with SET LOCAL lock_timeout
    and statement_timeout (the worker's renewals and completions go this way): a row held by a
    transaction left open makes it fail with 55P03, not hang; the next call on the pool works."""
    job_id = int(conn.execute("SELECT pgq.enqueue('q', 'k', '{}')").fetchone()[0])
    with clients(client_kind, dsn, max_size=1) as client:
        [claimed] = client.claim("w", ["q"], lease=60)
        bounded = client.bounded(lock_timeout=0.3, statement_timeout=5)
        assert bounded.renew(job_id, claimed.attempt) is not None  # nothing holds it: as renew
        with psycopg.connect(dsn) as squatter:
            squatter.execute("SELECT 1 FROM pgq.jobs WHERE id = %s FOR UPDATE", (job_id,))
            started = time.monotonic()
            with pytest.raises(PgqError) as held:
                bounded.renew(job_id, claimed.attempt)
            assert held.value.sqlstate == "55P03" and time.monotonic() - started < 3
            squatter.rollback()
        assert client.stats()  # the pool's one connection is usable again
        assert client.queue_status(["q"])[0].known  # (and carries no bound: it was SET LOCAL)
        assert bounded.complete(job_id, claimed.attempt, {"ok": 1}) is True
    assert job(conn, job_id)["state"] == "done"


def test_bulk_calls_drive_the_one_plan_until_a_call_acts_on_none_or_the_cap_is_reached():
    """pgq_thin.client.bulk_calls (the CLI's retry/cancel by filter) follows calls.bulk_plan (the
    dashboard's): the rule of how many rows each call asks for, and when to stop, is written once."""
    asked: list[int] = []

    def acting(answers: list[int]):
        it = iter(answers)

        def act(rows: int) -> int:
            asked.append(rows)
            return next(it)
        return act

    assert list(bulk_calls(acting([1000, 400, 0]))) == [1000, 1400]  # a call that skipped some: go on
    assert asked == [1000, 1000, 1000]
    asked.clear()
    assert list(bulk_calls(acting([1000, 500]), most=1500)) == [1000, 1500]
    assert asked == [1000, 500]
    asked.clear()
    assert list(bulk_calls(acting([0]), per_call=7)) == [] and asked == [7]
