"""Issue 37 (items 1, 2, 5 and 9): no login can hold, forge or guess its way into another's work.

- pgq takes no advisory lock: any login of the database may take any advisory key (a login with
  CONNECT only, no pgq role at all, included), so a key pgq used was a lock anyone could hold. The
  rows pgq locks are in its own tables, which only the schema owner can lock; every wait it takes
  on something another transaction may hold is SKIP LOCKED or bounded by a lock_timeout.
- A batch is its opener's: only the opener's login and the logins it names may join it; no
  member's end waits for a producer's transaction (or a stranger's); the opener's and an admin's
  close and cancel are bounded.
- No session setting changes what a pgq function does (pgq.batch_counting and pgq.batch_shard
  were channels a worker's session could write).

Every hostile call is made by a LOGIN role of its own. Waits are seen through pg_blocking_pids()
(or a lock_timeout error on the victim's side), never guessed by sleeping."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from loginkit import ALICE, BOSS, MALLORY, PROD, PROD2, WATCH, WRITERS, _ensure_role
from sqlhelpers import claim, hold_every_key, one, squatter_session

#: Producers a batch's opener names as joiners, or not.
JOINER, OUTSIDER = "pgq_t_joiner", "pgq_t_outsider"

#: How long a victim's session lets any wait last before it fails (55P03): a call that waited for
#: the squatter fails the test quickly instead of hanging it.
VICTIM_LOCK_TIMEOUT = "3s"


# Helpers ------------------------------------------------------------------------------------------


class Call:
    """A statement run on ``conn`` in a thread of its own, watched from ``su`` through
    pg_blocking_pids() by another thread from its start to its end: ``waited_for`` collects every
    session it was seen waiting for."""

    def __init__(self, su: psycopg.Connection, conn: psycopg.Connection, sql: str, params: Any = None) -> None:
        self.su, self.pid = su, conn.info.backend_pid
        self.rows: list[tuple[Any, ...]] | None = None
        self.error: psycopg.Error | None = None
        self.waited_for: set[int] = set()
        self._thread = threading.Thread(target=self._run, args=(conn, sql, params), daemon=True)
        self._watcher = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        self._watcher.start()

    def _run(self, conn: psycopg.Connection, sql: str, params: Any) -> None:
        try:
            cur = conn.execute(sql, params)
            self.rows = cur.fetchall() if cur.description is not None else []
        except psycopg.Error as exc:
            self.error = exc

    def _watch(self) -> None:
        while self._thread.is_alive():
            self.waited_for.update(one(self.su, "SELECT pg_blocking_pids(%s)", (self.pid,)))
            self._thread.join(0.005)

    def watch(self, timeout: float = 30.0) -> Call:
        """Until the call ends; a call still running after ``timeout`` seconds is cancelled and
        fails the test."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            self.su.execute("SELECT pg_cancel_backend(%s)", (self.pid,))
            self._thread.join(10)
            pytest.fail(f"the call did not end within {timeout}s (waiting for {sorted(self.waited_for)})")
        self._watcher.join()
        return self

    @property
    def value(self) -> Any:
        if self.error is not None:
            raise self.error
        assert self.rows is not None and len(self.rows) == 1, self.rows
        return self.rows[0][0]


def never_waits(su: psycopg.Connection, conn: psycopg.Connection, sql: str, params: Any = None) -> Any:
    """The statement's single value; fails the test if it is ever seen waiting for another session."""
    call = Call(su, conn, sql, params).watch()
    assert not call.waited_for, f"{sql!r} waited for the sessions {sorted(call.waited_for)}"
    return call.value


def victim(open_login: Callable[..., psycopg.Connection], name: str, autocommit: bool = True) -> psycopg.Connection:
    """A login's session whose waits end after VICTIM_LOCK_TIMEOUT."""
    c = open_login(name, autocommit)
    c.execute(f"SET lock_timeout = '{VICTIM_LOCK_TIMEOUT}'")
    if not autocommit:
        c.commit()
    return c


@pytest.fixture
def squatter(conn: psycopg.Connection, login: Callable[..., psycopg.Connection]) -> psycopg.Connection:  # noqa: F811
    """A CONNECT-only login's session (TESTING item 38), with every pgq.* setting set in it."""
    return squatter_session(conn, login)


