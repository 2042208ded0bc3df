"""Issue 18, the Python side: bad input to Client and AsyncClient is refused before anything is
sent (BadArgument, SQLSTATE 22023, naming the argument; BadArgumentType, also a TypeError, for a
wrong type): lone surrogates and NULs in texts, integers no SQL integer holds, NaN / infinite /
1e300-second intervals, payloads JSON cannot carry (100k-deep nesting, NaN, a NUL escape). Every
method is checked from its signature, so a call added later is covered too; a Client whose pool was
never opened shows that nothing was sent; and texts the check lets through round-trip through a
real server unchanged (the check is not too strict, nor too lax)."""

from __future__ import annotations

import asyncio
import inspect
import math
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from pgq_thin import calls
from pgq_thin.async_client import AsyncClient
from pgq_thin.client import Client, resolve_dsn
from pgq_thin.errors import BadArgument, BadArgumentType, InvalidArgument, PgqError, WaitTimeout
from pgq_thin.models import UnreadableJson

from sqlhelpers import one


def _deep(depth: int = 100_000) -> dict[str, Any]:
    top: dict[str, Any] = {}
    node = top
    for _ in range(depth):
        node["a"] = {}
        node = node["a"]
    return top


# By the annotation's base: a value the check lets through, the values it refuses (BadArgument)
# and those of a wrong type (BadArgumentType). A new annotation must be added here.
FINE: dict[str, Any] = {"str": "q", "int": 1, "Interval": 30, "bool": True, "datetime": None, "Any": None,
                        "CallerConnection": None, "dict[str, Any]": {}, "Sequence[str]": ["q"],
                        "Sequence[int]": [1], "Sequence[dict[str, Any]]": [{}], "Sequence[str | None]": ["q"],
                        "Sequence[str] | str": ["q"]}
_BAD_JSON = [_deep(), {"a": math.nan}, {"a": math.inf}, {"a": "nul \x00 inside"}, {"a": "lone \ud800"},
             {"\udcff": 1}, {"a": 10 ** 5000}, {"a": object()}]
REFUSED: dict[str, list[Any]] = {
    "str": ["q\udcff", "\ud800", "q\x00", "\x00"],
    "int": [2 ** 63, -(2 ** 63) - 1, 10 ** 400],
    "Interval": [math.nan, math.inf, -math.inf, 1e300, -1e300, 10 ** 400, 1e15,
                 "30", "", "abc", "5 minutes", "1e400s", "99999999999d", "q\x00", "\ud800"],
    "dict[str, Any]": _BAD_JSON,
    "Any": _BAD_JSON,
    "Sequence[str]": [["q", "r\udcff"], ["q\x00"]],
    "Sequence[str | None]": [[None, "r\udcff"], ["q\x00"]],
    "Sequence[str] | str": [["q", "r\udcff"], ["q\x00"], "q\udcff", "q\x00"],
    "Sequence[int]": [[1, 2 ** 63]],
    "Sequence[dict[str, Any]]": [[{}, {"a": math.nan}], [_deep()]],
    "bool": [], "datetime": [], "CallerConnection": [],
}
WRONG_TYPE: dict[str, list[Any]] = {
    "str": [b"q", 5, ["q"]],
    "int": [1.5, True, "1"],
    "Interval": [True, b"1", ["30s"]],
    "Sequence[str]": ["emails", b"emails", ["q", 5]],
    "Sequence[str | None]": ["emails", b"emails", [None, 5]],
    "Sequence[str] | str": [b"emails", ["q", 5], 5],
    "Sequence[int]": ["1", [1.5], [True]],
    "Sequence[dict[str, Any]]": [{"a": 1}, "x"],
    "bool": ["yes", 1],
    "dict[str, Any]": [], "Any": [], "datetime": [], "CallerConnection": [],
}


def _base(annotation: str) -> str:
    return annotation.removesuffix(" | None")


def _arguments(method: calls.Method[..., Any]) -> dict[str, Any]:
    """Arguments that build the call (every parameter given)."""
    params = inspect.signature(method.build).parameters
    return {name: FINE[_base(p.annotation)] for name, p in params.items()}


def _parameters(method: calls.Method[..., Any]) -> list[tuple[str, str]]:
    return [(name, _base(p.annotation)) for name, p in inspect.signature(method.build).parameters.items()]


EVERY_CALL = pytest.mark.parametrize("method", calls.ALL, ids=[m.__name__ for m in calls.ALL])

