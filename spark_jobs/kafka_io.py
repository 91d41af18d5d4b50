"""Reading and writing Kafka in the Spark jobs, through Spark's Kafka connector.

This module owns how the jobs use Spark's own connector (format ``kafka``, the jar
``spark-sql-kafka-0-10``; see :mod:`spark_jobs._connector`): the ``kafka.*`` options
built from the jobs' security settings, a read of one topic up to end offsets pinned
once, and a write that reports exactly what it sent where.

A read (:func:`read_topic`) has the connector's schema, headers included: ``key`` and
``value`` binary, ``topic`` string, ``partition`` int, ``offset`` long, ``timestamp`` a
Spark timestamp, ``timestampType`` int, ``headers`` array<struct<key string, value
binary>>. Spark plans every action again, so a batch read of "latest" could see more
records in a later action: :func:`pinned_ends` fixes the end of every partition once (the
last stable offset under ``read_committed``), and ``read_topic`` reads up to it.

A write (:func:`write_topic`) takes ``key``, ``value``, ``headers`` and ``topic`` (or a
topic for all rows) and chooses each record's partition itself, as Kafka's producers
choose it for a key (murmur2 of the key, modulo the partition count), and spreads records
without a key by a hash of their value: the counts per partition it reports are then
exactly where the records went. Every record is sent with ``acks=all``
(:data:`WRITE_OPTIONS`); a Spark task fails
when a send fails, so a write that returns had every record acknowledged (a retried task
sends its rows again: at-least-once).
"""

from __future__ import annotations

import asyncio
import json
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from aiokafka import AIOKafkaConsumer
from aiokafka.partitioner import murmur2

from decaton_aio._connect import start_client
from decaton_aio.client_properties import client_property_entries
from decaton_aio.errors import ConfigError
from decaton_aio.offsets import partition_extents, topic_partitions
from decaton_aio.producer import Idempotence
from decaton_aio.security import PLAINTEXT, SecuritySettings

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "FORMAT",
    "WRITE_OPTIONS",
    "WriteSummary",
    "choose_partition",
    "kafka_options",
    "partition_counts",
    "pinned_ends",
    "read_topic",
    "write_topic",
]

FORMAT: Final = "kafka"
"""Spark's Kafka connector."""

_PLAN_TIMEOUT_S: Final = 30.0

WRITE_OPTIONS: Final = {
    "kafka.acks": "all",
    "kafka.linger.ms": "5",
    "kafka.batch.size": str(256 * 1024),
}
"""The producer settings of a write (Kafka's defaults send 16 KB batches without waiting:
a write of 1 KB records then takes about twice as long)."""


