"""History that is dropped, not deleted (issue 40): pgq.configure_queue(..., archive => true) has the
sweep move the queue's finished jobs (a minute after their end) from pgq.jobs into pgq.archive,
partitioned by day of finished_at, with their events; retention drops a day's partitions whole. The
reads (get_job, job_result, job_history, job_links, list_jobs) find a job wherever it is; pgq.retry
takes an archived failed job back. A job something reads in pgq.jobs stays there."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import psycopg
import pytest

from pgq_thin import migrate
from pgq_tools.bench import _migrate_to  # a database at the base commit's schema and functions

from catalogkit import MIGRATIONS
from loginkit import PROD, PROD2, READERS, WATCH, Login
from plankit import capture, plan_of
from sqlfixtures import dsn, module_dsn, running_job, sqlstate_of, wait_until_blocked  # noqa: F401
from sqlhelpers import fresh_database, one

NEWEST = str(int(max(p.name for p in MIGRATIONS.glob("0*.sql"))[:4]))


@pytest.fixture(autouse=True)
def empty_archive(dsn: str) -> None:  # noqa: F811
    """The dsn fixture empties pgq.jobs and restarts its ids: the archive goes with it, partitions too."""
    with psycopg.connect(dsn, autocommit=True) as c:
        for (name,) in c.execute("SELECT c.relname::text FROM pg_inherits AS i JOIN pg_class AS c "
                                 "ON c.oid = i.inhrelid WHERE i.inhparent IN "
                                 "('pgq.archive'::regclass, 'pgq.archive_events'::regclass)"):
            c.execute(f'DROP TABLE pgq."{name}"')
        c.execute("TRUNCATE pgq.archive_cursors")


def finish(conn: psycopg.Connection, queue: str = "q", how: str = "complete", **kwargs) -> int:
    job_id, attempt = running_job(conn, queue, **kwargs)
    if how == "complete":
        conn.execute("SELECT pgq.complete(%s, %s, '{\"r\": 1}')", (job_id, attempt))
    elif how == "fail":
        conn.execute("SELECT pgq.fail(%s, %s, 'boom', retryable => false)", (job_id, attempt))
    else:
        conn.execute("SELECT pgq.cancel(%s)", (job_id,))
    return job_id


def age(conn: psycopg.Connection, job_id: int, by: str = "2 minutes") -> None:
    """The move takes jobs that finished a minute ago or more."""
    conn.execute("UPDATE pgq.jobs SET finished_at = finished_at - %s::interval WHERE id = %s", (by, job_id))


def where(conn: psycopg.Connection, job_id: int) -> str | None:
    return one(conn, "SELECT CASE WHEN EXISTS (SELECT FROM pgq.jobs WHERE id = %(id)s) THEN 'jobs' "
                     "WHEN EXISTS (SELECT FROM pgq.archive WHERE id = %(id)s) THEN 'archive' END", {"id": job_id})


def partitions(conn: psycopg.Connection, parent: str = "pgq.archive") -> list[str]:
    return [r[0] for r in conn.execute("SELECT c.relname::text FROM pg_inherits AS i JOIN pg_class AS c "
                                       "ON c.oid = i.inhrelid WHERE i.inhparent = %s::regclass ORDER BY 1",
                                       (parent,))]


def test_archive_defaults_to_false_and_null_leaves_it_as_it_is(conn: psycopg.Connection) -> None:
    assert one(conn, "SELECT archive FROM pgq.configure_queue('q')") is False
    assert one(conn, "SELECT archive FROM pgq.configure_queue('q', archive => true)") is True
    assert one(conn, "SELECT archive FROM pgq.configure_queue('q', max_attempts => 3)") is True
    assert one(conn, "SELECT archive FROM pgq.configure_queue('q', archive => false)") is False


def test_the_archive_has_the_columns_of_pgq_jobs_in_their_order(conn: psycopg.Connection) -> None:
    def columns(table: str) -> list[tuple]:
        return conn.execute("SELECT attname, atttypid::regtype::text FROM pg_attribute WHERE attrelid = %s::regclass "
                            "AND attnum > 0 AND NOT attisdropped ORDER BY attnum", (table,)).fetchall()
    assert columns("pgq.archive") == columns("pgq.jobs")
    assert columns("pgq.archive_events") == columns("pgq.job_events") + [("finished_at", "timestamp with time zone")]


def test_the_sweep_moves_finished_jobs_with_their_events_and_every_read_finds_them(
        conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('q', archive => true, audit => true)")
    done, failed, cancelled = finish(conn), finish(conn, how="fail"), finish(conn, how="cancel")
    fresh = finish(conn)  # finished less than a minute ago: not yet
    history = {i: conn.execute("SELECT * FROM pgq.job_history(%s)", (i,)).fetchall() for i in (done, failed, cancelled)}
    for i in (done, failed, cancelled):
        age(conn, i)
    before = {i: conn.execute("SELECT * FROM pgq.get_job(%s)", (i,)).fetchone() for i in (done, failed, cancelled)}
    stats = conn.execute("SELECT done, failed, cancelled FROM pgq.stats() WHERE queue = 'q'").fetchone()
    conn.execute("SELECT pgq.sweep()")
    assert [where(conn, i) for i in (done, failed, cancelled, fresh)] == ["archive", "archive", "archive", "jobs"]
    assert one(conn, "SELECT count(*) FROM pgq.job_events WHERE job_id = ANY (%s)", ([done, failed, cancelled],)) == 0
    for i in (done, failed, cancelled):
        assert conn.execute("SELECT * FROM pgq.get_job(%s)", (i,)).fetchone() == before[i]
        assert conn.execute("SELECT * FROM pgq.job_history(%s)", (i,)).fetchall() == history[i]
        assert history[i]
    assert conn.execute("SELECT state, result, last_error FROM pgq.job_result(%s)", (done,)).fetchone() == \
        ("done", {"r": 1}, None)
    assert one(conn, "SELECT state FROM pgq.job_result(%s)", (failed,)) == "failed"
    assert one(conn, "SELECT count(*) FROM pgq.job_links(%s)", (done,)) == 0
    assert conn.execute("SELECT done, failed, cancelled FROM pgq.stats() WHERE queue = 'q'").fetchone() == stats
    # list_jobs: archived and hot jobs of a state together, newest first, keyset-paged across both.
    assert [r[0] for r in conn.execute("SELECT id FROM pgq.list_jobs('q', 'done')")] == [fresh, done]
    assert [r[0] for r in conn.execute("SELECT id FROM pgq.list_jobs('q', 'done', limit_rows => 1)")] == [fresh]
    assert [r[0] for r in conn.execute("SELECT id FROM pgq.list_jobs('q', 'done', before_id => %s)", (fresh,))] \
        == [done]
    assert [r[0] for r in conn.execute("SELECT id FROM pgq.list_jobs('q')")] == [fresh, cancelled, failed, done]
    assert [r[0] for r in conn.execute("SELECT id FROM pgq.list_jobs(kind => 'k', state => 'failed')")] == [failed]
    # The day partition of their finish, and tomorrow's, made ahead.
    assert len(partitions(conn)) == 2 and len(partitions(conn, "pgq.archive_events")) == 2


def test_a_queue_without_archive_keeps_its_finished_jobs_in_pgq_jobs(conn: psycopg.Connection) -> None:
    job_id = finish(conn)
    age(conn, job_id)
    conn.execute("SELECT pgq.sweep()")
    assert where(conn, job_id) == "jobs"
    assert partitions(conn) == []


def test_a_job_something_reads_in_pgq_jobs_stays_and_is_read_once(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('q', archive => true)")
    held = finish(conn, unique_key="u")
    depended = finish(conn)
    conn.execute("SELECT pgq.enqueue('other', 'k', depends_on => ARRAY[%s]::bigint[])", (depended,))
    batch = one(conn, "SELECT pgq.batch_open('cb', 'k')")
    member = one(conn, "SELECT pgq.enqueue('q', 'k', batch => %s)", (batch,))
    claimed = conn.execute("SELECT id, attempt FROM pgq.claim('w', ARRAY['q'])").fetchone()
    assert claimed[0] == member
    conn.execute("SELECT pgq.complete(%s, %s)", claimed)
    plain = finish(conn)
    for i in (held, depended, member, plain):
        age(conn, i)
    conn.execute("SELECT pgq.sweep()")
    assert [where(conn, i) for i in (held, depended, member, plain)] == ["jobs", "jobs", "jobs", "archive"]
    # The cursor has passed them: the next sweep does not read them again.
    assert one(conn, "SELECT id FROM pgq.archive_cursors WHERE queue = 'q' AND state = 'done'") == plain


def test_a_job_an_enqueue_in_flight_holds_is_skipped_not_waited_for(conn: psycopg.Connection, dsn: str) -> None:  # noqa: F811
    conn.execute("SELECT pgq.configure_queue('q', archive => true)")
    job_id = finish(conn)
    age(conn, job_id)
    with psycopg.connect(dsn) as holder:
        holder.execute("SELECT FROM pgq.jobs WHERE id = %s FOR KEY SHARE", (job_id,))
        conn.execute("SELECT pgq.sweep()")
        assert where(conn, job_id) == "jobs"
        holder.rollback()


def test_retention_drops_whole_days_and_leaves_no_dead_tuple_in_pgq_jobs(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('q', archive => true, retention => '10 days')")
    old = finish(conn)
    age(conn, old, "5 days")
    recent = finish(conn)
    age(conn, recent)
    conn.execute("SELECT pgq.sweep()")
    assert where(conn, old) == "archive" and where(conn, recent) == "archive"
    days = partitions(conn)
    assert len(days) == 3  # five days ago, today, tomorrow
    conn.execute("SELECT pgq.configure_queue('q', retention => '2 days')")
    conn.execute("VACUUM pgq.jobs")
    conn.execute("SELECT pg_stat_force_next_flush()")
    dead = conn.execute("SELECT n_dead_tup, n_tup_del FROM pg_stat_user_tables "
                        "WHERE relid = 'pgq.jobs'::regclass").fetchone()
    conn.execute("SELECT pgq.sweep()")  # the old day is past 2 days: dropped
    assert partitions(conn) == days[1:]
    assert partitions(conn, "pgq.archive_events") == ["archive_events_" + d[len("archive_"):] for d in days[1:]]
    assert sqlstate_of(conn, "SELECT pgq.get_job(%s)", (old,)) == "P0002"
    assert where(conn, recent) == "archive"
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT pg_stat_clear_snapshot()")
    assert conn.execute("SELECT n_dead_tup, n_tup_del FROM pg_stat_user_tables "
                        "WHERE relid = 'pgq.jobs'::regclass").fetchone() == dead


def test_mixed_retentions_keep_the_day_for_the_longest_and_delete_the_shorter_ones_rows_from_the_archive(
        conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('short', archive => true, retention => '1 day')")
    conn.execute("SELECT pgq.configure_queue('long', archive => true, retention => '10 days')")
    a = finish(conn, "short")
    b = finish(conn, "long")
    age(conn, a, "3 days")
    age(conn, b, "3 days")
    conn.execute("SELECT pgq.sweep()")  # moves both into the day of three days ago
    conn.execute("SELECT pgq.sweep()")  # the short queue's job is past its day of retention
    assert where(conn, a) is None and where(conn, b) == "archive"
    assert len(partitions(conn)) == 3


def test_an_archived_failed_job_can_be_retried_and_comes_back_with_its_history(conn: psycopg.Connection) -> None:
    conn.execute("SELECT pgq.configure_queue('q', archive => true, audit => true)")
    failed, done = finish(conn, how="fail"), finish(conn)
    age(conn, failed)
    age(conn, done)
    history = conn.execute("SELECT * FROM pgq.job_history(%s)", (failed,)).fetchall()
    conn.execute("SELECT pgq.sweep()")
    assert where(conn, failed) == "archive"
    assert one(conn, "SELECT pgq.retry(%s)", (failed,)) is True
    assert where(conn, failed) == "jobs"
    assert one(conn, "SELECT state FROM pgq.get_job(%s)", (failed,)) == "pending"
    assert conn.execute("SELECT * FROM pgq.job_history(%s)", (failed,)).fetchall()[:len(history)] == history
    # A done job cannot be retried, archived or not; cancel of an archived job: it had finished.
    assert sqlstate_of(conn, "SELECT pgq.retry(%s)", (done,)) == "55000"
    assert one(conn, "SELECT pgq.cancel(%s)", (done,)) is False
    assert where(conn, done) == "archive"


def test_a_retry_racing_the_sweep_moving_the_job_gets_it_back(conn: psycopg.Connection, dsn: str) -> None:  # noqa: F811
    conn.execute("SELECT pgq.configure_queue('q', archive => true)")
    failed = finish(conn, how="fail")
    age(conn, failed)
    with psycopg.connect(dsn) as sweeper, psycopg.connect(dsn, autocommit=True) as admin:
        sweeper.execute("SELECT pgq.sweep()")  # moved, not committed: it holds the job's row
        result: list[object] = []
        t = threading.Thread(target=lambda: result.append(one(admin, "SELECT pgq.retry(%s)", (failed,))))
        t.start()
        wait_until_blocked(conn, admin.info.backend_pid)
        sweeper.commit()
        t.join(10)
    assert result == [True]
    assert where(conn, failed) == "jobs"
    assert one(conn, "SELECT state FROM pgq.get_job(%s)", (failed,)) == "pending"


def test_a_reader_during_the_move_sees_the_job_in_one_place(conn: psycopg.Connection, dsn: str) -> None:  # noqa: F811
    conn.execute("SELECT pgq.configure_queue('q', archive => true)")
    job_id = finish(conn)
    age(conn, job_id)
    with psycopg.connect(dsn) as sweeper, psycopg.connect(dsn) as reader:
        reader.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        assert one(reader, "SELECT state FROM pgq.get_job(%s)", (job_id,)) == "done"
        sweeper.execute("SELECT pgq.sweep()")
        sweeper.commit()
        assert where(conn, job_id) == "archive"
        assert one(reader, "SELECT state FROM pgq.get_job(%s)", (job_id,)) == "done"  # its snapshot: pgq.jobs
        reader.rollback()
        assert one(reader, "SELECT state FROM pgq.get_job(%s)", (job_id,)) == "done"  # now: the archive


#: Each read of one job, on a job still in pgq.jobs (`{id}`), and the handler's reads of other jobs
#: (`{owner}`, `{attempt}`: a running job of another queue).
READS_OF_A_LIVE_JOB = {
    "get_job": "SELECT state FROM pgq.get_job({id})",
    "job_result": "SELECT * FROM pgq.job_result({id})",
    "job_history": "SELECT count(*) FROM pgq.job_history({id})",
    "job_links": "SELECT count(*) FROM pgq.job_links({id})",
    "job_steps": "SELECT count(*) FROM pgq.job_steps({id})",
    "update_job": "SELECT pgq.update_job({id}, '{{}}')",
    "cancel_workflow": "SELECT pgq.cancel_workflow({id})",
    "await_jobs": "SELECT pgq.await_jobs({owner}, {attempt}, ARRAY[{id}]::bigint[])",
    "job_outcomes": "SELECT count(*) FROM pgq.job_outcomes({owner}, {attempt}, ARRAY[{id}]::bigint[])",
}


@pytest.mark.parametrize("read", READS_OF_A_LIVE_JOB)
def test_a_read_of_a_job_in_pgq_jobs_takes_no_lock_on_the_archive(conn: psycopg.Connection, dsn: str,  # noqa: F811
                                                                   read: str) -> None:
    """A transaction that read a job still in pgq.jobs holds no lock on the archive's tables: the
    sweep creates the day's partition (which waits at most 100 ms for its lock, then leaves the move
    to the next sweep) and moves the job meanwhile."""
    conn.execute("SELECT pgq.configure_queue('q', archive => true)")
    job_id = finish(conn)
    age(conn, job_id)
    owner, attempt = running_job(conn, "w")
    with psycopg.connect(dsn) as reader:
        reader.execute(READS_OF_A_LIVE_JOB[read].format(id=job_id, owner=owner, attempt=attempt)).fetchall()
        conn.execute("SELECT pgq.sweep()")
        assert where(conn, job_id) == "archive", "the reader's open transaction kept the sweep from archiving"
        reader.rollback()
    assert partitions(conn) != []


def test_no_role_reads_the_archive_directly(conn: psycopg.Connection, connect) -> None:
    conn.execute("SELECT pgq.configure_queue('q', archive => true)")
    job_id = finish(conn)
    age(conn, job_id)
    conn.execute("SELECT pgq.sweep()")
    c = connect(role="pgq_admin")
    for table in ("archive", "archive_events", "archive_cursors", *partitions(conn)):
        assert sqlstate_of(c, f"SELECT * FROM pgq.{table}") == "42501"
    assert one(c, "SELECT state FROM pgq.get_job(%s)", (job_id,)) == "done"


def test_job_links_shows_archived_linked_jobs_and_hides_those_of_queues_the_login_may_not_read(
        conn: psycopg.Connection, login: Login) -> None:
    """A job's links name jobs that may be archived too (a dependency is archived once its last
    dependant is): job_links gives their queue, kind and state from the archive, and leaves out one
    of a queue the login may not read, as it does for a job in pgq.jobs."""
    for name in ("q", "r", "secret"):  # the sweep's order: q's job first, its links go with it
        conn.execute("SELECT pgq.configure_queue(%s, archive => true)", (name,))
    readable, hidden = finish(conn, "r"), finish(conn, "secret")
    job_id = one(conn, "SELECT pgq.enqueue('q', 'k', depends_on => ARRAY[%s, %s]::bigint[])", (readable, hidden))
    attempt = one(conn, "SELECT attempt FROM pgq.claim('w', ARRAY['q'])")
    conn.execute("SELECT pgq.complete(%s, %s)", (job_id, attempt))
    conn.execute("SELECT pgq.grant_queue('secret', %s, 'read')", (READERS,))
    for i in (readable, hidden, job_id):
        age(conn, i)
    conn.execute("SELECT pgq.sweep()")
    assert [where(conn, i) for i in (job_id, readable, hidden)] == ["archive"] * 3
    links = "SELECT relation, job_id, queue, kind, state FROM pgq.job_links(%s)"
    assert conn.execute(links, (job_id,)).fetchall() == [("dependency", readable, "r", "k", "done"),
                                                         ("dependency", hidden, "secret", "k", "done")]
    watch = login(WATCH)  # a monitor outside the secret queue's read grant
    assert watch.execute(links, (job_id,)).fetchall() == [("dependency", readable, "r", "k", "done")]
    conn.execute(f"GRANT {READERS} TO {WATCH}")
    try:
        assert len(watch.execute(links, (job_id,)).fetchall()) == 2
    finally:
        conn.execute(f"REVOKE {READERS} FROM {WATCH}")


def test_job_steps_of_an_archived_job_is_empty_not_unknown(conn: psycopg.Connection, login: Login) -> None:
    """An archived job has no recorded steps (a job with steps stays in pgq.jobs): job_steps answers
    none, as for any readable job without steps, and P0002 to a login that may not read it."""
    conn.execute("SELECT pgq.configure_queue('secret', archive => true)")
    job_id = finish(conn, "secret")
    age(conn, job_id)
    conn.execute("SELECT pgq.sweep()")
    assert where(conn, job_id) == "archive"
    assert conn.execute("SELECT * FROM pgq.job_steps(%s)", (job_id,)).fetchall() == []
    conn.execute("SELECT pgq.grant_queue('secret', %s, 'read')", (READERS,))
    assert sqlstate_of(login(WATCH), "SELECT * FROM pgq.job_steps(%s)", (job_id,)) == "P0002"
    assert sqlstate_of(conn, "SELECT * FROM pgq.job_steps(%s)", (job_id + 1000,)) == "P0002"


def test_a_handler_awaits_and_reads_the_outcome_of_an_archived_job(conn: psycopg.Connection) -> None:
    """pgq.await_jobs and pgq.job_outcomes take any job the caller may read: an archived one has
    ended (its outcome read from the archive), not "no job with id"."""
    conn.execute("SELECT pgq.configure_queue('q', archive => true)")
    done, failed = finish(conn), finish(conn, how="fail")
    for i in (done, failed):
        age(conn, i)
    conn.execute("SELECT pgq.sweep()")
    assert [where(conn, i) for i in (done, failed)] == ["archive", "archive"]
    job_id, attempt = running_job(conn, "w")
    assert one(conn, "SELECT pgq.await_jobs(%s, %s, ARRAY[%s, %s]::bigint[])", (job_id, attempt, done, failed)) \
        == "ended"
    outcomes = conn.execute("SELECT job_id, state, result, last_error, finished_at IS NOT NULL "
                            "FROM pgq.job_outcomes(%s, %s, ARRAY[%s, %s, %s]::bigint[])",
                            (job_id, attempt, done, failed, failed + 1000)).fetchall()
    assert outcomes == [(done, "done", {"r": 1}, None, True), (failed, "failed", None, "boom", True),
                        (failed + 1000, None, None, None, False)]
    assert sqlstate_of(conn, "SELECT pgq.await_jobs(%s, %s, ARRAY[%s]::bigint[])",
                       (job_id, attempt, failed + 1000)) == "22023"


def test_the_bulk_calls_act_on_pgq_jobs_only_and_retry_takes_an_archived_job_back(conn: psycopg.Connection) -> None:
    """As documented (docs/sql-api.md, archived history): retry_jobs, delete_jobs and prune leave
    archived jobs alone; pgq.retry(id) is how an operator retries one, and the day's drop removes them."""
    conn.execute("SELECT pgq.configure_queue('q', archive => true)")
    archived, hot = finish(conn, how="fail"), finish(conn, how="fail")
    age(conn, archived)
    conn.execute("SELECT pgq.sweep()")
    assert [where(conn, i) for i in (archived, hot)] == ["archive", "jobs"]
    assert one(conn, "SELECT pgq.delete_jobs('q', 'failed', before => now() + interval '1 day')") == 1
    assert one(conn, "SELECT pgq.retry_jobs('q', 'failed')") == 0
    assert one(conn, "SELECT pgq.prune(interval '0')") == 0
    assert where(conn, archived) == "archive" and where(conn, hot) is None
    assert one(conn, "SELECT pgq.retry(%s)", (archived,)) is True
    assert where(conn, archived) == "jobs"


