"""The rules every HTTP server of pgq_thin keeps (the dashboard, ``pgq-thin metrics`` and a
worker's ``metrics_port``), with nothing but the standard library:

- **Host.** A server bound to a loopback address answers only to the Host names ``127.0.0.1``,
  ``localhost``, ``::1`` and the address it is bound to (``allowed_hosts``, ``host_allowed``): a page
  on another site that rebinds its DNS name to 127.0.0.1 sends its own name and gets 400, so it
  cannot read what the server answers. Bound to another address, any Host is answered.
- **Bearer token.** ``bearer_matches`` compares an ``Authorization: Bearer ...`` header with the
  token in constant time.
- **Wrong tokens are slowed down** (``Throttle``): after a few wrong tokens from one client
  address, that address must wait before its next token is checked at all (1 s, doubling, at most
  60 s); the same holds for all addresses together after more. A wait ends by itself: nobody is
  locked out for longer than the longest wait after the wrong tokens stop.
"""

from __future__ import annotations

import hmac
import ipaddress
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["LOOPBACK_HOSTS", "Throttle", "allowed_hosts", "bearer_matches", "host_allowed", "host_name",
           "is_bearer", "is_loopback"]

#: The Host names a server bound to a loopback address answers to (besides the address itself).
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def is_loopback(bind_host: str) -> bool:
    """Whether a server bound to ``bind_host`` is reachable from this machine only."""
    if bind_host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(bind_host.strip("[]")).is_loopback
    except ValueError:
        return False


def allowed_hosts(bind_host: str) -> tuple[str, ...] | None:
    """The Host names a server bound to ``bind_host`` answers to; None: any (it is not bound to a
    loopback address, so a rebound DNS name is no way in that a direct request is not)."""
    if not is_loopback(bind_host):
        return None
    own = bind_host.strip("[]").lower()
    return LOOPBACK_HOSTS if own in LOOPBACK_HOSTS else (*LOOPBACK_HOSTS, own)


def host_name(header: str | None) -> str | None:
    """The name of a Host header without its port (``[::1]:8080`` -> ``::1``), lower case; None when
    there is none or it is malformed."""
    if not header:
        return None
    header = header.strip().lower()
    if header.startswith("["):
        name, bracket, rest = header[1:].partition("]")
        if not bracket or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
            return None
        return name or None
    name, colon, port = header.partition(":")
    if colon and not port.isdigit():
        return None
    return name or None


def host_allowed(header: str | None, allowed: Sequence[str] | None) -> bool:
    """Whether a request with this Host header is answered (``allowed`` None: every one)."""
    if allowed is None:
        return True
    name = host_name(header)
    return name is not None and name in allowed


def is_bearer(authorization: str | None) -> bool:
    """Whether an Authorization header offers a bearer token (right or wrong; another scheme, such
    as a proxy's Basic credentials passed on, is no guess at the token)."""
    return (authorization or "").partition(" ")[0].lower() == "bearer"


def bearer_matches(authorization: str | None, token: str) -> bool:
    """Whether an Authorization header is ``Bearer TOKEN`` (compared in constant time)."""
    credentials = (authorization or "").partition(" ")[2]
    return is_bearer(authorization) and hmac.compare_digest(credentials.strip().encode(), token.encode())


@dataclass
class _Failures:
    count: int = 0
    last: float = 0.0  # when the last wrong token came
    until: float = 0.0  # no token is checked before this


class Throttle:
    """Slows down guessing: counts wrong tokens per client address and in total.

    An address's first ``free`` wrong tokens (5) answer at once; each one after that makes the
    address wait before its next token is checked at all: ``first_wait`` (1 s), doubling with each
    wrong token, at most ``max_wait`` (60 s). All addresses together get ``free_total`` (50) wrong
    tokens, then the same waits hold for every address: guessing from many addresses is slowed as
    well. A request during a wait is answered "wait" (429, Retry-After) without its token being
    checked, right or wrong, so waiting is the only way on. A right token clears its address's
    count and the total; counts are forgotten ``forget_after`` (15 minutes) after their last wrong
    token. At most ``max_addresses`` addresses are remembered (the least recently wrong are
    forgotten first). The longest anyone waits once the wrong tokens stop is ``max_wait``.

    Safe to share between threads and the event loop (a lock around a few dict operations).
    """

    def __init__(self, *, free: int = 5, free_total: int = 50, first_wait: float = 1.0, max_wait: float = 60.0,
                 forget_after: float = 900.0, max_addresses: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.free = free
        self.free_total = free_total
        self.first_wait = first_wait
        self.max_wait = max_wait
        self.forget_after = forget_after
        self.max_addresses = max_addresses
        self.clock = clock
        self._lock = threading.Lock()
        self._addresses: dict[str, _Failures] = {}  # in the order of their last wrong token
        self._total = _Failures()

    def wait(self, address: str) -> float:
        """Seconds ``address`` must wait before a token it sends is checked (0: check it now)."""
        with self._lock:
            now = self.clock()
            self._forget(now)
            entry = self._addresses.get(address)
            until = max(self._total.until, entry.until if entry is not None else 0.0)
            return max(until - now, 0.0)

    def retry_after(self, address: str) -> int:
        """``wait`` in whole seconds, for a Retry-After header (at least 1)."""
        return max(math.ceil(self.wait(address)), 1)

    def failed(self, address: str) -> None:
        """A wrong token from ``address``."""
        with self._lock:
            now = self.clock()
            self._forget(now)
            entry = self._addresses.pop(address, None) or _Failures()
            self._addresses[address] = entry  # now the most recently wrong
            while len(self._addresses) > self.max_addresses:
                del self._addresses[next(iter(self._addresses))]
            self._count(entry, now, self.free)
            self._count(self._total, now, self.free_total)

    def succeeded(self, address: str) -> None:
        """The right token from ``address``: its count and the total start again."""
        with self._lock:
            self._addresses.pop(address, None)
            self._total = _Failures()

    def _count(self, entry: _Failures, now: float, free: int) -> None:
        entry.count += 1
        entry.last = now
        beyond = entry.count - free
        if beyond > 0:
            entry.until = now + min(self.first_wait * 2 ** min(beyond - 1, 30), self.max_wait)

    def _forget(self, now: float) -> None:
        while self._addresses:
            address, entry = next(iter(self._addresses.items()))
            if now - entry.last < self.forget_after:
                break
            del self._addresses[address]
        if self._total.count and now - self._total.last >= self.forget_after:
            self._total = _Failures()
