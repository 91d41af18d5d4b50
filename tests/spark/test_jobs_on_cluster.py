"""Both jobs on a Spark standalone cluster (a master and 2 workers on loopback), each as
a user runs it: the retry backfill as ``python -m spark_jobs retry_backfill --master
spark://...``, the batch repair through ``spark-submit --py-files`` with what ``make
spark-dist`` builds, and the batch repair again from the wheel installed into a fresh
virtualenv (its console entry point). Each driver is a process of its own; the master
must list the application, so the work ran on the cluster's executors.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path
from typing import Any

import aiokafka
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from aiokafka import AIOKafkaProducer

from decaton_aio.metadata import METADATA_HEADER, TaskMetadata, encode_metadata
from decaton_aio.offsets import partition_extents
from decaton_aio.retry import dead_letter_headers
from decaton_aio.testing import BrokerHandle, read_records

pytest.importorskip("pyspark", reason="PySpark is not installed: pip install -e '.[spark]'")

import pyspark

from spark_jobs._bundle import MAIN_FILE, ZIP_FILE, build
from spark_jobs._connector import connector_jars
from spark_jobs.standalone import StandaloneCluster

# Every job starts a driver JVM and executors on the cluster: minutes on a busy machine.
pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
# What a copy of the tree for building the wheel leaves out.
_NOT_SOURCES = (
    ".git",
    ".venv",
    "build",
    "dist",
    "site",
    ".pure",
    ".fuzz",
    ".hypothesis",
    ".*cache",
    "__pycache__",
    "*.so",
)
DEAD_LETTERS = 30
# user 2 has 2 followers, not 5; user 4 has a counts row but no edge
EDGES = {"follower": [1, 3, 2], "followee": [2, 2, 1]}
COUNTS = {"user_id": [1, 2, 3, 4], "followers": [1, 5, 0, 3], "following": [1, 0, 1, 0]}


def job_env() -> dict[str, str]:
    """The environment of a job's driver: no project on PYTHONPATH (the driver finds what
    it imports where a user's would), executors on this interpreter."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYSPARK_PYTHON"] = sys.executable
    return env


def run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run a job's command; return its ``--summary-json`` (which the argv names last)."""
    result = subprocess.run(
        argv,
        cwd=cwd,
        env=env or job_env(),
        capture_output=True,
        text=True,
        timeout=500,
        check=False,
    )
    assert result.returncode == 0, f"{argv[:4]} exited {result.returncode}:\n{result.stderr}"
    summary: dict[str, Any] = json.loads(Path(argv[-1]).read_text())
    return summary


def parquet_inputs(directory: Path) -> list[str]:
    """The edges and counts as Parquet; the arguments that name them."""
    directory.mkdir()
    pq.write_table(pa.table(EDGES), directory / "edges.parquet")
    pq.write_table(pa.table(COUNTS), directory / "counts.parquet")
    return [
        "--edges",
        str(directory / "edges.parquet"),
        "--counts",
        str(directory / "counts.parquet"),
    ]


async def fill_dead_letters(broker: BrokerHandle, origin: str, dlq: str) -> None:
    """DEAD_LETTERS dead letters of ``origin`` on ``dlq``."""
    meta = encode_metadata(TaskMetadata(1, "shop", "shop-1", retry_count=3))
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap_servers)
    await producer.start()
    try:
        for i in range(DEAD_LETTERS):
            headers = dead_letter_headers(
                [(METADATA_HEADER, meta)],
                error_type="TimeoutError",
                message="it failed",
                exc=None,
                topic=origin,
                partition=i % 3,
                offset=i,
                attempts=3,
                timestamp_ms=1,
            )
            await producer.send(dlq, b"body-%d" % i, key=b"user-%d" % i, headers=headers)
        await producer.flush()
    finally:
        await producer.stop()


async def records_in(broker: BrokerHandle, topic: str) -> int:
    extents = await partition_extents(broker.bootstrap_servers, topic)
    return sum(e.high_watermark for e in extents.values())


