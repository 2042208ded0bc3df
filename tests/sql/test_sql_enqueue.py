"""pgq.enqueue and pgq.enqueue_many: defaults, deduplication by unique_key, ordering, volume."""

from __future__ import annotations

import threading
from datetime import timedelta

from psycopg.types.json import Jsonb

from sqlfixtures import dsn, module_dsn, wait_until_blocked  # noqa: F401  (one database per module, emptied per test)
from sqlhelpers import claim, job, notifications_until_marker, one


def test_enqueue_takes_max_attempts_from_the_queue_and_fills_defaults(conn):
    conn.execute("SELECT pgq.configure_queue('mail', max_attempts => 7)")
    with conn.transaction():  # run_at defaults to now(), the transaction's start, like created_at
        job_id = one(conn, "SELECT pgq.enqueue('mail', 'send')")
        now = one(conn, "SELECT now()")
    row = job(conn, job_id)
    assert row["queue"] == "mail" and row["kind"] == "send"
    assert row["max_attempts"] == 7
    assert row["payload"] == {}
    assert row["priority"] == 0
    assert row["state"] == "pending"
    assert row["attempt"] == 0
    assert row["run_at"] == now and row["created_at"] == now
    assert row["unique_key"] is None and row["tenant"] is None
    assert row["lease_until"] is None and row["claimed_by"] is None
    assert row["last_event"] == "enqueued"


def test_enqueue_creates_the_queue_with_default_settings_on_first_use(conn):
    assert one(conn, "SELECT count(*) FROM pgq.queues") == 0
    job_id = one(conn, "SELECT pgq.enqueue('fresh', 'k')")
    q = conn.execute("SELECT paused, lease, max_attempts, backoff_base, backoff_cap, retention, "
                     "notify, audit FROM pgq.queues WHERE name = 'fresh'").fetchone()
    assert q == (False, timedelta(seconds=30), 25, timedelta(seconds=1), timedelta(hours=1),
                 timedelta(days=7), True, True)
    assert job(conn, job_id)["max_attempts"] == 25


def test_enqueue_stores_every_explicit_argument(conn):
    job_id = one(conn, """
        SELECT pgq.enqueue(queue => 'q', kind => 'report.build', payload => '{"a": [1, 2]}',
                           run_at => '2100-01-01 00:00:00+00', priority => -5, max_attempts => 3,
                           unique_key => 'report-42', tenant => 'acme')""")
    row = job(conn, job_id)
    assert row["kind"] == "report.build"
    assert row["payload"] == {"a": [1, 2]}
    assert row["run_at"].year == 2100
    assert row["priority"] == -5 and row["max_attempts"] == 3
    assert row["unique_key"] == "report-42" and row["tenant"] == "acme"


def test_enqueue_ids_grow(conn):
    ids = [one(conn, "SELECT pgq.enqueue('q', 'k')") for _ in range(3)]
    assert ids == sorted(ids) and len(set(ids)) == 3


def test_unique_key_returns_the_existing_id_while_pending_or_running_and_a_new_id_after_done(conn):
    first = one(conn, "SELECT pgq.enqueue('q', 'k', unique_key => 'u1')")
    assert one(conn, "SELECT pgq.enqueue('q', 'k', '{\"other\": 1}', unique_key => 'u1')") == first
    (claimed,) = claim(conn)
    assert claimed["id"] == first
    assert one(conn, "SELECT pgq.enqueue('q', 'k', unique_key => 'u1')") == first
    assert one(conn, "SELECT count(*) FROM pgq.jobs") == 1
    assert job(conn, first)["payload"] == {}  # the duplicate's payload was not written

    assert one(conn, "SELECT pgq.complete(%s, %s)", (first, claimed["attempt"])) is True
    second = one(conn, "SELECT pgq.enqueue('q', 'k', unique_key => 'u1')")
    assert second != first
    assert job(conn, second)["state"] == "pending"


def test_unique_key_is_free_again_after_failed_or_cancelled(conn):
    a = one(conn, "SELECT pgq.enqueue('q', 'k', max_attempts => 1, unique_key => 'u')")
    (c,) = claim(conn)
    assert one(conn, "SELECT pgq.fail(%s, %s, 'boom')", (a, c["attempt"])) == "failed"
    b = one(conn, "SELECT pgq.enqueue('q', 'k', unique_key => 'u')")
    assert b != a
    assert one(conn, "SELECT pgq.cancel(%s)", (b,)) is True
    c_id = one(conn, "SELECT pgq.enqueue('q', 'k', unique_key => 'u')")
    assert c_id not in (a, b)


def test_unique_key_is_scoped_to_its_queue(conn):
    a = one(conn, "SELECT pgq.enqueue('q1', 'k', unique_key => 'same')")
    b = one(conn, "SELECT pgq.enqueue('q2', 'k', unique_key => 'same')")
    assert a != b


