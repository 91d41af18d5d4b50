"""`python -m decaton_aio produce` writes Decaton-compatible tasks to a real broker."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from decaton_aio import METADATA_HEADER
from decaton_aio.producer import summarize_spool
from decaton_aio.testing import BrokerHandle, read_records
from tests.unit.protobuf_helpers import task_metadata_proto_class

pytestmark = pytest.mark.integration


async def test_produce_from_stdin_writes_dt_meta(kafka_broker: BrokerHandle, topic_factory) -> None:
    """Tasks from JSON lines land with their keys, JSON bodies and a dt_meta header that
    the protobuf library decodes field by field."""
    topic = await topic_factory(partitions=2)
    lines = [
        {"key": "user-1", "task": {"follow": 2}},
        {"key": "user-2", "task": [1, 2, 3], "scheduled_time_ms": 1_900_000_000_000},
        {"key": None, "task": "plain"},
    ]
    argv = [sys.executable, "-m", "decaton_aio", "produce", "--topic", topic]
    argv += ["--bootstrap-servers", kafka_broker.bootstrap_servers, "--application-id", "cli-test"]
    stdin = "".join(json.dumps(line) + "\n" for line in lines)
    done = await asyncio.to_thread(
        subprocess.run, argv, input=stdin, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"produced 3 tasks to {topic}")

    records = await read_records(kafka_broker.bootstrap_servers, topic, 3)
    by_body = {json.dumps(json.loads(r.value)): r for r in records}
    for line in lines:
        record = by_body[json.dumps(line["task"])]
        assert record.key == (line["key"].encode() if line["key"] else None)
        proto = task_metadata_proto_class()()
        proto.ParseFromString(dict(record.headers)[METADATA_HEADER])
        assert proto.source_application_id == "cli-test"
        assert proto.timestamp_millis == record.timestamp
        assert proto.retry_count == 0
        assert proto.scheduled_time_millis == line.get("scheduled_time_ms", 0)
        assert proto.source_instance_id


async def test_inspect_shows_committed_offsets_and_lag(
    kafka_broker: BrokerHandle, topic_factory: Any, task_producer: Any
) -> None:
    """`inspect` reports, per partition, the group's committed offset, the high
    watermark read from fetch responses, and the lag between them."""
    topic = await topic_factory(partitions=2)
    producer = await task_producer(topic)
    for i in range(10):
        await producer.put(None, b"x", partition=i % 2)
    group = f"inspect-{uuid.uuid4().hex[:8]}"
    committer = AIOKafkaConsumer(
        bootstrap_servers=kafka_broker.bootstrap_servers, group_id=group, enable_auto_commit=False
    )
    await committer.start()
    try:
        committer.assign([TopicPartition(topic, 0)])
        await committer.commit({TopicPartition(topic, 0): 3})
    finally:
        await committer.stop()
    argv = [sys.executable, "-m", "decaton_aio", "inspect", "--json", "--topic", topic]
    argv += ["--bootstrap-servers", kafka_broker.bootstrap_servers, "--group", group]
    done = await asyncio.to_thread(
        subprocess.run, argv, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    rows = {r["partition"]: r for r in map(json.loads, done.stdout.splitlines())}
    assert (rows[0]["committed"], rows[0]["high_watermark"], rows[0]["lag"]) == (3, 5, 2)
    assert (rows[1]["committed"], rows[1]["high_watermark"], rows[1]["lag"]) == (None, 5, 5)


def _produce_cli(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "decaton_aio", "produce", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("topic_exists", [True, False], ids=["topic-exists", "topic-created"])
async def test_a_spool_left_by_one_run_is_delivered_by_the_next(
    kafka_broker: BrokerHandle, topic_factory: Any, tmp_path: Path, topic_exists: bool
) -> None:
    """A run with no cluster listening keeps 100 tasks in its spool and exits 69; the next
    run, with the cluster up and one new task, delivers the 101 before it exits 0 (the
    new task after the old ones of its key), also when the topic comes to exist only
    while that run waits; a replay of the empty spool sends nothing."""
    name = f"spooled-{uuid.uuid4().hex[:8]}"
    topic = await topic_factory(partitions=2) if topic_exists else name
    spool = tmp_path / "spool"
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(f'{{"key": "k{n % 7}", "task": {n}}}\n' for n in range(100)))
    common = ["--topic", topic, "--spool-dir", str(spool)]

    first = await asyncio.to_thread(
        _produce_cli, *common, "--bootstrap-servers", "127.0.0.1:1", "--file", str(tasks),
        "--drain-timeout-s", "0",
    )  # fmt: skip
    assert first.returncode == 69, first.stderr
    assert f"100 tasks still spooled in {spool}" in first.stdout

    (tmp_path / "one.jsonl").write_text('{"key": "k0", "task": 100}\n')
    servers = kafka_broker.bootstrap_servers
    one = str(tmp_path / "one.jsonl")
    second_run = asyncio.create_task(asyncio.to_thread(
        _produce_cli, *common, "--bootstrap-servers", servers, "--file", one,
        "--drain-timeout-s", "60",
    ))  # fmt: skip
    if not topic_exists:
        # Created while the run waits for its spool (a broker that creates topics on first
        # use may have made it already: then it is taken as it is).
        await asyncio.sleep(2.0)
        await topic_factory(partitions=1, name=topic)
    second = await second_run
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"spool {spool}: 100 tasks left by an earlier run" in second.stdout
    assert "delivered 101 tasks from the spool" in second.stdout
    assert summarize_spool(spool).entries == 0
    records = await read_records(servers, topic, 101)
    k0 = [json.loads(r.value) for r in records if r.key == b"k0"]
    assert sorted(json.loads(r.value) for r in records) == list(range(101))
    assert k0 == sorted(k0)  # per key, in spool order

    third = await asyncio.to_thread(
        _produce_cli, *common, "--bootstrap-servers", servers, "--replay-only"
    )
    assert third.returncode == 0, third.stderr
    assert third.stdout == ""


async def test_replay_only_delivers_the_spools_run_workers_left(
    kafka_broker: BrokerHandle, topic_factory: Any, tmp_path: Path
) -> None:
    """``run --workers 3 --spool-dir D`` keeps a spool per worker in D/worker-<n>; a later
    ``produce --spool-dir D --replay-only`` counts and delivers them (it used to look at
    D alone, print nothing and exit 0 with the tasks still on disk)."""
    topic = await topic_factory(partitions=1)
    spool = tmp_path / "spool"
    for worker, first in ((2, 0), (3, 10)):
        tasks = tmp_path / f"tasks-{worker}.jsonl"
        tasks.write_text("".join(f'{{"key": "k", "task": {n}}}\n' for n in range(first, first + 5)))
        left = await asyncio.to_thread(
            _produce_cli, "--topic", topic, "--spool-dir", str(spool / f"worker-{worker}"),
            "--bootstrap-servers", "127.0.0.1:1", "--file", str(tasks), "--drain-timeout-s", "0",
        )  # fmt: skip
        assert left.returncode == 69, left.stderr
    assert summarize_spool(spool).entries == 10

    replay = await asyncio.to_thread(
        _produce_cli, "--topic", topic, "--spool-dir", str(spool),
        "--bootstrap-servers", kafka_broker.bootstrap_servers, "--replay-only",
    )  # fmt: skip
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert f"spool {spool}: 10 tasks left by an earlier run" in replay.stdout
    assert f"delivered 10 tasks from the spool {spool}" in replay.stdout
    assert summarize_spool(spool).entries == 0
    records = await read_records(kafka_broker.bootstrap_servers, topic, 10)
    assert sorted(json.loads(r.value) for r in records) == [*range(5), *range(10, 15)]


async def test_a_task_too_large_to_send_names_its_line_and_what_was_delivered(
    kafka_broker: BrokerHandle, topic_factory: Any, tmp_path: Path
) -> None:
    """A task the cluster can never take ends the run with one line: where it is, why,
    how many tasks were delivered before it (a rerun would send them again), exit 65; the
    lines after it are not sent."""
    topic = await topic_factory(partitions=1)
    tasks = tmp_path / "tasks.jsonl"
    lines = [{"key": "a", "task": 1}, None, {"key": "b", "task": "x" * (2 << 20)}]
    lines.append({"key": "c", "task": 3})
    tasks.write_text("".join(f"{json.dumps(line) if line else ''}\n" for line in lines))
    run = await asyncio.to_thread(
        _produce_cli, "--topic", topic, "--file", str(tasks), "--idempotence", "off",
        "--bootstrap-servers", kafka_broker.bootstrap_servers,
    )  # fmt: skip
    assert run.returncode == 65, run.stdout + run.stderr
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith(f"decaton-aio: {tasks}:3: the broker can never take this record")
    assert "1 of 3 tasks were delivered (a rerun of the whole input sends them again" in line
    records = await read_records(kafka_broker.bootstrap_servers, topic, 1)
    assert [json.loads(r.value) for r in records] == [1]