async def test_both_jobs_run_on_the_standalone_cluster(
    spark_cluster: StandaloneCluster,
    kafka_broker: BrokerHandle,
    topic_factory: Any,
    tmp_path: Path,
) -> None:
    """The backfill sends every dead letter once and its rerun nothing (the ledger); the
    repair job, submitted with the --py-files zip, sends one task per wrong user."""
    origin = await topic_factory(partitions=3)
    dlq = await topic_factory(3, name=f"{origin}-dlq")
    repair = await topic_factory(partitions=2)
    await fill_dead_letters(kafka_broker, origin, dlq)
    servers = ["--bootstrap-servers", kafka_broker.bootstrap_servers]
    backfill = [sys.executable, "-m", "spark_jobs", "retry_backfill", "--master"]
    backfill += [spark_cluster.master_url, *servers, "--dlq-topic", dlq]
    backfill += ["--ledger", str(tmp_path / "ledger"), "--summary-json"]

    first = await asyncio.to_thread(run, [*backfill, str(tmp_path / "first.json")], ROOT)
    again = await asyncio.to_thread(run, [*backfill, str(tmp_path / "again.json")], ROOT)

    assert (first["selected"], first["sent"]) == (DEAD_LETTERS, DEAD_LETTERS)
    assert sum(first["per_partition"].values()) == DEAD_LETTERS
    assert (again["selected"], again["sent"]) == (0, 0)
    assert again["by_error_type"]["TimeoutError"]["already_backfilled"] == DEAD_LETTERS
    assert await records_in(kafka_broker, origin) == DEAD_LETTERS

    dist = tmp_path / "dist"
    build(dist)
    submit = [str(Path(pyspark.__file__).parent / "bin" / "spark-submit")]
    submit += ["--master", spark_cluster.master_url, "--jars", ",".join(connector_jars())]
    submit += ["--py-files", str(dist / ZIP_FILE), str(dist / MAIN_FILE), "batch_repair"]
    submit += [*servers, "--repair-topic", repair, *parquet_inputs(tmp_path / "in")]

    report = await asyncio.to_thread(
        run, [*submit, "--summary-json", str(tmp_path / "repair.json")], tmp_path
    )

    assert (report["inconsistent"], report["repair_tasks_sent"]) == (2, 2)
    records = await read_records(kafka_broker.bootstrap_servers, repair, 2)
    assert sorted(r.key for r in records) == [b"2", b"4"]
    ran = spark_cluster.applications()
    assert ran.count("decaton-aio-retry_backfill") == 2, ran
    assert "decaton-aio-batch_repair" in ran, ran


def _check(argv: list[Any], **kwargs: Any) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)
    assert done.returncode == 0, f"{argv} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done.stdout


def installed_venv(tmp_path: Path) -> Path:
    """A fresh virtualenv with the wheel built from a copy of this tree (pure Python, to
    build quickly, and away from the tree's own build directory) installed; the
    third-party packages come from this interpreter's site-packages (a path file), so
    PySpark is not downloaded again."""
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*_NOT_SOURCES))
    wheels = tmp_path / "wheels"
    _check(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(wheels), "."],
        cwd=source,
        env={**job_env(), "DECATON_AIO_PURE": "1"},
    )
    (wheel,) = wheels.glob("decaton_aio-*.whl")
    home = tmp_path / "venv"
    venv.create(home, with_pip=True)
    python = home / "bin" / "python"
    # Without PYTHONPATH: with the project root on it (the local Spark session puts it
    # there), pip would find the tree's own decaton_aio.egg-info and install nothing.
    _check([python, "-m", "pip", "install", "--quiet", "--no-deps", str(wheel)], env=job_env())
    (site,) = home.glob("lib/python*/site-packages")
    (site / "third_party.pth").write_text(str(Path(aiokafka.__file__).parents[1]) + "\n")
    where = _check(
        [python, "-c", "import decaton_aio_spark as m; print(m.__file__)"],
        cwd=tmp_path,
        env=job_env(),
    )
    assert where.startswith(str(home)), where
    return home


async def test_the_installed_wheel_runs_a_job_on_the_cluster(
    spark_cluster: StandaloneCluster,
    kafka_broker: BrokerHandle,
    topic_factory: Any,
    tmp_path: Path,
) -> None:
    """``decaton-aio-spark batch_repair`` from a fresh virtualenv, away from the source
    tree: the wheel holds the jobs (decaton_aio_spark) and the connector's pom."""
    home = await asyncio.to_thread(installed_venv, tmp_path)
    repair = await topic_factory(partitions=2)
    env = {**job_env(), "PYSPARK_PYTHON": str(home / "bin" / "python")}
    argv = [str(home / "bin" / "decaton-aio-spark"), "batch_repair"]
    argv += ["--master", spark_cluster.master_url]
    argv += ["--bootstrap-servers", kafka_broker.bootstrap_servers, "--repair-topic", repair]
    argv += [*parquet_inputs(tmp_path / "in"), "--summary-json", str(tmp_path / "s.json")]

    report = await asyncio.to_thread(run, argv, tmp_path, env)

    assert report["repair_tasks_sent"] == 2
    records = await read_records(kafka_broker.bootstrap_servers, repair, 2)
    assert sorted(r.key for r in records) == [b"2", b"4"]
