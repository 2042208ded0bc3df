"""How the clients read what a claim returns and write what a completion sends, by the shortcuts
that spare a worker Python calls per job (pgq_thin.calls: _Jsonb's scanner, _job, _int_array):
each reads and writes exactly what the plain way (json.loads, Job(*row), a list of ints) does."""

from __future__ import annotations

import dataclasses
import enum
import json
from typing import Any

import psycopg
import pytest
from psycopg.types.json import set_json_loads

from pgq_thin import Job, calls
from pgq_thin.models import UnreadableJson

from clientkit import clients

#: Payloads whose JSON text holds what a scanner may get wrong: escapes, non-ASCII text, numbers
#: of every shape (a float, an exponent, an integer wider than 64 bits), empty and nested values.
PAYLOADS: list[Any] = [
    {},
    {"text": "caf\u00e9 \u2603 \U0001f600", "quote": "a \"b\" \\ c\n\t", "nul-free": "\u0001\u001f"},
    {"n": 0, "neg": -17, "big": 123456789012345678901234567890, "f": 2.5, "tiny": 1e-300, "exp": 1.5e300},
    {"list": [], "obj": {}, "nested": [[{"a": [None, True, False]}]], "": "empty key"},
    {"keys": {str(i): i for i in range(50)}},
]


def test_claimed_payloads_read_as_json_loads_reads_the_servers_text(dsn: str, client_kind: str,
                                                                     conn: psycopg.Connection) -> None:
    with clients(client_kind, dsn) as client:
        ids = [client.enqueue("rows", "k", payload, meta={"m": payload}) for payload in PAYLOADS]
        claimed = {job.id: job for job in client.claim("w", ["rows"], batch=len(PAYLOADS))}
    for job_id in ids:
        text = conn.execute("SELECT payload::text FROM pgq.jobs WHERE id = %s", (job_id,)).fetchone()[0]
        read = json.loads(text)  # (jsonb writes 1.5e300 as its 301 digits: an int to json.loads too)
        assert claimed[job_id].payload == read and claimed[job_id].meta == {"m": read}
        assert [type(v) for v in claimed[job_id].payload.values()] == [type(v) for v in read.values()]


def test_a_value_nested_deeper_than_the_recursion_limit_is_unreadable_not_an_error() -> None:
    loader = calls._Jsonb(0, None)
    deep = b"[" * 100_000 + b"]" * 100_000
    value = loader.load(memoryview(deep))
    assert isinstance(value, UnreadableJson) and value.text == deep


def test_text_the_server_never_sends_is_read_or_refused_as_json_loads_does() -> None:
    loader = calls._Jsonb(0, None)
    assert loader.load(b' {"a": 1} ') == {"a": 1}  # surrounding whitespace
    for bad in (b'{"a": 1} x', b"", b"{"):
        with pytest.raises(json.JSONDecodeError):
            loader.load(bad)


def test_the_applications_json_loads_is_used_when_it_set_one() -> None:
    seen: list[bytes] = []

    def loads(data: bytes | str) -> Any:
        seen.append(bytes(data) if not isinstance(data, str) else data.encode())
        return json.loads(data)

    set_json_loads(loads)
    try:
        assert calls._Jsonb(0, None).load(memoryview(b'{"a": 1}')) == {"a": 1}
    finally:
        set_json_loads(json.loads)
    assert seen == [b'{"a": 1}']


def test_a_claimed_job_is_the_job_its_fields_make(dsn: str, client_kind: str) -> None:
    with clients(client_kind, dsn) as client:
        client.enqueue("rows", "k", {"n": 1}, tenant="t", meta={"x": 1})
        [claimed] = client.claim("w", ["rows"])
        made = Job(*(getattr(claimed, f.name) for f in dataclasses.fields(Job)))
        assert claimed == made and repr(claimed) == repr(made)
        assert type(claimed) is Job and vars(claimed) == vars(made)
        with pytest.raises(dataclasses.FrozenInstanceError):
            claimed.attempt = 2  # type: ignore[misc]
        client.enqueue("rows", "k", {"n": 2})
        answer = client.complete_and_claim([claimed.id], [claimed.attempt], "w", ["rows"])
        assert answer.completed == [claimed.id] and [type(j) for j in answer.jobs] == [Job]
        assert answer.jobs[0].payload == {"n": 2}


def test_job_has_nothing_a_row_would_skip() -> None:
    """The claim builds a Job from its row without calling Job's __init__ (calls._job): that is
    Job(*row) only while Job has no __post_init__, no __slots__ and no field that is not an init
    argument."""
    assert not hasattr(Job, "__post_init__") and "__slots__" not in vars(Job)
    assert all(f.init for f in dataclasses.fields(Job))


class Level(enum.IntEnum):
    HIGH = 7


def test_ids_and_attempts_are_sent_as_the_ints_they_are(dsn: str, client_kind: str) -> None:
    with clients(client_kind, dsn) as client:
        first = client.enqueue("rows", "k")
        [job] = client.claim("w", ["rows"])
        assert client.complete_many([job.id, 2 ** 63 - 1, -1], [job.attempt, 1, Level.HIGH]) == [first]
        assert client.complete_many([], []) == []
    assert calls.complete_many([Level.HIGH], [1]).params == {"ids": "{7}", "attempts": "{1}"}