def test_update_job_and_cancel_workflow_answer_an_archived_job_as_a_finished_one(
        conn: psycopg.Connection, login: Login) -> None:
    """An archived job has ended: update_job answers false and cancel_workflow 0, as for a job that
    finished in pgq.jobs, not "no job with id"; to a login that may not touch it, P0002 either way."""
    conn.execute("SELECT pgq.configure_queue('q', archive => true)")
    producer = login(PROD)
    job_id = one(producer, "SELECT pgq.enqueue('q', 'k')")
    (c,) = conn.execute("SELECT id, attempt FROM pgq.claim('w', ARRAY['q'])").fetchall()
    assert c[0] == job_id
    conn.execute("SELECT pgq.complete(%s, %s)", c)
    finished_here = one(producer, "SELECT pgq.update_job(%s, '{\"x\": 1}')", (job_id,))
    assert (finished_here, one(producer, "SELECT pgq.cancel_workflow(%s)", (job_id,))) == (False, 0)
    age(conn, job_id)
    conn.execute("SELECT pgq.sweep()")
    assert where(conn, job_id) == "archive"
    assert one(producer, "SELECT pgq.update_job(%s, '{\"x\": 1}')", (job_id,)) is False
    assert one(producer, "SELECT pgq.cancel_workflow(%s)", (job_id,)) == 0
    assert one(conn, "SELECT pgq.cancel_workflow(%s)", (job_id,)) == 0  # an admin
    stranger = login(PROD2)
    assert sqlstate_of(stranger, "SELECT pgq.update_job(%s, '{}')", (job_id,)) == "P0002"
    assert sqlstate_of(stranger, "SELECT pgq.cancel_workflow(%s)", (job_id,)) == "P0002"
    assert sqlstate_of(producer, "SELECT pgq.update_job(%s, '{}')", (job_id + 1000,)) == "P0002"
    assert one(conn, "SELECT payload FROM pgq.get_job(%s)", (job_id,)) == {}


