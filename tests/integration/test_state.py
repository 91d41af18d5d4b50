"""Per-key state (``ctx.state``) on a real broker: changelog, restore, checkpoints."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pytest

from decaton_aio import Application, ProcessingContext, StateStoreConfig
from decaton_aio.testing import BrokerHandle, read_records, wait_until

pytestmark = pytest.mark.integration


async def produce(task_producer: Any, topic: str, keys: list[str]) -> None:
    producer = await task_producer(topic)
    futures = [await producer.submit(key, b"1") for key in keys]
    await asyncio.gather(*futures)


def counting_app(topic: str, store: StateStoreConfig, seen: dict[str, int]) -> Application:
    async def process(ctx: ProcessingContext, task: bytes) -> None:
        count = ctx.state.get(0) + 1
        ctx.state.set(count)
        seen[ctx.key.decode()] = count  # type: ignore[union-attr]

    return Application(process, topics=(topic,), state=store)


async def run_until(
    broker: BrokerHandle, app: Application, group: str, done: Any, what: str
) -> Any:
    sub = broker.subscription(app, group_id=group)
    async with sub:
        await wait_until(done, what=what, timeout_s=60)
        return sub.state_store.reader.history[:] if sub.state_store else []


async def test_counts_survive_a_restart_and_reach_the_changelog(
    kafka_broker: BrokerHandle, topic_factory: Any, task_producer: Any, tmp_path: Path
) -> None:
    """A per-key counter kept in ctx.state counts every task of its key once; the changelog
    holds each change (the last record of a key is its count); a second subscription of
    the group (a restart, on the same directory) goes on counting from the restored values,
    and replays only the changes made after the first one's checkpoint (none)."""
    topic = await topic_factory(partitions=2)
    keys = [f"user-{i % 7}" for i in range(140)]
    await produce(task_producer, topic, keys)
    group = f"state-{uuid.uuid4().hex[:8]}"
    store = StateStoreConfig("counts", directory=tmp_path)
    seen: dict[str, int] = {}
    app = counting_app(topic, store, seen)
    await run_until(
        kafka_broker, app, group, lambda: all(seen.get(k) == 20 for k in set(keys)), "20 per key"
    )

    changelog = store.changelog_topic(group)
    records = await read_records(kafka_broker.bootstrap_servers, changelog, 140)
    last = {r.key.decode(): r.value for r in records if r.key is not None}
    assert {k: msgspec.msgpack.decode(v) for k, v in last.items()} == {k: 20 for k in set(keys)}

    await produce(task_producer, topic, keys)
    seen.clear()
    history = await run_until(
        kafka_broker, app, group, lambda: all(seen.get(k) == 40 for k in set(keys)), "40 per key"
    )
    assert sorted(h.partition for h in history) == [0, 1]
    assert sum(h.replayed for h in history) == 0  # the files' checkpoints were at the end
    assert Counter(seen.values()) == Counter({40: 7})