#: Any text: Hypothesis's own leave out lone surrogates, which undecodable bytes become.
TEXTS = st.lists(st.one_of(st.characters(), st.integers(0xD800, 0xDFFF).map(chr), st.just("\x00")),
                 max_size=40).map("".join)


def test_every_parameter_of_every_call_has_a_known_annotation() -> None:
    for method in calls.ALL:
        for name, p in inspect.signature(method.build).parameters.items():
            assert _base(p.annotation) in FINE, f"{method.__name__}({name}: {p.annotation}): add it to FINE"
        method.build(**_arguments(method))  # the fine values build every call


@EVERY_CALL
def test_a_value_that_cannot_be_sent_is_refused_naming_its_argument(method: Any) -> None:
    for name, annotation in _parameters(method):
        for value in REFUSED[annotation]:
            with pytest.raises(BadArgument, match=f'argument "{name}') as refused:
                method.build(**{**_arguments(method), name: value})
            assert refused.value.sqlstate == "22023", (name, value)


@EVERY_CALL
def test_a_value_of_the_wrong_type_is_a_type_error_naming_its_argument(method: Any) -> None:
    for name, annotation in _parameters(method):
        for value in WRONG_TYPE[annotation]:
            with pytest.raises(TypeError, match=f'argument "{name}') as refused:
                method.build(**{**_arguments(method), name: value})
            assert isinstance(refused.value, BadArgumentType) and isinstance(refused.value, PgqError)


def test_nothing_is_sent_for_bad_input_by_either_client(dsn: str) -> None:
    """The pools are never opened: a call that got as far as sending would fail differently."""
    pool = ConnectionPool(dsn, open=False)
    client = Client(pool=pool)
    for call in (lambda: client.enqueue("emails\udcff", "k"), lambda: client.claim("w", lease=math.nan),
                 lambda: client.enqueue("q", "k", _deep()), lambda: client.prune(older_than=1e300),
                 lambda: client.fail(1, 1, "boom \x00"), lambda: client.get_job(2 ** 64)):
        with pytest.raises(BadArgument):
            call()
    with pytest.raises(PgqError) as unsent:  # a good call does try to send, and finds the pool closed
        client.get_job(1)
    assert not isinstance(unsent.value, BadArgument)

    async def scenario() -> None:
        aclient = AsyncClient(pool=AsyncConnectionPool(dsn, open=False))
        with pytest.raises(BadArgument, match='"queue"'):
            await aclient.enqueue("emails\udcff", "k")
        with pytest.raises(BadArgument, match='"lease"'):
            await aclient.claim("w", lease=1e300)
        with pytest.raises(BadArgumentType, match='"queues"'):
            await aclient.claim("w", queues="emails")

    asyncio.run(scenario())


def test_bad_input_changes_nothing_and_good_input_still_works(dsn: str, conn: psycopg.Connection) -> None:
    with Client(dsn) as client:
        for call in (lambda: client.enqueue("q\ud800", "k"), lambda: client.enqueue("q", "k", {"x": math.nan}),
                     lambda: client.enqueue_many("q", "k", [{}, _deep()]),
                     lambda: client.enqueue("q", "k", max_run_time=math.inf)):
            with pytest.raises(BadArgument):
                call()
        assert one(conn, "SELECT count(*) FROM pgq.jobs") == 0
        job_id = client.enqueue("q", "k", {"s": "\\u0000 is text here"}, max_run_time=timedelta(minutes=1))
        assert client.get_job(job_id).payload == {"s": "\\u0000 is text here"}
    with pytest.raises(BadArgument, match="database address"):
        resolve_dsn("postgresql://\udcff@localhost/db")


@given(TEXTS)
def test_a_text_is_refused_exactly_when_postgresql_text_cannot_hold_it(text: str) -> None:
    try:
        text.encode()
        sendable = "\x00" not in text
    except UnicodeEncodeError:
        sendable = False
    try:
        calls.fail(1, 1, text)
    except BadArgument as exc:
        assert not sendable and 'argument "error"' in str(exc)
    else:
        assert sendable


