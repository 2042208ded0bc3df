"""Limits that hold (issue 18): intervals judged by what they do to a timestamp, sizes measured
uncompressed, claims that never wait for another session's lock, repeated rejections recorded
once, claims whose cost does not grow with idle queues or waiting tenants, pgq.drop_queue, idle
tenants pruned, and the validation gaps. Where the attacker is the point, each is tried through a
real login of the role it needs (a LOGIN role that is a member of pgq_producer or pgq_worker)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from sqlfixtures import sqlstate_of
from sqlhelpers import LOWER_LEASE_FLOOR, claim, one, wait_for

MONTHS = "3000000 mon -89999999 days"  # compares as 1 day; adds 1.3 million days to a timestamp
MIXED = "1 day -23:59:59"              # compares as 1 second; -59:59 on a 23-hour day


@pytest.fixture
def login(conn: psycopg.Connection, dsn: str) -> Iterator[Callable[..., psycopg.Connection]]:
    """Connects as a LOGIN role that is a member of the given pgq role (created once per cluster)."""
    opened: list[psycopg.Connection] = []

    def _login(role: str, autocommit: bool = True) -> psycopg.Connection:
        name = f"pgq_test_limits_{role.removeprefix('pgq_')}"
        if conn.execute("SELECT FROM pg_roles WHERE rolname = %s", (name,)).fetchone() is None:
            try:
                conn.execute(f"CREATE ROLE {name} LOGIN IN ROLE {role}")
            except psycopg.errors.DuplicateObject:
                pass
        c = psycopg.connect(dsn, user=name, autocommit=autocommit)
        assert one(c, "SELECT session_user") == name
        opened.append(c)
        return c

    yield _login
    for c in opened:
        c.close()


def error_of(c: psycopg.Connection, sql: str, params: Any = None) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as info:
        c.execute(sql, params)
    return info.value


def running_job(conn: psycopg.Connection, queue: str = "q") -> tuple[int, int]:
    job_id = one(conn, "SELECT pgq.enqueue(%s, 'k')", (queue,))
    (c,) = claim(conn, queues=[queue])
    assert c["id"] == job_id
    return job_id, c["attempt"]


# 1. Intervals --------------------------------------------------------------------------------------


def test_a_worker_login_gets_no_lease_of_a_million_days_from_months(conn, login):
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k')")
    worker = login("pgq_worker")
    e = error_of(worker, "SELECT * FROM pgq.claim('w', lease => %s::interval)", (MONTHS,))
    assert e.sqlstate == "22023" and 'argument "lease"' in str(e) and "months" in str(e)
    assert one(conn, "SELECT state::text FROM pgq.jobs WHERE id = %s", (job_id,)) == "pending"


# Every interval a caller can give, each with the call that takes it (a running job 1 at attempt 1
# in queue 'q' exists when it runs).
INTERVAL_CALLS = {
    "claim lease": ("SELECT * FROM pgq.claim('w', lease => %s::interval)", "lease"),
    "renew lease": ("SELECT pgq.renew(1, 1, %s::interval)", "lease"),
    "snooze delay": ("SELECT pgq.snooze(1, 1, %s::interval)", "delay"),
    "fail retry_in": ("SELECT pgq.fail(1, 1, 'e', retry_in => %s::interval)", "retry_in"),
    "enqueue max_run_time": ("SELECT pgq.enqueue('q', 'k', max_run_time => %s::interval)", "max_run_time"),
    "enqueue_many max_run_time": ("SELECT pgq.enqueue_many('q', 'k', ARRAY['{}'::jsonb], max_run_time => %s::interval)",
                                  "max_run_time"),
    "configure_queue lease": ("SELECT pgq.configure_queue('q', lease => %s::interval)", "lease"),
    "configure_queue backoff_base": ("SELECT pgq.configure_queue('q', backoff_base => %s::interval)",
                                     "backoff_base"),
    "configure_queue backoff_cap": ("SELECT pgq.configure_queue('q', backoff_cap => %s::interval)", "backoff_cap"),
    "configure_queue retention": ("SELECT pgq.configure_queue('q', retention => %s::interval)", "retention"),
    "configure_queue retention_failed": ("SELECT pgq.configure_queue('q', retention_failed => %s::interval)",
                                         "retention_failed"),
    "configure_queue retention_cancelled": (
        "SELECT pgq.configure_queue('q', retention_cancelled => %s::interval)", "retention_cancelled"),
    "configure_queue max_run_time": ("SELECT pgq.configure_queue('q', max_run_time => %s::interval)",
                                     "max_run_time"),
    "prune older_than": ("SELECT pgq.prune(older_than => %s::interval)", "older_than"),
    "schedule every": ("SELECT pgq.schedule('s', 'q', 'k', every => %s::interval)", "every"),
}


@pytest.mark.parametrize("value", [MONTHS, MIXED, "1 mon", "-1 day 25:00:00"])
@pytest.mark.parametrize("call", sorted(INTERVAL_CALLS))
def test_every_interval_argument_refuses_months_and_mixed_signs_naming_itself(conn, call, value):
    running_job(conn)
    before = conn.execute("SELECT q.*, j.* FROM pgq.queues AS q JOIN pgq.jobs AS j ON j.queue = q.name").fetchall()
    sql, argument = INTERVAL_CALLS[call]
    e = error_of(conn, sql, (value,))
    assert e.sqlstate == "22023", (call, value, e)
    assert f'argument "{argument}"' in str(e), str(e)
    after = conn.execute("SELECT q.*, j.* FROM pgq.queues AS q JOIN pgq.jobs AS j ON j.queue = q.name").fetchall()
    assert after == before
    assert one(conn, "SELECT count(*) FROM pgq.schedules") == 0


@pytest.mark.parametrize("column", ["lease", "backoff_base", "backoff_cap", "retention", "max_run_time",
                                    "retention_failed", "retention_cancelled"])
def test_the_queues_table_checks_refuse_months_too(conn, column):
    conn.execute("SELECT pgq.configure_queue('q')")
    assert sqlstate_of(conn, f"UPDATE pgq.queues SET {column} = %s::interval", (MONTHS,)) == "23514"
    assert sqlstate_of(conn, f"UPDATE pgq.queues SET {column} = %s::interval", (MIXED,)) == "23514"


def test_the_schedules_table_check_refuses_months_too(conn):
    conn.execute("SELECT pgq.schedule('s', 'q', 'k', every => '1 hour')")
    assert sqlstate_of(conn, "UPDATE pgq.schedules SET every = %s::interval", (MONTHS,)) == "23514"


def test_spans_of_days_and_time_still_work(conn):
    conn.execute("SELECT pgq.configure_queue('q', lease => '1 day', retention => '30 days', "
                 "backoff_base => '00:00:01.5', max_run_time => '2 days 03:00:00')")
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k')")
    (c,) = claim(conn, lease="23:59:59")
    assert one(conn, "SELECT pgq.snooze(%s, %s, '1 day 01:00:00') > now() + interval '1 day'",
               (job_id, c["attempt"]))


# 2. Sizes --------------------------------------------------------------------------------------------

BIG = "jsonb_build_object('x', repeat('x', 50000000))"  # 50 MB, about 0.6 MB compressed


def test_a_producer_login_cannot_enqueue_50_mb_through_a_compressed_column(conn, login):
    producer = login("pgq_producer")
    producer.execute(f"CREATE TEMP TABLE big AS SELECT {BIG} AS p")
    assert one(producer, "SELECT pg_column_size(p) < 1048576 FROM big")  # compressed: under the limit
    e = error_of(producer, "SELECT pgq.enqueue('q', 'k', p) FROM big")
    assert e.sqlstate == "22023" and 'argument "payload" is 5000' in str(e), str(e)
    e = error_of(producer, "SELECT pgq.enqueue_many('q', 'k', ARRAY[p]) FROM big")
    assert e.sqlstate == "22023" and 'argument "payloads[1]"' in str(e), str(e)
    assert one(conn, "SELECT count(*) FROM pgq.jobs") == 0


def test_a_worker_login_cannot_store_50_mb_results_or_progress(conn, login):
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k')")
    worker = login("pgq_worker")
    (c,) = claim(worker)
    worker.execute(f"CREATE TEMP TABLE big AS SELECT {BIG} AS p")
    e = error_of(worker, "SELECT pgq.complete(%s, %s, p) FROM big", (job_id, c["attempt"]))
    assert e.sqlstate == "22023" and 'argument "result"' in str(e), str(e)
    e = error_of(worker, "SELECT pgq.progress(%s, %s, p) FROM big", (job_id, c["attempt"]))
    assert e.sqlstate == "22023" and 'argument "progress"' in str(e), str(e)
    row = conn.execute("SELECT state::text, result, progress FROM pgq.jobs WHERE id = %s", (job_id,)).fetchone()
    assert row == ("running", None, None)
    # An error text is cut to its first 65536 characters, measured on the text itself.
    worker.execute("CREATE TEMP TABLE big_text AS SELECT repeat('é', 10000000) AS t")
    assert one(worker, "SELECT pgq.fail(%s, %s, t) FROM big_text", (job_id, c["attempt"])) == "pending"
    assert one(conn, "SELECT length(last_error) FROM pgq.jobs WHERE id = %s", (job_id,)) == 65536


def test_an_admin_cannot_schedule_a_50_mb_payload(conn):
    conn.execute(f"CREATE TEMP TABLE big AS SELECT {BIG} AS p")
    assert sqlstate_of(conn, "SELECT pgq.schedule('s', 'q', 'k', every => '1 hour', payload => p) FROM big") == "22023"


# 3. Locks --------------------------------------------------------------------------------------------


def run_unless_it_waits(c: psycopg.Connection, watcher: psycopg.Connection, sql: str) -> list[tuple]:
    """Runs sql on c in a thread; fails as soon as c's backend waits for a lock (pg_locks), else
    returns its rows. Waits on conditions only: the statement's end, or a lock wait."""
    pid = c.info.backend_pid
    result: list[Any] = []

    def run() -> None:
        try:
            result.append(c.execute(sql).fetchall())
        except BaseException as exc:  # noqa: BLE001 - reported below
            result.append(exc)

    t = threading.Thread(target=run)
    t.start()

    def finished_or_waiting() -> str | None:
        if result:
            return "finished"
        if one(watcher, "SELECT count(*) FROM pg_locks WHERE pid = %s AND NOT granted", (pid,)):
            return "waiting"
        return None

    outcome = wait_for(finished_or_waiting, f"{sql} to finish or wait", timeout=60)
    if outcome == "waiting":
        c.cancel_safe()
        t.join(30)
        pytest.fail(f"{sql} waited for a lock")
    t.join(30)
    if isinstance(result[0], BaseException):
        raise result[0]
    rows: list[tuple] = result[0]
    return rows


