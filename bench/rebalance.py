"""What a membership change costs the partitions that keep their owner and those that move:
``python -m bench.rebalance`` (``make bench-rebalance``).

On an embedded Apache Kafka, 12 partitions, members are ``python -m decaton_aio run``
processes with the runtime's defaults (the chaos suite's `Instance`), fed 600 tasks/s over
200 keys, each task sleeping 5 ms or 200 ms. Every member writes one line per task start
and end (partition, offset, wall clock) and one per change of its partitions; the figures
come from those lines only, the same way for both group protocols:

- ``steps``: 3 members in steady state; a 4th joins; one of the first three gets SIGTERM;
  another gets SIGKILL and a new member starts at once (a crashed pod restarted);
- ``rolling``: 3 static members (``--group-instance-id``), each stopped with SIGTERM and
  started again, one at a time.

Per step: the partitions that keep their owner (the same process ran their tasks just
before the step and at the end of its window, and no other one meanwhile), the longest
pause (gap between two task starts of a partition) of a kept and of a moved partition,
and the tasks that ran twice (a second start in the step's window). The steady state gives
the longest gap between tasks of a partition with nothing happening. ``--protocols`` runs
each on ``classic`` and ``consumer`` (``--group-protocol`` is always given).

The state store's choice is computed from the same runs: the consumer protocol's real
assignments at the join and at the leave (the coordinator's ``uniform`` assignor) against
what the runtime's state-aware assignor (`plan_assignment`) does for the same membership
change, counting restores (a partition whose new owner had neither it nor a standby copy).

The report goes to ``bench/results/rebalance-<tree>.md``, the raw figures beside it
(``.jsonl``), with the machine's load average, since timings depend on it.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from decaton_aio import BytesSerializer, EmbeddedBroker, TaskProducer
from decaton_aio.admin import TopicAdmin
from decaton_aio.consumer.state._assignor import MemberState, plan_assignment
from decaton_aio.producer import ProducerConfig
from tests.chaos.test_chaos import Instance, read_runs

PARTITIONS = 12
KEYS = 200
RATE = 600
PROTOCOLS = ("classic", "consumer")
NS = 1_000_000_000
JOIN_TIMEOUT_S = 180  # a loaded machine starts processes slowly
SETTLE_S = 6.0  # a step's window lasts at least this long after a new member joined

# Each member's own facts, in the chaos suite's line format (read by `read_runs`), plus
# one line per change of its partitions: ``own assigned|revoked|lost 0,3,7 <ns>``.
APP = textwrap.dedent(
    """
    import asyncio, os, time
    import structlog
    from decaton_aio import Application, BytesSerializer

    LOG = open(os.environ["CHAOS_LOG"], "a", buffering=1)
    TASK_S = float(os.environ["REBALANCE_TASK_MS"]) / 1000

    def owned(logger, name, event):
        what = str(event.get("event", ""))
        if what.startswith(("partitions assigned", "partitions revoked", "partitions lost")):
            numbers = ",".join(str(p).rsplit("-", 1)[1] for p in event.get("partitions", ()))
            at = time.time_ns()
            LOG.write(f"epoch 0 0 - {at}\\n")
            LOG.write(f"own {what.split()[1]} {numbers or '-'} {at}\\n")
        return event

    structlog.configure(processors=[owned, *structlog.get_config()["processors"]])

    async def process(ctx, task):
        LOG.write(f"start {ctx.partition} {ctx.offset} {ctx.key.decode()} {time.time_ns()}\\n")
        await asyncio.sleep(TASK_S)
        LOG.write(f"end {ctx.partition} {ctx.offset} {ctx.key.decode()} {time.time_ns()}\\n")

    app = Application(process, topics=("unused",), serializer=BytesSerializer())
    """
)


# ------------------------------------------------------------------------ the analysis


@dataclass
class Facts:
    """Task starts of every incarnation: per partition, ``(wall ns, incarnation, offset)``
    sorted by time; an incarnation is ``<instance>#<run>``."""

    starts: dict[int, list[tuple[int, str, int]]] = field(default_factory=lambda: defaultdict(list))

    @classmethod
    def of(cls, instances: Sequence[Instance]) -> Facts:
        facts = cls()
        for instance in instances:
            for run, events in enumerate(read_runs([instance]), 1):
                for kind, partition, offset, _, at in events:
                    if kind == "start":
                        facts.starts[partition].append((at, f"{instance.name}#{run}", offset))
        for starts in facts.starts.values():
            starts.sort()
        return facts

    def owner(self, partition: int, begin: int, end: int) -> set[str]:
        """The incarnations that started tasks of ``partition`` in ``[begin, end)``."""
        return {who for at, who, _ in self.starts[partition] if begin <= at < end}

    def last_owner(self, partition: int, before: int) -> str | None:
        found = [who for at, who, _ in self.starts[partition] if at < before]
        return found[-1] if found else None

    def longest_gap(self, partition: int, begin: int, end: int) -> int:
        """The longest time between two consecutive task starts of ``partition`` ending
        in ``(begin, end]`` (the gap open at ``end`` counts up to ``end``)."""
        times = [at for at, _, _ in self.starts[partition] if at <= end]
        longest, previous = 0, None
        for at in times:
            if previous is not None and at > begin:
                longest = max(longest, at - previous)
            previous = at
        if previous is not None:
            longest = max(longest, end - previous)
        return longest

    def twice(self, partition: int, begin: int, end: int) -> int:
        """Tasks of ``partition`` started again in ``[begin, end)`` (run before)."""
        seen: set[int] = set()
        again = 0
        for at, _, offset in self.starts[partition]:
            if offset in seen and begin <= at < end:
                again += 1
            seen.add(offset)
        return again


