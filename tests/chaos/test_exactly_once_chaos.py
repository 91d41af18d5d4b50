"""Exactly-once under SIGKILL and rolling restarts: three instances of an ``exactly_once``
application in one group share 12 partitions, each instance with one transactional
producer; they are killed (or stopped) and restarted in a loop while each input task emits
one output. A read_committed reader of the output topic sees every output, each exactly
once.

A kill redoes work: the tasks the killed instance processed since its partitions' last
committed transaction are aborted with it, and their next owner processes them again. How
many depends on when the kill lands: during a rebalance the instance has committed and
revoked its partitions (nothing to redo); while it keeps pace with the producer, the few
tasks since its last commit (one commit interval and the commit's own time at most); while
it catches up on the backlog a rebalance left (a dead member's partitions wait seconds for
its session to time out), everything it processed since its last commit, hundreds when it
dies in the burst before its first commit after the rebalance. Each kill is checked
against a bound: the tasks the killed instance processed that the group's commits did not
cover once it was dead, plus the tasks produced in one commit interval (a margin). The
test prints each kill's redone tasks and bound.

Apache Kafka only (skipped on Tansu). ``make test`` runs the short loop, ``make chaos``
the longer one too.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import textwrap
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from decaton_aio import BytesSerializer, TaskProducer
from decaton_aio.testing import BrokerHandle, committed_offsets, wait_until
from tests.chaos.test_chaos import Instance, await_commits, run_argv
from tests.integration.test_exactly_once import needs_transactions, read_committed

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

APP = textwrap.dedent(
    """
    import os
    from decaton_aio import Application, BytesSerializer

    LOG = open(os.environ["CHAOS_LOG"], "a", buffering=1)
    OUT = os.environ["CHAOS_OUT"]
    # Which incarnation's run of a task was committed: its output says.
    BY = os.path.basename(os.environ["CHAOS_LOG"]).encode()

    async def process(ctx, task):
        LOG.write(f"run {ctx.partition} {ctx.offset}\\n")
        output = b"%d:%d@%s" % (ctx.partition, ctx.offset, BY)
        await ctx.produce(OUT, output, key=ctx.key)

    app = Application(
        process, topics=("unused",), serializer=BytesSerializer(), exactly_once=True
    )
    """
)

SCENARIOS = {
    # name: (at least this many tasks, stop rounds, seconds an instance works before it is
    # stopped, the signal; the instances are stopped in turn and restarted at once)
    "short": (1000, 3, 1.0, signal.SIGKILL),
    "long": (3000, 9, 1.0, signal.SIGKILL),
    "rolling": (3000, 6, 1.0, signal.SIGTERM),  # a rolling restart
}

#: Partitions of the input topic: several per instance, so each instance's one
#: transactional producer serves many.
PARTITIONS = 12

#: An instance's log line naming its transactional producer's id.
TRANSACTIONAL_ID = re.compile(r'"transactional_id": "([^"]+)"')

#: ``run_argv``'s commit interval.
COMMIT_INTERVAL_S = 0.2

Task = tuple[int, int]  # (partition, offset)


async def both(producing: Coroutine[Any, Any, None], events: Coroutine[Any, Any, None]) -> None:
    """Run the producer and the timeline of events together; when either fails the other
    is cancelled, within the test (the producer never outlives its topic)."""
    async with asyncio.TaskGroup() as group:
        group.create_task(producing)
        group.create_task(events)


@dataclass(frozen=True)
class Kill:
    """One stop: the incarnation killed (its log's name), the group's committed offsets
    read once it was dead, and the tasks produced in the commit interval before it."""

    victim: str
    committed: dict[int, int | None]
    arrived: int


def read_runs(logs: list[Path]) -> dict[str, Counter[Task]]:
    """Each incarnation's runs of each task, by its log's name."""
    runs: dict[str, Counter[Task]] = {}
    for log in logs:
        lines = log.read_text().splitlines() if log.exists() else []
        parts = [line.split() for line in lines]
        runs[log.name] = Counter((int(p[1]), int(p[2])) for p in parts if len(p) == 3)
    return runs


def committed_runs(values: list[bytes]) -> tuple[Counter[bytes], dict[Task, str]]:
    """The committed outputs (``partition:offset``, counted) and the incarnation whose run
    of each task was committed."""
    outputs: Counter[bytes] = Counter()
    by: dict[Task, str] = {}
    for value in values:
        task, incarnation = value.split(b"@")
        outputs[task] += 1
        partition, offset = task.split(b":")
        by[(int(partition), int(offset))] = incarnation.decode()
    return outputs, by


def redone(runs: dict[str, Counter[Task]], by: dict[Task, str]) -> dict[str, int]:
    """Per incarnation, its runs whose output was not the one committed (aborted)."""
    kept = Counter(by.values())
    return {name: sum(tasks.values()) - kept[name] for name, tasks in runs.items()}


def kill_bounds(
    kills: list[Kill], runs: dict[str, Counter[Task]], wasted: dict[str, int]
) -> list[tuple[int, int]]:
    """Per kill, (tasks redone, bound): the killed incarnation's runs aborted, against
    the tasks it processed that the group's commits did not cover once it was dead, plus
    the tasks produced in one commit interval.

    Raises:
        AssertionError: a kill redid more than its bound.
    """
    found = []
    for kill in kills:
        uncommitted = [(p, o) for p, o in runs[kill.victim] if o >= (kill.committed.get(p) or 0)]
        bound = len(uncommitted) + kill.arrived
        found.append((wasted[kill.victim], bound))
        assert wasted[kill.victim] <= bound, (
            f"the kill of {kill.victim} redid {wasted[kill.victim]} tasks: "
            f"{len(uncommitted)} uncommitted at the kill, {kill.arrived} produced meanwhile"
        )
    return found


def test_the_kill_accounting_fails_past_the_bound() -> None:
    """Runs aborted by a kill are counted against the killed incarnation's uncommitted
    work; an incarnation that redid more than that fails the check."""
    runs = {
        "i0-1.log": Counter({(0, 0): 1, (0, 1): 1, (0, 2): 1, (1, 0): 1}),
        "i1-1.log": Counter({(0, 1): 1, (0, 2): 1, (1, 0): 2}),
    }
    values = [b"0:0@i0-1.log", b"0:1@i1-1.log", b"0:2@i1-1.log", b"1:0@i1-1.log"]
    outputs, by = committed_runs(values)
    assert set(outputs) == {b"0:0", b"0:1", b"0:2", b"1:0"}
    wasted = redone(runs, by)
    assert wasted == {"i0-1.log": 3, "i1-1.log": 1}  # i1 ran 1:0 twice (a rewind)
    kill = Kill("i0-1.log", {0: 1, 1: None}, arrived=0)
    assert kill_bounds([kill], runs, wasted) == [(3, 3)]  # 0:1, 0:2 and 1:0 uncommitted
    with pytest.raises(AssertionError, match="redid 3 tasks: 2 uncommitted"):
        kill_bounds([Kill("i0-1.log", {0: 1, 1: 1}, arrived=0)], runs, wasted)
    assert kill_bounds([Kill("i0-1.log", {0: 1, 1: 1}, arrived=1)], runs, wasted) == [(3, 3)]


@pytest.mark.timeout(300)  # processes starting, killed and joining again take a while
@pytest.mark.parametrize(
    "scenario",
    [
        pytest.param("short"),
        pytest.param("long", marks=pytest.mark.chaos_long),
        pytest.param("rolling", marks=pytest.mark.chaos_long),
    ],
)
async def test_kills_never_duplicate_or_lose_an_output(
    scenario: str,
    kafka_broker: BrokerHandle,
    topic_factory: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each input's output is committed exactly once however often instances die, and
    each kill redoes no more than its bound (see the module's docstring)."""
    needs_transactions(kafka_broker)
    tasks, rounds, period, sig = SCENARIOS[scenario]
    topic = await topic_factory(partitions=PARTITIONS)
    out = await topic_factory(partitions=2)
    group = f"eos-chaos-{uuid.uuid4().hex[:8]}"
    (tmp_path / "eos_app.py").write_text(APP)
    argv = run_argv("eos_app:app", kafka_broker, topic, group)
    monkeypatch.setenv("CHAOS_OUT", out)  # the instances inherit it
    instances = [Instance(f"i{n}", tmp_path, argv) for n in range(3)]
    for instance in instances:
        await instance.start()
    produced: dict[int, int] = defaultdict(int)  # partition -> end offset
    sent: list[float] = []  # when each task was produced
    kills: list[Kill] = []
    killing = True

    async def produce() -> None:
        # At a steady pace until the kills are over and at least ``tasks`` were sent.
        producer: TaskProducer[bytes] = TaskProducer(
            kafka_broker.producer_config(), topic, BytesSerializer()
        )
        async with producer:
            n = 0
            while killing or n < tasks:
                where = await producer.put(f"k{n % 120}", str(n).encode())
                produced[where.partition] = max(produced[where.partition], where.offset + 1)
                sent.append(time.monotonic())
                n += 1
                await asyncio.sleep(0.004)

    def working(victim: Instance) -> bool:
        # Its current run has processed tasks (one that exited never will).
        assert victim.proc is not None
        assert victim.proc.returncode is None, f"{victim.name} exited: {victim.logs[-1]}"
        log = victim.logs[-1]
        return log.exists() and log.stat().st_size > 0

    async def kill() -> None:
        nonlocal killing
        for n in range(rounds):
            victim = instances[n % len(instances)]
            # Kill it while it works.
            await wait_until(
                lambda v=victim: working(v), timeout_s=60, what=f"{victim.name} processing"
            )
            await asyncio.sleep(period)
            at = time.monotonic()
            await victim.stop(sig)
            committed = await committed_offsets(
                kafka_broker.bootstrap_servers, group, topic, range(PARTITIONS)
            )
            arrived = sum(1 for t in sent if at - COMMIT_INTERVAL_S < t <= at)
            kills.append(Kill(victim.logs[-1].name, committed, arrived))
            await victim.start()
        killing = False

    try:
        await both(produce(), kill())
        await await_commits(kafka_broker.bootstrap_servers, group, topic, produced, 120)
    finally:
        for instance in instances:
            await instance.stop(signal.SIGTERM)
    expected = {b"%d:%d" % (p, o) for p, end in produced.items() for o in range(end)}
    values = await read_committed(kafka_broker.bootstrap_servers, out, at_least=len(expected))
    counts, by = committed_runs(values)
    assert set(counts) == expected, f"{len(expected - set(counts))} outputs missing"
    twice = sum(1 for n in counts.values() if n > 1)
    assert twice == 0, f"{twice} outputs committed more than once"
    for log in (log for i in instances for log in i.logs):
        ids = set(TRANSACTIONAL_ID.findall(log.with_suffix(".err").read_text()))
        assert len(ids) == 1, f"{log.name}: transactional producers {ids}"
    runs = read_runs([log for i in instances for log in i.logs])
    wasted = redone(runs, by)
    per_kill = kill_bounds(kills, runs, wasted)
    others = sum(wasted.values()) - sum(r for r, _ in per_kill)  # instances not killed
    report = tmp_path.parent / f"eos-chaos-{scenario}.json"
    report.write_text(
        json.dumps(
            {
                "tasks": len(expected),
                "outputs": len(values),
                "redone": sum(wasted.values()),
                "kills": [{"redone": r, "bound": b} for r, b in per_kill],
                "redone_not_killed": others,
            }
        )
    )
    print(
        f"eos chaos {scenario}: {len(expected)} tasks, {len(values)} committed outputs, "
        f"{sum(wasted.values())} tasks processed again after {rounds} kills; per kill "
        f"(redone/bound): {', '.join(f'{r}/{b}' for r, b in per_kill)}; by instances not "
        f"killed: {others}"
    )


async def test_an_instance_frozen_past_its_session_cannot_commit_when_it_wakes(
    kafka_broker: BrokerHandle, topic_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A zombie: one of two instances is frozen (SIGSTOP) past its session timeout while it
    holds an open transaction; the other takes its partitions over. Woken (SIGCONT), the
    frozen one cannot commit: it finds its partitions lost and aborts its open transaction,
    or the group coordinator refuses the offsets of its generation (the transaction timeout
    is longer than the freeze, so the broker has not aborted the transaction for it); it
    says so, and every output is committed exactly once."""
    needs_transactions(kafka_broker)
    topic = await topic_factory(partitions=4)
    out = await topic_factory(partitions=2)
    group = f"eos-zombie-{uuid.uuid4().hex[:8]}"
    (tmp_path / "eos_app.py").write_text(APP)
    # A long interval keeps a transaction open while the instance is frozen, and makes
    # the transaction timeout (three intervals) outlast the freeze.
    argv = run_argv("eos_app:app", kafka_broker, topic, group, commit_interval_ms=8000)
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
        try:
            # The other instance takes every partition over once the session timed out.
            other_log = other.logs[-1]
            before = other_log.read_text().count("run ")
            await asyncio.sleep(6 + 4)  # past the session timeout: time is what this tests
            await wait_until(
                lambda: other_log.read_text().count("run ") > before + 100,
                what="the other instance processing the zombie's partitions",
            )
        finally:  # woken also when the wait fails, and the producer stops
            woken.set()
            if zombie.proc.returncode is not None:  # it cannot be woken: say how it ended
                err = zombie.logs[-1].with_suffix(".err").read_text()[-2000:]
                raise AssertionError(
                    f"the frozen instance exited with {zombie.proc.returncode}; its log "
                    f"ends:\n{err}"
                )
            zombie.proc.send_signal(signal.SIGCONT)

    try:
        await both(produce(), freeze())
        await await_commits(kafka_broker.bootstrap_servers, group, topic, produced, 120)
    finally:
        for instance in (zombie, other):
            await instance.stop(signal.SIGTERM)
    expected = {b"%d:%d" % (p, o) for p, end in produced.items() for o in range(end)}
    values = await read_committed(kafka_broker.bootstrap_servers, out, at_least=len(expected))
    counts, _ = committed_runs(values)
    assert set(counts) == expected, f"{len(expected - set(counts))} outputs missing"
    assert all(n == 1 for n in counts.values()), "an output was committed twice"
    told = zombie.logs[-1].with_suffix(".err").read_text()
    # Woken, the zombie either finds its session over first (its partitions are lost and
    # it aborts the open transaction itself), or commits first and the group refuses it.
    aborted = "the member lost its partitions" in told and "aborting the open" in told
    refused = "transaction failed" in told and "GenerationOverError" in told
    assert aborted or refused, "the zombie did not say it gave its transaction up"
    assert "ProducerFenced" not in told
    assert "never retrieved" not in told
