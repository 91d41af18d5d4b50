"""The Kafka sink of the ``decaton_kafka`` format: write DataFrame rows to a topic.

This module owns the write side: the writer's options, the columns it understands, the
producing Spark task and the commit that sums what every task produced. The format itself
is registered by :mod:`spark_jobs.kafka_source`::

    (
        df.write.format("decaton_kafka")
        .option("bootstrap.servers", "127.0.0.1:9092")
        .option("topic", "orders")
        .mode("append")
        .save()
    )

Columns (others are ignored, so a DataFrame read from a topic can be written as it is):

- ``value`` (required): binary or string (UTF-8); null writes a tombstone.
- ``key``: binary or string; null or absent for no key.
- ``headers``: array<struct<key string, value binary or string>>, written in order.
- ``partition``: an integer; null or absent lets the key choose (murmur2, like Kafka's
  Java producer).
- ``timestamp``: epoch milliseconds (long) or a Spark timestamp; null or absent for now.
- ``topic``: a string, used only when the ``topic`` option is not given.

Options (names are case-insensitive, values are strings):

- ``bootstrap.servers`` (required): ``host:port[,host:port]``.
- ``topic`` (required unless the rows carry a ``topic`` column): the topic to write.
- ``idempotence``: ``auto`` (default: idempotent where the cluster grants it), ``true``
  (required) or ``false``.
- ``compressionType``: ``gzip``, ``snappy``, ``lz4`` or ``zstd`` (default: none).
- ``lingerMs`` (default 5), ``maxBatchBytes`` (default 262144), ``requestTimeoutMs``
  (default 30000): producer tuning.
- ``kafka.<client property>`` and ``oauthTokenProvider``: TLS and SASL, as for the source
  (see :mod:`spark_jobs.kafka_source`).
- ``summaryPath``: a file where the driver-side commit writes a JSON
  :class:`WriteSummary`; :func:`write_topic` sets it and returns the summary.

Delivery: every record is sent with ``acks=all``, and each Spark task waits for every
acknowledgement before it reports its counts; the driver's commit sums them. The sink is
at-least-once: a Spark task that fails and is retried sends its rows again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import pyarrow as pa
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from aiokafka.partitioner import DefaultPartitioner
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    ByteType,
    DataType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
    TimestampType,
)

from decaton_aio.errors import ConfigError, ProducerError
from decaton_aio.producer import Idempotence, ProducerConfig, start_client
from decaton_aio.security import PLAINTEXT, SecuritySettings
from spark_jobs._active import activate
from spark_jobs._kafka_options import (
    FORMAT,
    int_option,
    option_value,
    require_option,
    security_from_options,
    security_to_options,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = [
    "KafkaWriteCommit",
    "KafkaWriteOptions",
    "KafkaWriter",
    "WriteSummary",
    "write_topic",
]

DEFAULT_LINGER_MS: Final = 5
DEFAULT_REQUEST_TIMEOUT_MS: Final = 30_000
DEFAULT_MAX_BATCH_BYTES: Final = 256 * 1024

# Batches sent before their acknowledgements are awaited: bounds what a task keeps in memory.
_SETTLE_EVERY_BATCHES: Final = 64

_INTEGER_TYPES: Final = (ByteType, ShortType, IntegerType, LongType)
_TEXT_TYPES: Final = (BinaryType, StringType)
_TIMESTAMP_TYPES: Final = (*_INTEGER_TYPES, TimestampType)


def _idempotence_option(options: Mapping[str, str]) -> Idempotence:
    raw = option_value(options, "idempotence")
    if raw is None or raw.lower() == "auto":
        return "auto"
    if raw.lower() in ("true", "1", "yes", "on"):
        return True
    if raw.lower() in ("false", "0", "no", "off"):
        return False
    raise ConfigError(f"option 'idempotence' must be 'auto', 'true' or 'false', got {raw!r}")


@dataclass(frozen=True)
class KafkaWriteOptions:
    """The parsed options of a write (see the module docstring for each option).

    Attributes:
        bootstrap_servers: where the cluster is.
        topic: the target topic, or ``None`` when each row names its own.
        idempotence: ``"auto"``, ``True`` or ``False`` (see ``ProducerConfig``).
        compression_type: the codec of produced batches, or ``None``.
        linger_ms: how long the client waits to fill a batch.
        max_batch_bytes: the largest batch the client sends per partition.
        request_timeout_ms: how long a produce request may take before it is retried.
        summary_path: where the commit writes its JSON summary, if anywhere.
        security: TLS and SASL settings (the ``kafka.*`` options).
    """

    bootstrap_servers: str
    topic: str | None
    idempotence: Idempotence = "auto"
    compression_type: str | None = None
    linger_ms: int = DEFAULT_LINGER_MS
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES
    request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS
    summary_path: str | None = None
    security: SecuritySettings = PLAINTEXT

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> KafkaWriteOptions:
        """Validate and parse the options Spark passes to the sink.

        Raises:
            ConfigError: when an option is missing or malformed.
        """
        return cls(
            bootstrap_servers=require_option(
                options, "bootstrap.servers", "host:port of the cluster"
            ),
            topic=option_value(options, "topic"),
            idempotence=_idempotence_option(options),
            compression_type=option_value(options, "compressionType"),
            linger_ms=int_option(options, "lingerMs", DEFAULT_LINGER_MS, minimum=0),
            max_batch_bytes=int_option(
                options, "maxBatchBytes", DEFAULT_MAX_BATCH_BYTES, minimum=1024
            ),
            request_timeout_ms=int_option(options, "requestTimeoutMs", DEFAULT_REQUEST_TIMEOUT_MS),
            summary_path=option_value(options, "summaryPath"),
            security=security_from_options(options),
        )


@dataclass(frozen=True)
class _Columns:
    """Which of the understood columns the rows carry."""

    has_key: bool
    has_headers: bool
    has_partition: bool
    has_timestamp: bool
    has_topic: bool

    @classmethod
    def check(cls, schema: StructType, *, topic_option: bool) -> _Columns:
        fields = {f.name: f.dataType for f in schema.fields}
        _check_column(fields, "value", _TEXT_TYPES, "binary or string", required=True)
        _check_column(fields, "key", _TEXT_TYPES, "binary or string")
        _check_column(fields, "partition", _INTEGER_TYPES, "an integer")
        _check_column(fields, "timestamp", _TIMESTAMP_TYPES, "epoch ms (long) or a timestamp")
        _check_column(fields, "topic", (StringType,), "string")
        if "headers" in fields:
            _check_headers(fields["headers"])
        if not topic_option and "topic" not in fields:
            raise ConfigError(
                "option 'topic' is required (or a 'topic' column): the topic to write, "
                "e.g. .option('topic', ...)"
            )
        return cls(
            has_key="key" in fields,
            has_headers="headers" in fields,
            has_partition="partition" in fields,
            has_timestamp="timestamp" in fields,
            has_topic="topic" in fields and not topic_option,
        )


def _check_column(
    fields: Mapping[str, DataType],
    name: str,
    types: tuple[type[DataType], ...],
    what: str,
    *,
    required: bool = False,
) -> None:
    if name not in fields:
        if required:
            raise ConfigError(
                f"the {FORMAT} sink needs a {name!r} column ({what}); the rows have "
                f"{sorted(fields)}"
            )
        return
    if not isinstance(fields[name], types):
        raise ConfigError(f"column {name!r} must be {what}, got {fields[name].simpleString()}")


def _check_headers(data_type: DataType) -> None:
    element = data_type.elementType if isinstance(data_type, ArrayType) else None
    names = [f.name for f in element.fields] if isinstance(element, StructType) else []
    if (
        not isinstance(element, StructType)
        or names != ["key", "value"]
        or not isinstance(element.fields[0].dataType, StringType)
        or not isinstance(element.fields[1].dataType, _TEXT_TYPES)
    ):
        raise ConfigError(
            "column 'headers' must be array<struct<key: string, value: binary or string>>, "
            f"got {data_type.simpleString()}"
        )


@dataclass
class KafkaWriteCommit(WriterCommitMessage):
    """What one Spark task produced: record counts per ``(topic, partition)``."""

    records: int = 0
    per_partition: dict[tuple[str, int], int] = field(default_factory=dict)


@dataclass(frozen=True)
class WriteSummary:
    """What a whole write produced, as the commit (or abort) wrote it to ``summaryPath``.

    Attributes:
        records: records acknowledged by the broker.
        per_partition: ``"<topic>:<partition>"`` -> records.
        tasks: Spark tasks that reported counts.
        committed: false when the write was aborted; ``records`` then counts what the
            successful tasks produced before the failure.
    """

    records: int
    per_partition: dict[str, int]
    tasks: int
    committed: bool

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> WriteSummary:
        """Read a summary file written by the sink."""
        return cls(**json.loads(Path(path).read_text()))


def _encode(value: Any) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return bytes(value)  # another buffer type


class _BatchSender:
    """Fills one aiokafka batch per (topic, partition) and sends it when full.

    aiokafka's batch API moves several times more records per second than one ``send()``
    per record, because no future is made per record. The price is choosing the partition
    here, the way Kafka's Java producer and aiokafka's ``send()`` do: murmur2 of the key, a
    random partition for a record without a key.
    """

    def __init__(self, producer: AIOKafkaProducer, commit: KafkaWriteCommit) -> None:
        self._producer = producer
        self._commit = commit
        self._partitioner = DefaultPartitioner()
        self._partitions: dict[str, list[int]] = {}
        self._open: dict[tuple[str, int], tuple[Any, int]] = {}  # (batch, records in it)
        self._sent: list[tuple[asyncio.Future[Any], tuple[str, int], int]] = []

    async def add(
        self,
        topic: str,
        partition: int | None,
        key: bytes | None,
        value: bytes | None,
        timestamp_ms: int | None,
        headers: list[tuple[str, bytes | None]],
    ) -> None:
        """Add one record to its partition's batch, sending the batch first if it is full."""
        partitions = self._partitions.get(topic)
        if partitions is None:
            try:
                known = await self._producer.partitions_for(topic)
            except KafkaError as exc:
                raise ProducerError(f"no metadata for topic {topic!r}: {exc!r}") from exc
            partitions = self._partitions[topic] = sorted(known)
        if partition is None:
            partition = self._partitioner(key, partitions, partitions)
        elif partition not in partitions:
            raise ProducerError(
                f"partition {partition} does not exist: {topic} has partitions "
                f"0..{len(partitions) - 1}"
            )
        where = (topic, partition)
        for attempt in range(2):
            batch, count = self._open.get(where) or (self._producer.create_batch(), 0)
            appended = batch.append(key=key, value=value, timestamp=timestamp_ms, headers=headers)
            if appended is not None:
                self._open[where] = (batch, count + 1)
                return
            if count == 0 or attempt:
                raise ProducerError(f"a record for {topic} is larger than a whole batch")
            await self._send(where)

    async def _send(self, where: tuple[str, int]) -> None:
        batch, count = self._open.pop(where)
        batch.close()
        future = await self._producer.send_batch(batch, where[0], partition=where[1])
        self._sent.append((future, where, count))
        if len(self._sent) >= _SETTLE_EVERY_BATCHES:
            await self._settle()

    async def finish(self) -> None:
        """Send every open batch and wait until the broker acknowledged all of them."""
        for where in list(self._open):
            await self._send(where)
        await self._settle()

    async def _settle(self) -> None:
        sent, self._sent = self._sent, []
        try:
            await asyncio.gather(*(future for future, _, _ in sent))
        except KafkaError as exc:
            raise ProducerError(f"the broker did not take a batch: {exc!r}") from exc
        for _, where, count in sent:
            self._commit.per_partition[where] = self._commit.per_partition.get(where, 0) + count
            self._commit.records += count


