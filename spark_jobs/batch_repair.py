"""Batch repair: the follow example's inconsistency checker over all the data, in Spark.

This module owns the job that compares the source of truth (the follow edges) with derived
state (the follow counts), emits one repair task per inconsistent user to a repair topic,
and reports what it found. The repair processor of the example
(``examples.follow.processor:repair``) consumes the tasks and recounts each user from the
edges, so the fix itself happens where the state lives, serialized with live updates.

Inputs, either:

- ``--sqlite PATH``: the example's database; tables ``follow_edges(follower, followee,
  active)`` and ``follow_counts(user_id, followers, following)``, read in one snapshot on
  the driver and handed to Spark as Arrow; or
- ``--edges PATH --counts PATH``: Parquet with the same columns (``active`` optional: when
  present only rows with a true/non-zero value are edges). Any path Spark reads works.

A user counts as inconsistent when the edges' follower or following count differs from the
stored one, a missing counts row meaning 0/0 (so a user with edges but no row, and a row
with non-zero counts for a user without edges, are both inconsistent). Counts read while
processors are writing may look wrong for a moment; the repair task then recounts and finds
nothing to fix, which is harmless.

Reading the inputs is :mod:`spark_jobs._repair_inputs`; here live the comparison, the
repair tasks, the run and the command line.

Each repair task is a JSON body ``{"user_id", "expected_followers", "expected_following",
"stored_followers", "stored_following", "detected_at_ms"}`` keyed by the user id, with a
``dt_meta`` header, so any decaton-aio (or Decaton) processor can consume it::

    python -m spark_jobs.batch_repair --bootstrap-servers HOST:PORT \\
        --sqlite follow.db --repair-topic follow-repairs [--dry-run] [--summary-json out.json]
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from decaton_aio.errors import ConfigError
from decaton_aio.metadata import METADATA_HEADER, TaskMetadata, encode_metadata
from decaton_aio.producer import Idempotence
from decaton_aio.security import PLAINTEXT, SecuritySettings

from ._cli import (
    JobParser,
    UsageError,
    add_common_arguments,
    require_bootstrap,
    run_job,
)
from ._repair_inputs import load_parquet, load_sqlite
from .kafka_io import write_topic

__all__ = [
    "RepairOptions",
    "RepairReport",
    "build_parser",
    "compare_counts",
    "load_parquet",
    "load_sqlite",
    "main",
    "repair_tasks",
    "run_repair",
]

APPLICATION_ID: Final = "decaton-aio-batch-repair"
"""The source application id written into each repair task's ``dt_meta``."""


@dataclass(frozen=True)
class RepairOptions:
    """What one run of the job does (the command line's options, as values).

    Attributes:
        bootstrap_servers: the Kafka cluster (not needed for a dry run).
        repair_topic: where repair tasks go.
        sqlite: the example's database file, or ``None`` with ``edges``/``counts``.
        edges: Parquet of ``follower, followee[, active]``.
        counts: Parquet of ``user_id, followers, following``.
        dry_run: find and report, send nothing.
        idempotence: the producer's idempotence (``"auto"``, ``True`` or ``False``).
        compression_type: the codec of produced batches, or ``None``.
        show: how many inconsistent users the report lists.
        security: TLS and SASL settings of every Kafka client of the run.
        kafka_extra: Kafka client properties for Spark's connector (``--kafka-properties``).
    """

    bootstrap_servers: str | None
    repair_topic: str
    sqlite: str | None = None
    edges: str | None = None
    counts: str | None = None
    dry_run: bool = False
    idempotence: Idempotence = "auto"
    compression_type: str | None = None
    show: int = 10
    security: SecuritySettings = PLAINTEXT
    kafka_extra: Mapping[str, str] = field(default_factory=dict)


