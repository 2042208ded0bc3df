"""Schedules: pgq.schedule / unschedule / schedules, firing from sweep and claim, at most one job
per (schedule, fire time) under concurrent sweepers and claimers, missed occurrences collapsing
into one, skip_if_running, the link from a job to its schedule, bad arguments, the probe's plan.

Time is moved with the test clock (clockdb.py): pgq's functions read it through pgq._now().
"""

from __future__ import annotations

import random
import threading
from datetime import datetime, timedelta, timezone

import psycopg
import pytest
from croniter import croniter

from clockdb import clock_module_dsn, dsn, set_clock  # noqa: F401  (fixtures)
from sqlfixtures import row_counts, sqlstate_of
from sqlhelpers import claim, job, one

T0 = "2030-01-01 12:34:56.5+00"


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(timezone.utc)


def schedule(conn: psycopg.Connection, name: str = "s", queue: str = "q", kind: str = "k", **kw) -> dict:
    args = "".join(f", {k} => %({k})s" for k in kw)
    cur = conn.execute(f"SELECT * FROM pgq.schedule(%(name)s, %(queue)s, %(kind)s{args})",
                       {"name": name, "queue": queue, "kind": kind, **kw})
    row = cur.fetchone()
    assert row is not None
    return dict(zip([d.name for d in cur.description], row))


def schedules(conn: psycopg.Connection) -> dict[str, dict]:
    cur = conn.execute("SELECT * FROM pgq.schedules()")
    names = [d.name for d in cur.description]
    return {r[0]: dict(zip(names, r)) for r in cur.fetchall()}


def scheduled_jobs(conn: psycopg.Connection, name: str = "s") -> list[tuple]:
    return conn.execute("SELECT id, run_at, state::text FROM pgq.jobs WHERE schedule = %s ORDER BY id",
                        (name,)).fetchall()


# Creating ------------------------------------------------------------------------------------------