def test_list_jobs_by_tags_finds_archived_jobs_through_the_archive_tags_index(
        conn: psycopg.Connection, login: Login) -> None:
    """list_jobs' tags filter reads the archive too (issue 40: a read finds a job wherever it is):
    archived tagged jobs are listed with the others of their state, newest first, keyset-paged,
    hidden from a login that may not read their queue, read through each day partition's GIN index."""
    for name in ("q", "secret"):
        conn.execute("SELECT pgq.configure_queue(%s, archive => true)", (name,))
    tagged = [finish(conn, tags=["a", "b"]) for _ in range(3)]
    other = finish(conn, tags=["a"])
    untagged = finish(conn)
    hidden = finish(conn, "secret", tags=["a", "b"])
    hot = finish(conn, tags=["b", "a"])  # finished, not archived yet
    live = one(conn, "SELECT pgq.enqueue('q', 'k', tags => '{a,b}')")
    for i in (*tagged, other, untagged, hidden):
        age(conn, i)
    conn.execute("SELECT pgq.sweep()")
    assert {where(conn, i) for i in (*tagged, other, untagged, hidden)} == {"archive"}
    assert where(conn, hot) == "jobs"

    def ids(c: psycopg.Connection, sql: str) -> list[int]:
        return [r[0] for r in c.execute(sql)]

    assert ids(conn, "SELECT id FROM pgq.list_jobs(tags => '{a,b}')") == [live, hot, hidden, *tagged[::-1]]
    assert ids(conn, "SELECT id FROM pgq.list_jobs('q', 'done', tags => '{b}')") == [hot, *tagged[::-1]]
    assert ids(conn, f"SELECT id FROM pgq.list_jobs(tags => '{{a}}', limit_rows => 2, before_id => {hidden})") \
        == [other, tagged[2]]
    assert ids(conn, "SELECT id FROM pgq.list_jobs(state => 'pending', tags => '{a}')") == [live]
    conn.execute("SELECT pgq.grant_queue('secret', %s, 'read')", (READERS,))
    assert ids(login(WATCH), "SELECT id FROM pgq.list_jobs(tags => '{a,b}')") == [live, hot, *tagged[::-1]]
    # The plan, with a day of untagged history beside the tagged jobs: the index, not a scan of the day.
    conn.execute("""
        INSERT INTO pgq.jobs (queue, kind, state, attempt, max_attempts, run_at, created_at, finished_at, last_event)
        SELECT 'q', 'k', 'done', 1, 25, now() - interval '1 hour', now() - interval '1 hour',
               now() - interval '2 minutes', 'enqueued'
        FROM generate_series(1, 3000)""")
    assert one(conn, "SELECT pgq._archive_jobs(array_agg(id)) FROM pgq.jobs WHERE id > %s", (live,)) == 3000
    conn.execute("ANALYZE pgq.archive")
    # Once pgq.jobs is vacuumed (autovacuum did it in a CI run), the planner, left to itself, walked
    # each day partition's archive_id_idx backwards instead: all 3,000 untagged jobs for 4 tagged.
    conn.execute("VACUUM ANALYZE pgq.jobs")
    conn.execute("LOAD 'auto_explain'")
    rows, plans = capture(conn, "SELECT * FROM pgq.list_jobs(tags => '{a,b}')")
    assert len(rows) == 6
    page = plan_of(plans, "t.tags @> _list_tagged.tags")
    assert "Bitmap Index Scan on archive_" in page.text and "Seq Scan on archive_" not in page.text, page.text
    assert "Bitmap Index Scan on jobs_tags_idx" in page.text, page.text
    assert "Index Scan Backward" not in page.text, page.text


