"""Toxiproxy, Shopify's TCP fault proxy: its binary, its server process, its HTTP API.

A fault test puts a Toxiproxy proxy between the clients and each broker node and then
injects faults ("toxics") into the traffic: latency, a bandwidth cap, a connection reset,
a black hole, fragmented packets, a connection closed after some bytes, or the proxy
disabled (the node unreachable). `Toxiproxy` starts ``toxiproxy-server`` on a free
loopback port, stops it by its PID, and drives it through its HTTP API (the standard
library's HTTP client: no dependency).

The binary is built from its Go module by ``go install`` at `TOXIPROXY_VERSION`
into the user's cache directory (``$XDG_CACHE_HOME`` or ``~/.cache``, then
``decaton-aio/toxiproxy-<version>``), once, the way Apache Kafka's jars are cached;
``$DECATON_AIO_TOXIPROXY_BIN`` names another binary.

Caller: tests and tools, from one thread (each call is one blocking HTTP request on
loopback, a millisecond or so; an event loop may call them directly).
"""

from __future__ import annotations

import atexit
import http.client
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from decaton_aio import environment
from decaton_aio.embedded._broker import find_free_port
from decaton_aio.embedded._maven import cache_root
from decaton_aio.embedded._spawn import die_with_parent, popen_for_life
from decaton_aio.errors import BrokerError, ConfigError

__all__ = [
    "TOXICS",
    "TOXIPROXY_BIN_ENV_VAR",
    "TOXIPROXY_VERSION",
    "Toxiproxy",
    "resolve_toxiproxy_binary",
    "toxiproxy_cache_dir",
]

#: The Toxiproxy release built and run (its Go module asks for Go 1.19 or newer).
TOXIPROXY_VERSION = "v2.7.0"

#: Environment variable naming a ``toxiproxy-server`` binary to use instead of the cached one.
TOXIPROXY_BIN_ENV_VAR = environment.TOXIPROXY_BIN.name

_MODULE = "github.com/Shopify/toxiproxy/v2/cmd/server"
_BINARY = "toxiproxy-server"
_INSTALL_TIMEOUT_S = 900.0
_STARTUP_TIMEOUT_S = 10.0

#: The toxic types and their attributes (all integers): ``latency`` and ``jitter`` in ms;
#: ``rate`` in KB/s; ``timeout`` in ms (``timeout``: 0 holds the data until the toxic is
#: removed, a black hole; ``reset_peer``: the connection is reset after that long);
#: ``average_size`` and ``size_variation`` in bytes and ``delay`` in microseconds
#: (``slicer``); ``bytes`` (``limit_data``: the connection is closed after that many).
TOXICS: Mapping[str, frozenset[str]] = {
    "latency": frozenset({"latency", "jitter"}),
    "bandwidth": frozenset({"rate"}),
    "slow_close": frozenset({"delay"}),
    "timeout": frozenset({"timeout"}),
    "reset_peer": frozenset({"timeout"}),
    "slicer": frozenset({"average_size", "size_variation", "delay"}),
    "limit_data": frozenset({"bytes"}),
}


def toxiproxy_cache_dir(version: str = TOXIPROXY_VERSION) -> Path:
    """Where the ``toxiproxy-server`` binary of ``version`` is cached."""
    return cache_root() / f"toxiproxy-{version}"


def _find_go() -> str | None:
    found = shutil.which("go")
    if found is None and os.access("/usr/local/go/bin/go", os.X_OK):
        return "/usr/local/go/bin/go"
    return found


def resolve_toxiproxy_binary(*, install: bool = True) -> str:
    """The ``toxiproxy-server`` to run, built with ``go install`` on first use.

    Order: ``$DECATON_AIO_TOXIPROXY_BIN``, then the binary in `toxiproxy_cache_dir()`,
    which is built there when missing and ``install`` is true (a few minutes, once).

    Raises:
        BrokerError: no binary, and Go is missing or the build failed (the message says
            what to install or shows the tail of Go's output).
    """
    override = os.environ.get(TOXIPROXY_BIN_ENV_VAR)
    if override:
        if os.path.isfile(override) and os.access(override, os.X_OK):
            return override
        raise BrokerError(f"{TOXIPROXY_BIN_ENV_VAR}={override!r} is not an executable file")
    cache = toxiproxy_cache_dir()
    binary = cache / _BINARY
    if binary.exists():
        return str(binary)
    go = _find_go()
    if not install or go is None:
        raise BrokerError(
            f"Toxiproxy {TOXIPROXY_VERSION} is not built and Go is missing: install Go "
            "(Debian: apt-get install golang-go; or run 'make toxiproxy'), or set "
            f"{TOXIPROXY_BIN_ENV_VAR} to a toxiproxy-server binary"
        )
    cache.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{cache.name}-", dir=cache.parent))
    try:
        result = subprocess.run(
            [go, "install", f"{_MODULE}@{TOXIPROXY_VERSION}"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "GOBIN": str(staging), "CGO_ENABLED": "0"},
            timeout=_INSTALL_TIMEOUT_S,
        )
        if result.returncode != 0:
            tail = "\n".join((result.stdout + result.stderr).splitlines()[-15:])
            raise BrokerError(
                f"go install of Toxiproxy {TOXIPROXY_VERSION} failed "
                f"(exit {result.returncode}):\n{tail}"
            )
        (staging / "server").rename(staging / _BINARY)
        try:
            staging.rename(cache)
        except OSError:  # another process put its copy in place first: use that one
            if not binary.exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return str(binary)