def kafka_options(
    bootstrap_servers: str,
    security: SecuritySettings = PLAINTEXT,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The connector's ``kafka.*`` options: the cluster, TLS and SASL, and ``extra``.

    TLS files are PEM (``kafka.ssl.truststore.type=PEM``, and a client certificate with
    its key as ``kafka.ssl.keystore.location``); they must exist where Spark's executors
    run. ``extra`` maps Kafka client properties (without the ``kafka.`` prefix) and wins.

    Raises:
        ConfigError: OAUTHBEARER through a Python token provider, which Spark's Kafka
            client (Java) cannot call; the message says what to use instead.
    """
    if security.sasl_mechanism == "OAUTHBEARER" and security.uses_sasl:
        raise ConfigError(
            "OAUTHBEARER through a Python token provider cannot reach Spark's Kafka client "
            "(Java): put Kafka's own OAUTHBEARER settings in a --kafka-properties file "
            "(sasl.mechanism, sasl.jaas.config, sasl.oauthbearer.token.endpoint.url, "
            "sasl.login.callback.handler.class) and leave out the provider"
        )
    entries = {} if security == PLAINTEXT else client_property_entries(security)
    entries = {"bootstrap.servers": bootstrap_servers, **entries, **(extra or {})}
    return {f"kafka.{key}": value for key, value in entries.items()}


def pinned_ends(
    bootstrap_servers: str,
    topic: str,
    *,
    isolation_level: str = "read_uncommitted",
    security: SecuritySettings = PLAINTEXT,
) -> dict[int, int]:
    """The current end of every partition of ``topic`` (blocking; not in an event loop).

    Returns:
        partition -> high watermark, or the last stable offset under ``read_committed``.

    Raises:
        ConfigError: when the topic does not exist.
        SecurityError: when TLS or SASL fails.
        BrokerError: when the cluster cannot be reached or does not answer.
    """
    extents = asyncio.run(
        partition_extents(
            bootstrap_servers,
            topic,
            timeout_s=_PLAN_TIMEOUT_S,
            isolation_level=isolation_level,
            security=security,
        )
    )
    return {p: e.high_watermark for p, e in extents.items()}


def read_topic(
    spark: SparkSession,
    bootstrap_servers: str,
    topic: str,
    *,
    ending_offsets: Mapping[int, int],
    starting_offsets: Mapping[int, int] | None = None,
    isolation_level: str = "read_uncommitted",
    security: SecuritySettings = PLAINTEXT,
    extra: Mapping[str, str] | None = None,
) -> DataFrame:
    """Read ``topic`` with its headers, from ``starting_offsets`` (default: the earliest)
    up to ``ending_offsets`` (exclusive; every partition, e.g. :func:`pinned_ends`).

    Raises:
        ConfigError: as :func:`kafka_options`.
    """
    reader = spark.read.format(FORMAT).option("subscribe", topic)
    reader = reader.option("includeHeaders", "true")
    reader = reader.option("endingOffsets", _offsets_json(topic, ending_offsets))
    if starting_offsets is not None:
        reader = reader.option("startingOffsets", _offsets_json(topic, starting_offsets))
    options = kafka_options(bootstrap_servers, security, extra)
    options["kafka.isolation.level"] = isolation_level
    return reader.options(**options).load()


def _offsets_json(topic: str, offsets: Mapping[int, int]) -> str:
    return json.dumps({topic: {str(p): o for p, o in sorted(offsets.items())}})


def partition_counts(
    bootstrap_servers: str, topics: list[str], *, security: SecuritySettings = PLAINTEXT
) -> dict[str, int]:
    """The partition count of each topic (blocking; not in an event loop).

    Raises:
        ConfigError: when a topic does not exist.
        SecurityError: when TLS or SASL fails.
        BrokerError: when the cluster cannot be reached.
    """

    async def counts() -> dict[str, int]:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap_servers,
            group_id=None,
            enable_auto_commit=False,
            client_id="decaton-aio-spark",
            **security.client_kwargs(),
        )
        await start_client(consumer, bootstrap_servers, security)
        try:
            return {t: len(await topic_partitions(consumer, t)) for t in topics}
        finally:
            await consumer.stop()

    return asyncio.run(counts())


def choose_partition(key: bytes | None, value: bytes | None, partitions: int) -> int:
    """The partition of a record: murmur2 of the key, as Kafka's producers choose it;
    without a key, a hash of the value."""
    if key is not None:
        return (murmur2(bytes(key)) & 0x7FFFFFFF) % partitions
    return zlib.crc32(bytes(value or b"")) % partitions


@dataclass
class WriteSummary:
    """What a write sent.

    Attributes:
        records: records acknowledged by the cluster.
        per_partition: ``"<topic>:<partition>"`` -> records.
    """

    records: int = 0
    per_partition: dict[str, int] = field(default_factory=dict)


def write_topic(
    df: DataFrame,
    bootstrap_servers: str,
    topic: str | None,
    *,
    idempotence: Idempotence = "auto",
    compression_type: str | None = None,
    security: SecuritySettings = PLAINTEXT,
    extra: Mapping[str, str] | None = None,
) -> WriteSummary:
    """Write the rows of ``df`` (``key``, ``value``, ``headers`` and, without ``topic``,
    a ``topic`` column) and report where they went.

    Args:
        df: the records; ``key`` and ``value`` binary or string, ``headers`` optional.
        bootstrap_servers: the cluster.
        topic: the topic of every row, or ``None`` to use the ``topic`` column.
        idempotence: ``"auto"`` (the Kafka client's default: idempotent), ``True`` or
            ``False``.
        compression_type: ``gzip``, ``snappy``, ``lz4`` or ``zstd``; none by default.
        security: TLS and SASL settings.
        extra: Kafka producer properties (no ``kafka.`` prefix); they win.

    Raises:
        ConfigError: when a target topic does not exist (nothing is sent then).
    """
    from pyspark import StorageLevel
    from pyspark.sql import functions as F
    from pyspark.sql.types import IntegerType

    records = df if topic is None else df.withColumn("topic", F.lit(topic))
    targets = [r.topic for r in records.select("topic").distinct().collect()]
    if not targets:
        return WriteSummary()
    if None in targets:
        raise ConfigError("a record has no topic: give a topic, or a topic in every row")
    counts = partition_counts(bootstrap_servers, targets, security=security)

    def partition_of(topic: str, key: bytes | None, value: bytes | None) -> int:
        return choose_partition(key, value, counts[topic])

    choose = F.udf(partition_of, IntegerType(), useArrow=False)
    value = F.col("value").cast("binary")
    key = F.col("key").cast("binary") if "key" in records.columns else F.lit(None)
    columns = ["topic", key.alias("key"), value.alias("value")]
    if "headers" in records.columns:
        columns.append("headers")
    outgoing = records.select(*columns)
    outgoing = outgoing.withColumn("partition", choose("topic", "key", "value"))
    outgoing = outgoing.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        spread = outgoing.groupBy("topic", "partition").count().collect()
        options = {**kafka_options(bootstrap_servers, security), **WRITE_OPTIONS}
        if idempotence != "auto":
            options["kafka.enable.idempotence"] = str(bool(idempotence)).lower()
        if compression_type is not None:
            options["kafka.compression.type"] = compression_type
        options.update({f"kafka.{k}": v for k, v in (extra or {}).items()})
        outgoing.write.format(FORMAT).options(**options).mode("append").save()
    finally:
        outgoing.unpersist()
    per_partition = {f"{r.topic}:{r.partition}": r["count"] for r in spread}
    return WriteSummary(sum(per_partition.values()), dict(sorted(per_partition.items())))