@pytest.mark.parametrize("value", ["NULL", "true", "false"])
def test_configure_queue_archive_takes_null_true_false(conn: psycopg.Connection, value: str) -> None:
    assert sqlstate_of(conn, f"SELECT pgq.configure_queue('q', archive => {value})") is None


def test_bad_archive_input_is_refused(conn: psycopg.Connection) -> None:
    assert sqlstate_of(conn, "SELECT pgq.configure_queue('q', archive => 'maybe')") == "22P02"
    assert sqlstate_of(conn, "SELECT pgq.get_job(NULL)") == "22004"
    assert sqlstate_of(conn, "SELECT pgq.job_history(NULL)") == "22004"


@pytest.fixture
def at_0029(databases) -> Iterator[str]:
    """A database at the schema and functions of the base commit (migration 0029)."""
    for dsn_0029 in fresh_database(databases, "template1"):
        _migrate_to(dsn_0029, "git:2f25220")
        yield dsn_0029


def reads(c: psycopg.Connection, ids: list[int]) -> dict[int, tuple]:
    return {i: (c.execute("SELECT * FROM pgq.get_job(%s)", (i,)).fetchone(),
                c.execute("SELECT * FROM pgq.job_history(%s)", (i,)).fetchall(),
                c.execute("SELECT * FROM pgq.job_result(%s)", (i,)).fetchone(),
                c.execute("SELECT * FROM pgq.job_links(%s)", (i,)).fetchall()) for i in ids}