class KafkaWriter(DataSourceArrowWriter):
    """Produces the rows of each Spark task and sums the counts on commit."""

    def __init__(self, options: KafkaWriteOptions, columns: _Columns) -> None:
        self.options = options
        self.columns = columns

    @classmethod
    def create(cls, options: Mapping[str, str], schema: StructType) -> KafkaWriter:
        """Validate the options and the rows' schema (on the driver side, before any task).

        Raises:
            ConfigError: when an option is missing or malformed, or a column is unusable.
        """
        parsed = KafkaWriteOptions.parse(options)
        return cls(parsed, _Columns.check(schema, topic_option=parsed.topic is not None))

    def write(self, iterator: Iterator[pa.RecordBatch]) -> KafkaWriteCommit:
        """Produce every row of one Spark task, wait for the acks, and report the counts.

        Raises:
            ProducerError: when the cluster cannot be reached or a record was not taken.
        """
        return asyncio.run(self._produce(iterator))

    async def _produce(self, batches: Iterable[pa.RecordBatch]) -> KafkaWriteCommit:
        opts = self.options
        config = ProducerConfig(
            opts.bootstrap_servers,
            idempotence=opts.idempotence,
            compression_type=opts.compression_type,
            linger_ms=opts.linger_ms,
            max_batch_bytes=opts.max_batch_bytes,
            request_timeout_ms=opts.request_timeout_ms,
            security=opts.security,
        )
        # The runtime's client start: acks=all, idempotence "auto" falling back where the
        # cluster refuses it, and the same errors.
        producer = await start_client(config, "decaton-aio-spark-sink")
        commit = KafkaWriteCommit()
        sender = _BatchSender(producer, commit)
        try:
            for batch in batches:
                for topic, value, key, partition, timestamp_ms, headers in self._records(batch):
                    if not topic:
                        raise ProducerError(
                            "a row has no topic: set the 'topic' option or fill the column"
                        )
                    header_list = [(h["key"], _encode(h["value"])) for h in headers or ()]
                    await sender.add(
                        topic, partition, _encode(key), _encode(value), timestamp_ms, header_list
                    )
            await sender.finish()
        finally:
            await producer.stop()
        return commit

    def _records(self, batch: pa.RecordBatch) -> Iterator[tuple[Any, ...]]:
        """(topic, value, key, partition, timestamp_ms, headers) of each row of a batch."""
        n = batch.num_rows
        cols = self.columns

        def column(name: str, present: bool) -> list[Any]:
            return batch.column(name).to_pylist() if present else [None] * n

        topics = column("topic", True) if cols.has_topic else [self.options.topic] * n
        timestamps = column("timestamp", cols.has_timestamp)
        if cols.has_timestamp and pa.types.is_timestamp(batch.column("timestamp").type):
            # Spark hands timestamps over as zone-aware datetimes.
            timestamps = [None if t is None else round(t.timestamp() * 1000) for t in timestamps]
        headers = column("headers", cols.has_headers)
        return zip(
            topics,
            column("value", True),
            column("key", cols.has_key),
            column("partition", cols.has_partition),
            timestamps,
            headers,
            strict=True,
        )

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Sum the tasks' counts; write the summary to ``summaryPath`` when set."""
        self._summarize(messages, committed=True)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Record what the successful tasks produced before a task failed."""
        self._summarize(messages, committed=False)

    def _summarize(self, messages: list[WriterCommitMessage | None], *, committed: bool) -> None:
        counts: dict[str, int] = {}
        tasks = 0
        for message in messages:
            if not isinstance(message, KafkaWriteCommit):
                continue  # a failed task sends no message
            tasks += 1
            for (topic, partition), n in message.per_partition.items():
                name = f"{topic}:{partition}"
                counts[name] = counts.get(name, 0) + n
        summary = WriteSummary(sum(counts.values()), dict(sorted(counts.items())), tasks, committed)
        if self.options.summary_path:
            _write_atomically(Path(self.options.summary_path), json.dumps(asdict(summary)))


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_topic(
    df: DataFrame,
    bootstrap_servers: str,
    topic: str | None,
    *,
    idempotence: Idempotence = "auto",
    compression_type: str | None = None,
    security: SecuritySettings = PLAINTEXT,
    oauth_token_provider: str | None = None,
    **options: str,
) -> WriteSummary:
    """Write ``df`` to a topic and return what the broker acknowledged.

    Blocking; callable from any thread: it makes ``df``'s session the calling thread's
    active one, where Spark looks the format up. The commit runs in a Spark worker, so its
    counts come back through a temporary summary file on the driver's machine.

    Args:
        df: rows with the columns described in the module docstring.
        bootstrap_servers: where the cluster is.
        topic: the target topic, or ``None`` to use each row's ``topic`` column.
        idempotence: ``"auto"`` (idempotent where the cluster grants it), ``True`` or
            ``False``.
        compression_type: ``"gzip"``, ``"snappy"``, ``"lz4"``, ``"zstd"`` or ``None``.
        security: TLS and SASL settings, passed on as ``kafka.*`` options.
        oauth_token_provider: ``MODULE:ATTR`` of an OAUTHBEARER token provider.
        options: further sink options, e.g. ``lingerMs="20"``.

    Raises:
        ConfigError: when an option or column is unusable (raised by Spark as its own
            exception type, with this message inside).
    """
    activate(df.sparkSession)
    with tempfile.TemporaryDirectory(prefix="decaton-kafka-write-") as tmp:
        summary_path = os.path.join(tmp, "summary.json")
        writer = (
            df.write.format(FORMAT)
            .mode("append")
            .option("bootstrap.servers", bootstrap_servers)
            .option("idempotence", str(idempotence).lower())  # "auto", "true" or "false"
            .option("summaryPath", summary_path)
        )
        if topic is not None:
            writer = writer.option("topic", topic)
        if compression_type is not None:
            writer = writer.option("compressionType", compression_type)
        secured = security_to_options(security, oauth_token_provider=oauth_token_provider)
        for name, value in {**secured, **options}.items():
            writer = writer.option(name, value)
        writer.save()
        return WriteSummary.load(summary_path)