def callbacks(su: psycopg.Connection, batch: int) -> list[dict[str, Any]]:
    return [{"id": r[0], "state": r[1], "meta": r[2]} for r in su.execute(
        "SELECT id, state::text, meta FROM pgq.jobs WHERE meta -> 'batch' ->> 'id' = %s ORDER BY id", (str(batch),))]


def members_of(su: psycopg.Connection, batch: int) -> list[int]:
    return [r[0] for r in su.execute("SELECT id FROM pgq.jobs WHERE batch_id = %s ORDER BY id", (batch,))]


# 1. No advisory lock: a squatter holds up nothing ----------------------------------------------------


def test_no_pgq_function_takes_an_advisory_lock_or_reads_a_batch_setting(conn):
    found = conn.execute(
        "SELECT p.proname FROM pg_proc AS p WHERE p.pronamespace = 'pgq'::regnamespace"
        " AND (p.prosrc ~ 'pg_(try_)?advisory_' OR p.prosrc ~ 'pgq\\.batch_(counting|shard)') ORDER BY 1").fetchall()
    assert found == []


def test_enqueues_never_wait_for_a_squatter_holding_the_queues_key(conn, login, squatter):  # noqa: F811
    hold_every_key(squatter, ["sq", "new-queue"], range(0), [])
    producer = victim(login, PROD)
    assert never_waits(conn, producer, "SELECT pgq.enqueue('sq', 'k')") > 0
    assert never_waits(conn, producer,
                       "SELECT count(*) FROM pgq.enqueue_many('sq', 'k', ARRAY['{}', '{}']::jsonb[])") == 2
    assert never_waits(conn, producer, "SELECT count(*) FROM pgq.enqueue_many('sq', 'k', ARRAY['{}']::jsonb[],"
                                       " unique_keys => ARRAY['u'])") == 1
    assert never_waits(conn, producer, "SELECT pgq.enqueue('new-queue', 'k')") > 0  # a queue's first job
    assert one(conn, "SELECT count(*) FROM pgq.jobs") == 5


def test_claims_and_sweeps_fire_due_schedules_past_a_squatter_holding_the_queues_key(conn, login, squatter):  # noqa: F811
    for name in ("s1", "s2"):
        conn.execute("SELECT pgq.schedule(%s, 'sq', 'tick', every => '1 hour')", (name,))

    def due(name: str) -> None:
        conn.execute("UPDATE pgq.schedules SET next_run_at = now() - interval '1 minute' WHERE name = %s", (name,))
        conn.execute("UPDATE pgq.queues SET next_schedule_at = now() - interval '1 minute' WHERE name = 'sq'")

    hold_every_key(squatter, ["sq"], range(0), [])
    worker = victim(login, ALICE)
    due("s1")
    assert [r[0] for r in never_waits_rows(conn, worker, "SELECT kind FROM pgq.claim('w', queues => ARRAY['sq'])")] \
        == ["tick"]  # named
    due("s2")
    assert [r[0] for r in never_waits_rows(conn, worker, "SELECT kind FROM pgq.claim('w')")] == ["tick"]  # every queue
    due("s1")
    never_waits(conn, worker, "SELECT pgq.sweep()")
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE schedule IS NOT NULL") == 3


def never_waits_rows(su: psycopg.Connection, conn: psycopg.Connection, sql: str) -> list[tuple[Any, ...]]:
    call = Call(su, conn, sql).watch()
    assert not call.waited_for, f"{sql!r} waited for the sessions {sorted(call.waited_for)}"
    if call.error is not None:
        raise call.error
    assert call.rows is not None
    return call.rows


def test_a_rejected_call_never_waits_for_a_squatter_and_is_still_recorded(conn, login, squatter):  # noqa: F811
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k')")
    alice, mallory = victim(login, ALICE), victim(login, MALLORY)
    [claimed] = claim(alice)
    hold_every_key(squatter, [], range(job_id, job_id + 1), [ALICE, MALLORY])
    for who in (mallory, alice):  # another login's forged calls; the owner's own stale ones
        assert never_waits(conn, who, "SELECT pgq.renew(%s, 7)", (job_id,)) is None
        assert never_waits(conn, who, "SELECT pgq.complete(%s, 7)", (job_id,)) is False
        assert never_waits(conn, who, "SELECT count(*) FROM pgq.complete_many(ARRAY[%s, %s]::bigint[], '{7,7}')",
                           (job_id, job_id)) == 0
    assert one(conn, "SELECT count(*) FROM pgq.job_events WHERE job_id = %s AND event = 'rejected'", (job_id,)) == 6
    assert never_waits(conn, alice, "SELECT pgq.complete(%s, %s)", (job_id, claimed["attempt"])) is True