def owners_at(facts: Facts, at: int, span_ns: int) -> dict[int, str]:
    """The incarnation that ran each partition's tasks over the ``span_ns`` before ``at``
    (the last one when several did)."""
    found = {}
    for p in range(PARTITIONS):
        who = facts.last_owner(p, at)
        if who is not None and facts.owner(p, at - span_ns, at):
            found[p] = who
    return found


def step_figures(
    facts: Facts, begin: int, end: int, *, same: Any = None, settle_ns: int = 2 * NS
) -> dict[str, Any]:
    """Figures of a step between ``begin`` (the signal, the start) and ``end`` (the next
    step): an owner is compared by ``same`` (the incarnation by default; the instance for
    static members, which come back under their own name)."""
    key = same or (lambda who: who)
    before = owners_at(facts, begin, settle_ns)
    after = owners_at(facts, end, settle_ns)
    kept, moved = [], []
    for p in range(PARTITIONS):
        between = {key(w) for w in facts.owner(p, begin, end)}
        if (
            p in before
            and after.get(p)
            and key(before[p]) == key(after[p])
            and (between <= {key(before[p])})
        ):
            kept.append(p)
        else:
            moved.append(p)
    gaps = {p: facts.longest_gap(p, begin, end) for p in range(PARTITIONS)}
    twice = {p: facts.twice(p, begin, end) for p in range(PARTITIONS)}
    return {
        "kept": len(kept),
        "moved_partitions": moved,
        "kept_pause_ms": round(max((gaps[p] for p in kept), default=0) / 1e6),
        "moved_pause_ms": round(max((gaps[p] for p in moved), default=0) / 1e6),
        "twice": sum(twice.values()),
        "twice_kept": sum(twice[p] for p in kept),
        "worst_kept": max(kept, key=lambda p: gaps[p]) if kept else None,
        "before": {p: key(w) for p, w in before.items()},
        "after": {p: key(w) for p, w in after.items()},
    }


def steady_gap(facts: Facts, begin: int, end: int) -> int:
    return round(max(facts.longest_gap(p, begin, end) for p in range(PARTITIONS)) / 1e6)


# ------------------------------------------------------------------------ the runs


