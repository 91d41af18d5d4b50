"""The embedded Apache Kafka's configuration, without starting it."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from decaton_aio.embedded import EmbeddedBroker, _apache_kafka
from decaton_aio.embedded._spawn import die_with_parent, popen_for_life


def test_cluster_id_never_starts_with_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    """An id starting with "-" would read as an option to the storage tool: drawn again."""
    draws = iter([uuid.UUID(bytes=b"\xf8" + b"\x00" * 15), uuid.UUID(bytes=b"\x04" * 16)])
    monkeypatch.setattr(_apache_kafka.uuid, "uuid4", lambda: next(draws))
    assert _apache_kafka._cluster_id() == "BAQEBAQEBAQEBAQEBAQEBA"


@pytest.mark.parametrize(
    ("nodes", "replicas", "min_isr", "auto_create"), [(1, "1", "1", "true"), (3, "3", "2", "false")]
)
def test_server_settings_fit_the_cluster_size(
    nodes: int, replicas: str, min_isr: str, auto_create: str
) -> None:
    props = _apache_kafka._server_properties(
        1, "127.0.0.1", 9092, 9093, "1@127.0.0.1:9093", Path("/tmp/d"), nodes
    )
    assert props["default.replication.factor"] == replicas
    assert props["offsets.topic.replication.factor"] == replicas
    assert props["min.insync.replicas"] == min_isr
    assert props["auto.create.topics.enable"] == auto_create
    assert props["group.initial.rebalance.delay.ms"] == "0"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:9092"


def test_a_process_started_from_a_short_lived_thread_outlives_it() -> None:
    """The parent-death signal a broker is started with fires when the thread that forked
    it ends: a broker started from a thread (asyncio.to_thread) died with that thread.
    Forked by a thread that lives as long as the process, it keeps running."""
    started: list[subprocess.Popen[bytes]] = []
    worker = threading.Thread(
        target=lambda: started.append(
            popen_for_life(
                [sys.executable, "-c", "import time; time.sleep(60)"],
                preexec_fn=die_with_parent(signal.SIGKILL),
            )
        )
    )
    worker.start()
    worker.join()
    (process,) = started
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            process.wait(timeout=1.0)  # alive after its starting thread ended
    finally:
        process.kill()
        process.wait()


def test_a_stop_interrupted_while_waiting_still_removes_the_secrets(tmp_path: Path) -> None:
    """A second Ctrl-C while the nodes stop (KeyboardInterrupt out of the wait) still
    removes the secured broker's directory (its keys, a client.properties with the
    password): the stop had forgotten it, and nothing removed it later."""

    class Interrupted:
        def stop(self) -> None:
            raise KeyboardInterrupt

    secrets = tmp_path / "decaton-aio-tls-x"
    secrets.mkdir()
    (secrets / "client.properties").write_text('sasl.jaas.config=... password="pw";\n')
    broker = EmbeddedBroker(flavor="apache")
    broker._cluster = Interrupted()  # type: ignore[assignment]
    broker._secured = type("Secured", (), {"directory": secrets})()  # type: ignore[assignment]
    with pytest.raises(KeyboardInterrupt):
        broker.stop()
    assert not secrets.exists()