def test_an_upgrade_from_0029_keeps_every_job_readable_and_archiving_them_changes_no_read(at_0029: str) -> None:
    with psycopg.connect(at_0029, autocommit=True) as su:
        assert one(su, "SELECT pgq.version()") == "29"
        su.execute("SELECT pgq.configure_queue('q', audit => true, max_attempts => 1)")
        su.execute("SELECT pgq.enqueue_many('q', 'k', array_fill('{}'::jsonb, ARRAY[8]))")
        rows = su.execute("SELECT id, attempt FROM pgq.claim('w', ARRAY['q'], 6)").fetchall()
        su.execute("SELECT pgq.complete(%s, %s, '{\"ok\": 1}')", rows[0])
        su.execute("SELECT pgq.complete(%s, %s)", rows[1])
        su.execute("SELECT pgq.fail(%s, %s, 'boom')", rows[2])
        su.execute("SELECT pgq.cancel(%s)", (rows[3][0],))
        su.execute("SELECT pgq.mark_unknown(%s, %s, 'maybe')", rows[4])
        ids = [r[0] for r in su.execute("SELECT id FROM pgq.jobs ORDER BY id")]
        states = dict(su.execute("SELECT id, state::text FROM pgq.jobs").fetchall())
        su.execute("UPDATE pgq.jobs SET finished_at = finished_at - interval '2 minutes'")
        before = reads(su, ids)
    migrate(at_0029)
    with psycopg.connect(at_0029, autocommit=True) as su:
        assert one(su, "SELECT pgq.version()") == NEWEST  # the newest migration's number
        assert reads(su, ids) == before
        su.execute("SELECT pgq.configure_queue('q', archive => true)")
        su.execute("SELECT pgq.sweep()")
        archived = {r[0] for r in su.execute("SELECT id FROM pgq.archive")}
        assert archived == {i for i, s in states.items() if s in ("done", "failed", "cancelled")}
        assert reads(su, ids) == before
        assert sorted(r[0] for r in su.execute("SELECT id FROM pgq.list_jobs('q', limit_rows => 100)")) == ids