def test_an_every_schedule_fires_on_the_multiples_of_its_interval_since_the_epoch(conn):
    set_clock(conn, T0)
    s = schedule(conn, every="1 hour", payload='{"report": "daily"}', priority=5, max_attempts=3,
                 tenant="acme")
    assert s["next_run_at"] == utc("2030-01-01 13:00:00+00")
    assert (s["name"], s["queue"], s["kind"], s["cron"], s["every"]) == ("s", "q", "k", None, timedelta(hours=1))
    assert (s["payload"], s["priority"], s["max_attempts"], s["tenant"]) == ({"report": "daily"}, 5, 3, "acme")
    assert (s["timezone"], s["skip_if_running"], s["enabled"]) == ("UTC", False, True)
    assert (s["last_run_at"], s["last_job_id"], s["skipped"]) == (None, None, 0)
    assert schedule(conn, "t", every="15 minutes")["next_run_at"] == utc("2030-01-01 12:45:00+00")
    sevens = (int(utc(T0).timestamp()) // 7 + 1) * 7
    assert schedule(conn, "u", every="7 seconds")["next_run_at"] == datetime.fromtimestamp(sevens, timezone.utc)
    # An occurrence exactly now is not "after now".
    set_clock(conn, "2030-01-01 13:00:00+00")
    assert schedule(conn, "v", every="1 hour")["next_run_at"] == utc("2030-01-01 14:00:00+00")
    # The queue exists from the start (pgq.stats lists it).
    assert one(conn, "SELECT count(*) FROM pgq.stats() WHERE queue = 'q'") == 1
    assert one(conn, "SELECT count(*) FROM pgq.jobs") == 0


def test_schedules_lists_every_schedule_by_name(conn):
    set_clock(conn, T0)
    schedule(conn, "b", every="1 minute")
    schedule(conn, "a", every="1 hour", enabled=False)
    assert list(schedules(conn)) == ["a", "b"]


# Firing ------------------------------------------------------------------------------------------


def test_a_sweep_enqueues_a_due_occurrence_once_with_run_at_the_fire_time_and_a_link_to_its_schedule(conn):
    set_clock(conn, T0)
    schedule(conn, every="1 hour", payload='{"p": 1}', priority=2, max_attempts=4, tenant="t")
    assert one(conn, "SELECT pgq.sweep()") == 0
    assert scheduled_jobs(conn) == []
    set_clock(conn, "2030-01-01 13:00:00.2+00")
    assert one(conn, "SELECT pgq.sweep()") == 0  # it recovered nothing; it fired one schedule
    ((job_id, run_at, state),) = scheduled_jobs(conn)
    assert (run_at, state) == (utc("2030-01-01 13:00:00+00"), "pending")
    row = job(conn, job_id)
    assert (row["queue"], row["kind"], row["payload"], row["priority"], row["max_attempts"], row["tenant"]) \
        == ("q", "k", {"p": 1}, 2, 4, "t")
    got = conn.execute("SELECT schedule FROM pgq.get_job(%s)", (job_id,)).fetchone()
    assert got == ("s",)
    s = schedules(conn)["s"]
    assert (s["last_run_at"], s["last_job_id"], s["next_run_at"]) == (
        utc("2030-01-01 13:00:00+00"), job_id, utc("2030-01-01 14:00:00+00"))
    # Again at the same time, and just before the next occurrence: nothing more.
    one(conn, "SELECT pgq.sweep()")
    set_clock(conn, "2030-01-01 13:59:59.999999+00")
    one(conn, "SELECT pgq.sweep()")
    assert len(scheduled_jobs(conn)) == 1


def test_a_claim_fires_a_due_schedule_and_can_claim_its_job_at_once(conn):
    set_clock(conn, T0)
    schedule(conn, every="1 minute", queue="reports")
    set_clock(conn, "2030-01-01 12:35:00+00")
    (c,) = claim(conn, queues=["reports"], lease="1 hour")
    assert c["run_at"] == utc("2030-01-01 12:35:00+00")
    assert job(conn, c["id"])["schedule"] == "s"
    # A claim of another queue leaves the schedule to the claims of its own queue and to sweeps.
    set_clock(conn, "2030-01-01 12:36:00+00")
    assert claim(conn, queues=["other"]) == []
    assert [r[1] for r in scheduled_jobs(conn)] == [utc("2030-01-01 12:35:00+00")]
    (c,) = claim(conn)  # a claim of every queue (reports included) fires it, and claims its job
    assert c["run_at"] == utc("2030-01-01 12:36:00+00")
    assert [r[1] for r in scheduled_jobs(conn)] == [utc("2030-01-01 12:35:00+00"), utc("2030-01-01 12:36:00+00")]


def queue_due(conn: psycopg.Connection, queue: str = "q"):  # type: ignore[no-untyped-def]
    return one(conn, "SELECT next_schedule_at FROM pgq.queues WHERE name = %s", (queue,))


def test_each_queue_keeps_the_earliest_next_run_at_of_its_enabled_schedules(conn):
    """queues.next_schedule_at is what a claim reads (with the queue's settings, no other table)."""
    set_clock(conn, T0)
    schedule(conn, "hourly", every="1 hour")
    assert queue_due(conn) == utc("2030-01-01 13:00:00+00")
    schedule(conn, "often", every="10 minutes")
    assert queue_due(conn) == utc("2030-01-01 12:40:00+00")
    schedule(conn, "off", every="1 minute", enabled=False)
    assert queue_due(conn) == utc("2030-01-01 12:40:00+00")
    set_clock(conn, "2030-01-01 12:40:00+00")
    (c,) = claim(conn)
    assert job(conn, c["id"])["schedule"] == "often"
    assert queue_due(conn) == utc("2030-01-01 12:50:00+00")
    # Moved to another queue: both queues are brought up to date.
    schedule(conn, "often", queue="other", every="10 minutes")
    assert (queue_due(conn), queue_due(conn, "other")) == (utc("2030-01-01 13:00:00+00"), utc("2030-01-01 12:50:00+00"))
    assert one(conn, "SELECT pgq.unschedule('hourly')") is True
    assert queue_due(conn) is None
    assert one(conn, "SELECT pgq.unschedule('often')") is True
    assert queue_due(conn, "other") is None


def test_a_stale_due_value_is_corrected_by_the_next_claim_and_fires_nothing(conn):
    set_clock(conn, T0)
    schedule(conn, every="1 hour")
    conn.execute("UPDATE pgq.queues SET next_schedule_at = '2030-01-01 12:00:00+00' WHERE name = 'q'")
    assert claim(conn) == []
    assert scheduled_jobs(conn) == []
    assert queue_due(conn) == utc("2030-01-01 13:00:00+00")


def test_missed_occurrences_collapse_into_the_latest_one_and_next_run_at_moves_past_now(conn):
    set_clock(conn, T0)
    schedule(conn, every="1 minute")
    set_clock(conn, "2030-01-01 14:02:30+00")  # an hour and a half without any claim or sweep
    one(conn, "SELECT pgq.sweep()")
    assert [r[1] for r in scheduled_jobs(conn)] == [utc("2030-01-01 14:02:00+00")]
    assert schedules(conn)["s"]["next_run_at"] == utc("2030-01-01 14:03:00+00")
    # A week of missed days collapses the same way.
    schedule(conn, "d", every="1 day")
    set_clock(conn, "2030-01-09 01:00:00+00")
    one(conn, "SELECT pgq.sweep()")
    assert [r[1] for r in scheduled_jobs(conn, "d")] == [utc("2030-01-09 00:00:00+00")]
    assert schedules(conn)["d"]["next_run_at"] == utc("2030-01-10 00:00:00+00")


def test_a_day_long_every_ignores_the_sessions_daylight_saving_time(conn):
    conn.execute("SET TimeZone = 'Europe/Paris'")
    set_clock(conn, "2030-03-30 12:00:00+00")  # the night of 30 to 31 March 2030 is 23 hours long in Paris
    assert schedule(conn, every="1 day")["next_run_at"] == utc("2030-03-31 00:00:00+00")
    set_clock(conn, "2030-04-02 06:00:00+00")
    one(conn, "SELECT pgq.sweep()")
    assert [r[1] for r in scheduled_jobs(conn)] == [utc("2030-04-02 00:00:00+00")]
    assert schedules(conn)["s"]["next_run_at"] == utc("2030-04-03 00:00:00+00")


def test_skip_if_running_skips_and_counts_occurrences_while_the_last_job_is_pending_or_running(conn):
    set_clock(conn, T0)
    schedule(conn, every="1 minute", skip_if_running=True)
    set_clock(conn, "2030-01-01 12:35:00+00")
    one(conn, "SELECT pgq.sweep()")
    ((first, _, _),) = scheduled_jobs(conn)
    set_clock(conn, "2030-01-01 12:36:00+00")
    one(conn, "SELECT pgq.sweep()")  # the first job is pending: skipped
    (c,) = claim(conn, lease="1 hour")
    assert c["id"] == first
    set_clock(conn, "2030-01-01 12:37:00+00")
    one(conn, "SELECT pgq.sweep()")  # running: skipped
    s = schedules(conn)["s"]
    assert (s["skipped"], s["last_skipped_at"], s["last_run_at"], s["last_job_id"], s["next_run_at"]) == (
        2, utc("2030-01-01 12:37:00+00"), utc("2030-01-01 12:35:00+00"), first, utc("2030-01-01 12:38:00+00"))
    assert len(scheduled_jobs(conn)) == 1
    assert one(conn, "SELECT pgq.complete(%s, 1)", (first,)) is True
    set_clock(conn, "2030-01-01 12:38:00+00")
    one(conn, "SELECT pgq.sweep()")
    assert [r[1] for r in scheduled_jobs(conn)][-1] == utc("2030-01-01 12:38:00+00")
    # Without skip_if_running, occurrences pile up as jobs.
    schedule(conn, "free", every="1 minute")
    for minute in (39, 40):
        set_clock(conn, f"2030-01-01 12:{minute}:00+00")
        one(conn, "SELECT pgq.sweep()")
    assert len(scheduled_jobs(conn, "free")) == 2


def test_a_paused_queues_schedule_keeps_one_job_waiting_and_collapses_the_rest_into_it(conn):
    """Issue 24: a schedule kept firing into a paused queue and its jobs piled up. Its occurrences
    collapse into the one job waiting, as missed ones do; the resume runs that one, and the schedule
    goes on."""
    set_clock(conn, T0)
    schedule(conn, every="1 minute")
    conn.execute("SELECT pgq.pause('q')")
    for minute in range(35, 60):  # 25 minutes of sweeps
        set_clock(conn, f"2030-01-01 12:{minute}:00+00")
        one(conn, "SELECT pgq.sweep()")
    jobs = scheduled_jobs(conn)
    assert len(jobs) == 1, f"{len(jobs)} jobs of the schedule in the paused queue"
    ((first, run_at, state),) = jobs
    assert (run_at, state) == (utc("2030-01-01 12:35:00+00"), "pending")
    s = schedules(conn)["s"]
    assert (s["next_run_at"], s["last_job_id"], s["skipped"]) == (utc("2030-01-01 13:00:00+00"), first, 0)
    # Another schedule of the same paused queue keeps one of its own.
    schedule(conn, "other", every="1 minute")
    set_clock(conn, "2030-01-01 13:00:00+00")
    one(conn, "SELECT pgq.sweep()")
    assert [len(scheduled_jobs(conn, name)) for name in ("s", "other")] == [1, 1]
    # Resumed, their jobs run; paused again, a running job is not a waiting one: one more each, then
    # no more.
    conn.execute("SELECT pgq.resume('q')")
    assert len(claim(conn, lease="1 hour", batch=10)) == 2
    conn.execute("SELECT pgq.pause('q')")
    for minute in range(1, 6):
        set_clock(conn, f"2030-01-01 13:0{minute}:00+00")
        one(conn, "SELECT pgq.sweep()")
    for name in ("s", "other"):
        assert [r[2] for r in scheduled_jobs(conn, name)] == ["running", "pending"]
    # Resumed for good: the schedule fires as before (an unpaused queue's jobs are its workers' to take).
    conn.execute("SELECT pgq.resume('q')")
    set_clock(conn, "2030-01-01 13:06:00+00")
    one(conn, "SELECT pgq.sweep()")
    assert [r[2] for r in scheduled_jobs(conn)] == ["running", "pending", "pending"]


def test_a_disabled_schedule_never_fires_and_enabling_it_starts_after_now(conn):
    set_clock(conn, T0)
    schedule(conn, every="1 minute", enabled=False)
    set_clock(conn, "2030-01-01 13:00:30+00")
    one(conn, "SELECT pgq.sweep()")
    claim(conn)
    assert scheduled_jobs(conn) == []
    assert schedule(conn, every="1 minute")["next_run_at"] == utc("2030-01-01 13:01:00+00")


def test_replacing_a_schedule_keeps_its_history_and_never_repeats_a_fire_time(conn):
    set_clock(conn, T0)
    schedule(conn, every="1 minute")
    set_clock(conn, "2030-01-01 12:35:00+00")
    one(conn, "SELECT pgq.sweep()")
    ((job_id, _, _),) = scheduled_jobs(conn)
    # Replaced by a statement whose clock is behind the last fire time (another session's
    # statement started earlier): the next run still comes after the last one.
    set_clock(conn, "2030-01-01 12:34:59+00")
    s = schedule(conn, every="1 minute", kind="k2", payload='{"v": 2}')
    assert (s["kind"], s["payload"], s["last_run_at"], s["last_job_id"], s["next_run_at"]) == (
        "k2", {"v": 2}, utc("2030-01-01 12:35:00+00"), job_id, utc("2030-01-01 12:36:00+00"))
    assert s["created_at"] == schedules(conn)["s"]["created_at"]
    assert len(schedules(conn)) == 1


def test_unschedule_deletes_the_schedule_and_its_jobs_keep_their_link(conn):
    set_clock(conn, T0)
    schedule(conn, every="1 minute")
    set_clock(conn, "2030-01-01 12:35:00+00")
    one(conn, "SELECT pgq.sweep()")
    assert one(conn, "SELECT pgq.unschedule('s')") is True
    assert one(conn, "SELECT pgq.unschedule('s')") is False
    assert schedules(conn) == {}
    set_clock(conn, "2030-01-01 12:40:00+00")
    one(conn, "SELECT pgq.sweep()")
    ((job_id, _, _),) = scheduled_jobs(conn)
    assert conn.execute("SELECT schedule FROM pgq.get_job(%s)", (job_id,)).fetchone() == ("s",)


def test_a_fair_queue_schedules_job_gets_the_schedules_tenant(conn):
    set_clock(conn, T0)
    conn.execute("SELECT pgq.configure_queue('q', fair => true)")
    schedule(conn, every="1 minute")
    schedule(conn, "t", every="1 minute", tenant="acme")
    set_clock(conn, "2030-01-01 12:35:00+00")
    one(conn, "SELECT pgq.sweep()")
    assert sorted(r[0] for r in conn.execute("SELECT tenant FROM pgq.jobs")) == ["", "acme"]
    assert len(claim(conn, batch=2)) == 2


def test_a_repeatable_read_claim_leaves_schedules_to_others(conn, connect):
    set_clock(conn, T0)
    schedule(conn, every="1 minute")
    set_clock(conn, "2030-01-01 12:35:00+00")
    rr = connect(autocommit=False)
    rr.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    assert claim(rr) == []
    rr.commit()
    assert scheduled_jobs(conn) == []
    assert len(claim(conn)) == 1


def test_a_cron_schedule_runs_on_the_wall_clock_of_its_time_zone(conn):
    set_clock(conn, T0)  # 12:34:56 UTC = 13:34:56 in Paris
    s = schedule(conn, cron="30 2 * * *", timezone="Europe/Paris")
    assert (s["cron"], s["every"], s["timezone"]) == ("30 2 * * *", None, "Europe/Paris")
    assert s["next_run_at"] == utc("2030-01-02 01:30:00+00")
    set_clock(conn, "2030-01-02 01:30:00.5+00")
    (c,) = claim(conn)
    assert c["run_at"] == utc("2030-01-02 01:30:00+00")
    assert schedules(conn)["s"]["next_run_at"] == utc("2030-01-03 01:30:00+00")


@pytest.mark.parametrize(("cron", "gap"), [
    ("* * * * *", "3 days 00:00:30"),
    ("*/5 * * * *", "7 days 00:02:10"),
    ("0 9 * * MON-FRI", "10 days"),
    ("15 0-1 * * *", "1 day 07:00:00"),
    ("0 0 29 2 *", "3000 days"),
    ("@hourly", "00:59:59"),
    ("7 13 1,15 * 3", "400 days"),
])
def test_missed_cron_occurrences_collapse_into_the_latest_due_one(conn, cron, gap):
    set_clock(conn, T0)
    first = schedule(conn, cron=cron)["next_run_at"]
    now = one(conn, "SELECT %s::timestamptz + %s::interval", (first, gap))
    set_clock(conn, now.isoformat())
    one(conn, "SELECT pgq.sweep()")
    # The latest occurrence at or before now (an occurrence exactly now is due).
    latest = croniter(cron, now.replace(tzinfo=None) + timedelta(seconds=1)).get_prev(datetime)
    latest = latest.replace(tzinfo=timezone.utc)
    assert [r[1] for r in scheduled_jobs(conn)] == [max(latest, first)]
    expected_next = croniter(cron, now.replace(tzinfo=None)).get_next(datetime).replace(tzinfo=timezone.utc)
    assert schedules(conn)["s"]["next_run_at"] == expected_next


@pytest.mark.parametrize(("cron", "field"), [
    ("* * * *", None), ("61 * * * *", "minute"), ("*/0 * * * *", "minute"),
    ("* 5-2 * * *", "hour"), ("* * * FOO *", "month"),
])
def test_a_malformed_cron_is_22023_naming_cron_and_writes_nothing(conn, cron, field):
    before = row_counts(conn)
    with pytest.raises(psycopg.Error) as info:
        conn.execute("SELECT pgq.schedule('s', 'q', 'k', cron => %s)", (cron,))
    assert info.value.sqlstate == "22023"
    assert 'argument "cron"' in str(info.value)
    if field:
        assert field in str(info.value)
    assert row_counts(conn) == before
    assert one(conn, "SELECT count(*) FROM pgq.schedules") == 0


def test_an_unknown_time_zone_is_22023_naming_timezone_for_cron_and_every(conn):
    for kind in ("cron => '0 * * * *'", "every => '1 hour'"):
        with pytest.raises(psycopg.Error) as info:
            conn.execute(f"SELECT pgq.schedule('s', 'q', 'k', {kind}, timezone => 'Nowhere/Atlantis')")
        assert info.value.sqlstate == "22023" and 'argument "timezone"' in str(info.value)
    assert one(conn, "SELECT count(*) FROM pgq.schedules") == 0


# Concurrency -------------------------------------------------------------------------------------


def test_many_concurrent_sweepers_and_claimers_never_enqueue_an_occurrence_twice(conn, connect):
    """Each round moves the clock past the next occurrences of 20 schedules (some skipped, some
    missed several), then 8 sessions call pgq.sweep or pgq.claim at once behind a barrier, some
    inside a transaction that they keep open a moment. Every occurrence due is enqueued exactly
    once: one job per (schedule, fire time), none missing; no call fails (no deadlock)."""
    set_clock(conn, T0)
    for i in range(20):  # every k minutes, half of them spelled as cron
        if i % 2:
            schedule(conn, f"s{i:02}", queue=f"q{i % 3}", cron=f"*/{1 + i % 4} * * * *")
        else:
            schedule(conn, f"s{i:02}", queue=f"q{i % 3}", every=f"{1 + i % 4} minutes")
    # A capped queue: its claims lock its row (in name order) while schedules of it fire.
    conn.execute("SELECT pgq.configure_queue('q0', max_running => 100000)")
    sessions = [connect(autocommit=(i % 2 == 0)) for i in range(8)]
    rounds = 25
    barrier = threading.Barrier(len(sessions) + 1)
    errors: list[BaseException] = []
    rng = random.Random(15)
    plans = [[rng.choice(["sweep", "claim", "claim_all"]) for _ in sessions] for _ in range(rounds)]

    def run(k: int, c: psycopg.Connection) -> None:
        try:
            for r in range(rounds):
                barrier.wait(timeout=60)
                if plans[r][k] == "sweep":
                    c.execute("SELECT pgq.sweep()")
                elif plans[r][k] == "claim":
                    c.execute("SELECT * FROM pgq.claim(%s, ARRAY[%s], 2)", (f"w{k}", f"q{k % 3}"))
                else:
                    c.execute("SELECT * FROM pgq.claim(%s, NULL, 1)", (f"w{k}",))
                if not c.autocommit:
                    c.execute("SELECT pg_sleep(0.01)")
                    c.commit()
                barrier.wait(timeout=60)
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(k, c)) for k, c in enumerate(sessions)]
    for t in threads:
        t.start()
    now = utc(T0)
    expected: dict[str, list[datetime]] = {f"s{i:02}": [] for i in range(20)}
    for _ in range(rounds):
        now += timedelta(seconds=rng.choice([30, 60, 90, 300]))
        set_clock(conn, now.isoformat())
        for i in range(20):
            step = 60 * (1 + i % 4)
            due = datetime.fromtimestamp(int(now.timestamp()) // step * step, timezone.utc)
            previous = expected[f"s{i:02}"][-1] if expected[f"s{i:02}"] else utc(T0)
            if due > previous:
                expected[f"s{i:02}"].append(due)
        try:
            barrier.wait(timeout=60)  # go
            barrier.wait(timeout=60)  # all done
        except threading.BrokenBarrierError:
            break
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    got: dict[str, list[datetime]] = {name: [] for name in expected}
    for name, run_at in conn.execute("SELECT schedule, run_at FROM pgq.jobs ORDER BY schedule, run_at"):
        got[name].append(run_at)
    assert one(conn, "SELECT count(*) FROM (SELECT schedule, run_at FROM pgq.jobs "
                     "GROUP BY 1, 2 HAVING count(*) > 1) AS d") == 0
    assert got == expected
    assert sum(len(v) for v in got.values()) > 100


def test_a_sweep_while_another_transaction_fires_the_schedule_skips_it_without_waiting(conn, connect):
    """Step by step: A fires the schedule inside an open transaction; B's sweep and claim neither
    wait for A nor enqueue the occurrence; after A commits, B finds nothing due."""
    set_clock(conn, T0)
    schedule(conn, every="1 minute")
    set_clock(conn, "2030-01-01 12:35:00+00")
    a, b = connect(autocommit=False), connect()
    b.execute("SET lock_timeout = '2s'")  # a wait would fail the step instead of hanging it
    a.execute("SELECT pgq.sweep()")       # A holds the schedule's row lock, its job uncommitted
    assert one(b, "SELECT pgq.sweep()") == 0
    assert claim(b) == []
    assert scheduled_jobs(conn) == []     # A's job is not visible yet
    a.commit()
    assert one(b, "SELECT pgq.sweep()") == 0
    assert len(scheduled_jobs(conn)) == 1
    (c,) = claim(b)
    assert c["run_at"] == utc("2030-01-01 12:35:00+00")


def test_a_repeatable_read_sweep_whose_snapshot_predates_a_firing_fails_instead_of_repeating_it(conn, connect):
    set_clock(conn, T0)
    schedule(conn, every="1 minute")
    set_clock(conn, "2030-01-01 12:35:00+00")
    rr = connect(autocommit=False)
    rr.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    assert one(rr, "SELECT count(*) FROM pgq.schedules() WHERE next_run_at <= '2030-01-01 12:35:00+00'") == 1
    one(conn, "SELECT pgq.sweep()")        # fired and committed after rr's snapshot
    with pytest.raises(psycopg.errors.SerializationFailure):
        rr.execute("SELECT pgq.sweep()")
    rr.rollback()
    assert len(scheduled_jobs(conn)) == 1


# Bad arguments -----------------------------------------------------------------------------------

BAD = [
    ({"name": None}, "22004", "name"),
    ({"name": "bad name"}, "22023", "name"),
    ({"queue": None}, "22004", "queue"),
    ({"queue": "-q"}, "22023", "queue"),
    ({"kind": None}, "22004", "kind"),
    ({"every": None}, "22023", "cron"),
    ({"cron": "* * * * *"}, "22023", "every"),
    ({"every": "0.5 seconds"}, "22023", "every"),
    ({"every": "-1 hour"}, "22023", "every"),
    ({"every": "1 month"}, "22023", "every"),
    ({"every": "1 year"}, "22023", "every"),
    ({"every": "3651 days"}, "22023", "every"),
    ({"payload": None}, "22004", "payload"),
    ({"payload": "[1]"}, "22023", "payload"),
    ({"timezone": None}, "22004", "timezone"),
    ({"timezone": "Mars/Olympus"}, "22023", "timezone"),
    ({"priority": None}, "22004", "priority"),
    ({"priority": 1001}, "22023", "priority"),
    ({"max_attempts": 0}, "22023", "max_attempts"),
    ({"tenant": ""}, "22023", "tenant"),
    ({"skip_if_running": None}, "22004", "skip_if_running"),
    ({"enabled": None}, "22004", "enabled"),
]


@pytest.mark.parametrize(("override", "sqlstate", "argument"), BAD,
                         ids=[b[2] + "-" + repr(list(b[0].values())[0]) for b in BAD])
def test_a_bad_argument_to_schedule_is_a_clear_error_naming_it_and_writes_nothing(conn, override, sqlstate, argument):
    args = {"name": "s", "queue": "q", "kind": "k", "cron": None, "every": "1 hour", "payload": "{}",
            "timezone": "UTC", "priority": 0, "max_attempts": None, "tenant": None,
            "skip_if_running": False, "enabled": True, **override}
    before = row_counts(conn)
    sql = ("SELECT pgq.schedule(%(name)s, %(queue)s, %(kind)s, %(cron)s, %(every)s::interval, "
           "%(payload)s::jsonb, %(timezone)s, %(priority)s, %(max_attempts)s, %(tenant)s, "
           "%(skip_if_running)s, %(enabled)s)")
    with pytest.raises(psycopg.Error) as info:
        conn.execute(sql, args)
    assert info.value.sqlstate == sqlstate
    assert f'argument "{argument}"' in str(info.value)
    assert row_counts(conn) == before
    assert one(conn, "SELECT count(*) FROM pgq.schedules") == 0


def test_unschedule_of_null_is_22004(conn):
    assert sqlstate_of(conn, "SELECT pgq.unschedule(NULL)") == "22004"


# The probe ---------------------------------------------------------------------------------------


def test_the_sweeps_schedules_probe_reads_one_entry_of_schedules_due_idx(conn):
    set_clock(conn, T0)
    conn.execute("""INSERT INTO pgq.schedules (name, queue, kind, every, next_run_at)
                    SELECT 's' || g, 'q', 'k', '1 day', pgq._now() + g * interval '1 minute'
                    FROM generate_series(1, 5000) AS g""")
    conn.execute("ANALYZE pgq.schedules")
    plan = "\n".join(r[0] for r in conn.execute(
        "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) "
        "SELECT EXISTS (SELECT FROM pgq.schedules AS s WHERE s.enabled AND s.next_run_at <= pgq._now())"))
    assert "Index Only Scan using schedules_due_idx" in plan, plan
    assert "Seq Scan" not in plan, plan
    assert "rows=0" in plan, plan
