"""A Kafka source for Spark through the Python Data Source API (format ``decaton_kafka``).

This module owns the data source class, the read side (planning, reading one Kafka
partition in a Spark task) and the registration of the format with a session. Parsing the
options lives in :mod:`spark_jobs._kafka_options`, the row schema and its Arrow batches in
:mod:`spark_jobs._kafka_schema`. The write side lives in :mod:`spark_jobs.kafka_sink`;
:class:`KafkaDataSource` hands out both.

Spark's own Kafka connector is a JVM jar that cannot be fetched offline, so this source
talks to the broker with aiokafka from Spark's Python workers::

    df = (
        spark.read.format("decaton_kafka")
        .option("bootstrap.servers", "127.0.0.1:9092")
        .option("topic", "orders-dlq")
        .option("startingOffsets", '{"0": 5}')  # optional; "earliest" by default
        .load()
    )

Read options (names are case-insensitive, values are strings):

- ``bootstrap.servers`` (required): ``host:port[,host:port]``.
- ``topic`` (required): the topic to read.
- ``startingOffsets``: ``"earliest"`` (default), ``"latest"``, or a JSON object mapping
  partition numbers to offsets, e.g. ``{"0": 5, "2": "earliest"}``; ``-2`` means earliest
  and ``-1`` latest, as in Spark's Kafka connector. Partitions not named start at the
  earliest offset. An offset below the log start (records removed by retention) starts at
  the log start.
- ``endingOffsets``: ``"latest"`` (default), or a JSON object of exclusive end offsets,
  e.g. ``{"0": 100}``; ``-1`` or ``"latest"`` means the end. Partitions not named are read
  to their end. An end past the current end reads to the current end.
- ``maxPollRecords``: records taken per poll in a Spark task (default 5000). The embedded
  broker ignores fetch byte limits, so batches are bounded by count.
- ``pollTimeoutMs``: how long a partition read may make no progress before the task fails
  (default 30000).
- ``isolationLevel``: ``read_uncommitted`` (default) or ``read_committed``: only records
  of committed transactions, read up to the last stable offset.
- ``kafka.<client property>``: TLS and SASL in Kafka's own names, as in Spark's Kafka
  connector: ``kafka.security.protocol``, ``kafka.sasl.mechanism``,
  ``kafka.sasl.jaas.config``, ``kafka.ssl.truststore.location`` (PEM), ... (see
  :mod:`decaton_aio.client_properties`); files must exist where Spark tasks run. An
  unsupported ``kafka.*`` key is an error. ``oauthTokenProvider``: ``MODULE:ATTR`` of an
  OAUTHBEARER token provider.

Schema (fixed; see :data:`SCHEMA_DDL`): ``topic`` string, ``partition`` int, ``offset``
long, ``timestamp`` long (epoch milliseconds as the record carries it: exact, free of time
zones, and written back unchanged by the sink; use ``timestamp_millis(timestamp)`` for a
Spark timestamp), ``key`` binary, ``value`` binary, ``headers``
array<struct<key string, value binary>> in record order (duplicates kept).

How a read is bounded: one Spark input partition per Kafka partition. The end offsets are
fixed once, when Spark plans the query, so a query reads a consistent snapshot even while
producers keep writing. They are the high watermarks that fetch responses report, not the
answer of a ListOffsets request, which the embedded broker (Tansu) gets wrong when a batch
holds several records. Spark plans each action again: to read the same snapshot in several
actions, pin it with :func:`high_watermarks` and pass it as ``endingOffsets``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Final

import pyarrow as pa
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError, OffsetOutOfRangeError
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from decaton_aio._connect import connect_error
from decaton_aio.errors import BrokerError, ConfigError
from decaton_aio.offsets import PartitionExtent, partition_extents
from decaton_aio.security import PLAINTEXT, SecuritySettings
from spark_jobs._kafka_options import (
    EARLIEST,
    FORMAT,
    LATEST,
    KafkaReadOptions,
    parse_offsets,
    security_to_options,
)
from spark_jobs._kafka_schema import SCHEMA_DDL, SPARK_TYPES, to_arrow

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.datasource import DataSourceWriter

__all__ = [
    "EARLIEST",
    "FORMAT",
    "LATEST",
    "SCHEMA_DDL",
    "KafkaDataSource",
    "KafkaInputPartition",
    "KafkaReadOptions",
    "PartitionExtent",
    "high_watermarks",
    "parse_offsets",
    "plan_partitions",
    "read_topic",
    "register",
]

# A fetch waits at most this long for data; short, so an empty partition answers quickly.
_FETCH_MAX_WAIT_MS: Final = 100
# How long one getmany() call may wait before the loop looks at the position again.
_POLL_SLICE_MS: Final = 200
# How long planning may take to learn the high watermark of every partition.
_PLAN_TIMEOUT_S: Final = 30.0


# --------------------------------------------------------------------------- planning


class KafkaInputPartition(InputPartition):
    """One Kafka partition's slice ``[start, end)``, read by one Spark task."""

    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        super().__init__((topic, partition, start, end))
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end


