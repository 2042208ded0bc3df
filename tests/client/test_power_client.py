"""Issue 27 from Python: enqueue's on_conflict (replace, and debounce with it), enqueue_many's
unique_keys, and the bulk actions retry_jobs and cancel_jobs, on Client and AsyncClient against a
real database: what each writes, what it leaves alone, and how bad input is refused."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import datetime, timedelta

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from pgq_thin import AsyncClient, BadArgumentType, Client, InvalidArgument, PermissionDenied
from pgq_thin.errors import BadArgument

from sqlhelpers import job, one, wait_for


@pytest.fixture
def client(dsn: str) -> Iterator[Client]:
    with Client(dsn) as c:
        yield c


def now(conn: psycopg.Connection) -> datetime:
    """The database's clock."""
    return one(conn, "SELECT clock_timestamp()")


def jobs_of(conn: psycopg.Connection, queue: str) -> list[dict]:
    rows = conn.execute("SELECT id FROM pgq.jobs WHERE queue = %s ORDER BY id", (queue,)).fetchall()
    return [job(conn, r[0]) for r in rows]


def failed(client: Client, queue: str, kind: str = "k", n: int = 1) -> list[int]:
    """``n`` jobs of ``kind`` that failed their only attempt."""
    ids = client.enqueue_many(queue, kind, [{"n": i} for i in range(n)], max_attempts=1)
    claimed = client.claim("w", [queue], batch=n, kinds=[kind])
    assert sorted(j.id for j in claimed) == ids
    for j in claimed:
        assert client.fail(j.id, j.attempt, "broke", retryable=False) == "failed"
    return ids


# Replace and debounce ----------------------------------------------------------------------------


def test_keep_answers_the_holders_id_and_changes_nothing(client: Client, conn: psycopg.Connection) -> None:
    holder = client.enqueue("q", "k", {"v": 1}, unique_key="u", priority=1)
    assert client.enqueue("q", "k", {"v": 2}, unique_key="u", priority=9) == holder
    assert client.enqueue("q", "k", {"v": 3}, unique_key="u", on_conflict="keep") == holder
    [row] = jobs_of(conn, "q")
    assert (row["id"], row["payload"], row["priority"]) == (holder, {"v": 1}, 1)


@pytest.mark.parametrize("holder_state", ["pending", "scheduled", "waiting"])
def test_replace_updates_a_holder_that_has_not_started_and_keeps_its_id(
        client: Client, conn: psycopg.Connection, holder_state: str) -> None:
    start = now(conn)
    first_run = {"pending": None, "scheduled": start + timedelta(hours=1), "waiting": None}[holder_state]
    blocker = client.enqueue("other", "k") if holder_state == "waiting" else None
    holder = client.enqueue("q", "k", {"v": 1}, unique_key="u", run_at=first_run, priority=1, max_attempts=3,
                            meta={"m": 1}, depends_on=[blocker] if blocker else None)
    assert job(conn, holder)["state"] == ("waiting" if holder_state == "waiting" else "pending")
    later = start + timedelta(minutes=10)
    replaced = client.enqueue("q", "k", {"v": 2}, unique_key="u", on_conflict="replace", run_at=later, priority=7,
                              max_attempts=5, meta={"m": 2})
    assert replaced == holder
    [row] = jobs_of(conn, "q")
    assert (row["id"], row["payload"], row["run_at"], row["priority"], row["max_attempts"], row["meta"]) == (
        holder, {"v": 2}, later, 7, 5, {"m": 2})
    assert row["state"] == ("waiting" if holder_state == "waiting" else "pending")


def test_replace_of_a_running_holder_enqueues_a_new_job_that_runs_after_it(
        client: Client, conn: psycopg.Connection) -> None:
    holder = client.enqueue("q", "k", {"v": 1}, unique_key="u")
    [running] = client.claim("w1", ["q"])
    assert running.id == holder
    second = client.enqueue("q", "k", {"v": 2}, unique_key="u", on_conflict="replace")
    assert second != holder
    assert (job(conn, holder)["state"], job(conn, holder)["payload"]) == ("running", {"v": 1})  # left alone
    assert (job(conn, second)["state"], job(conn, second)["payload"]) == ("waiting", {"v": 2})
    # Replaced again while the holder still runs: that waiting job takes the new fields (one job behind).
    assert client.enqueue("q", "k", {"v": 2.5}, unique_key="u", on_conflict="replace", priority=3) == second
    assert (job(conn, second)["payload"], job(conn, second)["priority"]) == ({"v": 2.5}, 3)
    assert client.claim("w2", ["q"]) == []  # not while the holder runs
    assert client.complete(running.id, running.attempt)
    [after] = client.claim("w2", ["q"])
    assert (after.id, after.payload) == (second, {"v": 2.5})
    assert len(jobs_of(conn, "q")) == 2
    # A third call while the new job runs: again a new job, the one running untouched.
    third = client.enqueue("q", "k", {"v": 3}, unique_key="u", on_conflict="replace")
    assert third not in (holder, second) and job(conn, second)["payload"] == {"v": 2.5}
    assert job(conn, third)["state"] == "waiting"  # behind the successor that runs