@dataclass
class RepairReport:
    """What the job found and sent.

    Attributes:
        users_checked: users with edges or a counts row.
        edges: active follow edges read.
        inconsistent: users whose counts disagree with the edges.
        followers_wrong: of those, users whose follower count is wrong.
        following_wrong: of those, users whose following count is wrong.
        missing_counts: of those, users with edges but no counts row.
        orphan_counts: of those, users with a non-zero counts row but no edges.
        repair_tasks_sent: repair tasks the broker acknowledged (0 in a dry run).
        per_partition: ``"<topic>:<partition>"`` -> repair tasks.
        sample: the first inconsistent users (by id) with expected and stored counts.
        repair_topic: where the tasks went.
        dry_run: nothing was sent.
        seconds: how long the job took.
    """

    users_checked: int
    edges: int
    inconsistent: int
    followers_wrong: int
    following_wrong: int
    missing_counts: int
    orphan_counts: int
    repair_tasks_sent: int
    repair_topic: str
    dry_run: bool
    per_partition: dict[str, int] = field(default_factory=dict)
    sample: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (``--summary-json``)."""
        return {"job": "batch_repair", **asdict(self)}

    def render(self) -> str:
        """The report as the lines the job prints."""
        verb = "would send" if self.dry_run else "sent"
        sent = self.inconsistent if self.dry_run else self.repair_tasks_sent
        lines = [
            f"batch repair{' (dry run)' if self.dry_run else ''}: {self.seconds:.1f}s",
            f"  users checked     {self.users_checked:>8}  ({self.edges} active edges)",
            f"  inconsistent      {self.inconsistent:>8}",
            f"    followers wrong {self.followers_wrong:>8}",
            f"    following wrong {self.following_wrong:>8}",
            f"    no counts row   {self.missing_counts:>8}",
            f"    counts, no edge {self.orphan_counts:>8}",
            f"  repair tasks      {sent:>8}  {verb} to {self.repair_topic}",
        ]
        for row in self.sample:
            stored = (
                "no counts row"
                if row["stored_followers"] is None
                else f"stored {row['stored_followers']}/{row['stored_following']}"
            )
            lines.append(
                f"    user {row['user_id']}: {stored}, edges say "
                f"{row['expected_followers']}/{row['expected_following']} (followers/following)"
            )
        return "\n".join(lines)


# --------------------------------------------------------------------------- the check


def compare_counts(edges: DataFrame, counts: DataFrame) -> DataFrame:
    """Every user with edges or a counts row, with expected and stored counts.

    Args:
        edges: ``follower, followee`` (active edges only).
        counts: ``user_id, followers, following``.

    Returns:
        ``user_id, expected_followers, expected_following, stored_followers,
        stored_following, has_row, inconsistent``; stored values are null without a
        counts row, which counts as 0/0.
    """

    followers = edges.groupBy(F.col("followee").alias("user_id")).agg(
        F.count(F.lit(1)).alias("expected_followers")
    )
    following = edges.groupBy(F.col("follower").alias("user_id")).agg(
        F.count(F.lit(1)).alias("expected_following")
    )
    expected = followers.join(following, "user_id", "full_outer")
    stored = counts.select(
        "user_id",
        F.col("followers").alias("stored_followers"),
        F.col("following").alias("stored_following"),
        F.lit(True).alias("has_row"),
    )
    joined = expected.join(stored, "user_id", "full_outer").select(
        "user_id",
        F.coalesce("expected_followers", F.lit(0)).alias("expected_followers"),
        F.coalesce("expected_following", F.lit(0)).alias("expected_following"),
        "stored_followers",
        "stored_following",
        F.coalesce("has_row", F.lit(False)).alias("has_row"),
    )
    return joined.withColumn("inconsistent", _followers_wrong() | _following_wrong())


def _followers_wrong() -> Column:
    return F.col("expected_followers") != F.coalesce("stored_followers", F.lit(0))


def _following_wrong() -> Column:
    return F.col("expected_following") != F.coalesce("stored_following", F.lit(0))


def repair_tasks(inconsistent: DataFrame, *, detected_at_ms: int) -> DataFrame:
    """The repair task records (``key, value, headers``) of the given (inconsistent) users."""
    meta = TaskMetadata(
        timestamp_ms=detected_at_ms,
        source_application_id=APPLICATION_ID,
        source_instance_id=f"{socket.gethostname()}-{os.getpid()}",
    )
    body = F.struct(
        "user_id",
        "expected_followers",
        "expected_following",
        "stored_followers",
        "stored_following",
        F.lit(detected_at_ms).alias("detected_at_ms"),
    )
    header = F.struct(
        F.lit(METADATA_HEADER).alias("key"),
        F.lit(bytearray(encode_metadata(meta))).alias("value"),
    )
    return inconsistent.select(
        F.col("user_id").cast("string").alias("key"),
        F.to_json(body, {"ignoreNullFields": "false"}).alias("value"),
        F.array(header).alias("headers"),
    )


def run_repair(spark: SparkSession, options: RepairOptions) -> RepairReport:
    """Find the inconsistent users, send one repair task each, and report.

    Raises:
        ConfigError: when an input is missing or malformed.
        ProducerError: when the broker does not take the repair tasks (raised by Spark as
            its own exception type, with this message inside).
    """

    started = time.monotonic()
    if options.sqlite is not None:
        edges, counts = load_sqlite(spark, options.sqlite)
    elif options.edges is not None and options.counts is not None:
        edges, counts = load_parquet(spark, options.edges, options.counts)
    else:
        raise ConfigError("no input: give sqlite, or edges and counts")
    users = compare_counts(edges, counts).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        inconsistent = F.col("inconsistent")
        stats = users.agg(
            F.count(F.lit(1)),
            F.sum("expected_followers"),  # each active edge is one follower
            F.count_if(inconsistent),
            F.count_if(_followers_wrong()),
            F.count_if(_following_wrong()),
            F.count_if(inconsistent & ~F.col("has_row")),
            F.count_if(
                inconsistent
                & F.col("has_row")
                & (F.col("expected_followers") + F.col("expected_following") == 0)
            ),
        ).first()
        assert stats is not None
        bad = users.where(inconsistent).drop("inconsistent", "has_row")
        report = RepairReport(
            users_checked=stats[0],
            edges=stats[1] or 0,
            inconsistent=stats[2],
            followers_wrong=stats[3],
            following_wrong=stats[4],
            missing_counts=stats[5],
            orphan_counts=stats[6],
            repair_tasks_sent=0,
            repair_topic=options.repair_topic,
            dry_run=options.dry_run,
            sample=[row.asDict() for row in bad.orderBy("user_id").limit(options.show).collect()],
        )
        if report.inconsistent and not options.dry_run:
            if not options.bootstrap_servers:
                raise ConfigError("bootstrap_servers is required to send repair tasks")
            tasks = repair_tasks(bad, detected_at_ms=time.time_ns() // 1_000_000)
            written = write_topic(
                tasks,
                options.bootstrap_servers,
                options.repair_topic,
                idempotence=options.idempotence,
                compression_type=options.compression_type,
                security=options.security,
                extra=options.kafka_extra,
            )
            report.repair_tasks_sent = written.records
            report.per_partition = written.per_partition
    finally:
        users.unpersist()
    report.seconds = time.monotonic() - started
    return report


# --------------------------------------------------------------------------- command line


def build_parser() -> JobParser:
    """The job's command line."""
    parser = JobParser(
        prog="batch_repair",
        description="Compare follow counts with the follow edges and send one repair task per "
        "inconsistent user to the repair topic.",
    )
    add_common_arguments(parser)
    parser.add_argument(
        "--repair-topic", required=True, metavar="TOPIC", help="where repair tasks go"
    )
    parser.add_argument("--sqlite", metavar="PATH", help="the follow example's SQLite database")
    parser.add_argument("--edges", metavar="PATH", help="Parquet: follower, followee[, active]")
    parser.add_argument("--counts", metavar="PATH", help="Parquet: user_id, followers, following")
    parser.add_argument(
        "--show", type=int, default=10, metavar="N", help="list the first N inconsistent users"
    )
    return parser


