"""The retry backoff, pgq._backoff(attempt, base, cap), as properties (TESTING.md scenario 19):
for every attempt, huge ones included, and any base <= cap a queue accepts, the delay stays within
[base, cap] and never raises; and pgq.fail schedules the retry by it."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sqlhelpers import claim, job, one

INT_MAX = 2**31 - 1
MICRO = timedelta(microseconds=1)
MAX_INTERVAL = timedelta(days=365)  # queues_backoff_check: backoff_cap <= 365 days

attempts = st.one_of(st.integers(-(2**31), INT_MAX), st.integers(0, 80),
                     st.sampled_from([0, 1, 2, 40, 41, 42, 1023, 1024, 1025, 10000, INT_MAX - 1, INT_MAX]))
micros = st.one_of(st.integers(1, MAX_INTERVAL // MICRO),
                   st.sampled_from([1, 10**6, 3600 * 10**6, MAX_INTERVAL // MICRO]))


@st.composite
def base_and_cap(draw: st.DrawFn) -> tuple[timedelta, timedelta]:
    a, b = draw(micros), draw(micros)
    return timedelta(microseconds=min(a, b)), timedelta(microseconds=max(a, b))


@pytest.fixture
def db(dsn: str) -> Iterator[psycopg.Connection]:
    # Hypothesis runs many examples in one test: one connection for all of them.
    with psycopg.connect(dsn, autocommit=True) as c:
        yield c


def _ceiling(attempt: int, base: timedelta, cap: timedelta) -> timedelta:
    """The documented growth: min(cap, base * 2^(attempt - 1)), attempt counted from 1."""
    seconds = base.total_seconds() * 2.0 ** min(max(attempt, 1) - 1, 1000)
    return cap if seconds >= cap.total_seconds() else timedelta(seconds=seconds)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(attempt=attempts, bounds=base_and_cap())
def test_the_backoff_stays_within_base_and_cap_for_every_attempt_and_never_errors(
        db: psycopg.Connection, attempt: int, bounds: tuple[timedelta, timedelta]) -> None:
    base, cap = bounds
    delays = db.execute("SELECT pgq._backoff(%s, %s, %s) FROM generate_series(1, 5)",
                        (attempt, base, cap)).fetchall()
    for (delay,) in delays:
        assert base <= delay <= cap, (attempt, base, cap, delay)


@pytest.mark.parametrize("base_seconds", [1.0, 0.5, 0.001])
def test_the_backoff_grows_as_documented_up_to_the_cap_for_ordinary_bases(
        db: psycopg.Connection, base_seconds: float) -> None:
    """min(cap, base * 2^(attempt-1)) scaled by a factor in [0.5, 1], never below base."""
    base, cap = timedelta(seconds=base_seconds), MAX_INTERVAL
    for attempt in [1, 2, 3, 10, 20, 30, 40, 41, 50, 60, 100, 10000, INT_MAX]:
        ceiling = _ceiling(attempt, base, cap)
        for (delay,) in db.execute("SELECT pgq._backoff(%s, %s, %s) FROM generate_series(1, 20)",
                                   (attempt, base, cap)).fetchall():
            assert max(base, ceiling / 2) - MICRO <= delay <= ceiling + MICRO, (attempt, delay, ceiling)


def test_the_backoff_reaches_the_cap_even_for_a_microsecond_base(db: psycopg.Connection) -> None:
    base, cap = MICRO, MAX_INTERVAL
    (delay,) = db.execute("SELECT pgq._backoff(60, %s, %s)", (base, cap)).fetchone()
    assert delay >= cap / 2


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(attempt=st.one_of(st.integers(1, 100), st.sampled_from([9999, INT_MAX - 1])), bounds=base_and_cap())
def test_fail_schedules_the_retry_within_the_queues_backoff(
        db: psycopg.Connection, attempt: int, bounds: tuple[timedelta, timedelta]) -> None:
    base, cap = bounds
    db.execute("SELECT pgq.configure_queue('b', backoff_base => %s, backoff_cap => %s)", (base, cap))
    job_id = one(db, "SELECT pgq.enqueue('b', 'k')")
    # The attempt this claim will hand out: attempt, of at least attempt + 1 allowed.
    db.execute("UPDATE pgq.jobs SET attempt = %s - 1, max_attempts = %s + 1 WHERE id = %s",
               (attempt, attempt, job_id))
    (claimed,) = claim(db, queues=["b"])
    assert (claimed["id"], claimed["attempt"]) == (job_id, attempt)
    state, at = db.execute("SELECT pgq.fail(%s, %s, 'boom'), statement_timestamp()",
                           (job_id, attempt)).fetchone()
    assert state == "pending"
    delay = job(db, job_id)["run_at"] - at
    assert base <= delay <= cap, (attempt, base, cap, delay)
    db.execute("DELETE FROM pgq.jobs WHERE id = %s", (job_id,))
