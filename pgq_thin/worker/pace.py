"""The rate pace: how a claimer waits for a rate limit's next token. The rule is the database's:
after a claim that came back short, a worker that knows some of its queues are rate-limited asks
pgq.rate_limit_wait how long until their next token, and claims again then, rather than at its
idle poll interval or at every NOTIFY (an enqueue into a rate-limited queue brings no token).
What it knows is pgq.rate_limit_wait's last answer: asked at start and after each sweep, so a
queue without a rate limit costs one call per sweep and none per claim."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import timedelta

__all__ = ["RatePace"]


class RatePace:
    """What the claimer of ``queues`` (None: all) knows of their rate limits, and the wait it
    makes of pgq.rate_limit_wait's answer (``paced``)."""

    def __init__(self, queues: Sequence[str] | None) -> None:
        self.queues = queues
        self.limited: frozenset[str] = frozenset()  # the queues that have a rate limit, as last told
        self._held: frozenset[str] = frozenset()  # those waiting for a token ...
        self._held_until = 0.0  # ... until then (time.monotonic())

    def learned(self, waits: Mapping[str, timedelta]) -> None:
        """pgq.rate_limit_wait's answer: which queues are rate-limited now."""
        self.limited = frozenset(waits)

    def wanted(self, jobs: int, batch: int) -> bool:
        """Whether a claim that took ``jobs`` of ``batch`` asks pgq.rate_limit_wait: it came back
        short and some of our queues are rate-limited."""
        return jobs < batch and bool(self.limited)

    def paced(self, waits: Mapping[str, timedelta], wait: float) -> tuple[float, bool]:
        """The wait after a short claim, given pgq.rate_limit_wait's answer and the usual ``wait``
        (0: claim again at once; else the idle wait): (seconds, whether wake-ups are ignored
        meanwhile). When every queue of ours waits for a token, until the first is due, and
        nothing wakes us sooner (a NOTIFY or a freed slot brings no token); when some queue of
        ours does not, the usual wait, cut short by that token. While a queue waits for its
        token, a NOTIFY naming it wakes nobody (``ignores``)."""
        self.learned(waits)
        held = {q: w.total_seconds() for q, w in waits.items() if w > timedelta(0)}
        if not held:
            self._held = frozenset()
            return wait, False
        pace = min(held.values())
        self._held = frozenset(held)
        self._held_until = time.monotonic() + pace
        if self.queues is not None and all(q in held for q in self.queues):
            return pace, True
        return (min(wait, pace) if wait > 0 else 0.0), False

    def ignores(self, queue: str) -> bool:
        """Whether a NOTIFY naming ``queue`` is no news: it waits for its rate limit's next token
        (any thread may ask)."""
        return queue in self._held and time.monotonic() < self._held_until