def _check(args: argparse.Namespace) -> None:
    parquet = args.edges is not None or args.counts is not None
    if args.sqlite is not None and parquet:
        raise UsageError("give either --sqlite or --edges and --counts, not both")
    if args.sqlite is None and not (args.edges and args.counts):
        raise UsageError("the input is missing: --sqlite PATH, or --edges PATH --counts PATH")
    if args.sqlite is not None and not os.path.isfile(args.sqlite):
        raise UsageError(f"--sqlite {args.sqlite}: no such file")
    if args.show < 0:
        raise UsageError(f"--show must be >= 0, got {args.show}")
    if not args.dry_run:
        require_bootstrap(args)


def _run(spark: SparkSession, args: argparse.Namespace) -> RepairReport:
    options = RepairOptions(
        bootstrap_servers=args.bootstrap_servers,
        repair_topic=args.repair_topic,
        sqlite=args.sqlite,
        edges=args.edges,
        counts=args.counts,
        dry_run=args.dry_run,
        idempotence=args.idempotence,
        compression_type=args.compression_type,
        show=args.show,
        security=args.security,
        kafka_extra=args.kafka_extra,
    )
    return run_repair(spark, options)


def main(argv: list[str] | None = None, *, spark: SparkSession | None = None) -> int:
    """Run the job from the command line; returns the exit code.

    Args:
        argv: the arguments; ``sys.argv[1:]`` when omitted.
        spark: a running session to use (left running); by default the job starts one.
    """
    return run_job("batch_repair", build_parser(), _run, argv, check=_check, spark=spark)


if __name__ == "__main__":
    sys.exit(main())
