"""Where partitions start and end, and where a consumer group stands in them.

High watermarks come from fetch responses, not from ListOffsets: some Kafka-compatible
brokers (the embedded one among them) answer ListOffsets(latest) wrongly when a batch
holds several records. The ListOffsets answer is used only as a hint of where to fetch:
on a real cluster the fetch then starts at the end and comes back empty and cheap.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, TopicPartition

from decaton_aio._aiokafka import client_of
from decaton_aio._connect import start_admin, start_client
from decaton_aio.errors import BrokerError, ConfigError
from decaton_aio.security import PLAINTEXT, SecuritySettings

__all__ = [
    "ISOLATION_LEVELS",
    "PartitionExtent",
    "PartitionPosition",
    "committed_offsets",
    "group_positions",
    "partition_extents",
    "topic_partitions",
]

_FETCH_MAX_WAIT_MS = 100

#: What a reader sees: every record, or only records of committed transactions.
ISOLATION_LEVELS = ("read_uncommitted", "read_committed")
_UNKNOWN_TOPIC_WAIT_S = 5.0


@dataclass(frozen=True, slots=True)
class PartitionExtent:
    """Where a partition's log starts and where a reader's view of it ends.

    Attributes:
        log_start: the first offset still in the log.
        high_watermark: the offset the next record will get; for a ``read_committed``
            reader, the last stable offset (where the first open transaction starts),
            since such a reader cannot go further.
    """

    log_start: int
    high_watermark: int


@dataclass(frozen=True, slots=True)
class PartitionPosition:
    """A consumer group's position in one partition.

    Attributes:
        partition: the partition number.
        committed: the committed offset (the next to process), ``None`` if none.
        high_watermark: the offset the next record will get (the last stable offset for
            ``read_committed``).
        lag: offsets between the committed offset (or the log start) and the end.
    """

    partition: int
    committed: int | None
    high_watermark: int
    lag: int


async def topic_partitions(
    consumer: AIOKafkaConsumer, topic: str, *, wait_s: float = _UNKNOWN_TOPIC_WAIT_S
) -> list[int]:
    """The partitions of ``topic``, waiting a little for a topic created a moment ago.

    Raises:
        ConfigError: when the topic does not exist.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while True:
        found = consumer.partitions_for_topic(topic)
        if found:
            return sorted(found)
        # The consumer tracks only the topics it subscribed to; a Metadata request
        # for all topics sees the others without creating ``topic`` by accident.
        cluster = await client_of(consumer).fetch_all_metadata()
        found = cluster.partitions_for_topic(topic)
        if found:
            return sorted(found)
        if loop.time() > deadline:
            raise ConfigError(f"topic {topic!r} does not exist")
        await asyncio.sleep(0.05)


async def partition_extents(
    bootstrap_servers: str,
    topic: str,
    *,
    timeout_s: float = 30.0,
    isolation_level: str = "read_uncommitted",
    security: SecuritySettings = PLAINTEXT,
) -> dict[int, PartitionExtent]:
    """The log start and high watermark of every partition of ``topic``.

    With ``isolation_level="read_committed"`` the end is the last stable offset.

    Raises:
        ConfigError: when the topic does not exist.
        SecurityError: when TLS or SASL fails.
        BrokerError: when the cluster cannot be reached or does not answer in time.
    """
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap_servers,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=_FETCH_MAX_WAIT_MS,
        client_id="decaton-aio-offsets",
        isolation_level=isolation_level,
        **security.client_kwargs(),
    )
    committed_only = isolation_level == "read_committed"
    end_of = consumer.last_stable_offset if committed_only else consumer.highwater
    await start_client(consumer, bootstrap_servers, security)
    try:
        tps = [TopicPartition(topic, p) for p in await topic_partitions(consumer, topic)]
        consumer.assign(tps)
        log_starts = await consumer.beginning_offsets(tps)
        hints = await consumer.end_offsets(tps)
        for tp in tps:
            consumer.seek(tp, max(log_starts[tp], hints[tp]))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while any(end_of(tp) is None for tp in tps):
            if loop.time() > deadline:
                missing = [tp.partition for tp in tps if end_of(tp) is None]
                raise BrokerError(
                    f"no fetch response for {topic} partitions {missing} within {timeout_s}s"
                )
            # A fetch response sets the high watermark whether or not it holds records.
            await consumer.getmany(timeout_ms=_FETCH_MAX_WAIT_MS, max_records=1)
        return {tp.partition: PartitionExtent(log_starts[tp], end_of(tp)) for tp in tps}
    finally:
        await consumer.stop()


async def committed_offsets(
    bootstrap_servers: str,
    group_id: str,
    topic: str,
    partitions: Iterable[int],
    *,
    security: SecuritySettings = PLAINTEXT,
) -> dict[int, int | None]:
    """The group's committed offset per partition (``None`` where nothing is committed).

    Raises:
        SecurityError: when TLS or SASL fails.
        BrokerError: when the cluster cannot be reached.
    """
    admin = await start_admin(bootstrap_servers, security)
    try:
        tps = [TopicPartition(topic, p) for p in partitions]
        # Always name the partitions: asking for a whole group breaks some brokers.
        found = await admin.list_consumer_group_offsets(group_id, partitions=tps)
    finally:
        await admin.close()
    result: dict[int, int | None] = {tp.partition: None for tp in tps}
    for tp, meta in found.items():
        result[tp.partition] = meta.offset if meta.offset >= 0 else None
    return result


async def group_positions(
    bootstrap_servers: str,
    group_id: str,
    topic: str,
    *,
    isolation_level: str = "read_uncommitted",
    security: SecuritySettings = PLAINTEXT,
) -> list[PartitionPosition]:
    """Where ``group_id`` stands in every partition of ``topic``, with its lag.

    The lag is counted to the end a reader of ``isolation_level`` reaches.

    Raises:
        ConfigError: when the topic does not exist.
        SecurityError: when TLS or SASL fails.
        BrokerError: when the cluster cannot be reached.
    """
    extents = await partition_extents(
        bootstrap_servers, topic, isolation_level=isolation_level, security=security
    )
    committed = await committed_offsets(
        bootstrap_servers, group_id, topic, extents, security=security
    )
    positions = []
    for partition, extent in sorted(extents.items()):
        done = committed[partition]
        start = extent.log_start if done is None else max(done, extent.log_start)
        positions.append(
            PartitionPosition(
                partition, done, extent.high_watermark, max(0, extent.high_watermark - start)
            )
        )
    return positions
