"""Retry backfill: send dead-lettered tasks back to be processed, each at most once.

This module owns the job that reads a dead letter topic (and, optionally, durable-producer
spool directories), decodes the failure headers the runtime wrote (``dt_dlq_*``), selects
records by error type, failure time and key, reports counts per error type, and produces the
selected tasks again: to their origin task topic (``dt_dlq_origin_topic``; the DLQ name
without ``-dlq`` when the header is missing), to ``--to-topic``, or to the origin's retry
topic (``--to-retry-topic``). A re-sent task keeps its key, body and other headers; its
``dt_meta`` keeps timestamp and source but gets retry count 0 and no scheduled time; the
``dt_dlq_*`` and ``dt_origin_*`` headers are dropped and ``dt_backfill_source`` (where the
record was read) and ``dt_backfill_run`` (the run id) are added.

Once only: every run appends what it sent to a ledger (``--ledger PATH``: a Parquet data
set, one ``run_id=...`` directory per run) and skips what an earlier run sent. A record is
known by its failure (origin topic, partition, offset and last failure time; where it was
read, ``<dlq topic>:<partition>:<offset>`` or ``spool:<entry id>``, when it has no failure
headers), so a dead letter found both in a spool and, after the spool was replayed, on the
topic is sent once, and a dead letter topic made again (its offsets from 0) is not taken
for what was sent before. The
ledger is written after the broker acknowledged the run's records: a crash in between sends
them again on the next run (at-least-once, like the rest of the runtime); run one backfill
per ledger at a time. ``--dry-run`` reads the ledger, sends nothing and writes no ledger.

Spools: lines of ``spool-*.jsonl`` and ``spool-*.rejected`` (see :mod:`decaton_aio.producer._spool`)
whose topic is the dead letter topic, i.e. dead letters the runtime could not deliver.
Unreadable lines are counted and skipped.

Here live the job's options, the selection of each record's outcome, the records sent and
the command line. Reading and decoding dead letters is :mod:`spark_jobs._dead_letters`,
the ledger :mod:`spark_jobs._ledger`, the report :mod:`spark_jobs._backfill_report`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

import msgspec
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType

from decaton_aio.errors import ConfigError, DecodeError
from decaton_aio.metadata import METADATA_HEADER, TaskMetadata, decode_metadata, encode_metadata
from decaton_aio.offsets import ISOLATION_LEVELS
from decaton_aio.producer import Idempotence
from decaton_aio.retry import DLQ_HEADERS, ORIGIN_HEADERS, SideTopics
from decaton_aio.security import PLAINTEXT, SecuritySettings

from ._backfill_report import BackfillReport, tally
from ._cli import (
    JobParser,
    UsageError,
    add_common_arguments,
    parse_instant,
    require_bootstrap,
    run_job,
)

# NO_ERROR_TYPE and LEDGER_SCHEMA are re-exported: they were defined here before the split.
from ._dead_letters import NO_ERROR_TYPE as NO_ERROR_TYPE
from ._dead_letters import decode_failures, header, read_dead_letters
from ._ledger import LEDGER_SCHEMA as LEDGER_SCHEMA
from ._ledger import append_run, known_ids
from .kafka_io import write_topic

__all__ = [
    "BACKFILL_RUN_HEADER",
    "BACKFILL_SOURCE_HEADER",
    "BackfillFilter",
    "BackfillOptions",
    "BackfillReport",
    "build_parser",
    "main",
    "reset_metadata",
    "run_backfill",
]

APPLICATION_ID: Final = "decaton-aio-retry-backfill"
BACKFILL_SOURCE_HEADER: Final = "dt_backfill_source"
"""Added to a re-sent task: where its dead letter was read."""
BACKFILL_RUN_HEADER: Final = "dt_backfill_run"
"""Added to a re-sent task: the id of the run that sent it."""

_STRIPPED: Final = sorted(
    {*DLQ_HEADERS, *ORIGIN_HEADERS, METADATA_HEADER, BACKFILL_SOURCE_HEADER, BACKFILL_RUN_HEADER}
)


@dataclass(frozen=True)
class BackfillFilter:
    """Which dead letters to send (all of them when every field is empty).

    Attributes:
        error_types: ``dt_dlq_error_type`` values; ``T`` also selects ``T:<detail>`` (so
            ``DecodeError`` selects ``DecodeError:body``).
        since_ms: failures at or after this epoch ms.
        until_ms: failures before this epoch ms.
        time_field: which failure time the range applies to: ``last`` or ``first``.
        key_regex: a Java regular expression searched in the UTF-8 key (``^...$`` to
            match the whole key); records without a key never match.
    """

    error_types: tuple[str, ...] = ()
    since_ms: int | None = None
    until_ms: int | None = None
    time_field: Literal["last", "first"] = "last"
    key_regex: str | None = None

    def condition(self) -> Column:
        """The filter as a Spark condition over the decoded columns."""

        cond = F.lit(True)
        if self.error_types:
            error = F.col("error_type")
            any_type = F.lit(False)
            for name in self.error_types:
                any_type = any_type | (error == name) | error.startswith(f"{name}:")
            cond = cond & any_type
        when = F.col(f"{self.time_field}_failure_ms")
        if self.since_ms is not None:
            cond = cond & (when >= self.since_ms)
        if self.until_ms is not None:
            cond = cond & (when < self.until_ms)
        if self.key_regex is not None:
            cond = cond & F.col("key").cast("string").rlike(self.key_regex)
        return F.coalesce(cond, F.lit(False))  # a missing time or key does not match


@dataclass(frozen=True)
class BackfillOptions:
    """What one run does (the command line's options, as values).

    Attributes:
        bootstrap_servers: the Kafka cluster.
        dlq_topic: the dead letter topic to read.
        ledger: the ledger data set; ``None`` only for a dry run.
        filters: which dead letters to send.
        spool_dirs: durable-producer spool directories to read as well.
        to_topic: send everything here instead of the origin topics.
        to_retry_topic: send to the origin's retry topic (``<origin>-retry``).
        dry_run: report only.
        idempotence: the producer's idempotence (``"auto"``, ``True`` or ``False``).
        compression_type: the codec of produced batches, or ``None``.
        side_topics: the runtime's side topic suffixes.
        show: how many selected records the report lists.
        isolation_level: how the dead letter topic is read (``read_committed``, the
            default, skips records of aborted transactions).
        security: TLS and SASL settings of every Kafka client of the run.
        kafka_extra: Kafka client properties for Spark's connector (``--kafka-properties``).
    """

    bootstrap_servers: str
    dlq_topic: str
    ledger: str | None
    filters: BackfillFilter = field(default_factory=BackfillFilter)
    spool_dirs: tuple[str, ...] = ()
    to_topic: str | None = None
    to_retry_topic: bool = False
    dry_run: bool = False
    idempotence: Idempotence = "auto"
    compression_type: str | None = None
    side_topics: SideTopics = field(default_factory=SideTopics)
    show: int = 5
    isolation_level: str = "read_committed"
    security: SecuritySettings = PLAINTEXT
    kafka_extra: Mapping[str, str] = field(default_factory=dict)


def reset_metadata(raw: bytes | None, timestamp_ms: int | None) -> bytes:
    """The ``dt_meta`` of a re-sent task: retry count 0, no scheduled time.

    Timestamp and source are kept; a missing or malformed header becomes fresh metadata
    stamped with the record's timestamp.
    """
    meta = None
    if raw is not None:
        try:
            meta = decode_metadata(bytes(raw))
        except DecodeError:
            meta = None
    if meta is None:
        now_ms = time.time_ns() // 1_000_000
        meta = TaskMetadata(timestamp_ms or now_ms, source_application_id=APPLICATION_ID)
    return encode_metadata(msgspec.structs.replace(meta, retry_count=0, scheduled_time_ms=0))


# --------------------------------------------------------------------------- selecting


def _classify(spark: SparkSession, options: BackfillOptions, df: DataFrame) -> DataFrame:
    """Add ``target`` and ``status`` (one of the outcomes counted in the report)."""
    ids = known_ids(spark, options.ledger)
    if ids is None:
        known = F.lit(False)
    else:
        # By failure: a record read again (or its spool copy) has the same one; where it
        # was read does not tell (a dead letter topic made again starts at offset 0).
        by_failure = ids.select(F.col("id").alias("_by_failure"))
        df = df.join(by_failure, df.failure_id == by_failure._by_failure, "left")
        known = F.col("_by_failure").isNotNull()
    if options.to_topic is not None:
        target = F.lit(options.to_topic)
    elif options.to_retry_topic:
        target = F.concat("origin_topic", F.lit(options.side_topics.retry))
    else:
        target = F.col("origin_topic")
    # The same failure read twice (a spool entry the replayer also delivered): the topic's
    # copy wins.
    first = Window.partitionBy("failure_id").orderBy(F.col("source") != "dlq", "source_id")
    status = (
        F.when(~F.col("readable"), "unreadable")
        .when(F.col("entry_topic") != options.dlq_topic, "other_topic")
        .when(~options.filters.condition(), "filtered_out")
        .when(known, "already_backfilled")
        .when(F.row_number().over(first) > 1, "duplicate")
        .when(target.isNull(), "no_target")
        .otherwise("selected")
    )
    return df.select(
        *(c for c in df.columns if not c.startswith("_by_")),
        target.alias("target"),
        status.alias("status"),
    )


def _outgoing(selected: DataFrame, run_id: str) -> DataFrame:
    """The records to produce: ``topic, key, value, headers``."""
    reset = F.udf(reset_metadata, BinaryType(), useArrow=False)
    kept = F.filter("headers", lambda h: ~h.key.isin(_STRIPPED))

    def added_header(name: str, value: Column) -> Column:
        return F.struct(F.lit(name).alias("key"), value.alias("value"))

    added = F.array(
        added_header(METADATA_HEADER, reset(header(METADATA_HEADER, text=False), "timestamp")),
        added_header(BACKFILL_SOURCE_HEADER, F.encode("source_id", "UTF-8")),
        added_header(BACKFILL_RUN_HEADER, F.lit(bytearray(run_id.encode()))),
    )
    return selected.select(
        F.col("target").alias("topic"), "key", "value", F.concat(kept, added).alias("headers")
    )


# --------------------------------------------------------------------------- the run


def run_backfill(spark: SparkSession, options: BackfillOptions) -> BackfillReport:
    """Read, classify, report, and (unless a dry run) send and record the selection.

    Raises:
        ConfigError: when the dead letter topic does not exist or an option is unusable.
        BrokerError: when the cluster cannot be reached.
        ProducerError: when the broker does not take the records (raised by Spark as its
            own exception type, with this message inside).
    """
    if not options.dry_run and options.ledger is None:
        raise ConfigError("a ledger is required to send (or use a dry run)")
    started = time.monotonic()
    now = dt.datetime.now(dt.UTC)
    run_id = f"{now:%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:8]}"
    records = read_dead_letters(
        spark,
        options.bootstrap_servers,
        options.dlq_topic,
        options.spool_dirs,
        isolation_level=options.isolation_level,
        security=options.security,
        kafka_extra=options.kafka_extra,
    )
    decoded = decode_failures(records, options.dlq_topic, options.side_topics)
    classified = _classify(spark, options, decoded)
    classified = classified.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        report = BackfillReport(options.dlq_topic, run_id, options.dry_run, ledger=options.ledger)
        tally(report, classified.groupBy("source", "error_type", "status").count().collect())
        selected = classified.where(F.col("status") == "selected")
        sample = selected.orderBy("source", "source_id").limit(options.show).collect()
        report.sample = [
            {
                "source_id": r.source_id,
                "key": None if r.key is None else bytes(r.key).decode(errors="replace"),
                "error_type": r.error_type,
                "target": r.target,
            }
            for r in sample
        ]
        if report.selected and not options.dry_run:
            assert options.ledger is not None
            written = write_topic(
                _outgoing(selected, run_id),
                options.bootstrap_servers,
                None,
                idempotence=options.idempotence,
                compression_type=options.compression_type,
                security=options.security,
                extra=options.kafka_extra,
            )
            report.sent, report.per_partition = written.records, written.per_partition
            # Only after every record was acknowledged: a crash before this line re-sends
            # the run's records next time rather than losing them.
            append_run(selected, options.ledger, run_id, int(now.timestamp() * 1000))
            report.ledger_entries = report.selected
    finally:
        classified.unpersist()
    report.seconds = time.monotonic() - started
    return report


# --------------------------------------------------------------------------- command line


def build_parser() -> JobParser:
    """The job's command line."""
    parser = JobParser(
        prog="retry_backfill",
        description="Send dead-lettered tasks back to their task topic (or retry topic) with "
        "a reset retry count, once: a ledger remembers what was sent.",
    )
    add_common_arguments(parser)
    parser.add_argument(
        "--dlq-topic", required=True, metavar="TOPIC", help="the dead letter topic to read"
    )
    parser.add_argument(
        "--ledger", metavar="PATH", help="ledger of sent records (required unless --dry-run)"
    )
    parser.add_argument(
        "--spool-dir", action="append", default=[], metavar="DIR",
        help="also read dead letters from this durable-producer spool (repeatable)",
    )  # fmt: skip
    parser.add_argument(
        "--error-type", action="append", default=[], metavar="TYPE",
        help="only this dt_dlq_error_type; TYPE also selects TYPE:<detail> (repeatable)",
    )  # fmt: skip
    parser.add_argument("--since", metavar="TIME", help="failures at/after: epoch ms or ISO 8601")
    parser.add_argument("--until", metavar="TIME", help="failures before: epoch ms or ISO 8601")
    parser.add_argument(
        "--time-field", choices=("last", "first"), default="last",
        help="which failure time --since/--until apply to (default: last)",
    )  # fmt: skip
    parser.add_argument("--key-regex", metavar="RE", help="keys containing a match (Java regex)")
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--to-topic", metavar="TOPIC", help="send here, not to the origin topic")
    target.add_argument(
        "--to-retry-topic", action="store_true", help="send to the origin's retry topic"
    )
    parser.add_argument("--show", type=int, default=5, metavar="N", help="list N selected records")
    parser.add_argument(
        "--isolation-level", choices=ISOLATION_LEVELS, default="read_committed",
        help="read_committed (default): skip dead letters of aborted transactions, which an "
        "exactly-once application leaves beside the copy its task's next run wrote",
    )  # fmt: skip
    return parser


def _options(args: argparse.Namespace) -> BackfillOptions:
    require_bootstrap(args)
    if not args.dry_run and not args.ledger:
        raise UsageError("--ledger PATH is required to send (it keeps re-runs from sending twice); "
                         "use --dry-run to only report")  # fmt: skip
    since = None if args.since is None else parse_instant(args.since, "--since")
    until = None if args.until is None else parse_instant(args.until, "--until")
    if since is not None and until is not None and since >= until:
        raise UsageError(f"--since ({args.since}) must be before --until ({args.until})")
    if args.key_regex is not None:
        try:
            re.compile(args.key_regex)
        except re.error as exc:
            raise UsageError(
                f"--key-regex {args.key_regex!r} is not a regular expression: {exc}"
            ) from None
    for directory in args.spool_dir:
        if not os.path.isdir(directory):
            raise UsageError(f"--spool-dir {directory}: no such directory")
    if args.show < 0:
        raise UsageError(f"--show must be >= 0, got {args.show}")
    return BackfillOptions(
        bootstrap_servers=args.bootstrap_servers,
        dlq_topic=args.dlq_topic,
        ledger=args.ledger,
        filters=BackfillFilter(
            tuple(args.error_type), since, until, args.time_field, args.key_regex
        ),
        spool_dirs=tuple(args.spool_dir),
        to_topic=args.to_topic,
        to_retry_topic=args.to_retry_topic,
        dry_run=args.dry_run,
        idempotence=args.idempotence,
        compression_type=args.compression_type,
        show=args.show,
        isolation_level=args.isolation_level,
        security=args.security,
        kafka_extra=args.kafka_extra,
    )


def main(argv: list[str] | None = None, *, spark: SparkSession | None = None) -> int:
    """Run the job from the command line; returns the exit code.

    Args:
        argv: the arguments; ``sys.argv[1:]`` when omitted.
        spark: a running session to use (left running); by default the job starts one.
    """
    return run_job(
        "retry_backfill",
        build_parser(),
        lambda spark, args: run_backfill(spark, _options(args)),
        argv,
        check=_options,
        spark=spark,
    )


if __name__ == "__main__":
    sys.exit(main())
