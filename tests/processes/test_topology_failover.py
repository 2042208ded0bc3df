"""Failover to a streaming standby, with real servers (pgq_thin.testing.topology): a primary and a
standby made with pg_basebackup, the primary killed with -9, the standby promoted with pg_promote().

With asynchronous replication the standby may miss the old primary's last claims. The fence
(pgq._check_timeline, run by the first claim on the new timeline) makes sure no attempt number the
old primary handed out is issued again, so an old owner's write is refused and the new owner's
result kept. With synchronous replication nothing acknowledged is lost.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from psycopg.types.json import Jsonb

from pgq_thin.migrate import migrate
from pgq_thin.testing.topology import ReplicatedPair, timeline

from sqlhelpers import LOWER_LEASE_FLOOR

pytestmark = pytest.mark.slow


def one(conn: psycopg.Connection, sql: str, params: object = None) -> object:
    row = conn.execute(sql, params).fetchone()  # type: ignore[arg-type]
    assert row is not None
    return row[0]


@pytest.fixture
def async_pair() -> Iterator[ReplicatedPair]:
    with ReplicatedPair(synchronous=False) as pair:
        migrate(pair.primary.dsn_for("test"))
        yield pair


def test_timeline_changes_at_promotion_at_once(async_pair: ReplicatedPair) -> None:
    """What the fence reads: the current WAL file's timeline, new the moment the standby is
    promoted (pg_control_checkpoint() would still say the old one until a checkpoint)."""
    before = timeline(async_pair.primary.dsn_for("test"))
    async_pair.fail_over(rebuild=False)
    with psycopg.connect(async_pair.primary.dsn_for("test"), autocommit=True) as conn:
        assert one(conn, "SELECT pgq._timeline()") == before + 1
        assert one(conn, "SELECT timeline_id FROM pg_control_checkpoint()") == before


def test_async_failover_an_old_attempt_is_refused_and_the_new_owners_result_kept(
        async_pair: ReplicatedPair) -> None:
    """The issue's reproduction: a job claimed on the primary as attempt 1, the claim not on the
    asynchronous standby; the primary killed, the standby promoted. A new worker claims the job
    there: not as attempt 1 again. The old worker's complete(id, 1) is refused, the new owner's
    complete accepted, and its result is what stays."""
    dsn = async_pair.dsn("test")
    with psycopg.connect(dsn, autocommit=True) as producer:
        job_id = one(producer, "SELECT pgq.enqueue('mail', 'send', '{\"to\": \"ada\"}')")
    async_pair.wait_caught_up()                        # the enqueue is on the standby
    assert async_pair.standby is not None
    async_pair.standby.cut_off()                       # ... and nothing after it will be
    with psycopg.connect(dsn, autocommit=True) as old_worker:
        claimed = old_worker.execute("SELECT id, attempt FROM pgq.claim('old-worker')").fetchall()
    assert claimed == [(job_id, 1)]

    async_pair.fail_over(rebuild=False)                # kill -9, pg_promote()

    with psycopg.connect(dsn, autocommit=True) as new_worker, \
            psycopg.connect(dsn, autocommit=True) as old_worker:
        # The new primary never saw the old claim: the job is pending at attempt 0 here.
        assert new_worker.execute("SELECT state::text, attempt FROM pgq.jobs WHERE id = %s",
                                  (job_id,)).fetchone() == ("pending", 0)
        rows = new_worker.execute("SELECT id, attempt, max_attempts FROM pgq.claim('new-worker')").fetchall()
        assert len(rows) == 1 and rows[0][0] == job_id
        new_attempt, new_max = rows[0][1], rows[0][2]
        assert new_attempt > 1, "attempt 1 was handed out by the old primary: it must not be issued again"
        assert new_max - new_attempt == 25 - 1, "the attempts left are those of a first attempt"

        assert one(old_worker, "SELECT pgq.complete(%s, 1, %s)", (job_id, Jsonb({"by": "old"}))) is False
        assert one(new_worker, "SELECT pgq.complete(%s, %s, %s)",
                   (job_id, new_attempt, Jsonb({"by": "new"}))) is True
        assert one(old_worker, "SELECT pgq.complete(%s, 1, %s)", (job_id, Jsonb({"by": "old"}))) is False
        row = new_worker.execute("SELECT state::text, result FROM pgq.jobs WHERE id = %s", (job_id,)).fetchone()
        assert row == ("done", {"by": "new"})
        events = [r[0] for r in new_worker.execute(
            "SELECT event FROM pgq.job_events WHERE job_id = %s ORDER BY id", (job_id,))]
        assert events == ["fenced", "claimed", "rejected", "completed", "rejected"]
        fence = new_worker.execute("SELECT timeline, moves, jobs_moved FROM pgq.fence").fetchone()
        assert fence == (one(new_worker, "SELECT pgq._timeline()"), 1, 1)


def test_a_claim_on_a_standby_is_refused_with_a_clear_error() -> None:
    with ReplicatedPair(synchronous=False) as pair:
        migrate(pair.primary.dsn_for("test"))
        assert pair.standby is not None
        pair.wait_caught_up()
        with psycopg.connect(pair.standby.dsn_for("test"), autocommit=True) as conn:
            with pytest.raises(psycopg.errors.ReadOnlySqlTransaction) as caught:
                conn.execute("SELECT * FROM pgq.claim('w')")
            assert "standby" in str(caught.value)
            assert "target_session_attrs=read-write" in (caught.value.diag.message_hint or "")


def test_sync_failover_mid_drain_loses_nothing_acknowledged_and_fences_stale_writes(tmp_path) -> None:
    """Synchronous replication, real worker processes on a multi-host DSN: mid-drain the primary is
    killed with -9 and the standby promoted; the workers reconnect by themselves. Afterwards every
    acknowledged enqueue is done, none completed twice, no two live owners (the soak's checks), the
    lease of a job claimed on the old primary expired and the job was recovered, and that old
    owner's write is refused on the new primary."""
    import random

    from pgq_tools import soak
    from pgq_tools.fleet import Fleet, worker_command

    with ReplicatedPair(synchronous=True) as pair:
        direct = pair.primary.dsn_for("test")
        migrate(direct)
        dsn = pair.dsn("test")
        with psycopg.connect(direct, autocommit=True) as conn:
            conn.execute(soak._LEDGER_DDL)
            conn.execute("SELECT pgq.configure_queue(%s, lease => '2 seconds', max_attempts => 1000,"
                         " backoff_base => '100 ms', backoff_cap => '1 s')", (soak.QUEUE,))
            acknowledged = [r[0] for r in conn.execute(
                "SELECT id FROM pgq.enqueue_many(%s, 'soak.work', array_fill('{\"ms\": 20}'::jsonb, ARRAY[400]))"
                " AS t(id)", (soak.QUEUE,))]
        producers = soak._Producers(dsn, threads=1, rate=30, rng=random.Random(13))
        fleet = Fleet(tmp_path)
        try:
            for n in range(3):
                fleet.start(f"w{n}", worker_command("pgq_tools.soak_app:worker", dsn),
                            env={"PGQ_SOAK_WORKER": f"w{n}", "PGQ_SOAK_CONCURRENCY": "4"})
            producers.start()
            with psycopg.connect(direct, autocommit=True) as conn:
                soak_wait(lambda: one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'done'") >= 100,
                          "100 jobs done before the failover")
                # A worker that claims a job on the old primary and never comes back.
                # (Its lease outlasts a failover on a loaded machine, as a rule; if it does not, the
                # old primary recovered it and the checks below still hold.)
                zombie = conn.execute("SELECT id, attempt FROM pgq.claim('zombie', lease => '10 seconds')").fetchone()
                assert zombie is not None
            pair.fail_over(rebuild=False)                    # mid-drain: kill -9, promote
            with psycopg.connect(dsn, autocommit=True) as conn:
                soak_wait(lambda: one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'done'"
                                            " AND finished_at > (SELECT moved_at FROM pgq.fence)") >= 100,
                          "100 jobs done on the new primary")
            producers.stop()
            acknowledged += producers.acknowledged
            with psycopg.connect(dsn, autocommit=True) as conn:
                soak_wait(lambda: one(conn, "SELECT count(*) FROM pgq.jobs WHERE state NOT IN"
                                            " ('done', 'failed', 'cancelled')") == 0,
                          "every job finished", timeout=120)
                # The job claimed on the old primary by a worker that never came back: its lease
                # expired, it was recovered and done by a worker past the fence; the old owner's
                # write is refused.
                events = conn.execute("SELECT event, attempt, at > (SELECT moved_at FROM pgq.fence)"
                                      " FROM pgq.job_events WHERE job_id = %s ORDER BY id", (zombie[0],)).fetchall()
                assert ("lease_expired", zombie[1]) in [(e, a) for e, a, _ in events], events
                after_fence = [(e, past) for e, a, past in events if a > 100000]
                assert after_fence == [("claimed", True), ("completed", True)], events
                assert one(conn, "SELECT pgq.complete(%s, %s)", zombie) is False
                assert one(conn, "SELECT attempt FROM pgq.jobs WHERE id = %s", (zombie[0],)) > 100000
                assert one(conn, "SELECT moves FROM pgq.fence") == 1
        finally:
            producers.stop()
            fleet.stop()
        counts = soak.SoakCounts()
        problems = soak._check(dsn, acknowledged, counts)
        assert problems == [], problems
        assert (counts.lost, counts.completed_twice, counts.not_terminal) == (0, 0, 0)
        assert counts.states == {"done": counts.jobs} and counts.acknowledged > 400
        print(f"sync failover: {counts.jobs} jobs, {counts.executions} executions, {counts.reclaims} reclaims, "
              f"{counts.rejected} stale writes rejected, {counts.duplicates} duplicate effects "
              f"({counts.explained} explained)")


