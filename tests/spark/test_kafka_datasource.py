"""The ``decaton_kafka`` Spark format: read back exactly what was produced, write then read.

Spark calls block, so the async tests run them in a thread and keep their event loop (and
the fixtures' producers on it) free.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import murmur2

from decaton_aio.errors import ConfigError
from decaton_aio.metadata import METADATA_HEADER, TaskMetadata, encode_metadata
from decaton_aio.testing import BrokerHandle, recent_timestamp_ms

pytest.importorskip("pyspark", reason="PySpark is not installed: pip install -e '.[spark]'")

from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, Row, SparkSession

from spark_jobs.kafka_sink import WriteSummary, write_topic
from spark_jobs.kafka_source import (
    EARLIEST,
    LATEST,
    KafkaReadOptions,
    PartitionExtent,
    high_watermarks,
    parse_offsets,
    plan_partitions,
    read_topic,
)

pytestmark = pytest.mark.spark

T = TypeVar("T")

# Record and failure times stay inside the broker's time retention.
BASE_MS = recent_timestamp_ms()
PER_PARTITION = {0: 30, 1: 20, 2: 10}
# Extra records with their own headers, produced to partition 1 after the tasks.
EXTRA_HEADERS = [("trace", b"\x00\x01"), ("trace", b"dup"), ("empty", b"")]


@dataclass(frozen=True)
class Expected:
    """One produced record, as a read should return it."""

    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]


async def in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a blocking Spark call off the event loop."""
    return await asyncio.to_thread(fn, *args, **kwargs)


def in_new_thread(fn: Callable[[], T]) -> T:
    """Run ``fn`` in a thread of its own, where no Spark call ran before (blocking).

    ``asyncio.to_thread`` reuses its pool's threads, and an earlier Spark call there (such
    as ``createDataFrame``) may have made the session the thread's active one already.
    """
    outcome: list[tuple[bool, Any]] = []

    def target() -> None:
        try:
            outcome.append((True, fn()))
        except BaseException as exc:  # handed to the caller
            outcome.append((False, exc))

    thread = threading.Thread(target=target, name="spark-caller")
    thread.start()
    thread.join()
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


def rows_of(df: DataFrame) -> list[Row]:
    """Collect a read, ordered by partition and offset."""
    return sorted(df.collect(), key=lambda r: (r.partition, r.offset))


def as_expected(row: Row) -> Expected:
    """A read row in the shape of :class:`Expected`."""
    headers = [(h.key, bytes(h.value)) for h in row.headers]
    key = None if row.key is None else bytes(row.key)
    value = None if row.value is None else bytes(row.value)
    return Expected(row.partition, row.offset, row.timestamp, key, value, headers)


async def produce_known_records(
    kafka_broker: BrokerHandle, topic_factory: Any, task_producer: Any
) -> tuple[str, list[Expected]]:
    """Fill a fresh 3-partition topic with tasks (dt_meta header) and a few raw records.

    Partition p gets PER_PARTITION[p] tasks keyed ``key-<p>-<i>``; partition 1 then gets a
    record with duplicate and empty headers and no key, and a tombstone.
    """
    topic = await topic_factory(partitions=3)
    producer = await task_producer(topic, application_id="spark-test")
    expected: list[Expected] = []
    futures = []
    for partition, count in PER_PARTITION.items():
        for i in range(count):
            ts = BASE_MS + partition * 1000 + i
            key, value = f"key-{partition}-{i}".encode(), f"value-{partition}-{i}".encode()
            meta = TaskMetadata(ts, "spark-test", producer.config.instance_id)
            header = (METADATA_HEADER, encode_metadata(meta))
            expected.append(Expected(partition, i, ts, key, value, [header]))
            futures.append(await producer.submit(key, value, timestamp_ms=ts, partition=partition))
    await asyncio.gather(*futures)

    raw = AIOKafkaProducer(
        bootstrap_servers=kafka_broker.bootstrap_servers,
        acks="all",
        enable_idempotence=kafka_broker.supports_idempotence,
    )
    await raw.start()
    try:
        offset = PER_PARTITION[1]
        await raw.send_and_wait(
            topic, b"raw", partition=1, timestamp_ms=BASE_MS + 5000, headers=EXTRA_HEADERS
        )
        expected.append(Expected(1, offset, BASE_MS + 5000, None, b"raw", EXTRA_HEADERS))
        await raw.send_and_wait(topic, None, key=b"gone", partition=1, timestamp_ms=BASE_MS + 6000)
        expected.append(Expected(1, offset + 1, BASE_MS + 6000, b"gone", None, []))
    finally:
        await raw.stop()
    return topic, expected


