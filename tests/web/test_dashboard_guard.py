"""The dashboard against hostile requests, over Starlette's TestClient on a real database (and a
real ``pgq-thin dashboard`` process for what a huge upload costs its memory): every request body is
bounded (413, and nothing read past the limit), deep or broken JSON is a 400, no body makes a 500
or a traceback; each login is a random session that /logout revokes; wrong tokens are slowed down
per client address; a foreign Host header gets its 400 with the security headers.

The documented limits (docs/security.md): a login form of at most 4096 bytes, any other body at
most 8192 bytes, JSON nested at most 32 levels; a session lasts 12 hours."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import re
import select
import socket
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from pgq_thin import AsyncClient, Client
from pgq_thin.dashboard.app import COOKIE, create_app

from dashboardkit import dashboard, failed_job, logins, running_dashboard, unknown_job
from sqlhelpers import wait_for

FORM = {"content-type": "application/x-www-form-urlencoded"}
SECURITY_HEADERS = ("content-security-policy", "x-content-type-options", "x-frame-options", "referrer-policy")


@pytest.fixture
def roles(pgq_dsn: str) -> Iterator[dict[str, str]]:
    with logins(pgq_dsn) as dsns:
        yield dsns


def assert_error(response: Any, status: int, *words: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert body["sqlstate"] is None, body
    for word in words:
        assert word in body["error"], body
    assert "Traceback" not in response.text


def chunked(total: int, size: int = 65536) -> Iterator[bytes]:
    """``total`` bytes of body, sent chunked (no Content-Length: the limit counts what arrives). The
    TestClient hands the app all of it at once; the real server's test below sends it piece by piece."""
    for _ in range(total // size):
        yield b"a" * size


def log_in(http: TestClient, token: str = "s3cret") -> str:
    """Log in with the form; the session cookie it set (the client keeps it too)."""
    response = http.post("/login", data={"token": token, "next": "/"}, follow_redirects=False)
    assert response.status_code == 303, response.text
    return response.cookies[COOKIE]


def with_cookie(value: str) -> dict[str, str]:
    return {"cookie": f"{COOKIE}={value}"}


# Request bodies ----------------------------------------------------------------------------------


def test_a_login_body_over_4_kib_is_413_and_is_not_read_further(pgq_client: Client) -> None:
    with dashboard(pgq_client.dsn, token="s3cret") as http:
        big = http.post("/login", content=b"token=" + b"a" * (5 * 1024 * 1024), headers=FORM)
        assert_error(big, 413, "at most 4096 bytes", "/login")
        assert big.headers["connection"] == "close"  # the rest of the upload is not waited for
        for name in SECURITY_HEADERS:
            assert name in big.headers
        assert_error(http.post("/login", content=chunked(5 * 1024 * 1024), headers=FORM), 413, "at most 4096 bytes")
        assert COOKIE not in http.cookies
        # A form within the limit (a long next path) is read as before.
        form = urllib.parse.urlencode({"token": "s3cret", "next": "/jobs?kind=" + "k" * 3900}).encode()
        assert len(form) <= 4096
        assert http.post("/login", content=form, headers=FORM, follow_redirects=False).status_code == 303


def test_a_json_action_body_over_8_kib_is_413_and_changes_nothing(pgq_client: Client,
                                                                   roles: dict[str, str]) -> None:
    unknown = unknown_job(pgq_client)
    failed = failed_job(pgq_client)
    with dashboard(roles["pgq_admin"]) as http:
        padded = json.dumps({"state": "done", "pad": "x" * 9000}).encode()
        assert_error(http.post(f"/api/jobs/{unknown}/resolve", content=padded), 413, "at most 8192 bytes")
        assert_error(http.post(f"/api/jobs/{unknown}/resolve", content=chunked(5 * 1024 * 1024)), 413,
                     "at most 8192 bytes")
        for url in (f"/api/jobs/{failed}/retry", f"/api/jobs/{failed}/cancel", "/api/queues/mail/pause"):
            assert_error(http.post(url, content=b"x" * 8193), 413, "at most 8192 bytes")
        # At the limit it is read: a resolve body of exactly 8192 bytes resolves.
        exact = json.dumps({"state": "done", "pad": ""}).encode()
        exact = json.dumps({"state": "done", "pad": "x" * (8192 - len(exact))}).encode()
        assert len(exact) == 8192
        assert http.post(f"/api/jobs/{unknown}/resolve", content=exact).json()["job"]["state"] == "done"
    assert pgq_client.get_job(failed).state == "failed" and not pgq_client.stats()[0].paused


def test_deep_json_is_a_400_never_a_500(pgq_client: Client, roles: dict[str, str],
                                        caplog: pytest.LogCaptureFixture) -> None:
    unknown = unknown_job(pgq_client)
    url = f"/api/jobs/{unknown}/resolve"

    def nested(depth: int) -> bytes:  # {"state": "done", "x": [[...]]}, ``depth`` levels in all
        return b'{"state": "done", "x": ' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"

    with dashboard(roles["pgq_admin"]) as http:
        for body in (b"[" * 8000, b'{"a":' * 1600, b"[" * 8000 + b"]" * 192, nested(33)):
            assert_error(http.post(url, content=body), 400, "nested deeper than 32 levels")
        assert_error(http.post(url, content=b"[" * 100_000), 413, "at most 8192 bytes")  # the body
        assert_error(http.post(url, content=b'{"state": "done"'), 400, "must be JSON")
        assert_error(http.post(url, content=b'{"state": "d\xffne"}'), 400, "must be JSON")
        assert pgq_client.get_job(unknown).state == "outcome_unknown"
        assert http.post(url, content=nested(32)).json()["job"]["state"] == "done"  # 32 levels: read
    assert "RecursionError" not in caplog.text and "Traceback" not in caplog.text


def json_bodies() -> st.SearchStrategy[bytes]:
    """Bodies a hostile client might send: bytes, JSON of any shape, deep nesting, forms."""
    values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                          lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                       max_size=4),
                          max_leaves=20)
    return st.one_of(
        st.binary(max_size=9000),
        values.map(lambda v: json.dumps(v).encode()),
        st.fixed_dictionaries({"state": st.text(max_size=30)}).map(lambda v: json.dumps(v).encode()),
        st.tuples(st.integers(0, 9000), st.sampled_from([b"[", b"{", b'{"a":', b'"'])).map(lambda t: t[1] * t[0]),
        st.dictionaries(st.sampled_from(["token", "next", "x"]), st.text(max_size=60), max_size=3).map(
            lambda d: urllib.parse.urlencode(d).encode()),
    )


