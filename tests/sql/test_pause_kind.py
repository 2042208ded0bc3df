"""Issue 41, pausing one kind: pgq.pause(queue, kind => ...) and pgq.resume(queue, kind => ...).

Claims skip a paused kind of that queue only (other kinds of it, and that kind in other queues, go
on being claimed); a queue with paused kinds is claimed per kind through jobs_kind_ready_idx, so a
run of paused jobs at the queue's head is skipped without being read. queue_settings shows the
paused kinds (pgq.queues.paused_kinds). Bad input: 22023 naming `kind`, nothing written. Resuming a
kind that is not paused changes nothing. Race: claimers in threads of their own while a kind is
paused and resumed: no claim that starts after pause() committed takes a job of that kind; after
resume() every job runs."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

from plankit import capture, plan_of
from sqlfixtures import sqlstate_of
from sqlhelpers import one, wait_for


def enqueue(conn: psycopg.Connection, queue: str, kind: str, n: int = 1, priority: int = 0) -> list[int]:
    return [r[0] for r in conn.execute(
        "SELECT pgq.enqueue(%s, %s, priority => %s) FROM generate_series(1, %s)", (queue, kind, priority, n))]


def claim(conn: psycopg.Connection, queues: list[str] | None = None, batch: int = 10,
          kinds: list[str] | None = None) -> list[tuple[int, str, str]]:
    return [(r[0], r[1], r[2]) for r in conn.execute(
        "SELECT id, queue, kind FROM pgq.claim('w', queues => %s::text[], batch => %s, kinds => %s::text[])",
        (queues, batch, kinds))]


def settings(conn: psycopg.Connection, queue: str) -> dict[str, Any]:
    cur = conn.execute("SELECT * FROM pgq.queue_settings(%s)", (queue,))
    return dict(zip([d.name for d in cur.description], cur.fetchone() or ()))


def test_claims_skip_the_paused_kind_of_that_queue_only(conn: psycopg.Connection) -> None:
    enqueue(conn, "q", "slow", 5, priority=10)  # at the head of the queue
    fast = enqueue(conn, "q", "fast", 3)
    other = enqueue(conn, "r", "slow", 2)
    row = one(conn, "SELECT paused_kinds FROM pgq.pause('q', kind => 'slow')")
    assert row == ["slow"]
    assert settings(conn, "q")["paused_kinds"] == ["slow"] and settings(conn, "q")["paused"] is False
    assert settings(conn, "r")["paused_kinds"] is None

    got = claim(conn, batch=100)  # queues => NULL: every queue
    assert sorted(i for i, _, _ in got) == sorted(fast + other)
    assert claim(conn, batch=100) == []
    assert claim(conn, ["q"], kinds=["slow", "fast"]) == []  # a worker's kinds: the paused one is left out

    assert one(conn, "SELECT paused_kinds FROM pgq.resume('q', kind => 'slow')") is None
    assert [k for _, _, k in claim(conn, ["q"], batch=100)] == ["slow"] * 5


def test_pause_kind_is_a_set_and_resume_of_an_unpaused_kind_changes_nothing(conn: psycopg.Connection) -> None:
    enqueue(conn, "q", "a")
    for kind in ("b", "a", "b"):
        conn.execute("SELECT pgq.pause('q', kind => %s)", (kind,))
    assert settings(conn, "q")["paused_kinds"] == ["a", "b"]
    assert one(conn, "SELECT paused_kinds FROM pgq.resume('q', kind => 'zzz')") == ["a", "b"]
    # The whole queue's pause and its paused kinds are apart.
    conn.execute("SELECT pgq.pause('q')")
    conn.execute("SELECT pgq.resume('q')")
    assert settings(conn, "q")["paused_kinds"] == ["a", "b"] and settings(conn, "q")["paused"] is False
    conn.execute("SELECT pgq.resume('q', kind => 'a'), pgq.resume('q', kind => 'b')")
    assert settings(conn, "q")["paused_kinds"] is None


@pytest.mark.parametrize("call", ["pause", "resume"])
@pytest.mark.parametrize("kind", ["", "bad kind", "-x", "k" * 129])
def test_a_kind_that_is_not_a_name_is_refused_naming_kind_and_writes_nothing(
        conn: psycopg.Connection, call: str, kind: str) -> None:
    enqueue(conn, "q", "a")
    conn.execute("SELECT pgq.pause('q', kind => 'a')")
    before = settings(conn, "q")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match='argument "kind"'):
        conn.execute(f"SELECT pgq.{call}('q', kind => %s)", (kind,))
    assert settings(conn, "q") == before
    assert sqlstate_of(conn, f"SELECT pgq.{call}('nope', kind => 'a')") == "22023"  # no such queue
    assert one(conn, "SELECT count(*) FROM pgq.queues WHERE name = 'nope'") == 0


def test_the_claim_of_a_queue_with_a_paused_kind_reads_no_paused_job(conn: psycopg.Connection) -> None:
    """5000 paused jobs at the queue's head and one job of another kind: the claim takes it, and
    reads a handful of rows of pgq.jobs (per kind through jobs_kind_ready_idx), not the paused run."""
    enqueue(conn, "q", "paused", 5000, priority=5)
    (wanted,) = enqueue(conn, "q", "other")
    conn.execute("SELECT pgq.pause('q', kind => 'paused')")
    conn.execute("ANALYZE pgq.jobs")
    conn.execute("LOAD 'auto_explain'")
    for queues in (["q"], None):
        rows, plans = capture(conn, "SELECT id FROM pgq.claim('w', queues => %s::text[], batch => 10)", (queues,))
        assert rows == ([(wanted,)] if queues else [])
        read = sum(s.rows for p in plans for s in p.job_scans)
        assert read < 20, "\n".join(f"{p.query[:80]}: {[str(s) for s in p.job_scans]}" for p in plans)
        assert any(s.index == "jobs_kind_ready_idx" for p in plans for s in p.job_scans)


def test_a_fair_a_key_limited_and_a_capped_queue_skip_a_paused_kind_too(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('f', fair => true)")
    conn.execute("SELECT pgq.configure_queue('k', key_max_running => 1)")
    conn.execute("SELECT pgq.configure_queue('c', max_running => 1)")
    for queue in ("f", "k", "c"):
        conn.execute("SELECT pgq.enqueue(%s, 'slow', priority => 9, tenant => 't', concurrency_key => 'a')", (queue,))
        fast = int(one(conn, "SELECT pgq.enqueue(%s, 'fast', tenant => 't', concurrency_key => 'b')", (queue,)))
        conn.execute("SELECT pgq.pause(%s, kind => 'slow')", (queue,))
        assert [i for i, _, _ in claim(conn, [queue])] == [fast]
        assert claim(conn, [queue]) == []


def test_claimers_never_take_a_paused_kind_after_pause_commits_and_take_it_after_resume(
        connect, conn: psycopg.Connection) -> None:
    enqueue(conn, "q", "slow", 300)
    enqueue(conn, "q", "fast", 300)
    enqueue(conn, "r", "slow", 100)
    total = 700
    paused = threading.Event()    # set once pause() has committed
    resuming = threading.Event()  # set before resume() is called (a claim that began after
    #                               resume committed, before an event set after it, may take them)
    # (id, queue, kind, whether the claim began after pause committed and before resume was called)
    taken: list[tuple[int, str, str, bool]] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def claimer() -> None:
        try:
            c = connect()
            while True:
                with lock:
                    if len(taken) >= total:
                        return
                while_paused = paused.is_set() and not resuming.is_set()
                rows = c.execute("SELECT id, queue, kind, attempt FROM pgq.claim('w', batch => 3)").fetchall()
                for job_id, _, _, attempt in rows:
                    assert one(c, "SELECT pgq.complete(%s, %s)", (job_id, attempt)) is True
                with lock:
                    taken.extend((r[0], r[1], r[2], while_paused) for r in rows)
                if not rows:
                    resuming.wait(0.05)  # nothing claimable until resume: poll, as a worker does
        except BaseException as e:  # noqa: BLE001 (reported by the test)
            errors.append(e)

    threads = [threading.Thread(target=claimer) for _ in range(4)]
    for t in threads:
        t.start()
    conn.execute("SELECT pgq.pause('q', kind => 'slow')")  # autocommit: committed when it returns
    paused.set()
    others = "SELECT count(*) FROM pgq.jobs WHERE state <> 'done' AND NOT (queue = 'q' AND kind = 'slow')"
    wait_for(lambda: one(conn, others) == 0 or errors, "every job but q's slow ones to be done")
    assert not errors, errors
    resuming.set()
    conn.execute("SELECT pgq.resume('q', kind => 'slow')")
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    bad = [r for r in taken if r[1] == "q" and r[2] == "slow" and r[3]]
    assert bad == [], f"paused jobs taken by claims that began after pause() committed: {bad[:5]}"
    assert len({r[0] for r in taken}) == len(taken) == total
    assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE state <> 'done'") == 0
    # While the kind was paused the others kept running: q's fast jobs and r's slow ones.
    assert {(r[1], r[2]) for r in taken if r[3]} >= {("q", "fast"), ("r", "slow")}


def test_a_queue_without_paused_kinds_is_claimed_as_before(conn: psycopg.Connection) -> None:
    """The pick of a queue without paused kinds is pgq._lease_jobs' one statement through
    jobs_ready_idx, with no per-kind step, even while another queue has a paused kind."""
    enqueue(conn, "q", "a", 3)
    enqueue(conn, "p", "a")
    conn.execute("SELECT pgq.pause('p', kind => 'a')")
    conn.execute("LOAD 'auto_explain'")
    rows, plans = capture(conn, "SELECT id FROM pgq.claim('w', queues => '{q}', batch => 3)")
    assert len(rows) == 3
    assert not any("_kinds_pick" in p.query or "_claim_kinds" in p.query or "_pending_kinds" in p.query
                   for p in plans)
    assert "jobs_ready_idx" in plan_of(plans, "WITH picked AS").text
