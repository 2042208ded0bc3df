"""pgq_thin.webguard, the rules the dashboard and both metrics exporters share, without a server:
which Host headers a loopback-bound server answers, the bearer check, and the wrong-token throttle
on a clock the test moves (its waits, their cap, the total over all addresses, forgetting)."""

from __future__ import annotations

import pytest

from pgq_thin.webguard import Throttle, allowed_hosts, bearer_matches, host_allowed, host_name, is_bearer


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(("bind", "expected"), [
    ("127.0.0.1", ("127.0.0.1", "localhost", "::1")),
    ("localhost", ("127.0.0.1", "localhost", "::1")),
    ("127.0.0.2", ("127.0.0.1", "localhost", "::1", "127.0.0.2")),
    ("::1", ("127.0.0.1", "localhost", "::1")),
    ("0.0.0.0", None),
    ("::", None),
    ("192.0.2.10", None),
    ("metrics.internal", None),
])
def test_a_server_bound_to_loopback_answers_only_to_the_loopback_names(bind: str, expected: object) -> None:
    assert allowed_hosts(bind) == expected


def test_host_headers_are_read_with_their_port_and_malformed_ones_refused() -> None:
    loopback = allowed_hosts("127.0.0.1")
    for header in ("127.0.0.1", "127.0.0.1:8080", "localhost:9187", "LocalHost", "[::1]", "[::1]:8080"):
        assert host_allowed(header, loopback), header
    for header in (None, "", "rebound.example", "rebound.example:8080", "127.0.0.1.nip.io", "localhost.",
                   "127.0.0.1:80x", "127.0.0.1:", "[::1", "[::1]x", "[::2]:80", "::1", "user@127.0.0.1"):
        assert not host_allowed(header, loopback), header
    assert host_allowed("anything.example", None) and host_allowed(None, None)
    assert host_name("[::1]:8080") == "::1" and host_name("Example.COM:80") == "example.com"


def test_the_bearer_check() -> None:
    assert bearer_matches("Bearer s3cret", "s3cret") and bearer_matches("bearer  s3cret ", "s3cret")
    for header in (None, "", "Bearer", "Bearer s3cre", "Bearer s3cretx", "Basic s3cret", "s3cret"):
        assert not bearer_matches(header, "s3cret"), header
    assert is_bearer("Bearer guess") and not is_bearer("Basic dXNlcjpwdw==") and not is_bearer(None)


def test_an_address_gets_five_wrong_tokens_then_doubling_waits_up_to_a_minute() -> None:
    clock = Clock()
    throttle = Throttle(clock=clock)
    for _ in range(5):
        throttle.failed("a")
        assert throttle.wait("a") == 0
    waits = []
    for _ in range(9):
        throttle.failed("a")
        waits.append(throttle.wait("a"))
        clock.now += throttle.wait("a")  # it waits, then guesses again
    assert waits == [1, 2, 4, 8, 16, 32, 60, 60, 60]
    assert throttle.wait("b") == 0  # another address is not slowed
    throttle.failed("a")
    clock.now += 30
    assert throttle.wait("a") == 30 and throttle.retry_after("a") == 30
    clock.now += 30
    throttle.succeeded("a")  # the right token, checked once the wait is over: the count starts again
    for _ in range(5):
        throttle.failed("a")
    assert throttle.wait("a") == 0


def test_all_addresses_together_get_fifty_wrong_tokens() -> None:
    clock = Clock()
    throttle = Throttle(clock=clock)
    for n in range(50):  # a guesser with many addresses, one guess each
        throttle.failed(f"10.0.0.{n}")
    assert throttle.wait("198.51.100.1") == 0
    throttle.failed("10.0.1.1")
    assert throttle.wait("198.51.100.1") == 1  # now everyone waits between guesses
    clock.now += 1
    throttle.failed("10.0.1.2")
    assert throttle.wait("198.51.100.1") == 2
    clock.now += 2
    throttle.succeeded("198.51.100.1")  # the right token clears the total too
    assert throttle.wait("10.0.1.3") == 0


def test_counts_are_forgotten_after_fifteen_minutes_and_at_most_so_many_addresses_are_kept() -> None:
    clock = Clock()
    throttle = Throttle(clock=clock, max_addresses=3)
    for _ in range(7):
        throttle.failed("a")
    assert throttle.wait("a") == 2
    clock.now += 899
    throttle.failed("a")  # the last wrong token is what counts: forgotten 15 minutes after it
    clock.now += 899
    assert throttle.wait("a") == 0  # its wait (4 s) is long over, but the count is remembered
    throttle.failed("a")
    assert throttle.wait("a") == 8
    clock.now += 900
    throttle.failed("a")
    assert throttle.wait("a") == 0  # forgotten: this was its first
    for address in ("b", "c", "d"):  # three more addresses: "a" is the least recently wrong, and goes
        throttle.failed(address)
    assert list(throttle._addresses) == ["b", "c", "d"]