def test_concurrent_enqueues_with_the_same_unique_key_make_one_job(connect):
    a = connect(autocommit=False)
    b = connect()
    observer = connect()
    first = one(a, "SELECT pgq.enqueue('q', 'k', unique_key => 'race')")
    result: dict[str, int] = {}

    def second_enqueue() -> None:
        result["id"] = one(b, "SELECT pgq.enqueue('q', 'k', unique_key => 'race')")

    t = threading.Thread(target=second_enqueue)
    t.start()
    assert a.info.backend_pid in wait_until_blocked(observer, b.info.backend_pid)
    a.commit()
    t.join(10)
    assert result["id"] == first
    assert one(observer, "SELECT count(*) FROM pgq.jobs WHERE unique_key = 'race'") == 1


def test_enqueue_with_a_unique_key_held_by_a_rolled_back_transaction_makes_a_new_job(connect):
    a = connect(autocommit=False)
    b = connect()
    observer = connect()
    rolled_back = one(a, "SELECT pgq.enqueue('q', 'k', unique_key => 'race')")
    result: dict[str, int] = {}
    t = threading.Thread(
        target=lambda: result.update(id=one(b, "SELECT pgq.enqueue('q', 'k', unique_key => 'race')")))
    t.start()
    wait_until_blocked(observer, b.info.backend_pid)
    a.rollback()
    t.join(10)
    assert result["id"] != rolled_back
    assert one(observer, "SELECT array_agg(id) FROM pgq.jobs WHERE unique_key = 'race'") == [result["id"]]


def test_enqueue_is_part_of_the_callers_transaction(connect):
    a = connect(autocommit=False)
    observer = connect()
    one(a, "SELECT pgq.enqueue('q', 'k')")
    assert one(observer, "SELECT count(*) FROM pgq.jobs") == 0
    a.rollback()
    assert one(observer, "SELECT count(*) FROM pgq.jobs") == 0


def test_enqueue_notifies_for_due_jobs_only_and_not_when_notify_is_off(connect):
    listener = connect()
    listener.execute("LISTEN pgq")
    producer = connect()
    producer.execute("SELECT pgq.enqueue('loud', 'k')")
    producer.execute("SELECT pgq.enqueue('loud', 'k', run_at => now() + interval '1 hour')")
    producer.execute("SELECT pgq.configure_queue('quiet', notify => false)")
    producer.execute("SELECT pgq.enqueue('quiet', 'k')")
    assert notifications_until_marker(listener, producer) == ["loud"]


def test_enqueue_many_returns_ids_in_payload_order(conn):
    payloads = [Jsonb({"n": i}) for i in range(50)]
    ids = [r[0] for r in conn.execute("SELECT * FROM pgq.enqueue_many('q', 'k', %s)", (payloads,))]
    assert len(ids) == 50 and len(set(ids)) == 50
    stored = dict(conn.execute("SELECT id, (payload->>'n')::int FROM pgq.jobs").fetchall())
    assert [stored[i] for i in ids] == list(range(50))
    assert ids == sorted(ids)


def test_enqueue_many_takes_defaults_from_the_queue_and_stores_the_shared_arguments(conn):
    conn.execute("SELECT pgq.configure_queue('q', max_attempts => 4)")
    ids = [r[0] for r in conn.execute(
        "SELECT * FROM pgq.enqueue_many('q', 'k', ARRAY['{}', '{\"x\": 1}']::jsonb[], priority => 9, "
        "tenant => 't1', run_at => '2099-01-01')")]
    rows = [job(conn, i) for i in ids]
    assert [r["max_attempts"] for r in rows] == [4, 4]
    assert [r["priority"] for r in rows] == [9, 9]
    assert [r["tenant"] for r in rows] == ["t1", "t1"]
    assert all(r["run_at"].year == 2099 and r["state"] == "pending" for r in rows)


def test_enqueue_many_with_an_empty_array_adds_no_job(conn):
    assert conn.execute("SELECT * FROM pgq.enqueue_many('q', 'k', ARRAY[]::jsonb[])").fetchall() == []
    assert one(conn, "SELECT count(*) FROM pgq.jobs") == 0


def test_enqueue_many_adds_ten_thousand_jobs_in_order(conn):
    payloads = [Jsonb({"n": i}) for i in range(10_000)]
    ids = [r[0] for r in conn.execute("SELECT * FROM pgq.enqueue_many('bulk', 'k', %s)", (payloads,))]
    assert len(ids) == 10_000
    assert ids == sorted(ids)
    ns = [r[0] for r in conn.execute("SELECT (payload->>'n')::int FROM pgq.jobs ORDER BY id")]
    assert ns == list(range(10_000))
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'pending' AND queue = 'bulk'") == 10_000


def test_enqueue_many_notifies_once_per_call(connect):
    listener = connect()
    listener.execute("LISTEN pgq")
    producer = connect()
    producer.execute("SELECT pgq.enqueue_many('many', 'k', ARRAY['{}', '{}', '{}']::jsonb[])")
    assert notifications_until_marker(listener, producer) == ["many"]