def test_debounce_ends_with_one_job_that_carries_the_last_payload(client: Client, conn: psycopg.Connection) -> None:
    """enqueue(..., unique_key, on_conflict="replace", run_at=now + delay), called again and again:
    one job, due a delay after the last call, with the last call's payload."""
    ids, last_run_at = set(), None
    for n in range(1, 6):
        last_run_at = now(conn) + timedelta(seconds=1)
        ids.add(client.enqueue("search", "reindex", {"n": n}, unique_key="doc-7", on_conflict="replace",
                               run_at=last_run_at))
    [only] = ids
    [row] = jobs_of(conn, "search")
    assert (row["id"], row["payload"], row["run_at"]) == (only, {"n": 5}, last_run_at)
    [claimed] = wait_for(lambda: client.claim("w", ["search"]), "the debounced job to be due")
    assert (claimed.id, claimed.payload) == (only, {"n": 5})
    assert client.complete(claimed.id, claimed.attempt)
    assert client.claim("w", ["search"]) == [] and len(jobs_of(conn, "search")) == 1


def test_enqueue_many_with_unique_keys_keep(client: Client, conn: psycopg.Connection) -> None:
    holder = client.enqueue("q", "k", {"v": "old"}, unique_key="a")
    ids = client.enqueue_many("q", "k", [{"v": 1}, {"v": 2}, {"v": 3}], unique_keys=["a", None, "c"])
    assert ids[0] == holder and len(set(ids)) == 3
    assert [job(conn, i)["payload"] for i in ids] == [{"v": "old"}, {"v": 2}, {"v": 3}]
    assert [job(conn, i)["unique_key"] for i in ids] == ["a", None, "c"]
    # Again: every key is held now, by the jobs of the first call.
    assert client.enqueue_many("q", "k", [{"v": 4}, {"v": 5}], unique_keys=["c", "a"]) == [ids[2], holder]
    assert len(jobs_of(conn, "q")) == 3


def test_enqueue_many_with_unique_keys_replace(client: Client, conn: psycopg.Connection) -> None:
    pending = client.enqueue("q", "k", {"v": "old"}, unique_key="a")
    running = client.enqueue("q", "k", {"v": "old"}, unique_key="b")
    assert [j.id for j in client.claim("w", ["q"], kinds=["k"], batch=2)] == [pending, running]
    assert client.release(pending, 1)  # pending again, not started
    ids = client.enqueue_many("q", "k", [{"v": 1}, {"v": 2}, {"v": 3}], unique_keys=["a", "b", None],
                              on_conflict="replace", priority=4)
    assert ids[0] == pending and ids[1] not in (pending, running) and ids[2] not in (pending, running)
    assert (job(conn, pending)["payload"], job(conn, pending)["priority"]) == ({"v": 1}, 4)
    assert (job(conn, running)["state"], job(conn, running)["payload"]) == ("running", {"v": "old"})
    assert [job(conn, i)["payload"] for i in ids[1:]] == [{"v": 2}, {"v": 3}]


def test_enqueue_many_refuses_a_key_twice_and_a_list_of_another_length(client: Client,
                                                                       conn: psycopg.Connection) -> None:
    for keys in (["a", "b", "a"], ["a", "b"], ["a", "b", "c", "d"]):
        with pytest.raises(InvalidArgument) as refused:
            client.enqueue_many("q", "k", [{}, {}, {}], unique_keys=keys)
        assert refused.value.sqlstate == "22023" and "unique_keys" in refused.value.message
    assert jobs_of(conn, "q") == []


