"""A checkpoint that cannot be read (corrupt or truncated, in the commit metadata or on the
checkpoint topic): the partition starts from the committed offset, one warning names the
partition, and no task from that offset on is lost."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import OffsetAndMetadata
from structlog.testing import capture_logs

from decaton_aio import Application, DurableSender, ProcessingContext
from decaton_aio.consumer.commit._checkpoint_codec import Checkpoint, encode, to_text
from decaton_aio.testing import BrokerHandle, drain

pytestmark = pytest.mark.integration

COMMITTED = 5
TASKS = 20


async def commit(broker: BrokerHandle, group: str, tp: TopicPartition, metadata: str) -> None:
    """Commit ``COMMITTED`` with ``metadata`` for ``group``, as an earlier run would have."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=broker.bootstrap_servers, group_id=group, enable_auto_commit=False
    )
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.commit({tp: OffsetAndMetadata(COMMITTED, metadata)})
    finally:
        await consumer.stop()


def valid_checkpoint() -> bytes:
    # Done above the committed offset: 6, 8 and 9 (a true checkpoint of COMMITTED).
    return encode(Checkpoint(COMMITTED, bytes([0b0101_1000])))


CASES = {
    "metadata-garbage": ("metadata", b"", "dc1:%%% not base64 %%%"),
    "metadata-truncated": ("metadata", b"", to_text(valid_checkpoint())[:-6]),
    "topic-garbage": ("topic", b"\x00garbage", ""),
    "topic-truncated": ("topic", valid_checkpoint()[:-3], ""),
}


@pytest.mark.parametrize("exactly_once", [False, True], ids=["at-least-once", "exactly-once"])
@pytest.mark.parametrize("case", list(CASES))
async def test_an_unreadable_checkpoint_starts_the_partition_at_its_committed_offset(
    case: str,
    exactly_once: bool,
    kafka_broker: BrokerHandle,
    topic_factory: Any,
    task_producer: Any,
) -> None:
    if exactly_once and not kafka_broker.hides_aborted_transactions:
        pytest.skip(f"{kafka_broker.flavor}: no transactions")
    where, record, metadata = CASES[case]
    if where == "metadata" and not kafka_broker.keeps_commit_metadata:
        pytest.skip(f"{kafka_broker.flavor} drops commit metadata")
    topic = await topic_factory(partitions=1)
    producer = await task_producer(topic)
    for n in range(TASKS):
        await producer.put(f"k{n}", str(n).encode())
    group = f"corrupt-{uuid.uuid4().hex[:8]}"
    tp = TopicPartition(topic, 0)
    if where == "topic":
        checkpoints = await topic_factory(partitions=1, name=f"{group}-checkpoints")
        async with DurableSender(kafka_broker.producer_config()) as sender:
            key = f"{group}/{topic}/0".encode()
            at = await sender.send(checkpoints, record, key=key, partition=0)
        metadata = f"dc1ref:0:{at.offset}:{COMMITTED}"
    await commit(kafka_broker, group, tp, metadata)

    seen: list[int] = []

    async def process(ctx: ProcessingContext, task: bytes) -> None:
        seen.append(ctx.offset)

    app = Application(process, topics=(topic,), exactly_once=exactly_once)
    with capture_logs() as logs:
        await drain(app, kafka_broker.bootstrap_servers, expected=TASKS - COMMITTED, group_id=group)
    assert sorted(seen) == list(range(COMMITTED, TASKS))  # none skipped, none before
    warnings = [e for e in logs if "checkpoint" in e["event"] and e["log_level"] == "warning"]
    assert [w.get("partition") for w in warnings] == [f"{topic}-0"], warnings