def idle_holder(login: Callable[..., psycopg.Connection], queue: str) -> psycopg.Connection:
    """A worker login that claimed one job of `queue` in a transaction and sits idle in it."""
    holder = login("pgq_worker", autocommit=False)
    assert holder.execute("SELECT id FROM pgq.claim('idle', %s::text[])", ([queue],)).fetchall()
    return holder


def test_an_idle_transaction_holding_a_capped_queue_holds_up_no_other_claim(conn, login):
    conn.execute("SELECT pgq.configure_queue('capped', max_running => 5)")
    conn.execute("SELECT pgq.enqueue_many('capped', 'k', array_fill('{}'::jsonb, ARRAY[3]))")
    other = one(conn, "SELECT pgq.enqueue('other', 'k')")
    holder = idle_holder(login, "capped")
    assert one(conn, "SELECT state FROM pg_stat_activity WHERE pid = %s",
               (holder.info.backend_pid,)) == "idle in transaction"
    worker = login("pgq_worker")
    rows = run_unless_it_waits(worker, conn, "SELECT id FROM pgq.claim('w', NULL, batch => 10)")
    assert [r[0] for r in rows] == [other]  # the capped queue is skipped for this call
    assert run_unless_it_waits(worker, conn, "SELECT id FROM pgq.claim('w', '{capped}')") == []
    holder.rollback()
    assert len(run_unless_it_waits(worker, conn, "SELECT id FROM pgq.claim('w', '{capped}', batch => 10)")) == 3


