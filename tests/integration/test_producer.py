"""The task producer against a real broker: where tasks land and what they carry."""

from __future__ import annotations

import asyncio
import logging
import re

import msgspec
import pytest
import structlog.testing

from decaton_aio import (
    METADATA_HEADER,
    JsonSerializer,
    ProducerConfig,
    ProducerError,
    TaskProducer,
)
from decaton_aio.producer import _client as producer_client
from decaton_aio.testing import BrokerHandle, read_records, recent_timestamp_ms
from tests.unit.protobuf_helpers import task_metadata_proto_class

# A fixed record time inside the broker's time retention.
RECORD_MS = recent_timestamp_ms()

pytestmark = pytest.mark.integration


class Order(msgspec.Struct):
    order_id: int
    item: str


async def test_put_returns_location_and_writes_dt_meta(topic_factory, task_producer) -> None:
    """A put lands where it says, with a dt_meta header the protobuf library reads."""
    topic = await topic_factory(partitions=1)
    producer = await task_producer(topic, JsonSerializer(Order), application_id="orders-app")
    where = await producer.put("k1", Order(1, "book"), timestamp_ms=RECORD_MS + 123)
    assert (where.topic, where.partition, where.offset) == (topic, 0, 0)

    (record,) = await read_records(producer.config.bootstrap_servers, topic, 1)
    assert record.key == b"k1"
    assert msgspec.json.decode(record.value, type=Order) == Order(1, "book")
    assert record.timestamp == RECORD_MS + 123
    headers = dict(record.headers)
    proto = task_metadata_proto_class()()
    proto.ParseFromString(headers[METADATA_HEADER])
    assert proto.timestamp_millis == RECORD_MS + 123
    assert proto.source_application_id == "orders-app"
    assert proto.source_instance_id == producer.config.instance_id
    assert proto.retry_count == 0
    assert proto.scheduled_time_millis == 0


async def test_scheduled_time_travels_in_metadata(topic_factory, task_producer) -> None:
    """scheduled_time_ms is written to the metadata, not to the body."""
    topic = await topic_factory(partitions=1)
    producer = await task_producer(topic)
    await producer.put(b"k", b"body", scheduled_time_ms=1_900_000_000_000)
    (record,) = await read_records(producer.config.bootstrap_servers, topic, 1)
    proto = task_metadata_proto_class()()
    proto.ParseFromString(dict(record.headers)[METADATA_HEADER])
    assert proto.scheduled_time_millis == 1_900_000_000_000
    assert record.value == b"body"


async def test_many_puts_in_flight_keep_key_order(topic_factory, task_producer) -> None:
    """Thousands of concurrent puts all land; per key, offsets follow put order."""
    topic = await topic_factory(partitions=3)
    producer = await task_producer(topic, JsonSerializer(Order))
    futures = [await producer.submit(f"key-{i % 20}", Order(i, "x")) for i in range(3000)]
    locations = await asyncio.gather(*futures)
    assert len({(w.partition, w.offset) for w in locations}) == 3000

    records = await read_records(producer.config.bootstrap_servers, topic, 3000)
    seen: dict[bytes, int] = {}
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        order_id = msgspec.json.decode(record.value, type=Order).order_id
        assert record.key is not None
        assert order_id > seen.get(record.key, -1)
        seen[record.key] = order_id
    assert len(seen) == 20


async def test_str_and_bytes_keys_are_the_same_key(topic_factory, task_producer) -> None:
    """A str key is its UTF-8 bytes: both land in the same partition."""
    topic = await topic_factory(partitions=3)
    producer = await task_producer(topic)
    a = await producer.put("사용자-7", b"1")
    b = await producer.put("사용자-7".encode(), b"2")
    assert a.partition == b.partition
    assert b.offset == a.offset + 1


async def test_explicit_partition_and_flush(topic_factory, task_producer) -> None:
    """An explicit partition wins over the key; flush waits for what was submitted."""
    topic = await topic_factory(partitions=3)
    producer = await task_producer(topic)
    futures = [await producer.submit("same", b"x", partition=2) for _ in range(10)]
    await producer.flush()
    assert all(f.done() for f in futures)
    assert {f.result().partition for f in futures} == {2}


async def test_put_before_start_is_a_clear_error(kafka_broker: BrokerHandle) -> None:
    """Using a producer that was not started says how to start it."""
    producer = TaskProducer(
        ProducerConfig(kafka_broker.bootstrap_servers), "t", JsonSerializer(Order)
    )
    with pytest.raises(ProducerError, match="not started"):
        await producer.put("k", Order(1, "x"))


async def test_idempotence_auto_takes_what_the_cluster_grants(
    kafka_broker: BrokerHandle,
    topic_factory,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With the default "auto" the producer is idempotent where the cluster grants it;
    where it does not (Tansu), two producers go on without it, logged once, at debug
    level: the broker does not support it, and nothing the user can do changes that
    (aiokafka's own error line for the refusal is not shown either)."""
    monkeypatch.setattr(producer_client, "_WARNED_NO_IDEMPOTENCE", set())
    topic = await topic_factory(partitions=1)
    config = ProducerConfig(kafka_broker.bootstrap_servers)
    granted = []
    with structlog.testing.capture_logs() as logs, caplog.at_level(logging.WARNING, "aiokafka"):
        for n in range(2):
            async with TaskProducer(config, topic, JsonSerializer(Order)) as producer:
                await producer.put("k", Order(n, "x"))
                assert producer.sender is not None
                granted.append(producer.sender.idempotent)
    warnings = [e for e in logs if "refused an idempotent producer" in e["event"]]
    assert len(await read_records(kafka_broker.bootstrap_servers, topic, 2)) == 2
    if kafka_broker.supports_idempotence:
        assert (granted, warnings) == ([True, True], [])
    else:
        assert granted == [False, False]
        assert [w["log_level"] for w in warnings] == ["debug"]
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


async def test_idempotence_required_fails_where_refused(
    kafka_broker: BrokerHandle, topic_factory
) -> None:
    """idempotence=True is an idempotent producer, or a start failure naming the fix."""
    topic = await topic_factory(partitions=1)
    config = ProducerConfig(kafka_broker.bootstrap_servers, idempotence=True)
    producer = TaskProducer(config, topic, JsonSerializer(Order))
    if kafka_broker.supports_idempotence:
        async with producer:
            await producer.put("k", Order(1, "x"))
            assert producer.sender is not None
            assert producer.sender.idempotent
    else:
        with pytest.raises(ProducerError, match=r"idempotence='auto'.*idempotence=False"):
            await producer.start()


async def test_unreachable_cluster_is_a_producer_error() -> None:
    """A cluster nobody listens on is reported, not hung on forever."""
    config = ProducerConfig("127.0.0.1:1", idempotence=False, request_timeout_ms=2000)
    with pytest.raises(ProducerError, match=re.escape("127.0.0.1:1")):
        await TaskProducer(config, "t", JsonSerializer(Order)).start()