def soak_wait(condition, what: str, timeout: float = 60.0) -> None:
    from pgq_thin.testing.topology import wait_for

    wait_for(condition, what, timeout=timeout, interval=0.2)


def test_async_failover_under_load_never_reissues_a_token(async_pair: ReplicatedPair) -> None:
    """Asynchronous replication under load: producers and claim/complete loops run against the
    primary, which is killed with -9 without warning and the standby promoted. What had not
    reached the standby is lost (acknowledged enqueues, acknowledged completions: counted and
    printed, the figures docs/ha.md reports); but no (job, attempt) the old primary handed out is
    handed out again by the new one."""
    import threading

    from pgq_thin import Client

    dsn = async_pair.dsn("test")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pgq.enqueue_many('load', 'k', array_fill('{}'::jsonb, ARRAY[3000]))")
    async_pair.wait_caught_up()
    stop = threading.Event()
    enqueued: list[int] = []
    old_tokens: set[tuple[int, int]] = set()
    completed: list[int] = []

    def produce() -> None:
        with Client(async_pair.primary.dsn_for("test"), max_size=1) as client:
            while not stop.is_set():
                try:
                    enqueued.extend(client.enqueue_many("load", "k", [{}] * 10))
                except Exception:  # noqa: BLE001 - the primary died
                    return

    def work(name: str) -> None:
        with Client(async_pair.primary.dsn_for("test"), max_size=1) as client:
            while not stop.is_set():
                try:
                    for job in client.claim(name, ["load"], batch=5):
                        old_tokens.add((job.id, job.attempt))
                        if client.complete(job.id, job.attempt):
                            completed.append(job.id)
                except Exception:  # noqa: BLE001 - the primary died
                    return

    threads = [threading.Thread(target=produce)] + [threading.Thread(target=work, args=(f"old{n}",))
                                                    for n in range(2)]
    for t in threads:
        t.start()
    with psycopg.connect(async_pair.primary.dsn_for("test"), autocommit=True) as conn:
        wait_for_count = 300
        soak_wait(lambda: len(completed) >= wait_for_count, f"{wait_for_count} completions on the old primary")
        lag = one(conn, "SELECT pg_current_wal_lsn() - replay_lsn FROM pg_stat_replication")
    async_pair.fail_over(rebuild=False)
    stop.set()
    for t in threads:
        t.join(timeout=30)

    with psycopg.connect(dsn, autocommit=True) as conn:
        present = {r[0] for r in conn.execute("SELECT id FROM pgq.jobs")}
        done = {r[0] for r in conn.execute("SELECT id FROM pgq.jobs WHERE state = 'done'")}
        lost_enqueues = [i for i in enqueued if i not in present]
        lost_completions = [i for i in completed if i in present and i not in done]
        # The jobs still running here were claimed on the old primary by owners that are gone: as if
        # their leases had run out (instead of waiting 30 s), so the drain recovers them too.
        running = one(conn, "SELECT count(*) FROM pgq.jobs WHERE state = 'running'")
        conn.execute("UPDATE pgq.jobs SET lease_until = now() - interval '1 second' WHERE state = 'running'")
        conn.execute(LOWER_LEASE_FLOOR)  # by hand the leases lie below the claims' floor
        new_tokens: set[tuple[int, int]] = set()
        while rows := conn.execute("SELECT id, attempt FROM pgq.claim('new', ARRAY['load'], 100)").fetchall():
            new_tokens.update((r[0], r[1]) for r in rows)
            conn.execute("SELECT pgq.complete_many(%s, %s)", ([r[0] for r in rows], [r[1] for r in rows]))
        assert one(conn, "SELECT count(*) FROM pgq.jobs WHERE state <> 'done'") == 0
    print(f"\nasync failover under load: standby {lag} bytes of WAL behind just before the kill; "
          f"{len(enqueued)} enqueues and {len(completed)} completions acknowledged by the old primary, "
          f"lost: {len(lost_enqueues)} enqueues, {len(lost_completions)} completions "
          f"(run again on the new primary); {running} jobs running on the new primary whose owners were "
          f"gone; {len(new_tokens)} claims on the new primary")
    assert old_tokens and new_tokens
    assert not old_tokens & new_tokens, "a token the old primary handed out was handed out again"
    assert all(attempt > 100000 for job_id, attempt in new_tokens if job_id in {i for i, _ in old_tokens})
