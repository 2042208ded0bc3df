"""Both clients behind one face, so that a test of a client's behaviour runs once over Client and
once over AsyncClient and reads the same (a drift between the two fails it on one of them).

``clients(kind)`` (conftest's ``client_kind`` fixture gives "Client" and "AsyncClient" in turn) opens a
client of that kind on a DSN; an AsyncClient runs on an event loop of its own thread, and each of
its calls is made blocking here. ``counting`` counts the statements a client sends by what they
call (a wrapper of the client's own ``_send``: the real database answers)."""

from __future__ import annotations

import asyncio
import functools
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from pgq_thin import AsyncClient, Client

#: The clients every test of a client's behaviour runs over (conftest's client_kind fixture).
KINDS = ("Client", "AsyncClient")


class Blocking:
    """An AsyncClient's methods, each run on ``loop`` (another thread's) and waited for (a method
    that answers at once, as ``bounded`` does, answers as it is; a view of the client's calls that
    it answers is made blocking too)."""

    def __init__(self, client: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.client = client
        self.loop = loop

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.client, name)
        if not callable(attribute):
            return attribute

        @functools.wraps(attribute)
        def blocking(*args: Any, **kwargs: Any) -> Any:
            answer = attribute(*args, **kwargs)
            if asyncio.iscoroutine(answer):
                return asyncio.run_coroutine_threadsafe(answer, self.loop).result(timeout=60)
            return Blocking(answer, self.loop) if hasattr(answer, "_send") else answer

        return blocking


@contextmanager
def clients(kind: str, dsn: str, **settings: Any) -> Iterator[Any]:
    """A client of ``kind`` on ``dsn`` (closed on exit): a Client, or a Blocking AsyncClient."""
    if kind == "Client":
        with Client(dsn, **settings) as client:
            yield client
        return
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="test-async-client", daemon=True)
    thread.start()
    client = AsyncClient(dsn, **settings)
    blocking = Blocking(client, loop)
    try:
        blocking.open()
        yield blocking
    finally:
        blocking.close()
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


def counting(client: Any, counts: Counter[str], name: Callable[[str], str | None]) -> None:
    """Count each statement ``client`` sends under ``name(query)`` (None: not counted)."""
    inner = client.client if isinstance(client, Blocking) else client
    send = inner._send

    def counted(call: Any) -> Any:
        key = name(call.query)
        if key is not None:
            counts[key] += 1
        return send(call)

    inner._send = counted
