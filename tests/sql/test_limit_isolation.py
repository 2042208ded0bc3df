"""Issue 37, items 3, 4 and 9 (key limits, rate limits, session settings): no login can hold, forge or
guess its way into another's work through a queue's limits. Each attacker here is a LOGIN role of
its own, with the pgq roles it needs and nothing else:

* a key held back is only that key, in that queue: a key of another queue never shares its lock
  (keys used to share 16,384 hash slots across every queue, so any login could find a key of its own
  queue on another queue's key's slot), and a transaction holding thousands of keys holds only those;
* a worker's open transaction holds back at most the tokens it spent, never the rest of a queue's
  rate (its claims used to hold the shards of the queue's bucket, and so their refill, to its end);
* no session setting changes what a claim does (pgq.key_walk, pgq.fence used to carry state)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from sqlhelpers import claim, one, wait_for

ATTACKER, VICTIM = "pgq_t_iso_mallory", "pgq_t_iso_alice"
LOGINS = {ATTACKER: ["pgq_producer", "pgq_worker"], VICTIM: ["pgq_producer", "pgq_worker"]}
STEP = 100000  # pgq._fence_step()

Login = Callable[..., psycopg.Connection]


@pytest.fixture
def login(conn: psycopg.Connection, dsn: str) -> Iterator[Login]:
    """login(name, autocommit=True) connects as that LOGIN role (roles are cluster-wide: made once)."""
    for name, member_of in LOGINS.items():
        if conn.execute("SELECT FROM pg_roles WHERE rolname = %s", (name,)).fetchone() is None:
            try:
                conn.execute(f"CREATE ROLE {name} LOGIN")
            except (psycopg.errors.DuplicateObject, psycopg.errors.UniqueViolation):
                pass  # another database of the session's server made it meanwhile
        for role in member_of:
            conn.execute(f"GRANT {role} TO {name}")
    opened: list[psycopg.Connection] = []

    def _login(name: str, autocommit: bool = True) -> psycopg.Connection:
        c = psycopg.connect(make_conninfo(dsn, user=name), autocommit=autocommit)
        c.execute("SET statement_timeout = '20s'")  # a claim that waited would fail here, not hang
        if not autocommit:
            c.commit()
        opened.append(c)
        return c

    yield _login
    for c in opened:
        c.close()


def keys_of(conn: psycopg.Connection, rows: list[dict]) -> list[str | None]:
    return [one(conn, "SELECT concurrency_key FROM pgq.jobs WHERE id = %s", (r["id"],)) for r in rows]


def old_slot(queue: str, key: str) -> str:
    """The hash slot that pgq.key_slots gave (queue, key) up to schema version 19, as SQL."""
    return f"hashtextextended({queue} || chr(31) || {key}, 0) & 16383"


# 3. Keys: a key held back is only that key, in that queue -------------------------------------------


def test_a_key_of_another_queue_that_hashed_to_the_same_slot_is_not_held_back(conn, login):
    """The issue's reproduction: mallory finds, in one SELECT, a key of her own queue on the slot of
    alice's key; her worker's open claim of it used to hold alice's key back."""
    conn.execute("SELECT pgq.configure_queue('alice', key_max_running => 1)")
    conn.execute("SELECT pgq.configure_queue('mallory', key_max_running => 1)")
    conn.execute("SELECT pgq.grant_queue('alice', %s, 'claim')", (VICTIM,))
    twin = one(conn, f"SELECT 'k' || g FROM generate_series(1, 1000000) AS g "
                     f"WHERE {old_slot(chr(39) + 'mallory' + chr(39), chr(39) + 'k' + chr(39) + ' || g')}"
                     f" = {old_slot(chr(39) + 'alice' + chr(39), chr(39) + 'customer-7' + chr(39))} LIMIT 1")
    mallory = login(ATTACKER, autocommit=False)
    mallory.execute("SELECT pgq.enqueue('mallory', 'k', concurrency_key => %s)", (twin,))
    mallory.commit()
    assert keys_of(conn, claim(mallory, "mallory-1", ["mallory"])) == [twin]  # held: her transaction stays open
    alice = login(VICTIM)
    job_id = one(alice, "SELECT pgq.enqueue('alice', 'k', concurrency_key => 'customer-7')")
    assert [r["id"] for r in claim(alice, "alice-1", ["alice"])] == [job_id]
    mallory.rollback()


