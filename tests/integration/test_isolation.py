"""Consuming a topic written by a transactional producer: read_committed never processes
records of aborted transactions, and transaction markers do not hold the commit back."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from decaton_aio import Application, ProcessingContext
from decaton_aio.offsets import group_positions
from decaton_aio.testing import BrokerHandle, committed_offsets, wait_until

pytestmark = pytest.mark.integration


async def write_transactions(servers: str, topic: str) -> None:
    """One committed transaction (c-0..c-2), one aborted (a-0, a-1), one committed (c-3)."""
    producer = AIOKafkaProducer(
        bootstrap_servers=servers, transactional_id=f"upstream-{uuid.uuid4().hex[:8]}"
    )
    await producer.start()
    try:
        async with producer.transaction():
            for i in range(3):
                await producer.send(topic, f"c-{i}".encode(), key=b"k")
        await producer.begin_transaction()
        for i in range(2):
            await producer.send(topic, f"a-{i}".encode(), key=b"k")
        await producer.abort_transaction()
        async with producer.transaction():
            await producer.send(topic, b"c-3", key=b"k")
    finally:
        await producer.stop()


@pytest.mark.parametrize(
    ("isolation", "expected"),
    [
        ("read_committed", [b"c-0", b"c-1", b"c-2", b"c-3"]),
        ("read_uncommitted", [b"c-0", b"c-1", b"c-2", b"a-0", b"a-1", b"c-3"]),
    ],
)
async def test_isolation_level_and_the_commit_past_transaction_markers(
    kafka_broker: BrokerHandle, topic_factory: Any, isolation: str, expected: list[bytes]
) -> None:
    """Whatever the isolation level, the group's committed offset reaches the end of the
    partition (the last offset is a transaction marker no consumer is handed), so the lag
    that `inspect` reports drops to zero."""
    if not kafka_broker.hides_aborted_transactions:
        pytest.skip("this broker does not hide aborted transactions from read_committed")
    topic = await topic_factory(partitions=1)
    await write_transactions(kafka_broker.bootstrap_servers, topic)
    seen: list[bytes] = []

    async def process(ctx: ProcessingContext, task: bytes) -> None:
        seen.append(task)

    app = Application(process, topics=(topic,))
    group = f"isolation-{uuid.uuid4().hex[:8]}"
    end = 3 + 1 + 2 + 1 + 1 + 1  # records and a marker per transaction
    async with kafka_broker.subscription(app, group, isolation_level=isolation) as sub:
        await wait_until(
            lambda: [p.last_committed for p in sub.partitions.values()] == [end],
            what=f"a commit of offset {end}",
        )
    assert seen == expected
    committed = await committed_offsets(kafka_broker.bootstrap_servers, group, topic, [0])
    assert committed == {0: end}
    (position,) = await group_positions(
        kafka_broker.bootstrap_servers, group, topic, isolation_level=isolation
    )
    assert (position.committed, position.high_watermark, position.lag) == (end, end, 0)