def test_the_fold_runs_past_a_squatter_and_the_counts_stay_exact(conn, login, squatter):  # noqa: F811
    conn.execute("SELECT pgq.enqueue_many('q', 'k', array_fill('{}'::jsonb, ARRAY[3]))")
    alice = victim(login, ALICE)
    for c in claim(alice, batch=3):
        assert one(alice, "SELECT pgq.complete(%s, %s)", (c["id"], c["attempt"])) is True
    hold_every_key(squatter, [], range(0), [])
    assert one(conn, "SELECT count(*) FROM pgq.finished_deltas") == 3
    never_waits(conn, alice, "SELECT pgq.sweep()")
    assert one(conn, "SELECT count(*) FROM pgq.finished_deltas") == 0  # folded, not skipped
    assert one(conn, "SELECT total FROM pgq.finished_counts WHERE queue = 'q' AND state = 'done'") == 3
    monitor = victim(login, WATCH)
    assert never_waits_rows(conn, monitor, "SELECT queue, done_total FROM pgq.metrics() WHERE queue = 'q'") \
        == [("q", 3)]


def test_drop_queue_and_the_prune_of_idle_tenants_are_not_stopped_by_a_squatter(conn, login, squatter):  # noqa: F811
    conn.execute("SELECT pgq.configure_queue('empty')")
    conn.execute("SELECT pgq.configure_queue('fair', fair => true)")
    job_id = one(conn, "SELECT pgq.enqueue('fair', 'k', tenant => 'idle')")
    conn.execute("SELECT pgq.cancel(%s)", (job_id,))
    conn.execute("DELETE FROM pgq.job_events; DELETE FROM pgq.jobs")  # the tenant is idle now
    hold_every_key(squatter, ["empty", "fair"], range(0), [])
    admin = victim(login, BOSS)
    assert never_waits(conn, admin, "SELECT pgq.drop_queue('empty')") is True
    never_waits(conn, admin, "SELECT pgq.prune()")
    assert one(conn, "SELECT count(*) FROM pgq.tenants WHERE queue = 'fair' AND tenant = 'idle'") == 0


def test_a_batch_callback_is_enqueued_past_a_squatter_holding_its_queues_key(conn, login, squatter):  # noqa: F811
    producer, alice = victim(login, PROD), victim(login, ALICE)
    batch = one(producer, "SELECT pgq.batch_open('cb', 'report')")
    member = one(producer, "SELECT pgq.enqueue('m', 'k', batch => %s)", (batch,))
    assert one(producer, "SELECT pgq.batch_close(%s)", (batch,)) is True
    [c] = claim(alice, queues=["m"])
    hold_every_key(squatter, ["cb", "m"], range(member, member + 2), [ALICE])
    assert never_waits(conn, alice, "SELECT pgq.complete(%s, %s)", (member, c["attempt"])) is True
    [cb] = callbacks(conn, batch)
    assert cb["meta"]["batch"] == {"id": batch, "members": 1, "done": 1, "failed": 0, "cancelled": 0}