class Toxiproxy:
    """A ``toxiproxy-server`` process owned by this Python process, and its HTTP API.

    Use it as a context manager, or call `start()` and `stop()`:

    ```python
    with Toxiproxy() as toxiproxy:
        toxiproxy.create("node-1", listen_port=19092, upstream="127.0.0.1:9092")
        toxiproxy.add_toxic("node-1", "latency", latency=200, jitter=50)
    ```

    Args:
        host: the loopback address the API and every proxy listen on.
        port: the API's port; a free one when omitted.
        binary: the ``toxiproxy-server`` to run; `resolve_toxiproxy_binary()` when
            omitted.
        log_path: where the server's output goes; a temporary file when omitted.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        binary: str | None = None,
        log_path: str | os.PathLike[str] | None = None,
    ) -> None:
        self.host = host
        self.port = port or find_free_port(host)
        self._binary = binary
        self._log_path = Path(log_path) if log_path else None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path | None:
        """The file holding the server's output (kept after stop)."""
        return self._log_path

    def start(self) -> Toxiproxy:
        """Start the server and wait until its API answers.

        Raises:
            BrokerError: no binary (see `resolve_toxiproxy_binary()`), or the server
                exited or did not answer within 10 s.
        """
        if self._process is not None:
            raise BrokerError("this Toxiproxy was already started")
        binary = self._binary or resolve_toxiproxy_binary()
        if self._log_path is None:
            fd, name = tempfile.mkstemp(prefix="decaton-aio-toxiproxy-", suffix=".log")
            os.close(fd)
            self._log_path = Path(name)
        with open(self._log_path, "ab") as log:
            self._process = popen_for_life(
                [binary, "-host", self.host, "-port", str(self.port)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent(),
            )
        atexit.register(self.stop)
        deadline = time.monotonic() + _STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                code = self._process.returncode
                self.stop()
                raise BrokerError(
                    f"toxiproxy-server exited with code {code} at start; log {self._log_path}"
                )
            try:
                self._call("GET", "/version")
                return self
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise BrokerError(f"toxiproxy-server did not answer on {self.host}:{self.port}")

    def stop(self) -> None:
        """Stop the server (every proxy closes its connections). Safe to call twice."""
        process, self._process = self._process, None
        atexit.unregister(self.stop)
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def create(self, name: str, *, listen_port: int, upstream: str) -> None:
        """Create an enabled proxy ``name`` on ``host:listen_port`` forwarding to
        ``upstream`` (``host:port``)."""
        body = {"name": name, "listen": f"{self.host}:{listen_port}", "upstream": upstream}
        self._call("POST", "/proxies", {**body, "enabled": True})

    def delete(self, name: str) -> None:
        """Delete a proxy and close its connections."""
        self._call("DELETE", f"/proxies/{name}")

    def set_enabled(self, name: str, enabled: bool) -> None:
        """Disable a proxy (its listener closes and its connections are dropped: the
        upstream is unreachable) or enable it again."""
        self._call("POST", f"/proxies/{name}", {"enabled": enabled})

    def add_toxic(
        self,
        proxy: str,
        kind: str,
        *,
        stream: str = "downstream",
        name: str | None = None,
        toxicity: float = 1.0,
        **attributes: int,
    ) -> str:
        """Add a toxic to ``proxy`` and return its name.

        Args:
            proxy: the proxy's name.
            kind: one of `TOXICS`.
            stream: ``downstream`` (upstream to client: responses) or ``upstream``
                (client to upstream: requests).
            name: the toxic's name; ``<kind>_<stream>`` when omitted.
            toxicity: the share of connections it applies to (0 to 1).
            attributes: the kind's attributes (see `TOXICS`).

        Raises:
            ConfigError: an unknown kind, stream or attribute.
        """
        known = TOXICS.get(kind)
        if known is None:
            raise ConfigError(f"unknown toxic {kind!r}: use one of {sorted(TOXICS)}")
        if stream not in ("upstream", "downstream"):
            raise ConfigError(f"stream must be 'upstream' or 'downstream', got {stream!r}")
        unknown = set(attributes) - known
        if unknown:
            raise ConfigError(f"toxic {kind!r} has no {sorted(unknown)}: it takes {sorted(known)}")
        name = name or f"{kind}_{stream}"
        body = {"name": name, "type": kind, "stream": stream, "toxicity": toxicity}
        self._call("POST", f"/proxies/{proxy}/toxics", {**body, "attributes": attributes})
        return name

    def remove_toxic(self, proxy: str, name: str) -> None:
        """Remove a toxic from a proxy; held data flows again."""
        self._call("DELETE", f"/proxies/{proxy}/toxics/{name}")

    def proxies(self) -> dict[str, Any]:
        """Every proxy, by name, as the API describes it (``enabled``, ``toxics``, ...)."""
        found = self._call("GET", "/proxies")
        return dict(found) if isinstance(found, dict) else {}

    def reset(self) -> None:
        """Enable every proxy and remove every toxic."""
        self._call("POST", "/reset")

    def _call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        connection = http.client.HTTPConnection(self.host, self.port, timeout=10)
        try:
            payload = json.dumps(body).encode() if body is not None else None
            headers = {"Content-Type": "application/json"} if payload is not None else {}
            connection.request(method, path, body=payload, headers=headers)
            response = connection.getresponse()
            text = response.read().decode(errors="replace")
        finally:
            connection.close()
        if response.status >= 300:
            raise BrokerError(f"Toxiproxy {method} {path}: {response.status} {text.strip()}")
        return json.loads(text) if text.strip() else None

    def __enter__(self) -> Toxiproxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        pid = self._process.pid if self._process is not None else None
        return f"Toxiproxy('{self.host}:{self.port}', pid={pid})"
