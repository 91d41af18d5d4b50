"""Exactly-once under SIGKILL: three instances of an ``exactly_once`` application in one
group, killed and restarted in a loop while each input task emits one output. A
read_committed reader of the output topic sees every output, each exactly once.

Apache Kafka only (skipped on Tansu). ``make test`` runs the short loop, ``make chaos``
the longer one too.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import textwrap
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from decaton_aio import BytesSerializer, TaskProducer
from decaton_aio.testing import BrokerHandle, wait_until
from tests.chaos.test_chaos import Instance, await_commits
from tests.integration.test_exactly_once import needs_transactions, read_committed

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

APP = textwrap.dedent(
    """
    import os
    from decaton_aio import Application, BytesSerializer

    LOG = open(os.environ["CHAOS_LOG"], "a", buffering=1)
    OUT = os.environ["CHAOS_OUT"]

    async def process(ctx, task):
        LOG.write(f"run {ctx.partition} {ctx.offset}\\n")
        await ctx.produce(OUT, b"%d:%d" % (ctx.partition, ctx.offset), key=ctx.key)

    app = Application(
        process, topics=("unused",), serializer=BytesSerializer(), exactly_once=True
    )
    """
)

SCENARIOS = {
    # name: (at least this many tasks, kill rounds, seconds an instance works before its
    # SIGKILL; the instances are killed in turn and restarted at once)
    "short": (1000, 3, 1.0),
    "long": (3000, 9, 1.0),
}


@pytest.mark.parametrize(
    "scenario", [pytest.param("short"), pytest.param("long", marks=pytest.mark.chaos_long)]
)
async def test_kills_never_duplicate_or_lose_an_output(
    scenario: str,
    kafka_broker: BrokerHandle,
    topic_factory: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each input's output is committed exactly once however often instances die."""
    needs_transactions(kafka_broker)
    tasks, rounds, period = SCENARIOS[scenario]
    topic = await topic_factory(partitions=4)
    out = await topic_factory(partitions=2)
    group = f"eos-chaos-{uuid.uuid4().hex[:8]}"
    (tmp_path / "eos_app.py").write_text(APP)
    argv = [sys.executable, "-m", "decaton_aio", "run", "eos_app:app", "--topic", topic]
    argv += ["--bootstrap-servers", kafka_broker.bootstrap_servers, "--group", group]
    argv += ["--session-timeout-ms", "6000", "--heartbeat-interval-ms", "500"]
    argv += ["--property", "decaton.commit.interval.ms=200"]
    monkeypatch.setenv("CHAOS_OUT", out)  # the instances inherit it
    instances = [Instance(f"i{n}", tmp_path, argv) for n in range(3)]
    for instance in instances:
        await instance.start()
    produced: dict[int, int] = defaultdict(int)  # partition -> end offset
    killing = True

    async def produce() -> None:
        # At a steady pace until the kills are over and at least ``tasks`` were sent.
        producer: TaskProducer[bytes] = TaskProducer(
            kafka_broker.producer_config(), topic, BytesSerializer()
        )
        async with producer:
            n = 0
            while killing or n < tasks:
                where = await producer.put(f"k{n % 40}", str(n).encode())
                produced[where.partition] = max(produced[where.partition], where.offset + 1)
                n += 1
                await asyncio.sleep(0.004)

    async def kills() -> None:
        nonlocal killing
        for n in range(rounds):
            victim = instances[n % len(instances)]
            # Kill it while it works: its current run has processed tasks.
            await wait_until(
                lambda v=victim: v.logs[-1].exists() and v.logs[-1].stat().st_size > 0,
                timeout_s=60,
                what=f"{victim.name} processing",
            )
            await asyncio.sleep(period)
            await victim.stop(signal.SIGKILL)
            await victim.start()
        killing = False

    try:
        await asyncio.gather(produce(), kills())
        await await_commits(kafka_broker.bootstrap_servers, group, topic, produced, 120)
    finally:
        for instance in instances:
            await instance.stop(signal.SIGTERM)
    expected = {b"%d:%d" % (p, o) for p, end in produced.items() for o in range(end)}
    values = await read_committed(kafka_broker.bootstrap_servers, out, at_least=len(expected))
    counts = Counter(values)
    assert set(counts) == expected, f"{len(expected - set(counts))} outputs missing"
    twice = sum(1 for n in counts.values() if n > 1)
    assert twice == 0, f"{twice} outputs committed more than once"
    runs = Counter(
        line
        for log in (p for i in instances for p in i.logs)
        if log.exists()
        for line in log.read_text().splitlines()
        if line.startswith("run ")
    )
    redone = sum(n - 1 for n in runs.values())
    report = tmp_path.parent / f"eos-chaos-{scenario}.json"
    report.write_text(
        json.dumps({"tasks": len(expected), "outputs": len(values), "redone": redone})
    )
    print(
        f"eos chaos {scenario}: {len(expected)} tasks, {len(values)} committed outputs, "
        f"{redone} tasks processed again after {rounds} kills"
    )