@given(st.one_of(st.floats(), st.integers(min_value=-10 ** 20, max_value=10 ** 20)))
def test_a_number_of_seconds_is_refused_exactly_when_no_timedelta_holds_it(seconds: float) -> None:
    try:
        expected = timedelta(seconds=seconds)
    except (OverflowError, ValueError):
        expected = None
    try:
        call = calls.snooze(1, 1, seconds)
    except BadArgument:
        assert expected is None or abs(expected) > timedelta.max - timedelta(days=1)
    else:
        assert call.params["delay"] == expected


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=TEXTS)
def test_what_the_check_lets_through_reaches_the_database_unchanged(dsn: str, text: str) -> None:
    with Client(dsn, max_size=1) as client:
        try:
            job_id = client.enqueue("q", "k", {"text": text, text: [text]}, unique_key=text or None)
        except BadArgument:
            assert "\x00" in text or any(0xD800 <= ord(c) <= 0xDFFF for c in text)
            return
        except InvalidArgument as exc:
            pytest.fail(f"the server refused what the client let through: {exc}")
        job_id = client.claim("w\x1b" + text, queues=["q"])[0].id
        assert client.fail(job_id, 1, text, retryable=False) == "failed"
        record = client.get_job(job_id)
        assert record.payload == {"text": text, text: [text]}
        assert (record.unique_key, record.last_error) == (text or None, text)
        assert record.claimed_by == "w\x1b" + text


_ANYTHING = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=2 ** 62, max_value=2 ** 70),
    st.floats(), st.text(), TEXTS, st.binary(max_size=4), st.datetimes(), st.timedeltas(),
    st.datetimes(timezones=st.timezones()) if hasattr(st, "timezones") else st.datetimes(),
    st.lists(st.one_of(st.integers(), st.text(max_size=5), st.floats()), max_size=3),
    st.dictionaries(st.text(max_size=5), st.one_of(st.integers(), st.floats(), TEXTS), max_size=3),
    st.decimals(), st.just(object()), st.just(_deep(2000)))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_value_for_any_argument_is_answered_or_refused_with_a_pgq_error(dsn: str, data: st.DataObject) -> None:
    """Whatever a caller passes, a call returns or raises a PgqError (BadArgument before sending,
    InvalidArgument and the others from the server), never psycopg's or Python's own exceptions."""
    method = data.draw(st.sampled_from(calls.ALL))
    name, _ = data.draw(st.sampled_from(_parameters(method) or [("", "")]))
    arguments = _arguments(method)
    if name and name != "conn":
        arguments[name] = data.draw(_ANYTHING, label=name)
    with Client(dsn, max_size=1) as client:
        try:
            getattr(client, method.__name__)(**arguments)
        except PgqError:
            pass


# Durations: one way everywhere (issue 42) ------------------------------------------------------------

#: Durations as the CLI reads them, and what each is.
DURATIONS = [("30s", timedelta(seconds=30)), ("1h", timedelta(hours=1)), ("3m 12s", timedelta(seconds=192)),
             ("500ms", timedelta(milliseconds=500)), ("1h 30m", timedelta(minutes=90)), ("7d", timedelta(days=7))]


@EVERY_CALL
def test_every_interval_argument_takes_a_duration_as_the_cli_reads_it(method: Any) -> None:
    for name, annotation in _parameters(method):
        if annotation != "Interval":
            continue
        for text, expected in DURATIONS:
            assert method.build(**{**_arguments(method), name: text}).params[name] == expected, (name, text)
        assert method.build(**{**_arguments(method), name: timedelta(seconds=30)}).params[name] == timedelta(seconds=30)
        assert method.build(**{**_arguments(method), name: 30}).params[name] == timedelta(seconds=30)


def test_a_text_that_is_not_a_duration_is_refused_saying_what_would_be_one() -> None:
    with pytest.raises(BadArgument, match=r'^argument "lease" needs a unit: \'5\' could be 5s, 5m or 5h') as bare:
        calls.claim("w", lease="5")
    assert bare.value.sqlstate == "22023"
    with pytest.raises(BadArgument, match=r'^argument "every" is not a duration: \'every hour\' \(e\.g\. 30s'):
        calls.schedule("s", "q", "k", every="every hour")
    with pytest.raises(BadArgument, match=r'^argument "retention" is too long: \'99999999999d\' \(at most 9+d\)'):
        calls.configure_queue("q", retention="99999999999d")
    with pytest.raises(BadArgumentType, match=r'^argument "timeout" must be a timedelta, a number of seconds or a '
                       r"duration such as '30s', got bytes"):
        calls.seconds("timeout", b"30s")  # type: ignore[arg-type]


