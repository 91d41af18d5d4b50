"""The jobs' use of Spark's Kafka connector: headers come with a read, a read stops at the
pinned ends, ``read_committed`` hides aborted records, a write reports exactly where its
records went, a missing topic sends nothing, and the options and commands refuse what
cannot work with one line.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import zipfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import DefaultPartitioner

from decaton_aio.errors import ConfigError
from decaton_aio.security import SecuritySettings
from decaton_aio.testing import BrokerHandle, read_records

pytest.importorskip("pyspark", reason="PySpark is not installed: pip install -e '.[spark]'")

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from spark_jobs import __main__ as command
from spark_jobs import retry_backfill
from spark_jobs._bundle import MAIN_FILE, ZIP_FILE, build
from spark_jobs._cli import _resolve_cluster, read_kafka_properties
from spark_jobs._connector import connector_jars, package
from spark_jobs.kafka_io import (
    choose_partition,
    kafka_options,
    pinned_ends,
    read_topic,
    write_topic,
)

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]


async def produce(broker: BrokerHandle, topic: str, count: int, start: int = 0) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap_servers)
    await producer.start()
    try:
        for i in range(start, start + count):
            headers = [("dt_meta", b"m-%d" % i), ("trace", b"t")]
            await producer.send(topic, b"v-%d" % i, key=b"k-%d" % i, headers=headers)
        await producer.flush()
    finally:
        await producer.stop()


@pytest.mark.integration
async def test_a_read_has_the_headers_and_stops_at_the_pinned_ends(
    spark: SparkSession, kafka_broker: BrokerHandle, topic_factory: Any
) -> None:
    """Records written after the ends were pinned are not read, even by a later action."""
    topic = await topic_factory(partitions=2)
    await produce(kafka_broker, topic, 10)
    servers = kafka_broker.bootstrap_servers
    ends = await asyncio.to_thread(pinned_ends, servers, topic)
    df = read_topic(spark, servers, topic, ending_offsets=ends)
    await produce(kafka_broker, topic, 5, start=10)

    rows = await asyncio.to_thread(df.orderBy("key").collect)

    assert sum(ends.values()) == 10
    assert len(rows) == 10
    first = rows[0]
    assert (bytes(first.key), bytes(first.value)) == (b"k-0", b"v-0")
    assert [(h.key, bytes(h.value)) for h in first.headers] == [
        ("dt_meta", b"m-0"),
        ("trace", b"t"),
    ]


@pytest.mark.integration
async def test_read_committed_skips_aborted_records(
    spark: SparkSession, kafka_broker: BrokerHandle, topic_factory: Any
) -> None:
    topic = await topic_factory(partitions=1)
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka_broker.bootstrap_servers, transactional_id=f"{topic}-tx"
    )
    await producer.start()
    try:
        for value, commit in ((b"kept-1", True), (b"aborted", False), (b"kept-2", True)):
            await producer.begin_transaction()
            await producer.send_and_wait(topic, value, key=b"k")
            await (producer.commit_transaction() if commit else producer.abort_transaction())
    finally:
        await producer.stop()
    servers = kafka_broker.bootstrap_servers

    def read(level: str) -> list[bytes]:
        ends = pinned_ends(servers, topic, isolation_level=level)
        df = read_topic(spark, servers, topic, ending_offsets=ends, isolation_level=level)
        return sorted(bytes(r.value) for r in df.select("value").collect())

    assert await asyncio.to_thread(read, "read_committed") == [b"kept-1", b"kept-2"]
    assert await asyncio.to_thread(read, "read_uncommitted") == [b"aborted", b"kept-1", b"kept-2"]


@pytest.mark.integration
async def test_a_write_reports_where_each_record_went(
    spark: SparkSession, kafka_broker: BrokerHandle, topic_factory: Any
) -> None:
    """Keyed records go where Kafka's producers put a key; the summary's counts per
    partition are the topic's, and unkeyed records are counted too."""
    topic = await topic_factory(partitions=3)
    keyed = spark.range(40).select(
        F.concat(F.lit("key-"), F.col("id").cast("string")).alias("key"),
        F.col("id").cast("string").alias("value"),
    )
    unkeyed = spark.range(5).select(
        F.lit(None).cast("string").alias("key"), F.col("id").cast("string").alias("value")
    )

    summary = await asyncio.to_thread(
        write_topic, keyed.unionByName(unkeyed), kafka_broker.bootstrap_servers, topic
    )

    records = await read_records(kafka_broker.bootstrap_servers, topic, 45)
    landed = Counter(f"{topic}:{r.partition}" for r in records)
    assert summary.records == 45
    assert summary.per_partition == dict(landed)
    partitioner = DefaultPartitioner()
    for r in records:
        if r.key is not None:
            assert r.partition == partitioner(r.key, [0, 1, 2], [0, 1, 2])


@pytest.mark.integration
async def test_a_missing_topic_is_refused_before_anything_is_sent(
    spark: SparkSession, kafka_broker: BrokerHandle, topic_factory: Any
) -> None:
    present = await topic_factory(partitions=1)
    rows = spark.createDataFrame(
        [(present, "k", "v"), ("no-such-topic-here", "k", "v")],
        "topic string, key string, value string",
    )

    with pytest.raises(ConfigError, match="no-such-topic-here"):
        await asyncio.to_thread(write_topic, rows, kafka_broker.bootstrap_servers, None)

    ends = await asyncio.to_thread(pinned_ends, kafka_broker.bootstrap_servers, present)
    assert ends == {0: 0}
    untargeted = spark.createDataFrame([(None, "k", "v")], "topic string, key string, value string")
    with pytest.raises(ConfigError, match="has no topic"):
        await asyncio.to_thread(write_topic, untargeted, kafka_broker.bootstrap_servers, None)


