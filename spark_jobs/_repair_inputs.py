"""The batch repair's inputs: follow edges and follow counts, from SQLite or Parquet.

This module owns reading the two tables :mod:`spark_jobs.batch_repair` compares and
handing them over in one shape: edges as ``follower, followee`` (active edges only) and
counts as ``user_id, followers, following``, all ``bigint``. :func:`load_sqlite` reads the
follow example's database in one snapshot on the driver and hands it to Spark as Arrow;
:func:`load_parquet` reads Parquet (any path Spark reads), where ``active`` is optional:
when present only rows with a true/non-zero value are edges.
"""

from __future__ import annotations

import os
import sqlite3
from typing import Final

import pyarrow as pa
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from decaton_aio.errors import ConfigError

__all__ = ["load_parquet", "load_sqlite"]

_FETCH_ROWS: Final = 50_000


def _sqlite_tables(conn: sqlite3.Connection, path: str) -> None:
    names = {n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    missing = sorted({"follow_edges", "follow_counts"} - names)
    if missing:
        raise ConfigError(
            f"{path} has no table {', '.join(missing)}: is it the follow example's database?"
        )


def _fetch_arrow(cursor: sqlite3.Cursor, names: list[str]) -> pa.Table:
    columns: list[list[int]] = [[] for _ in names]
    while rows := cursor.fetchmany(_FETCH_ROWS):
        for i, column in enumerate(zip(*rows, strict=True)):
            columns[i].extend(column)
    return pa.table({n: pa.array(c, pa.int64()) for n, c in zip(names, columns, strict=True)})


def load_sqlite(spark: SparkSession, path: str) -> tuple[DataFrame, DataFrame]:
    """Read the active edges and the counts of the example's database, in one snapshot.

    Both tables are read inside one read transaction (WAL: writers keep going meanwhile),
    so the edges and counts belong to the same moment.

    Returns:
        ``(edges, counts)``: ``follower, followee`` and ``user_id, followers, following``.

    Raises:
        ConfigError: when the file or its tables are missing.
    """
    if not os.path.isfile(path):
        raise ConfigError(f"--sqlite {path}: no such file")
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None)
    try:
        _sqlite_tables(conn, path)
        conn.execute("BEGIN")
        edges = _fetch_arrow(
            conn.execute("SELECT follower, followee FROM follow_edges WHERE active = 1"),
            ["follower", "followee"],
        )
        counts = _fetch_arrow(
            conn.execute("SELECT user_id, followers, following FROM follow_counts"),
            ["user_id", "followers", "following"],
        )
        conn.execute("COMMIT")
    except sqlite3.Error as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    finally:
        conn.close()
    return spark.createDataFrame(edges), spark.createDataFrame(counts)


def _require_columns(df: DataFrame, columns: list[str], what: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ConfigError(f"{what} lacks column(s) {missing}; it has {df.columns}")


def load_parquet(spark: SparkSession, edges: str, counts: str) -> tuple[DataFrame, DataFrame]:
    """Read edges and counts from Parquet (see the module docstring for the columns).

    Raises:
        ConfigError: when a path cannot be read or a column is missing.
    """

    try:
        edges_df = spark.read.parquet(edges)
        counts_df = spark.read.parquet(counts)
    except AnalysisException as exc:
        raise ConfigError(f"cannot read the Parquet input: {str(exc).splitlines()[0]}") from exc
    _require_columns(edges_df, ["follower", "followee"], f"--edges {edges}")
    _require_columns(counts_df, ["user_id", "followers", "following"], f"--counts {counts}")
    if "active" in edges_df.columns:
        edges_df = edges_df.where(F.col("active").cast("boolean"))
    long = "bigint"
    return (
        edges_df.select(F.col("follower").cast(long), F.col("followee").cast(long)),
        counts_df.select(*(F.col(c).cast(long) for c in ("user_id", "followers", "following"))),
    )
