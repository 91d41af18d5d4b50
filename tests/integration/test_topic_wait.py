"""A service started before its task topic exists waits for it, not ready meanwhile, and
processes the topic once it is created."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from decaton_aio import Application, ProcessingContext
from decaton_aio.consumer import HealthCheck, SubscriptionState
from decaton_aio.testing import BrokerHandle, wait_until
from tests.integration.test_operations import eventually, probe

pytestmark = pytest.mark.integration


async def test_a_subscription_waits_for_its_task_topic_not_ready_meanwhile(
    kafka_broker: BrokerHandle, topic_factory: Any, task_producer: Any
) -> None:
    """Given no task topic, the start waits and /readyz is 503 naming the topic; when the
    topic is created and tasks are produced, they are processed and /readyz is 200."""
    topic = f"later-{uuid.uuid4().hex[:8]}"
    processed: list[bytes] = []

    async def process(ctx: ProcessingContext, task: bytes) -> None:
        processed.append(task)

    sub = kafka_broker.subscription(Application(process, topics=(topic,)))
    port = sub.metrics.start_http_server(0, probes=HealthCheck(sub))
    starting = asyncio.create_task(sub.start())
    try:
        await wait_until(lambda: bool(sub.waiting_for_topics), what="the wait for the topic")
        status, body = await probe(port, "/readyz")
        assert status == 503
        assert f"waiting for the task topics {topic} to be created" in body["reasons"]
        assert not starting.done()
        await topic_factory(partitions=2, name=topic)
        await asyncio.wait_for(starting, 30)
        assert sub.waiting_for_topics == ()
        producer = await task_producer(topic)
        for i in range(10):
            await producer.put(f"k{i}", f"task-{i}".encode())
        await wait_until(lambda: len(processed) == 10, timeout_s=60, what="ten tasks")

        async def ready() -> bool:
            return (await probe(port, "/readyz"))[0] == 200

        await eventually(ready, "ready", timeout_s=60)
    finally:
        await sub.stop()
        sub.metrics.stop()
    assert sorted(processed) == sorted(f"task-{i}".encode() for i in range(10))


async def test_a_stop_while_waiting_ends_the_start(kafka_broker: BrokerHandle) -> None:
    """Stopped while it waits for its task topic, the start returns without consuming
    and the subscription is terminated."""

    async def process(ctx: ProcessingContext, task: bytes) -> None:
        raise AssertionError("nothing to process")

    sub = kafka_broker.subscription(Application(process, topics=(f"never-{uuid.uuid4().hex}",)))
    starting = asyncio.create_task(sub.start())
    await wait_until(lambda: bool(sub.waiting_for_topics), what="the wait for the topic")
    await sub.stop()
    await asyncio.wait_for(starting, 10)
    assert sub.state is SubscriptionState.TERMINATED
    assert sub.partitions == {}
    await sub.wait_stopped()


APP = textwrap.dedent(
    """
    from decaton_aio import Application

    async def process(ctx, task):
        ctx.logger.info("processed", task=task.decode())

    app = Application(process, topics=("unused",))
    """
)


async def test_run_waits_for_its_task_topic_then_processes_it(
    tmp_path: Path, kafka_broker: BrokerHandle, topic_factory: Any, task_producer: Any
) -> None:
    """`run` started before its task topic exists logs once what it waits for and keeps
    running; /readyz is 503 until the topic is created, tasks produced then are processed,
    /readyz turns 200, and SIGTERM ends it with 0."""
    topic = f"later-{uuid.uuid4().hex[:8]}"
    (tmp_path / "later_app.py").write_text(APP)
    argv = [sys.executable, "-m", "decaton_aio", "--log-format", "json", "run", "later_app:app"]
    argv += ["--bootstrap-servers", kafka_broker.bootstrap_servers, "--topic", topic]
    argv += ["--group", f"later-{uuid.uuid4().hex[:8]}", "--metrics-port", "0"]
    argv += ["--session-timeout-ms", "6000", "--heartbeat-interval-ms", "500"]
    if not kafka_broker.supports_idempotence:
        argv += ["--idempotence", "off"]
    log = tmp_path / "stderr.jsonl"
    with log.open("wb") as stderr:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=tmp_path,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=stderr,
        )

    def events(name: str) -> list[dict[str, Any]]:
        found = []
        for line in log.read_text().splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if event.get("event") == name:
                found.append(event)
        return found

    try:
        [endpoint] = await eventually(
            lambda: asyncio.to_thread(events, "metrics endpoint"), "the metrics endpoint"
        )
        port = int(endpoint["url"].rsplit(":", 1)[1].split("/")[0])
        [waiting] = await eventually(
            lambda: asyncio.to_thread(events, "waiting for task topics to be created"),
            "the waiting line",
        )
        assert waiting["topics"] == [topic]
        status, body = await probe(port, "/readyz")
        assert status == 503
        assert f"waiting for the task topics {topic} to be created" in body["reasons"]
        assert proc.returncode is None
        await topic_factory(partitions=1, name=topic)
        producer = await task_producer(topic)
        for i in range(5):
            await producer.put(f"k{i}", f"task-{i}".encode())

        def five_processed() -> list[dict[str, Any]]:
            found = events("processed")
            return found if len(found) >= 5 else []

        done = await eventually(
            lambda: asyncio.to_thread(five_processed), "five tasks processed", timeout_s=60
        )
        assert sorted(e["task"] for e in done) == [f"task-{i}" for i in range(5)]

        async def ready() -> bool:
            return (await probe(port, "/readyz"))[0] == 200

        await eventually(ready, "ready", timeout_s=60)
        assert len(events("waiting for task topics to be created")) == 1
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), 60)
    assert code == 0, log.read_text()[-3000:]