class Group:
    """One topic, one group, its members and a producer at ``RATE`` tasks/s."""

    def __init__(self, bootstrap: str, workdir: Path, protocol: str, task_ms: int) -> None:
        self.bootstrap = bootstrap
        self.workdir = workdir
        self.protocol = protocol
        self.task_ms = task_ms
        self.group = f"rebalance-{uuid.uuid4().hex[:8]}"
        self.topic = ""
        self.instances: list[Instance] = []
        self.produced = 0
        self.failed = 0
        self._stop = asyncio.Event()
        self._admin = TopicAdmin(bootstrap)
        self._producing: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Group:
        self.topic = await self._admin.create(PARTITIONS, prefix="rebalance")
        (self.workdir / "rebalance_app.py").write_text(APP)
        self._producing = asyncio.create_task(self._produce())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        if self._producing is not None:
            await self._producing
        for instance in self.instances:
            await instance.stop(signal.SIGTERM)
        await self._admin.close()  # the topic deleted

    def member(self, name: str, instance_id: str | None = None) -> Instance:
        argv = [sys.executable, "-m", "decaton_aio", "run", "rebalance_app:app"]
        argv += ["--topic", self.topic, "--bootstrap-servers", self.bootstrap]
        argv += ["--group", self.group, "--group-protocol", self.protocol]
        if instance_id is not None:
            argv += ["--group-instance-id", instance_id]
        env = {"REBALANCE_TASK_MS": str(self.task_ms)}
        instance = Instance(name, self.workdir, argv, env)
        self.instances.append(instance)
        return instance

    async def _produce(self) -> None:
        config = ProducerConfig(self.bootstrap, linger_ms=5)
        producer: TaskProducer[bytes] = TaskProducer(config, self.topic, BytesSerializer())
        pending: set[asyncio.Task[Any]] = set()
        async with producer:
            while True:  # the topic's partitions have leaders
                try:
                    await asyncio.gather(
                        *(producer.put("warm", b"0", partition=p) for p in range(PARTITIONS))
                    )
                    break
                except Exception:  # not yet
                    await asyncio.sleep(0.5)
            began = time.monotonic()
            while not self._stop.is_set():
                due = int((time.monotonic() - began) * RATE)
                while self.produced < due:
                    n = self.produced
                    put = asyncio.create_task(self._put(producer, n))
                    pending.add(put)
                    put.add_done_callback(pending.discard)
                    self.produced += 1
                await asyncio.sleep(0.01)
            await asyncio.gather(*pending)

    async def _put(self, producer: TaskProducer[bytes], n: int) -> None:
        try:
            await producer.put(f"k{n % KEYS}", str(n).encode())
        except Exception:  # counted in the report
            self.failed += 1

    async def all_running(self, timeout_s: float = 120) -> None:
        """Wait until every partition's tasks run (each member joined, the group formed)."""
        deadline = time.monotonic() + timeout_s
        while True:
            now = time.time_ns()
            facts = Facts.of(self.instances)
            if all(facts.owner(p, now - NS, now) for p in range(PARTITIONS)):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"not every partition runs after {timeout_s} s")
            await asyncio.sleep(0.5)


async def wait_until(at_ns: int) -> None:
    await asyncio.sleep(max(0.0, (at_ns - time.time_ns()) / NS))


async def started(member: Instance, mark: int, window_s: float, joined: dict[str, float]) -> None:
    """Start ``member`` and wait out the step: ``window_s`` from ``mark`` and at least
    `SETTLE_S` after the member took part in a rebalance (a loaded machine starts a
    process slowly); how long it took to join goes to ``joined``."""
    await member.start()
    await member.joined(JOIN_TIMEOUT_S)
    joined[member.name] = round((time.time_ns() - mark) / NS, 1)
    await wait_until(max(mark + int(window_s * NS), time.time_ns() + int(SETTLE_S * NS)))