def test_a_transaction_holding_every_old_slot_holds_back_no_other_queues_keys(conn, login):
    """One transaction claims a job of 16,384 keys that cover every old slot (17 claims): every
    key-limited and key-rate-limited claim of every other queue, restricted ones included, used to
    come back empty meanwhile, and pgq.health said nothing. Now it holds its own keys only, and
    pgq.health names it."""
    conn.execute("SELECT pgq.configure_queue('hoard', key_max_running => 1, audit => false)")
    conn.execute(f"SELECT pgq.enqueue('hoard', 'k', concurrency_key => key) FROM ("
                 f"SELECT DISTINCT ON ({old_slot(chr(39) + 'hoard' + chr(39), 'k.key')}) k.key "
                 f"FROM generate_series(1, 400000) AS g CROSS JOIN LATERAL (SELECT 'h' || g AS key) AS k) AS s")
    assert one(conn, f"SELECT count(DISTINCT {old_slot('queue', 'concurrency_key')}) FROM pgq.jobs") == 16384
    conn.execute("SELECT pgq.configure_queue('limited', key_max_running => 1)")
    conn.execute("SELECT pgq.configure_queue('rated', key_rate_limit => 5)")
    conn.execute("SELECT pgq.configure_queue('private', key_max_running => 2)")
    conn.execute("SELECT pgq.grant_queue('private', %s, 'claim')", (VICTIM,))
    victims = {q: one(conn, "SELECT pgq.enqueue(%s, 'k', concurrency_key => 'acme')", (q,))
               for q in ("limited", "rated", "private")}

    mallory = login(ATTACKER, autocommit=False)
    held = sum(len(claim(mallory, f"hoarder-{n}", ["hoard"], batch=1000)) for n in range(17))
    assert held == 16384
    alice = login(VICTIM)
    for queue, job_id in victims.items():
        assert [r["id"] for r in claim(alice, "alice-1", [queue])] == [job_id], queue
    # ...while the hoarder's own keys stay its own: another claim of the queue gets none of them.
    assert claim(alice, "alice-2", ["hoard"], batch=10) == []

    pid = mallory.info.backend_pid
    found = wait_for(lambda: [r for r in conn.execute(
        "SELECT severity, detail FROM pgq.health(max_snapshot_age => '1 second') WHERE \"check\" = 'held_keys'")
        if f"pid {pid}" in r[1]], "pgq.health to name the transaction that holds the keys")
    assert "16384 key" in found[0][1], found
    mallory.rollback()
    rows = conn.execute("SELECT severity FROM pgq.health() WHERE \"check\" = 'held_keys'").fetchall()
    assert rows == [("ok",)]


# 4. Rates: an open transaction holds back at most the tokens it spent -------------------------------