def test_an_idle_transaction_holding_a_tenant_holds_up_no_fair_claim(conn, login):
    conn.execute("SELECT pgq.configure_queue('fair', fair => true)")
    conn.execute("SELECT pgq.enqueue('fair', 'k', tenant => 'A')")
    conn.execute("SELECT pgq.enqueue('fair', 'k', tenant => 'A')")
    b = one(conn, "SELECT pgq.enqueue('fair', 'k', tenant => 'B')")
    holder = idle_holder(login, "fair")  # holds tenant A's row (A's first job: A sorts first)
    worker = login("pgq_worker")
    rows = run_unless_it_waits(worker, conn, "SELECT id, tenant FROM pgq.claim('w', '{fair}', batch => 10)")
    assert b in [r[0] for r in rows] and all(r[1] == "B" for r in rows), rows
    holder.rollback()


@pytest.mark.parametrize("call", [
    "SELECT pgq.pause('capped')",
    "SELECT pgq.resume('capped')",
    "SELECT pgq.configure_queue('capped', max_running => 9)",
    "SELECT pgq.drop_queue('capped')",
    "SELECT pgq.schedule('s', 'capped', 'k', every => '1 hour')",
])
def test_admin_calls_give_up_on_a_held_queue_row_with_55P03_and_a_hint(conn, login, call):
    conn.execute("SELECT pgq.configure_queue('capped', max_running => 5)")
    conn.execute("SELECT pgq.enqueue('capped', 'k')")
    holder = idle_holder(login, "capped")
    admin = login("pgq_admin")
    admin.execute("SET lock_timeout = '20s'")  # the call gives up after its own 5 s, not this
    e = error_of(admin, call)
    assert e.sqlstate == "55P03", e
    assert e.diag.message_hint and "pgq.health()" in e.diag.message_hint
    assert "queue capped is locked by another session" in str(e)
    holder.rollback()
    assert one(conn, "SELECT max_running FROM pgq.queues WHERE name = 'capped'") == 5


