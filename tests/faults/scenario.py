"""One network fault scenario: two ``run`` instances of the fault application
(``fault_app.py``) behind Toxiproxy, tasks produced at a steady pace, one fault injected
for a while on one path, and what the group made of it.

Paths (which clients go through the faulty proxies):

- ``runtime``: one node; the instances reach it through its proxy for everything (fetch,
  group coordinator, outputs, state, retries, transactions), the tasks are produced
  directly.
- ``producer``: one node; ``python -m decaton_aio produce --spool-dir`` goes through the
  proxy, a batch a second, and the instances connect directly.
- ``coordinator``: three nodes; the instances go through the proxies and the fault is on
  the node that coordinates their group only. Every topic the application uses is
  placed with its leaders on the two other nodes, so the instances still reach every
  leader they fetch from and produce to: one proxy per node is shared by all clients of
  that node, so "cut from the coordinator only" needs the coordinator on a node that
  leads none of the group's partitions. (Under exactly-once the transaction coordinator
  may sit on that node too.)
- ``leaders``: three nodes, placed as for ``coordinator``, and the fault is on the two
  nodes that lead every partition: the instances reach their group's coordinator but
  none of the leaders they fetch from and produce to (the fetch path alone).
- ``node``: three nodes; the fault is on a node that leads half the partitions (not the
  group's coordinator): every client of that node is cut from it, while the brokers keep
  replicating to it.

The instances speak the group protocol ``DECATON_AIO_GROUP_PROTOCOL`` names, the consumer
protocol when it is unset (the default on Kafka 4.x); on the consumer protocol the
application runs without its state store (a state store keeps the classic protocol), so
the state's counts are judged on the classic protocol only.

The ``commit`` fault cuts requests and responses in flight, a cycle a second
(`CommitCuts`), so the cuts fall on each step of the commits. With ``rebalance`` a third
member joins just before the fault begins and the first leaves (SIGTERM) half a second
into it: the fault falls on the rebalance.

The figures of a run (`Figures`): how long until an instance's readiness probe said not
ready (``detect_s``) and when, after the fault, every probe said ready again for good
(``ready_s``), until an instance's oldest partition commit was over 5 s old
(``aged_s``), the warnings the instances logged from the fault to the steady state after
it, the longest time no task completed (``stall_s``), how long after the fault ended every
task produced until then was committed (``recover_s``), and the task runs redone (runs
beyond each task's fate), against their bound: the work pending at the fault, produced
during it, plus one commit interval.

What is judged: nothing lost (every task processed or dead-lettered, as its fate says),
each key's tasks in order in the task topic (``produce --spool-dir`` included) and in
every instance, every output there (once under exactly-once, in ``read_committed``) and
the state's counts, no process exit (``produce`` exits 0), descriptors and memory flat,
the runs redone within their bound; and after a black hole or an unreachable node of
30 s between the instances and the cluster, the probes not ready within the session
timeout and a few seconds (the members lost their group: no broker answers) and ready
again within a few seconds of the end, and the lag back to 0 within 10 s (a miss is kept
in ``missed``: the test reports it as an expected failure with its figures).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import signal
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import msgspec
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from decaton_aio import BytesSerializer, RecordLocation, TaskProducer
from decaton_aio._aiokafka import AIOKafkaClient
from decaton_aio.consumer.group._choose import protocol_from_environment
from decaton_aio.embedded import EmbeddedBroker, Toxiproxy
from decaton_aio.offsets import committed_offsets, partition_extents
from decaton_aio.testing import BrokerHandle
from tests.chaos.test_chaos import Instance, run_argv
from tests.integration.test_exactly_once import read_all
from tests.soak import soak_app
from tests.soak.checks import Reading, TaskLog, parse_metrics
from tests.soak.soak_app import DEAD, fate

PARTITIONS = 6
KEYS = 60
INSTANCES = 2
#: Tasks a second.
RATE = 150
#: Commit interval of the instances.
COMMIT_INTERVAL_MS = 500
#: No fetch returning for this long makes an instance's readiness probe fail.
FETCH_TIMEOUT_MS = 3000
#: The instances' session timeout (the chaos tests' ``run`` arguments).
SESSION_S = 6.0
#: The instances' group protocol (``DECATON_AIO_GROUP_PROTOCOL``; unset: the consumer one).
PROTOCOL = protocol_from_environment() or "consumer"
#: Faults after which the lag must be back to 0 within `RECOVERY_LIMIT_S` when they
#: lasted `LONG_OUTAGE_S` or more: a black hole and an unreachable node.
OUTAGES = ("timeout", "down")
LONG_OUTAGE_S = 30.0
RECOVERY_LIMIT_S = 10.0

#: An instance's oldest partition commit older than this (10 commit intervals) shows a fault.
AGED_S = 5.0
#: What the application logs of its own tasks' failures.
_APP_EVENTS = ("processor failed",)

_METRICS_URL = re.compile(r"http://[0-9.]+:[0-9]+/metrics")
_HERE = Path(__file__).parent

#: Runs of a task by its fate: retried once, retried until the attempts (3) ran out.
_RUNS = {"ok": 1, "fails once": 2, "retries once": 2, "always fails": 3, "rejected": 1}


@dataclass(frozen=True)
class Fault:
    """A toxic (``kind`` and its attributes, on each of ``streams``) or ``down`` (the
    proxy disabled: the node refuses connections, open ones are dropped)."""

    kind: str
    attributes: dict[str, int] = field(default_factory=dict)
    streams: tuple[str, ...] = ("downstream",)

    def apply(self, toxiproxy: Toxiproxy, proxies: list[str]) -> None:
        for proxy in proxies:
            if self.kind == "down":
                toxiproxy.set_enabled(proxy, False)
                continue
            for stream in self.streams:
                toxiproxy.add_toxic(proxy, self.kind, stream=stream, **self.attributes)

    def remove(self, toxiproxy: Toxiproxy, proxies: list[str]) -> None:
        for proxy in proxies:
            if self.kind == "down":
                toxiproxy.set_enabled(proxy, True)
                continue
            for stream in self.streams:
                toxiproxy.remove_toxic(proxy, f"{self.kind}_{stream}")

    async def hold(self, toxiproxy: Toxiproxy, proxies: list[str], seconds: float) -> None:
        """The fault for ``seconds``, then none."""
        self.apply(toxiproxy, proxies)
        try:
            await asyncio.sleep(seconds)
        finally:
            self.remove(toxiproxy, proxies)


@dataclass(frozen=True)
class CommitCuts(Fault):
    """Requests or responses lost in flight, over and over: each cycle drops what passes
    one way (a ``timeout`` toxic with no timeout: a black hole in one direction) for
    0.8 s, then removes it, which closes every connection through the proxy (the dropped
    bytes would leave them out of step), and lets the network be for a while of its own.
    A cycle holds about one commit interval (500 ms), and the pauses vary, so the cuts
    fall on each step of the commits in turn: a transaction's ``AddOffsetsToTxn``,
    ``TxnOffsetCommit`` and ``EndTxn`` (under exactly-once), an ``OffsetCommit``
    (at-least-once), their requests lost before the broker saw them (upstream) or their
    responses after it applied them (downstream). (A held ``latency`` toxic reset with
    ``reset_peer`` cut them too, but Toxiproxy can hang removing such a latency toxic,
    after which its API answers nothing more.)"""

    kind: str = "commit"

    async def hold(self, toxiproxy: Toxiproxy, proxies: list[str], seconds: float) -> None:
        until = time.monotonic() + seconds
        cycle = 0
        try:
            while time.monotonic() < until:
                stream = ("downstream", "upstream")[cycle % 2]
                for proxy in proxies:
                    toxiproxy.add_toxic(proxy, "timeout", stream=stream, timeout=0)
                await asyncio.sleep(0.8)
                self._clear(toxiproxy, proxies)
                await asyncio.sleep(0.3 + 0.1 * (cycle % 5))
                cycle += 1
        finally:
            self._clear(toxiproxy, proxies)

    @staticmethod
    def _clear(toxiproxy: Toxiproxy, proxies: list[str]) -> None:
        for proxy in proxies:
            for toxic in toxiproxy.proxies()[proxy]["toxics"]:
                toxiproxy.remove_toxic(proxy, toxic["name"])


BOTH = ("upstream", "downstream")
FAULTS = {
    "latency": Fault("latency", {"latency": 300, "jitter": 200}, BOTH),
    "bandwidth": Fault("bandwidth", {"rate": 16}),  # KB/s of responses
    "reset_peer": Fault("reset_peer", {"timeout": 300}),  # each connection reset after 0.3 s
    "timeout": Fault("timeout", {"timeout": 0}, BOTH),  # a black hole
    "slicer": Fault("slicer", {"average_size": 24, "size_variation": 16, "delay": 500}, BOTH),
    "limit_data": Fault("limit_data", {"bytes": 2048}),  # responses cut after 2 KB
    "down": Fault("down"),
    "commit": CommitCuts(),  # requests and responses cut in flight, a cycle a second
}


@dataclass
class Figures:
    """What a fault did (seconds; ``None``: never happened)."""

    path: str
    fault: str
    exactly_once: bool
    fault_s: float
    rebalance: bool = False
    protocol: str = PROTOCOL
    tasks: int = 0
    detect_s: float | None = None
    ready_s: float | None = None
    aged_s: float | None = None
    warnings: dict[str, int] = field(default_factory=dict)
    stall_s: float = 0.0
    recover_s: float | None = None
    resumed_s: float | None = None
    drain_per_s: float | None = None
    drain_cores: float | None = None
    redone: int = 0
    redo_bound: int = 0
    fds: tuple[float, float] = (0.0, 0.0)
    rss_mb: tuple[float, float] = (0.0, 0.0)
    dead_lettered: int = 0
    outputs: int = 0
    lost: int = 0
    out_of_order: int = 0
    duplicate_outputs: int = 0
    instance_exits: list[int | None] = field(default_factory=list)
    produce_exits: list[int] = field(default_factory=list)


@dataclass
class Cluster:
    """The brokers a scenario runs on: where each kind of client connects, which
    proxies the fault goes on, and the group (named so its coordinator is known)."""

    broker: EmbeddedBroker
    toxiproxy: Toxiproxy
    path: str
    group: str = field(default_factory=lambda: f"faults-{uuid.uuid4().hex[:8]}")
    coordinator: int = 1
    faulty: list[str] = field(default_factory=list)
    leaders: list[int] = field(default_factory=list)

    @property
    def direct(self) -> str:
        return self.broker.bootstrap_servers

    @property
    def runtime_servers(self) -> str:
        proxied = self.path != "producer"
        return self.broker.proxied_bootstrap_servers if proxied else self.direct

    @property
    def producer_servers(self) -> str:
        return self.broker.proxied_bootstrap_servers if self.path == "producer" else self.direct

    async def prepare(self, topic: str, out: str) -> None:
        """Find the group's coordinator, create the topics (with their leaders off the
        coordinator's node on three nodes) and choose the faulty proxies."""
        routes = {r.node_id: r.name for r in self.broker.proxy_routes}
        nodes = sorted(routes)
        client = AIOKafkaClient(bootstrap_servers=self.direct)
        await client.bootstrap()
        try:
            self.coordinator = await client.coordinator_lookup(0, self.group)
        finally:
            await client.close()
        others = [n for n in nodes if n != self.coordinator] or nodes
        self.leaders = [others[p % len(others)] for p in range(PARTITIONS)]
        rf = len(nodes)

        def assignment(p: int) -> list[int]:
            lead = self.leaders[p]
            return [lead, *(n for n in nodes if n != lead)][:rf]

        replicas = {p: assignment(p) for p in range(PARTITIONS)}
        names = [topic, f"{topic}-retry", f"{topic}-dlq", out]
        new = [NewTopic(name, -1, -1, replica_assignments=replicas) for name in names]
        changelog = {"cleanup.policy": "compact"}
        new.append(
            NewTopic(f"{self.group}-counts-changelog", -1, -1, replicas, topic_configs=changelog)
        )
        admin = AIOKafkaAdminClient(bootstrap_servers=self.direct)
        await admin.start()
        try:
            await admin.create_topics(new)
        finally:
            await admin.close()
        await _wait_for_leaders(self.direct, names)
        if self.path == "coordinator":
            self.faulty = [routes[self.coordinator]]
        elif self.path == "leaders":
            self.faulty = [routes[n] for n in others]
        elif self.path == "node":
            self.faulty = [routes[others[0]]]
        else:
            self.faulty = list(routes.values())


