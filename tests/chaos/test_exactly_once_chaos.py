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
import textwrap
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from decaton_aio import BytesSerializer, TaskProducer
from decaton_aio.testing import BrokerHandle, wait_until
from tests.chaos.test_chaos import Instance, await_commits, run_argv
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
    argv = run_argv("eos_app:app", kafka_broker, topic, group)
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


async def test_an_instance_frozen_past_its_session_cannot_commit_when_it_wakes(
    kafka_broker: BrokerHandle, topic_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A zombie: one of two instances is frozen (SIGSTOP) past its session timeout while it
    holds open transactions; the other takes its partitions over. Woken (SIGCONT), the
    frozen one is fenced: its transactions abort, it says so, and every output is
    committed exactly once."""
    needs_transactions(kafka_broker)
    topic = await topic_factory(partitions=4)
    out = await topic_factory(partitions=2)
    group = f"eos-zombie-{uuid.uuid4().hex[:8]}"
    (tmp_path / "eos_app.py").write_text(APP)
    # A long interval keeps a transaction open while the instance is frozen.
    argv = run_argv("eos_app:app", kafka_broker, topic, group, commit_interval_ms=3000)
    monkeypatch.setenv("CHAOS_OUT", out)
    zombie, other = (Instance(f"i{n}", tmp_path, argv) for n in range(2))
    for instance in (zombie, other):
        await instance.start()
    produced: dict[int, int] = defaultdict(int)
    frozen = asyncio.Event()
    woken = asyncio.Event()

    async def produce() -> None:
        producer: TaskProducer[bytes] = TaskProducer(
            kafka_broker.producer_config(), topic, BytesSerializer()
        )
        async with producer:
            n = 0
            while not woken.is_set() or n < 600:
                where = await producer.put(f"k{n % 40}", str(n).encode())
                produced[where.partition] = max(produced[where.partition], where.offset + 1)
                n += 1
                await asyncio.sleep(0.01)

    async def freeze() -> None:
        assert zombie.proc is not None
        log = zombie.logs[-1]
        await wait_until(
            lambda: log.exists() and log.read_text().count("run ") >= 50,
            what="the zombie processing",
        )
        zombie.proc.send_signal(signal.SIGSTOP)
        frozen.set()
        # The other instance takes every partition over once the session timed out.
        other_log = other.logs[-1]
        before = other_log.read_text().count("run ")
        await asyncio.sleep(6 + 4)  # past the session timeout: time is what this tests
        await wait_until(
            lambda: other_log.read_text().count("run ") > before + 100,
            what="the other instance processing the zombie's partitions",
        )
        zombie.proc.send_signal(signal.SIGCONT)
        woken.set()

    try:
        await asyncio.gather(produce(), freeze())
        await await_commits(kafka_broker.bootstrap_servers, group, topic, produced, 120)
    finally:
        for instance in (zombie, other):
            await instance.stop(signal.SIGTERM)
    expected = {b"%d:%d" % (p, o) for p, end in produced.items() for o in range(end)}
    values = await read_committed(kafka_broker.bootstrap_servers, out, at_least=len(expected))
    counts = Counter(values)
    assert set(counts) == expected, f"{len(expected - set(counts))} outputs missing"
    assert all(n == 1 for n in counts.values()), "an output was committed twice"
    told = zombie.logs[-1].with_suffix(".err").read_text()
    assert "another instance owns this partition's transactions now" in told