def test_concurrent_claimers_never_wait_and_never_pass_a_cap_while_a_session_holds_it_idle(dsn, conn, login):
    conn.execute("SELECT pgq.configure_queue('capped', max_running => 3, audit => false)")
    conn.execute("SELECT pgq.enqueue_many('capped', 'k', array_fill('{}'::jsonb, ARRAY[200]))")
    stop = threading.Event()
    errors: list[BaseException] = []
    observed: list[int] = []
    holder = idle_holder(login, "capped")  # one slot held, and the queue's row, by an idle transaction

    def claimer() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                c.execute("SET lock_timeout = '20s'")  # a wait would show up in pg_locks, sampled below
                while not stop.is_set():
                    for job_id, attempt in c.execute(
                            "SELECT id, attempt FROM pgq.claim('w', '{capped}', batch => 2)").fetchall():
                        c.execute("SELECT pgq.complete(%s, %s)", (job_id, attempt))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    waits: list[list[str]] = []

    def sampler() -> None:
        # A claim waiting for a lock another transaction holds (a row, a transaction id, a
        # relation): the rule is about claims (a complete may wait a moment for a row another
        # claimer's pick locked and skipped), and not about the relation extension lock
        # ('extend'), which concurrent inserts into one table take turns on inside the server.
        with psycopg.connect(dsn, autocommit=True) as c:
            while not stop.is_set():
                observed.append(one(c, "SELECT count(*) FROM pgq.jobs WHERE queue = 'capped' AND state = 'running'"))
                waits.append([f"{r[0]} by {r[1]}" for r in c.execute(
                    "SELECT l.locktype, left(a.query, 60) FROM pg_locks AS l JOIN pg_stat_activity AS a "
                    "ON a.pid = l.pid WHERE NOT l.granted AND a.datname = current_database()"
                    " AND l.locktype <> 'extend' AND a.query LIKE '%pgq.claim(%'")])

    threads = [threading.Thread(target=claimer) for _ in range(4)] + [threading.Thread(target=sampler)]
    for t in threads:
        t.start()
    try:
        # While the holder is idle nothing of the queue can be claimed (its row is held): samples
        # accumulate; then it ends and the claimers drain the queue.
        wait_for(lambda: len(observed) > 30, "30 samples while the queue is held", timeout=60)
        assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE queue = 'capped' AND state = 'done'") == 0
        holder.rollback()
        wait_for(lambda: one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'done'") == 200,
                 "all 200 jobs done", timeout=120)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    assert not errors, errors
    assert max(observed) <= 3, f"running counts seen: max {max(observed)}"
    assert not [w for w in waits if w], f"a claim waited for a lock: {[w for w in waits if w][:5]}"


# 4. Repeated rejections ------------------------------------------------------------------------------


def rejections(conn: psycopg.Connection, job_id: int) -> list[tuple]:
    return conn.execute("SELECT attempt, times, split_part(note, ' ', 1) FROM pgq.job_events "
                        "WHERE job_id = %s AND event = 'rejected' ORDER BY id", (job_id,)).fetchall()


def test_ten_thousand_bogus_completes_write_one_event(conn, login):
    job_id, _ = running_job(conn)
    worker = login("pgq_worker")
    assert one(worker, "SELECT count(*) FILTER (WHERE pgq.complete(%s, 999999)) FROM generate_series(1, 10000)",
               (job_id,)) == 0
    assert rejections(conn, job_id) == [(999999, 10000, "complete")]