async def _wait_for_leaders(servers: str, topics: list[str]) -> None:
    deadline = time.monotonic() + 30
    for topic in topics:
        while True:
            with contextlib.suppress(Exception):
                extents = await partition_extents(servers, topic)
                if len(extents) == PARTITIONS:
                    break
            assert time.monotonic() < deadline, f"{topic} has no leaders"
            await asyncio.sleep(0.2)


class Feeder:
    """Produces task number n with key ``k{n % KEYS}`` at `RATE`: in this process
    (`direct`) or a batch a second through ``produce --spool-dir`` (`cli`)."""

    def __init__(self, servers: str, topic: str, workdir: Path) -> None:
        self.servers = servers
        self.topic = topic
        self.workdir = workdir
        self.sent = 0
        self.delivered = 0
        self.exit_codes: list[int] = []

    async def direct(self, until: asyncio.Event) -> None:
        """Tasks handed to the producer on schedule, many in flight (the pace does not
        follow the acknowledgements' latency); `delivered` counts the acknowledged."""
        producer: TaskProducer[bytes] = TaskProducer(
            BrokerHandle(self.servers).producer_config(), self.topic, BytesSerializer()
        )
        in_flight: list[asyncio.Future[RecordLocation]] = []

        def acked(sent: asyncio.Future[RecordLocation]) -> None:
            if not sent.cancelled() and sent.exception() is None:
                self.delivered += 1

        async with producer:
            began = time.monotonic()
            while not until.is_set():
                due = int(RATE * (time.monotonic() - began)) - self.sent
                for _ in range(due):
                    sent = await producer.submit(f"k{self.sent % KEYS}", str(self.sent).encode())
                    sent.add_done_callback(acked)
                    in_flight.append(sent)
                    self.sent += 1
                await asyncio.sleep(0.02)
            for sent in in_flight:
                await sent  # raises if a task was not delivered

    async def cli(self, until: asyncio.Event) -> None:
        spool = self.workdir / "spool"
        argv = [sys.executable, "-m", "decaton_aio", "produce", "--topic", self.topic]
        argv += ["--bootstrap-servers", self.servers, "--spool-dir", str(spool)]
        argv += ["--drain-timeout-s", "120"]
        batch = self.workdir / "batch.jsonl"
        while not until.is_set():
            began = time.monotonic()
            first, self.sent = self.sent, self.sent + RATE
            lines = (
                json.dumps({"key": f"k{n % KEYS}", "task": n}) for n in range(first, self.sent)
            )
            batch.write_text("".join(f"{line}\n" for line in lines))
            with (self.workdir / "produce.err").open("ab") as err:
                proc = await asyncio.create_subprocess_exec(
                    *argv, "--file", str(batch), stdout=err, stderr=err
                )
                self.exit_codes.append(await proc.wait())
            self.delivered = self.sent
            await asyncio.sleep(max(0.0, began + 1.0 - time.monotonic()))


