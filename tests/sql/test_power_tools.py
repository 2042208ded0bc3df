"""Power tools in SQL (issue 27): enqueue's on_conflict 'replace' (and debounce with run_at), and
enqueue_many's unique_keys; bulk retry and cancel by filter (pgq.retry_jobs, pgq.cancel_jobs); a
running job's cancellation told to its worker on channel pgq_cancel. Real PostgreSQL, real
concurrent connections; where two callers meet, a deterministic interleaving (one holds its
transaction open while the other is seen waiting, or not) and a stress run."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from sqlhelpers import claim, notifications_until_marker, one, wait_for


def enqueue(conn: psycopg.Connection, key: str | None = "k1", **kwargs: Any) -> int:
    args = {"queue": "q", "unique_key": key, **kwargs}
    if "payload" in args:
        args["payload"] = json.dumps(args["payload"])
    if "meta" in args:
        args["meta"] = json.dumps(args["meta"])
    named = "".join(f", {name} => %({name})s" for name in args if name != "queue")
    return int(one(conn, f"SELECT pgq.enqueue(%(queue)s, 'k'{named})", args))


def row(conn: psycopg.Connection, job_id: int) -> dict[str, Any]:
    got = conn.cursor(row_factory=dict_row).execute(
        "SELECT id, state::text, payload, priority, run_at, meta, max_attempts, unique_key, depends_on, "
        "dependency_mode, attempt FROM pgq.jobs WHERE id = %s", (job_id,)).fetchone()
    assert got is not None
    return got


def live_jobs(conn: psycopg.Connection, queue: str = "q") -> list[dict[str, Any]]:
    return conn.cursor(row_factory=dict_row).execute(
        "SELECT id, state::text, payload, unique_key FROM pgq.jobs WHERE queue = %s"
        " AND state IN ('waiting', 'pending', 'running', 'outcome_unknown') ORDER BY id", (queue,)).fetchall()


def run_one(conn: psycopg.Connection, job_id: int) -> int:
    [claimed] = claim(conn, queues=[one(conn, "SELECT queue FROM pgq.jobs WHERE id = %s", (job_id,))])
    assert claimed["id"] == job_id
    return int(claimed["attempt"])


def waiting_for_lock(observer: psycopg.Connection, pid: int) -> bool:
    return one(observer, "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (pid,)) is True


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def body() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, out


# --- on_conflict ------------------------------------------------------------------------------

def test_keep_is_the_default_and_writes_nothing(conn) -> None:
    first = enqueue(conn, payload={"n": 1})
    assert enqueue(conn, payload={"n": 2}) == first
    assert enqueue(conn, payload={"n": 3}, on_conflict="keep") == first
    assert row(conn, first)["payload"] == {"n": 1}
    assert len(live_jobs(conn)) == 1


def test_replace_updates_a_pending_holder_and_keeps_its_id(conn) -> None:
    conn.execute("SELECT pgq.configure_queue('q', audit => true)")
    first = enqueue(conn, payload={"n": 1}, priority=1, meta={"a": 1}, max_attempts=3)
    later = one(conn, "SELECT now() + interval '1 hour'")
    again = enqueue(conn, payload={"n": 2}, priority=5, meta={"b": 2}, max_attempts=7, run_at=later,
                    on_conflict="replace")
    assert again == first
    got = row(conn, first)
    assert (got["state"], got["payload"], got["priority"], got["meta"], got["max_attempts"], got["run_at"]) == (
        "pending", {"n": 2}, 5, {"b": 2}, 7, later)
    assert one(conn, "SELECT array_agg(event ORDER BY id) FROM pgq.job_events WHERE job_id = %s", (first,)) == [
        "replaced"]
    assert len(live_jobs(conn)) == 1
    # Without max_attempts the queue's default applies, as it would to a new job.
    enqueue(conn, payload={"n": 3}, on_conflict="replace")
    assert row(conn, first)["max_attempts"] == one(conn, "SELECT max_attempts FROM pgq.queues WHERE name = 'q'")


def test_debounce_is_replace_with_a_delay_one_job_with_the_last_payload(conn) -> None:
    ids = {enqueue(conn, payload={"n": n}, on_conflict="replace",
                   run_at=one(conn, "SELECT now() + interval '30 seconds'")) for n in range(5)}
    assert len(ids) == 1
    [job_id] = ids
    assert row(conn, job_id)["payload"] == {"n": 4}
    assert claim(conn, queues=["q"]) == []  # not due before its delay
    conn.execute("UPDATE pgq.jobs SET run_at = now() - interval '1 second' WHERE id = %s", (job_id,))
    [claimed] = claim(conn, queues=["q"])
    assert claimed["id"] == job_id and claimed["payload"] == {"n": 4}


def test_replace_updates_a_waiting_holder_which_keeps_waiting(conn) -> None:
    dep = enqueue(conn, key=None, queue="other")
    holder = enqueue(conn, payload={"n": 1}, depends_on=[dep])
    assert row(conn, holder)["state"] == "waiting"
    assert enqueue(conn, payload={"n": 2}, on_conflict="replace") == holder
    got = row(conn, holder)
    assert got["state"] == "waiting" and got["payload"] == {"n": 2} and got["depends_on"] == [dep]


def test_replace_behind_a_running_holder_enqueues_one_job_that_runs_after_it(conn) -> None:
    holder = enqueue(conn, payload={"n": 1})
    attempt = run_one(conn, holder)
    successor = enqueue(conn, payload={"n": 2}, on_conflict="replace")
    assert successor != holder
    got = row(conn, successor)
    # The holder is left alone (its payload, its key); the new job waits for it, whatever its end.
    assert row(conn, holder)["payload"] == {"n": 1} and row(conn, holder)["unique_key"] == "k1"
    assert (got["state"], got["unique_key"], got["depends_on"], got["dependency_mode"]) == (
        "waiting", None, [holder], "all_ended")
    # A debounce behind it: the same successor takes the newer fields.
    assert enqueue(conn, payload={"n": 3}, on_conflict="replace") == successor
    assert enqueue(conn, payload={"n": 4}, on_conflict="replace") == successor
    assert row(conn, successor)["payload"] == {"n": 4}
    # 'keep' answers the holder, as before.
    assert enqueue(conn, payload={"n": 5}) == holder
    assert one(conn, "SELECT pgq.fail(%s, %s, 'boom', retryable => false)", (holder, attempt)) == "failed"
    assert row(conn, successor)["state"] == "pending"
    [claimed] = claim(conn, queues=["q"])
    assert claimed["id"] == successor and claimed["payload"] == {"n": 4}
    # The successor runs; the key is free: a replace enqueues a keyed job that waits for it.
    third = enqueue(conn, payload={"n": 6}, on_conflict="replace")
    got = row(conn, third)
    assert (got["state"], got["unique_key"], got["depends_on"]) == ("waiting", "k1", [successor])
    assert enqueue(conn, payload={"n": 7}, on_conflict="replace") == third
    assert one(conn, "SELECT pgq.complete(%s, %s)", (successor, claimed["attempt"])) is True
    assert row(conn, third)["state"] == "pending" and row(conn, third)["payload"] == {"n": 7}
    # Nothing is left behind once the successors have ended and the jobs are pruned.
    assert one(conn, "SELECT count(*) FROM pgq.replace_slots") <= 1
    [claimed] = claim(conn, queues=["q"])
    assert one(conn, "SELECT pgq.complete(%s, %s)", (third, claimed["attempt"])) is True
    conn.execute("SELECT pgq.prune(older_than => '0 seconds')")
    assert one(conn, "SELECT count(*) FROM pgq.replace_slots") == 0


def test_replace_without_a_holder_enqueues_a_keyed_job_and_keeps_no_row(conn) -> None:
    job_id = enqueue(conn, payload={"n": 1}, on_conflict="replace")
    assert row(conn, job_id)["unique_key"] == "k1" and row(conn, job_id)["state"] == "pending"
    assert enqueue(conn, payload={"n": 2}, on_conflict="replace") == job_id
    assert one(conn, "SELECT count(*) FROM pgq.replace_slots") == 0
    # on_conflict without a unique_key: there is nothing to conflict with.
    assert enqueue(conn, key=None, on_conflict="replace") != job_id


@pytest.mark.parametrize(("value", "sqlstate"), [("overwrite", "22023"), (None, "22004"), ("", "22023")])
def test_a_bad_on_conflict_is_refused_naming_it_and_writes_nothing(conn, value, sqlstate) -> None:
    before = one(conn, "SELECT count(*) FROM pgq.jobs")
    for sql in ("SELECT pgq.enqueue('q', 'k', unique_key => 'x', on_conflict => %s)",
                "SELECT pgq.enqueue_many('q', 'k', ARRAY['{}']::jsonb[], on_conflict => %s)"):
        with pytest.raises(psycopg.Error) as err:
            conn.execute(sql, (value,))
        assert err.value.sqlstate == sqlstate and "on_conflict" in str(err.value), err.value
    assert one(conn, "SELECT count(*) FROM pgq.jobs") == before


# --- enqueue_many's unique_keys ---------------------------------------------------------------

def many(conn: psycopg.Connection, payloads: list[dict[str, Any]], keys: list[str | None], **kwargs: Any) -> list[int]:
    named = "".join(f", {name} => %({name})s" for name in kwargs)
    return [r[0] for r in conn.execute(
        f"SELECT * FROM pgq.enqueue_many('q', 'k', %(payloads)s::jsonb[], unique_keys => %(keys)s{named})",
        {"payloads": [json.dumps(p) for p in payloads], "keys": keys, **kwargs}).fetchall()]


def test_enqueue_many_with_unique_keys_keeps_or_replaces_per_key_in_payload_order(conn) -> None:
    held = enqueue(conn, key="b", payload={"old": True})
    ids = many(conn, [{"n": 1}, {"n": 2}, {"n": 3}], ["a", "b", None])
    assert ids[1] == held and ids[0] < ids[2] and len(set(ids)) == 3
    assert row(conn, held)["payload"] == {"old": True}
    assert [row(conn, i)["unique_key"] for i in ids] == ["a", "b", None]
    again = many(conn, [{"n": 4}, {"n": 5}], ["b", "a"], on_conflict="replace")
    assert again == [held, ids[0]]
    assert row(conn, held)["payload"] == {"n": 4} and row(conn, ids[0])["payload"] == {"n": 5}


@pytest.mark.parametrize(("keys", "argument"), [
    (["a", "a"], "unique_keys"),
    (["a"], "unique_keys"),
    (["a", "b", "c"], "unique_keys"),
    (["a", ""], "unique_keys[2]"),
    (["x" * 1025, "b"], "unique_keys[1]"),
])
def test_enqueue_many_refuses_bad_unique_keys_naming_them_and_writes_nothing(conn, keys, argument) -> None:
    with pytest.raises(psycopg.Error) as err:
        many(conn, [{"n": 1}, {"n": 2}], keys)
    assert err.value.sqlstate == "22023" and argument in str(err.value), err.value
    assert one(conn, "SELECT count(*) FROM pgq.jobs") == 0


# --- bulk retry and cancel --------------------------------------------------------------------

def failed_jobs(conn: psycopg.Connection, queue: str, kind: str, n: int) -> list[int]:
    ids = []
    for _ in range(n):
        job_id = int(one(conn, "SELECT pgq.enqueue(%s, %s)", (queue, kind)))
        attempt = run_one(conn, job_id)
        assert one(conn, "SELECT pgq.fail(%s, %s, 'boom', retryable => false)", (job_id, attempt)) == "failed"
        ids.append(job_id)
    return ids


def test_retry_jobs_retries_the_matching_failed_jobs_oldest_first_at_most_limit_rows(conn) -> None:
    a = failed_jobs(conn, "q", "a", 5)
    b = failed_jobs(conn, "q", "b", 2)
    other = failed_jobs(conn, "other", "a", 2)
    assert one(conn, "SELECT pgq.retry_jobs('q', 'failed', kind => 'a', limit_rows => 3)") == 3
    states = {i: row(conn, i)["state"] for i in a + b + other}
    assert [states[i] for i in a] == ["pending"] * 3 + ["failed"] * 2
    assert {states[i] for i in b + other} == {"failed"}
    assert one(conn, "SELECT pgq.retry_jobs('q', 'failed', kind => 'a')") == 2
    assert one(conn, "SELECT pgq.retry_jobs('q', 'failed', kind => 'a')") == 0
    # finished_before: only those that ended before it.
    conn.execute("UPDATE pgq.jobs SET finished_at = now() - interval '1 day' WHERE id = %s", (b[0],))
    assert one(conn, "SELECT pgq.retry_jobs('q', 'failed', finished_before => now() - interval '1 hour')") == 1
    assert row(conn, b[0])["state"] == "pending" and row(conn, b[1])["state"] == "failed"
    # A retried job runs again with the next attempt, as pgq.retry's would.
    conn.execute("UPDATE pgq.jobs SET run_at = now() - interval '1 second' WHERE state = 'pending'")
    assert one(conn, "SELECT count(*) FROM pgq.claim('w', '{q}', batch => 100)") == 6


def test_retry_jobs_skips_a_job_whose_key_is_held_and_counts_only_what_it_retried(conn) -> None:
    job_id = enqueue(conn, key="dup")
    attempt = run_one(conn, job_id)
    assert one(conn, "SELECT pgq.fail(%s, %s, 'boom', retryable => false)", (job_id, attempt)) == "failed"
    plain = failed_jobs(conn, "q", "k", 1)[0]
    holder = enqueue(conn, key="dup")
    assert one(conn, "SELECT pgq.retry_jobs('q', 'failed')") == 1
    assert row(conn, job_id)["state"] == "failed" and row(conn, plain)["state"] == "pending"
    assert row(conn, holder)["state"] == "pending"


def test_cancel_jobs_cancels_by_state_kind_and_age_and_tells_running_jobs_workers(conn, dsn) -> None:
    pending = [enqueue(conn, key=None) for _ in range(3)]
    dep = enqueue(conn, key=None, queue="other")
    waiting = enqueue(conn, key=None, depends_on=[dep])
    running = enqueue(conn, key=None, queue="r")
    attempt = run_one(conn, running)
    old = pending[0]
    conn.execute("UPDATE pgq.jobs SET created_at = now() - interval '1 day' WHERE id = %s", (old,))
    assert one(conn, "SELECT pgq.cancel_jobs('q', 'pending', created_before => now() - interval '1 hour')") == 1
    assert row(conn, old)["state"] == "cancelled" and row(conn, pending[1])["state"] == "pending"
    assert one(conn, "SELECT pgq.cancel_jobs('q', 'pending', kind => 'nope')") == 0
    assert one(conn, "SELECT pgq.cancel_jobs('q', 'pending', limit_rows => 1)") == 1
    assert one(conn, "SELECT pgq.cancel_jobs('q', 'waiting')") == 1 and row(conn, waiting)["state"] == "cancelled"
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN pgq_cancel")
        assert one(conn, "SELECT pgq.cancel_jobs('r', 'running')") == 1
        got = notifications_until_marker(listener, conn, "pgq_cancel")
    assert got == [f"{running}:{attempt}"]
    assert row(conn, running)["state"] == "cancelled"
    assert one(conn, "SELECT pgq.complete(%s, %s)", (running, attempt)) is False


def test_cancel_of_a_running_job_notifies_pgq_cancel_and_of_a_pending_one_not(conn, dsn) -> None:
    running = enqueue(conn, key=None)
    attempt = run_one(conn, running)
    pending = enqueue(conn, key=None)
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN pgq_cancel")
        assert one(conn, "SELECT pgq.cancel(%s)", (pending,)) is True
        assert one(conn, "SELECT pgq.cancel(%s)", (running,)) is True
        assert one(conn, "SELECT pgq.cancel(%s)", (running,)) is False
        got = notifications_until_marker(listener, conn, "pgq_cancel")
    assert got == [f"{running}:{attempt}"]


@pytest.mark.parametrize(("sql", "sqlstate", "argument"), [
    ("SELECT pgq.retry_jobs('q', 'pending')", "22023", "state"),
    ("SELECT pgq.retry_jobs('q', NULL)", "22004", "state"),
    ("SELECT pgq.retry_jobs(NULL, 'failed')", "22004", "queue"),
    ("SELECT pgq.retry_jobs('q', 'failed', limit_rows => 0)", "22023", "limit_rows"),
    ("SELECT pgq.retry_jobs('q', 'failed', limit_rows => 10001)", "22023", "limit_rows"),
    ("SELECT pgq.retry_jobs('q', 'failed', kind => '')", "22023", "kind"),
    ("SELECT pgq.cancel_jobs('q', 'done')", "22023", "state"),
    ("SELECT pgq.cancel_jobs('q', 'failed')", "22023", "state"),
    ("SELECT pgq.cancel_jobs('q', 'pending', limit_rows => NULL)", "22004", "limit_rows"),
])
def test_bulk_calls_refuse_bad_filters_naming_the_argument_and_change_nothing(conn, sql, sqlstate, argument) -> None:
    failed_jobs(conn, "q", "k", 1)
    enqueue(conn, key=None)
    before = conn.execute("SELECT id, state FROM pgq.jobs ORDER BY id").fetchall()
    with pytest.raises(psycopg.Error) as err:
        conn.execute(sql)
    assert err.value.sqlstate == sqlstate and argument in str(err.value), err.value
    assert conn.execute("SELECT id, state FROM pgq.jobs ORDER BY id").fetchall() == before


# --- races ------------------------------------------------------------------------------------

@pytest.mark.parametrize("claim_ends", ["commit", "rollback"])
def test_replace_against_a_claim_in_flight_of_the_holder_never_waits_and_runs_after_it(dsn, claim_ends) -> None:
    """The claim locked the pending holder first: the replace does not wait for it (a producer never
    waits for a worker); the holder counts as started and a new job waits for it. Whether the claim
    commits or rolls back, the holder runs first with its payload, then the new job with the new."""
    with psycopg.connect(dsn, autocommit=True) as setup, psycopg.connect(dsn) as claimer, \
            psycopg.connect(dsn, autocommit=True) as producer:
        holder = enqueue(setup, payload={"n": 1})
        [claimed] = claim(claimer, queues=["q"])  # in claimer's open transaction
        assert claimed["id"] == holder
        producer.execute("SET lock_timeout = '2s'")
        successor = enqueue(producer, payload={"n": 2}, on_conflict="replace")
        assert successor != holder
        got = row(setup, successor)
        assert (got["state"], got["depends_on"], got["payload"]) == ("waiting", [holder], {"n": 2})
        getattr(claimer, claim_ends)()
        assert row(setup, holder)["payload"] == {"n": 1}
        if claim_ends == "rollback":
            [claimed] = claim(setup, queues=["q"])
            assert claimed["id"] == holder
        assert one(setup, "SELECT pgq.complete(%s, %s)", (holder, claimed["attempt"])) is True
        [after] = claim(setup, queues=["q"])
        assert after["id"] == successor and after["payload"] == {"n": 2}


def test_a_replace_in_flight_hides_the_holder_from_claims_until_it_commits(dsn) -> None:
    """The replace locked the pending holder first: a claim skips it (it never waits) and the next
    claim, after the replace's commit, gets the new payload."""
    with psycopg.connect(dsn, autocommit=True) as setup, psycopg.connect(dsn) as producer:
        holder = enqueue(setup, payload={"n": 1})
        assert enqueue(producer, payload={"n": 2}, on_conflict="replace") == holder  # open transaction
        assert claim(setup, queues=["q"]) == []
        producer.commit()
        [claimed] = claim(setup, queues=["q"])
        assert claimed["id"] == holder and claimed["payload"] == {"n": 2}


