"""Compressed topics: batches of every codec are consumed, whoever wrote them, and the
task producer compresses with the codec it is given."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from decaton_aio import Application, BytesSerializer, TaskProducer
from decaton_aio.embedded._apache_kafka import java_executable, resolve_kafka_classpath
from decaton_aio.producer import COMPRESSION_TYPES
from decaton_aio.testing import BrokerHandle, drain

pytestmark = pytest.mark.integration

TASKS = 40

APP = textwrap.dedent(
    """
    import json, os
    from decaton_aio import Application, JsonSerializer

    async def process(ctx, task):
        with open(os.environ["DONE_FILE"], "a") as out:
            out.write(json.dumps([ctx.topic, ctx.key.decode(), task]) + "\\n")

    app = Application(process, topics=("unused",), serializer=JsonSerializer(dict))
    """
)


def _java_produce(servers: str, topic: str, codec: str, lines: list[str]) -> None:
    """Write ``key|value`` lines with Kafka's own Java producer, compressed with ``codec``."""
    argv = [java_executable(), "-cp", resolve_kafka_classpath()]
    argv += ["org.apache.kafka.tools.ConsoleProducer", "--bootstrap-server", servers]
    argv += ["--topic", topic, "--compression-codec", codec]
    argv += ["--property", "parse.key=true", "--property", "key.separator=|"]
    argv += ["--producer-property", "linger.ms=50", "--producer-property", "acks=all"]
    done = subprocess.run(
        argv, input="".join(f"{line}\n" for line in lines), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]


async def test_java_producer_batches_of_every_codec_are_processed_by_run(
    tmp_path: Path, kafka_broker: BrokerHandle, topic_factory: Any
) -> None:
    """Given one topic per codec, stored compressed with it (topic compression.type) and
    written by Kafka's Java console producer with it, `python -m decaton_aio run` with
    default flags processes every task of every topic."""
    if kafka_broker.flavor == "tansu":
        pytest.skip("the Java producer runs beside Apache Kafka; Tansu is the Java-free leg")
    topics = {
        codec: await topic_factory(partitions=2, configs={"compression.type": codec})
        for codec in COMPRESSION_TYPES
    }
    expected: set[tuple[str, str, str]] = set()
    for codec, topic in topics.items():
        lines = [f"k{i % 5}|" + json.dumps({"n": i, "codec": codec}) for i in range(TASKS)]
        await asyncio.to_thread(_java_produce, kafka_broker.bootstrap_servers, topic, codec, lines)
        expected |= {(topic, f"k{i % 5}", f"{codec}:{i}") for i in range(TASKS)}

    (tmp_path / "codec_app.py").write_text(APP)
    done = tmp_path / "done.jsonl"
    done.touch()
    argv = [sys.executable, "-m", "decaton_aio", "run", "codec_app:app"]
    argv += ["--bootstrap-servers", kafka_broker.bootstrap_servers, "--group", "codecs"]
    for topic in topics.values():
        argv += ["--topic", topic]
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=tmp_path,
        env={**os.environ, "DONE_FILE": str(done), "PYTHONPATH": "."},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    seen: set[tuple[str, str, str]] = set()
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while seen != expected and proc.returncode is None and loop.time() < deadline:
            await asyncio.sleep(0.1)
            for line in (await asyncio.to_thread(done.read_text)).splitlines():
                topic, key, task = json.loads(line)
                seen.add((topic, key, f"{task['codec']}:{task['n']}"))
    finally:
        if proc.returncode is None:
            proc.terminate()
        _, stderr = await asyncio.wait_for(proc.communicate(), 30)
    assert seen == expected, stderr.decode()[-2000:]


@pytest.mark.parametrize("codec", COMPRESSION_TYPES)
async def test_task_producer_compresses_and_the_runtime_reads_it(
    kafka_broker: BrokerHandle, topic_factory: Any, codec: str
) -> None:
    """Tasks put by a producer compressing with ``codec`` are all processed."""
    topic = await topic_factory(partitions=2)
    config = kafka_broker.producer_config(compression_type=codec, linger_ms=20)
    async with TaskProducer(config, topic, BytesSerializer()) as producer:
        tasks = [b"x" * 100 + str(i).encode() for i in range(TASKS)]
        await asyncio.gather(*[await producer.submit(f"k{i % 3}", t) for i, t in enumerate(tasks)])
    app = Application(_noop, topics=(topic,), serializer=BytesSerializer())
    result = await drain(app, kafka_broker.bootstrap_servers, expected=TASKS, timeout_s=30)
    assert sorted(t.task for t in result.processed) == sorted(tasks)


async def _noop(ctx: Any, task: bytes) -> None:
    return None
