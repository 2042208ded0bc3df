"""What every request to the dashboard passes before a route sees it, and what bounds the rest
(docs/security.md, "The web surfaces"):

1. **Host**: bound to a loopback address, only the loopback names are answered (400 otherwise,
   against DNS rebinding; pgq_thin.webguard's rule, the exporters' too).
2. **Body size**: a body larger than the route takes gets 413 and is not read: ``LOGIN_BODY_LIMIT``
   (4 KiB) for the login form, ``BODY_LIMIT`` (8 KiB) for every other request (the JSON actions'
   bodies are a few bytes). A declared Content-Length is refused before a byte is read; a chunked
   body is counted as it arrives and refused when it passes the limit.
3. **Origin**: a POST from another origin gets 403 (CSRF), token or not.
4. **Token**: ``Authorization: Bearer TOKEN`` or a session cookie (401 otherwise, a page answering
   with the login form). Wrong tokens are slowed down per client address (pgq_thin.webguard's
   Throttle: 429 with Retry-After while an address waits); a session cookie is never slowed.

Every answer, refusals included, carries the security headers (``SECURITY_HEADERS``). A login is a
session (``Sessions``): a random id kept in this process, valid for ``SESSION_LIFETIME`` (12 hours),
revoked by /logout; the cookie holds the id, never the token nor anything derived from it.
JSON bodies are parsed by ``parse_json``, which refuses nesting deeper than ``MAX_JSON_DEPTH``.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pgq_thin.webguard import Throttle, bearer_matches, host_allowed, is_bearer

__all__ = ["BODY_LIMIT", "COOKIE", "LOGIN_BODY_LIMIT", "MAX_JSON_DEPTH", "SECURITY_HEADERS", "SESSION_LIFETIME",
           "BadJSON", "Guard", "Sessions", "client_address", "parse_json", "refusal"]

#: The login form's cookie: a session id (random, per login; see Sessions).
COOKIE = "pgq_dashboard"
#: Paths served without the token: the login form and the static files (the wheel's own CSS/JS).
OPEN_PATHS = ("/login", "/static/")
#: The most a request body may hold: the login form (a token and a page to go back to), and any
#: other request (the JSON actions: ``{"state": "done"}`` is 17 bytes).
LOGIN_BODY_LIMIT = 4096
BODY_LIMIT = 8192
#: The deepest a JSON body may nest (``{"state": "done"}`` is 1).
MAX_JSON_DEPTH = 32
#: How long a login lasts (seconds): 12 hours, the cookie's Max-Age too.
SESSION_LIFETIME = 12 * 3600.0
#: The most sessions kept at once; past it the oldest is dropped (only a token holder makes one).
MAX_SESSIONS = 1000
SECURITY_HEADERS = [
    (b"content-security-policy",
     b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
     b"form-action 'self'; frame-ancestors 'none'; base-uri 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
]


def refusal(message: str, status: int, headers: dict[str, str] | None = None) -> JSONResponse:
    """An error answer of the API's shape: {"error", "sqlstate", "hint"}."""
    return JSONResponse({"error": message, "sqlstate": None, "hint": None}, status_code=status, headers=headers)


def client_address(request: Request) -> str:
    """Who sent the request, as the server saw it (uvicorn takes X-Forwarded-For only from a proxy
    on 127.0.0.1, its forwarded_allow_ips default)."""
    return request.client.host if request.client is not None else "?"


class BodyTooLarge(Exception):
    """A streamed body passed its limit (raised from ``receive``; Guard answers 413)."""


class BadJSON(ValueError):
    """A body that is not JSON, or nests deeper than MAX_JSON_DEPTH."""


def parse_json(body: bytes) -> Any:
    """The JSON of a body (empty: None); BadJSON when it is not JSON or nests deeper than
    MAX_JSON_DEPTH. The depth is counted before parsing, so no body reaches the parser's recursion
    limit (a RecursionError would be a 500)."""
    if not body.strip():
        return None
    depth = 0
    in_string = escaped = False
    for byte in body:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > MAX_JSON_DEPTH:
                raise BadJSON(f"the body is nested deeper than {MAX_JSON_DEPTH} levels")
        elif byte in (0x5D, 0x7D):  # ] }
            depth -= 1
    try:
        return json.loads(body)
    except ValueError:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise BadJSON("the body must be JSON") from None


