"""Apache Kafka for the embedded broker: its jars, its configuration, its processes.

The broker is the real one, resolved from Maven Central by Maven through the pom shipped
in ``decaton_aio/embedded/kafka-jvm`` and cached per version in the user's cache directory
(``$XDG_CACHE_HOME`` or ``~/.cache``, then ``decaton-aio/kafka-<version>``). Each node runs
in KRaft combined mode (broker and controller in one JVM) on free loopback ports, with
storage formatted in a fresh temporary directory (removed at stop; one whose owning
process died without stopping it, killed outright, is removed by the next start). Group
timings are short so tests stay fast: consumer-protocol groups heartbeat every 500 ms and
lose a silent member after 6 s (Apache Kafka's defaults:
``group.consumer.heartbeat.interval.ms=5000``, ``group.consumer.session.timeout.ms=45000``;
a group may set its own with ``kafka-configs --entity-type groups``), classic groups accept
session timeouts from 1 s.
`KafkaCluster` starts one node or three, waits until every broker answers a Metadata
request listing them all, and stops them by PID; `decaton_aio.embedded` is the public
face.

Caller: [`EmbeddedBroker`][decaton_aio.EmbeddedBroker], from one thread.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from decaton_aio.embedded._maven import cache_root, find_java, maven_into_cache
from decaton_aio.embedded._spawn import popen_for_life
from decaton_aio.errors import BrokerError

__all__ = [
    "KAFKA_VERSION",
    "KafkaCluster",
    "java_executable",
    "kafka_cache_dir",
    "resolve_kafka_classpath",
]

#: The Apache Kafka release the embedded broker runs.
KAFKA_VERSION = "4.1.1"

_PACKAGE_DIR = Path(__file__).parent / "kafka-jvm"
_POM = _PACKAGE_DIR / "pom.xml"
_LOG_CONFIG = _PACKAGE_DIR / "log4j2.properties"
_HEAP = "-Xmx512m"
_STOP_GRACE_S = 10.0
_TANSU_HINT = "or use the Java-free Tansu broker (--flavor tansu, DECATON_AIO_BROKER=tansu)"


def kafka_cache_dir(version: str = KAFKA_VERSION) -> Path:
    """Where the jars of ``version`` are cached."""
    return cache_root() / f"kafka-{version}"


def java_executable() -> str:
    """The ``java`` to run Kafka with: ``$JAVA_HOME/bin/java``, else ``java`` on ``PATH``.

    Raises:
        BrokerError: when there is none; the message says what to install.
    """
    found = find_java()
    if found is None:
        raise BrokerError(
            "the embedded Apache Kafka needs Java 17 or newer: install a JRE (Debian: apt-get "
            "install openjdk-17-jre-headless; or run 'make install') and set JAVA_HOME, "
            + _TANSU_HINT
        )
    return found


def resolve_kafka_classpath(version: str = KAFKA_VERSION) -> str:
    """The classpath of the Kafka broker and tools, resolved with Maven on first use.

    The jars are copied into `kafka_cache_dir()` by ``mvn dependency:copy-dependencies``
    (see `maven_into_cache()`: never half a cache).

    Returns:
        A ``java -cp`` argument (``<cache>/lib/*``).

    Raises:
        BrokerError: when Maven is missing or cannot resolve the artifacts.
    """

    def arguments(staging: Path) -> list[str]:
        return [
            "--file",
            str(_POM),
            "dependency:copy-dependencies",
            f"-Dkafka.version={version}",
            f"-DoutputDirectory={staging / 'lib'}",
        ]

    def error(message: str) -> BrokerError:
        return BrokerError(f"{message}\n(the embedded Apache Kafka {version}; {_TANSU_HINT})")

    cache = maven_into_cache(
        kafka_cache_dir(version), arguments, what=f"Apache Kafka {version}", error=error
    )
    return str(cache / "lib" / "*")


def _cluster_id() -> str:
    # Base64url of a random UUID, as Kafka's own; never starting with "-", which the
    # storage tool's command line would take for an option (one start in 64 otherwise).
    while True:
        found = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not found.startswith("-"):
            return found


@dataclass
class _Node:
    """One KRaft node (broker and controller in one JVM)."""

    node_id: int
    port: int
    controller_port: int
    config: Path
    log_path: Path
    probe_port: int
    process: subprocess.Popen[bytes] | None = None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass
class KafkaCluster:
    """The processes of an embedded Apache Kafka: one node, or three.

    Args:
        host: the loopback address every listener binds to.
        ports: one client port per node.
        controller_ports: one controller port per node.
        log_path: the broker log; with several nodes, node ``n`` logs to ``<stem>-n<suffix>``.
        settings: extra or overriding ``server.properties`` entries for every node.
        preexec: runs in each child before ``exec`` (dies with its parent).
        format_args: extra arguments of the storage format (``--add-scram ...``).
        probe_ports: the plain listener each node's readiness is probed on, when the
            client ports are secured.
        proxied: per node, ``(port, advertised port)`` of a second plain listener,
            ``PROXIED``, which advertises the port of a proxy in front of it: a client
            that bootstraps through the proxies reaches every node through them.
    """

    host: str
    ports: list[int]
    controller_ports: list[int]
    log_path: Path
    settings: dict[str, str] = field(default_factory=dict)
    preexec: Callable[[], None] | None = None
    format_args: list[str] = field(default_factory=list)
    probe_ports: list[int] = field(default_factory=list)
    proxied: list[tuple[int, int]] = field(default_factory=list)
    nodes: list[_Node] = field(default_factory=list)
    workdir: Path | None = None

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"{self.host}:{port}" for port in self.ports)

    def start(self, timeout_s: float, probe: Callable[[str, int, int], bool]) -> None:
        """Format storage, start every node and wait until each lists all brokers.

        Raises:
            BrokerError: a node exits early or the cluster is not ready in time.
        """
        java = java_executable()
        classpath = resolve_kafka_classpath()
        remove_abandoned(Path(tempfile.gettempdir()))
        self.workdir = Path(tempfile.mkdtemp(prefix=_WORKDIR_PREFIX))
        (self.workdir / _OWNER_FILE).write_text(str(os.getpid()))
        cluster_id = _cluster_id()
        count = len(self.ports)
        voters = ",".join(
            f"{i + 1}@{self.host}:{port}" for i, port in enumerate(self.controller_ports)
        )
        for i, (port, controller) in enumerate(zip(self.ports, self.controller_ports, strict=True)):
            node_id = i + 1
            config = self.workdir / f"server-{node_id}.properties"
            properties = _server_properties(
                node_id,
                self.host,
                port,
                controller,
                voters,
                self.workdir / f"data-{node_id}",
                count,
            )
            if self.proxied:
                properties.update(_proxied_listener(properties, self.host, *self.proxied[i]))
            properties.update(self.settings)
            config.write_text("".join(f"{k}={v}\n" for k, v in properties.items()))
            log = self.log_path if count == 1 else _node_log(self.log_path, node_id)
            probe_port = self.probe_ports[i] if self.probe_ports else port
            self.nodes.append(_Node(node_id, port, controller, config, log, probe_port))
            self._format(java, classpath, cluster_id, config)
        for node in self.nodes:
            self._spawn(java, classpath, node)
        self.wait_ready(timeout_s, probe)

    def _format(self, java: str, classpath: str, cluster_id: str, config: Path) -> None:
        extra = []
        if self.format_args:
            # In a file of the private work directory, which the storage tool reads (an
            # argument a line, "@file"): salted SCRAM passwords log a user in, and a
            # command line is public (ps).
            argfile = config.with_suffix(".format-args")
            argfile.touch(mode=0o600)
            argfile.write_text("".join(f"{arg}\n" for arg in self.format_args))
            extra = [f"@{argfile}"]
        result = subprocess.run(
            [java, "-cp", classpath, f"-Dlog4j2.configurationFile={_LOG_CONFIG}",
             "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(config),
             *extra],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=False,
        )  # fmt: skip
        if result.returncode != 0:
            raise BrokerError(
                f"formatting Kafka storage failed (exit {result.returncode}):\n"
                + (result.stdout + result.stderr)[-2000:]
            )

    def _spawn(self, java: str, classpath: str, node: _Node) -> None:
        with open(node.log_path, "ab") as log:
            log.write(
                f"decaton-aio: starting Apache Kafka {KAFKA_VERSION} node {node.node_id} on "
                f"{self.host}:{node.port} (controller port {node.controller_port}), "
                f"config {node.config}\n".encode()
            )
            log.flush()
            node.process = popen_for_life(
                [java, _HEAP, "-XX:+UseG1GC", "-Djava.awt.headless=true",
                 f"-Dlog4j2.configurationFile={_LOG_CONFIG}", "-cp", classpath,
                 "kafka.Kafka", str(node.config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=self.preexec,
            )  # fmt: skip

    def wait_ready(self, timeout_s: float, probe: Callable[[str, int, int], bool]) -> None:
        """Wait until every live node answers a Metadata request listing the live brokers."""
        deadline = time.monotonic() + timeout_s
        live = [n for n in self.nodes if n.process is not None]
        while time.monotonic() < deadline:
            for node in live:
                if not node.alive():
                    assert node.process is not None
                    raise BrokerError(
                        f"Kafka node {node.node_id} exited with code {node.process.returncode} "
                        f"at start; log {node.log_path}:\n" + tail(node.log_path, 20)
                    )
            if all(probe(self.host, node.probe_port, len(live)) for node in live):
                return
            time.sleep(0.05)
        raise BrokerError(
            f"Apache Kafka did not become ready on {self.bootstrap_servers} within "
            f"{timeout_s}s; log {self.nodes[0].log_path}:\n" + tail(self.nodes[0].log_path, 20)
        )

    def node(self, node_id: int) -> _Node:
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise BrokerError(f"no node {node_id}: nodes are 1..{len(self.nodes)}")

    def kill_node(self, node_id: int) -> None:
        """SIGKILL one node; its data stays for `restart_node()`."""
        node = self.node(node_id)
        if node.process is not None and node.alive():
            node.process.send_signal(signal.SIGKILL)
            node.process.wait()
        node.process = None

    def restart_node(
        self, node_id: int, timeout_s: float, probe: Callable[[str, int, int], bool]
    ) -> None:
        """Start a stopped node again on its ports and data, and wait for the cluster."""
        node = self.node(node_id)
        if node.alive():
            raise BrokerError(f"node {node_id} is running: kill it first")
        self._spawn(java_executable(), resolve_kafka_classpath(), node)
        self.wait_ready(timeout_s, probe)

    def stop(self) -> None:
        """SIGTERM every node, SIGKILL what is left after a grace period, remove the data."""
        running = [n.process for n in self.nodes if n.process is not None and n.alive()]
        try:
            for process in running:
                process.terminate()
            deadline = time.monotonic() + _STOP_GRACE_S
            for process in running:
                try:
                    process.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        finally:  # a second Ctrl-C during the wait: the nodes are killed, the data removed
            for process in running:
                if process.poll() is None:
                    process.kill()
            for node in self.nodes:
                node.process = None
            if self.workdir is not None:
                shutil.rmtree(self.workdir, ignore_errors=True)
                self.workdir = None

    def pids(self) -> list[int]:
        return [n.process.pid for n in self.nodes if n.process is not None and n.alive()]


_WORKDIR_PREFIX = "decaton-aio-kafka-"
_OWNER_FILE = "owner.pid"


def remove_abandoned(tmp: Path) -> list[Path]:
    """Remove the work directories under ``tmp`` whose owning process is gone (a process
    killed outright cannot remove its own, and its nodes die with it); return them. A
    directory with no owner file, or one naming a live process, is left alone."""
    removed = []
    for workdir in tmp.glob(f"{_WORKDIR_PREFIX}*"):
        try:
            pid = int((workdir / _OWNER_FILE).read_text())
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(workdir, ignore_errors=True)
            removed.append(workdir)
        except (OSError, ValueError):  # no owner file, not ours to judge, or a live owner
            continue
    return removed


def _server_properties(
    node_id: int, host: str, port: int, controller: int, voters: str, data: Path, count: int
) -> dict[str, str]:
    replicas = str(min(3, count))
    min_isr = "2" if count >= 3 else "1"
    return {
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        "controller.quorum.voters": voters,
        "listeners": f"PLAINTEXT://{host}:{port},CONTROLLER://{host}:{controller}",
        "advertised.listeners": f"PLAINTEXT://{host}:{port}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": str(data),
        "num.partitions": "1",
        "default.replication.factor": replicas,
        "min.insync.replicas": min_isr,
        "auto.create.topics.enable": "true" if count == 1 else "false",
        # Internal topics: as replicated as the cluster allows, few partitions (a quick
        # start; a test cluster has few groups and transactional producers).
        "offsets.topic.replication.factor": replicas,
        "offsets.topic.num.partitions": "10",
        "transaction.state.log.replication.factor": replicas,
        "transaction.state.log.min.isr": min_isr,
        "transaction.state.log.num.partitions": "5",
        "share.coordinator.state.topic.replication.factor": replicas,
        "share.coordinator.state.topic.min.isr": min_isr,
        # A new group starts at once instead of waiting for more members to join, and
        # short session timeouts (a quick failover in tests) are accepted.
        "group.initial.rebalance.delay.ms": "0",
        "group.min.session.timeout.ms": "1000",
        # Consumer-protocol groups: a heartbeat every 500 ms and a member given up after
        # 6 s without one (production defaults: 5 s and 45 s, each also the minimum a group
        # may set); the minimums let a test's group go lower still.
        "group.consumer.heartbeat.interval.ms": "500",
        "group.consumer.min.heartbeat.interval.ms": "100",
        "group.consumer.session.timeout.ms": "6000",
        "group.consumer.min.session.timeout.ms": "1000",
        # A killed node loses its leaderships after 3 s, not 9: failover tests stay short.
        "broker.session.timeout.ms": "3000",
        "broker.heartbeat.interval.ms": "500",
        # Deleted topics and their files go at once: tests create and delete many.
        "log.segment.delete.delay.ms": "0",
        "file.delete.delay.ms": "0",
        # Each node of a cluster is a rack (zone) of its own: a client's rack names one
        # node, and replicas are spread as they are across zones.
        **({"broker.rack": f"rack-{node_id}"} if count > 1 else {}),
    }


def _proxied_listener(
    properties: dict[str, str], host: str, port: int, advertised: int
) -> dict[str, str]:
    # Brokers keep talking to each other on PLAINTEXT: a fault between a client and a
    # node's proxy leaves replication alone.
    return {
        "listeners": f"{properties['listeners']},PROXIED://{host}:{port}",
        "advertised.listeners": (
            f"{properties['advertised.listeners']},PROXIED://{host}:{advertised}"
        ),
        "listener.security.protocol.map": (
            f"{properties['listener.security.protocol.map']},PROXIED:PLAINTEXT"
        ),
    }


def _node_log(log_path: Path, node_id: int) -> Path:
    return log_path.with_name(f"{log_path.stem}-n{node_id}{log_path.suffix}")


def tail(path: Path, max_lines: int) -> str:
    """The last lines of a log file ("" when it does not exist)."""
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-max_lines:])
