"""Several instances of one application in one group, killed and restarted while tasks
flow: every task is processed at least once, a key's tasks run one at a time and in
offset order between rebalances (a rebalance may rewind a key to its committed point),
and the group's commits reach the end.

Scenarios add a broker restart on persistent storage, a processor that raises, one that
hangs past the rebalance timeout and one that leaks deferred completions. A task that
outlives the rebalance timeout may overlap the next owner's run of its key: the runtime
does not cancel it (like Decaton), so such tasks are exempt from the overlap check only.

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
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from decaton_aio import BytesSerializer, EmbeddedBroker, TaskProducer
from decaton_aio.admin import TopicAdmin
from decaton_aio.offsets import group_positions
from decaton_aio.testing import BOOTSTRAP_ENV_VAR, BROKER_ENV_VAR, BrokerHandle

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

APP = textwrap.dedent(
    """
    import asyncio, os, time
    import structlog
    from decaton_aio import Application, BytesSerializer

    LOG = open(os.environ["CHAOS_LOG"], "a", buffering=1)
    MODE = os.environ["CHAOS_MODE"]

    def epochs(logger, name, event):
        # A change of partitions (assigned, revoked, lost) starts a new epoch: a key may
        # rewind to its committed point there.
        if str(event.get("event", "")).startswith("partitions "):
            LOG.write(f"epoch 0 0 - {time.time_ns()}\\n")
        return event

    structlog.configure(processors=[epochs, *structlog.get_config()["processors"]])

    def log(kind, ctx):
        at = time.time_ns()  # wall clock: comparable with a Decaton JVM's facts
        LOG.write(f"{kind} {ctx.partition} {ctx.offset} {ctx.key.decode()} {at}\\n")

    async def process(ctx, task):
        n = int(task)
        log("start", ctx)
        if MODE == "leaks" and n % 50 == 5:
            ctx.deferred()  # never completed: the deferred timeout gives it up
            log("end", ctx)
            return
        if MODE == "hangs" and n % 400 == 7:
            await asyncio.sleep(3.0)
        else:  # "uneven": one task in ten outlasts the others, which complete above it
            await asyncio.sleep(0.1 if MODE == "uneven" and n % 10 == 3 else 0.002)
        log("end", ctx)
        if MODE == "raises" and n % 11 == 0:
            raise RuntimeError(f"task {n} fails")

    app = Application(process, topics=("unused",), serializer=BytesSerializer())
    """
)

# Longer than this, a task may overlap the next owner's run of its key (not cancelled).
REBALANCE_TIMEOUT_MS = 1000


@dataclass
class Instance:
    """One `python -m decaton_aio run` process and its incarnations' logs."""

    name: str
    workdir: Path
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    proc: asyncio.subprocess.Process | None = None
    runs: int = 0
    logs: list[Path] = field(default_factory=list)

    async def start(self) -> None:
        self.runs += 1
        log = self.workdir / f"{self.name}-{self.runs}.log"
        self.logs.append(log)
        env = {**os.environ, **self.env, "CHAOS_LOG": str(log), "PYTHONPATH": str(self.workdir)}
        with log.with_suffix(".err").open("wb") as stderr:  # the process's own log
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv,
                cwd=self.workdir,
                env=env,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=stderr,
            )

    async def joined(self, timeout_s: float = 60) -> None:
        """Wait until this incarnation has taken part in a rebalance (its log says so)."""
        deadline = time.monotonic() + timeout_s
        log = self.logs[-1]
        while not (log.exists() and "epoch" in log.read_text()):
            assert self.proc is not None
            assert self.proc.returncode is None, f"{self.name} exited: {log.with_suffix('.err')}"
            assert time.monotonic() < deadline, f"{self.name} did not join its group"
            await asyncio.sleep(0.1)

    async def stop(self, sig: signal.Signals) -> None:
        """Send ``sig`` and wait for the exit; one still running 60 s later is killed (no
        process outlives its test) and the stop fails."""
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(sig)
            try:
                await asyncio.wait_for(self.proc.wait(), 60)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
                raise AssertionError(
                    f"{self.name} did not exit within 60 s of {sig.name}: killed"
                ) from None