def test_no_body_makes_a_500_or_a_traceback(pgq_client: Client, roles: dict[str, str],
                                            caplog: pytest.LogCaptureFixture) -> None:
    unknown = unknown_job(pgq_client)
    failed = failed_job(pgq_client)
    with dashboard(roles["pgq_admin"], token="s3cret") as http:
        log_in(http)  # the actions go with the session cookie (never slowed down by the form's wrong tokens)

        @settings(max_examples=150, deadline=None, database=None)
        @given(body=json_bodies(), form=st.booleans())
        @example(body=b"[" * 5000, form=False)
        @example(body=b'{"state": "done", "x": ' + b"{" * 3000, form=False)
        @example(body=b"token=" + b"%ff" * 1300, form=True)
        def post(body: bytes, form: bool) -> None:
            headers = FORM if form else {"content-type": "application/json"}
            for url in ("/login", f"/api/jobs/{unknown}/resolve", f"/api/jobs/{failed}/retry",
                        f"/api/jobs/{failed}/cancel", "/api/queues/mail/pause", "/api/queues/mail/resume"):
                response = http.post(url, content=body, headers=headers, follow_redirects=False)
                assert response.status_code < 500, (url, body[:200], response.text[:500])
                assert "Traceback" not in response.text

        post()
    assert "Traceback" not in caplog.text and "RecursionError" not in caplog.text


def test_a_huge_upload_to_the_real_server_is_refused_without_reading_it(pgq_dsn: str) -> None:
    """``pgq-thin dashboard`` (uvicorn): a login form that says it holds 200 MB gets 413 before a
    byte of it is sent; one sent chunked gets 413 after 4 KiB, and the process's peak memory does not
    grow by what was sent (the issue: 200 MB took it from 47 to 235 MB)."""

    def peak_kib(pid: int) -> int:
        with open(f"/proc/{pid}/status") as status:
            return int(re.search(r"VmHWM:\s+(\d+) kB", status.read()).group(1))  # type: ignore[union-attr]

    def answer(sock: socket.socket) -> bytes:
        assert select.select([sock], [], [], 10)[0], "no answer within 10 s"
        return sock.recv(65536)

    pids: list[int] = []
    with running_dashboard(pgq_dsn, "s3cret", pids=pids) as url:
        port = int(url.rsplit(":", 1)[1])
        before = peak_kib(pids[0])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"POST /login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded"
                         b"\r\nContent-Length: 209715200\r\n\r\n")
            assert answer(sock).startswith(b"HTTP/1.1 413 ")
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"POST /login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded"
                         b"\r\nTransfer-Encoding: chunked\r\n\r\n2000\r\n" + b"a" * 0x2000 + b"\r\n")
            assert answer(sock).startswith(b"HTTP/1.1 413 ")  # after 8 KiB: the chunked stream never ends
            sent = 0  # the server closed the connection: the rest of 200 MB finds nobody taking it
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                while sent < 200 * 1024 * 1024:
                    sent += sock.send(b"10000\r\n" + b"a" * 0x10000 + b"\r\n")
        assert sent < 20 * 1024 * 1024, sent
        assert peak_kib(pids[0]) - before < 30 * 1024
        with urllib_get(f"{url}/healthz", "s3cret") as response:  # and it still serves
            assert response.status == 200


@contextmanager
def urllib_get(url: str, token: str) -> Iterator[Any]:
    import urllib.request

    with urllib.request.urlopen(urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"}),
                                timeout=10) as response:
        yield response