def test_two_replaces_behind_a_running_holder_take_turns_and_enqueue_one_successor(dsn) -> None:
    with psycopg.connect(dsn, autocommit=True) as setup, psycopg.connect(dsn) as first, \
            psycopg.connect(dsn, autocommit=True) as second, psycopg.connect(dsn, autocommit=True) as observer:
        holder = enqueue(setup, payload={"n": 0})
        [claimed] = claim(setup, queues=["q"])
        successor = enqueue(first, payload={"n": 1}, on_conflict="replace")  # open transaction
        pid = second.info.backend_pid
        thread, out = in_thread(lambda: enqueue(second, payload={"n": 2}, on_conflict="replace"))
        wait_for(lambda: waiting_for_lock(observer, pid), "the second replace waits for the first")
        # The holder's worker is not held by either: it renews and completes.
        assert one(setup, "SELECT pgq.renew(%s, %s)", (holder, claimed["attempt"])) is not None
        first.commit()
        thread.join(30)
        assert out.get("value") == successor, out
        assert one(setup, "SELECT pgq.complete(%s, %s)", (holder, claimed["attempt"])) is True
        jobs = live_jobs(setup)
        assert [(j["id"], j["state"], j["payload"]) for j in jobs] == [(successor, "pending", {"n": 2})]


