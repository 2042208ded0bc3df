"""Durations in the worker's settings and outcomes (issue 42): what the CLI accepts ("30s", "1h",
"3m 12s") as well as a timedelta or a number of seconds, converted once; a bare "5" refused with
an error naming the setting."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest

from pgq_thin import Job
from pgq_thin.worker import JobContext, Retry, Snooze

from sqlhelpers import job, wait_for
from workerkit import RUNTIMES, _current, enqueue, fast_worker, running


@pytest.fixture(autouse=True)
def current_runtime(runtime: str) -> Iterator[str]:
    _current[0] = runtime
    yield runtime
    _current[0] = "threads"


def test_settings_take_duration_words(runtime: str) -> None:
    worker = RUNTIMES[runtime](["default"], lease="3m 12s", poll_interval="500ms", sweep_interval="1m",
                               shutdown_timeout="2s")
    assert worker.lease == timedelta(minutes=3, seconds=12)
    assert worker.poll_interval == 0.5
    assert worker.sweep_interval == 60.0
    assert worker.shutdown_timeout == 2.0


def test_settings_take_timedeltas_as_seconds(runtime: str) -> None:
    """A timedelta of poll_interval, sweep_interval or shutdown_timeout is kept as its seconds (the
    runtime computes with them)."""
    worker = RUNTIMES[runtime](["default"], poll_interval=timedelta(milliseconds=250),
                               sweep_interval=timedelta(minutes=1), shutdown_timeout=timedelta(seconds=3))
    assert (worker.poll_interval, worker.sweep_interval, worker.shutdown_timeout) == (0.25, 60.0, 3.0)


@pytest.mark.parametrize("setting", ["lease", "poll_interval", "sweep_interval", "shutdown_timeout"])
def test_a_bare_number_in_text_is_refused_naming_the_setting(runtime: str, setting: str) -> None:
    with pytest.raises(ValueError, match=rf"^{setting} needs a unit: '5' could be 5s, 5m or 5h"):
        RUNTIMES[runtime](["default"], **{setting: "5"})
    with pytest.raises(ValueError, match=rf"^{setting} is not a duration: 'soon'"):
        RUNTIMES[runtime](["default"], **{setting: "soon"})


def test_out_of_range_words_are_refused_as_numbers_are(runtime: str) -> None:
    with pytest.raises(ValueError, match="^poll_interval must be .*more than 0"):
        RUNTIMES[runtime](["default"], poll_interval="0s")
    with pytest.raises(ValueError, match="^shutdown_timeout must be .*at most 86400"):
        RUNTIMES[runtime](["default"], shutdown_timeout="2d")
    with pytest.raises(TypeError, match="^lease must be"):
        RUNTIMES[runtime](["default"], lease=[5])


def test_retry_and_snooze_take_duration_words() -> None:
    assert Retry("1h 30m").delay == timedelta(hours=1, minutes=30)
    assert Retry(5).delay == 5 and Retry(None).delay is None
    assert Snooze("250ms").delay == timedelta(milliseconds=250)
    assert str(Snooze("3m 12s")) == "snoozed for 192 s"
    with pytest.raises(ValueError, match="^Retry delay needs a unit: '5' could be"):
        Retry("5")
    with pytest.raises(ValueError, match="^Snooze delay is not a duration: 'later'"):
        Snooze("later")
    with pytest.raises(ValueError, match="^Snooze delay must be a positive"):
        Snooze("0s")


def test_a_worker_with_word_settings_runs_and_honours_retry_and_snooze_words(dsn: str,
                                                                             conn: psycopg.Connection) -> None:
    worker = fast_worker(lease="30s", poll_interval="100ms", sweep_interval="1s", shutdown_timeout="10s")

    @worker.handler("later")
    def later(job_: Job, ctx: JobContext) -> None:
        if job_.attempt == 1:
            raise Retry("1h", reason="come back in an hour")
        raise AssertionError("not retried so soon")

    @worker.handler("sleepy")
    def sleepy(job_: Job, ctx: JobContext) -> None:
        raise Snooze("2h")

    retried, snoozed = enqueue(conn, "later"), enqueue(conn, "sleepy")
    with running(worker, dsn):
        wait_for(lambda: conn.execute("SELECT count(*) = 2 FROM pgq.jobs WHERE id IN (%s, %s) AND state = 'pending' "
                                      "AND run_at > now() + interval '30 minutes'", (retried, snoozed)).fetchone()[0],
                 "both jobs due again later")
    gap = conn.execute("SELECT run_at - now() FROM pgq.jobs WHERE id = %s", (retried,)).fetchone()[0]
    assert timedelta(minutes=59) < gap <= timedelta(hours=1)
    gap = conn.execute("SELECT run_at - now() FROM pgq.jobs WHERE id = %s", (snoozed,)).fetchone()[0]
    assert timedelta(minutes=119) < gap <= timedelta(hours=2)
    assert job(conn, retried)["attempt"] == 1


def test_a_durable_sleep_takes_duration_words(runtime: str, dsn: str, conn: psycopg.Connection) -> None:
    worker = fast_worker()
    if runtime == "threads":
        @worker.handler("napper")
        def napper(job_: Job, ctx: JobContext) -> None:
            ctx.sleep("1h 30m", name="nap")
            raise AssertionError("not awake so soon")
    else:
        @worker.handler("napper")
        async def anapper(job_: Job, ctx: JobContext) -> None:
            await ctx.sleep("1h 30m", name="nap")
            raise AssertionError("not awake so soon")

    napping = enqueue(conn, "napper")
    with running(worker, dsn):
        wait_for(lambda: conn.execute("SELECT state::text <> 'running' AND run_at > now() + interval '89 minutes' "
                                      "FROM pgq.jobs WHERE id = %s", (napping,)).fetchone()[0],
                 "the job asleep for 1h 30m")
    assert job(conn, napping)["attempt"] == 1 and job(conn, napping)["last_error"] is None


def test_a_signal_timeout_in_words_reads_as_given() -> None:
    from pgq_thin.worker import SignalTimeout

    assert str(SignalTimeout("go", "5m")) == "signal 'go' did not come within its timeout 5m"
    assert str(SignalTimeout("go", 30)) == "signal 'go' did not come within its timeout 30 s"
