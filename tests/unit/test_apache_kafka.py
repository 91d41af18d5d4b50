"""The embedded Apache Kafka's configuration, without starting it."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from decaton_aio.embedded import _apache_kafka


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