def test_an_enqueue_behind_another_producers_open_insert_of_its_unique_key_gives_up_after_5s(conn, login):  # noqa: F811
    """Another producer's transaction inserted a job of the key and stays open: an enqueue of that
    key waits for it (the unique index) at most 5 s, then 55P03 naming the key; the caller's own
    lock_timeout is its own again afterwards. (It waited as long as that transaction stayed open.)"""
    conn.execute("SELECT pgq.configure_queue('uq')")
    squatting, producer = login(PROD, False), login(PROD2, False)
    one(squatting, "SELECT pgq.enqueue('uq', 'k', unique_key => 'order-7')")  # and left open
    for on_conflict in ("keep", "replace"):
        call = Call(conn, producer, "SELECT pgq.enqueue('uq', 'k', unique_key => 'order-7', on_conflict => %s)",
                    (on_conflict,)).watch(timeout=30)
        assert call.error is not None and call.error.sqlstate == "55P03", call.error
        assert "unique_key order-7 of queue uq" in str(call.error)
        assert call.waited_for == {squatting.info.backend_pid}
        producer.rollback()
    producer.execute("SET lock_timeout = '250ms'")  # a caller's shorter bound is kept
    call = Call(conn, producer, "SELECT pgq.enqueue('uq', 'k', unique_key => 'order-7')").watch(timeout=30)
    assert call.error is not None and "gave up after lock_timeout 250ms" in str(call.error)
    producer.rollback()
    producer.execute("SET lock_timeout = '0'")
    assert one(producer, "SELECT pgq.enqueue('uq', 'k', unique_key => 'order-8')") > 0  # no wait: a key of its own
    assert one(producer, "SHOW lock_timeout") == "0"
    producer.commit()
    squatting.commit()
    held = one(conn, "SELECT id FROM pgq.jobs WHERE unique_key = 'order-7'")
    assert one(producer, "SELECT pgq.enqueue('uq', 'k', unique_key => 'order-7')") == held  # keep, at once


def test_a_tenants_first_job_left_open_bounds_other_enqueues_and_holds_no_claim(conn, login):  # noqa: F811
    """Another producer's open transaction enqueued a fair queue's first job of a tenant (it
    registered the tenant): an enqueue of that tenant waits for it at most 5 s, then 55P03 naming
    the tenant; a claim that fires a due schedule of that tenant waits for it at most 1 ms (the
    schedule stays due, and fires once the registration committed)."""
    conn.execute("SELECT pgq.configure_queue('fq', fair => true)")
    conn.execute("SELECT pgq.schedule('tick', 'fq', 'tick', every => '1 hour', tenant => 'acme')")
    conn.execute("UPDATE pgq.schedules SET next_run_at = now() - interval '1 minute' WHERE name = 'tick'")
    conn.execute("UPDATE pgq.queues SET next_schedule_at = now() - interval '1 minute' WHERE name = 'fq'")
    conn.execute("DELETE FROM pgq.tenants WHERE queue = 'fq'")
    squatting, producer, worker = login(PROD, False), victim(login, PROD2, False), victim(login, ALICE)
    one(squatting, "SELECT pgq.enqueue('fq', 'k', tenant => 'acme')")  # and left open
    call = Call(conn, producer, "SELECT pgq.enqueue('fq', 'k', tenant => 'acme')").watch(timeout=30)
    assert call.error is not None and call.error.sqlstate == "55P03", call.error
    assert "tenant 'acme' of queue fq" in str(call.error)
    producer.rollback()
    # The claim's firing waits for the registration at most 1 ms (docs/sql-api.md), then leaves the
    # schedule due: it ends, with nothing, while the squatter stays open. (A 1 ms wait may be seen
    # in pg_blocking_pids on a loaded machine: the bound is what is asserted, not "no wait".)
    call = Call(conn, worker, "SELECT kind FROM pgq.claim('w', queues => ARRAY['fq'])").watch(timeout=30)
    assert call.error is None and call.rows == [], (call.error, call.rows)
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE schedule = 'tick'") == 0
    squatting.commit()
    assert [r[0] for r in never_waits_rows(conn, worker, "SELECT kind FROM pgq.claim('w', queues => ARRAY['fq'])")] \
        in (["tick"], ["k"])
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE schedule = 'tick'") == 1


# 2 and 5. Batches belong to their opener ---------------------------------------------------------------


