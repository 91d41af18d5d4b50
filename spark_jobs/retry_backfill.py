"""Retry backfill (F24): send dead-lettered tasks back to be processed, each at most once.

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
known by where it was read (``<dlq topic>:<partition>:<offset>``, or ``spool:<entry id>``)
and by its failure (origin topic, partition, offset and last failure time), so a dead letter
found both in a spool and, after the spool was replayed, on the topic is sent once. The
ledger is written after the broker acknowledged the run's records: a crash in between sends
them again on the next run (at-least-once, like the rest of the runtime); run one backfill
per ledger at a time. ``--dry-run`` reads the ledger, sends nothing and writes no ledger.

Spools: lines of ``spool-*.jsonl`` and ``spool-*.rejected`` (see :mod:`decaton_aio.spool`)
whose topic is the dead letter topic, i.e. dead letters the runtime could not deliver.
Unreadable lines are counted and skipped.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import sys
import time
import uuid
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

if __package__ in (None, ""):  # spark-submit spark_jobs/retry_backfill.py: find the project
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import msgspec
from pyspark import StorageLevel
from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, Row, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType

from decaton_aio.errors import ConfigError, DecodeError
from decaton_aio.metadata import METADATA_HEADER, TaskMetadata, decode_metadata, encode_metadata
from decaton_aio.retry import DLQ_HEADERS, ORIGIN_HEADERS, SideTopics
from spark_jobs._cli import (
    JobParser,
    UsageError,
    activate,
    add_common_arguments,
    parse_instant,
    require_bootstrap,
    run_job,
    table,
)
from spark_jobs.kafka_sink import write_topic
from spark_jobs.kafka_source import high_watermarks, read_topic

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
NO_ERROR_TYPE: Final = "(none)"
"""The error type reported for a record without ``dt_dlq_error_type``."""

LEDGER_SCHEMA: Final = (
    "source_id string, failure_id string, error_type string, target_topic string, "
    "backfilled_at_ms long"
)
_STRIPPED: Final = sorted(
    {*DLQ_HEADERS, *ORIGIN_HEADERS, METADATA_HEADER, BACKFILL_SOURCE_HEADER, BACKFILL_RUN_HEADER}
)
_SPOOL_SCHEMA: Final = (
    "v int, id string, topic string, key_b64 string, value_b64 string, "
    "headers array<array<string>>, timestamp_ms long, spooled_at_ms long"
)
_SPOOL_PATTERNS: Final = ("spool-*.jsonl", "spool-*.rejected")
_COUNTED: Final = ("selected", "filtered_out", "already_backfilled", "duplicate", "no_target")
_TABLE_HEADER: Final = "error type|total|selected|filtered out|sent before|duplicate|no target"


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
        idempotence: the producer's idempotence (off for the embedded broker).
        side_topics: the runtime's side topic suffixes.
        show: how many selected records the report lists.
    """

    bootstrap_servers: str
    dlq_topic: str
    ledger: str | None
    filters: BackfillFilter = field(default_factory=BackfillFilter)
    spool_dirs: tuple[str, ...] = ()
    to_topic: str | None = None
    to_retry_topic: bool = False
    dry_run: bool = False
    idempotence: bool = True
    side_topics: SideTopics = field(default_factory=SideTopics)
    show: int = 5


