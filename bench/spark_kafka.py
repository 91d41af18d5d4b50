"""Spark reading and writing Kafka: records per second of Spark's Kafka connector.

Runs against a fresh embedded Apache Kafka in ``local[2]``; for each format given (the
formats are pairs of a writer and a reader, for comparing data sources), and
each of ``--runs`` runs, it writes ``--records`` records of ``--value-bytes`` bytes with a
``dt_meta`` header to a new topic of ``--partitions`` partitions (the write figure), then
reads that topic into a DataFrame and aggregates it: count, value bytes, records with a
``dt_meta`` header, distinct keys (the read figure). It prints one JSON line per run and
the medians, and deletes each topic after its run.

    python -m bench.spark_kafka                  # format kafka, 1,000,000 x 1 KB, 3 runs
    python -m bench.spark_kafka --records 100000 --runs 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from decaton_aio.admin import TopicAdmin
from decaton_aio.embedded import EmbeddedBroker
from decaton_aio.metadata import METADATA_HEADER, TaskMetadata, encode_metadata
from spark_jobs.kafka_io import WRITE_OPTIONS

# The formats measured: how a DataFrame is written to a topic, and how a topic is read.
_WRITERS: dict[str, Callable[[Any, str, str], None]] = {}
_READERS: dict[str, Callable[[Any, str, str], Any]] = {}


def _write_kafka(df: Any, servers: str, topic: str) -> None:
    writer = df.write.format("kafka").option("kafka.bootstrap.servers", servers)
    writer.options(**WRITE_OPTIONS).option("topic", topic).mode("append").save()


def _read_kafka(spark: Any, servers: str, topic: str) -> Any:
    reader = spark.read.format("kafka").option("kafka.bootstrap.servers", servers)
    return reader.option("subscribe", topic).option("includeHeaders", "true").load()


_WRITERS["kafka"] = _write_kafka
_READERS["kafka"] = _read_kafka


def _records(spark: Any, count: int, value_bytes: int, partitions: int) -> Any:
    from pyspark.sql import functions as F

    meta = bytearray(encode_metadata(TaskMetadata(int(time.time() * 1000), "bench", "bench-1")))
    header = F.struct(F.lit(METADATA_HEADER).alias("key"), F.lit(meta).alias("value"))
    filler = "x" * (value_bytes - 12)
    return spark.range(0, count, numPartitions=partitions).select(
        F.concat(F.lit("key-"), F.col("id") % 10_000).cast("string").alias("key"),
        F.encode(
            F.concat(F.lpad(F.col("id").cast("string"), 12, "0"), F.lit(filler)), "UTF-8"
        ).alias("value"),
        F.array(header).alias("headers"),
    )


def _aggregate(df: Any) -> Any:
    from pyspark.sql import functions as F

    meta = F.filter("headers", lambda h: h.key == METADATA_HEADER)
    return df.agg(
        F.count(F.lit(1)).alias("records"),
        F.sum(F.length("value")).alias("value_bytes"),
        F.count_if(F.size(meta) > 0).alias("with_meta"),
        F.approx_count_distinct("key").alias("keys"),
    ).first()


def _run(spark: Any, broker: EmbeddedBroker, fmt: str, args: argparse.Namespace) -> dict[str, Any]:
    servers = broker.bootstrap_servers
    admin = TopicAdmin(servers)
    loop = asyncio.new_event_loop()  # the admin client stays on the loop it started on
    topic = loop.run_until_complete(admin.create(args.partitions, prefix=f"bench-spark-{fmt}"))
    try:
        data = _records(spark, args.records, args.value_bytes, args.partitions)
        started = time.perf_counter()
        _WRITERS[fmt](data, servers, topic)
        write_s = time.perf_counter() - started
        started = time.perf_counter()
        row = _aggregate(_READERS[fmt](spark, servers, topic))
        read_s = time.perf_counter() - started
        if (row.records, row.with_meta) != (args.records, args.records):
            raise SystemExit(f"{fmt}: read {row.records} records, {row.with_meta} with dt_meta")
        return {
            "format": fmt,
            "records": args.records,
            "value_bytes": args.value_bytes,
            "write_s": round(write_s, 2),
            "write_per_s": round(args.records / write_s),
            "read_s": round(read_s, 2),
            "read_per_s": round(args.records / read_s),
        }
    finally:
        loop.run_until_complete(admin.close(delete=True))
        loop.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.spark_kafka", description=__doc__)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--value-bytes", type=int, default=1024)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--formats", default=",".join(_WRITERS), help="comma-separated")
    args = parser.parse_args(argv)
    formats = args.formats.split(",")
    unknown = sorted(set(formats) - set(_WRITERS))
    if unknown:
        parser.error(f"unknown formats {unknown}; known: {sorted(_WRITERS)}")

    from spark_jobs._session import local_session

    settings = {"log.retention.bytes": "-1", "message.max.bytes": "4194304"}
    with EmbeddedBroker(flavor="apache", settings=settings) as broker:
        spark = local_session("bench-spark-kafka", "local[2]")
        try:
            runs: dict[str, list[dict[str, Any]]] = {fmt: [] for fmt in formats}
            for _ in range(args.runs):
                for fmt in formats:  # interleaved, so drift on a shared machine hits both
                    result = _run(spark, broker, fmt, args)
                    runs[fmt].append(result)
                    print(json.dumps(result), flush=True)
            for fmt, results in runs.items():
                median = {
                    key: statistics.median(r[key] for r in results)
                    for key in ("write_s", "write_per_s", "read_s", "read_per_s")
                }
                print(json.dumps({"format": fmt, "median_of": len(results), **median}))
        finally:
            spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
