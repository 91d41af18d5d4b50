"""Per-key state under exactly-once and SIGKILL: instances of an ``exactly_once``
application that counts each key's tasks in ctx.state (kept in memory, so every
assignment restores it from the changelog) and emits ``<key>:<count>`` per task are killed
and restarted in turn while tasks flow. Each key's committed outputs are the counts
1..n exactly once, where n is its number of tasks, and a read_committed read of the
changelog ends at n for every key.

Apache Kafka only (skipped on Tansu).
"""

from __future__ import annotations

import asyncio
import signal
import textwrap
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import msgspec
import pytest

from decaton_aio import BytesSerializer, TaskProducer
from decaton_aio.testing import BrokerHandle
from tests.chaos.test_chaos import Instance, await_commits, run_argv
from tests.integration.test_exactly_once import needs_transactions, read_all

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

APP = textwrap.dedent(
    """
    import os
    from decaton_aio import Application, BytesSerializer, StateStoreConfig

    OUT = os.environ["CHAOS_OUT"]

    async def process(ctx, task):
        count = ctx.state.get(0) + 1
        ctx.state.set(count)
        await ctx.produce(OUT, b"%s:%d" % (ctx.key, count), key=ctx.key)

    app = Application(
        process,
        topics=("unused",),
        serializer=BytesSerializer(),
        exactly_once=True,
        state=StateStoreConfig("counts"),
    )
    """
)

KEYS = 30
TASKS = 900
KILLS = 3


async def test_kills_never_count_a_task_twice(
    kafka_broker: BrokerHandle, topic_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """However often instances die mid-transaction, state, outputs and changelog agree:
    every key's count is its number of tasks, each count committed once."""
    needs_transactions(kafka_broker)
    topic = await topic_factory(partitions=4)
    out = await topic_factory(partitions=2)
    group = f"eos-state-chaos-{uuid.uuid4().hex[:8]}"
    (tmp_path / "eos_state_app.py").write_text(APP)
    argv = run_argv("eos_state_app:app", kafka_broker, topic, group)
    monkeypatch.setenv("CHAOS_OUT", out)
    instances = [Instance(f"i{n}", tmp_path, argv) for n in range(2)]
    for instance in instances:
        await instance.start()
    produced: dict[int, int] = defaultdict(int)  # partition -> end offset
    per_key: Counter[str] = Counter()
    # kill n happens once (n + 1) / (KILLS + 1) of the tasks were sent
    due = [asyncio.Event() for _ in range(KILLS)]

    async def produce() -> None:
        producer: TaskProducer[bytes] = TaskProducer(
            kafka_broker.producer_config(), topic, BytesSerializer()
        )
        async with producer:
            for n in range(TASKS):
                key = f"k{n % KEYS}"
                where = await producer.put(key, str(n).encode())
                produced[where.partition] = max(produced[where.partition], where.offset + 1)
                per_key[key] += 1
                for kill, event in enumerate(due):
                    if n + 1 >= (kill + 1) * TASKS // (KILLS + 1):
                        event.set()
                await asyncio.sleep(0.005)  # a steady pace

    async def kills() -> None:
        for n in range(KILLS):
            await due[n].wait()
            victim = instances[n % len(instances)]
            await victim.stop(signal.SIGKILL)
            await victim.start()

    try:
        await asyncio.gather(produce(), kills())
        await await_commits(kafka_broker.bootstrap_servers, group, topic, produced, 120)
    finally:
        for instance in instances:
            await instance.stop(signal.SIGTERM)

    committed: dict[str, list[int]] = defaultdict(list)
    for record in await read_all(kafka_broker.bootstrap_servers, out, at_least=TASKS):
        key, count = record.value.decode().split(":")
        committed[key].append(int(count))
    assert {k: sorted(v) for k, v in committed.items()} == {
        k: list(range(1, n + 1)) for k, n in per_key.items()
    }
    last: dict[str, int] = {}
    changelog = f"{group}-counts-changelog"
    for record in await read_all(kafka_broker.bootstrap_servers, changelog):
        last[record.key.decode()] = msgspec.msgpack.decode(record.value)
    assert last == dict(per_key)
