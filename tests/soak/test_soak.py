"""The soak: three instances of one application in one group, for a long while, at half of
the capacity measured at the start, through rolling restarts and a broker restart, with
tasks that sometimes fail, retry or go to the dead letter topic (``soak_app.py``).

Every few seconds (10 in the long form) each instance's metrics page gives its RSS, open
file descriptors, asyncio tasks, pending records and commit age, and the group's lag is
read from the cluster. The run passes when, after warm-up, no incarnation's RSS grows 5%
and its descriptors and tasks do not grow under the steady load between two episodes
(``checks.steady_window``); the lag each disturbance left goes back to 0; every task is
processed or dead-lettered; each key's tasks run in order; and the group's commits reach
the end of the task and retry topics.

``make test`` runs 3 minutes; ``make soak`` runs 30 (``SOAK_MINUTES``) and writes the
series to ``bench/results/soak.json`` (``SOAK_OUT``), which ``bench/soak_plot.py`` draws.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import sys
import time
import urllib.request
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiokafka.errors import KafkaError

from decaton_aio import BytesSerializer, TaskProducer
from decaton_aio.admin import TopicAdmin
from decaton_aio.errors import BrokerError, ProducerError
from decaton_aio.offsets import committed_offsets, partition_extents
from decaton_aio.testing import BrokerHandle, read_records
from tests.chaos.test_chaos import Instance, own_broker, run_argv  # noqa: F401 (a fixture)
from tests.soak import soak_app
from tests.soak.checks import (
    Disturbance,
    Incarnation,
    TaskLog,
    disturbance_figures,
    growth_failures,
    parse_metrics,
    plan,
    recovery_failures,
    steady_window,
)

pytestmark = [pytest.mark.integration, pytest.mark.soak]

MINUTES = float(os.environ.get("SOAK_MINUTES", "3"))
PLAN = plan(MINUTES)
PARTITIONS = 8
KEYS = 512
INSTANCES = 3
#: While the capacity is measured, at most this many tasks wait unprocessed.
BACKLOG = 20_000
#: How long the group may take to commit everything once production stops.
SETTLE_S = 180.0
#: How long one question to the cluster may take: a client that started while the broker
#: was restarting can wait a minute and more for it, and the answer is asked again.
ASK_TIMEOUT_S = 10.0

_METRICS_URL = re.compile(r"http://[0-9.]+:[0-9]+/metrics")

Offsets = dict[tuple[str, int], int]


@dataclass
class Feeder:
    """Produces task number n (key ``k{n % KEYS}``) until the broker takes it."""

    producer: TaskProducer[bytes]
    sent: int = 0
    first: int = 0  # the first task of the paced phase
    inflight: set[asyncio.Task[None]] = field(default_factory=set)

    async def _put(self, n: int) -> None:
        while True:
            try:
                await self.producer.put(f"k{n % KEYS}", str(n).encode())
                return
            except (ProducerError, KafkaError):
                await asyncio.sleep(0.5)  # the broker restarts: the task is sent again

    def send(self, count: int) -> None:
        """Start sending the next ``count`` tasks."""
        for n in range(self.sent, self.sent + count):
            task = asyncio.create_task(self._put(n))
            self.inflight.add(task)
            task.add_done_callback(self.inflight.discard)
        self.sent += count

    async def paced(self, rate: float, seconds: float) -> None:
        """Send ``rate`` tasks a second for ``seconds``, from :attr:`first` on; while the
        broker does not take them, up to a minute's worth wait in flight."""
        began = time.monotonic()
        while (elapsed := time.monotonic() - began) < seconds:
            due = int(rate * elapsed) - (self.sent - self.first)
            room = max(0, int(rate * 60) - len(self.inflight))
            self.send(min(due, room))
            await asyncio.sleep(0.05)
        await self.flush()

    async def flush(self) -> None:
        """Wait until every task sent is taken."""
        while self.inflight:
            await asyncio.gather(*list(self.inflight))