@dataclass
class BackfillReport:
    """What a run read, selected and sent.

    Attributes:
        dlq_topic: the dead letter topic read.
        run_id: this run's id (its ledger directory and ``dt_backfill_run`` header).
        dry_run: nothing was sent or written.
        read: records read per source (``dlq``, ``spool``).
        spool_unreadable: spool lines that could not be parsed.
        spool_other_topics: spool entries for topics other than the dead letter topic.
        by_error_type: per error type, records by outcome: ``total``, ``selected``,
            ``filtered_out``, ``already_backfilled``, ``duplicate`` (the same failure read
            twice), ``no_target`` (no origin topic known).
        selected: records chosen to be sent.
        sent: records the broker acknowledged (0 in a dry run).
        per_partition: ``"<topic>:<partition>"`` -> records sent.
        ledger: the ledger path, or ``None``.
        ledger_entries: entries this run added to the ledger.
        sample: the first selected records.
        seconds: how long the run took.
    """

    dlq_topic: str
    run_id: str
    dry_run: bool
    read: dict[str, int] = field(default_factory=dict)
    spool_unreadable: int = 0
    spool_other_topics: int = 0
    by_error_type: dict[str, dict[str, int]] = field(default_factory=dict)
    selected: int = 0
    sent: int = 0
    per_partition: dict[str, int] = field(default_factory=dict)
    ledger: str | None = None
    ledger_entries: int = 0
    sample: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (``--summary-json``)."""
        return {"job": "retry_backfill", **asdict(self)}

    def render(self) -> str:
        """The report as the lines the job prints."""
        title = f"retry backfill of {self.dlq_topic}{' (dry run)' if self.dry_run else ''}"
        lines = [f"{title}: run {self.run_id}, {self.seconds:.1f}s"]
        read = ", ".join(f"{n} from the {s}" for s, n in sorted(self.read.items())) or "nothing"
        lines.append(f"  read        {read}")
        if self.spool_unreadable or self.spool_other_topics:
            lines.append(
                f"  spool       {self.spool_unreadable} unreadable lines skipped, "
                f"{self.spool_other_topics} entries for other topics ignored"
            )
        rows = [(name, c["total"], *(c[k] for k in _COUNTED))
                for name, c in sorted(self.by_error_type.items())]  # fmt: skip
        lines += table(_TABLE_HEADER.split("|"), rows)
        spread = ", ".join(f"{k}={n}" for k, n in sorted(self.per_partition.items()))
        verb = "would send" if self.dry_run else f"sent {self.sent}"
        lines.append(f"  selected    {self.selected}: {verb}{f' ({spread})' if spread else ''}")
        for row in self.sample:
            lines.append(
                f"    {row['source_id']} key={row['key']} {row['error_type']} -> {row['target']}"
            )
        if self.ledger is not None:
            added = "unchanged (dry run)" if self.dry_run else f"+{self.ledger_entries} entries"
            lines.append(f"  ledger      {self.ledger}: {added}")
        return "\n".join(lines)


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


# --------------------------------------------------------------------------- reading


def _read_topic(spark: SparkSession, options: BackfillOptions) -> DataFrame:

    # Pin the end offsets once: every action of the run then sees the same records.
    ends = high_watermarks(options.bootstrap_servers, options.dlq_topic)
    df = read_topic(spark, options.bootstrap_servers, options.dlq_topic, ending_offsets=ends)
    return df.select(
        F.lit("dlq").alias("source"),
        F.concat_ws(":", "topic", "partition", "offset").alias("source_id"),
        F.col("topic").alias("entry_topic"),
        F.lit(True).alias("readable"),
        "key",
        "value",
        "headers",
        "timestamp",
    )


def _read_spools(spark: SparkSession, dirs: tuple[str, ...]) -> DataFrame | None:
    files = sorted(
        str(p) for d in dirs for pattern in _SPOOL_PATTERNS for p in Path(d).glob(pattern)
    )
    if not files:
        return None
    lines = spark.read.text(files).where(F.trim("value") != "")
    e = F.from_json("value", _SPOOL_SCHEMA).alias("e")
    parsed = lines.select("value", e)
    readable = F.coalesce(
        F.col("e.id").isNotNull() & F.col("e.topic").isNotNull() & (F.col("e.v") == 1),
        F.lit(False),
    )
    headers = F.transform(
        F.coalesce("e.headers", F.array().cast("array<array<string>>")),
        lambda h: F.struct(h[0].alias("key"), F.unbase64(h[1]).alias("value")),
    )
    return parsed.select(
        F.lit("spool").alias("source"),
        F.when(readable, F.concat(F.lit("spool:"), "e.id"))
        .otherwise(F.concat(F.lit("spool-unreadable:"), F.sha2("value", 256)))
        .alias("source_id"),
        F.col("e.topic").alias("entry_topic"),
        readable.alias("readable"),
        F.unbase64("e.key_b64").alias("key"),
        F.unbase64("e.value_b64").alias("value"),
        F.when(readable, headers).alias("headers"),
        F.coalesce("e.timestamp_ms", "e.spooled_at_ms").alias("timestamp"),
    )


def _header(name: str, *, text: bool = True) -> Column:
    # The last header of that name wins, as the runtime reads them.
    found = F.try_element_at(F.filter("headers", lambda h: h.key == name), F.lit(-1))
    value = found.getField("value")
    return value.cast("string") if text else value


def _decode(df: DataFrame, options: BackfillOptions) -> DataFrame:
    """Add the failure columns decoded from the ``dt_dlq_*`` headers."""
    sides = options.side_topics
    # The task topic: the origin header with a retry/shaping suffix removed, else the
    # dead letter topic's name without its suffix.
    side_suffix = f"({re.escape(sides.retry)}|{re.escape(sides.shaping)})$"
    origin = F.regexp_replace(_header("dt_dlq_origin_topic"), side_suffix, "")
    dlq = options.dlq_topic
    fallback = dlq[: -len(sides.dead_letter)] if dlq.endswith(sides.dead_letter) else None
    coordinates = [
        _header("dt_dlq_origin_topic"),
        _header("dt_dlq_origin_partition"),
        _header("dt_dlq_origin_offset"),
        _header("dt_dlq_last_failure_ms"),
    ]
    present = coordinates[0].isNotNull()
    for column in coordinates[1:]:
        present = present & column.isNotNull()
    failure = F.when(present, F.concat_ws(":", *coordinates))
    return df.select(
        "*",
        F.coalesce(_header("dt_dlq_error_type"), F.lit(NO_ERROR_TYPE)).alias("error_type"),
        _header("dt_dlq_error_message").alias("error_message"),
        F.coalesce(origin, F.lit(fallback)).alias("origin_topic"),
        _header("dt_dlq_first_failure_ms").try_cast("long").alias("first_failure_ms"),
        _header("dt_dlq_last_failure_ms").try_cast("long").alias("last_failure_ms"),
        F.coalesce(failure, F.col("source_id")).alias("failure_id"),
    )


def _ledger_ids(spark: SparkSession, ledger: str | None) -> DataFrame | None:
    if ledger is None or ("://" not in ledger and not os.path.exists(ledger)):
        return None
    try:
        entries = spark.read.schema(LEDGER_SCHEMA).parquet(ledger)
    except AnalysisException as exc:
        if "PATH_NOT_FOUND" in str(exc):
            return None
        raise ConfigError(f"cannot read the ledger {ledger}: {str(exc).splitlines()[0]}") from exc
    ids = entries.select(F.col("source_id").alias("id")).union(entries.select("failure_id"))
    return ids.where(F.col("id").isNotNull()).distinct()


def _classify(spark: SparkSession, options: BackfillOptions, df: DataFrame) -> DataFrame:
    """Add ``target`` and ``status`` (one of the outcomes counted in the report)."""
    ids = _ledger_ids(spark, options.ledger)
    if ids is None:
        known = F.lit(False)
    else:
        by_source = ids.select(F.col("id").alias("_by_source"))
        by_failure = ids.select(F.col("id").alias("_by_failure"))
        df = df.join(by_source, df.source_id == by_source._by_source, "left")
        df = df.join(by_failure, df.failure_id == by_failure._by_failure, "left")
        known = F.col("_by_source").isNotNull() | F.col("_by_failure").isNotNull()
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

    def header(name: str, value: Column) -> Column:
        return F.struct(F.lit(name).alias("key"), value.alias("value"))

    added = F.array(
        header(METADATA_HEADER, reset(_header(METADATA_HEADER, text=False), "timestamp")),
        header(BACKFILL_SOURCE_HEADER, F.encode("source_id", "UTF-8")),
        header(BACKFILL_RUN_HEADER, F.lit(bytearray(run_id.encode()))),
    )
    return selected.select(
        F.col("target").alias("topic"), "key", "value", F.concat(kept, added).alias("headers")
    )


# --------------------------------------------------------------------------- the run


def _tally(report: BackfillReport, counts: list[Row]) -> None:
    """Fill the report's counts from rows of ``source, error_type, status, count``."""
    by_type: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(_COUNTED, 0))
    for row in counts:
        n = row["count"]
        report.read[row.source] = report.read.get(row.source, 0) + n
        if row.status == "unreadable":
            report.spool_unreadable += n
        elif row.status == "other_topic":
            report.spool_other_topics += n
        else:
            by_type[row.error_type][row.status] += n
    for c in by_type.values():
        c["total"] = sum(c[s] for s in _COUNTED)
    report.by_error_type = dict(by_type)
    report.selected = sum(c["selected"] for c in by_type.values())


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
    activate(spark)
    started = time.monotonic()
    now = dt.datetime.now(dt.UTC)
    run_id = f"{now:%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:8]}"
    records = _read_topic(spark, options)
    spooled = _read_spools(spark, options.spool_dirs)
    if spooled is not None:
        records = records.unionByName(spooled)
    classified = _classify(spark, options, _decode(records, options))
    classified = classified.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        report = BackfillReport(options.dlq_topic, run_id, options.dry_run, ledger=options.ledger)
        _tally(report, classified.groupBy("source", "error_type", "status").count().collect())
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
            )
            report.sent, report.per_partition = written.records, written.per_partition
            # Only after every record was acknowledged: a crash before this line re-sends
            # the run's records next time rather than losing them.
            entries = selected.select(
                "source_id",
                "failure_id",
                "error_type",
                F.col("target").alias("target_topic"),
                F.lit(int(now.timestamp() * 1000)).alias("backfilled_at_ms"),
            )
            path = f"{options.ledger.rstrip('/')}/run_id={run_id}"
            entries.coalesce(1).write.mode("errorifexists").parquet(path)
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
        show=args.show,
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