class Sessions:
    """The login form's sessions, kept in this process (a restart logs everyone out): ``create``
    gives a random id (256 bits) valid for ``lifetime`` seconds, ``valid`` checks one, ``revoke``
    ends one. Only a hash of each id is kept. At most MAX_SESSIONS at once (the oldest goes)."""

    def __init__(self, lifetime: float = SESSION_LIFETIME, clock: Callable[[], float] = time.monotonic) -> None:
        self.lifetime = lifetime
        self.clock = clock
        self._lock = threading.Lock()
        self._expiry: dict[bytes, float] = {}  # hash of the id -> when it ends, oldest first

    @staticmethod
    def _key(session_id: str) -> bytes:
        return hashlib.sha256(session_id.encode()).digest()

    def create(self) -> str:
        session_id = secrets.token_urlsafe(32)
        with self._lock:
            now = self.clock()
            for key in [k for k, ends in self._expiry.items() if ends <= now]:
                del self._expiry[key]
            while len(self._expiry) >= MAX_SESSIONS:
                del self._expiry[next(iter(self._expiry))]
            self._expiry[self._key(session_id)] = now + self.lifetime
        return session_id

    def valid(self, session_id: str | None) -> bool:
        if not session_id:
            return False
        with self._lock:
            ends = self._expiry.get(self._key(session_id))
            return ends is not None and ends > self.clock()

    def revoke(self, session_id: str | None) -> None:
        if session_id:
            with self._lock:
                self._expiry.pop(self._key(session_id), None)


class Guard:
    """The checks every request passes first (in this order): Host, body size, Origin on POSTs
    (CSRF), then the token; every answer gets the security headers. ``receive`` is wrapped so that
    no route reads more of a body than its limit."""

    def __init__(self, app: ASGIApp, token: str | None, login_page: Callable[[Request, str], Response],
                 sessions: Sessions, throttle: Throttle, allowed_hosts: Sequence[str] | None = None) -> None:
        self.app = app
        self.token = token
        self.login_page = login_page  # what a browser gets without the token: the login form (with 401)
        self.sessions = sessions
        self.throttle = throttle
        self.allowed_hosts = None if allowed_hosts is None else [h.lower() for h in allowed_hosts]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        started = False

        async def send_with_headers(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message["headers"] = list(message.get("headers", [])) + SECURITY_HEADERS
            await send(message)

        limit = LOGIN_BODY_LIMIT if request.url.path == "/login" else BODY_LIMIT
        answer = self.refusal(request, limit)
        if answer is not None:
            await answer(scope, receive, send_with_headers)
            return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge
            return message

        try:
            await self.app(scope, limited_receive, send_with_headers)
        except BodyTooLarge:
            if not started:  # a route reads its body before it answers
                await _too_large(request, limit)(scope, receive, send_with_headers)

    def refusal(self, request: Request, limit: int) -> Response | None:
        if not host_allowed(request.headers.get("host"), self.allowed_hosts):
            return refusal(f"Host {request.headers.get('host', '')[:100]!r} refused: bound to a loopback address, "
                           f"this dashboard answers only to {', '.join(self.allowed_hosts or ())}", 400)
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            return _too_large(request, limit)
        if request.method not in ("GET", "HEAD", "OPTIONS"):
            own = f"{request.url.scheme}://{request.headers.get('host', '')}"
            origin = request.headers.get("origin")
            if origin is not None and origin != own:
                return refusal(f"cross-origin request refused: Origin {origin[:100]} is not this dashboard's "
                               f"({own})", 403)
            if origin is None and request.headers.get("sec-fetch-site") in ("cross-site", "same-site"):
                return refusal("cross-site request refused", 403)
        if self.token is None or request.url.path.startswith(OPEN_PATHS):
            return None
        if self.sessions.valid(request.cookies.get(COOKIE)):
            return None  # a session is never slowed down: it already showed the token
        authorization = request.headers.get("authorization")
        if is_bearer(authorization):
            address = client_address(request)
            if self.throttle.wait(address) > 0:
                seconds = self.throttle.retry_after(address)
                return refusal(f"too many wrong tokens from {address}: try again in {seconds} s", 429,
                               {"retry-after": str(seconds)})
            if bearer_matches(authorization, self.token):
                self.throttle.succeeded(address)
                return None
            self.throttle.failed(address)
        if request.method == "GET" and wants_html(request):
            query = request.url.query
            return self.login_page(request, local(request.url.path + (f"?{query}" if query else "")))
        return refusal("a token is required: send Authorization: Bearer TOKEN, or log in at /login", 401,
                       {"www-authenticate": 'Bearer realm="pgq dashboard"'})


def _too_large(request: Request, limit: int) -> Response:
    return refusal(f"request body too large: {request.method} {request.url.path[:100]} takes at most {limit} bytes",
                   413, {"connection": "close"})


def wants_html(request: Request) -> bool:
    path = request.url.path
    return not (path.startswith("/api/") or path in ("/metrics", "/healthz"))


def local(path: str | None) -> str:
    """A redirect target that stays on this site."""
    if not path or not path.startswith("/") or path.startswith("//") or "\\" in path:
        return "/"
    return path