def run_argv(
    target: str, broker: BrokerHandle, topic: str, group: str, *, commit_interval_ms: int = 200
) -> list[str]:
    """``python -m decaton_aio run TARGET`` on ``topic`` in ``group``, with the chaos
    tests' session timeout (6 s) and commit interval."""
    argv = [sys.executable, "-m", "decaton_aio", "run", target, "--topic", topic]
    argv += ["--bootstrap-servers", broker.bootstrap_servers, "--group", group]
    argv += ["--session-timeout-ms", "6000", "--heartbeat-interval-ms", "500"]
    return [*argv, "--property", f"decaton.commit.interval.ms={commit_interval_ms}"]


async def await_commits(
    bootstrap_servers: str, group: str, topic: str, ends: dict[int, int], timeout_s: float
) -> None:
    """Poll the group's committed offsets (another process commits them) until each
    partition's reaches its end in ``ends``; fail naming them after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = await group_positions(bootstrap_servers, group, topic)
        if all((p.committed or 0) == ends[p.partition] for p in found):  # None: no records
            return
        assert time.monotonic() < deadline, f"commits stuck: {found}"
        await asyncio.sleep(0.5)


def read_runs(instances: list[Instance]) -> list[list[tuple[str, int, int, str, int]]]:
    """Each incarnation's events: (kind, partition, offset, key, wall clock ns)."""
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
            one incarnation, or two tasks of a key running at the same time (a task that
            ran longer than the rebalance timeout excepted).
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
                began = begun.pop((partition, offset))
                if at - began <= REBALANCE_TIMEOUT_MS * 1_000_000:
                    intervals[(partition, key)].append((began, at))
    for lane, spans in intervals.items():
        spans.sort()
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert start >= end, f"two tasks of key {lane} overlapped"
    return len(ended) - len(set(ended))


def test_the_checks_fail_on_bad_runs() -> None:
    """The guarantee checks see a lost task, a key out of order and an overlap, and let a
    key rewind at a rebalance and a task that outlived the rebalance timeout overlap."""
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
    hung = [("start", 0, 0, "a", 1), ("end", 0, 0, "a", 2 + REBALANCE_TIMEOUT_MS * 1_000_000)]
    assert check_guarantees([hung, other], {(0, 0), (0, 1)}) == 0
    again = [("start", 0, 0, "a", 6), ("end", 0, 0, "a", 7)]
    assert check_guarantees([one, again], {(0, 0)}) == 1
    rewound = [*backwards[:2], ("epoch", 0, 0, "-", 2), *backwards[2:], ("end", 0, 0, "a", 4)]
    assert check_guarantees([rewound], {(0, 0), (0, 1)}) == 0


@dataclass(frozen=True)
class Scenario:
    """Tasks to produce, what the processor does, and what happens when (seconds into the
    run): ``(at, index, signal)`` stops instance ``index`` and starts it again; ``index``
    ``BROKER`` restarts the broker on its data instead."""

    tasks: int
    events: tuple[tuple[float, int, signal.Signals], ...]
    mode: str = "plain"


BROKER = -1
KILL, TERM = signal.SIGKILL, signal.SIGTERM
SCENARIOS = {
    "short": Scenario(1500, ((2.0, 0, KILL), (4.0, 1, TERM))),
    "rolling": Scenario(4000, ((2.0, 0, TERM), (5.0, 1, TERM), (8.0, 2, TERM))),
    "kills": Scenario(4000, ((2.0, 1, KILL), (5.0, 2, KILL), (8.0, 0, KILL))),
    "broker": Scenario(3000, ((3.0, BROKER, KILL), (7.0, 1, KILL))),
    "raises": Scenario(3000, ((2.0, 0, KILL), (5.0, 1, TERM)), mode="raises"),
    "hangs": Scenario(3000, ((2.5, 0, TERM), (5.0, 1, KILL), (7.5, 2, TERM)), mode="hangs"),
    "leaks": Scenario(3000, ((2.0, 2, KILL), (5.0, 0, TERM)), mode="leaks"),
}