async def steps(
    bootstrap: str, protocol: str, task_ms: int, window_s: float, crash_s: float, steady_s: float
) -> dict[str, Any]:
    """3 members steady, a 4th joins, one leaves (SIGTERM), one crashes (SIGKILL) and a new
    member starts at once."""
    with tempfile.TemporaryDirectory(prefix="rebalance-") as tmp:
        async with Group(bootstrap, Path(tmp), protocol, task_ms) as group:
            joined: dict[str, float] = {}
            first = [group.member(f"m{n}") for n in range(3)]
            for member in first:
                await member.start()
            for member in first:
                await member.joined(JOIN_TIMEOUT_S)
            await group.all_running()
            await asyncio.sleep(3)  # the backlog of the start is worked off
            marks = {"steady": time.time_ns()}
            await asyncio.sleep(steady_s)
            marks["join"] = time.time_ns()
            await started(group.member("m3"), marks["join"], window_s, joined)
            marks["leave"] = time.time_ns()
            await first[0].stop(signal.SIGTERM)
            await wait_until(marks["leave"] + int(window_s * NS))
            marks["crash"] = time.time_ns()
            await first[1].stop(signal.SIGKILL)
            await started(group.member("m4"), marks["crash"], crash_s, joined)
            marks["end"] = time.time_ns()
            facts = Facts.of(group.instances)
    figures = {
        "run": "steps",
        "protocol": protocol,
        "task_ms": task_ms,
        "steady_gap_ms": steady_gap(facts, marks["steady"], marks["join"]),
        "joined_s": joined,
        "failed_puts": group.failed,
    }
    order = ["join", "leave", "crash", "end"]
    for step, after in itertools.pairwise(order):
        figures[step] = step_figures(facts, marks[step], marks[after])
    return figures


async def rolling(
    bootstrap: str, protocol: str, task_ms: int, window_s: float, steady_s: float
) -> dict[str, Any]:
    """3 static members, each stopped with SIGTERM and started again, one at a time."""
    with tempfile.TemporaryDirectory(prefix="rebalance-") as tmp:
        async with Group(bootstrap, Path(tmp), protocol, task_ms) as group:
            members = [group.member(f"m{n}", f"{group.group}-m{n}") for n in range(3)]
            for member in members:
                await member.start()
            for member in members:
                await member.joined(JOIN_TIMEOUT_S)
            await group.all_running()
            await asyncio.sleep(3)
            marks = [time.time_ns()]
            await asyncio.sleep(steady_s)
            joined: dict[str, float] = {}
            for member in members:
                marks.append(time.time_ns())
                await member.stop(signal.SIGTERM)
                await started(member, marks[-1], window_s, joined)
            marks.append(time.time_ns())
            facts = Facts.of(group.instances)

    def instance(who: str) -> str:
        return who.split("#")[0]

    figures: dict[str, Any] = {
        "run": "rolling",
        "protocol": protocol,
        "task_ms": task_ms,
        "steady_gap_ms": steady_gap(facts, marks[0], marks[1]),
        "joined_s": joined,
        "failed_puts": group.failed,
        "restarts": [],
    }
    whole = step_figures(facts, marks[1], marks[-1], same=instance)
    figures["moved"] = len(whole["moved_partitions"])
    for n, member in enumerate(members):
        begin, end = marks[n + 1], marks[n + 2]
        step = step_figures(facts, begin, end, same=instance)
        own = [p for p, who in step["before"].items() if who == member.name]
        others = [p for p in range(PARTITIONS) if p not in own]
        figures["restarts"].append(
            {
                "member": member.name,
                "moved": len(step["moved_partitions"]),
                "others_pause_ms": round(
                    max(facts.longest_gap(p, begin, end) for p in others) / 1e6
                ),
                "own_pause_ms": round(
                    max((facts.longest_gap(p, begin, end) for p in own), default=0) / 1e6
                ),
                "twice": step["twice"],
            }
        )
    return figures


# ------------------------------------------------------------------------ state stores


