"""The embedded Apache Kafka's configuration, without starting it."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from decaton_aio.embedded import _apache_kafka
from decaton_aio.embedded._broker import _die_with_parent
from decaton_aio.embedded._spawn import popen_for_life


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
                preexec_fn=_die_with_parent(signal.SIGKILL),
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
