"""The HTTP server of pgq's two Prometheus exporters (``pgq-thin metrics``, pgq_thin.metrics.serve,
and a worker's ``metrics_port``): prometheus_client's WSGI app, in a daemon thread, behind the
rules the dashboard keeps too (pgq_thin.webguard):

- bound to a loopback address it answers only to the loopback Host names (400 otherwise: a
  DNS-rebinding page cannot read queue names and counts);
- it serves ``GET /metrics`` (and HEAD) only: 404 for any other path, 405 for another method;
- with a ``token``, a scrape needs ``Authorization: Bearer TOKEN`` (401 otherwise), and wrong
  tokens are slowed down like the dashboard's (429 with Retry-After while an address waits).

Needs prometheus_client (the ``metrics`` extra); imported when a server starts.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from pgq_thin.webguard import Throttle, allowed_hosts, bearer_matches, host_allowed, is_bearer

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

__all__ = ["PATH", "guarded", "serve"]

#: The one path an exporter answers.
PATH = "/metrics"

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class _QuietHandler(WSGIRequestHandler):
    """No line on stderr per scrape (prometheus_client's exporter is quiet too)."""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


def guarded(app: WSGIApp, hosts: tuple[str, ...] | None, token: str | None, throttle: Throttle) -> WSGIApp:
    """``app`` (prometheus_client's) behind the Host rule, /metrics only and the optional token."""

    def answer(start_response: Callable[..., Any], status: str, text: str,
               headers: list[tuple[str, str]] | None = None) -> Iterable[bytes]:
        body = (text + "\n").encode()
        start_response(status, [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body))),
                                ("X-Content-Type-Options", "nosniff"), *(headers or [])])
        return [body]

    def guarded_app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        host = environ.get("HTTP_HOST")
        if not host_allowed(host, hosts):
            return answer(start_response, "400 Bad Request", f"Host {str(host)[:100]!r} refused: bound to a loopback "
                          f"address, this exporter answers only to {', '.join(hosts or ())}")
        if environ.get("PATH_INFO") != PATH:
            return answer(start_response, "404 Not Found", f"not found: the metrics are at {PATH}")
        if environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            return answer(start_response, "405 Method Not Allowed", f"{PATH} answers GET", [("Allow", "GET, HEAD")])
        if token is not None:
            address = str(environ.get("REMOTE_ADDR", "?"))
            if throttle.wait(address) > 0:
                seconds = throttle.retry_after(address)
                return answer(start_response, "429 Too Many Requests",
                              f"too many wrong tokens from {address}: try again in {seconds} s",
                              [("Retry-After", str(seconds))])
            authorization = environ.get("HTTP_AUTHORIZATION")
            if not bearer_matches(authorization, token):
                if is_bearer(authorization):
                    throttle.failed(address)
                return answer(start_response, "401 Unauthorized", "a token is required: send Authorization: Bearer "
                              "TOKEN", [("WWW-Authenticate", 'Bearer realm="pgq metrics"')])
            throttle.succeeded(address)
        return app(environ, start_response)

    return guarded_app


def serve(registry: CollectorRegistry, port: int, host: str, token: str | None = None) -> tuple[WSGIServer,
                                                                                                  threading.Thread]:
    """Serve ``registry`` on http://host:port/metrics from a daemon thread; the server (its
    ``server_address`` says the port bound) and the thread. OSError when the address is taken."""
    from prometheus_client.exposition import ThreadingWSGIServer, make_wsgi_app

    family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]

    class Server(ThreadingWSGIServer):
        address_family = family

    app = guarded(make_wsgi_app(registry), allowed_hosts(host), token, Throttle())
    server = make_server(str(address[0]), port, app, Server, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name=f"pgq metrics :{port}", daemon=True)
    thread.start()
    return server, thread
