"""Dead letters as rows: read from the dead letter topic and spools, failure headers decoded.

This module owns what the retry backfill (:mod:`spark_jobs.retry_backfill`) reads and how
it understands a dead letter. :func:`read_dead_letters` reads the dead letter topic (end
offsets pinned once, so every action of a run sees the same records) and, optionally,
the lines of durable-producer spools (``spool-*.jsonl``, ``spool-*.rejected``; see
:mod:`decaton_aio.producer._spool`) into rows of one shape; :func:`decode_failures` adds the columns
decoded from the ``dt_dlq_*`` headers the runtime wrote: the error, the origin task topic
and the failure's identity.

The rows of :func:`read_dead_letters`: ``source`` (``dlq`` or ``spool``), ``source_id``
(``<topic>:<partition>:<offset>``, ``spool:<entry id>``, or ``spool-unreadable:<sha256>``
for a line that could not be parsed), ``entry_topic`` (the topic the record was for),
``readable``, ``key``, ``value``, ``headers`` and ``timestamp`` (epoch ms).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from decaton_aio.retry import SideTopics
from decaton_aio.security import PLAINTEXT, SecuritySettings

from .kafka_io import pinned_ends, read_topic

__all__ = ["NO_ERROR_TYPE", "decode_failures", "header", "read_dead_letters"]

NO_ERROR_TYPE: Final = "(none)"
"""The error type reported for a record without ``dt_dlq_error_type``."""

_SPOOL_SCHEMA: Final = (
    "v int, id string, topic string, key_b64 string, value_b64 string, "
    "headers array<array<string>>, timestamp_ms long, spooled_at_ms long"
)
_SPOOL_PATTERNS: Final = ("spool-*.jsonl", "spool-*.rejected")


def read_dead_letters(
    spark: SparkSession,
    bootstrap_servers: str,
    dlq_topic: str,
    spool_dirs: Sequence[str] = (),
    *,
    isolation_level: str = "read_uncommitted",
    security: SecuritySettings = PLAINTEXT,
    kafka_extra: Mapping[str, str] | None = None,
) -> DataFrame:
    """The dead letter topic's records, and the spools' lines, as rows of one shape.

    ``isolation_level="read_committed"`` skips records of aborted transactions (a dead
    letter topic written by a transactional producer).

    Raises:
        ConfigError: when the dead letter topic does not exist.
        BrokerError: when the cluster cannot be reached.
    """
    records = _read_topic(
        spark, bootstrap_servers, dlq_topic, isolation_level, security, kafka_extra
    )
    spooled = _read_spools(spark, spool_dirs)
    return records if spooled is None else records.unionByName(spooled)


def _read_topic(
    spark: SparkSession,
    bootstrap_servers: str,
    dlq_topic: str,
    isolation_level: str,
    security: SecuritySettings,
    kafka_extra: Mapping[str, str] | None,
) -> DataFrame:
    # Pin the end offsets once: every action of the run then sees the same records.
    ends = pinned_ends(
        bootstrap_servers, dlq_topic, isolation_level=isolation_level, security=security
    )
    df = read_topic(
        spark,
        bootstrap_servers,
        dlq_topic,
        ending_offsets=ends,
        isolation_level=isolation_level,
        security=security,
        extra=kafka_extra,
    )
    return df.select(
        F.lit("dlq").alias("source"),
        F.concat_ws(":", "topic", "partition", "offset").alias("source_id"),
        F.col("topic").alias("entry_topic"),
        F.lit(True).alias("readable"),
        "key",
        "value",
        "headers",
        F.unix_millis("timestamp").alias("timestamp"),
    )


def _read_spools(spark: SparkSession, dirs: Sequence[str]) -> DataFrame | None:
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


def header(name: str, *, text: bool = True) -> Column:
    """The value of header ``name`` (as a string, or binary when ``text`` is false).

    The last header of that name wins, as the runtime reads them; null when there is none.
    """
    found = F.try_element_at(F.filter("headers", lambda h: h.key == name), F.lit(-1))
    value = found.getField("value")
    return value.cast("string") if text else value


def decode_failures(df: DataFrame, dlq_topic: str, side_topics: SideTopics) -> DataFrame:
    """Add the failure columns decoded from the ``dt_dlq_*`` headers.

    The columns: ``error_type`` (:data:`NO_ERROR_TYPE` without the header),
    ``error_message``, ``origin_topic`` (the task topic: the origin header with a retry or
    shaping suffix removed, else the dead letter topic's name without its suffix, else
    null), ``first_failure_ms``, ``last_failure_ms`` and ``failure_id`` (origin topic,
    partition, offset and last failure time; the ``source_id`` when a header is missing).
    """
    side_suffix = f"({re.escape(side_topics.retry)}|{re.escape(side_topics.shaping)})$"
    origin = F.regexp_replace(header("dt_dlq_origin_topic"), side_suffix, "")
    dead_letter = side_topics.dead_letter
    fallback = dlq_topic[: -len(dead_letter)] if dlq_topic.endswith(dead_letter) else None
    coordinates = [
        header("dt_dlq_origin_topic"),
        header("dt_dlq_origin_partition"),
        header("dt_dlq_origin_offset"),
        header("dt_dlq_last_failure_ms"),
    ]
    present = coordinates[0].isNotNull()
    for column in coordinates[1:]:
        present = present & column.isNotNull()
    failure = F.when(present, F.concat_ws(":", *coordinates))
    return df.select(
        "*",
        F.coalesce(header("dt_dlq_error_type"), F.lit(NO_ERROR_TYPE)).alias("error_type"),
        header("dt_dlq_error_message").alias("error_message"),
        F.coalesce(origin, F.lit(fallback)).alias("origin_topic"),
        header("dt_dlq_first_failure_ms").try_cast("long").alias("first_failure_ms"),
        header("dt_dlq_last_failure_ms").try_cast("long").alias("last_failure_ms"),
        F.coalesce(failure, F.col("source_id")).alias("failure_id"),
    )
