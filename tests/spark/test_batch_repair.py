"""Batch repair: the job finds exactly the corrupted users, the processor fixes them.

Spark calls block, so the async tests run them in a thread and keep their event loop free.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from decaton_aio import JsonSerializer
from decaton_aio.metadata import metadata_from_headers
from decaton_aio.offsets import partition_extents
from decaton_aio.testing import BrokerHandle, drain, read_records
from examples.follow.processor import RepairProcessor, repair_app
from examples.follow.producer import generate_events
from examples.follow.store import FollowStore, corrupt_counts, find_inconsistencies, open_database
from examples.follow.tasks import RepairTask

pytest.importorskip("pyspark", reason="PySpark is not installed: pip install -e '.[spark]'")

from pyspark.sql import SparkSession

from spark_jobs.batch_repair import RepairOptions, main, run_repair

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]


async def filled_database(path: Path, events: int = 3000, users: int = 300) -> None:
    """A follow database with ``events`` generated events applied (consistent counts)."""
    store = FollowStore(path)
    try:
        for event in generate_events(events, users=users, seed=5):
            await store.apply(event)
    finally:
        await store.close()


@pytest.mark.integration
async def test_one_repair_task_per_corrupted_user_then_every_count_is_right(
    spark: SparkSession, kafka_broker: BrokerHandle, topic_factory: Any, tmp_path: Path
) -> None:
    """Given 17 users with broken counts (off by a few, row deleted, phantom rows), the job
    sends exactly 17 repair tasks keyed by those users; once the repair processor has run
    them, no user is inconsistent."""
    db = tmp_path / "follow.db"
    await filled_database(db)
    conn = open_database(db)
    broken = corrupt_counts(conn, 17, seed=3)
    assert len(find_inconsistencies(conn)) == 17
    conn.close()
    topic = await topic_factory(partitions=3)
    bootstrap = kafka_broker.bootstrap_servers
    options = RepairOptions(bootstrap, topic, sqlite=str(db))

    report = await asyncio.to_thread(run_repair, spark, options)

    assert (report.inconsistent, report.repair_tasks_sent) == (17, 17)
    assert report.missing_counts + report.orphan_counts > 0
    assert sum(report.per_partition.values()) == 17
    extents = await partition_extents(bootstrap, topic)
    assert sum(e.high_watermark for e in extents.values()) == 17  # nothing more
    records = await read_records(bootstrap, topic, 17)
    assert sorted(int(r.key) for r in records) == broken
    decode = JsonSerializer(RepairTask).decode
    for record in records:
        task = decode(record.value)
        assert task.user_id == int(record.key)
        assert metadata_from_headers(record.headers, 0).source_application_id == (
            "decaton-aio-batch-repair"
        )

    processor = RepairProcessor(FollowStore(db))
    await drain(
        repair_app(processor, topic=topic),
        bootstrap,
        expected=17,
        producer=kafka_broker.producer_config(),
        raise_failures=True,
    )
    await processor.store.close()
    assert (processor.checked, processor.fixed) == (17, 17)
    conn = open_database(db)
    assert find_inconsistencies(conn) == []
    conn.close()


def test_parquet_inputs_dry_run_from_the_command_line(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Parquet edges (with an ``active`` column) and counts: a dry run reports the users
    that are off and sends nothing; the summary is also written as JSON."""
    edges = [(1, 2, True), (3, 2, True), (2, 1, True), (4, 1, False), (5, 6, True)]
    counts = [
        (1, 1, 1),  # right
        (2, 2, 1),  # right
        (3, 0, 0),  # following is 1
        (4, 1, 0),  # the unfollow was counted as a follow: 0/0 expected
        (6, 1, 0),  # right
        (9, 0, 0),  # no edges and 0/0: right
        (7, 2, 2),  # phantom
    ]  # user 5 has no row but follows 6
    spark.createDataFrame(edges, "follower long, followee long, active boolean").write.parquet(
        str(tmp_path / "edges")
    )
    spark.createDataFrame(counts, "user_id long, followers long, following long").write.parquet(
        str(tmp_path / "counts")
    )
    summary = tmp_path / "summary.json"
    argv = ["--edges", str(tmp_path / "edges"), "--counts", str(tmp_path / "counts")]
    argv += ["--repair-topic", "unused", "--dry-run", "--summary-json", str(summary)]

    assert main(argv, spark=spark) == 0

    data = json.loads(summary.read_text())
    assert data["inconsistent"] == 4
    assert [row["user_id"] for row in data["sample"]] == [3, 4, 5, 7]
    assert (data["missing_counts"], data["orphan_counts"], data["repair_tasks_sent"]) == (1, 2, 0)
    assert "would send to unused" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--repair-topic", "t", "--dry-run"], "the input is missing"),
        (["--repair-topic", "t", "--sqlite", "a.db", "--edges", "e"], "either --sqlite or"),
        (["--repair-topic", "t", "--sqlite", __file__], "--bootstrap-servers is required"),
        (["--repair-topic", "t", "--sqlite", "missing.db"], "--sqlite missing.db: no such file"),
        (["--sqlite", "a.db"], "the following arguments are required: --repair-topic"),
    ],
)
def test_bad_arguments_give_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    """Each bad command line is refused before Spark starts, with one line on stderr."""
    monkeypatch.delenv("DECATON_AIO_BOOTSTRAP_SERVERS", raising=False)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert message in err


def test_runs_as_a_module_with_help_and_errors() -> None:
    """``python -m spark_jobs.batch_repair`` has --help and exits 2 on a missing input."""
    env = {k: v for k, v in os.environ.items() if k != "DECATON_AIO_BOOTSTRAP_SERVERS"}
    run = [sys.executable, "-m", "spark_jobs.batch_repair"]
    helped = subprocess.run([*run, "--help"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert helped.returncode == 0
    assert "--repair-topic" in helped.stdout
    bad = subprocess.run(
        [*run, "--repair-topic", "t", "--sqlite", str(ROOT / "no-such.db"), "--dry-run"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        f"batch_repair: --sqlite {ROOT / 'no-such.db'}: no such file"
    ]