def test_an_open_transaction_holds_back_at_most_the_tokens_it_spent(dsn, conn, login):
    """The issue's reproduction: on a 16-shard 1,600/s queue, BEGIN; claim(batch => 1000) twice, then
    idle: other workers got nothing while the tokens came back. Now four other claimers take the
    rate as it comes back, and a sampler of what they were granted never sees more than the rate."""
    rate = 1600
    conn.execute("SELECT pgq.configure_queue('api', rate_limit => %s, audit => false)", (rate,))
    conn.execute("SELECT pgq.enqueue_many('api', 'k', array_fill('{}'::jsonb, ARRAY[20000]))")
    mallory = login(ATTACKER, autocommit=False)
    start = time.monotonic()
    spent = sum(len(claim(mallory, "hoarder", ["api"], batch=1000)) for _ in range(2))
    assert spent >= rate  # the burst, and what came back between its two claims
    granted: list[int] = [0] * 4
    stop = threading.Event()
    errors: list[BaseException] = []

    def claimer(i: int) -> None:
        try:
            with psycopg.connect(make_conninfo(dsn, user=VICTIM), autocommit=True) as c:
                c.execute("SET statement_timeout = '20s'")
                while not stop.is_set():
                    granted[i] += len(c.execute("SELECT id FROM pgq.claim('w', '{api}', batch => 50)").fetchall())
                    time.sleep(0.005)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    samples: list[tuple[float, int]] = []
    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    try:
        def sampled() -> bool:
            samples.append((time.monotonic() - start, sum(granted)))
            return sum(granted) >= rate or bool(errors)
        wait_for(sampled, "the other claimers to be granted a second's worth of tokens", timeout=30)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    mallory.rollback()
    assert not errors, errors
    # Never more than the rate: what the others got by t is at most what the bucket gave out by t
    # (its burst, then the rate, from just before the hoarder's first claim), less what the hoarder
    # spent, give or take the claims in flight when the sample was taken.
    over = [(t, n) for t, n in samples if n > rate + rate * t - spent + 4 * 50]
    assert not over, over[:5]
    # ...and no less, but for what the hoarder holds beyond what it spent (the rest of the slices it
    # took from: fewer than a block of tokens, 112 at this rate) and the claims in flight: the
    # others take the tokens as they come, not only once the hoarder's slices have left the window.
    t, n = samples[-1]
    assert n >= rate + rate * t - spent - 112 - 4 * 50 - 300, samples


# 9. Session settings change nothing -----------------------------------------------------------------


def test_a_forged_pgq_key_walk_changes_no_claim(conn, login):
    """pgq.key_walk said where a session's last walk of a queue's keys stopped; any caller could set
    it, and the walk then started where the caller said."""
    conn.execute("SELECT pgq.configure_queue('keyed', key_max_running => 1)")
    conn.execute("SELECT pgq.enqueue_many('keyed', 'k', array_fill('{}'::jsonb, ARRAY[40]), concurrency_key => 'a')")
    for key in "bcdefghijklmnopqrstuvwxyz":
        conn.execute("SELECT pgq.enqueue('keyed', 'k', concurrency_key => %s)", (key,))
    assert keys_of(conn, claim(conn, "w", ["keyed"])) == ["a"]  # a is full; its jobs hold the head
    worker = login(VICTIM, autocommit=False)

    def first_key(setting: str | None) -> list[str | None]:
        if setting is not None:
            worker.execute("SELECT set_config('pgq.key_walk', %s, false)", (setting,))
        got = keys_of(conn, claim(worker, "w", ["keyed"]))
        worker.rollback()  # the claim (and, in the transaction, the setting) undone
        return got

    honest = first_key(None)
    for forged in ["keyed" + chr(31) + "m", "keyed" + chr(31) + "zzz", "keyed" + chr(31), "junk"]:
        assert first_key(forged) == honest, forged


def test_a_forged_pgq_fence_setting_skips_no_fence_check(conn, login):
    """pgq.fence marked a session whose fences had been checked: a session that set it skipped the
    check, and after a promotion its claims issued the old primary's attempt numbers again."""
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k')")
    conn.execute("UPDATE pgq.fence SET timeline = pgq._timeline() - 1")  # as if promoted
    worker = login(VICTIM)
    worker.execute("SELECT set_config('pgq.fence', %s, false)", (str(one(conn, "SELECT pgq._timeline()")),))
    [claimed] = claim(worker, "w")
    assert (claimed["id"], claimed["attempt"]) == (job_id, 1 + STEP)
    assert one(conn, "SELECT moves FROM pgq.fence") == 1