class Scenario:
    """Runs a fault scenario and judges it; `run` returns its figures."""

    def __init__(
        self,
        cluster: Cluster,
        fault: str,
        *,
        fault_s: float,
        exactly_once: bool,
        workdir: Path,
        rebalance: bool = False,
    ) -> None:
        self.cluster = cluster
        self.fault = FAULTS[fault]
        self.figures = Figures(cluster.path, fault, exactly_once, fault_s, rebalance)
        self.rebalance = rebalance
        self.exactly_once = exactly_once
        self.workdir = workdir
        self.topic = f"faults-{uuid.uuid4().hex[:8]}"
        self.out = f"{self.topic}-out"
        self.instances: list[Instance] = []
        self.urls: list[str] = []  # the metrics of the instances running
        self.processed: dict[str, int] = {}  # tasks processed by each instance, last seen
        self.cpu: dict[str, float] = {}  # CPU seconds of each instance, last seen
        self.cpu_progress: list[tuple[float, float]] = []  # (time, CPU seconds so far)
        self.progress: list[tuple[float, int]] = []  # (time, tasks processed so far)
        self.not_ready: list[float] = []  # times a probe said not ready
        #: The recovery target this run missed (every other target is asserted).
        self.missed: str | None = None
        self.aged: list[float] = []  # times an instance's oldest commit was over AGED_S old

    async def run(self) -> Figures:
        cluster = self.cluster
        await cluster.prepare(self.topic, self.out)
        for source in (_HERE / "fault_app.py", Path(soak_app.__file__)):
            shutil.copy(source, self.workdir / source.name)
        handle = BrokerHandle(cluster.runtime_servers)
        argv = run_argv(
            "fault_app:app",
            handle,
            self.topic,
            cluster.group,
            commit_interval_ms=COMMIT_INTERVAL_MS,
        )
        argv += ["--metrics-port", "0", "--fetch-timeout-ms", str(FETCH_TIMEOUT_MS)]
        if self.exactly_once:
            argv.append("--exactly-once")
        argv += ["--group-protocol", PROTOCOL]
        env = {"FAULT_OUT": self.out, "FAULT_STATE": "1" if PROTOCOL == "classic" else "0"}
        self.instances = [Instance(f"i{n}", self.workdir, argv, env) for n in range(INSTANCES)]
        leaving: Instance | None = None
        feeder = Feeder(cluster.producer_servers, self.topic, self.workdir)
        stop_feeding, stop_watching = asyncio.Event(), asyncio.Event()
        feeding = watching = None
        try:
            for instance in self.instances:
                await instance.start()
            for instance in self.instances:
                await instance.joined()
                self.urls.append(await self._metrics_url(instance))
            feed = feeder.cli if cluster.path == "producer" else feeder.direct
            feeding = asyncio.create_task(feed(stop_feeding))
            watching = asyncio.create_task(self._watch(stop_watching))
            await asyncio.sleep(3.0)  # the steady state before the fault
            before = self._readings()
            committed_before = sum((await self._committed(self.topic)).values())
            if self.rebalance:
                await self._join(argv, env)
            began, began_wall = time.monotonic(), time.time()
            fault = asyncio.create_task(
                self.fault.hold(cluster.toxiproxy, cluster.faulty, self.figures.fault_s)
            )
            if self.rebalance:
                await asyncio.sleep(0.5)
                leaving = self.instances[0]
                assert leaving.proc is not None
                leaving.proc.send_signal(signal.SIGTERM)
            await fault
            ended = time.monotonic()
            sent_by_end = feeder.sent
            self.figures.redo_bound = (
                sent_by_end - committed_before + RATE * COMMIT_INTERVAL_MS // 1000
            )
            if leaving is not None:
                await self._left(leaving)
            await self._recovered(feeder, sent_by_end, ended)
            await asyncio.sleep(2.0)  # the steady state after it
            steady_wall = time.time()
            stop_feeding.set()
            await feeding
            await self._settled(feeder.sent)
            after = self._readings()
            stop_watching.set()
            await watching
            for instance in self.instances:
                assert instance.proc is not None
                assert instance.proc.returncode is None or instance is leaving, (
                    f"{instance.name} exited during the fault: {instance.logs[-1]}"
                )
        finally:
            stop_feeding.set()
            stop_watching.set()
            for task in (feeding, watching):
                if task is not None:
                    with contextlib.suppress(BaseException):
                        await task
            # Every instance stopped, each whatever the others' stops do.
            stops = [instance.stop(signal.SIGTERM) for instance in self.instances]
            for result in await asyncio.gather(*stops, return_exceptions=True):
                if isinstance(result, BaseException):
                    raise result
        exits = [i.proc.returncode for i in self.instances if i.proc is not None]
        self.figures.instance_exits = exits
        self.figures.produce_exits = sorted(set(feeder.exit_codes))
        assert exits == [0] * len(exits), f"instances exited with {exits}"
        assert set(feeder.exit_codes) <= {0}, f"produce exited with {feeder.exit_codes}"
        self.figures.tasks = feeder.sent
        self.figures.detect_s = _first_after(self.not_ready, began)
        last = max(self.not_ready, default=began)
        self.figures.ready_s = round(max(0.0, last - ended) + 0.2, 1) if last >= began else 0.0
        self.figures.aged_s = _first_after(self.aged, began)
        self.figures.warnings = self._warnings(began_wall, steady_wall)
        self.figures.stall_s = self._longest_stall(began, ended)
        self._catch_up(ended)
        timeline = [
            (round(at - ended, 2), n, c)
            for (at, n), (_, c) in zip(self.progress, self.cpu_progress, strict=True)
        ]
        ended_wall = began_wall + (ended - began)
        (self.workdir / "progress.json").write_text(json.dumps([ended_wall, timeline]))
        self.figures.fds = (max(r.fds for r in before), max(r.fds for r in after))
        self.figures.rss_mb = (
            round(max(r.rss_mb for r in before), 1),
            round(max(r.rss_mb for r in after), 1),
        )
        await self._judge(feeder.sent)
        return self.figures

    async def _join(self, argv: list[str], env: dict[str, str]) -> None:
        """A member joins: returns once it reached the cluster and asks to join (the
        fault then falls on the rebalance it started; half a second into the fault the
        first member leaves, with SIGTERM: it drains, commits what it can and leaves)."""
        joining = Instance(f"i{len(self.instances)}", self.workdir, argv, env)
        self.instances.append(joining)
        await joining.start()
        err = joining.logs[-1].with_suffix(".err")
        deadline = time.monotonic() + 60
        while '"state": "running"' not in err.read_text():
            assert joining.proc is not None
            assert joining.proc.returncode is None, f"{joining.name} exited: {err}"
            assert time.monotonic() < deadline, f"{joining.name} never ran: {err}"
            await asyncio.sleep(0.02)

    async def _left(self, leaving: Instance) -> None:
        """The member that left exited 0 (by the end of the fault or soon after), and the
        one that joined took part in the group."""
        assert leaving.proc is not None
        code = await asyncio.wait_for(leaving.proc.wait(), 90)
        assert code == 0, f"{leaving.name} left with {code}: {leaving.logs[-1]}"
        url = self.urls[self.instances.index(leaving)]
        self.urls.remove(url)
        joining = self.instances[-1]
        await joining.joined(timeout_s=90)
        self.urls.append(await self._metrics_url(joining))

    async def _metrics_url(self, instance: Instance) -> str:
        err = instance.logs[-1].with_suffix(".err")
        deadline = time.monotonic() + 60
        while not (found := _METRICS_URL.findall(err.read_text())):
            assert time.monotonic() < deadline, f"{instance.name} serves no metrics: {err}"
            await asyncio.sleep(0.1)
        return str(found[0])

    def _warnings(self, since: float, until: float) -> dict[str, int]:
        """The warnings and errors the instances logged between ``since`` and ``until``
        (wall clock), by event (numbers in it as ``N``), but for the application's own
        failures."""
        found: Counter[str] = Counter()
        for instance in self.instances:
            for log in instance.logs:
                for line in log.with_suffix(".err").read_text().splitlines():
                    try:
                        entry = json.loads(line)
                        at = datetime.fromisoformat(entry["timestamp"]).timestamp()
                    except (ValueError, KeyError, TypeError):
                        continue
                    if (
                        entry.get("level") in ("warning", "error", "critical")
                        and entry.get("event") not in _APP_EVENTS
                        and since <= at <= until
                    ):
                        found[re.sub(r"\d+", "N", str(entry.get("event")))[:120]] += 1
        return dict(found)

    def _readings(self) -> list[Reading]:
        return [parse_metrics(_get(url)) for url in self.urls]

    async def _watch(self, until: asyncio.Event) -> None:
        """Every 0.2 s: the instances' readiness and how many tasks they processed."""
        while not until.is_set():
            now = time.monotonic()
            for url in list(self.urls):
                if not await asyncio.to_thread(_ready, url.replace("/metrics", "/readyz")):
                    self.not_ready.append(now)
                with contextlib.suppress(OSError):
                    page = await asyncio.to_thread(_get, url)
                    done = int(sum(_samples(page, "decaton_tasks_processed_total")))
                    self.processed[url] = done
                    self.cpu[url] = sum(_samples(page, "process_cpu_seconds_total"))
                    if (
                        max(_samples(page, "decaton_partition_commit_age_seconds"), default=0)
                        > AGED_S
                    ):
                        self.aged.append(now)
            self.progress.append((now, sum(self.processed.values())))
            self.cpu_progress.append((now, sum(self.cpu.values())))
            await asyncio.sleep(0.2)

    def _longest_stall(self, began: float, ended: float) -> float:
        """The longest stretch in which no task completed, among those that overlap the
        fault (seen every 0.2 s)."""
        longest, since, last = 0.0, None, -1
        for at, processed in self.progress:
            if processed != last:
                if since is not None and at >= began and since <= ended:
                    longest = max(longest, at - since)
                since, last = at, processed
        return round(longest, 1)

    def _catch_up(self, ended: float) -> None:
        """When a task first completed after the fault ended (``resumed_s``), and the
        pace (tasks a second, both instances) from the end until every task produced
        before it was committed (``drain_per_s``)."""
        before = [n for at, n in self.progress if at <= ended]
        at_end = before[-1] if before else 0
        for at, processed in self.progress:
            if at > ended and processed > at_end:
                self.figures.resumed_s = round(at - ended, 1)
                break
        recover = self.figures.recover_s
        if recover:
            until = [n for at, n in self.progress if at <= ended + recover]
            self.figures.drain_per_s = round((until[-1] - at_end) / recover) if until else None
            # The CPU the instances had meanwhile (cores): a drain that is slow with
            # little CPU waited for the machine, not for the runtime.
            cpu = [c for at, c in self.cpu_progress if ended <= at <= ended + recover]
            if len(cpu) > 1:
                self.figures.drain_cores = round((cpu[-1] - cpu[0]) / recover, 2)

    async def _committed(self, topic: str) -> dict[int, int]:
        found = await committed_offsets(
            self.cluster.direct, self.cluster.group, topic, range(PARTITIONS)
        )
        return {p: o or 0 for p, o in found.items()}

    async def _ends(self, topic: str) -> dict[int, int]:
        extents = await partition_extents(self.cluster.direct, topic)
        return {p: e.high_watermark for p, e in extents.items()}

    async def _recovered(self, feeder: Feeder, sent: int, ended: float) -> None:
        """Wait until every task produced before the fault ended is committed."""
        deadline = ended + 120
        while feeder.delivered < sent:
            assert time.monotonic() < deadline, "the producer never delivered its tasks"
            await asyncio.sleep(0.1)
        ends = await self._ends(self.topic)
        while True:
            committed = await self._committed(self.topic)
            if all(committed[p] >= end for p, end in ends.items()):
                self.figures.recover_s = round(time.monotonic() - ended, 2)
                return
            assert time.monotonic() < deadline, f"not recovered: {committed} < {ends}"
            await asyncio.sleep(0.1)

    async def _settled(self, sent: int) -> None:
        """Wait until the group committed the ends of the task and retry topics."""
        deadline = time.monotonic() + 120
        while True:
            topics = (self.topic, f"{self.topic}-retry")
            ends = [await self._ends(t) for t in topics]
            committed = [await self._committed(t) for t in topics]
            if sum(ends[0].values()) >= sent and all(
                c[p] >= e for c, e2 in zip(committed, ends, strict=True) for p, e in e2.items()
            ):
                return
            assert time.monotonic() < deadline, f"commits stuck: {committed} < {ends}"
            await asyncio.sleep(0.5)

    async def _judge(self, tasks: int) -> None:
        """Nothing lost, keys in order, the right tasks dead-lettered, outputs (once
        under exactly-once) and the state's counts; and the tasks redone."""
        log = TaskLog(tasks)
        for instance in self.instances:
            for run, path in enumerate(instance.logs, 1):
                with path.open() as lines:
                    log.read(f"{instance.name}#{run}", lines)
        direct = self.cluster.direct
        dlq = f"{self.topic}-dlq"
        dead = [int(r.value) for r in await read_all(direct, dlq) if r.value is not None]
        counts, failures = log.failures(dead)
        self.figures.dead_lettered = len(dead)
        self.figures.lost = tasks - counts["processed"] - counts["dead_lettered"]
        failures += await self._topic_order(tasks)
        self.figures.out_of_order = (
            counts["out_of_order"]
            + counts["overlaps"]
            + sum(1 for f in failures if f.startswith("in the task topic"))
        )
        assert not failures, "\n".join(failures)
        expected_runs = sum(_RUNS[fate(n)] for n in range(tasks))
        self.figures.redone = log.runs - expected_runs
        succeeded = [n for n in range(tasks) if fate(n) not in DEAD]
        outputs = Counter(int(r.value) for r in await read_all(direct, self.out))
        self.figures.outputs = sum(outputs.values())
        missing = set(succeeded) - set(outputs)
        assert not missing, f"{len(missing)} outputs missing, e.g. {sorted(missing)[:5]}"
        # The application counts a key's tasks that succeeded at their first attempt.
        # (Only on the classic protocol: on the consumer protocol it has no state store.)
        per_key: Counter[str] = Counter(f"k{n % KEYS}" for n in range(tasks) if fate(n) == "ok")
        twice = [n for n, c in outputs.items() if c > 1]
        self.figures.duplicate_outputs = len(twice)
        if self.exactly_once:
            assert not twice, f"{len(twice)} outputs committed more than once: {twice[:5]}"
        if PROTOCOL == "classic":
            changelog: dict[str, int] = {}
            for record in await read_all(direct, f"{self.cluster.group}-counts-changelog"):
                changelog[record.key.decode()] = _count(record.value)
            if self.exactly_once:
                assert changelog == dict(per_key), "the state's counts are not the tasks'"
            else:
                low = {k: n for k, n in per_key.items() if changelog.get(k, 0) < n}
                assert not low, f"counts lower than the tasks of their keys: {low}"
        assert self.figures.redone <= self.figures.redo_bound, (
            f"{self.figures.redone} runs redone, more than the work pending at the fault and "
            f"produced during it ({self.figures.redo_bound})"
        )
        fds_before, fds_after = self.figures.fds
        assert fds_after <= fds_before + 16, f"descriptors grew: {self.figures.fds}"
        rss_before, rss_after = self.figures.rss_mb
        assert rss_after <= rss_before * 1.25 + 32, f"memory grew: {self.figures.rss_mb}"
        # The lag's target is the consumer's; on the producer's path the delay is the
        # spool's replay backoff (reported in recover_s), which has no target.
        outage = self.figures.fault in OUTAGES and self.figures.fault_s >= LONG_OUTAGE_S
        if outage and self.cluster.path != "producer":
            recover = self.figures.recover_s
            assert recover is not None
            if self.cluster.path == "runtime":
                # No broker answers: the members lose their group a session in (a probe
                # that lags by up to a loop of the watch), and are ready soon after it.
                assert self.figures.detect_s is not None
                assert self.figures.detect_s <= SESSION_S + 3, "the probe missed the outage"
                assert self.figures.ready_s is not None
                assert self.figures.ready_s <= RECOVERY_LIMIT_S, "not ready after the outage"
            if recover > RECOVERY_LIMIT_S:
                self.missed = (
                    f"lag back to 0 {recover} s after a {self.figures.fault_s:g} s outage "
                    f"(target {RECOVERY_LIMIT_S:g} s): processing resumed "
                    f"{self.figures.resumed_s} s after its end, then the backlog drained at "
                    f"{self.figures.drain_per_s} tasks/s"
                )

    async def _topic_order(self, tasks: int) -> list[str]:
        """The task topic holds each key's tasks in the order they were produced (the
        spool of ``produce --spool-dir`` included): one failure per key out of order."""
        last: dict[tuple[int, bytes | None], int] = {}
        failures = []
        records = await read_all(self.cluster.direct, self.topic, at_least=tasks)
        for record in sorted(records, key=lambda r: (r.partition, r.offset)):
            n = int(record.value)
            lane = (record.partition, record.key)
            if n <= last.get(lane, -1):
                failures.append(
                    f"in the task topic, key {record.key!r}: task {n} at offset "
                    f"{record.offset} after task {last[lane]}"
                )
            last[lane] = max(n, last.get(lane, -1))
        return failures

    def report(self, name: str) -> None:
        """Print the figures and write them beside the test's directory."""
        data = asdict(self.figures)
        (self.workdir.parent / f"faults-{name}.json").write_text(json.dumps(data))
        print(f"faults {name}: {json.dumps(data)}")


def _first_after(times: list[float], began: float) -> float | None:
    return next((round(t - began, 1) for t in times if t >= began), None)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return str(response.read().decode())


def _samples(page: str, name: str) -> list[float]:
    """The values of a metric's samples on a metrics page (Prometheus text format)."""
    return [
        float(line.rsplit(" ", 1)[1])
        for line in page.splitlines()
        if line.startswith(name) and line[len(name)] in " {"
    ]


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, TimeoutError, OSError):
        return False


def _count(value: Any) -> int:
    return int(msgspec.msgpack.decode(value)) if value is not None else 0