def test_an_open_replace_behind_a_running_holder_does_not_hold_its_worker(dsn) -> None:
    with psycopg.connect(dsn, autocommit=True) as setup, psycopg.connect(dsn) as producer:
        setup.execute("SET lock_timeout = '2s'")
        holder = enqueue(setup, payload={"n": 0})
        [claimed] = claim(setup, queues=["q"])
        enqueue(producer, payload={"n": 1}, on_conflict="replace")  # open transaction
        assert one(setup, "SELECT pgq.progress(%s, %s, '{\"p\": 1}')", (holder, claimed["attempt"])) is True
        assert one(setup, "SELECT pgq.complete(%s, %s)", (holder, claimed["attempt"])) is True
        producer.rollback()
        assert live_jobs(setup) == []


def test_cancel_against_a_complete_one_wins_and_the_other_is_told(dsn) -> None:
    with psycopg.connect(dsn, autocommit=True) as setup, psycopg.connect(dsn) as admin, \
            psycopg.connect(dsn, autocommit=True) as worker, psycopg.connect(dsn, autocommit=True) as observer:
        job_id = enqueue(setup, key=None)
        attempt = run_one(setup, job_id)
        assert one(admin, "SELECT pgq.cancel(%s)", (job_id,)) is True  # open transaction
        pid = worker.info.backend_pid
        thread, out = in_thread(lambda: one(worker, "SELECT pgq.complete(%s, %s)", (job_id, attempt)))
        wait_for(lambda: waiting_for_lock(observer, pid), "the complete waits for the cancel")
        admin.commit()
        thread.join(30)
        assert out.get("value") is False, out
        assert row(setup, job_id)["state"] == "cancelled"
        # The other order: the complete first, then the cancel finds it done.
        job_id = enqueue(setup, key=None)
        attempt = run_one(setup, job_id)
        assert one(worker, "SELECT pgq.complete(%s, %s)", (job_id, attempt)) is True
        assert one(setup, "SELECT pgq.cancel(%s)", (job_id,)) is False
        assert row(setup, job_id)["state"] == "done"