def _consumer(options: KafkaReadOptions) -> AIOKafkaConsumer:
    # No group: partitions are assigned by hand and nothing is committed.
    return AIOKafkaConsumer(
        bootstrap_servers=options.bootstrap_servers,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="none",
        fetch_max_wait_ms=_FETCH_MAX_WAIT_MS,
        client_id="decaton-aio-spark-source",
        isolation_level=options.isolation_level,
        **options.security.client_kwargs(),
    )


def high_watermarks(
    bootstrap_servers: str,
    topic: str,
    *,
    timeout_s: float = _PLAN_TIMEOUT_S,
    isolation_level: str = "read_uncommitted",
    security: SecuritySettings = PLAINTEXT,
) -> dict[int, int]:
    """The current end of every partition, as fetch responses report it.

    Pass the result as ``endingOffsets`` (``json.dumps`` it) to read the same snapshot in
    several queries. Blocking; call it from synchronous code, not inside an event loop.

    Returns:
        partition -> high watermark (the offset the next record will get), or the last
        stable offset with ``isolation_level="read_committed"``.

    Raises:
        ConfigError: when the topic does not exist.
        SecurityError: when TLS or SASL fails.
        BrokerError: when the cluster cannot be reached or does not answer.
    """
    extents = asyncio.run(
        partition_extents(
            bootstrap_servers,
            topic,
            timeout_s=timeout_s,
            isolation_level=isolation_level,
            security=security,
        )
    )
    return {p: e.high_watermark for p, e in extents.items()}


def plan_partitions(
    options: KafkaReadOptions, extents: Mapping[int, PartitionExtent]
) -> list[KafkaInputPartition]:
    """Turn the asked-for bounds into one ``[start, end)`` slice per partition.

    Ends past the high watermark stop at it; starts below the log start move up to it; a
    start past the end reads nothing.

    Raises:
        ConfigError: when the offsets name a partition the topic does not have.
    """
    unknown = sorted(options.named_partitions() - set(extents))
    if unknown:
        raise ConfigError(
            f"offsets name partitions {unknown} but topic {options.topic!r} has partitions "
            f"0..{len(extents) - 1}"
        )
    planned = []
    for partition, extent in sorted(extents.items()):
        end = options.end_bound(partition)
        end = extent.high_watermark if end == LATEST else min(end, extent.high_watermark)
        start = options.start_bound(partition)
        if start == EARLIEST:
            start = extent.log_start
        elif start == LATEST:
            start = extent.high_watermark
        start = min(max(start, extent.log_start), end)
        planned.append(KafkaInputPartition(options.topic, partition, start, end))
    return planned


# --------------------------------------------------------------------------- reading


def read_partition(
    options: KafkaReadOptions, part: KafkaInputPartition
) -> Iterator[pa.RecordBatch]:
    """Read ``[part.start, part.end)`` of one partition as Arrow batches (blocking).

    Runs in a Spark task. aiokafka needs an event loop, and Spark wants a plain iterator, so
    the read drives a private loop one poll at a time and yields between polls: records
    stream out in batches of at most ``max_poll_records`` instead of piling up in memory.

    Raises:
        BrokerError: when the read makes no progress for ``poll_timeout_ms``, or the start
            offset is no longer in the log.
    """
    if part.start >= part.end:
        return
    tp = TopicPartition(part.topic, part.partition)
    loop = asyncio.new_event_loop()
    try:
        consumer = loop.run_until_complete(_open_reader(options, tp, part.start))
        try:
            yield from _poll_until(loop, consumer, options, part, tp)
        finally:
            loop.run_until_complete(consumer.stop())
    finally:
        loop.close()


async def _open_reader(
    options: KafkaReadOptions, tp: TopicPartition, start: int
) -> AIOKafkaConsumer:
    # Created inside the loop: aiokafka binds to the running loop when it starts.
    consumer = _consumer(options)
    try:
        await consumer.start()
    except KafkaError as exc:
        await consumer.stop()
        raise await connect_error(exc, options.bootstrap_servers, options.security) from exc
    consumer.assign([tp])
    consumer.seek(tp, start)
    return consumer