def restores(before: dict[int, str], after: dict[int, str], standbys: dict[str, set[int]]) -> int:
    """Partitions whose new owner had neither the partition nor a standby copy of it."""
    return sum(
        1
        for p, owner in after.items()
        if before.get(p) != owner and p not in standbys.get(owner, set())
    )


def state_choice(
    before: dict[int, str], after: dict[int, str], standby_replicas: int
) -> dict[str, int]:
    """Restores of the coordinator's assignment ``after`` (recorded) against the state-aware
    assignor's for the same change of members, both from ``before`` with the standbys the
    state-aware assignor places for it."""
    members_before = set(before.values())
    owned = {m: frozenset(p for p, o in before.items() if o == m) for m in members_before}
    _, standbys = plan_assignment(
        range(PARTITIONS),
        {m: MemberState(owned[m], dict.fromkeys(owned[m], 1000)) for m in members_before},
        standby_replicas,
    )
    members_after = set(after.values())
    states = {}
    for m in members_after:
        positions = dict.fromkeys(owned.get(m, frozenset()), 1000)
        positions.update(dict.fromkeys(standbys.get(m, set()), 990))
        states[m] = MemberState(owned.get(m, frozenset()), positions)
    planned, _ = plan_assignment(range(PARTITIONS), states, standby_replicas)
    return {
        "uniform_moved": sum(1 for p, o in after.items() if before.get(p) != o),
        "uniform_restores": restores(before, after, standbys),
        "state_aware_moved": sum(1 for p, o in planned.items() if before.get(p) != o),
        "state_aware_restores": restores(before, planned, standbys),
    }


# ------------------------------------------------------------------------ the report


def tree() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _span(values: Iterable[Any]) -> str:
    found = sorted(v for v in values if v is not None)
    if not found:
        return "-"
    if isinstance(found[0], str):  # one per run
        return "; ".join(found)
    return str(found[0]) if found[0] == found[-1] else f"{found[0]}-{found[-1]}"


def steps_table(results: list[dict[str, Any]], protocol: str, task_ms: Sequence[int]) -> list[str]:
    def cell(ms: int, pick: Any) -> str:
        found = [
            r
            for r in results
            if r["run"] == "steps" and r["protocol"] == protocol and r["task_ms"] == ms
        ]
        return _span(pick(r) for r in found)

    rows = [
        ("partitions that keep their owner at the join (of 12)", lambda r: r["join"]["kept"]),
        ("longest pause of a kept partition at the join, ms", lambda r: r["join"]["kept_pause_ms"]),
        (
            "longest pause of a moved partition at the join, ms",
            lambda r: r["join"]["moved_pause_ms"],
        ),
        ("partitions that keep their owner at the leave (of 12)", lambda r: r["leave"]["kept"]),
        (
            "longest pause of a kept partition at the leave, ms",
            lambda r: r["leave"]["kept_pause_ms"],
        ),
        (
            "longest pause of a moved partition at the leave, ms",
            lambda r: r["leave"]["moved_pause_ms"],
        ),
        ("crash and restart: partitions kept (of 12)", lambda r: r["crash"]["kept"]),
        (
            "crash and restart: longest pause of a kept partition, ms",
            lambda r: r["crash"]["kept_pause_ms"],
        ),
        (
            "crash and restart: longest pause of any partition, ms",
            lambda r: max(r["crash"]["kept_pause_ms"], r["crash"]["moved_pause_ms"]),
        ),
        (
            "tasks run twice: join / leave / crash",
            lambda r: f"{r['join']['twice']} / {r['leave']['twice']} / {r['crash']['twice']}",
        ),
        (
            "of them on kept partitions: join / leave / crash",
            lambda r: " / ".join(str(r[s]["twice_kept"]) for s in ("join", "leave", "crash")),
        ),
        (
            "new member joined after: join / crash, s",
            lambda r: f"{r['joined_s'].get('m3')} / {r['joined_s'].get('m4')}",
        ),
        (
            "longest gap between tasks of a partition in steady state, ms",
            lambda r: r["steady_gap_ms"],
        ),
    ]
    lines = [f"| {protocol} | " + " | ".join(f"{ms} ms tasks" for ms in task_ms) + " |"]
    lines.append("|---|" + "---:|" * len(task_ms))
    for label, pick in rows:
        lines.append(f"| {label} | " + " | ".join(cell(ms, pick) for ms in task_ms) + " |")
    return lines