def test_a_flood_naming_every_attempt_from_one_login_writes_two_events(conn, login):
    """Issue 24: keyed on the attempt, the dedup let a flood naming attempts 1000 to 4000 write 3,001
    events. The first attempt named keeps its event; the second event names the latest other one;
    together they count every call."""
    job_id, attempt = running_job(conn)
    worker = login("pgq_worker")
    before = one(conn, "SELECT count(*) FROM pgq.job_events")
    assert one(worker, "SELECT count(*) FILTER (WHERE pgq.complete(%s, a)) FROM generate_series(1000, 4000) AS a",
               (job_id,)) == 0
    assert one(conn, "SELECT count(*) FROM pgq.job_events") - before == 2
    assert rejections(conn, job_id) == [(1000, 1, "complete"), (4000, 3000, "complete")]
    assert one(conn, "SELECT note FROM pgq.job_events WHERE job_id = %s AND event = 'rejected' ORDER BY id DESC "
                     "LIMIT 1", (job_id,)).startswith("complete from attempt 4000 rejected")
    # The first attempt named again counts on its own event; the same flood through complete_many and
    # the other operations: two events each, at most.
    assert one(worker, "SELECT pgq.complete(%s, 1000)", (job_id,)) is False
    worker.execute("SELECT pgq.complete_many(ARRAY(SELECT %s::bigint FROM generate_series(1, 3001)), "
                   "ARRAY(SELECT a FROM generate_series(1000, 4000) AS a))", (job_id,))
    worker.execute("SELECT count(pgq.renew(%s, a)) FROM generate_series(1000, 4000) AS a", (job_id,))
    assert rejections(conn, job_id) == [(1000, 2, "complete"), (4000, 3000, "complete"),
                                        (1000, 1, "complete_many"), (4000, 3000, "complete_many"),
                                        (1000, 1, "renew"), (4000, 3000, "renew")]
    assert one(conn, "SELECT pgq.complete(%s, %s)", (job_id, attempt)) is True  # the owner, unhindered


def test_complete_many_with_30000_copies_of_one_pair_writes_one_event(conn, login):
    job_id, _ = running_job(conn)
    worker = login("pgq_worker")
    assert worker.execute("SELECT pgq.complete_many(array_fill(%s::bigint, ARRAY[30000]), "
                          "array_fill(999999, ARRAY[30000]))", (job_id,)).fetchall() == []
    assert rejections(conn, job_id) == [(999999, 30000, "complete_many")]
    worker.execute("SELECT pgq.complete_many(ARRAY[%s, %s]::bigint[], '{999999,5}')", (job_id, job_id))
    assert rejections(conn, job_id) == [(999999, 30001, "complete_many"), (5, 1, "complete_many")]


def test_rejections_of_another_attempt_or_operation_are_events_of_their_own(conn):
    job_id, attempt = running_job(conn)
    for sql in ["SELECT pgq.complete(%s, 7)", "SELECT pgq.complete(%s, 8)", "SELECT pgq.fail(%s, 7, 'e')",
                "SELECT pgq.renew(%s, 7)", "SELECT pgq.complete(%s, 7)", "SELECT pgq.release(%s, 7)",
                "SELECT pgq.snooze(%s, 7, '1 minute')", "SELECT pgq.mark_unknown(%s, 7, 'n')",
                "SELECT pgq.progress(%s, 7, '{}')", "SELECT pgq.complete(%s, 7)"]:
        conn.execute(sql, (job_id,))
    assert rejections(conn, job_id) == [(7, 3, "complete"), (8, 1, "complete"), (7, 1, "fail"), (7, 1, "renew"),
                                        (7, 1, "release"), (7, 1, "snooze"), (7, 1, "mark_unknown"),
                                        (7, 1, "progress")]
    assert one(conn, "SELECT pgq.complete(%s, %s)", (job_id, attempt))


def test_concurrent_repeated_rejections_still_write_one_event(dsn, conn):
    job_id, _ = running_job(conn)
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def rejecter() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                barrier.wait(30)
                for _ in range(100):
                    assert one(c, "SELECT pgq.complete(%s, 424242)", (job_id,)) is False
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=rejecter) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert rejections(conn, job_id) == [(424242, 400, "complete")]


# 5. Many queues, many tenants --------------------------------------------------------------------------


def reads(conn: psycopg.Connection, table: str) -> int:
    """Rows and index entries this transaction has read from a pgq table so far."""
    row = conn.execute("SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0), coalesce(idx_scan, 0) "
                       "FROM pg_stat_xact_user_tables WHERE schemaname = 'pgq' AND relname = %s",
                       (table,)).fetchone()
    assert row is not None
    return int(row[0]) + int(row[1])