def test_another_producer_cannot_join_a_batch_by_guessing_its_id(conn, login):  # noqa: F811
    """Joined, a stranger could cancel the callback (a member waiting for a failed job), delay it for
    ever (a member due in 9999), or hold the batch row so that its opener's close waits."""
    opener, stranger = login(PROD), login(PROD2)
    batch = one(opener, "SELECT pgq.batch_open('cb', 'report', run_when => 'all_done')")
    failed = one(conn, "SELECT pgq.enqueue('x', 'k')")
    conn.execute("SELECT pgq.cancel(%s)", (failed,))
    before = one(conn, "SELECT count(*) FROM pgq.jobs")
    unknown = sqlstate_and_message(stranger, "SELECT pgq.enqueue('m', 'k', batch => 987654)")
    for call, params in (("SELECT pgq.enqueue('m', 'k', batch => %s)", (batch,)),
                         ("SELECT pgq.enqueue('m', 'k', batch => %s, depends_on => ARRAY[%s]::bigint[])",
                          (batch, failed)),
                         ("SELECT pgq.enqueue('m', 'k', batch => %s, run_at => '9999-01-01')", (batch,)),
                         ("SELECT pgq.enqueue_many('m', 'k', ARRAY['{}', '{}']::jsonb[], batch => %s)", (batch,))):
        code, message = sqlstate_and_message(stranger, call, params)
        assert (code, message.replace(str(batch), "N")) == (unknown[0], unknown[1].replace("987654", "N"))
    assert one(conn, "SELECT count(*) FROM pgq.jobs") == before
    member = one(opener, "SELECT pgq.enqueue('m', 'k', batch => %s)", (batch,))
    stranger.execute("BEGIN")  # a stranger's open transaction after its refused join holds nothing
    sqlstate_and_message(stranger, "SELECT pgq.enqueue('m', 'k', batch => %s)", (batch,))
    assert never_waits(conn, opener, "SELECT pgq.batch_close(%s)", (batch,)) is True
    [c] = claim(conn, queues=["m"])
    assert one(conn, "SELECT pgq.complete(%s, %s)", (member, c["attempt"])) is True
    [cb] = callbacks(conn, batch)
    assert cb["state"] == "pending" and cb["meta"]["batch"]["members"] == 1


def sqlstate_and_message(conn: psycopg.Connection, sql: str, params: Any = None) -> tuple[str | None, str]:
    try:
        conn.execute(sql, params)
    except psycopg.Error as e:
        return e.sqlstate, e.diag.message_primary or ""
    raise AssertionError(f"{sql} succeeded")


def test_the_logins_an_opener_names_may_join_and_nobody_else(conn, login):  # noqa: F811
    """A member's handler that adds members may run as another login: the opener names it (or a
    group role it is a member of) in batch_open(..., joiners)."""
    for name in (JOINER, OUTSIDER):
        _ensure_role(conn, name, True, ["pgq_producer"])
    opener, named, group_member, other = login(PROD), login(JOINER), login(PROD2), login(OUTSIDER)
    by_name = one(opener, "SELECT pgq.batch_open('cb', 'report', joiners => ARRAY[%s])", (JOINER,))
    by_group = one(opener, "SELECT pgq.batch_open('cb', 'report', joiners => ARRAY[%s])", (WRITERS,))
    assert one(named, "SELECT pgq.enqueue('m', 'k', batch => %s)", (by_name,)) > 0
    assert one(group_member, "SELECT pgq.enqueue('m', 'k', batch => %s)", (by_group,)) > 0
    for who, batch in ((other, by_name), (other, by_group), (named, by_group), (group_member, by_name)):
        assert sqlstate_and_message(who, "SELECT pgq.enqueue('m', 'k', batch => %s)", (batch,))[0] == "22023"
    assert one(opener, "SELECT pgq.enqueue('m', 'k', batch => %s)", (by_name,)) > 0
    assert [len(members_of(conn, b)) for b in (by_name, by_group)] == [2, 1]
    # Joining is all a named login may do: the batch stays the opener's to read, close and cancel.
    for call in ("SELECT * FROM pgq.batch_status(%s)", "SELECT pgq.batch_close(%s)", "SELECT pgq.cancel_batch(%s)"):
        assert sqlstate_and_message(named, call, (by_name,))[0] == "P0002"
    assert one(conn, "SELECT count(*) FROM pgq.batch_joiners WHERE batch_id = %s", (by_name,)) == 1
    one(opener, "SELECT pgq.cancel_batch(%s)", (by_name,))
    conn.execute("SELECT pgq.prune(older_than => '0')")  # its members, then the batch and its joiners
    assert one(conn, "SELECT count(*) FROM pgq.batch_joiners WHERE batch_id = %s", (by_name,)) == 0


