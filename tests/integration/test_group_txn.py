"""Transactional offset commits with the group's metadata (``TxnOffsetCommit`` v3) and
stable offset reads (``OffsetFetch`` v7), against Apache Kafka: the coordinator takes a
member's offsets in its generation, refuses a member whose generation is over (its
transaction aborts), and a stable read waits for an open transaction's offsets."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import CommitFailedError
from aiokafka.structs import OffsetAndMetadata

from decaton_aio.consumer.commit._group_txn import (
    GroupMetadata,
    group_metadata,
    read_stable_offsets,
    send_group_metadata,
)
from decaton_aio.testing import BrokerHandle, wait_until
from tests.integration.test_exactly_once import needs_transactions, read_all

pytestmark = pytest.mark.integration


async def member(broker: BrokerHandle, topic: str, group: str) -> AIOKafkaConsumer:
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=broker.bootstrap_servers,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    await wait_until(lambda: bool(consumer.assignment()), timeout_s=30, what="an assignment")
    return consumer


async def transactional(broker: BrokerHandle, member: Any) -> AIOKafkaProducer:
    producer = AIOKafkaProducer(
        bootstrap_servers=broker.bootstrap_servers,
        transactional_id=f"group-txn-{uuid.uuid4().hex[:8]}",
        enable_idempotence=True,
    )
    send_group_metadata(producer, member)
    await producer.start()
    return producer


async def committed(broker: BrokerHandle, group: str, tp: TopicPartition) -> OffsetAndMetadata:
    admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
    await admin.start()
    try:
        return (await read_stable_offsets(admin, group, [tp], timeout_s=10))[tp]
    finally:
        await admin.close()


async def test_offsets_commit_with_the_members_generation(
    kafka_broker: BrokerHandle, topic_factory: Any
) -> None:
    needs_transactions(kafka_broker)
    topic = await topic_factory(partitions=1)
    out = await topic_factory(partitions=1)
    group = f"gt-{uuid.uuid4().hex[:8]}"
    tp = TopicPartition(topic, 0)
    consumer = await member(kafka_broker, topic, group)
    producer = await transactional(kafka_broker, lambda: group_metadata(consumer))
    try:
        assert group_metadata(consumer).joined
        await producer.begin_transaction()
        await producer.send_and_wait(out, b"kept")
        await producer.send_offsets_to_transaction({tp: OffsetAndMetadata(7, "meta")}, group)
        await producer.commit_transaction()
    finally:
        await producer.stop()
        await consumer.stop()
    assert await committed(kafka_broker, group, tp) == OffsetAndMetadata(7, "meta")
    assert [r.value for r in await read_all(kafka_broker.bootstrap_servers, out)] == [b"kept"]


@pytest.mark.parametrize("stale", ["generation", "member", "not-joined"])
async def test_a_member_whose_generation_is_over_cannot_commit(
    stale: str, kafka_broker: BrokerHandle, topic_factory: Any
) -> None:
    """The coordinator (or, not joined, the client) refuses the offsets; the transaction
    aborts and neither its output nor its offsets are ever visible."""
    needs_transactions(kafka_broker)
    topic = await topic_factory(partitions=1)
    out = await topic_factory(partitions=1)
    group = f"gt-{uuid.uuid4().hex[:8]}"
    tp = TopicPartition(topic, 0)
    consumer = await member(kafka_broker, topic, group)
    now = group_metadata(consumer)
    zombie = {
        "generation": GroupMetadata(now.generation_id - 1, now.member_id),
        "member": GroupMetadata(now.generation_id, "gone-member"),
        "not-joined": GroupMetadata(-1, ""),
    }[stale]
    producer = await transactional(kafka_broker, lambda: zombie)
    try:
        await producer.begin_transaction()
        await producer.send_and_wait(out, b"zombie")
        with pytest.raises(CommitFailedError):
            await producer.send_offsets_to_transaction({tp: OffsetAndMetadata(9, "")}, group)
        await producer.abort_transaction()
    finally:
        await producer.stop()
        await consumer.stop()
    assert (await committed(kafka_broker, group, tp)).offset == -1
    assert await read_all(kafka_broker.bootstrap_servers, out) == []


async def test_a_stable_read_waits_for_the_open_transactions_offsets(
    kafka_broker: BrokerHandle, topic_factory: Any
) -> None:
    needs_transactions(kafka_broker)
    topic = await topic_factory(partitions=1)
    group = f"gt-{uuid.uuid4().hex[:8]}"
    tp = TopicPartition(topic, 0)
    consumer = await member(kafka_broker, topic, group)
    producer = await transactional(kafka_broker, lambda: group_metadata(consumer))
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap_servers)
    await admin.start()
    try:
        await producer.begin_transaction()
        await producer.send_offsets_to_transaction({tp: OffsetAndMetadata(3, "")}, group)
        reading = asyncio.ensure_future(read_stable_offsets(admin, group, [tp], timeout_s=30))
        # Pending while the transaction is open (the read keeps asking).
        done, _ = await asyncio.wait([reading], timeout=1.0)
        assert not done
        await producer.commit_transaction()
        assert (await reading)[tp].offset == 3
        await producer.begin_transaction()
        await producer.send_offsets_to_transaction({tp: OffsetAndMetadata(4, "")}, group)
        with pytest.raises(TimeoutError):  # one still open holds the read past its timeout
            await read_stable_offsets(admin, group, [tp], timeout_s=0.5)
        await producer.abort_transaction()
        assert (await read_stable_offsets(admin, group, [tp], timeout_s=10))[tp].offset == 3
    finally:
        await admin.close()
        await producer.stop()
        await consumer.stop()
