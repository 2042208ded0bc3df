"""Upgrades proven on live databases: a database built at each landed schema version (every
migration point, with the functions as that migration wrote them) and filled with what that
version can hold (jobs in every state, running jobs with live leases, failed and outcome_unknown
jobs, and where the version has them schedules, timeouts, progress, restricted queues with grants,
meta, key-limited and rate-limited queues, jobs waiting on dependencies) is migrated to the newest
by pgq_thin.migrate. Every job keeps its state, attempt, payload, lease and history; a running
attempt's owner completes it (its login since 0008; any login for a job claimed before, whose
session_role is NULL); waiting jobs are released by their dependencies; a schedule fires once per
occurrence; the limits still hold; the finished counters equal the rows; every job can still be
finished; and the catalog equals a fresh install's."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row

from pgq_thin import migrate
from pgq_tools.bench import _migrate_to  # the migrations up to one, with their own functions

from catalogkit import MIGRATION_SHA256, MIGRATIONS, assert_same_catalog, catalog
from sqlhelpers import LOWER_LEASE_FLOOR, fresh_database, one, wait_for

#: The migrations that landed before the function source: each a schema version users' databases
#: may be at.
LANDED = [name.removesuffix(".sql") for name in sorted(MIGRATION_SHA256) if int(name[:4]) <= 13]
#: Releases of the function-source era (migration 0014 on): the schema version users' databases are
#: at, and the commit of main whose migrations and function source built it (git history: CI clones).
RELEASED = {"0016_per_key_claims": "95c7c4dd5363b0eee753141d4fa2d7f6e825bed7",
            "0017_workflows": "8110847e7fee28baf8cf6e8d076bab1398593922"}
OWNER, OTHER = "upgrade_worker_a", "upgrade_worker_b"  # two worker logins (cluster-wide roles)


def _number(version: str) -> int:
    return int(version[:4])


def _login(dsn: str, role: str) -> psycopg.Connection[Any]:
    return psycopg.connect(make_conninfo(dsn, user=role), autocommit=True)


def _claim(conn: psycopg.Connection[Any], queue: str, lease: str = "1 hour") -> tuple[int, int]:
    row = conn.execute("SELECT id, attempt FROM pgq.claim('upgrade-test', ARRAY[%s], 1, %s::interval)",
                       (queue, lease)).fetchone()
    assert row is not None, f"nothing to claim in {queue}"
    return row[0], row[1]


def fill(dsn: str, version: str) -> dict[str, Any]:
    """Jobs in every state the schema at ``version`` knows, made through that version's own API;
    returns the ids (and attempts) of the ones the checks act on after the upgrade."""
    n = _number(version)
    made: dict[str, Any] = {}
    with psycopg.connect(dsn, autocommit=True) as su:
        for role in (OWNER, OTHER):
            if one(su, "SELECT count(*) FROM pg_roles WHERE rolname = %s", (role,)) == 0:
                su.execute(f"CREATE ROLE {role} LOGIN")
            su.execute(f"GRANT pgq_worker TO {role}")
        # One queue with a job in each state.
        su.execute("SELECT pgq.configure_queue('q', max_attempts => 3)")
        made["pending"] = one(su, "SELECT pgq.enqueue('q', 'k', '{\"n\": 1}')")
        made["scheduled"] = one(su, "SELECT pgq.enqueue('q', 'k', '{\"n\": 2}', run_at => now() + interval '1 day')")
        made["unique"] = one(su, "SELECT pgq.enqueue('q', 'k', '{\"n\": 3}', unique_key => 'u-1', "
                                 "run_at => now() + interval '2 days')")
        for state in ("done", "failed", "cancelled", "outcome_unknown", "stale"):
            made[state] = one(su, "SELECT pgq.enqueue('q', 'k', jsonb_build_object('state', %s::text), priority => 10)",
                              (state,))
            job_id, attempt = _claim(su, "q")
            assert job_id == made[state]
            if state == "done":
                assert one(su, "SELECT pgq.complete(%s, %s, '{\"ok\": true}')", (job_id, attempt)) is True
            elif state == "failed":
                assert one(su, "SELECT pgq.fail(%s, %s, 'boom', retryable => false)", (job_id, attempt)) == "failed"
            elif state == "cancelled":
                assert one(su, "SELECT pgq.cancel(%s)", (job_id,)) is True
            elif state == "outcome_unknown":
                assert one(su, "SELECT pgq.mark_unknown(%s, %s, 'the mail may have gone')", (job_id, attempt)) is True
            else:  # a lease that expired: recovered by the next claim as attempt 2, attempt 1 rejected
                su.execute("UPDATE pgq.jobs SET lease_until = now() - interval '1 second' WHERE id = %s", (job_id,))
                su.execute(LOWER_LEASE_FLOOR)
                again = _claim(su, "q")
                assert again == (job_id, 2)
                assert one(su, "SELECT pgq.complete(%s, 1)", (job_id,)) is False
                assert one(su, "SELECT pgq.complete(%s, 2)", (job_id,)) is True
        # A fair queue, and a running job with a live lease, claimed by a worker login.
        su.execute("SELECT pgq.configure_queue('fair', fair => true)")
        made["fair"] = one(su, "SELECT pgq.enqueue('fair', 'k', '{}', tenant => 'acme')")
        made["running"] = one(su, "SELECT pgq.enqueue('run', 'k', '{\"long\": true}')")
        with _login(dsn, OWNER) as owner:
            made["running_attempt"] = _claim(owner, "run")[1]
            if n >= 4:
                assert one(owner, "SELECT pgq.progress(%s, %s, '{\"step\": 7}')",
                           (made["running"], made["running_attempt"])) is True
        if n >= 4:
            su.execute("SELECT pgq.schedule('hourly', 'sched', 'tick', every => '1 hour')")
            made["timed"] = one(su, "SELECT pgq.enqueue('q', 'k', '{}', max_run_time => '10 minutes', "
                                    "run_at => now() + interval '3 days')")
        if n >= 8:
            if one(su, "SELECT count(*) FROM pg_roles WHERE rolname = 'upgrade_trusted'") == 0:
                su.execute("CREATE ROLE upgrade_trusted NOLOGIN")
            su.execute("SELECT pgq.configure_queue('secret')")
            su.execute("SELECT pgq.grant_queue('secret', 'upgrade_trusted', 'claim')")
            made["secret"] = one(su, "SELECT pgq.enqueue('secret', 'k', '{}')")
        if n >= 10:
            made["meta"] = one(su, "SELECT pgq.enqueue('q', 'k', '{}', meta => '{\"trace\": \"abc\"}', "
                                   "run_at => now() + interval '4 days')")
        if n >= 11:
            su.execute("SELECT pgq.configure_queue('keyed', key_max_running => 1)")
            made["keyed"] = [one(su, "SELECT pgq.enqueue('keyed', 'k', '{}', concurrency_key => 'a')")
                             for _ in range(2)]
            made["keyed_attempt"] = _claim(su, "keyed")[1]
            su.execute("SELECT pgq.configure_queue('rated', rate_limit => 1, rate_period => '1 hour')")
            made["rated"] = [one(su, "SELECT pgq.enqueue('rated', 'k', '{}')") for _ in range(2)]
            made["rated_attempt"] = _claim(su, "rated")[1]
        if n >= 13:
            made["dependency"] = one(su, "SELECT pgq.enqueue('deps', 'k', '{}')")
            made["waiting"] = one(su, "SELECT pgq.enqueue('deps', 'after', '{}', depends_on => ARRAY[%s]::bigint[])",
                                  (made["dependency"],))
            assert one(su, "SELECT state::text FROM pgq.jobs WHERE id = %s", (made["waiting"],)) == "waiting"
    return made


def snapshot(dsn: str) -> dict[str, list[dict[str, Any]]]:
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        tables = {"jobs": "id", "job_events": "id", "queues": "name", "tenants": "queue, tenant"}
        if conn.execute("SELECT to_regclass('pgq.schedules') IS NOT NULL AS x").fetchone()["x"]:  # type: ignore[index]
            tables["schedules"] = "name"
        if conn.execute("SELECT to_regclass('pgq.grants') IS NOT NULL AS x").fetchone()["x"]:  # type: ignore[index]
            tables["grants"] = "queue, privilege, role"
        return {t: conn.execute(f"SELECT * FROM pgq.{t} ORDER BY {order}").fetchall() for t, order in tables.items()}


def assert_kept(before: dict[str, list[dict[str, Any]]], after: dict[str, list[dict[str, Any]]]) -> None:
    """Every row of before is in after, every column it had with the value it had."""
    for table, rows in before.items():
        later = after[table]
        assert len(later) >= len(rows), table
        for old, new in zip(rows, later):
            assert {k: new[k] for k in old} == old, f"pgq.{table} changed by the upgrade"


@pytest.fixture(scope="module")
def fresh_catalog(databases, template_db) -> dict[str, list[tuple]]:
    return catalog(databases.dsn_for(template_db))


@pytest.fixture
def upgraded(databases) -> Iterator[str]:
    """An empty database, to build at a landed version."""
    yield from fresh_database(databases, "template1")


@pytest.mark.slow
@pytest.mark.parametrize("version", LANDED + list(RELEASED))
def test_a_database_at_each_landed_version_holding_jobs_upgrades_without_stranding_one(
        version, upgraded, fresh_catalog):
    dsn = upgraded
    n = _number(version)
    _migrate_to(dsn, f"git:{RELEASED[version]}" if version in RELEASED else version)
    made = fill(dsn, version)
    before = snapshot(dsn)

    migrate(dsn)

    after = snapshot(dsn)
    assert_kept(before, after)
    assert_same_catalog(fresh_catalog, catalog(dsn))
    with psycopg.connect(dsn, autocommit=True) as su:
        assert one(su, "SELECT pgq.version()") == str(max(_number(m) for m in MIGRATION_SHA256))
        # The running attempt's owner completes it: the fence holds, and so does the login rule.
        running, attempt = made["running"], made["running_attempt"]
        with _login(dsn, OTHER) as other, _login(dsn, OWNER) as owner:
            assert one(other, "SELECT pgq.renew(%s, %s)", (running, attempt + 1)) is None  # a stale attempt
            if n < 8:  # claimed before logins were bound: session_role is NULL and admits any login
                assert one(su, "SELECT session_role FROM pgq.jobs WHERE id = %s", (running,)) is None
                assert one(other, "SELECT pgq.complete(%s, %s)", (running, attempt)) is True
            else:
                assert one(other, "SELECT pgq.complete(%s, %s)", (running, attempt)) is False
                assert one(owner, "SELECT pgq.complete(%s, %s)", (running, attempt)) is True
        assert one(su, "SELECT state::text FROM pgq.jobs WHERE id = %s", (running,)) == "done"
        if n >= 4:  # the checkpoint is handed to the next attempt, and the schedule fires once per occurrence
            assert one(su, "SELECT progress FROM pgq.jobs WHERE id = %s", (running,)) == {"step": 7}
            su.execute("UPDATE pgq.schedules SET next_run_at = now() - interval '1 minute' WHERE name = 'hourly'")
            su.execute("UPDATE pgq.queues SET next_schedule_at = now() - interval '1 minute' WHERE name = 'sched'")
            su.execute("SELECT pgq.sweep()")
            su.execute("SELECT pgq.sweep()")
            assert one(su, "SELECT count(*) FROM pgq.jobs WHERE schedule = 'hourly'") == 1
        if n >= 8:  # the restricted queue still admits only its grantees
            with _login(dsn, OWNER) as owner:
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    owner.execute("SELECT * FROM pgq.claim('w', ARRAY['secret'])")
        if n >= 11:  # the key's running job still holds its only slot; the spent token stays spent
            assert su.execute("SELECT * FROM pgq.claim('w', ARRAY['keyed'])").fetchall() == []
            assert su.execute("SELECT * FROM pgq.claim('w', ARRAY['rated'])").fetchall() == []
            assert one(su, "SELECT pgq.complete(%s, %s)", (made["keyed"][0], made["keyed_attempt"])) is True
            second = _claim(su, "keyed")
            assert second[0] == made["keyed"][1]
            assert one(su, "SELECT pgq.complete(%s, %s)", second) is True
            assert one(su, "SELECT pgq.complete(%s, %s)", (made["rated"][0], made["rated_attempt"])) is True
        if n >= 13:  # the waiting job is released by its dependency's completion
            job_id, job_attempt = _claim(su, "deps")
            assert job_id == made["dependency"]
            assert one(su, "SELECT pgq.complete(%s, %s)", (job_id, job_attempt)) is True
            assert one(su, "SELECT state::text FROM pgq.jobs WHERE id = %s", (made["waiting"],)) == "pending"
        if n >= 13:  # 0017 kept the links the jobs were enqueued with: pgq.job_links shows them
            assert su.execute("SELECT relation, job_id FROM pgq.job_links(%s)", (made["waiting"],)).fetchall() \
                == [("dependency", made["dependency"])]
            assert su.execute("SELECT relation, job_id FROM pgq.job_links(%s)", (made["dependency"],)).fetchall() \
                == [("dependant", made["waiting"])]
        # Jobs from before 0017 have no enqueuer on record (an admin still reads their results);
        # a batch of the old queues' jobs calls back once.
        if n < 17:
            assert one(su, "SELECT count(*) FROM pgq.jobs WHERE id = ANY (%s) AND enqueued_by IS NOT NULL",
                       ([r["id"] for r in before["jobs"]],)) == 0
        assert one(su, "SELECT state FROM pgq.job_result(%s)", (made["done"],)) == "done"
        batch = one(su, "SELECT pgq.batch_open('q', 'batch_done')")
        member = one(su, "SELECT pgq.enqueue('run', 'k', '{}', batch => %s)", (batch,))
        assert one(su, "SELECT pgq.batch_close(%s)", (batch,)) is True
        assert one(su, "SELECT pgq.cancel(%s)", (member,)) is True
        assert one(su, "SELECT count(*) FROM pgq.jobs WHERE kind = 'batch_done'") == 1
        # The finished counters equal the rows.
        counted = {r[0]: r[1:] for r in su.execute(
            "SELECT queue, done_total, failed_total, cancelled_total FROM pgq.metrics()").fetchall()}
        rows = {r[0]: r[1:] for r in su.execute(
            "SELECT queue, count(*) FILTER (WHERE state = 'done'), count(*) FILTER (WHERE state = 'failed'), "
            "count(*) FILTER (WHERE state = 'cancelled') FROM pgq.jobs GROUP BY queue").fetchall()}
        assert {q: counted[q] for q in rows} == rows
        # 0018's tools on the jobs from before: the old keyed job is replaced in place, the failed
        # one retried by filter.
        assert one(su, "SELECT pgq.enqueue('q', 'k', '{\"n\": 30}', unique_key => 'u-1', on_conflict => 'replace')") \
            == made["unique"]
        assert one(su, "SELECT payload FROM pgq.jobs WHERE id = %s", (made["unique"],)) == {"n": 30}
        assert one(su, "SELECT pgq.retry_jobs('q', 'failed', limit_rows => 10000)") >= 1
        assert one(su, "SELECT state::text FROM pgq.jobs WHERE id = %s", (made["failed"],)) == "pending"
        # Every job can still be finished: the rest of them, due now, run to their ends.
        su.execute("UPDATE pgq.jobs SET run_at = now() WHERE state = 'pending'")
        su.execute("SELECT pgq.resolve(%s, 'done')", (made["outcome_unknown"],))
        su.execute("SELECT pgq.configure_queue(name, max_running => 0, key_max_running => 0, rate_limit => 0) "
                   "FROM pgq.queues")
        while rows := su.execute("SELECT id, attempt FROM pgq.claim('drain', batch => 100)").fetchall():
            for job_id, job_attempt in rows:
                assert one(su, "SELECT pgq.complete(%s, %s)", (job_id, job_attempt)) is True
        left = su.execute("SELECT id, state::text FROM pgq.jobs WHERE state NOT IN ('done', 'failed', 'cancelled') "
                          "ORDER BY id").fetchall()
        assert left == [], left


def test_a_migration_that_needs_a_lock_a_session_holds_gives_up_after_lock_timeout_and_runs_again(upgraded):
    """0013 adds columns to pgq.jobs (ACCESS EXCLUSIVE): behind a reader's open transaction it waits
    lock_timeout, fails with nothing applied, and runs once the reader is gone. (Landed migrations set
    no lock_timeout of their own: pgq_thin.migrate sets it on every connection yoyo applies one on.)"""
    dsn = upgraded
    _migrate_to(dsn, "0012_waiting_state")
    with psycopg.connect(dsn) as reader:
        reader.execute("LOCK TABLE pgq.jobs IN ACCESS SHARE MODE")
        # (Should the migration wait without bound, the reader lets go after 60 s and the test fails.)
        release = threading.Timer(60, reader.rollback)
        release.start()
        try:
            with pytest.raises(psycopg.errors.LockNotAvailable):
                migrate(dsn, lock_timeout="200ms")
        finally:
            release.cancel()
        with psycopg.connect(dsn, autocommit=True) as su:
            assert one(su, "SELECT max(migration_id) FROM _yoyo_migration") == "0012_waiting_state"
        reader.rollback()
    # Every migration from 0013 on is applied by that second call (the names from the tree's own).
    pending = sorted(p.stem for p in MIGRATIONS.glob("*.sql") if p.stem >= "0013_job_dependencies")
    assert pending[:2] == ["0013_job_dependencies", "0014_catalog_comments"]
    assert migrate(dsn) == pending


def test_0017_behind_a_reader_of_the_jobs_gives_up_changing_nothing_and_runs_again(upgraded):
    """0017 adds columns to pgq.jobs (ACCESS EXCLUSIVE for an instant): behind a session that keeps
    pgq.jobs open it gives up after its lock_timeout, the database at 0016 with its functions
    working, and applies once the session is gone."""
    dsn = upgraded
    _migrate_to(dsn, f"git:{RELEASED['0016_per_key_claims']}")
    with psycopg.connect(dsn) as reader:
        reader.execute("SELECT count(*) FROM pgq.jobs")  # ACCESS SHARE, held to the transaction's end
        release = threading.Timer(60, reader.rollback)
        release.start()
        try:
            with pytest.raises(psycopg.errors.LockNotAvailable):
                migrate(dsn, lock_timeout="200ms")
        finally:
            release.cancel()
        with psycopg.connect(dsn, autocommit=True) as su:
            assert one(su, "SELECT max(migration_id) FROM _yoyo_migration") == "0016_per_key_claims"
            assert one(su, "SELECT pgq.version()") == "16"
            assert one(su, "SELECT pgq.enqueue('q', 'k')") is not None
        reader.rollback()
    assert migrate(dsn) == sorted(p.stem for p in MIGRATIONS.glob("*.sql") if p.stem >= "0017_workflows")


def test_0020_waits_for_a_keyed_claim_in_flight_whose_running_job_then_still_holds_its_key(upgraded):
    """A claim of the old source in flight when the upgrade runs holds a key's hash slot: the
    migration waits for it (from 0018, 0019's trigger rename waits for its lock on pgq.jobs; from
    0019, 0020's EXCLUSIVE lock on pgq.key_slots), so the job it claimed is running, and counted,
    when the new source's first claim of the key comes: never two of the key at once."""
    dsn = upgraded
    _migrate_to(dsn, "git:5e1aa62")  # 0018, with the source that holds keys by pgq.key_slots
    with psycopg.connect(dsn, autocommit=True) as su:
        su.execute("SELECT pgq.configure_queue('keyed', key_max_running => 1)")
        first, second = (one(su, "SELECT pgq.enqueue('keyed', 'k', '{}', concurrency_key => 'a')") for _ in range(2))
        with psycopg.connect(dsn) as inflight:
            claimed = inflight.execute("SELECT id, attempt FROM pgq.claim('old', ARRAY['keyed'])").fetchall()
            assert [c[0] for c in claimed] == [first]
            errors: list[BaseException] = []

            def run() -> None:
                try:
                    migrate(dsn, lock_timeout="60s")
                except BaseException as exc:  # noqa: BLE001 - reported below
                    errors.append(exc)

            migration = threading.Thread(target=run)
            migration.start()
            claimer = one(inflight, "SELECT pg_backend_pid()")
            wait_for(lambda: one(su, "SELECT count(*) FROM pg_stat_activity "
                                     "WHERE %s = ANY (pg_blocking_pids(pid))", (claimer,)) > 0,
                     "the migration to wait for the claim in flight")
            assert one(su, "SELECT pgq.version()") == "18"
            inflight.commit()
            migration.join(timeout=120)
            assert not migration.is_alive() and not errors, errors
        assert one(su, "SELECT pgq.version()") == str(max(_number(m) for m in MIGRATION_SHA256))
        assert su.execute("SELECT * FROM pgq.claim('new', ARRAY['keyed'])").fetchall() == []  # a's one place
        assert one(su, "SELECT pgq.complete(%s, %s)", claimed[0]) is True
        assert _claim(su, "keyed")[0] == second


def test_0030_keeps_a_0029_queues_keyed_jobs_which_then_join_a_sequence_in_order(upgraded):
    """A database at 0029 (the function source of 2f25220) holding a key's running and pending
    jobs and a job without a key: 0030 keeps every one of them, and a key_sequence given after the
    upgrade takes them in id order, the running one holding its key (never stranded, never two)."""
    dsn = upgraded
    _migrate_to(dsn, "git:2f25220")
    with psycopg.connect(dsn, autocommit=True) as su:
        assert one(su, "SELECT pgq.version()") == "29"
        su.execute("SELECT pgq.configure_queue('hooks', key_max_running => 1)")
        keyed = [one(su, "SELECT pgq.enqueue('hooks', 'k', '{}', concurrency_key => 'c1')") for _ in range(3)]
        loose = one(su, "SELECT pgq.enqueue('hooks', 'k', '{}')")
        running = _claim(su, "hooks")
        assert running[0] == keyed[0]
        before = su.execute("SELECT id, state, attempt FROM pgq.jobs ORDER BY id").fetchall()
        migrate(dsn)
        assert one(su, "SELECT pgq.version()") == str(max(_number(m) for m in MIGRATION_SHA256))
        assert su.execute("SELECT id, state, attempt FROM pgq.jobs ORDER BY id").fetchall() == before
        su.execute("SELECT pgq.configure_queue('hooks', key_max_running => 0, key_sequence => 'halt')")
        assert [r[0] for r in su.execute("SELECT id FROM pgq.claim('new', ARRAY['hooks'], 10)")] == [loose]
        assert one(su, "SELECT pgq.complete(%s, %s)", running) is True
        for job_id in keyed[1:]:
            got = su.execute("SELECT id, attempt FROM pgq.claim('new', ARRAY['hooks'], 10)").fetchall()
            assert [g[0] for g in got] == [job_id]
            assert one(su, "SELECT pgq.complete(%s, %s)", got[0]) is True
