"""Per-key concurrency (issue 11): at most key_max_running jobs of one (queue, concurrency_key)
running at once, across all claimers; pgq.set_key_limit overrides it for one key."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter

import psycopg
import pytest

from sqlhelpers import LOWER_LEASE_FLOOR, claim, one, wait_for


def enqueue_keyed(conn: psycopg.Connection, queue: str, key: str | None, n: int, tenant: str | None = None) -> None:
    conn.execute("SELECT pgq.enqueue_many(%s, 'k', array_fill('{}'::jsonb, ARRAY[%s]), tenant => %s, "
                 "concurrency_key => %s)", (queue, n, tenant, key))


def running_per_key(conn: psycopg.Connection, queue: str) -> dict[str | None, int]:
    rows = conn.execute("SELECT concurrency_key, count(*) FROM pgq.jobs WHERE queue = %s AND state = 'running' "
                        "GROUP BY 1", (queue,)).fetchall()
    return {key: n for key, n in rows}


@pytest.mark.parametrize("fair", [False, True])
def test_many_concurrent_claimers_never_pass_a_key_limit(dsn: str, conn: psycopg.Connection, fair: bool) -> None:
    conn.execute("SELECT pgq.configure_queue('keyed', key_max_running => 2, audit => false, fair => %s)", (fair,))
    conn.execute("SELECT pgq.set_key_limit('keyed', 'big', 3)")
    limits = {"a": 2, "b": 2, "big": 3}
    for i, key in enumerate(["a", "b", "big"]):
        enqueue_keyed(conn, "keyed", key, 60, tenant=f"t{i % 2}")
    enqueue_keyed(conn, "keyed", None, 40, tenant="t0")
    total = 220
    stop = threading.Event()
    errors: list[BaseException] = []
    over: list[dict[str | None, int]] = []
    samples: list[int] = []
    unkeyed_seen: list[int] = []

    def claimer(seed: int) -> None:
        rng = random.Random(seed)
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                while not stop.is_set():
                    rows = c.execute("SELECT id, attempt FROM pgq.claim('w', '{keyed}', batch => 3)").fetchall()
                    if not rows:
                        time.sleep(0.002)
                    for job_id, attempt in rows:
                        time.sleep(rng.random() * 0.004)
                        c.execute("SELECT pgq.complete(%s, %s)", (job_id, attempt))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    def sampler() -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            while not stop.is_set():
                seen = running_per_key(c, "keyed")
                samples.append(1)
                unkeyed_seen.append(seen.get(None, 0))
                if any(n > limits[k] for k, n in seen.items() if k is not None):
                    over.append(seen)

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(8)] + [threading.Thread(target=sampler)]
    for t in threads:
        t.start()
    wait_for(lambda: one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'done'") == total and len(samples) > 50,
             f"all {total} jobs done and 50 samples taken", timeout=180)
    stop.set()
    for t in threads:
        t.join(timeout=30)
    assert not errors, errors
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'done'") == total
    assert not over, f"a key over its limit: {over[:5]}"


def test_many_claimers_at_once_get_at_most_the_key_limit_together(dsn: str, conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('keyed', key_max_running => 2)")
    enqueue_keyed(conn, "keyed", "a", 50)
    barrier = threading.Barrier(8)
    held: list[list[tuple[int, int]]] = [[] for _ in range(8)]

    def first_claim(i: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as c:
            barrier.wait(30)
            held[i] = c.execute("SELECT id, attempt FROM pgq.claim('w', '{keyed}', batch => 2)").fetchall()

    starters = [threading.Thread(target=first_claim, args=(i,)) for i in range(8)]
    for t in starters:
        t.start()
    for t in starters:
        t.join(timeout=60)
    assert 1 <= sum(len(h) for h in held) <= 2, held
    held.append(conn.execute("SELECT id, attempt FROM pgq.claim('w', '{keyed}', batch => 5)").fetchall())
    assert sum(len(h) for h in held) == 2, held


def test_a_full_key_never_blocks_other_keys(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('keyed', key_max_running => 1)")
    enqueue_keyed(conn, "keyed", "a", 4)  # the oldest 4 jobs share key a
    [first] = claim(conn, queues=["keyed"])  # key a is now full; its next 3 jobs are the oldest
    assert one(conn, "SELECT concurrency_key FROM pgq.jobs WHERE id = %s", (first["id"],)) == "a"
    for key in "bcdefghijklm":
        enqueue_keyed(conn, "keyed", key, 1)
    got = claim(conn, queues=["keyed"], batch=10)
    keys = [one(conn, "SELECT concurrency_key FROM pgq.jobs WHERE id = %s", (c["id"],)) for c in got]
    assert keys == list("bcdefghijk")


def test_a_batch_takes_only_a_keys_free_slots_and_fills_up_with_other_keys(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('keyed', key_max_running => 2)")
    enqueue_keyed(conn, "keyed", "a", 5)
    enqueue_keyed(conn, "keyed", "b", 5)
    enqueue_keyed(conn, "keyed", None, 3)
    claim(conn, queues=["keyed"], batch=10)
    assert running_per_key(conn, "keyed") == {"a": 2, "b": 2, None: 3}
    assert claim(conn, queues=["keyed"], batch=10) == []  # both keys full, no unkeyed job left


def test_jobs_without_a_key_are_not_limited(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('keyed', key_max_running => 1)")
    enqueue_keyed(conn, "keyed", None, 6)
    assert len(claim(conn, queues=["keyed"], batch=6)) == 6


def test_set_key_limit_overrides_the_queue_default_and_null_removes_it(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('keyed', key_max_running => 1)")
    assert one(conn, "SELECT pgq.set_key_limit('keyed', 'big', 3)") == 3
    enqueue_keyed(conn, "keyed", "big", 6)
    enqueue_keyed(conn, "keyed", "small", 6)
    claim(conn, queues=["keyed"], batch=10)
    assert running_per_key(conn, "keyed") == {"big": 3, "small": 1}
    assert one(conn, "SELECT pgq.set_key_limit('keyed', 'big', NULL)") == 1  # back to the queue's default
    conn.execute("UPDATE pgq.jobs SET state = 'pending', lease_until = NULL WHERE state = 'running'")
    claim(conn, queues=["keyed"], batch=10)
    assert running_per_key(conn, "keyed") == {"big": 1, "small": 1}


def test_an_override_limits_a_key_on_a_queue_without_a_default(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('q')")
    conn.execute("SELECT pgq.set_key_limit('q', 'slow', 1)")
    enqueue_keyed(conn, "q", "slow", 3)
    enqueue_keyed(conn, "q", "fast", 3)
    claim(conn, queues=["q"], batch=10)
    assert running_per_key(conn, "q") == {"slow": 1, "fast": 3}
    # And removing the last override makes the queue a plain one again.
    conn.execute("SELECT pgq.set_key_limit('q', 'slow', NULL)")
    assert one(conn, "SELECT key_limited FROM pgq.queues WHERE name = 'q'") is False


def test_key_limits_work_with_max_running(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('keyed', key_max_running => 2, max_running => 3)")
    enqueue_keyed(conn, "keyed", "a", 5)
    enqueue_keyed(conn, "keyed", "b", 5)
    assert len(claim(conn, queues=["keyed"], batch=10)) == 3
    assert running_per_key(conn, "keyed") == {"a": 2, "b": 1}


def test_key_limits_work_with_fair_mode(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('keyed', key_max_running => 1, fair => true)")
    enqueue_keyed(conn, "keyed", "a", 4, tenant="t1")
    enqueue_keyed(conn, "keyed", "b", 4, tenant="t1")
    enqueue_keyed(conn, "keyed", "c", 4, tenant="t2")
    got = claim(conn, queues=["keyed"], batch=10)
    assert running_per_key(conn, "keyed") == {"a": 1, "b": 1, "c": 1}
    assert Counter(c["tenant"] for c in got) == {"t1": 2, "t2": 1}


def test_a_claim_across_queues_mixes_keyed_and_plain_queues(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('keyed', key_max_running => 1)")
    enqueue_keyed(conn, "keyed", "a", 3)
    conn.execute("SELECT pgq.enqueue_many('plain', 'k', array_fill('{}'::jsonb, ARRAY[3]))")
    got = claim(conn, queues=["keyed", "plain"], batch=10)
    assert sorted(c["queue"] for c in got) == ["keyed", "plain", "plain", "plain"]
    got = claim(conn, queues=None, batch=10)
    assert got == []


def test_kinds_and_key_limits(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('keyed', key_max_running => 1)")
    conn.execute("SELECT pgq.enqueue('keyed', 'x', concurrency_key => 'a')")
    conn.execute("SELECT pgq.enqueue('keyed', 'y', concurrency_key => 'a')")
    conn.execute("SELECT pgq.enqueue('keyed', 'y', concurrency_key => 'b')")
    got = conn.execute("SELECT kind FROM pgq.claim('w', '{keyed}', batch => 10, kinds => '{y}')").fetchall()
    assert got == [("y",), ("y",)]
    assert running_per_key(conn, "keyed") == {"a": 1, "b": 1}


def test_enqueue_stores_the_key(conn: psycopg.Connection) -> None:
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k', concurrency_key => 'cust-1')")
    assert one(conn, "SELECT concurrency_key FROM pgq.jobs WHERE id = %s", (job_id,)) == "cust-1"
    assert one(conn, "SELECT concurrency_key FROM pgq.get_job(%s)", (job_id,)) == "cust-1"


@pytest.mark.parametrize("call, argument, sqlstate", [
    ("SELECT pgq.enqueue('q', 'k', concurrency_key => '')", "concurrency_key", "22023"),
    ("SELECT pgq.enqueue('q', 'k', concurrency_key => repeat('x', 257))", "concurrency_key", "22023"),
    ("SELECT pgq.enqueue_many('q', 'k', ARRAY['{}']::jsonb[], concurrency_key => '')", "concurrency_key", "22023"),
    ("SELECT pgq.configure_queue('q', key_max_running => -1)", "key_max_running", "22023"),
    ("SELECT pgq.configure_queue('q', key_max_running => 100001)", "key_max_running", "22023"),
    ("SELECT pgq.set_key_limit(NULL, 'a', 1)", "queue", "22004"),
    ("SELECT pgq.set_key_limit('bad name', 'a', 1)", "queue", "22023"),
    ("SELECT pgq.set_key_limit('q', NULL, 1)", "key", "22004"),
    ("SELECT pgq.set_key_limit('q', '', 1)", "key", "22023"),
    ("SELECT pgq.set_key_limit('q', repeat('x', 257), 1)", "key", "22023"),
    ("SELECT pgq.set_key_limit('q', 'a', -1)", "max_running", "22023"),
    ("SELECT pgq.set_key_limit('q', 'a', 100001)", "max_running", "22023"),
])
def test_bad_arguments_are_refused_and_write_nothing(conn: psycopg.Connection, call: str, argument: str,
                                                     sqlstate: str) -> None:
    with pytest.raises(psycopg.Error) as err:
        conn.execute(call)
    assert err.value.sqlstate == sqlstate and f'"{argument}"' in err.value.diag.message_primary
    assert one(conn, "SELECT count(*) FROM pgq.queues") == 0
    assert one(conn, "SELECT count(*) FROM pgq.jobs") == 0
    assert one(conn, "SELECT count(*) FROM pgq.key_limits") == 0


def test_set_key_limit_of_a_queue_that_does_not_exist_is_refused_and_creates_nothing(conn: psycopg.Connection) -> None:
    """Issue 24: it created the queue (a typo made a new, empty queue with a key limit); pause,
    grant_queue and drop_queue refuse such a queue with 22023, and so does it now."""
    conn.execute("SELECT pgq.configure_queue('exports')")
    before = conn.execute("SELECT (SELECT count(*) FROM pgq.queues), (SELECT count(*) FROM pgq.key_limits)").fetchone()
    for max_running in (2, 0, None):
        with pytest.raises(psycopg.errors.InvalidParameterValue) as refused:
            conn.execute("SELECT pgq.set_key_limit('exprots', 'acme', %s)", (max_running,))
        assert refused.value.diag.message_primary == "pgq: argument \"queue\" names no queue: 'exprots'"
        assert "pgq.configure_queue" in (refused.value.diag.message_hint or "")
    assert conn.execute("SELECT (SELECT count(*) FROM pgq.queues), (SELECT count(*) FROM pgq.key_limits)"
                        ).fetchone() == before
    assert one(conn, "SELECT pgq.set_key_limit('exports', 'acme', 2)") == 2  # an existing queue still works


def test_a_queue_without_key_limits_never_reads_them(conn: psycopg.Connection) -> None:
    """The hot path of a plain queue: its claim reads neither pgq.key_limits nor counts keys (the
    queue row says it has no key limit; only a key-limited queue takes the extra step)."""
    conn.execute("SELECT pgq.configure_queue('other')")
    conn.execute("SELECT pgq.set_key_limit('other', 'a', 1)")  # key limits exist, on another queue
    conn.execute("SELECT pgq.enqueue_many('plain', 'k', array_fill('{}'::jsonb, ARRAY[20]), "
                 "concurrency_key => 'a')")
    conn.execute("SELECT pg_stat_force_next_flush()")

    def scans() -> int:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        return one(conn, "SELECT coalesce(seq_scan, 0) + coalesce(idx_scan, 0) FROM pg_stat_user_tables "
                         "WHERE relid = 'pgq.key_limits'::regclass")

    before = scans()
    for _ in range(5):
        assert len(claim(conn, queues=["plain"], batch=4)) == 4
    conn.execute("SELECT pg_stat_force_next_flush()")
    assert scans() == before
    # ...while a key-limited queue's claim does read them (so the check above can fail).
    conn.execute("SELECT pgq.enqueue('other', 'k', concurrency_key => 'a')")
    assert len(claim(conn, queues=["other"])) == 1
    conn.execute("SELECT pg_stat_force_next_flush()")
    assert scans() > before


def test_key_max_running_zero_without_overrides_makes_the_queue_plain_again(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('keyed', key_max_running => 1)")
    assert one(conn, "SELECT key_limited FROM pgq.queues WHERE name = 'keyed'") is True
    conn.execute("SELECT pgq.set_key_limit('keyed', 'a', 2)")
    conn.execute("SELECT pgq.configure_queue('keyed', key_max_running => 0)")
    assert one(conn, "SELECT key_limited FROM pgq.queues WHERE name = 'keyed'") is True  # the override
    conn.execute("SELECT pgq.set_key_limit('keyed', 'a', NULL)")
    assert one(conn, "SELECT key_limited FROM pgq.queues WHERE name = 'keyed'") is False
    enqueue_keyed(conn, "keyed", "a", 4)
    assert len(claim(conn, queues=["keyed"], batch=4)) == 4


def test_an_override_of_zero_frees_one_key_of_the_queues_limit(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('keyed', key_max_running => 1)")
    assert one(conn, "SELECT pgq.set_key_limit('keyed', 'internal', 0)") == 0
    enqueue_keyed(conn, "keyed", "internal", 4)
    enqueue_keyed(conn, "keyed", "customer", 4)
    claim(conn, queues=["keyed"], batch=10)
    assert running_per_key(conn, "keyed") == {"internal": 4, "customer": 1}


def test_a_key_limited_claim_outside_read_committed_is_refused(dsn: str, conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('keyed', key_max_running => 1)")
    enqueue_keyed(conn, "keyed", "a", 1)
    with psycopg.connect(dsn) as tx:
        tx.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        with pytest.raises(psycopg.Error) as err:
            tx.execute("SELECT * FROM pgq.claim('w', '{keyed}')")
        assert err.value.sqlstate == "55000" and "READ COMMITTED" in err.value.diag.message_primary
        tx.rollback()
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'running'") == 0


def test_an_expired_lease_keeps_its_keys_slot_until_recovered(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('keyed', key_max_running => 1)")
    enqueue_keyed(conn, "keyed", "a", 2)
    [held] = claim(conn, queues=["keyed"])
    conn.execute("UPDATE pgq.jobs SET lease_until = now() - interval '1 second' WHERE id = %s", (held["id"],))
    conn.execute(LOWER_LEASE_FLOOR)
    [again] = claim(conn, queues=["keyed"], batch=5)  # recovered first, then the key's one slot
    assert running_per_key(conn, "keyed") == {"a": 1}
    assert again["id"] == held["id"] and again["attempt"] == 2


def keys_of(conn: psycopg.Connection, rows: list[dict]) -> list[str | None]:
    return [one(conn, "SELECT concurrency_key FROM pgq.jobs WHERE id = %s", (r["id"],)) for r in rows]


@pytest.mark.parametrize("fair", [False, True])
def test_claims_of_different_keys_run_side_by_side(dsn: str, conn: psycopg.Connection, fair: bool) -> None:
    """Issue 25: a claim that holds key a (its transaction still open) takes no lock of the queue:
    another claim takes key b's jobs meanwhile, at once (it used to skip the whole queue)."""
    conn.execute("SELECT pgq.configure_queue('keyed', key_max_running => 1, fair => %s)", (fair,))
    enqueue_keyed(conn, "keyed", "a", 3, tenant="t1")
    enqueue_keyed(conn, "keyed", "b", 3, tenant="t2")
    with psycopg.connect(dsn) as first:  # a transaction left open after its claim
        [held] = claim(first, queues=["keyed"])
        assert one(conn, "SELECT concurrency_key FROM pgq.jobs WHERE id = %s", (held["id"],)) == "a"
        with psycopg.connect(dsn, autocommit=True) as second:
            second.execute("SET statement_timeout = '10s'")  # a wait would fail here, not hang
            got = claim(second, queues=["keyed"], batch=5)
            assert keys_of(conn, got) == ["b"]
        first.rollback()
    assert keys_of(conn, claim(conn, queues=["keyed"], batch=5)) == ["a"]  # a's slot is free again