# Sessions ----------------------------------------------------------------------------------------


def test_each_login_is_a_random_session_that_logout_revokes(pgq_client: Client) -> None:
    with dashboard(pgq_client.dsn, token="s3cret") as http:
        first = log_in(http)
        response = http.post("/login", data={"token": "s3cret"}, follow_redirects=False)
        second = response.cookies[COOKIE]
        assert first != second and len(first) >= 32  # no longer a function of the token
        assert "max-age=43200" in response.headers["set-cookie"].lower()  # 12 hours
        fixed = hmac.new(b"s3cret", b"pgq dashboard login", hashlib.sha256).hexdigest()  # 872c9cd's cookie
        http.cookies.clear()
        assert http.get("/api/queues", headers=with_cookie(fixed)).status_code == 401
        for session in (first, second):
            assert http.get("/api/queues", headers=with_cookie(session)).status_code == 200
        out = http.post("/logout", headers=with_cookie(first), follow_redirects=False)
        assert out.status_code == 303 and out.headers["location"] == "/login"
        assert f'{COOKIE}=""' in out.headers["set-cookie"] and "max-age=0" in out.headers["set-cookie"].lower()
        http.cookies.clear()
        assert http.get("/api/queues", headers=with_cookie(first)).status_code == 401  # revoked
        page = http.get("/jobs", headers=with_cookie(first))
        assert page.status_code == 401 and 'name="token"' in page.text
        assert http.get("/api/queues", headers=with_cookie(second)).status_code == 200  # the other one lives
        assert http.post("/logout", headers=with_cookie(first)).status_code == 401  # nothing left to log out


def test_a_session_ends_after_its_lifetime(pgq_client: Client) -> None:
    with dashboard(pgq_client.dsn, token="s3cret", session_lifetime=1.0) as http:
        session = log_in(http)
        http.cookies.clear()
        assert http.get("/api/queues", headers=with_cookie(session)).status_code == 200
        wait_for(lambda: http.get("/api/queues", headers=with_cookie(session)).status_code == 401,
                 "the session to expire", timeout=20)
        assert http.get("/api/queues", headers={"Authorization": "Bearer s3cret"}).status_code == 200


# Wrong tokens ------------------------------------------------------------------------------------


def test_wrong_tokens_are_slowed_down_per_address_and_sessions_keep_working(pgq_client: Client) -> None:
    # One app (one throttle, one set of sessions) served twice: each server makes its own AsyncClient.
    app = create_app(lambda: AsyncClient(pgq_client.dsn, max_size=2), token="s3cret")
    with TestClient(app, client=("203.0.113.7", 40000)) as attacker, \
            TestClient(app, client=("198.51.100.2", 50000)) as user:
        session = log_in(user)
        for _ in range(5):  # the first five wrong tokens of an address answer at once
            assert attacker.post("/login", data={"token": "guess"}).status_code == 401
        assert attacker.get("/api/queues", headers={"Authorization": "Bearer guess"}).status_code == 401
        # The sixth made the address wait 1 s: nothing it sends is checked until then, right or wrong.
        slowed = attacker.post("/login", data={"token": "s3cret"}, follow_redirects=False)
        assert slowed.status_code == 429 and slowed.headers["retry-after"] == "1"
        assert "Too many wrong tokens" in slowed.text and COOKIE not in slowed.cookies
        api = attacker.get("/api/queues", headers={"Authorization": "Bearer s3cret"})
        assert_error(api, 429, "too many wrong tokens")
        assert api.headers["retry-after"] == "1"
        # The real user elsewhere is not slowed, and a session is never slowed.
        assert user.get("/api/queues").status_code == 200
        user.cookies.clear()
        assert attacker.get("/api/queues", headers=with_cookie(session)).status_code == 200
        assert log_in(user)
        # Once the wait is over the right token works, and clears the address's count.
        wait_for(lambda: attacker.post("/login", data={"token": "s3cret"},
                                       follow_redirects=False).status_code == 303, "the wait to end", 20)
        attacker.cookies.clear()
        assert attacker.post("/login", data={"token": "guess"}).status_code == 401


# Host --------------------------------------------------------------------------------------------


def test_a_foreign_host_gets_400_with_the_security_headers(pgq_client: Client) -> None:
    with dashboard(pgq_client.dsn, token="s3cret", allowed_hosts=["127.0.0.1", "localhost", "::1"]) as http:
        refused = http.get("http://rebound.example:8080/api/queues")
        assert_error(refused, 400, "rebound.example")
        for name in SECURITY_HEADERS:
            assert name in refused.headers, name
        assert refused.headers["x-frame-options"] == "DENY"
        assert http.post("http://rebound.example/login", data={"token": "s3cret"}).status_code == 400
        for host in ("localhost:8080", "127.0.0.1", "[::1]:8080", "LOCALHOST"):
            answer = http.get("/api/queues", headers={"host": host, "authorization": "Bearer s3cret"})
            assert answer.status_code == 200, (host, answer.text)
