"""Several instances of one application in one group, killed and restarted while tasks
flow: every task is processed at least once, a key's tasks run one at a time and in
offset order between rebalances (a rebalance may rewind a key to its committed point),
and the group's commits reach the end.

``make chaos`` runs every scenario; ``make test`` runs the short one.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import sys
import textwrap
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from decaton_aio import BytesSerializer, TaskProducer
from decaton_aio.offsets import group_positions
from decaton_aio.testing import BrokerHandle

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

APP = textwrap.dedent(
    """
    import asyncio, os, time
    import structlog
    from decaton_aio import Application, BytesSerializer

    LOG = open(os.environ["CHAOS_LOG"], "a", buffering=1)

    def epochs(logger, name, event):
        # A rebalance starts a new epoch: a key may rewind to its committed point there.
        if event.get("event") in ("partitions assigned", "partitions revoked"):
            LOG.write(f"epoch 0 0 - {time.monotonic_ns()}\\n")
        return event

    structlog.configure(processors=[epochs, *structlog.get_config()["processors"]])

    async def process(ctx, task):
        LOG.write(f"start {ctx.partition} {ctx.offset} {ctx.key.decode()} {time.monotonic_ns()}\\n")
        await asyncio.sleep(0.002)
        LOG.write(f"end {ctx.partition} {ctx.offset} {ctx.key.decode()} {time.monotonic_ns()}\\n")

    app = Application(process, topics=("unused",), serializer=BytesSerializer())
    """
)


@dataclass
class Instance:
    """One `python -m decaton_aio run` process and its incarnations' logs."""

    name: str
    workdir: Path
    argv: list[str]
    proc: asyncio.subprocess.Process | None = None
    runs: int = 0
    logs: list[Path] = field(default_factory=list)

    async def start(self) -> None:
        self.runs += 1
        log = self.workdir / f"{self.name}-{self.runs}.log"
        self.logs.append(log)
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv,
            cwd=self.workdir,
            env={**os.environ, "CHAOS_LOG": str(log), "PYTHONPATH": str(self.workdir)},
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )

    async def stop(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(sig)
            await asyncio.wait_for(self.proc.wait(), 60)


def read_runs(instances: list[Instance]) -> list[list[tuple[str, int, int, str, int]]]:
    """Each incarnation's events: (kind, partition, offset, key, monotonic ns)."""
    runs = []
    for instance in instances:
        for log in instance.logs:
            events = []
            for line in log.read_text().splitlines() if log.exists() else []:
                parts = line.split()
                if len(parts) == 5:  # a line cut by SIGKILL is dropped
                    kind, partition, offset, key, at = parts
                    events.append((kind, int(partition), int(offset), key, int(at)))
            runs.append(events)
    return runs


def check_guarantees(
    runs: list[list[tuple[str, int, int, str, int]]], produced: set[tuple[int, int]]
) -> int:
    """Assert the guarantees; return how many tasks ran more than once.

    Raises:
        AssertionError: a task never processed, a key's tasks out of offset order within
            one incarnation, or two tasks of a key running at the same time.
    """
    ended = [(p, o) for run in runs for kind, p, o, _, _ in run if kind == "end"]
    missing = produced - set(ended)
    assert not missing, f"{len(missing)} tasks never processed, e.g. {sorted(missing)[:5]}"
    for run in runs:
        last: dict[tuple[int, str], int] = {}
        for kind, partition, offset, key, _ in run:
            if kind == "epoch":
                last.clear()  # after a rebalance a key starts again at its committed point
            if kind != "start":
                continue
            lane = (partition, key)
            assert offset > last.get(lane, -1), f"key {key} ran {offset} after {last[lane]}"
            last[lane] = offset
    intervals: dict[tuple[int, str], list[tuple[int, int]]] = defaultdict(list)
    for run in runs:
        begun: dict[tuple[int, int], int] = {}
        for kind, partition, offset, key, at in run:
            if kind == "start":
                begun[(partition, offset)] = at
            elif (partition, offset) in begun:
                intervals[(partition, key)].append((begun.pop((partition, offset)), at))
    for lane, spans in intervals.items():
        spans.sort()
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert start >= end, f"two tasks of key {lane} overlapped"
    return len(ended) - len(set(ended))


def test_the_checks_fail_on_bad_runs() -> None:
    """The guarantee checks see a lost task, a key out of order and an overlap, and let a
    key rewind at a rebalance."""
    ok = [("start", 0, 0, "a", 1), ("end", 0, 0, "a", 2), ("start", 0, 1, "a", 3)]
    with pytest.raises(AssertionError, match="1 tasks never processed"):
        check_guarantees([ok], {(0, 0), (0, 1)})
    backwards = [("start", 0, 1, "a", 1), ("end", 0, 1, "a", 2), ("start", 0, 0, "a", 3)]
    with pytest.raises(AssertionError, match="ran 0 after 1"):
        check_guarantees([[*backwards, ("end", 0, 0, "a", 4)]], {(0, 0), (0, 1)})
    one = [("start", 0, 0, "a", 1), ("end", 0, 0, "a", 5)]
    other = [("start", 0, 1, "a", 3), ("end", 0, 1, "a", 4)]
    with pytest.raises(AssertionError, match="overlapped"):
        check_guarantees([one, other], {(0, 0), (0, 1)})
    again = [("start", 0, 0, "a", 6), ("end", 0, 0, "a", 7)]
    assert check_guarantees([one, again], {(0, 0)}) == 1
    rewound = [*backwards[:2], ("epoch", 0, 0, "-", 2), *backwards[2:], ("end", 0, 0, "a", 4)]
    assert check_guarantees([rewound], {(0, 0), (0, 1)}) == 0


SCENARIOS = {
    # name: (tasks, [(seconds into the run, instance index, signal)])
    "short": (1500, [(2.0, 0, signal.SIGKILL), (4.0, 1, signal.SIGTERM)]),
    "rolling": (
        4000,
        [(2.0, 0, signal.SIGTERM), (5.0, 1, signal.SIGTERM), (8.0, 2, signal.SIGTERM)],
    ),
    "kills": (4000, [(2.0, 1, signal.SIGKILL), (5.0, 2, signal.SIGKILL), (8.0, 0, signal.SIGKILL)]),
}


@pytest.mark.parametrize(
    "scenario",
    [
        pytest.param("short"),
        pytest.param("rolling", marks=pytest.mark.chaos_long),
        pytest.param("kills", marks=pytest.mark.chaos_long),
    ],
)
async def test_instances_killed_and_restarted_keep_the_guarantees(
    scenario: str, kafka_broker: BrokerHandle, topic_factory: Any, tmp_path: Path
) -> None:
    tasks, events = SCENARIOS[scenario]
    topic = await topic_factory(partitions=4)
    group = f"chaos-{uuid.uuid4().hex[:8]}"
    (tmp_path / "chaos_app.py").write_text(APP)
    argv = [sys.executable, "-m", "decaton_aio", "run", "chaos_app:app", "--topic", topic]
    argv += ["--bootstrap-servers", kafka_broker.bootstrap_servers, "--group", group]
    argv += ["--session-timeout-ms", "6000", "--heartbeat-interval-ms", "500"]
    argv += ["--property", "decaton.commit.interval.ms=200"]
    instances = [Instance(f"i{n}", tmp_path, argv) for n in range(3)]
    for instance in instances:
        await instance.start()
    produced: set[tuple[int, int]] = set()

    async def produce() -> None:
        producer: TaskProducer[bytes] = TaskProducer(
            kafka_broker.producer_config(), topic, BytesSerializer()
        )
        async with producer:
            for n in range(tasks):
                where = await producer.put(f"k{n % 40}", str(n).encode())
                produced.add((where.partition, where.offset))
                await asyncio.sleep(0.004)

    async def chaos() -> None:
        began = time.monotonic()
        for at, index, sig in events:
            await asyncio.sleep(max(0.0, began + at - time.monotonic()))
            await instances[index].stop(sig)
            await instances[index].start()

    try:
        await asyncio.gather(produce(), chaos())
        ends: dict[int, int] = defaultdict(int)
        for partition, offset in produced:
            ends[partition] = max(ends[partition], offset + 1)
        deadline = time.monotonic() + 90
        while True:
            found = await group_positions(kafka_broker.bootstrap_servers, group, topic)
            if all(p.committed == ends[p.partition] for p in found):
                break
            assert time.monotonic() < deadline, f"commits stuck: {found}"
            await asyncio.sleep(0.5)
    finally:
        for instance in instances:
            await instance.stop(signal.SIGTERM)
    duplicates = check_guarantees(read_runs(instances), produced)
    report = tmp_path.parent / f"chaos-{scenario}.json"
    report.write_text(json.dumps({"scenario": scenario, "tasks": tasks, "duplicates": duplicates}))
    print(f"chaos {scenario}: {tasks} tasks, {duplicates} processed more than once")