def test_an_unfiltered_list_jobs_pages_as_the_union_of_the_queues_pages(conn: psycopg.Connection) -> None:
    """list_jobs() without a filter walks pgq.jobs and the archive by id (issue 40): its pages, keyset-paged
    with before_id across both, hold the same rows in the same order as the queues' own listings
    (the per-(queue, state) path) put together, whatever the page size."""
    conn.execute("INSERT INTO pgq.queues (name) SELECT 'q' || n FROM generate_series(0, 4) AS n")
    for name in ("q1", "q3"):
        conn.execute("SELECT pgq.configure_queue(%s, archive => true)", (name,))
    # 7 states in turn over 5 queues (coprime: every pair), finished over 3 days.
    conn.execute("""
        INSERT INTO pgq.jobs (queue, kind, state, attempt, max_attempts, run_at, created_at, finished_at,
                              last_event, lease_until, depends_on, dependencies_left)
        SELECT 'q' || g % 5, 'k' || g % 3, s.state, 1, 25, now() - interval '1 hour', now() - interval '1 hour',
               CASE WHEN s.state IN ('done', 'failed', 'cancelled') THEN now() - interval '1 day' * (g % 3) END,
               'enqueued', CASE WHEN s.state = 'running' THEN now() + interval '1 hour' END,
               CASE WHEN s.state = 'waiting' THEN '{1}'::bigint[] END, CASE WHEN s.state = 'waiting' THEN 1 END
        FROM generate_series(1, 700) AS g,
             LATERAL (SELECT (enum_range(NULL::pgq.job_state))[1 + g % 7] AS state) AS s""")
    # Three quarters of the archiving queues' finished jobs in the archive, the rest still in pgq.jobs.
    assert one(conn, "SELECT pgq._archive_jobs(array_agg(id)) FROM pgq.jobs WHERE queue IN ('q1', 'q3')"
                     " AND state IN ('done', 'failed', 'cancelled') AND id % 4 <> 0") > 50
    assert len(partitions(conn)) == 3
    cols = "id, queue, kind, state, finished_at, lease_until"
    expected = sorted((r for q in ("q0", "q1", "q2", "q3", "q4") for r in conn.execute(
        f"SELECT {cols} FROM pgq.list_jobs(%s, limit_rows => 1000)", (q,))), key=lambda r: -r[0])
    assert len(expected) == 700
    assert {r[3] for r in expected} == set(one(conn, "SELECT enum_range(NULL::pgq.job_state)::text[]"))
    for size in (1, 7, 50, 1000):
        got: list[tuple] = []
        before = None
        while True:
            page = conn.execute(f"SELECT {cols} FROM pgq.list_jobs(limit_rows => %s, before_id => %s)",
                                (size, before)).fetchall()
            assert len(page) <= size
            if not page:
                break
            got += page
            before = page[-1][0]
        assert got == expected, size
    # Whole rows, the first page: as the queues' own listings give them.
    whole = conn.execute("SELECT * FROM pgq.list_jobs(limit_rows => 40)").fetchall()
    assert [r[0] for r in whole] == [r[0] for r in expected[:40]]
    for row in whole:
        assert row in conn.execute("SELECT * FROM pgq.list_jobs(%s, %s, limit_rows => 1000)",
                                   (row[1], row[5])).fetchall()