def test_bulk_retry_against_workers_runs_every_job_to_done_once_per_attempt(dsn) -> None:
    """1,000 failed jobs retried 100 at a time while four workers claim and complete them, and a
    sampler checks that no job ever has two live owners: every job ends done, each retried once."""
    with psycopg.connect(dsn, autocommit=True) as setup:
        setup.execute("SELECT pgq.configure_queue('q', audit => true)")
        setup.execute("""
            INSERT INTO pgq.jobs (queue, kind, state, attempt, max_attempts, finished_at, last_event, last_error)
            SELECT 'q', 'k', 'failed', 1, 1, now(), 'failed', 'boom' FROM generate_series(1, 1000)""")
    stop = threading.Event()
    errors: list[BaseException] = []

    def work(name: str) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                while not stop.is_set():
                    for job in claim(c, worker=name, queues=["q"], batch=10):
                        assert one(c, "SELECT pgq.complete(%s, %s)", (job["id"], job["attempt"])) is True
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    def sample() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                while not stop.is_set():
                    assert one(c, "SELECT count(*) FROM pgq.jobs WHERE state = 'running' AND lease_until IS NULL") == 0
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(f"w{i}",)) for i in range(4)] + [threading.Thread(target=sample)]
    for t in threads:
        t.start()
    try:
        with psycopg.connect(dsn, autocommit=True) as admin:
            total = 0
            while (n := one(admin, "SELECT pgq.retry_jobs('q', 'failed', limit_rows => 100)")) > 0:
                total += n
            assert total == 1000
            wait_for(lambda: one(admin, "SELECT count(*) FROM pgq.jobs WHERE state = 'done'") == 1000,
                     "every retried job done", timeout=120)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not errors, errors
    with psycopg.connect(dsn, autocommit=True) as check:
        assert check.execute("""
            SELECT count(*) FILTER (WHERE e.event = 'retried'), count(*) FILTER (WHERE e.event = 'claimed'),
                   count(*) FILTER (WHERE e.event = 'completed')
            FROM pgq.job_events AS e""").fetchone() == (1000, 1000, 1000)
        assert one(check, "SELECT count(*) FROM pgq.jobs WHERE attempt <> 2") == 0


