"""Side topics on a real cluster: how they are created, what a subscription does when they
cannot be, and the timestamps of the records written to them."""

from __future__ import annotations

import time
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from decaton_aio import Application, ConfigError, ProcessingContext
from decaton_aio.admin import ensure_side_topics
from decaton_aio.backoff import RetryPolicy
from decaton_aio.metadata import METADATA_HEADER, decode_metadata
from decaton_aio.retry import RetryConfig, SideTopics
from decaton_aio.testing import BrokerHandle, read_records, wait_until

pytestmark = pytest.mark.integration

FAST = RetryPolicy(max_attempts=2, backoff_base_ms=50, backoff_max_ms=50, jitter=0)


async def _noop(ctx: ProcessingContext, task: bytes) -> None:
    return None


async def _describe(servers: str, topics: list[str]) -> dict[str, tuple[int, int, dict[str, str]]]:
    """Partitions, replication factor and settings of each topic."""
    admin = AIOKafkaAdminClient(bootstrap_servers=servers)
    await admin.start()
    try:
        described = {d["topic"]: d for d in await admin.describe_topics(topics)}
        resources = [ConfigResource(ConfigResourceType.TOPIC, t) for t in topics]
        configs: dict[str, dict[str, str]] = {}
        for response in await admin.describe_configs(resources):
            for _code, _msg, _type, name, entries, *_ in response.resources:
                configs[name] = {e[0]: e[1] for e in entries}
    finally:
        await admin.close()
    return {
        t: (
            len(described[t]["partitions"]),
            len(described[t]["partitions"][0]["replicas"]),
            configs.get(t, {}),
        )
        for t in topics
    }


async def test_side_topics_copy_the_task_topic(
    kafka_broker: BrokerHandle, topic_factory: Any
) -> None:
    """Retry and dead letter topics get the task topic's partition count, retention and
    record size limit, and as many replicas as the cluster can give, up to 3."""
    topic = await topic_factory(
        partitions=3, configs={"retention.ms": "3600000", "max.message.bytes": "2000000"}
    )
    app = Application(_noop, topics=(topic,), retry=RetryConfig(FAST))
    created = await ensure_side_topics(kafka_broker.bootstrap_servers, app)
    assert created == sorted([f"{topic}-dlq", f"{topic}-retry"])
    shapes = await _describe(kafka_broker.bootstrap_servers, created)
    brokers = len(kafka_broker.bootstrap_servers.split(","))
    for name in created:
        partitions, replicas, configs = shapes[name]
        assert (partitions, replicas) == (3, min(3, brokers)), name
        if kafka_broker.flavor != "tansu":  # Tansu stores settings but echoes defaults
            assert configs["retention.ms"] == "3600000", name
            assert configs["max.message.bytes"] == "2000000", name
    # A second instance finds them and creates nothing.
    assert await ensure_side_topics(kafka_broker.bootstrap_servers, app) == []


async def test_a_side_topic_that_cannot_be_created_stops_the_start(
    kafka_broker: BrokerHandle, topic_factory: Any
) -> None:
    """Asking for more replicas than there are brokers: the subscription refuses to start
    with an error naming the side topic and the command that creates it."""
    if kafka_broker.flavor == "tansu":
        pytest.skip("Tansu accepts any replication factor")
    topic = await topic_factory(partitions=1)
    brokers = len(kafka_broker.bootstrap_servers.split(","))
    app = Application(
        _noop, topics=(topic,), side_topics=SideTopics(replication_factor=brokers + 1)
    )
    with pytest.raises(ConfigError) as caught:
        async with kafka_broker.subscription(app):
            pass
    message = str(caught.value)
    assert f"{topic}-dlq: InvalidReplicationFactorError" in message
    assert f"kafka-topics.sh --create --topic {topic}-dlq --partitions 1" in message


async def test_a_missing_task_topic_stops_the_start(kafka_broker: BrokerHandle) -> None:
    """Side topics copy their task topic, so it must exist first; the error says so."""
    app = Application(_noop, topics=(f"absent-{time.time_ns()}",))
    with pytest.raises(ConfigError, match="does not exist: create it before starting"):
        await ensure_side_topics(kafka_broker.bootstrap_servers, app)


async def test_retry_and_dead_letter_records_are_stamped_when_sent(
    kafka_broker: BrokerHandle, topic_factory: Any, task_producer: Any
) -> None:
    """A task produced an hour ago fails: its retry and dead letter records carry the
    time they were sent, and the hour-old time stays in their dt_meta."""
    topic = await topic_factory(partitions=1)
    producer = await task_producer(topic)
    produced_ms = int(time.time() * 1000) - 3_600_000
    await producer.put(b"k", b"always fails", timestamp_ms=produced_ms)
    attempts = 0

    async def fail(ctx: ProcessingContext, task: bytes) -> None:
        nonlocal attempts
        attempts += 1
        raise ConnectionError("down")

    app = Application(fail, topics=(topic,), retry=RetryConfig(FAST))
    before_ms = int(time.time() * 1000)
    async with kafka_broker.subscription(app):
        await wait_until(lambda: attempts == 2, what="two attempts")
        (retried,) = await read_records(kafka_broker.bootstrap_servers, f"{topic}-retry", 1)
        (dead,) = await read_records(kafka_broker.bootstrap_servers, f"{topic}-dlq", 1)
    after_ms = int(time.time() * 1000)
    for record in (retried, dead):
        assert before_ms - 1000 <= record.timestamp <= after_ms + 1000
        meta = decode_metadata(dict(record.headers)[METADATA_HEADER])
        assert meta.timestamp_ms == produced_ms


async def test_a_dead_letter_without_dt_meta_keeps_the_task_time(
    kafka_broker: BrokerHandle, topic_factory: Any, task_producer: Any
) -> None:
    """A plain record (no dt_meta) that fails for good: the dead letter record gets a
    dt_meta holding the original record's timestamp."""
    topic = await topic_factory(partitions=1)
    producer = await task_producer(topic)
    produced_ms = int(time.time() * 1000) - 60_000
    assert producer.sender is not None
    await producer.sender.send(topic, b"plain", key=b"k", headers=[], timestamp_ms=produced_ms)

    async def fail(ctx: ProcessingContext, task: bytes) -> None:
        raise ValueError("bad task")

    app = Application(fail, topics=(topic,), retry=RetryConfig(RetryPolicy(max_attempts=1)))
    async with kafka_broker.subscription(app):
        (dead,) = await read_records(kafka_broker.bootstrap_servers, f"{topic}-dlq", 1)
    headers = dict(dead.headers)
    assert decode_metadata(headers[METADATA_HEADER]).timestamp_ms == produced_ms
    assert dead.timestamp > produced_ms + 30_000