def test_a_claim_of_every_queue_reads_no_idle_queue(conn):
    conn.execute("INSERT INTO pgq.queues (name) SELECT 'idle-' || i FROM generate_series(1, 5000) AS i")
    job_id = one(conn, "SELECT pgq.enqueue('busy', 'k')")
    conn.execute("ANALYZE pgq.queues")
    with conn.transaction():
        before = reads(conn, "queues"), reads(conn, "jobs")
        assert [c["id"] for c in claim(conn)] == [job_id]
        queues_read, jobs_read = reads(conn, "queues") - before[0], reads(conn, "jobs") - before[1]
    assert queues_read < 20, f"the claim read {queues_read} queue rows"
    assert jobs_read < 20, f"the claim read {jobs_read} job rows and index scans"


def test_a_fair_claim_reads_the_tenants_it_serves_not_every_waiting_one(conn):
    conn.execute("SELECT pgq.configure_queue('fair', fair => true, audit => false)")
    conn.execute("SELECT pgq.enqueue('fair', 'k', tenant => 't' || i) FROM generate_series(1, 3000) AS i")
    conn.execute("ANALYZE pgq.tenants")
    conn.execute("ANALYZE pgq.jobs")
    with conn.transaction():
        before = reads(conn, "tenants"), reads(conn, "jobs")
        assert len(claim(conn, queues=["fair"], batch=5)) == 5
        tenants_read, jobs_read = reads(conn, "tenants") - before[0], reads(conn, "jobs") - before[1]
    assert tenants_read < 60, f"the claim read {tenants_read} tenant rows and scans"
    assert jobs_read < 100, f"the claim read {jobs_read} job rows and index scans"


def test_a_claim_of_every_queue_still_fires_a_due_schedule_of_a_queue_without_jobs(conn):
    conn.execute("SELECT pgq.schedule('s', 'scheduled', 'k', every => '1 hour')")
    conn.execute("UPDATE pgq.schedules SET next_run_at = now() - interval '1 minute'")
    conn.execute("UPDATE pgq.queues SET next_schedule_at = now() - interval '1 minute'")
    (c,) = claim(conn)
    assert c["queue"] == "scheduled"


def test_a_claim_of_every_queue_recovers_an_expired_lease_and_claims_it(conn):
    job_id, _ = running_job(conn, "only")
    conn.execute("UPDATE pgq.jobs SET lease_until = now() - interval '1 second'")
    conn.execute(LOWER_LEASE_FLOOR)
    (c,) = claim(conn)
    assert c["id"] == job_id and c["attempt"] == 2


# drop_queue and prune of tenants ----------------------------------------------------------------------


def test_drop_queue_removes_an_empty_queue_with_its_tenants(conn):
    conn.execute("SELECT pgq.configure_queue('gone', fair => true)")
    conn.execute("SELECT pgq.set_tenant_weight('gone', 'A', 3)")
    assert one(conn, "SELECT pgq.drop_queue('gone')") is True
    assert one(conn, "SELECT count(*) FROM pgq.queues WHERE name = 'gone'") == 0
    assert one(conn, "SELECT count(*) FROM pgq.tenants WHERE queue = 'gone'") == 0


def test_drop_queue_refuses_while_the_queue_has_jobs_or_schedules_and_names_no_queue(conn):
    job_id = one(conn, "SELECT pgq.enqueue('busy', 'k')")
    e = error_of(conn, "SELECT pgq.drop_queue('busy')")
    assert e.sqlstate == "55000" and "still has jobs" in str(e) and e.diag.message_hint
    (c,) = claim(conn)
    assert sqlstate_of(conn, "SELECT pgq.drop_queue('busy')") == "55000"  # running
    conn.execute("SELECT pgq.complete(%s, %s)", (job_id, c["attempt"]))
    assert sqlstate_of(conn, "SELECT pgq.drop_queue('busy')") == "55000"  # done, not pruned
    conn.execute("SELECT pgq.prune(older_than => '0')")
    conn.execute("SELECT pgq.schedule('s', 'busy', 'k', every => '1 hour')")
    e = error_of(conn, "SELECT pgq.drop_queue('busy')")
    assert e.sqlstate == "55000" and "still has schedules" in str(e)
    conn.execute("SELECT pgq.unschedule('s')")
    assert one(conn, "SELECT pgq.drop_queue('busy')") is True
    e = error_of(conn, "SELECT pgq.drop_queue('busy')")
    assert e.sqlstate == "22023" and 'argument "queue" names no queue' in str(e)
    assert sqlstate_of(conn, "SELECT pgq.drop_queue(NULL)") == "22004"