def test_bad_input_is_refused_naming_the_argument_and_writes_nothing(client: Client, conn: psycopg.Connection) -> None:
    holder = client.enqueue("q", "k", {"v": 1}, unique_key="u")
    for value in ("merge", "", "REPLACE", None):
        with pytest.raises(InvalidArgument) as refused:
            client.enqueue("q", "k", {"v": 2}, unique_key="u", on_conflict=value)  # type: ignore[arg-type]
        assert refused.value.sqlstate in ("22023", "22004") and '"on_conflict"' in refused.value.message
        with pytest.raises(InvalidArgument, match='"on_conflict"'):
            client.enqueue_many("q", "k", [{"v": 2}], unique_keys=["u"], on_conflict=value)  # type: ignore[arg-type]
    with pytest.raises(BadArgumentType, match='"on_conflict"'):
        client.enqueue("q", "k", on_conflict=1)  # type: ignore[arg-type]
    with pytest.raises(BadArgumentType, match='"unique_keys"'):
        client.enqueue_many("q", "k", [{}], unique_keys="u")  # type: ignore[arg-type]  # a str is not a list
    with pytest.raises(BadArgumentType, match=r'"unique_keys\[2\]"'):
        client.enqueue_many("q", "k", [{}, {}], unique_keys=["u", 7])  # type: ignore[list-item]
    with pytest.raises(BadArgument, match=r'"unique_keys\[1\]".*NUL'):
        client.enqueue_many("q", "k", [{}], unique_keys=["a\x00b"])
    [row] = jobs_of(conn, "q")
    assert (row["id"], row["payload"]) == (holder, {"v": 1})


# Bulk actions by filter --------------------------------------------------------------------------


def test_retry_jobs_counts_and_filters_by_state_kind_and_end(client: Client, conn: psycopg.Connection) -> None:
    early = failed(client, "q", "a", 3)
    middle = now(conn)
    late_a, late_b = failed(client, "q", "a", 2), failed(client, "q", "b", 2)
    other_queue = failed(client, "elsewhere", "a", 1)
    cancelled = client.enqueue("q", "a")
    assert client.cancel(cancelled)

    assert client.retry_jobs("q", "failed", "a", finished_before=middle) == 3
    assert {job(conn, i)["state"] for i in early} == {"pending"}
    assert {job(conn, i)["state"] for i in late_a + late_b + other_queue} == {"failed"}
    assert client.retry_jobs("q", "failed", limit_rows=3) == 3  # oldest id first
    assert [job(conn, i)["state"] for i in late_a + late_b] == ["pending", "pending", "pending", "failed"]
    assert client.retry_jobs("q", "failed") == 1
    assert client.retry_jobs("q", "failed") == 0
    assert client.retry_jobs("q", "cancelled") == 1 and job(conn, cancelled)["state"] == "pending"
    assert job(conn, other_queue[0])["state"] == "failed"
    assert "retried" in [r[0] for r in conn.execute(
        "SELECT event FROM pgq.job_events WHERE job_id = %s", (early[0],)).fetchall()]


def test_cancel_jobs_counts_and_filters_by_state_kind_and_creation(client: Client, conn: psycopg.Connection) -> None:
    old = client.enqueue_many("q", "a", [{}, {}])
    middle = now(conn)
    new_a, [new_b] = client.enqueue_many("q", "a", [{}, {}]), client.enqueue_many("q", "b", [{}])
    [running] = client.claim("w", ["q"])  # the oldest: old[0]
    elsewhere = client.enqueue("elsewhere", "a")
    waiting = client.enqueue("q", "a", depends_on=[elsewhere])

    assert client.cancel_jobs("q", "pending", created_before=middle) == 1  # old[1]; old[0] runs
    assert job(conn, old[1])["state"] == "cancelled" and job(conn, running.id)["state"] == "running"
    assert client.cancel_jobs("q", "pending", "b") == 1 and job(conn, new_b)["state"] == "cancelled"
    assert client.cancel_jobs("q", "pending", limit_rows=1) == 1
    assert [job(conn, i)["state"] for i in new_a] == ["cancelled", "pending"]
    assert client.cancel_jobs("q", "running") == 1 and job(conn, running.id)["state"] == "cancelled"
    assert not client.complete(running.id, running.attempt)  # the stale owner is refused
    assert client.cancel_jobs("q", "waiting") == 1 and job(conn, waiting)["state"] == "cancelled"
    assert client.cancel_jobs("q", "pending") == 1 and client.cancel_jobs("q", "pending") == 0
    assert job(conn, elsewhere)["state"] == "pending"


