"""Retry backfill: the filter selects exactly the expected dead letters, each is sent
once, a dry run sends nothing, spools are read, and the sent tasks are processed again.

Spark calls block, so the async tests run them in a thread and keep their event loop free.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiokafka import AIOKafkaProducer

from decaton_aio import Application, JsonSerializer, ProcessingContext
from decaton_aio.backoff import RetryPolicy
from decaton_aio.metadata import (
    METADATA_HEADER,
    TaskMetadata,
    decode_metadata,
    encode_metadata,
)
from decaton_aio.offsets import partition_extents
from decaton_aio.producer import SpoolEntry
from decaton_aio.retry import RetryConfig, dead_letter_headers
from decaton_aio.testing import BrokerHandle, drain, read_records, recent_timestamp_ms

pytest.importorskip("pyspark", reason="PySpark is not installed: pip install -e '.[spark]'")

from pyspark.sql import SparkSession

from spark_jobs._ledger import append_run, known_ids
from spark_jobs.retry_backfill import (
    BackfillFilter,
    BackfillOptions,
    BackfillReport,
    main,
    run_backfill,
)

pytestmark = pytest.mark.spark

# Record and failure times stay inside the broker's time retention.
BASE_MS = recent_timestamp_ms()
# (key, error type, seconds after BASE_MS of the last failure)
DEAD_LETTERS = [
    *[(f"user-{i}", "TimeoutError", i) for i in range(12)],
    *[(f"user-{i}", "ValueError", i) for i in range(12, 20)],
    *[(f"user-{i}", "DecodeError:body", i) for i in (1, 2, 30, 31)],
]
ORIGINAL_META = TaskMetadata(BASE_MS - 5000, "shop", "shop-1", retry_count=2, scheduled_time_ms=7)


def dlq_headers(origin: str, index: int, error_type: str, second: int) -> list[tuple[str, bytes]]:
    """What the runtime writes for a task of ``origin`` that failed for good."""
    return dead_letter_headers(
        [(METADATA_HEADER, encode_metadata(ORIGINAL_META)), ("trace", b"t-1")],
        error_type=error_type,
        message="it failed",
        exc=None,
        topic=origin,
        partition=index % 3,
        offset=index,
        attempts=3,
        timestamp_ms=ORIGINAL_META.timestamp_ms,
        now_ms=BASE_MS + second * 1000,
    )


async def fill_dead_letters(broker: BrokerHandle, origin: str, dlq: str) -> None:
    """DEAD_LETTERS in order, then one record without any dead letter header."""
    producer = AIOKafkaProducer(
        bootstrap_servers=broker.bootstrap_servers, enable_idempotence=broker.supports_idempotence
    )
    await producer.start()
    try:
        for index, (key, error_type, second) in enumerate(DEAD_LETTERS):
            headers = dlq_headers(origin, index, error_type, second)
            await producer.send_and_wait(
                dlq, f"body-{index}".encode(), key.encode(), headers=headers
            )
        await producer.send_and_wait(dlq, b"raw", key=b"user-5")
    finally:
        await producer.stop()


async def records_in(broker: BrokerHandle, topic: str) -> int:
    """How many records the topic holds."""
    extents = await partition_extents(broker.bootstrap_servers, topic)
    return sum(e.high_watermark for e in extents.values())


def counts(report: BackfillReport, error_type: str) -> tuple[int, ...]:
    """(total, selected, filtered out, sent before) of one error type."""
    c = report.by_error_type[error_type]
    return c["total"], c["selected"], c["filtered_out"], c["already_backfilled"]


@pytest.mark.integration
async def test_filter_selects_exactly_the_expected_records_and_reruns_send_nothing(
    spark: SparkSession, kafka_broker: BrokerHandle, topic_factory: Any, tmp_path: Path
) -> None:
    """Error types TimeoutError and DecodeError (which covers DecodeError:body), last
    failures in [2 s, 31 s), single-digit keys: exactly those 9 records go back to the
    origin topic with retry count 0, no schedule and no dead letter headers. The same run
    again sends nothing (ledger), and a dry run of everything sends nothing either."""
    origin = await topic_factory(partitions=3)
    dlq = await topic_factory(3, name=f"{origin}-dlq")
    await fill_dead_letters(kafka_broker, origin, dlq)
    ledger = tmp_path / "ledger"
    wanted = BackfillFilter(
        error_types=("TimeoutError", "DecodeError"),
        since_ms=BASE_MS + 2000,
        until_ms=BASE_MS + 31_000,
        key_regex=r"^user-\d$",
    )
    expected = {  # bodies are unique: body-<index>
        f"body-{index}".encode()
        for index, (key, error_type, second) in enumerate(DEAD_LETTERS)
        if error_type.split(":")[0] in ("TimeoutError", "DecodeError")
        and 2 <= second < 31
        and re.fullmatch(r"user-\d", key)
    }
    assert len(expected) == 9
    options = BackfillOptions(
        kafka_broker.bootstrap_servers,
        dlq,
        str(ledger),
        wanted,
    )

    first = await asyncio.to_thread(run_backfill, spark, options)

    assert (first.selected, first.sent, first.read) == (9, 9, {"dlq": 25})
    assert counts(first, "TimeoutError") == (12, 8, 4, 0)
    assert counts(first, "DecodeError:body") == (4, 1, 3, 0)
    assert counts(first, "ValueError") == (8, 0, 8, 0)
    assert counts(first, "(none)") == (1, 0, 1, 0)
    assert await records_in(kafka_broker, origin) == 9
    sent = await read_records(kafka_broker.bootstrap_servers, origin, 9)
    assert {r.value for r in sent} == expected
    for record in sent:
        headers = dict(record.headers)
        assert not [k for k in headers if k.startswith(("dt_dlq_", "dt_origin_"))]
        assert headers["trace"] == b"t-1"
        meta = decode_metadata(headers[METADATA_HEADER])
        assert meta == msgspec.structs.replace(ORIGINAL_META, retry_count=0, scheduled_time_ms=0)
        assert headers["dt_backfill_source"].decode().startswith(f"{dlq}:")
        assert headers["dt_backfill_run"].decode() == first.run_id

    again = await asyncio.to_thread(run_backfill, spark, options)

    assert (again.selected, again.sent) == (0, 0)
    assert counts(again, "TimeoutError") == (12, 0, 4, 8)
    assert await records_in(kafka_broker, origin) == 9
    assert [p.name for p in ledger.iterdir() if p.name.startswith("run_id=")] == [
        f"run_id={first.run_id}"
    ]

    summary = tmp_path / "dry.json"
    argv = ["--bootstrap-servers", kafka_broker.bootstrap_servers, "--dlq-topic", dlq]
    argv += ["--ledger", str(ledger), "--dry-run", "--summary-json", str(summary)]
    assert await asyncio.to_thread(main, argv, spark=spark) == 0
    dry = json.loads(summary.read_text())
    assert (dry["dry_run"], dry["selected"], dry["sent"]) == (True, 25 - 9, 0)
    assert dry["by_error_type"]["TimeoutError"]["already_backfilled"] == 8
    assert await records_in(kafka_broker, origin) == 9
    assert len([p for p in ledger.iterdir() if p.name.startswith("run_id=")]) == 1


class Job(msgspec.Struct):
    """A task of the runtime test."""

    n: int


def spool_line(topic: str, key: bytes, value: bytes, headers: list[tuple[str, bytes]]) -> bytes:
    """One spool line as the durable producer writes it."""
    return msgspec.json.encode(SpoolEntry.new(topic, value, key=key, headers=headers)) + b"\n"


@pytest.mark.integration
async def test_runtime_dead_letters_and_spools_go_to_the_retry_topic_and_run_again(
    spark: SparkSession, kafka_broker: BrokerHandle, topic_factory: Any, tmp_path: Path
) -> None:
    """Dead letters written by the runtime plus a spool (one entry the topic also holds,
    one only spooled, one for another topic, one torn line) are sent once each to the
    retry topic with retry count 0; the application then processes them."""
    bootstrap = kafka_broker.bootstrap_servers
    origin = await topic_factory(partitions=2)
    dlq = f"{origin}-dlq"
    serializer = JsonSerializer(Job)
    healed = False
    processed: list[int] = []

    async def process(ctx: ProcessingContext, job: Job) -> None:
        if job.n % 3 == 0 and not healed:
            raise ValueError(f"job {job.n} is broken")
        processed.append(job.n)

    app = Application(
        process,
        topics=(origin,),
        serializer=serializer,
        retry=RetryConfig(RetryPolicy(max_attempts=1)),
    )
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, enable_idempotence=kafka_broker.supports_idempotence
    )
    await producer.start()
    try:
        for n in range(10):
            await producer.send_and_wait(origin, serializer.encode(Job(n)), f"k{n}".encode())
    finally:
        await producer.stop()
    group = f"backfill-{uuid.uuid4().hex[:8]}"
    config = kafka_broker.producer_config()
    await drain(app, bootstrap, expected=10, group_id=group, producer=config)
    dead = await read_records(bootstrap, dlq, 4)
    assert sorted(r.key for r in dead) == [b"k0", b"k3", b"k6", b"k9"]

    spool = tmp_path / "spool"
    spool.mkdir()
    copy = dead[0]
    only_spooled = dlq_headers(origin, 99, "TimeoutError", 1)
    (spool / "spool-000000000001.jsonl").write_bytes(
        spool_line(dlq, copy.key, copy.value, list(copy.headers))
        + spool_line(dlq, b"k-spooled", serializer.encode(Job(100)), only_spooled)
        + spool_line(origin, b"k-task", serializer.encode(Job(101)), [])
        + b'{"v": 1, "id": "torn'
    )
    summary = tmp_path / "summary.json"
    argv = ["--bootstrap-servers", bootstrap, "--dlq-topic", dlq, "--spool-dir", str(spool)]
    argv += ["--to-retry-topic", "--ledger", str(tmp_path / "ledger")]
    argv += ["--summary-json", str(summary)]

    assert await asyncio.to_thread(main, argv, spark=spark) == 0

    report = json.loads(summary.read_text())
    assert report["read"] == {"dlq": 4, "spool": 4}
    assert (report["spool_unreadable"], report["spool_other_topics"]) == (1, 1)
    assert report["by_error_type"]["ValueError"]["duplicate"] == 1
    assert (report["selected"], report["sent"]) == (5, 5)
    retried = await read_records(bootstrap, f"{origin}-retry", 5)
    assert sorted(r.key for r in retried) == [b"k-spooled", b"k0", b"k3", b"k6", b"k9"]
    for record in retried:
        meta = decode_metadata(dict(record.headers)[METADATA_HEADER])
        assert (meta.retry_count, meta.scheduled_time_ms) == (0, 0)

    healed = True
    processed.clear()
    await drain(app, bootstrap, expected=5, group_id=group, producer=config)
    assert sorted(processed) == [0, 3, 6, 9, 100]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--dlq-topic", "d", "--dry-run"], "--bootstrap-servers is required"),
        (["--bootstrap-servers", "h:1", "--dlq-topic", "d"], "--ledger PATH is required"),
        (["--bootstrap-servers", "h:1", "--dry-run"], "required: --dlq-topic"),
        (
            ["--bootstrap-servers", "h:1", "--dlq-topic", "d", "--dry-run", "--since", "May"],
            "--since 'May' is neither epoch milliseconds nor an ISO 8601 time",
        ),
        (
            ["--bootstrap-servers", "h:1", "--dlq-topic", "d", "--dry-run", "--since",
             "2024-05-06T00:00:00Z", "--until", "1700000000000"],
            "must be before --until",
        ),
        (
            ["--bootstrap-servers", "h:1", "--dlq-topic", "d", "--dry-run", "--key-regex", "("],
            "--key-regex '(' is not a regular expression",
        ),
        (
            ["--bootstrap-servers", "h:1", "--dlq-topic", "d", "--dry-run", "--spool-dir", "/no"],
            "--spool-dir /no: no such directory",
        ),
        (
            ["--bootstrap-servers", "h:1", "--dlq-topic", "d", "--dry-run", "--to-topic", "t",
             "--to-retry-topic"],
            "not allowed with argument",
        ),
        (
            ["--bootstrap-servers", "h:1", "--dlq-topic", "d", "--dry-run", "--summary-json",
             "/tmp"],
            "--summary-json /tmp is a directory: name a file",
        ),
    ],
)  # fmt: skip
def test_bad_arguments_give_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    """Each bad command line is refused before Spark starts, with one line on stderr."""
    monkeypatch.delenv("DECATON_AIO_BOOTSTRAP_SERVERS", raising=False)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert message in err


def test_a_ledger_named_with_a_scheme_is_read(spark: Any, tmp_path: Path) -> None:
    """A ledger path Spark resolves (a scheme, or none on YARN's default HDFS) is read:
    a path not on the driver's disk was taken as a ledger not written yet, so every run
    sent everything again."""
    ledger = f"file:{tmp_path / 'ledger'}"
    assert known_ids(spark, ledger) is None  # not written yet
    sent = spark.createDataFrame(
        [("d:0:7", "d:0:7:f1", "ValueError", "orders")],
        "source_id string, failure_id string, error_type string, target string",
    )
    append_run(sent, ledger, "run-1", 1_700_000_000_000)
    ids = known_ids(spark, ledger)
    assert ids is not None
    assert [row.id for row in ids.collect()] == ["d:0:7:f1"]