def _poll_until(
    loop: asyncio.AbstractEventLoop,
    consumer: AIOKafkaConsumer,
    options: KafkaReadOptions,
    part: KafkaInputPartition,
    tp: TopicPartition,
) -> Iterator[pa.RecordBatch]:
    position = part.start
    stall_limit_s = options.poll_timeout_ms / 1000
    last_progress = time.monotonic()
    while position < part.end:
        try:
            batch = loop.run_until_complete(
                consumer.getmany(
                    tp, timeout_ms=_POLL_SLICE_MS, max_records=options.max_poll_records
                )
            )
        except OffsetOutOfRangeError as exc:
            raise BrokerError(
                f"{tp.topic}[{tp.partition}] offset {position} is no longer in the log "
                "(removed by retention after the query was planned?)"
            ) from exc
        records = [r for r in batch.get(tp, ()) if r.offset < part.end]
        if records:
            yield to_arrow(part.topic, part.partition, records)
        # The position, not the last record, says how far the read got: it also moves
        # past offsets that hold no record (transaction markers, compacted-away records).
        new_position = loop.run_until_complete(consumer.position(tp))
        if new_position > position:
            position = new_position
            last_progress = time.monotonic()
        elif time.monotonic() - last_progress > stall_limit_s:
            raise BrokerError(
                f"{tp.topic}[{tp.partition}]: no progress at offset {position} for "
                f"{stall_limit_s:g}s; the read should reach offset {part.end}"
            )


# --------------------------------------------------------------------------- the source


def _check_schema(schema: StructType) -> None:
    # StructType.fromDDL needs a JVM, which a Python worker does not have: compare the
    # field names and Spark's own type names instead.
    got = [(f.name, f.dataType.simpleString()) for f in schema.fields]
    if got != SPARK_TYPES:
        raise ConfigError(
            f"the {FORMAT} source has a fixed schema ({SCHEMA_DDL}); do not pass .schema(), "
            f"got {schema.simpleString()}"
        )


class _KafkaReader(DataSourceReader):
    """Plans one input partition per Kafka partition and reads each with aiokafka."""

    def __init__(self, options: KafkaReadOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        """Fix the offsets to read, once per query (runs on the driver side)."""
        extents = asyncio.run(
            partition_extents(
                self.options.bootstrap_servers,
                self.options.topic,
                timeout_s=_PLAN_TIMEOUT_S,
                isolation_level=self.options.isolation_level,
                security=self.options.security,
            )
        )
        return plan_partitions(self.options, extents)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Read one planned partition (runs in a Spark task)."""
        assert isinstance(partition, KafkaInputPartition)
        return read_partition(self.options, partition)


class KafkaDataSource(DataSource):
    """The ``decaton_kafka`` format: read a topic into rows, write rows to a topic."""

    @classmethod
    def name(cls) -> str:
        """The format name, :data:`FORMAT`."""
        return FORMAT

    def schema(self) -> str:
        """The fixed schema of a read, :data:`SCHEMA_DDL` (Spark parses it)."""
        return SCHEMA_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        """A batch reader; validates the options first.

        Raises:
            ConfigError: when an option is missing or malformed.
        """
        _check_schema(schema)
        return _KafkaReader(KafkaReadOptions.parse(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """A batch writer (see :mod:`spark_jobs.kafka_sink`); only ``mode("append")``.

        Raises:
            ConfigError: on ``mode("overwrite")``, a missing option or an unusable column.
        """
        from spark_jobs.kafka_sink import KafkaWriter  # the heavier write side, on demand

        if overwrite:
            raise ConfigError(
                f"the {FORMAT} sink only appends to a topic: use .mode('append'), not overwrite"
            )
        return KafkaWriter.create(self.options, schema)


def register(spark: SparkSession) -> None:
    """Make ``spark.read.format("decaton_kafka")`` and the writer available in ``spark``."""
    spark.dataSource.register(KafkaDataSource)


def read_topic(
    spark: SparkSession,
    bootstrap_servers: str,
    topic: str,
    *,
    starting_offsets: str | Mapping[int, int] | None = None,
    ending_offsets: str | Mapping[int, int] | None = None,
    security: SecuritySettings = PLAINTEXT,
    oauth_token_provider: str | None = None,
    **options: str,
) -> DataFrame:
    """Read a topic into a DataFrame of :data:`SCHEMA_DDL` (lazily, like any read).

    Args:
        spark: a session where :func:`register` was called.
        bootstrap_servers: where the cluster is.
        topic: the topic to read.
        starting_offsets: ``"earliest"`` (default), ``"latest"`` or partition -> offset.
        ending_offsets: ``"latest"`` (default) or partition -> exclusive end offset.
        security: TLS and SASL settings, passed on as ``kafka.*`` options.
        oauth_token_provider: ``MODULE:ATTR`` of an OAUTHBEARER token provider.
        options: further source options, e.g. ``maxPollRecords="10000"``.
    """
    reader = (
        spark.read.format(FORMAT)
        .option("bootstrap.servers", bootstrap_servers)
        .option("topic", topic)
    )
    for name, value in (("startingOffsets", starting_offsets), ("endingOffsets", ending_offsets)):
        if value is not None:
            text = (
                value
                if isinstance(value, str)
                else json.dumps({str(p): o for p, o in value.items()})
            )
            reader = reader.option(name, text)
    secured = security_to_options(security, oauth_token_provider=oauth_token_provider)
    for name, value in {**secured, **options}.items():
        reader = reader.option(name, value)
    return reader.load()