def test_only_an_admin_may_drop_a_queue(conn, login):
    conn.execute("SELECT pgq.configure_queue('q')")
    assert sqlstate_of(login("pgq_producer"), "SELECT pgq.drop_queue('q')") == "42501"
    assert sqlstate_of(login("pgq_worker"), "SELECT pgq.drop_queue('q')") == "42501"
    assert one(login("pgq_admin"), "SELECT pgq.drop_queue('q')") is True


def waiting_on_lock(conn: psycopg.Connection, pid: int) -> bool:
    return bool(one(conn, "SELECT count(*) FROM pg_locks WHERE pid = %s AND NOT granted", (pid,)))


def test_drop_queue_racing_an_enqueue_in_flight_sees_its_job_and_refuses(conn, login):
    conn.execute("SELECT pgq.configure_queue('racy')")
    producer = login("pgq_producer", autocommit=False)
    job_id = one(producer, "SELECT pgq.enqueue('racy', 'k')")  # not committed yet
    admin = login("pgq_admin")
    outcome: list[Any] = []
    t = threading.Thread(target=lambda: outcome.append(sqlstate_of(admin, "SELECT pgq.drop_queue('racy')")))
    t.start()
    wait_for(lambda: waiting_on_lock(conn, admin.info.backend_pid), "the drop to wait for the enqueue")
    producer.commit()
    t.join(30)
    assert outcome == ["55000"]
    assert one(conn, "SELECT queue FROM pgq.jobs WHERE id = %s", (job_id,)) == "racy"
    assert one(conn, "SELECT count(*) FROM pgq.queues WHERE name = 'racy'") == 1


def test_an_enqueue_racing_a_drop_in_flight_waits_and_recreates_the_queue(conn, login):
    conn.execute("SELECT pgq.configure_queue('racy', max_attempts => 3)")
    admin = login("pgq_admin", autocommit=False)
    assert one(admin, "SELECT pgq.drop_queue('racy')") is True  # not committed yet
    producer = login("pgq_producer")
    ids: list[int] = []
    t = threading.Thread(target=lambda: ids.append(one(producer, "SELECT pgq.enqueue('racy', 'k')")))
    t.start()
    wait_for(lambda: waiting_on_lock(conn, producer.info.backend_pid), "the enqueue to wait for the drop")
    admin.commit()
    t.join(30)
    assert len(ids) == 1
    assert one(conn, "SELECT max_attempts FROM pgq.queues WHERE name = 'racy'") == 25  # created anew
    (c,) = claim(conn)
    assert c["id"] == ids[0]


def test_prune_removes_tenants_without_jobs_but_keeps_weights_and_busy_ones(conn):
    conn.execute("SELECT pgq.configure_queue('fair', fair => true)")
    finished = one(conn, "SELECT pgq.enqueue('fair', 'k', tenant => 'done')")
    (c,) = claim(conn)
    assert c["id"] == finished
    conn.execute("SELECT pgq.complete(%s, %s)", (finished, c["attempt"]))
    conn.execute("SELECT pgq.enqueue('fair', 'k', tenant => 'busy')")
    conn.execute("SELECT pgq.set_tenant_weight('fair', 'weighted', 4)")
    conn.execute("INSERT INTO pgq.tenants (queue, tenant) SELECT 'fair', 'idle' || i FROM generate_series(1, 50) i")
    assert one(conn, "SELECT pgq.prune(older_than => '0')") == 1
    assert [r[0] for r in conn.execute("SELECT tenant FROM pgq.tenants ORDER BY tenant")] == ["busy", "weighted"]


def test_prune_leaves_a_tenant_whose_first_job_is_being_enqueued(conn, login):
    conn.execute("SELECT pgq.configure_queue('fair', fair => true)")
    conn.execute("INSERT INTO pgq.tenants (queue, tenant) VALUES ('fair', 'A')")
    producer = login("pgq_producer", autocommit=False)
    job_id = one(producer, "SELECT pgq.enqueue('fair', 'k', tenant => 'A')")  # not committed yet
    admin = login("pgq_admin")
    run_unless_it_waits(admin, conn, "SELECT pgq.prune()")  # skips the queue, without waiting
    producer.commit()
    assert one(conn, "SELECT count(*) FROM pgq.tenants WHERE tenant = 'A'") == 1
    (c,) = claim(conn)
    assert c["id"] == job_id


# 6. Validation gaps ------------------------------------------------------------------------------------


