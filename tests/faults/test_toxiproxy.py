"""The Toxiproxy driver against a real toxiproxy-server: a proxy forwards, and each fault
the suite relies on does to a connection what it says (delayed, reset, cut after some
bytes, refused while disabled)."""

from __future__ import annotations

import contextlib
import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from decaton_aio.embedded import Toxiproxy, find_free_port
from decaton_aio.errors import ConfigError


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


@pytest.fixture
def proxy(toxiproxy: Toxiproxy) -> Iterator[int]:
    """A proxy named ``echo`` in front of a loopback echo server; its port."""
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = find_free_port()
    toxiproxy.create("echo", listen_port=port, upstream=f"127.0.0.1:{server.server_address[1]}")
    try:
        yield port
    finally:
        toxiproxy.delete("echo")
        server.shutdown()
        server.server_close()


def _echo(port: int, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(payload)
        got = b""
        while len(got) < len(payload):
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += chunk
        return got


def test_a_proxy_forwards_and_its_toxics_change_the_connection(
    toxiproxy: Toxiproxy, proxy: int
) -> None:
    """Forwarding, latency (a lower bound: the reply cannot come sooner), limit_data,
    reset_peer and a disabled proxy, each undone by removing it."""
    assert _echo(proxy, b"hello") == b"hello"

    toxiproxy.add_toxic("echo", "latency", latency=300, jitter=0)
    began = time.monotonic()
    assert _echo(proxy, b"slow") == b"slow"
    assert time.monotonic() - began >= 0.3
    toxiproxy.remove_toxic("echo", "latency_downstream")

    toxiproxy.add_toxic("echo", "limit_data", bytes=1000)
    assert len(_echo(proxy, b"x" * 5000)) == 1000  # closed after 1000 bytes
    toxiproxy.remove_toxic("echo", "limit_data_downstream")

    toxiproxy.add_toxic("echo", "reset_peer", stream="upstream", timeout=0)
    with pytest.raises(ConnectionError):
        _echo(proxy, b"reset")
    toxiproxy.remove_toxic("echo", "reset_peer_upstream")

    toxiproxy.set_enabled("echo", False)
    with pytest.raises(ConnectionRefusedError):
        _echo(proxy, b"refused")
    assert toxiproxy.proxies()["echo"]["enabled"] is False
    toxiproxy.set_enabled("echo", True)
    assert _echo(proxy, b"back") == b"back"


def test_a_black_hole_holds_data_until_it_is_removed(toxiproxy: Toxiproxy, proxy: int) -> None:
    """``timeout`` with 0 holds the data (no reply, the connection stays open); removing
    the toxic lets a new connection through at once."""
    toxiproxy.add_toxic("echo", "timeout", timeout=0)
    with socket.create_connection(("127.0.0.1", proxy), timeout=0.5) as sock:
        sock.sendall(b"lost")
        with pytest.raises(TimeoutError):
            sock.recv(10)
    toxiproxy.remove_toxic("echo", "timeout_downstream")
    assert _echo(proxy, b"through") == b"through"


def test_a_bad_toxic_is_refused_with_what_to_use(toxiproxy: Toxiproxy) -> None:
    with pytest.raises(ConfigError, match="unknown toxic 'lag'"):
        toxiproxy.add_toxic("echo", "lag")
    with pytest.raises(ConfigError, match="takes \\['jitter', 'latency'\\]"):
        toxiproxy.add_toxic("echo", "latency", delay=5)
    with pytest.raises(ConfigError, match="stream must be"):
        toxiproxy.add_toxic("echo", "latency", stream="both")


def test_the_server_stops_with_its_owner(toxiproxy: Toxiproxy) -> None:
    """stop() ends a server: its API no longer answers (the session's, asked for, makes
    the test skip where there is no binary)."""
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(Toxiproxy())
        assert server.proxies() == {}
    with pytest.raises(ConnectionRefusedError):
        server.proxies()
