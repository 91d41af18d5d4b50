"""Both Spark jobs on the secured embedded Apache Kafka, over SASL_SSL and mutual TLS: the
source reads and the sink writes through the ``kafka.*`` options the jobs build from their
security flags (the SASL_SSL run gives a client.properties file, the mutual TLS run the
individual flags).

Spark calls block, so the async tests run them in a thread and keep their event loop free.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from decaton_aio import BytesSerializer, TaskProducer
from decaton_aio.metadata import METADATA_HEADER, TaskMetadata, encode_metadata
from decaton_aio.retry import dead_letter_headers
from decaton_aio.testing import BrokerHandle, read_records

pytest.importorskip("pyspark", reason="PySpark is not installed: pip install -e '.[spark]'")

from pyspark.sql import SparkSession

from spark_jobs import batch_repair, retry_backfill

# The first test also starts the secured broker and Spark: more than the default 120 s on
# a busy machine.
pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture(params=["SASL_SSL", "MTLS"])
def secured(request: pytest.FixtureRequest) -> BrokerHandle:
    """Each test runs once on the SASL_SSL listener and once on the mutual TLS one."""
    name = "secured_kafka_broker" if request.param == "SASL_SSL" else "mtls_kafka_broker"
    handle: BrokerHandle = request.getfixturevalue(name)
    return handle


def security_argv(handle: BrokerHandle) -> list[str]:
    """The client.properties file for SASL_SSL; the individual flags for mutual TLS."""
    assert handle.embedded is not None
    if handle.security.uses_sasl:
        listener = handle.embedded.listeners["SASL_SSL"]
        return ["--client-properties", str(listener.client_properties)]
    return [
        "--bootstrap-servers", handle.bootstrap_servers, "--security-protocol", "SSL",
        "--ssl-cafile", str(handle.security.ssl_cafile),
        "--ssl-certfile", str(handle.security.ssl_certfile),
    ]  # fmt: skip


async def topics(handle: BrokerHandle, *prefixes: str) -> list[str]:
    admin = handle.topic_admin()
    try:
        return [await admin.create(1, prefix=prefix) for prefix in prefixes]
    finally:
        await admin.close(delete=False)


async def test_retry_backfill_reads_and_sends_over_the_secured_listener(
    spark: SparkSession, secured: BrokerHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Dead letters on the secured cluster are read by the Spark source and sent back to
    their origin topic by the Spark sink; the password is never printed."""
    origin, dlq = await topics(secured, "secured-origin", "secured-dlq")
    meta = encode_metadata(TaskMetadata(int(time.time() * 1000), "shop", "shop-1", 2))
    async with TaskProducer(secured.producer_config(), dlq, BytesSerializer()) as producer:
        assert producer.sender is not None
        for i in range(4):
            headers = dead_letter_headers(
                [(METADATA_HEADER, meta)],
                error_type="TimeoutError",
                message="it failed",
                exc=None,
                topic=origin,
                partition=0,
                offset=i,
                attempts=3,
                timestamp_ms=1,
            )
            await producer.sender.send(dlq, b'{"n": %d}' % i, key=b"user-%d" % i, headers=headers)
    argv = [*security_argv(secured), "--dlq-topic", dlq, "--ledger", str(tmp_path / "ledger")]
    argv += ["--summary-json", str(tmp_path / "summary.json")]

    code = await asyncio.to_thread(retry_backfill.main, argv, spark=spark)

    out = capsys.readouterr()
    assert code == 0, out.err
    assert json.loads((tmp_path / "summary.json").read_text())["sent"] == 4
    records = await read_records(secured.bootstrap_servers, origin, 4, security=secured.security)
    assert sorted(r.key for r in records) == [b"user-%d" % i for i in range(4)]
    assert _sasl_password(secured) not in out.out + out.err


async def test_batch_repair_sends_repair_tasks_over_the_secured_listener(
    spark: SparkSession, secured: BrokerHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The repair job's tasks reach the secured cluster through the Spark sink."""
    (repair,) = await topics(secured, "secured-repair")
    edges = [(1, 2, True), (3, 2, True)]
    counts = [(1, 0, 1), (2, 5, 0), (3, 0, 1)]  # user 2 has 2 followers, not 5
    spark.createDataFrame(edges, "follower long, followee long, active boolean").write.parquet(
        str(tmp_path / "edges")
    )
    spark.createDataFrame(counts, "user_id long, followers long, following long").write.parquet(
        str(tmp_path / "counts")
    )
    argv = [*security_argv(secured), "--repair-topic", repair]
    argv += ["--edges", str(tmp_path / "edges"), "--counts", str(tmp_path / "counts")]

    code = await asyncio.to_thread(batch_repair.main, argv, spark=spark)

    out = capsys.readouterr()
    assert code == 0, out.err
    records = await read_records(secured.bootstrap_servers, repair, 1, security=secured.security)
    assert [r.key for r in records] == [b"2"]
    assert _sasl_password(secured) not in out.out + out.err


def _sasl_password(handle: BrokerHandle) -> str:
    assert handle.embedded is not None
    password = handle.embedded.listeners["SASL_SSL"].security.sasl_password
    assert password
    return password