@pytest.fixture
def own_broker() -> Iterator[BrokerHandle]:
    """A single-node Apache Kafka of the test's own, so it can be restarted on its data."""
    if os.environ.get(BROKER_ENV_VAR, "apache") == "tansu":
        pytest.skip("Tansu keeps topics in memory: a restart loses them")
    if os.environ.get(BOOTSTRAP_ENV_VAR):
        pytest.skip("restarts an embedded broker; a user's cluster is not restarted")
    broker = EmbeddedBroker(flavor="apache").start()
    try:
        yield BrokerHandle(broker.bootstrap_servers, broker)
    finally:
        broker.stop()


@pytest.mark.timeout(300)  # processes starting, killed and joining again take a while
@pytest.mark.parametrize(
    "name",
    [n if n == "short" else pytest.param(n, marks=pytest.mark.chaos_long) for n in SCENARIOS],
)
async def test_instances_killed_and_restarted_keep_the_guarantees(
    name: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    scenario = SCENARIOS[name]
    restarts_broker = any(index == BROKER for _, index, _ in scenario.events)
    broker: BrokerHandle = request.getfixturevalue(
        "own_broker" if restarts_broker else "kafka_broker"
    )
    admin = TopicAdmin(broker.bootstrap_servers)
    topic = await admin.create(
        4, prefix=f"chaos-{name}", replication_factor=broker.replication_factor
    )
    group = f"chaos-{uuid.uuid4().hex[:8]}"
    (tmp_path / "chaos_app.py").write_text(APP)
    argv = [sys.executable, "-m", "decaton_aio", "run", "chaos_app:app", "--topic", topic]
    argv += ["--bootstrap-servers", broker.bootstrap_servers, "--group", group]
    argv += ["--session-timeout-ms", "6000", "--heartbeat-interval-ms", "500"]
    for setting in (
        "decaton.commit.interval.ms=200",
        f"decaton.group.rebalance.timeout.ms={REBALANCE_TIMEOUT_MS}",
        "decaton.processing.shutdown.timeout.ms=5000",
        "decaton.deferred.complete.timeout.ms=1000",
    ):
        argv += ["--property", setting]
    env = {"CHAOS_MODE": scenario.mode}
    instances = [Instance(f"i{n}", tmp_path, argv, env) for n in range(3)]
    for instance in instances:
        await instance.start()
    produced: set[tuple[int, int]] = set()

    async def produce() -> None:
        producer: TaskProducer[bytes] = TaskProducer(
            broker.producer_config(), topic, BytesSerializer()
        )
        async with producer:
            for n in range(scenario.tasks):
                where = await producer.put(f"k{n % 40}", str(n).encode())
                produced.add((where.partition, where.offset))
                await asyncio.sleep(0.004)

    async def chaos() -> None:
        began = time.monotonic()
        for at, index, sig in scenario.events:
            await asyncio.sleep(max(0.0, began + at - time.monotonic()))
            if index == BROKER:
                assert broker.embedded is not None
                await asyncio.to_thread(broker.embedded.kill_node, 1)
                await asyncio.to_thread(broker.embedded.restart_node, 1)
            else:
                await instances[index].stop(sig)
                await instances[index].start()

    try:
        for instance in instances:  # the timeline starts with every instance in the group
            await instance.joined()
        await asyncio.gather(produce(), chaos())
        ends: dict[int, int] = defaultdict(int)
        for partition, offset in produced:
            ends[partition] = max(ends[partition], offset + 1)
        await await_commits(broker.bootstrap_servers, group, topic, ends, 90)
    finally:
        for instance in instances:
            await instance.stop(signal.SIGTERM)
        await admin.close()
    duplicates = check_guarantees(read_runs(instances), produced)
    report = tmp_path.parent / f"chaos-{name}.json"
    report.write_text(
        json.dumps({"scenario": name, "tasks": scenario.tasks, "duplicates": duplicates})
    )
    print(f"chaos {name}: {scenario.tasks} tasks, {duplicates} processed more than once")
