"""Thousands of records with random keys, headers and bodies (some valid) on a real
broker: each is processed or dead-lettered with the reason, and the group's commits reach
the end of every partition."""

from __future__ import annotations

import asyncio
import random
import uuid
from typing import Any

import msgspec
import pytest
from aiokafka import AIOKafkaProducer

from decaton_aio import Application, JsonSerializer, ProcessingContext
from decaton_aio.metadata import METADATA_HEADER, TaskMetadata, encode_metadata
from decaton_aio.offsets import group_positions
from decaton_aio.testing import BrokerHandle, read_records, wait_until

pytestmark = pytest.mark.integration

RECORDS = 2000
PARTITIONS = 3


class Order(msgspec.Struct, frozen=True):
    order_id: str
    amount: int


def _record(rnd: random.Random, n: int) -> tuple[bytes | None, bytes | None, list[Any]]:
    key = None if rnd.random() < 0.2 else rnd.randbytes(rnd.randint(0, 4))
    kind = rnd.random()
    if kind < 0.5:
        value: bytes | None = msgspec.json.encode(Order(f"o-{n}", n))
    elif kind < 0.8:
        value = rnd.randbytes(rnd.randint(0, 30))
    elif kind < 0.9 and key is not None:
        value = None  # a tombstone
    else:
        value = b'{"order_id": "o", "amount": "not a number"}'
    headers: list[tuple[str, bytes]] = []
    for _ in range(rnd.randint(0, 2)):
        pick = rnd.random()
        if pick < 0.4:
            headers.append((METADATA_HEADER, encode_metadata(TaskMetadata(n, "fuzz"))))
        elif pick < 0.7:
            headers.append((METADATA_HEADER, rnd.randbytes(rnd.randint(0, 12))))
        else:
            headers.append(("x-other", rnd.randbytes(4)))
    return key, value, headers


async def test_random_records_are_processed_or_dead_lettered(
    kafka_broker: BrokerHandle, topic_factory: Any
) -> None:
    topic = await topic_factory(partitions=PARTITIONS)
    rnd = random.Random(20261124)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_broker.bootstrap_servers, linger_ms=20)
    await producer.start()
    try:
        sends = [
            await producer.send(topic, value, key=key, headers=headers)
            for key, value, headers in (_record(rnd, n) for n in range(RECORDS))
        ]
        ends: dict[int, int] = {}
        for sent in sends:
            where = await sent
            ends[where.partition] = max(ends.get(where.partition, 0), where.offset + 1)
    finally:
        await producer.stop()

    processed: set[tuple[int, int]] = set()

    async def process(ctx: ProcessingContext, task: Order) -> None:
        processed.add((ctx.partition, ctx.offset))

    group = f"fuzz-{uuid.uuid4().hex[:8]}"
    app = Application(
        process,
        topics=(topic,),
        serializer=JsonSerializer(Order),
        properties={"decaton.commit.interval.ms": 100},
    )
    async with kafka_broker.subscription(app, group):

        async def at_end() -> bool:
            found = await group_positions(kafka_broker.bootstrap_servers, group, topic)
            return all(p.committed == ends.get(p.partition, 0) for p in found)

        await wait_until(lambda: len(processed) > 0, what="the first task")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while not await at_end():  # the broker's view: polled, commits come every 100 ms
            assert loop.time() < deadline, "the group's commits did not reach the end"
            await asyncio.sleep(0.2)
    dead = await read_records(
        kafka_broker.bootstrap_servers, f"{topic}-dlq", RECORDS - len(processed)
    )
    dead_origins = {
        (
            int(dict(r.headers)["dt_dlq_origin_partition"]),
            int(dict(r.headers)["dt_dlq_origin_offset"]),
        )
        for r in dead
    }
    assert len(processed) + len(dead) == RECORDS
    assert processed.isdisjoint(dead_origins)
    reasons = {dict(r.headers)["dt_dlq_error_type"] for r in dead}
    assert reasons <= {b"DecodeError:body", b"DecodeError:header"}
    assert len(processed) > RECORDS // 4  # the valid ones, whose header was readable


async def test_hostile_records_never_stall_a_partition(
    kafka_broker: BrokerHandle, topic_factory: Any
) -> None:
    """Records a broken or hostile producer may write: a key of 1 MB, 10,001 headers, a
    header of 900 KB; each with a body that decodes and one that does not. The good ones
    are processed; the bad ones are dead-lettered, as they are where they fit and as a
    reference to their origin where they cannot be sent (the producer sends 1 MB per
    request at most); the partition's commits reach its end."""
    topic = await topic_factory(partitions=1, configs={"max.message.bytes": str(4 << 20)})
    shapes: list[tuple[bytes, list[tuple[str, bytes]]]] = [
        (b"k" * (1 << 20), []),
        (b"many", [(f"h{i}", b"v") for i in range(10_001)]),
        (b"big", [("x-big", b"x" * (900 << 10))]),
    ]
    good = msgspec.json.encode(Order("o", 1))
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka_broker.bootstrap_servers, max_request_size=8 << 20
    )
    await producer.start()
    try:
        for key, headers in shapes:
            for value in (good, b"not json"):
                await producer.send_and_wait(topic, value, key=key, headers=headers)
        await producer.send_and_wait(topic, good, key=b"plain")
    finally:
        await producer.stop()
    total = 2 * len(shapes) + 1

    processed: list[int] = []

    async def process(ctx: ProcessingContext, task: Order) -> None:
        processed.append(ctx.offset)

    group = f"hostile-{uuid.uuid4().hex[:8]}"
    app = Application(process, topics=(topic,), serializer=JsonSerializer(Order))
    async with kafka_broker.subscription(app, group):

        async def at_end() -> bool:
            (found,) = await group_positions(kafka_broker.bootstrap_servers, group, topic)
            return found.committed == total

        await wait_until(lambda: len(processed) == len(shapes) + 1, what="the good ones")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while not await at_end():
            assert loop.time() < deadline, "the partition's commits stalled"
            await asyncio.sleep(0.2)
    assert sorted(processed) == [0, 2, 4, 6]
    dead = await read_records(kafka_broker.bootstrap_servers, f"{topic}-dlq", len(shapes))
    by_origin = {int(dict(r.headers)["dt_dlq_origin_offset"]): r for r in dead}
    assert sorted(by_origin) == [1, 3, 5]
    reference = by_origin[1]  # 1 MB of key: more than the producer sends
    assert (reference.key, reference.value) == (None, b"")
    assert dict(reference.headers)["dt_dlq_error_type"] == b"RecordRejected"
    assert b"1048584 bytes of key and value" in dict(reference.headers)["dt_dlq_error_message"]
    assert dict(by_origin[3].headers)["dt_dlq_error_type"] == b"DecodeError:body"
    assert len(by_origin[3].headers) > 10_001  # kept as it is, with the DLQ headers