def test_a_key_another_claim_holds_is_skipped_for_this_call(dsn: str, conn: psycopg.Connection) -> None:
    """While a claim of key a has not committed, another claim cannot count a's running jobs (the
    first claim's are not visible yet): it leaves a out for this call, even with a free slot, and
    takes the other keys' jobs; once the first commits, a's free slot is claimable again."""
    conn.execute("SELECT pgq.configure_queue('keyed', key_max_running => 2)")
    enqueue_keyed(conn, "keyed", "a", 4)
    enqueue_keyed(conn, "keyed", "b", 1)
    with psycopg.connect(dsn) as first:
        assert keys_of(conn, claim(first, queues=["keyed"])) == ["a"]
        with psycopg.connect(dsn, autocommit=True) as second:
            second.execute("SET statement_timeout = '10s'")
            assert keys_of(conn, claim(second, queues=["keyed"], batch=5)) == ["b"]
            first.commit()
            assert keys_of(conn, claim(second, queues=["keyed"], batch=5)) == ["a"]  # its second slot
    assert running_per_key(conn, "keyed") == {"a": 2, "b": 1}


def test_a_capped_queue_still_takes_turns_with_key_limits(dsn: str, conn: psycopg.Connection) -> None:
    """max_running is the queue's own count: its claims still hold the queue row (skipped by the
    others while held), key limits or not."""
    conn.execute("SELECT pgq.configure_queue('keyed', key_max_running => 1, max_running => 5)")
    enqueue_keyed(conn, "keyed", "a", 2)
    enqueue_keyed(conn, "keyed", "b", 2)
    with psycopg.connect(dsn) as first:
        assert keys_of(conn, claim(first, queues=["keyed"])) == ["a"]
        with psycopg.connect(dsn, autocommit=True) as second:
            assert claim(second, queues=["keyed"], batch=5) == []
        first.commit()
    assert keys_of(conn, claim(conn, queues=["keyed"], batch=5)) == ["b"]