def test_cancel_jobs_cancels_outcome_unknown_jobs(client: Client, conn: psycopg.Connection) -> None:
    client.enqueue_many("q", "k", [{}, {}])
    claimed = client.claim("w", ["q"], batch=2)
    for j in claimed:
        assert client.mark_unknown(j.id, j.attempt, "the network timed out")
    assert client.cancel_jobs("q", "outcome_unknown") == 2
    assert {job(conn, j.id)["state"] for j in claimed} == {"cancelled"}


@pytest.mark.parametrize("call", ["retry_jobs", "cancel_jobs"])
def test_bulk_actions_refuse_bad_input_naming_the_argument(client: Client, conn: psycopg.Connection,
                                                           call: str) -> None:
    ids = failed(client, "q", n=2) if call == "retry_jobs" else client.enqueue_many("q", "k", [{}, {}])
    state = "failed" if call == "retry_jobs" else "pending"
    act = getattr(client, call)
    for args, kwargs, argument, sqlstate in [
        ((None, state), {}, "queue", "22004"),
        (("q", None), {}, "state", "22004"),
        (("q", "done"), {}, "state", "22023"),
        (("q", "failed" if call == "cancel_jobs" else "pending"), {}, "state", "22023"),
        (("q", state), {"limit_rows": 0}, "limit_rows", "22023"),
        (("q", state), {"limit_rows": 10001}, "limit_rows", "22023"),
        (("q", state), {"limit_rows": None}, "limit_rows", "22004"),
        (("bad queue!", state), {}, "queue", "22023"),
        (("q", state, "bad kind!"), {}, "kind", "22023"),
    ]:
        with pytest.raises(InvalidArgument) as refused:
            act(*args, **kwargs)
        assert (refused.value.sqlstate, f'"{argument}"' in refused.value.message) == (sqlstate, True), (
            args, kwargs, refused.value)
    before = "finished_before" if call == "retry_jobs" else "created_before"
    for kwargs, argument in [({before: "2026-01-01"}, before), ({"limit_rows": 1.5}, "limit_rows"),
                             ({"kind": 3}, "kind")]:
        with pytest.raises(BadArgumentType, match=f'"{argument}"'):
            act("q", state, **kwargs)
    assert {job(conn, i)["state"] for i in ids} == {state}


@pytest.mark.parametrize("call", ["retry_jobs", "cancel_jobs"])
def test_bulk_actions_are_for_pgq_admin_only(dsn: str, client: Client, conn: psycopg.Connection, call: str) -> None:
    ids = failed(client, "q") if call == "retry_jobs" else client.enqueue_many("q", "k", [{}])
    state = "failed" if call == "retry_jobs" else "pending"
    for role in ("pgq_producer", "pgq_worker", "pgq_monitor"):
        with ConnectionPool(dsn, min_size=1, max_size=1, kwargs={"autocommit": True},
                            configure=lambda c, r=role: c.execute(f"SET ROLE {r}"), open=True) as pool:
            with pytest.raises(PermissionDenied) as denied:
                getattr(Client(pool=pool), call)("q", state)
            assert denied.value.sqlstate == "42501"
    assert job(conn, ids[0])["state"] == state


def test_async_client_replaces_and_acts_in_bulk(dsn: str, conn: psycopg.Connection) -> None:
    async def scenario() -> tuple[int, int, int, int]:
        async with AsyncClient(dsn) as client:
            holder = await client.enqueue("q", "k", {"v": 1}, unique_key="u")
            replaced = await client.enqueue("q", "k", {"v": 2}, unique_key="u", on_conflict="replace")
            [many] = await client.enqueue_many("q", "k", [{"v": 3}], unique_keys=["u"], on_conflict="replace")
            assert holder == replaced == many
            cancelled = await client.cancel_jobs("q", "pending")
            retried = await client.retry_jobs("q", "cancelled", "k", finished_before=None, limit_rows=10)
            return holder, cancelled, retried, len(await client.list_jobs("q", "pending"))

    holder, cancelled, retried, pending = asyncio.run(scenario())
    assert (cancelled, retried, pending) == (1, 1, 1)
    assert (job(conn, holder)["state"], job(conn, holder)["payload"]) == ("pending", {"v": 3})