@pytest.mark.parametrize("joiners, code", [
    ("ARRAY['pgq_t_nobody']", "22023"),
    ("ARRAY[NULL]::text[]", "22023"),
    ("array_fill('pgq_t_joiner'::text, ARRAY[101])", "22023"),
])
def test_batch_open_refuses_an_unknown_joiner_naming_the_argument(conn, joiners, code):
    with pytest.raises(psycopg.Error) as e:
        conn.execute(f"SELECT pgq.batch_open('cb', 'report', joiners => {joiners})")
    assert e.value.sqlstate == code and "joiners" in str(e.value)
    assert one(conn, "SELECT count(*) FROM pgq.batches") == 0


def test_a_close_or_cancel_behind_an_open_join_gives_up_after_its_lock_timeout(conn, login):  # noqa: F811
    """The opener's own enqueue into the batch, left open: its close and an admin's cancel wait
    for it at most their lock_timeout (5 s), then 55P03 naming the batch."""
    opener, joiner, admin = login(PROD), login(PROD, False), login(BOSS)
    batch = one(opener, "SELECT pgq.batch_open('cb', 'report')")
    one(joiner, "SELECT pgq.enqueue('m', 'k', batch => %s)", (batch,))  # and left open
    closing = Call(conn, opener, "SELECT pgq.batch_close(%s)", (batch,))
    cancelling = Call(conn, admin, "SELECT pgq.cancel_batch(%s)", (batch,))
    for call in (closing.watch(timeout=30), cancelling.watch(timeout=30)):
        assert call.error is not None and call.error.sqlstate == "55P03", call.error
        assert f"batch {batch}" in str(call.error)
        assert call.waited_for  # (for the join, or for the other call that waits for it first)
    assert joiner.info.backend_pid in closing.waited_for | cancelling.waited_for
    joiner.commit()
    assert one(opener, "SELECT pgq.batch_close(%s)", (batch,)) is True


def test_sixteen_open_joins_make_no_members_end_wait(conn, login):  # noqa: F811
    """Each of 16 open transactions that enqueued a member holds a count shard: the worker's
    complete of another member counts its end elsewhere, without waiting; the counts add up."""
    conn.execute("SELECT pgq.configure_queue('later')")
    opener, alice = login(PROD), login(ALICE)
    batch = one(opener, "SELECT pgq.batch_open('cb', 'report')")
    first = one(opener, "SELECT pgq.enqueue('m', 'k', batch => %s)", (batch,))
    [c] = claim(alice, queues=["m"])
    joins = [login(PROD, False) for _ in range(16)]
    for j in joins:
        one(j, "SELECT pgq.enqueue('later', 'k', batch => %s)", (batch,))
    assert one(conn, "SELECT count(*) FROM pg_locks AS l JOIN pg_class AS c ON c.oid = l.relation"
                     " WHERE c.relname = 'batch_counts' AND l.mode = 'RowExclusiveLock'") >= 16
    assert never_waits(conn, alice, "SELECT pgq.complete(%s, %s)", (first, c["attempt"])) is True
    for j in joins:
        j.commit()
    assert one(opener, "SELECT pgq.batch_close(%s)", (batch,)) is True
    for c in claim(alice, queues=["later"], batch=16):
        assert one(alice, "SELECT pgq.complete(%s, %s)", (c["id"], c["attempt"])) is True
    [cb] = callbacks(conn, batch)
    assert cb["meta"]["batch"] == {"id": batch, "members": 17, "done": 17, "failed": 0, "cancelled": 0}
    assert one(conn, "SELECT count(*) FROM pgq.batch_backend_counts WHERE batch_id = %s", (batch,)) == 1  # alice's
    conn.execute("SELECT pgq.prune(older_than => '0')")  # the members, then the batch with all its counts
    assert one(conn, "SELECT (SELECT count(*) FROM pgq.batch_counts WHERE batch_id = %(b)s)"
                     " + (SELECT count(*) FROM pgq.batch_backend_counts WHERE batch_id = %(b)s)"
                     " + (SELECT count(*) FROM pgq.batches WHERE id = %(b)s)", {"b": batch}) == 0


