"""`python -m decaton_aio run` as a process: processes, drains on a signal, commits."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from decaton_aio.properties import encode_record
from decaton_aio.testing import BrokerHandle, committed_offsets

pytestmark = pytest.mark.integration

APP = textwrap.dedent(
    """
    import asyncio, os, sys
    from decaton_aio import Application, JsonSerializer

    DONE = os.environ["DONE_FILE"]

    async def process(ctx, task):
        await asyncio.sleep(task["sleep_s"])
        with open(DONE, "a") as out:
            out.write(f"{ctx.offset}\\n")

    app = Application(process, topics=("unused",), serializer=JsonSerializer(dict))
    """
)


async def start(
    tmp_path: Path,
    broker: BrokerHandle,
    topic: str,
    group: str,
    *extra: str,
    env: dict[str, str] | None = None,
) -> tuple[asyncio.subprocess.Process, Path]:
    (tmp_path / "cli_app.py").write_text(APP)
    done = tmp_path / "done.txt"
    done.touch()
    argv = [sys.executable, "-m", "decaton_aio", "--log-format", "json", "run", "cli_app:app"]
    argv += ["--bootstrap-servers", broker.bootstrap_servers, "--topic", topic, "--group", group]
    argv += ["--session-timeout-ms", "6000", "--heartbeat-interval-ms", "500", *extra]
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=tmp_path,
        env={**os.environ, **(env or {}), "DONE_FILE": str(done)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    return proc, done


async def lines_in(path: Path, count: int, timeout_s: float = 30) -> list[int]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        text = await asyncio.to_thread(path.read_text)
        lines = [int(x) for x in text.split()]
        if len(lines) >= count:
            return lines
        if loop.time() > deadline:
            raise TimeoutError(f"{len(lines)} of {count} tasks done")
        await asyncio.sleep(0.05)


async def test_sigterm_drains_in_flight_tasks_and_commits(
    tmp_path: Path, kafka_broker: BrokerHandle, topic_factory: Any, task_producer: Any
) -> None:
    """On SIGTERM the runner stops fetching, lets running tasks finish, commits, exits 0."""
    topic = await topic_factory(partitions=1)
    producer = await task_producer(topic)
    for i in range(20):
        sleep_s = 0.0 if i < 10 else 1.0  # the last ten are in flight at the signal
        await producer.put(f"k{i}", f'{{"sleep_s": {sleep_s}}}'.encode())
    group = f"cli-{uuid.uuid4().hex[:8]}"
    proc, done = await start(tmp_path, kafka_broker, topic, group)
    await lines_in(done, 10)
    await asyncio.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, stderr = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, stderr.decode()
    assert sorted(await lines_in(done, 20)) == list(range(20))
    committed = await committed_offsets(kafka_broker.bootstrap_servers, group, topic, [0])
    assert committed == {0: 20}
    assert b'"state": "terminated"' in stderr


async def test_second_signal_exits_at_once(
    tmp_path: Path, kafka_broker: BrokerHandle, topic_factory: Any, task_producer: Any
) -> None:
    """A second SIGINT does not wait for the drain: the process exits 130 at once."""
    topic = await topic_factory(partitions=1)
    producer = await task_producer(topic)
    await producer.put("k", b'{"sleep_s": 0.0}')
    await producer.put("slow", b'{"sleep_s": 60.0}')
    group = f"cli-{uuid.uuid4().hex[:8]}"
    proc, done = await start(tmp_path, kafka_broker, topic, group)
    await lines_in(done, 1)
    proc.send_signal(signal.SIGINT)
    await asyncio.sleep(0.3)
    assert proc.returncode is None  # draining the 60 s task
    proc.send_signal(signal.SIGINT)
    await asyncio.wait_for(proc.communicate(), 10)
    assert proc.returncode == 130


@pytest.mark.parametrize("surface", ["argv", "env", "file", "topic"])
async def test_bad_property_is_rejected_at_start(
    surface: str,
    tmp_path: Path,
    kafka_broker: BrokerHandle,
    topic_factory: Any,
    task_producer: Any,
) -> None:
    """A bad property from any surface (command line, environment, properties file,
    properties topic) fails the start with one line naming the property, what is allowed
    and where the value is (for the topic, the record that fixes it), exit 2, no
    traceback."""
    topic = await topic_factory(partitions=1)
    extra: list[str] = []
    env: dict[str, str] = {}
    if surface == "argv":
        extra = ["--property", "decaton.partition.concurency=5"]
    elif surface == "env":
        env = {"DECATON_PARTITION_CONCURRENCY": "many"}
    elif surface == "file":
        (tmp_path / "bad.properties").write_text("decaton.partition.concurrency=-3\n")
        extra = ["--properties-file", str(tmp_path / "bad.properties")]
    else:
        properties = await topic_factory(partitions=1)
        producer = await task_producer(properties)
        key, body = encode_record("decaton.partition.concurrency", 0)
        await producer.sender.send(properties, body, key=key)
        extra = ["--properties-topic", properties]
    proc, _ = await start(tmp_path, kafka_broker, topic, "g", *extra, env=env)
    _, stderr = await asyncio.wait_for(proc.communicate(), 60)
    text = stderr.decode()
    assert proc.returncode == 2, text
    message = text.strip().splitlines()[-1]
    assert "decaton.partition.concurrency" in message
    if surface != "argv":
        assert "expected an integer >= 1" in message
    where = {
        "argv": "(from --property)",
        "env": "(from the environment)",
        "file": f"(in the file {tmp_path / 'bad.properties'})",
        "topic": "in the properties topic",
    }[surface]
    assert where in message
    if surface == "topic":
        assert "a record with the name as key and no value to remove it" in message
    assert "Traceback" not in text


async def test_refused_producer_stops_run_cleanly(
    tmp_path: Path, kafka_broker: BrokerHandle, topic_factory: Any
) -> None:
    """When the cluster refuses the producer at start (--idempotence on where it is not
    granted), run exits 69 with one line saying what to do, and leaves no client open."""
    if kafka_broker.supports_idempotence:
        pytest.skip("this cluster grants an idempotent producer")
    topic = await topic_factory(partitions=1)
    proc, _ = await start(tmp_path, kafka_broker, topic, "refused", "--idempotence", "on")
    _, stderr = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 69
    text = stderr.decode()
    assert "the cluster refused an idempotent producer" in text.strip().splitlines()[-1]
    assert "Unclosed" not in text