def test_choose_partition_is_murmur2_of_the_key() -> None:
    partitioner = DefaultPartitioner()
    for key in (b"", b"a", b"user-1", "ü".encode(), bytes(range(40))):
        assert choose_partition(key, b"v", 7) == partitioner(key, list(range(7)), list(range(7)))
    spread = {choose_partition(None, b"%d" % i, 4) for i in range(50)}
    assert spread == {0, 1, 2, 3}


class Tokens:
    """An OAUTHBEARER token provider written in Python."""

    async def token(self) -> str:
        return "t"


def test_security_becomes_kafka_options_and_oauthbearer_is_refused() -> None:
    security = SecuritySettings(
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="u",
        sasl_password="p",
        ssl_cafile="/ca.pem",
    )

    options = kafka_options("h:1", security, {"client.id": "x"})

    assert options["kafka.bootstrap.servers"] == "h:1"
    assert options["kafka.security.protocol"] == "SASL_SSL"
    assert options["kafka.sasl.mechanism"] == "SCRAM-SHA-512"
    assert "ScramLoginModule" in options["kafka.sasl.jaas.config"]
    assert options["kafka.ssl.truststore.type"] == "PEM"
    assert options["kafka.client.id"] == "x"
    oauth = SecuritySettings(
        security_protocol="SASL_SSL",
        sasl_mechanism="OAUTHBEARER",
        sasl_oauth_token_provider=Tokens(),
    )
    with pytest.raises(ConfigError, match="--kafka-properties"):
        kafka_options("h:1", oauth)


def test_kafka_properties_file(tmp_path: Path) -> None:
    good = tmp_path / "good.properties"
    good.write_text("# comment\nkafka.client.id = x\nsasl.jaas.config=a=b;\n\n")
    bad = tmp_path / "bad.properties"
    bad.write_text("client.id=x\n=secret-without-a-name\n")

    assert read_kafka_properties(good) == {"client.id": "x", "sasl.jaas.config": "a=b;"}
    with pytest.raises(ConfigError, match="line 2 is not key=value") as caught:
        read_kafka_properties(bad)
    assert "secret" not in str(caught.value)
    with pytest.raises(ConfigError, match="missing"):
        read_kafka_properties(tmp_path / "missing")


def test_the_command_names_a_job_or_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert command.main([]) == 2
    assert command.main(["nope"]) == 2
    assert "unknown job 'nope'" in capsys.readouterr().err
    assert command.main(["batch-repair", "--help"]) == 0
    assert "--repair-topic" in capsys.readouterr().out
    result = subprocess.run(
        [sys.executable, "-m", "spark_jobs", "retry_backfill", "--bogus"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0, result.stderr


def test_the_spark_submit_bundle_holds_the_jobs_under_their_installed_name(
    tmp_path: Path,
) -> None:
    build(tmp_path)

    names = zipfile.ZipFile(tmp_path / ZIP_FILE).namelist()
    assert "decaton_aio_spark/__main__.py" in names
    assert "decaton_aio_spark/connector-pom/pom.xml" in names
    assert "decaton_aio/metadata.py" in names
    assert not [n for n in names if n.startswith("spark_jobs/") or n.endswith((".so", ".pyc"))]
    assert "from decaton_aio_spark.__main__ import main" in (tmp_path / MAIN_FILE).read_text()


def test_the_connector_is_pysparks_version_and_cached() -> None:
    """The cached jars are the connector of the installed PySpark's version, its token
    provider, kafka-clients and commons-pool2: nothing PySpark already ships."""
    import pyspark

    names = sorted(Path(jar).name for jar in connector_jars())

    assert f"spark-sql-kafka-0-10_2.13-{pyspark.__version__}.jar" in names
    assert f"spark-token-provider-kafka-0-10_2.13-{pyspark.__version__}.jar" in names
    assert [n.split("-")[0] for n in names] == ["commons", "kafka", "spark", "spark"]
    assert package() == f"org.apache.spark:spark-sql-kafka-0-10_2.13:{pyspark.__version__}"


def test_the_security_of_kafka_properties_reaches_the_jobs_python_clients(
    tmp_path: Path,
) -> None:
    """Security keys given with --kafka-properties (they win over the flags for Spark's
    connector) reach the job's own Python clients too, which read the end offsets and
    partition counts: they connected in plaintext and the job ended at once, unable to
    reach the cluster. Keys those clients cannot use are one line naming the file."""
    scram = tmp_path / "scram.properties"
    scram.write_text(
        "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\nsasl.jaas.config="
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="jobs" password="PW-SECRET";\nclient.id=repair\n'
    )
    args = retry_backfill.build_parser().parse_args(
        ["--bootstrap-servers", "h:1", "--dlq-topic", "t-dlq", "--kafka-properties", str(scram)]
    )
    _resolve_cluster(args)
    assert (args.security.security_protocol, args.security.sasl_mechanism) == (
        "SASL_SSL",
        "SCRAM-SHA-512",
    )
    assert (args.security.sasl_username, args.security.sasl_password) == (
        "jobs",
        "PW-SECRET",
    )
    oauth = tmp_path / "oauth.properties"
    oauth.write_text(
        "security.protocol=SASL_SSL\nsasl.mechanism=OAUTHBEARER\nsasl.jaas.config="
        "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;\n"
    )
    args.kafka_properties = oauth
    with pytest.raises(ConfigError, match="a Python client") as caught:
        _resolve_cluster(args)
    assert str(oauth) in str(caught.value)