def report(results: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    out = [f"# Rebalances on both group protocols (tree {meta['tree']})", ""]
    out.append(
        f"`{meta['command']}`: embedded Apache Kafka, {PARTITIONS} partitions, members are "
        f"`python -m decaton_aio run` with defaults (`--group-protocol` given), {RATE} "
        f"tasks/s over {KEYS} keys; windows: steady {meta['steady_s']} s, join and leave "
        f"{meta['window_s']} s each, crash and restart {meta['crash_s']} s, rolling "
        f"restart {meta['window_s']} s a member; {meta['repeats']} run(s) each (a range is "
        "min-max over runs)."
    )
    out.append("")
    out.append(
        f"Machine: {meta['cpus']} CPUs shared with other work; load average (1 min) "
        f"{meta['load_begin']} at the start, {meta['load_end']} at the end, "
        f"{_span(r.get('load') for r in results)} at the end of each run. Took "
        f"{meta['took_s']} s."
    )
    out.append("")
    out.append(
        "A partition keeps its owner when the process that ran its tasks in the 2 s "
        "before the step runs them in the last 2 s of the step's window and no other "
        "process ran any meanwhile; a pause is the longest time between two task starts "
        "of a partition in the window; a task runs twice when it starts again in the "
        "window. Classic is the runtime's classic protocol (eager, its own assignors); "
        "consumer is Kafka's consumer group protocol (the coordinator's `uniform` assignor)."
    )
    task_ms = sorted({r["task_ms"] for r in results if r["run"] == "steps"})
    for protocol in PROTOCOLS:
        if any(r["run"] == "steps" and r["protocol"] == protocol for r in results):
            out += ["", *steps_table(results, protocol, task_ms)]
    rolls = [r for r in results if r["run"] == "rolling"]
    if rolls:
        out += ["", "## Rolling restart of 3 static members", ""]
        out.append(
            "Each member (`--group-instance-id`) stopped with SIGTERM and started again at "
            "once, one at a time; moved: partitions whose owner (by instance) changed."
        )
        out += [
            "",
            "| protocol | task | partitions moved (whole roll) | per restart: moved | "
            "longest pause of the others, ms | longest pause of its own, ms | tasks run twice "
            "| steady gap, ms |",
            "|---|---:|---:|---|---|---|---|---:|",
        ]
        for r in rolls:
            per = r["restarts"]
            out.append(
                f"| {r['protocol']} | {r['task_ms']} ms | {r['moved']} | "
                + " / ".join(str(x["moved"]) for x in per)
                + " | "
                + " / ".join(str(x["others_pause_ms"]) for x in per)
                + " | "
                + " / ".join(str(x["own_pause_ms"]) for x in per)
                + " | "
                + " / ".join(str(x["twice"]) for x in per)
                + f" | {r['steady_gap_ms']} |"
            )
    choices = [r for r in results if r["run"] == "state"]
    if choices:
        out += ["", "## State stores: restores per join and per leave", ""]
        out.append(
            "The consumer protocol's real assignments (the coordinator's `uniform` "
            "assignor) at the join and at the leave of the runs above, against what the "
            "state-aware assignor of the classic protocol (`plan_assignment`) gives for "
            "the same change of members from the same assignment; a restore is a "
            "partition whose new owner had neither it nor a standby copy (the standbys "
            "placed for the assignment before the change, as the state-aware assignor "
            "places them)."
        )
        out += [
            "",
            "| change | standbys | uniform: moved | uniform: restores | "
            "state-aware: moved | state-aware: restores |",
            "|---|---:|---|---|---|---|",
        ]
        for change in ("join", "leave", "crash"):
            for replicas in (0, 1):
                found = [r for r in choices if r["change"] == change and r["standbys"] == replicas]
                if found:
                    out.append(
                        f"| {change} | {replicas} | "
                        + " | ".join(
                            _span(r[k] for r in found)
                            for k in (
                                "uniform_moved",
                                "uniform_restores",
                                "state_aware_moved",
                                "state_aware_restores",
                            )
                        )
                        + " |"
                    )
    return "\n".join(out) + "\n"


def write(out: Path, results: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    """The report at ``out``, the raw figures beside it (``.jsonl``)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report(results, meta))
    with out.with_suffix(".jsonl").open("w") as raw:
        raw.write(json.dumps({"meta": meta}) + "\n")
        for r in results:
            raw.write(json.dumps(r) + "\n")


async def main(args: argparse.Namespace) -> None:
    began = time.monotonic()
    meta: dict[str, Any] = {
        "tree": tree(),
        "command": "python -m bench.rebalance " + " ".join(sys.argv[1:]),
        "cpus": os.cpu_count(),
        "load_begin": round(os.getloadavg()[0], 2),
        "window_s": args.window_s,
        "crash_s": args.crash_s,
        "steady_s": args.steady_s,
        "repeats": args.repeats,
    }
    out = Path(args.out or f"bench/results/rebalance-{meta['tree']}.md")
    results: list[dict[str, Any]] = []
    broker = EmbeddedBroker(flavor="apache").start()
    try:
        for _ in range(args.repeats):
            for protocol in args.protocols:
                for task_ms in args.task_ms if "steps" in args.runs else ():
                    r = await steps(
                        broker.bootstrap_servers,
                        protocol,
                        task_ms,
                        args.window_s,
                        args.crash_s,
                        args.steady_s,
                    )
                    r["load"] = round(os.getloadavg()[0], 2)
                    results.append(r)
                    print(json.dumps(r), flush=True)
                    if protocol == "consumer":
                        for change in ("join", "leave", "crash"):
                            for replicas in (0, 1):
                                choice: dict[str, Any] = {
                                    **state_choice(
                                        r[change]["before"], r[change]["after"], replicas
                                    ),
                                    "run": "state",
                                    "change": change,
                                    "standbys": replicas,
                                    "task_ms": task_ms,
                                }
                                results.append(choice)
                                print(json.dumps(choice), flush=True)
                if "rolling" in args.runs:
                    r = await rolling(
                        broker.bootstrap_servers,
                        protocol,
                        args.task_ms[0],
                        args.window_s,
                        args.steady_s,
                    )
                    r["load"] = round(os.getloadavg()[0], 2)
                    results.append(r)
                    print(json.dumps(r), flush=True)
    finally:
        broker.stop()
    meta["load_end"] = round(os.getloadavg()[0], 2)
    meta["took_s"] = round(time.monotonic() - began)
    write(out, results, meta)
    print(f"report: {out}", file=sys.stderr)


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.rebalance", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--protocols", type=lambda s: s.split(","), default=list(PROTOCOLS))
    parser.add_argument(
        "--task-ms", type=lambda s: [int(x) for x in s.split(",")], default=[5, 200]
    )
    parser.add_argument(
        "--runs", type=lambda s: s.split(","), default=["steps", "rolling"], help="steps,rolling"
    )
    parser.add_argument("--window-s", type=float, default=12.0, help="join, leave, each restart")
    parser.add_argument(
        "--crash-s",
        type=float,
        default=20.0,
        help="crash and restart (longer than the session timeout)",
    )
    parser.add_argument("--steady-s", type=float, default=10.0)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument(
        "--out", default=None, help="the report (default bench/results/rebalance-<tree>.md)"
    )
    args = parser.parse_args(argv)
    for protocol in args.protocols:
        if protocol not in PROTOCOLS:
            parser.error(f"--protocols: {protocol!r} is not one of {', '.join(PROTOCOLS)}")
    return args


if __name__ == "__main__":
    asyncio.run(main(parse()))
