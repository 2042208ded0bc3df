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