def test_durations_in_text_reach_the_server_as_the_intervals_they_name(dsn: str) -> None:
    with Client(dsn) as client:
        job_id = client.enqueue("q", "k", max_run_time="3m 12s")
        assert client.get_job(job_id).max_run_time == timedelta(seconds=192)
        [job] = client.claim("w", queues=["q"], lease="90s")
        assert timedelta(seconds=80) < job.lease_until - client.clock() <= timedelta(seconds=90)
        assert client.fail(job.id, job.attempt, "boom", retry_in="1h") == "pending"
        assert client.get_job(job_id).run_at - client.clock() > timedelta(minutes=59)
        with pytest.raises(WaitTimeout):
            client.wait(job_id, timeout="50ms", poll_interval="10ms")

    async def scenario() -> None:
        async with AsyncClient(dsn) as aclient:
            job_id = await aclient.enqueue("q", "k", max_run_time="1h 30m")
            assert (await aclient.get_job(job_id)).max_run_time == timedelta(minutes=90)
            with pytest.raises(BadArgument, match='argument "max_run_time" needs a unit'):
                await aclient.enqueue("q", "k", max_run_time="90")

    asyncio.run(scenario())


# Reading: a value the server holds but Python's json cannot read -----------------------------------

DEEP = "[" * 5000 + "]" * 5000  # jsonb takes it; Python's json stops at its recursion limit


def test_a_job_whose_payload_python_cannot_read_fails_for_good_and_the_worker_goes_on(
        dsn: str, conn: psycopg.Connection, runtime: str) -> None:
    """A job enqueued from another language with a deeply nested payload: claiming it used to raise
    RecursionError in the claimer, which stopped the worker, and every worker after its lease."""
    from pgq_thin.testing import adrain, drain
    from pgq_thin.worker import AsyncWorker, Worker

    deep = one(conn, "SELECT pgq.enqueue('q', 'k', jsonb_build_object('x', %s::jsonb))", (DEEP,))
    fine = one(conn, "SELECT pgq.enqueue('q', 'k', '{\"x\": 1}')")
    worker = (Worker if runtime == "threads" else AsyncWorker)(queues=["q"], concurrency=1, prefetch=0)
    ran: list[int] = []
    worker.handler("k")(lambda job, ctx: ran.append(job.id))
    result = drain(worker, dsn) if runtime == "threads" else asyncio.run(adrain(worker, dsn))
    assert result.outcomes == {deep: "failed", fine: "done"} and ran == [fine]
    with Client(dsn) as client:
        record = client.get_job(deep)
        assert isinstance(record.payload, UnreadableJson) and record.payload.text.startswith(b'{"x": [[[')
        assert record.state == "failed" and "nested too deeply" in (record.last_error or "")
        assert record.attempt == 1  # failed at once, not retryable


@pytest.mark.parametrize("setting", ["lease", "poll_interval", "sweep_interval", "shutdown_timeout"])
def test_a_worker_refuses_a_nan_infinite_or_huge_setting_in_seconds_naming_it(setting: str) -> None:
    from pgq_thin.worker import AsyncWorker, Worker

    for runtime in (Worker, AsyncWorker):
        for value in (math.nan, math.inf, 1e300, 10 ** 400):
            with pytest.raises(ValueError, match=f"^{setting} must be a finite number of seconds"):
                runtime(**{setting: value})
        with pytest.raises(ValueError, match=f"^{setting} needs a unit: '30' could be 30s"):
            runtime(**{setting: "30"})  # a bare number in text, as everywhere (issue 42)
        with pytest.raises(TypeError, match=f"^{setting} must be a number of seconds, a timedelta or a duration"):
            runtime(**{setting: [30]})
        runtime(**{setting: 30})  # a sane value is fine


def test_retry_and_snooze_refuse_a_nan_infinite_or_huge_delay() -> None:
    from pgq_thin import Retry, Snooze

    for value in (math.nan, math.inf, 1e300, 10 ** 400, -1, 0, True):
        with pytest.raises(ValueError, match="Retry delay must be a positive finite number"):
            Retry(delay=value)
        with pytest.raises(ValueError, match="Snooze delay must be a positive finite number"):
            Snooze(value)
    assert Retry(delay=5).delay == 5 and Snooze(timedelta(minutes=1)).delay == timedelta(minutes=1)


def test_a_pool_of_the_callers_own_gets_a_pgq_error_for_what_python_cannot_read(
        dsn: str, conn: psycopg.Connection) -> None:
    deep = one(conn, "SELECT pgq.enqueue('q', 'k', jsonb_build_object('x', %s::jsonb))", (DEEP,))
    with ConnectionPool(dsn, kwargs={"autocommit": True}) as pool, Client(pool=pool) as client:
        with pytest.raises(PgqError, match="nested too deeply") as refused:
            client.get_job(deep)
        assert "READING" in (refused.value.hint or "")