@dataclass
class Soak:
    """One soak run: the group, its instances and what was read of them."""

    broker: BrokerHandle
    topic: str
    group: str
    instances: list[Instance]
    t0: float = 0.0  # time.monotonic() at the start of the paced phase
    urls: dict[str, str] = field(default_factory=dict)  # instance -> its metrics page
    incarnations: dict[str, Incarnation] = field(default_factory=dict)
    current: dict[str, Incarnation] = field(default_factory=dict)
    lag: list[tuple[float, int | None]] = field(default_factory=list)
    disturbances: list[Disturbance] = field(default_factory=list)
    episodes: list[tuple[float, float]] = field(default_factory=list)  # rolls, broker
    exit_codes: list[int | None] = field(default_factory=list)

    @property
    def topics(self) -> tuple[str, str]:
        return self.topic, f"{self.topic}-retry"

    def now(self) -> float:
        return time.monotonic() - self.t0

    # ------------------------------------------------------------ instances

    async def start(self, instance: Instance) -> None:
        """Start an incarnation and wait until it joined and serves its metrics."""
        await instance.start()
        await instance.joined(timeout_s=120)
        err = instance.logs[-1].with_suffix(".err")
        deadline = time.monotonic() + 60
        while not (found := _METRICS_URL.findall(err.read_text())):
            assert time.monotonic() < deadline, f"{instance.name} serves no metrics: {err}"
            await asyncio.sleep(0.1)
        url = found[0]
        name = f"{instance.name}#{instance.runs}"
        self.urls[instance.name] = url
        self.current[instance.name] = self.incarnations[name] = Incarnation(name, self.now())

    async def stop(self, instance: Instance) -> None:
        """Stop an incarnation with SIGTERM (it drains, commits and leaves)."""
        self.urls.pop(instance.name, None)
        self.current.pop(instance.name, None)
        await instance.stop(signal.SIGTERM)
        assert instance.proc is not None
        self.exit_codes.append(instance.proc.returncode)

    # ------------------------------------------------------------ the group

    async def ends(self) -> Offsets:
        """The end of every partition of the task and retry topics."""
        found: Offsets = {}
        async with asyncio.timeout(ASK_TIMEOUT_S):
            for topic in self.topics:
                extents = await partition_extents(self.broker.bootstrap_servers, topic)
                found.update({(topic, p): e.high_watermark for p, e in extents.items()})
        return found

    async def committed(self) -> Offsets:
        """The group's committed offset in every partition (0 where none)."""
        found: Offsets = {}
        async with asyncio.timeout(ASK_TIMEOUT_S):
            for topic in self.topics:
                offsets = await committed_offsets(
                    self.broker.bootstrap_servers, self.group, topic, range(PARTITIONS)
                )
                found.update({(topic, p): o or 0 for p, o in offsets.items()})
        return found

    async def caught_up(self, ends: Offsets) -> bool:
        """Whether the group committed up to ``ends`` (``False`` while the cluster does
        not answer)."""
        try:
            committed = await self.committed()
        except (BrokerError, KafkaError, TimeoutError):
            return False
        return all(committed[tp] >= end for tp, end in ends.items())

    async def wait_for(self, what: Callable[[], Awaitable[bool]], timeout_s: float) -> bool:
        """Poll ``what`` every half second; whether it held within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not await what():
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.5)
        return True

    async def settled(self) -> bool:
        """Whether the group committed the end of both topics (nothing left to do)."""
        try:
            ends = await self.ends()
        except (BrokerError, KafkaError, TimeoutError):
            return False
        return await self.caught_up(ends)

    # ------------------------------------------------------------ disturbances

    async def disturb(self, what: str, act: Callable[[], Awaitable[None]]) -> None:
        """Carry out a disturbance, then wait (up to ``PLAN.recovery_limit_s``) until
        the group committed every record that was there when it ended: the next one
        begins after that, so each recovery is its own."""
        disturbance = Disturbance(what, self.now())
        self.disturbances.append(disturbance)
        await act()
        disturbance.ended = self.now()
        while True:
            try:
                ends = await self.ends()
                break
            except (BrokerError, KafkaError, TimeoutError):
                await asyncio.sleep(0.5)
        if await self.wait_for(lambda: self.caught_up(ends), PLAN.recovery_limit_s):
            disturbance.recovered = self.now()

    async def roll(self) -> None:
        """Restart the instances one after another."""
        for n, instance in enumerate(self.instances):
            if n:
                await asyncio.sleep(PLAN.roll_gap_s)

            async def restart(instance: Instance = instance) -> None:
                await self.stop(instance)
                await self.start(instance)

            await self.disturb(f"restart {instance.name}", restart)

    async def restart_broker(self) -> None:
        embedded = self.broker.embedded
        assert embedded is not None

        async def restart() -> None:
            await asyncio.to_thread(embedded.kill_node, 1)
            await asyncio.to_thread(embedded.restart_node, 1)

        await self.disturb("broker restart", restart)

    async def timeline(self) -> None:
        """The broker restart and the rolls in time order (the broker first when they
        are due together), each after the previous."""
        events = [(PLAN.broker_at_s, self.restart_broker)] + [(at, self.roll) for at in PLAN.rolls]
        for at, act in sorted(events, key=lambda e: e[0]):  # a stable sort
            await asyncio.sleep(max(0.0, at - self.now()))
            began = self.now()
            await act()
            self.episodes.append((began, self.now()))

    # ------------------------------------------------------------ readings

    async def read(self) -> None:
        """Read every running incarnation's metrics page and the group's lag."""
        at = self.now()
        for name, url in list(self.urls.items()):
            incarnation = self.current.get(name)
            try:
                text = await asyncio.to_thread(_fetch, url)
            except OSError:
                continue  # stopping
            if incarnation is not None:
                incarnation.readings.append((at, parse_metrics(text)))
        try:
            ends, committed = await self.ends(), await self.committed()
            self.lag.append((at, sum(max(0, e - committed[tp]) for tp, e in ends.items())))
        except (BrokerError, KafkaError, TimeoutError):
            self.lag.append((at, None))

    async def sample(self, until: asyncio.Event) -> None:
        """Read every ``PLAN.sample_s`` until ``until`` is set."""
        while not until.is_set():
            began = time.monotonic()
            await self.read()
            try:
                async with asyncio.timeout(max(0.0, PLAN.sample_s - (time.monotonic() - began))):
                    await until.wait()
            except TimeoutError:
                pass

    # ------------------------------------------------------------ capacity

    async def capacity(self, feeder: Feeder) -> float:
        """Tasks a second the group processes with as many as it can take: tasks are
        sent while fewer than :data:`BACKLOG` wait, and the rate is what the group
        committed over the last two thirds of ``PLAN.capacity_s``."""
        began = time.monotonic()
        marks: list[tuple[float, int]] = []
        while (elapsed := time.monotonic() - began) < PLAN.capacity_s:
            committed = sum(v for (t, _), v in (await self.committed()).items() if t == self.topic)
            if elapsed >= PLAN.capacity_s / 3:
                marks.append((time.monotonic(), committed))
            feeder.send(max(0, BACKLOG - (feeder.sent - committed)))
            await asyncio.sleep(0.5)
        await feeder.flush()
        assert len(marks) >= 2, "the group's commits could not be read"
        (t1, c1), (t2, c2) = marks[0], marks[-1]
        return (c2 - c1) / (t2 - t1)


def _fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


def _read_logs(instances: list[Instance], tasks: int) -> TaskLog:
    log = TaskLog(tasks)
    for instance in instances:
        for run, path in enumerate(instance.logs, 1):
            with path.open() as lines:
                log.read(f"{instance.name}#{run}", lines)
    return log


def _write(out: Path, report: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))


async def _dead_lettered(servers: str, topic: str) -> list[int]:
    """The task numbers in the dead letter topic."""
    extents = await partition_extents(servers, topic)
    count = sum(e.high_watermark - e.log_start for e in extents.values())
    records = await read_records(servers, topic, count, timeout_s=60)
    return [int(r.value) for r in records if r.value is not None]


@pytest.mark.timeout(PLAN.duration_s + PLAN.capacity_s + SETTLE_S + 600)
async def test_soak(own_broker: BrokerHandle, tmp_path: Path) -> None:  # noqa: F811
    broker = own_broker
    admin = TopicAdmin(broker.bootstrap_servers)
    topic = await admin.create(PARTITIONS, prefix="soak", replication_factor=1)
    group = f"soak-{uuid.uuid4().hex[:8]}"
    shutil.copy(Path(soak_app.__file__), tmp_path / "soak_app.py")
    argv = run_argv("soak_app:app", broker, topic, group, commit_interval_ms=1000)
    argv += ["--metrics-port", "0", "--property", "decaton.processing.shutdown.timeout.ms=10000"]
    instances = [Instance(f"i{n}", tmp_path, argv) for n in range(INSTANCES)]
    soak = Soak(broker, topic, group, instances)
    load = [os.getloadavg()]
    producer: TaskProducer[bytes] = TaskProducer(broker.producer_config(), topic, BytesSerializer())
    try:
        async with producer:
            feeder = Feeder(producer)
            soak.t0 = time.monotonic()
            await asyncio.gather(*(soak.start(i) for i in instances))
            capacity = await soak.capacity(feeder)
            assert await soak.wait_for(soak.settled, SETTLE_S), "the capacity phase never settled"
            rate = capacity / 2
            print(f"soak: capacity {capacity:.0f} tasks/s, paced at {rate:.0f}")
            shift = time.monotonic() - soak.t0
            soak.t0, feeder.first = soak.t0 + shift, feeder.sent
            for incarnation in soak.incarnations.values():
                incarnation.started -= shift
            done = asyncio.Event()
            sampler = asyncio.create_task(soak.sample(done))
            await asyncio.gather(feeder.paced(rate, PLAN.duration_s), soak.timeline())
            settled = await soak.wait_for(soak.settled, SETTLE_S)
            done.set()
            await sampler
            await soak.read()
        load.append(os.getloadavg())
    finally:
        for instance in instances:
            if instance.proc is not None and instance.proc.returncode is None:
                await soak.stop(instance)
        await admin.close()
    log = _read_logs(instances, feeder.sent)
    dead = await _dead_lettered(broker.bootstrap_servers, f"{topic}-dlq")
    counts, failures = log.failures(dead)
    if not settled:
        failures.append("the group's commits did not reach the end of its topics")
    failures += recovery_failures(soak.disturbances, PLAN.recovery_limit_s)
    growth: dict[str, Any] = {}
    for name, incarnation in soak.incarnations.items():
        window = steady_window(incarnation.started, PLAN.warmup_s, soak.episodes)
        growth[name], found = growth_failures(incarnation, *window)
        failures += found
    judged = [g for g in growth.values() if g]
    if not judged:
        failures.append("no incarnation ran long enough after warm-up to be judged")
    failures += [f"an instance exited with {code}" for code in soak.exit_codes if code != 0]
    report = {
        "minutes": MINUTES,
        "plan": asdict(PLAN),
        "capacity_tasks_s": round(capacity, 1),
        "rate_tasks_s": round(rate, 1),
        "load_average": load,
        "counts": counts,
        "commits_reached_end": settled,
        "disturbances": disturbance_figures(soak.disturbances),
        "episodes": soak.episodes,
        "growth": growth,
        "exit_codes": soak.exit_codes,
        "failures": failures,
        "lag": soak.lag,
        "incarnations": {
            name: {
                "started": i.started,
                "readings": [{"t": t, **asdict(r)} for t, r in i.readings],
            }
            for name, i in soak.incarnations.items()
        },
    }
    _write(Path(os.environ.get("SOAK_OUT") or tmp_path.parent / "soak.json"), report)
    print(f"soak: {json.dumps({k: report[k] for k in ('counts', 'growth')})}", file=sys.stderr)
    assert not failures, "\n".join(failures)