def test_many_replaces_and_claims_at_once_leave_at_most_one_job_not_started_per_key(dsn) -> None:
    """Eight producers replace ten keys while four workers claim and complete; a sampler checks,
    all along, that no key ever has more than two jobs that have not started (the second only while
    a claim of the first is in flight); the jobs of a key run one after the other, each once."""
    stop = threading.Event()
    errors: list[BaseException] = []
    keys = [f"key{i}" for i in range(10)]

    def produce(n: int) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                for i in range(150):
                    key = keys[(n + i) % len(keys)]
                    enqueue(c, key=key, payload={"p": n, "i": i, "key": key}, on_conflict="replace")
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    def work(name: str) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                while not stop.is_set():
                    jobs = claim(c, worker=name, queues=["q"], batch=2)
                    for job in jobs:
                        assert one(c, "SELECT pgq.complete(%s, %s)", (job["id"], job["attempt"])) is True
                    if not jobs:  # as a worker does when idle: what an end and an enqueue in flight left
                        c.execute("SELECT pgq.sweep()")
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    def sample() -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                while not stop.is_set():
                    worst = one(c, """
                        SELECT coalesce(max(n), 0) FROM (
                            SELECT count(*) AS n FROM pgq.jobs AS j
                            WHERE j.state IN ('pending', 'waiting')
                            GROUP BY j.payload->>'key') AS x""")
                    # One job of a key not started, and for an instant a second: a holder that a
                    # claim in flight locks counts as started, so a job is enqueued to wait for it.
                    assert worst <= 2, worst
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    with psycopg.connect(dsn, autocommit=True) as setup:
        setup.execute("SELECT pgq.configure_queue('q', audit => true)")
    producers = [threading.Thread(target=produce, args=(n,)) for n in range(8)]
    others = [threading.Thread(target=work, args=(f"w{i}",)) for i in range(4)] + [threading.Thread(target=sample)]
    for t in producers + others:
        t.start()
    for t in producers:
        t.join(300)
    try:
        with psycopg.connect(dsn, autocommit=True) as check:
            wait_for(lambda: one(check, "SELECT count(*) FROM pgq.jobs WHERE state <> 'done'") == 0,
                     "every job done", timeout=120)
    finally:
        stop.set()
        for t in others:
            t.join(60)
    assert not errors, errors
    with psycopg.connect(dsn, autocommit=True) as check:
        # The jobs of one key ran one after the other: each successor was claimed after what it
        # waited for had ended (by the events' clock_timestamp: claimed_at is its statement's start).
        assert one(check, """SELECT count(*) FROM pgq.jobs AS j CROSS JOIN LATERAL unnest(j.depends_on) AS d(id)
                             JOIN pgq.job_events AS c ON c.job_id = j.id AND c.event = 'claimed'
                             JOIN pgq.job_events AS e ON e.job_id = d.id AND e.event = 'completed'
                             WHERE c.at < e.at""") == 0
        assert one(check, "SELECT count(*) FROM pgq.jobs WHERE depends_on IS NOT NULL") > 0
        # No attempt ran twice, and no job was claimed by two workers.
        assert one(check, "SELECT count(*) FROM pgq.jobs WHERE attempt <> 1") == 0
        assert one(check, """SELECT count(*) FROM (SELECT job_id FROM pgq.job_events WHERE event = 'claimed'
                                                  GROUP BY job_id HAVING count(*) > 1) AS x""") == 0