# --------------------------------------------------------------------------- reading


@pytest.mark.integration
async def test_read_returns_every_record_with_its_headers(
    spark: SparkSession, kafka_broker, topic_factory, task_producer
) -> None:
    """A default read returns every record of every partition, byte for byte.

    One Spark partition per Kafka partition; exact counts per partition; keys, values,
    timestamps (ms), offsets and headers (dt_meta bytes, duplicates, empty values, in
    order) as produced; a tombstone keeps its null value.
    """
    topic, expected = await produce_known_records(kafka_broker, topic_factory, task_producer)

    def read() -> tuple[int, list[Row]]:
        df = read_topic(spark, kafka_broker.bootstrap_servers, topic)
        return df.rdd.getNumPartitions(), rows_of(df)

    spark_partitions, rows = await in_thread(read)

    assert spark_partitions == 3
    counts = {p: sum(1 for r in rows if r.partition == p) for p in range(3)}
    assert counts == {0: 30, 1: 22, 2: 10}
    assert {r.topic for r in rows} == {topic}
    assert [as_expected(r) for r in rows] == sorted(expected, key=lambda e: (e.partition, e.offset))


@pytest.mark.integration
async def test_offsets_options_select_a_slice(
    spark: SparkSession, kafka_broker, topic_factory, task_producer
) -> None:
    """startingOffsets and endingOffsets select [start, end) per partition.

    Partition 0 reads 5..11, partition 1 reads 0..3, partition 2 (end past the end) reads
    to its end; "latest" as the start reads nothing.
    """
    topic, _ = await produce_known_records(kafka_broker, topic_factory, task_producer)
    bootstrap = kafka_broker.bootstrap_servers

    def read() -> tuple[list[Row], list[Row]]:
        sliced = read_topic(
            spark,
            bootstrap,
            topic,
            starting_offsets='{"0": 5, "1": "earliest"}',
            ending_offsets={0: 12, 1: 4, 2: 999},
        )
        nothing = read_topic(spark, bootstrap, topic, starting_offsets="latest")
        return rows_of(sliced), nothing.collect()

    sliced, nothing = await in_thread(read)

    got = [(r.partition, r.offset) for r in sliced]
    want = [(0, o) for o in range(5, 12)] + [(1, o) for o in range(4)] + [(2, o) for o in range(10)]
    assert got == want
    assert [bytes(r.key) for r in sliced[:2]] == [b"key-0-5", b"key-0-6"]
    assert nothing == []


@pytest.mark.integration
async def test_pinned_end_offsets_give_the_same_snapshot(
    spark: SparkSession, kafka_broker, topic_factory, task_producer
) -> None:
    """high_watermarks() pins the end: records produced afterwards are not read.

    A read without endingOffsets sees everything; empty partitions read as nothing.
    """
    topic = await topic_factory(partitions=3)
    producer = await task_producer(topic)
    for i in range(15):
        await producer.put(f"k{i}", b"before", partition=0)
    pinned = await in_thread(high_watermarks, kafka_broker.bootstrap_servers, topic)
    assert pinned == {0: 15, 1: 0, 2: 0}
    for i in range(5):
        await producer.put(f"k{i}", b"after", partition=0)

    def read() -> tuple[list[Row], list[Row]]:
        bootstrap = kafka_broker.bootstrap_servers
        snapshot = read_topic(spark, bootstrap, topic, ending_offsets=json.dumps(pinned))
        return snapshot.collect(), read_topic(spark, bootstrap, topic).collect()

    snapshot, everything = await in_thread(read)

    assert sorted(r.offset for r in snapshot) == list(range(15))
    assert {bytes(r.value) for r in snapshot} == {b"before"}
    assert len(everything) == 20


# --------------------------------------------------------------------------- writing