def test_a_queue_name_with_a_comma_given_to_claim_is_refused(conn, login):
    worker = login("pgq_worker")
    e = error_of(worker, "SELECT * FROM pgq.claim('w', ARRAY['a,b'])")
    assert e.sqlstate == "22023" and 'argument "queues[1]"' in str(e), str(e)
    e = error_of(worker, "SELECT * FROM pgq.claim('w', ARRAY['ok', 'a,b'])")
    assert e.sqlstate == "22023" and 'argument "queues[2]"' in str(e), str(e)
    e = error_of(worker, "SELECT * FROM pgq.claim('w', kinds => ARRAY['x,y'])")
    assert e.sqlstate == "22023" and 'argument "kinds[1]"' in str(e), str(e)


def test_unique_key_is_limited_by_bytes_so_the_index_limit_is_never_hit(conn, login):
    producer = login("pgq_producer")
    e = error_of(producer, "SELECT pgq.enqueue('q', 'k', unique_key => repeat(U&'\\+01F600', 1024))")
    assert e.sqlstate == "22023" and 'argument "unique_key" must be 1 to 1024 bytes' in str(e), str(e)
    # The longest key allowed, in a queue with the longest name, fits the index.
    long_queue = "q" * 128
    assert one(producer, "SELECT pgq.enqueue(%s, 'k', unique_key => repeat(U&'\\+01F600', 256))", (long_queue,))
    assert one(producer, "SELECT pgq.enqueue(%s, 'k', unique_key => repeat(md5('x'), 32))", (long_queue,))


def at_the_attempt_room(conn: psycopg.Connection, offset: int = 0) -> tuple[int, int]:
    """A running job whose max_attempts is its attempt room (1,000,000 past its offset): as if it had
    been released or snoozed 999,975 times (written as the owner: that many calls take too long)."""
    job_id, _ = running_job(conn)
    top = offset + 1_000_000
    conn.execute("UPDATE pgq.jobs SET attempt_offset = %s, max_attempts = %s, attempt = %s WHERE id = %s",
                 (offset, top, top - 1, job_id))
    return job_id, top - 1


@pytest.mark.parametrize("call", ["SELECT pgq.release(%s, %s)", "SELECT pgq.snooze(%s, %s, '1 second')"])
def test_release_and_snooze_stop_at_the_attempt_room_with_54000(conn, login, call):
    job_id, attempt = at_the_attempt_room(conn)
    worker = login("pgq_worker")
    # The job is the worker login's own (migration 0008: another login's release is "not yours").
    conn.execute("UPDATE pgq.jobs SET session_role = %s WHERE id = %s", (one(worker, "SELECT session_user"), job_id))
    before = conn.execute("SELECT * FROM pgq.jobs").fetchall()
    e = error_of(worker, call, (job_id, attempt))
    assert e.sqlstate == "54000" and e.diag.message_hint, e
    assert conn.execute("SELECT * FROM pgq.jobs").fetchall() == before


@pytest.mark.parametrize("call", ["SELECT pgq.release(%s, %s)", "SELECT pgq.snooze(%s, %s, '1 second')"])
def test_no_counter_overflows_after_the_most_fence_moves_the_docs_allow(conn, call):
    # 21,464 timeline changes of 100,000 attempt numbers each, and a job at its attempt room: its
    # counters are still below 2^31 - 1, and nothing can raise them past the room.
    job_id, attempt = at_the_attempt_room(conn, offset=21464 * 100000)
    assert attempt + 1 == 2147400000 < 2**31 - 1
    assert sqlstate_of(conn, call, (job_id, attempt)) == "54000"
    assert one(conn, "SELECT pgq.fail(%s, %s, 'e', retry_in => '1 second')", (job_id, attempt)) == "pending"
    conn.execute("UPDATE pgq.jobs SET run_at = now() WHERE id = %s", (job_id,))
    (c,) = claim(conn)
    assert c["attempt"] == attempt + 1 == c["max_attempts"]
    assert sqlstate_of(conn, call, (job_id, c["attempt"])) == "54000"
    assert one(conn, "SELECT pgq.fail(%s, %s, 'e')", (job_id, c["attempt"])) == "failed"


def test_retry_stops_at_the_attempt_room_too(conn):
    job_id, attempt = at_the_attempt_room(conn)
    conn.execute("UPDATE pgq.jobs SET attempt = max_attempts WHERE id = %s", (job_id,))
    assert one(conn, "SELECT pgq.fail(%s, %s, 'e')", (job_id, attempt + 1)) == "failed"
    e = error_of(conn, "SELECT pgq.retry(%s)", (job_id,))
    assert e.sqlstate == "54000", e
