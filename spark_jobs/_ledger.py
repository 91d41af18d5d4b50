"""The retry backfill's ledger: what earlier runs sent, so that a re-run skips it.

This module owns the ledger's format and both its reads and its writes. The ledger is a
Parquet data set with one ``run_id=<run id>`` directory per run that sent something; each
entry names a re-sent dead letter twice, by where it was read (``source_id``) and by its
failure (``failure_id``, what a later run skips by), with its error type, the topic it
went to and when. A run appends its entries only after the broker acknowledged its records (see
:mod:`spark_jobs.retry_backfill`); nothing here ever rewrites or removes an entry.
"""

from __future__ import annotations

from typing import Final

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from decaton_aio.errors import ConfigError

__all__ = ["LEDGER_SCHEMA", "append_run", "known_ids"]

LEDGER_SCHEMA: Final = (
    "source_id string, failure_id string, error_type string, target_topic string, "
    "backfilled_at_ms long"
)
"""The columns of a ledger entry (Spark DDL)."""


def known_ids(spark: SparkSession, ledger: str | None) -> DataFrame | None:
    """Every ``failure_id`` the ledger holds, as one column ``id`` (a record's failure:
    the same for a record read again or its spool copy, while where it was read, the
    ``source_id``, starts again at offset 0 in a dead letter topic made again).

    Returns:
        The distinct ids, or ``None`` when there is no ledger (yet).

    Raises:
        ConfigError: when the ledger exists but cannot be read.
    """
    if ledger is None:
        return None
    # A path is Spark's to resolve (a path without a scheme is on the default file
    # system: HDFS on YARN); a ledger not written yet is a path Spark does not find.
    try:
        entries = spark.read.schema(LEDGER_SCHEMA).parquet(ledger)
    except AnalysisException as exc:
        if "PATH_NOT_FOUND" in str(exc):
            return None
        raise ConfigError(f"cannot read the ledger {ledger}: {str(exc).splitlines()[0]}") from exc
    ids = entries.select(F.col("failure_id").alias("id"))
    return ids.where(F.col("id").isNotNull()).distinct()


def append_run(sent: DataFrame, ledger: str, run_id: str, backfilled_at_ms: int) -> None:
    """Add one run's entries to the ledger, in a directory of the run's own.

    Args:
        sent: the records the run sent, with ``source_id, failure_id, error_type, target``.
        ledger: the ledger's path.
        run_id: the run's id; a directory of that run must not exist yet.
        backfilled_at_ms: when the run started, in epoch milliseconds.
    """
    entries = sent.select(
        "source_id",
        "failure_id",
        "error_type",
        F.col("target").alias("target_topic"),
        F.lit(backfilled_at_ms).alias("backfilled_at_ms"),
    )
    path = f"{ledger.rstrip('/')}/run_id={run_id}"
    entries.coalesce(1).write.mode("errorifexists").parquet(path)