def test_one_transaction_forging_the_shard_setting_holds_no_members_end(conn, login):  # noqa: F811
    conn.execute("SELECT pgq.configure_queue('later')")
    opener, alice = login(PROD), login(ALICE)
    batch = one(opener, "SELECT pgq.batch_open('cb', 'report')")
    first = one(opener, "SELECT pgq.enqueue('m', 'k', batch => %s)", (batch,))
    [c] = claim(alice, queues=["m"])
    forger = login(PROD, False)
    for shard in range(16):
        forger.execute("SELECT set_config('pgq.batch_shard', %s, true)", (f"{batch}:{shard}",))
        one(forger, "SELECT pgq.enqueue('later', 'k', batch => %s)", (batch,))
    assert never_waits(conn, alice, "SELECT pgq.complete(%s, %s)", (first, c["attempt"])) is True
    forger.commit()
    assert one(opener, "SELECT pgq.batch_close(%s)", (batch,)) is True
    for c in claim(alice, queues=["later"], batch=16):
        assert one(alice, "SELECT pgq.complete(%s, %s)", (c["id"], c["attempt"])) is True
    [cb] = callbacks(conn, batch)
    assert cb["meta"]["batch"]["members"] == 17 and cb["meta"]["batch"]["done"] == 17


def test_a_cancel_left_open_holds_no_tail_end_for_long(conn, login):  # noqa: F811
    """The opener cancels its batch in a transaction it leaves open: a worker's end of a running
    member waits for the batch row at most a second, then leaves the callback to the sweep."""
    opener, canceller, alice = login(PROD), login(PROD, False), login(ALICE)
    batch = one(opener, "SELECT pgq.batch_open('cb', 'report')")
    member = one(opener, "SELECT pgq.enqueue('m', 'k', batch => %s)", (batch,))
    one(opener, "SELECT pgq.enqueue('m2', 'k', batch => %s)", (batch,))
    assert one(opener, "SELECT pgq.batch_close(%s)", (batch,)) is True
    [c] = claim(alice, queues=["m"])
    assert one(canceller, "SELECT pgq.cancel_batch(%s)", (batch,)) == 1  # and left open
    ending = Call(conn, alice, "SELECT pgq.complete(%s, %s)", (member, c["attempt"])).watch(timeout=30)
    assert ending.value is True  # done while the cancel still holds the batch row: it gave up its turn
    assert canceller.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
    assert canceller.info.backend_pid in ending.waited_for
    canceller.commit()
    assert callbacks(conn, batch) == []
    conn.execute("SELECT pgq.sweep()")
    [cb] = callbacks(conn, batch)
    assert cb["state"] == "cancelled" and cb["meta"]["batch"]["done"] == 1


# 9. No session setting changes what a pgq function does ---------------------------------------------


@pytest.mark.parametrize("setting", ["pgq.batch_counting", "pgq.batch_shard"])
@pytest.mark.parametrize("many", [False, True], ids=["complete", "complete_many"])
def test_a_workers_session_setting_does_not_uncount_its_end_of_another_logins_member(conn, login, setting, many):  # noqa: F811
    opener, alice = login(PROD), login(ALICE)
    batch = one(opener, "SELECT pgq.batch_open('cb', 'report')")
    members = [one(opener, "SELECT pgq.enqueue('m', 'k', batch => %s)", (batch,)) for _ in range(2)]
    assert one(opener, "SELECT pgq.batch_close(%s)", (batch,)) is True
    value = "caller" if setting == "pgq.batch_counting" else f"{batch}:99"
    alice.execute(f"SET {setting} = '{value}'")
    claimed = claim(alice, queues=["m"], batch=2)
    if many:
        done = alice.execute("SELECT pgq.complete_many(%s::bigint[], %s::integer[])",
                             ([c["id"] for c in claimed], [c["attempt"] for c in claimed])).fetchall()
        assert sorted(r[0] for r in done) == members
    else:
        for c in claimed:
            assert one(alice, "SELECT pgq.complete(%s, %s)", (c["id"], c["attempt"])) is True
    status = opener.execute("SELECT state, unfinished, done FROM pgq.batch_status(%s)", (batch,)).fetchone()
    assert status == ("finished", 0, 2)
    [cb] = callbacks(conn, batch)
    assert cb["meta"]["batch"]["done"] == 2


# The "a job ended" hub (issue 38) ----------------------------------------------------------------------


def test_the_trigger_of_a_jobs_end_is_named_for_what_it_does(conn):
    rows = conn.execute("SELECT t.tgname, t.tgfoid::regproc::text FROM pg_trigger AS t"
                        " WHERE t.tgrelid = 'pgq.jobs'::regclass AND NOT t.tgisinternal").fetchall()
    assert rows == [("jobs_ended", "pgq._job_ended")]
