"""The counter example as a process: kill -9 mid-stream, restart, and the counts are exact.

``python -m decaton_aio run examples.counter.processor:app`` keeps each user's count in
``ctx.state`` (SQLite copies in ``$COUNTER_STATE_DIR``, a compacted changelog). SIGKILL
loses the uncommitted offsets and the copies' last uncommitted changes; the restart
restores from the copies' checkpoints and the changelog, and the redelivered views are
recognised by the offset kept in the state.
"""

from __future__ import annotations

import asyncio
import json
import signal
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from decaton_aio.offsets import group_positions
from decaton_aio.testing import BrokerHandle, topic_partitions
from tests.integration.test_follow_example import start_example

pytestmark = pytest.mark.integration


async def start_counter(
    broker: BrokerHandle, topic: str, group: str, state: Path, log: Path, *extra: str
) -> asyncio.subprocess.Process:
    """Start the counter as its own process, logging JSON lines to ``log``."""
    app, env = "examples.counter.processor:app", {"COUNTER_STATE_DIR": str(state)}
    return await start_example(broker, app, topic, group, log, env, *extra, log_level="info")


async def last_values(bootstrap_servers: str, topic: str) -> dict[str, Any]:
    """The newest value of every key of a changelog (what a restore ends with)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap_servers, enable_auto_commit=False)
    await consumer.start()
    values: dict[str, Any] = {}
    try:
        tps = [TopicPartition(topic, p) for p in await topic_partitions(consumer, topic)]
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                for record in records:
                    value = record.value
                    decoded = None if value is None else msgspec.msgpack.decode(value)
                    values[record.key.decode()] = decoded
    finally:
        await consumer.stop()
    return values


def restores(log: Path) -> list[dict[str, Any]]:
    """The "state restored" events of the log."""
    found = []
    for line in log.read_text().splitlines():
        if '"state restored"' in line:
            found.append(json.loads(line))
    return found


async def eventually(predicate: Any, what: str, timeout_s: float = 90.0) -> None:
    """Poll ``await predicate()`` until it is true."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await predicate():
        if loop.time() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.2)


async def test_counts_are_exact_after_sigkill_and_restart(
    kafka_broker: BrokerHandle, topic_factory: Any, task_producer: Any, tmp_path: Path
) -> None:
    """Given 3,000 views of 60 users on 3 partitions, when the counter is killed with
    SIGKILL mid-stream and restarted on its state directory, then once the group committed
    everything, every user's count in the changelog equals its views, and the restart
    restored every partition from its copy."""
    topic = await topic_factory(partitions=3)
    users = [f"user-{i % 60}" for i in range(3000)]
    producer = await task_producer(topic)
    await asyncio.gather(*[await producer.submit(u, b"view") for u in users])
    group = f"counter-{uuid.uuid4().hex[:8]}"
    state, log = tmp_path / "state", tmp_path / "counter.log"
    bootstrap = kafka_broker.bootstrap_servers

    async def committed() -> int:
        return sum(p.committed or 0 for p in await group_positions(bootstrap, group, topic))

    slow = ("--property", "decaton.processing.rate.per.partition=200")
    first = await start_counter(kafka_broker, topic, group, state, log, *slow)
    try:
        await eventually(lambda: _ge(committed(), 600), "600 committed views")
    finally:
        first.send_signal(signal.SIGKILL)
        await first.wait()
    assert first.returncode == -signal.SIGKILL
    assert await committed() < len(users)

    second = await start_counter(kafka_broker, topic, group, state, log)
    try:
        await eventually(lambda: _ge(committed(), len(users)), "every view committed")
    finally:
        second.send_signal(signal.SIGTERM)
        await asyncio.wait_for(second.wait(), 30)
    assert second.returncode == 0, log.read_text()[-3000:]

    counts = await last_values(bootstrap, f"{group}-visits-changelog")
    assert {user: value["count"] for user, value in counts.items()} == Counter(users)
    restored = restores(log)
    assert sorted(r["partition"] for r in restored[-3:]) == [0, 1, 2]
    print("replayed on restart:", [r["replayed"] for r in restored[-3:]])


async def _ge(value: Any, target: int) -> bool:
    return bool(await value >= target)
