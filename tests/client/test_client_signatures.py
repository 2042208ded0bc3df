"""The clients' methods show what they take and return (issue 42): ``help(Client)`` and
``inspect.signature`` give each method's parameters and its real result (``-> int``, not the
description's ``'Call[int]'``), on Client as a plain result and on AsyncClient as the awaitable."""

from __future__ import annotations

import inspect
import pydoc
from collections.abc import Coroutine
from typing import Any, get_args, get_origin

from pgq_thin import AsyncClient, Client
from pgq_thin.models import BatchStatus, JobResult, StepLookup


def unconnected(cls: type[Any]) -> Any:
    """A client object without a pool: a signature needs no database."""
    return cls.__new__(cls)


def test_client_methods_show_their_parameters_and_real_results() -> None:
    client = unconnected(Client)
    enqueue = inspect.signature(client.enqueue)
    assert enqueue.return_annotation is int
    assert list(enqueue.parameters)[:3] == ["queue", "kind", "payload"]
    assert enqueue.parameters["queue"].annotation is str
    assert enqueue.parameters["priority"].default == 0
    assert enqueue.parameters["run_at"].kind is inspect.Parameter.KEYWORD_ONLY
    assert inspect.signature(client.batch_status).return_annotation is BatchStatus
    assert inspect.signature(client.job_result).return_annotation is JobResult
    assert inspect.signature(client.get_step).return_annotation == StepLookup | None
    assert inspect.signature(client.cancel).return_annotation is bool
    # The unbound method, as help() and the class's own signature show it: self first.
    assert list(inspect.signature(Client.enqueue).parameters)[0] == "self"
    assert inspect.signature(Client.enqueue).return_annotation is int


def test_async_client_methods_return_the_awaitable_of_the_same_result() -> None:
    client = unconnected(AsyncClient)
    returns = inspect.signature(client.enqueue).return_annotation
    assert get_origin(returns) is Coroutine and get_args(returns)[-1] is int
    assert inspect.signature(client.enqueue).parameters == inspect.signature(unconnected(Client).enqueue).parameters
    assert get_args(inspect.signature(AsyncClient.batch_status).return_annotation)[-1] is BatchStatus


def test_help_shows_each_method_with_its_signature() -> None:
    text = pydoc.render_doc(Client, renderer=pydoc.plaintext)
    assert "batch_open(self, callback_queue: str, callback_kind: str" in text
    assert "batch_open(...)" not in text
    assert "-> int" in text.split("enqueue(self, queue: str, kind: str", 1)[1].split("\n", 1)[0]
    assert "Call[" not in text