def kafka_partition(key: bytes, partitions: int) -> int:
    """The partition Kafka's Java producer picks for a key: murmur2, positive, modulo."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


@pytest.mark.integration
async def test_write_then_read_round_trip(spark: SparkSession, kafka_broker, topic_factory) -> None:
    """Rows written to a fresh topic read back with the same keys, values and headers.

    An explicit partition is kept; otherwise the key picks the partition as Kafka's Java
    producer does; timestamps are kept; the summary counts every record per partition.
    A second write takes string columns (UTF-8), a Spark timestamp and a topic column.
    """
    topic = await topic_factory(partitions=3)
    bootstrap = kafka_broker.bootstrap_servers
    rows = []
    for i in range(60):
        headers = [("n", str(i).encode()), ("n", b"again")] if i % 2 else []
        partition = 2 if i % 10 == 0 else None
        key = None if i % 15 == 7 else f"user-{i % 6}".encode()
        rows.append((key, f"v{i}".encode(), headers, partition, BASE_MS + i))
    when = dt.datetime(2024, 5, 6, 7, 8, 9, 123000, tzinfo=dt.UTC)

    def write_and_read() -> tuple[WriteSummary, WriteSummary, list[Row]]:
        df = spark.createDataFrame(
            rows,
            "key binary, value binary, headers array<struct<key: string, value: binary>>, "
            "partition int, timestamp long",
        ).repartition(2)
        summary = write_topic(df, bootstrap, topic)
        text = spark.createDataFrame(
            [("s-key", "s-value", when, topic)],
            "key string, value string, timestamp timestamp, topic string",
        )
        text_summary = write_topic(text, bootstrap, None)
        return summary, text_summary, read_topic(spark, bootstrap, topic).collect()

    summary, text_summary, read = await in_thread(write_and_read)

    assert (summary.committed, summary.records, summary.tasks) == (True, 60, 2)
    assert (text_summary.committed, text_summary.records) == (True, 1)
    counted = Counter(summary.per_partition) + Counter(text_summary.per_partition)
    stored = [(r.partition, bytes(r.value)) for r in read]
    if kafka_broker.flavor == "tansu":
        # Tansu refuses idempotent producers: a retried send can store a record twice.
        stored = list(set(stored))
    assert counted == Counter(f"{topic}:{partition}" for partition, _ in stored)

    got = {bytes(r.value): r for r in read}
    assert len(got) == 61
    for key, value, headers, partition, ts in rows:
        row = got[value]
        assert (None if row.key is None else bytes(row.key)) == key
        assert [(h.key, bytes(h.value)) for h in row.headers] == headers
        assert row.timestamp == ts
        if partition is not None:
            assert row.partition == partition
        elif key is not None:
            assert row.partition == kafka_partition(key, 3)
    text_row = got[b"s-value"]
    assert bytes(text_row.key) == b"s-key"
    assert text_row.timestamp == int(when.timestamp() * 1000)
    assert text_row.partition == kafka_partition(b"s-key", 3)


@pytest.mark.integration
async def test_write_and_read_from_a_thread_that_never_used_spark(
    spark: SparkSession, kafka_broker, topic_factory
) -> None:
    """write_topic and read_topic work from any thread, not only the session's.

    Spark looks a Python data source up in the calling thread's active session; the rows
    are built in one thread, written from a new thread and read back from another new
    thread, so neither call may rely on an earlier call having activated the session.
    """
    topic = await topic_factory(partitions=2)
    bootstrap = kafka_broker.bootstrap_servers
    rows = [(f"k{i}".encode(), f"v{i}".encode()) for i in range(10)]
    df = await in_thread(spark.createDataFrame, rows, "key binary, value binary")

    def write() -> WriteSummary:
        return write_topic(df, bootstrap, topic)

    def read() -> list[Row]:
        return read_topic(spark, bootstrap, topic).collect()

    summary = await in_thread(in_new_thread, write)
    read_back = await in_thread(in_new_thread, read)

    assert (summary.committed, summary.records) == (True, 10)
    assert sorted((bytes(r.key), bytes(r.value)) for r in read_back) == rows


# --------------------------------------------------------------------------- bad options


GOOD = {"bootstrap.servers": "h:1", "topic": "t"}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"bootstrap.servers": "h:1"}, "option 'topic' is required"),
        ({"topic": "t"}, "option 'bootstrap.servers' is required"),
        ({**GOOD, "startingOffsets": "{0: 5}"}, "must be 'earliest', 'latest' or a JSON object"),
        ({**GOOD, "startingOffsets": "[5]"}, "must be a JSON object"),
        ({**GOOD, "startingOffsets": '{"x": 5}'}, "'x' is not a partition number"),
        ({**GOOD, "endingOffsets": '{"0": -7}'}, "partition 0 has -7"),
        ({**GOOD, "endingOffsets": '{"0": true}'}, "partition 0 has True"),
        ({**GOOD, "endingOffsets": "earliest"}, "cannot be 'earliest'"),
        (
            {**GOOD, "startingOffsets": '{"0": 9}', "endingOffsets": '{"0": 3}'},
            "startingOffsets 9 is after endingOffsets 3",
        ),
        ({**GOOD, "maxPollRecords": "many"}, "'maxPollRecords' must be an integer"),
        ({**GOOD, "pollTimeoutMs": "0"}, "'pollTimeoutMs' must be >= 1"),
    ],
)
def test_bad_read_options_are_rejected(options: dict[str, str], message: str) -> None:
    """Each malformed read option is refused with a message naming the problem."""
    with pytest.raises(ConfigError, match=message):
        KafkaReadOptions.parse(options)


def test_offsets_words_and_json() -> None:
    """Offsets parse from the words, JSON numbers and JSON words, -2/-1 as in Spark."""
    assert parse_offsets(None, "o", default=LATEST) == (LATEST, {})
    assert parse_offsets("Earliest", "o", default=LATEST) == (EARLIEST, {})
    assert parse_offsets('{"0": 5, "2": "latest", "3": -2}', "o", default=LATEST) == (
        LATEST,
        {0: 5, 2: LATEST, 3: EARLIEST},
    )


def test_plan_clamps_to_the_log() -> None:
    """Planning keeps each slice inside [log start, high watermark] and names partitions.

    A start below the log start (records removed by retention) moves up to it, an end past
    the high watermark stops there, "latest" as start gives an empty slice, and offsets
    naming a partition the topic lacks are refused.
    """
    extents = {0: PartitionExtent(10, 50), 1: PartitionExtent(0, 7), 2: PartitionExtent(3, 3)}
    options = KafkaReadOptions.parse(
        {**GOOD, "startingOffsets": '{"0": 2, "1": "latest"}', "endingOffsets": '{"0": 99}'}
    )
    planned = plan_partitions(options, extents)
    assert [(p.partition, p.start, p.end) for p in planned] == [(0, 10, 50), (1, 7, 7), (2, 3, 3)]

    with pytest.raises(ConfigError, match=r"offsets name partitions \[5\]"):
        plan_partitions(KafkaReadOptions.parse({**GOOD, "endingOffsets": '{"5": 1}'}), extents)


@pytest.mark.integration
async def test_bad_options_through_spark_say_what_is_wrong(
    spark: SparkSession, kafka_broker, topic_factory
) -> None:
    """Through Spark, a bad option fails the read or write with the option's message.

    Missing topic, bad offsets JSON, offsets naming a partition the topic lacks, an
    overwrite write and rows without a value column.
    """
    topic = await topic_factory(partitions=3)
    bootstrap = kafka_broker.bootstrap_servers

    def no_topic() -> None:
        spark.read.format("decaton_kafka").option("bootstrap.servers", bootstrap).load().collect()

    def bad_json() -> None:
        read_topic(spark, bootstrap, topic, starting_offsets="{0: 1}").collect()

    def unknown_partition() -> None:
        read_topic(spark, bootstrap, topic, ending_offsets={7: 1}).collect()

    def overwrite() -> None:
        df = spark.createDataFrame([(b"v",)], "value binary")
        df.write.format("decaton_kafka").option("bootstrap.servers", bootstrap).option(
            "topic", topic
        ).mode("overwrite").save()

    def no_value() -> None:
        write_topic(spark.createDataFrame([(b"k",)], "key binary"), bootstrap, topic)

    cases = [
        (no_topic, "option 'topic' is required"),
        (bad_json, "'startingOffsets' must be 'earliest', 'latest' or a JSON object"),
        (unknown_partition, r"offsets name partitions \[7\] but topic"),
        (overwrite, r"only appends to a topic: use \.mode\('append'\)"),
        (no_value, "needs a 'value' column"),
    ]
    for call, message in cases:
        with pytest.raises(PySparkException, match=message):
            await in_thread(call)
