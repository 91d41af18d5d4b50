"""Runtime properties from a Kafka topic: every instance sees a change."""

from __future__ import annotations

from typing import Any

import pytest

from decaton_aio.properties import (
    PARTITION_CONCURRENCY,
    KafkaPropertySource,
    Properties,
    encode_record,
)
from decaton_aio.testing import BrokerHandle, wait_until

pytestmark = pytest.mark.integration


async def test_property_topic_backlog_and_live_changes(
    kafka_broker: BrokerHandle, topic_factory: Any, task_producer: Any
) -> None:
    """The backlog sets the start values (latest per name wins); a record produced while
    running changes the live property in every listening instance; a bad value is
    rejected and the old one kept."""
    topic = await topic_factory(partitions=2)
    producer = await task_producer(topic)
    client = producer.sender
    for value in (8, 16):
        key, body = encode_record("decaton.partition.concurrency", value)
        await client.send(topic, body, key=key)

    loaded = await KafkaPropertySource(kafka_broker.bootstrap_servers, topic).load()
    assert loaded == {"decaton.partition.concurrency": 16}

    instances = [Properties(loaded), Properties(loaded)]
    sources = [KafkaPropertySource(kafka_broker.bootstrap_servers, topic) for _ in instances]
    for source, props in zip(sources, instances, strict=True):
        await source.start(props)
    try:
        key, body = encode_record("decaton.partition.concurrency", 64)
        await client.send(topic, body, key=key)
        await wait_until(
            lambda: all(p[PARTITION_CONCURRENCY].value == 64 for p in instances),
            timeout_s=20,
            what="both instances to see concurrency 64",
        )
        key, body = encode_record("decaton.partition.concurrency", -5)
        await client.send(topic, body, key=key)
        key, body = encode_record("decaton.max.pending.records", 500)
        await client.send(topic, body, key=key)
        await wait_until(
            lambda: all(p["decaton.max.pending.records"].value == 500 for p in instances),
            timeout_s=20,
            what="the next change",
        )
        assert all(p[PARTITION_CONCURRENCY].value == 64 for p in instances)
    finally:
        for source in sources:
            await source.stop()