def test_a_claim_of_one_whose_first_key_another_claim_holds_takes_the_next_key(dsn: str,
                                                                               conn: psycopg.Connection) -> None:
    """Claimers of one job each, at once (a worker's slots, several workers): the one whose first
    candidate's key another claim holds takes the next key's job, not nothing."""
    conn.execute("SELECT pgq.configure_queue('keyed', key_max_running => 1)")
    enqueue_keyed(conn, "keyed", "a", 3)
    enqueue_keyed(conn, "keyed", "b", 1)
    with psycopg.connect(dsn) as first:
        assert keys_of(conn, claim(first, queues=["keyed"])) == ["a"]
        with psycopg.connect(dsn, autocommit=True) as second:
            second.execute("SET statement_timeout = '10s'")
            assert keys_of(conn, claim(second, queues=["keyed"], batch=1)) == ["b"]
        first.rollback()


def test_sweep_prunes_old_key_rows_and_keeps_one_for_a_key_with_pending_jobs(conn: psycopg.Connection) -> None:
    """A key's rows in pgq.key_locks (made by its enqueues: a few when enqueues of a new key meet)
    are pruned once an hour old: gone for a key without pending jobs, one fresh row for a key with
    some, whose claims still hold it."""
    conn.execute("SELECT pgq.configure_queue('keyed', key_max_running => 1)")
    enqueue_keyed(conn, "keyed", "busy", 2)
    enqueue_keyed(conn, "keyed", "idle", 1)
    [idle] = [c for c in claim(conn, queues=["keyed"], batch=5) if keys_of(conn, [c]) == ["idle"]]
    conn.execute("SELECT pgq.complete(%s, %s)", (idle["id"], idle["attempt"]))
    conn.execute("INSERT INTO pgq.key_locks (queue, key, made_by) VALUES ('keyed', 'busy', '1')")  # a second row
    assert one(conn, "SELECT count(*) FROM pgq.key_locks WHERE key = 'busy'") == 2
    conn.execute("SELECT pgq.sweep()")  # nothing is an hour old yet
    assert one(conn, "SELECT count(*) FROM pgq.key_locks") == 3
    conn.execute("UPDATE pgq.key_locks SET made_at = now() - interval '2 hours'")
    conn.execute("SELECT pgq.sweep()")
    rows = conn.execute("SELECT key, made_at > now() - interval '1 minute' FROM pgq.key_locks").fetchall()
    assert rows == [("busy", True)]
    running = running_per_key(conn, "keyed")
    assert running == {"busy": 1}  # its other job waits for the one running
    assert claim(conn, queues=["keyed"], batch=5) == []
