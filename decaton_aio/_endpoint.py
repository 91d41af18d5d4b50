"""The HTTP endpoint of a runtime: Prometheus metrics, and the liveness and readiness probes.

One small threaded WSGI server on a daemon thread. ``/healthz`` and ``/readyz`` answer
with a JSON body (200 when the check passes, 503 with the reasons when not); every other
path serves the metrics page: OpenMetrics or the Prometheus text format as the scraper's
``Accept`` header asks, gzipped when it accepts that, only the samples its ``name[]``
parameters name when it gives some. The page and the probes themselves are the caller's
business (a page function, `Probes`); this module only serves them.
"""

from __future__ import annotations

import gzip
import json
import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from socketserver import ThreadingMixIn
from typing import Any, Protocol
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from decaton_aio._exposition import keep_names, negotiate
from decaton_aio.errors import ConfigError

__all__ = ["DEFAULT_METRICS_ADDR", "Endpoint", "Page", "Probes"]

DEFAULT_METRICS_ADDR = "127.0.0.1"
"""Loopback by default so metrics are not exposed on every interface by accident; pass
``"0.0.0.0"`` (or ``"::"``) when Prometheus scrapes from another host."""

_StartResponse = Callable[[str, list[tuple[str, str]]], Any]

Page = Callable[[bool], str]
"""The metrics page: OpenMetrics (ending with ``# EOF``) when called with True, else the
Prometheus text format. Called from the endpoint's threads."""


class Probes(Protocol):
    """The checks behind ``/healthz`` and ``/readyz``.

    Each returns whether the check passed and a JSON-serializable body saying why. Called
    from the endpoint's thread.
    """

    def liveness(self) -> tuple[bool, Mapping[str, object]]: ...

    def readiness(self) -> tuple[bool, Mapping[str, object]]: ...


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a slow scraper never holds the process at exit


class _IPv6Server(_Server):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes and probes are frequent: no access log."""


def _metrics(page: Page, environ: dict[str, Any]) -> tuple[str, list[tuple[str, str]], bytes]:
    """The metrics response to a request: status, headers and body."""
    method = environ.get("REQUEST_METHOD", "GET")
    if method == "OPTIONS":
        return "200 OK", [("Allow", "OPTIONS,GET")], b""
    if method != "GET":
        body = f"# HTTP 405 Method Not Allowed: {method}; use OPTIONS or GET\n".encode()
        return "405 Method Not Allowed", [("Allow", "OPTIONS,GET")], body
    if environ.get("PATH_INFO") == "/favicon.ico":
        return "200 OK", [], b""  # a browser's, not a scrape
    openmetrics, content_type = negotiate(environ.get("HTTP_ACCEPT"))
    text = page(openmetrics)
    names = parse_qs(environ.get("QUERY_STRING", "")).get("name[]")
    if names:
        text = keep_names(text, names) + ("# EOF\n" if openmetrics else "")
    body = text.encode()
    headers = [("Content-Type", content_type)]
    if "gzip" in environ.get("HTTP_ACCEPT_ENCODING", ""):
        body = gzip.compress(body, compresslevel=1)
        headers.append(("Content-Encoding", "gzip"))
    return "200 OK", headers, body


def _app(page: Page, probes: Probes | None) -> Any:
    def app(environ: dict[str, Any], start_response: _StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path not in ("/healthz", "/readyz"):
            status, headers, output = _metrics(page, environ)
            start_response(status, headers)
            return [output]
        body: Mapping[str, object]
        if probes is None:
            ok, body = False, {"status": "unknown", "reason": "no probes on this endpoint"}
            status = "404 Not Found"
        else:
            try:
                ok, body = probes.liveness() if path == "/healthz" else probes.readiness()
            except Exception as exc:  # a failing check is a failed probe, not a 500
                ok, body = False, {"status": "error", "reason": f"the check raised {exc!r}"}
            status = "200 OK" if ok else "503 Service Unavailable"
        payload = json.dumps(body, sort_keys=True).encode()
        start_response(
            status,
            [
                ("Content-Type", "application/json"),
                ("Content-Length", str(len(payload))),
                ("Cache-Control", "no-store"),
            ],
        )
        return [payload]

    return app


class Endpoint:
    """A running HTTP endpoint; `start()` makes one, `stop()` ends it.

    Attributes:
        port: the port it is bound to.
    """

    def __init__(self, server: WSGIServer, thread: threading.Thread) -> None:
        self._server = server
        self._thread = thread
        self.port = int(server.server_port)

    @classmethod
    def start(cls, page: Page, port: int, addr: str, probes: Probes | None) -> Endpoint:
        """Bind ``addr:port`` and serve from a daemon thread.

        Raises:
            ConfigError: the port is out of range or the address cannot be bound.
        """
        if not 0 <= port <= 65535:
            raise ConfigError(f"metrics port must be between 0 and 65535, got {port}")
        server_class = _IPv6Server if ":" in addr else _Server
        try:
            server = make_server(
                addr, port, _app(page, probes), server_class, handler_class=_QuietHandler
            )
        except OSError as exc:
            raise ConfigError(
                f"cannot serve metrics on {addr}:{port}: {exc}; choose another port or address"
            ) from exc
        thread = threading.Thread(target=server.serve_forever, name="decaton-metrics", daemon=True)
        thread.start()
        return cls(server, thread)

    def stop(self) -> None:
        """Stop serving, close the socket and join the thread."""
        self._server.shutdown()  # returns once serve_forever has left its loop
        self._server.server_close()
        self._thread.join()
