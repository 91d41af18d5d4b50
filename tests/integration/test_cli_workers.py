"""`python -m decaton_aio run --workers N`: a supervisor and N worker processes in one group.

A worker killed with SIGKILL is restarted and no task is lost; SIGINT to the supervisor
(a terminal's Ctrl-C) makes every worker drain; a worker that keeps crashing ends the
supervisor with one clear line and a non-zero exit; the supervisor's metrics endpoint
serves every worker's series.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
import textwrap
import urllib.request
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from decaton_aio.cli._supervisor import choose_workers, usable_cpus
from decaton_aio.producer import summarize_spool
from decaton_aio.testing import BrokerHandle, committed_offsets

pytestmark = pytest.mark.integration

APP = textwrap.dedent(
    """
    import asyncio, os
    from decaton_aio import Application, JsonSerializer

    ROLE = os.environ.get("DECATON_AIO_WORKER", "0:").split(":")[0]
    if ROLE != "0" and os.environ.get("CRASH_AT_START"):
        os._exit(3)  # a worker that cannot start
    LOG = open(os.path.join(os.environ["OUT_DIR"], f"w{ROLE}-{os.getpid()}.log"), "a", buffering=1)

    async def process(ctx, task):
        LOG.write(f"start {ctx.partition} {ctx.offset}\\n")
        await asyncio.sleep(task["sleep_s"])
        LOG.write(f"end {ctx.partition} {ctx.offset}\\n")

    app = Application(process, topics=("unused",), serializer=JsonSerializer(dict))
    """
)


class Supervisor:
    """A `run --workers N` process, its stderr lines and its workers' task logs."""

    def __init__(self, proc: asyncio.subprocess.Process, out: Path) -> None:
        self.proc = proc
        self.out = out
        self.lines: list[str] = []
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc.stderr is not None
        async for raw in self.proc.stderr:
            self.lines.append(raw.decode(errors="replace").rstrip())

    def events(self, name: str) -> list[dict[str, Any]]:
        found = []
        for line in self.lines:
            if line.startswith("{"):
                event = json.loads(line)
                if event.get("event") == name:
                    found.append(event)
        return found

    def owned(self) -> dict[Any, int]:
        """How many partitions each worker owns, as its last change of them logged (a
        change logs the partitions that moved and the count owned after it)."""
        latest: dict[Any, int] = {}
        for line in self.lines:
            if line.startswith("{"):
                event = json.loads(line)
                if str(event.get("event", "")).startswith("partitions ") and "owned" in event:
                    latest[event.get("worker")] = event["owned"]
        return latest

    def logs(self) -> dict[str, list[tuple[str, int, int]]]:
        """Each worker incarnation's (kind, partition, offset) events, by 'w<i>-<pid>'."""
        runs = {}
        for path in self.out.glob("w*.log"):
            rows = [line.split() for line in path.read_text().splitlines()]
            runs[path.stem] = [(k, int(p), int(o)) for k, p, o in (r for r in rows if len(r) == 3)]
        return runs

    def ended(self) -> set[tuple[int, int]]:
        return {(p, o) for run in self.logs().values() for k, p, o in run if k == "end"}

    async def wait(self, timeout_s: float = 60) -> int:
        code = await asyncio.wait_for(self.proc.wait(), timeout_s)
        await self.reader
        return code


async def eventually(check: Callable[[], Any], what: str, timeout_s: float = 60) -> Any:
    """Poll ``check`` (reading files and logs of other processes) until it is truthy."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


@pytest.fixture
def start_supervisor(
    tmp_path: Path, kafka_broker: BrokerHandle
) -> Callable[..., Awaitable[Supervisor]]:
    (tmp_path / "workers_app.py").write_text(APP)
    started: list[Supervisor] = []

    async def start(topic: str, group: str, *extra: str, **env: str) -> Supervisor:
        out = tmp_path / f"out-{uuid.uuid4().hex[:6]}"
        out.mkdir()
        argv = [sys.executable, "-m", "decaton_aio", "--log-format", "json", "run"]
        argv += ["workers_app:app", "--bootstrap-servers", kafka_broker.bootstrap_servers]
        argv += ["--topic", topic, "--group", group, *extra]
        argv += ["--session-timeout-ms", "6000", "--heartbeat-interval-ms", "500"]
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=tmp_path,
            env={**os.environ, "OUT_DIR": str(out), **env},
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        sup = Supervisor(proc, out)
        started.append(sup)
        return sup

    yield start  # type: ignore[misc]
    for sup in started:
        if sup.proc.returncode is None:
            sup.proc.kill()
        for event in sup.events("worker started"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(event["pid"], signal.SIGKILL)


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        text: str = response.read().decode()
        return text


async def test_a_killed_worker_is_restarted_and_no_task_is_lost(
    kafka_broker: BrokerHandle,
    topic_factory: Any,
    task_producer: Any,
    start_supervisor: Callable[..., Awaitable[Supervisor]],
) -> None:
    """SIGKILL of one of two workers: the supervisor starts it again, every task produced
    before and after the kill is processed, the endpoint shows both workers and the
    restart, and SIGINT then drains both and commits to the end."""
    topic = await topic_factory(partitions=4)
    group = f"workers-{uuid.uuid4().hex[:8]}"
    producer = await task_producer(topic)
    sup = await start_supervisor(topic, group, "--workers", "2", "--metrics-port", "0")
    url = (await eventually(lambda: sup.events("metrics endpoint of all workers"), "endpoint"))[0]
    url = url["url"]

    def assigned_workers() -> set[str]:
        # Only assigned partitions export the pending gauge: both workers hold some.
        found = re.findall(r'decaton_partition_tasks_pending\{[^}]*worker="(\d)"', scrape(url))
        return set(found) if set(found) == {"1", "2"} else set()

    await eventually(assigned_workers, "both workers assigned partitions", 90)
    for i in range(200):
        await producer.put(f"k{i}", b'{"sleep_s": 0.01}')
    await eventually(lambda: len(sup.ended()) >= 200, "the first 200 tasks")

    victim = sup.events("worker started")[0]
    os.kill(victim["pid"], signal.SIGKILL)
    for i in range(200, 400):
        await producer.put(f"k{i}", b'{"sleep_s": 0.01}')
    restarted = await eventually(
        lambda: [e for e in sup.events("worker started") if e["worker"] == victim["worker"]][1:],
        "the killed worker started again",
    )
    assert restarted[0]["pid"] != victim["pid"]
    assert any("worker exited: restarting" in line for line in sup.lines)
    await eventually(lambda: len(sup.ended()) >= 400, "all 400 tasks", 90)
    offsets = {(p, o) for p, o in sup.ended()}
    assert len(offsets) == 400  # every produced record, none missing
    text = scrape(url)
    assert f'decaton_supervisor_worker_restarts_total{{worker="{victim["worker"]}"}} 1.0' in text

    sup.proc.send_signal(signal.SIGINT)
    assert await sup.wait() == 0
    committed = await committed_offsets(kafka_broker.bootstrap_servers, group, topic, range(4))
    per_partition: dict[int, int] = {}
    for p, o in offsets:
        per_partition[p] = max(per_partition.get(p, -1), o + 1)
    assert committed == per_partition


async def test_sigint_drains_every_worker(
    kafka_broker: BrokerHandle,
    topic_factory: Any,
    task_producer: Any,
    start_supervisor: Callable[..., Awaitable[Supervisor]],
) -> None:
    """SIGINT to the supervisor while both workers have tasks running: each worker lets
    its running tasks finish and commits them, every worker process is gone, exit 0."""
    topic = await topic_factory(partitions=2)
    group = f"workers-{uuid.uuid4().hex[:8]}"
    # The tasks come once each worker holds one partition (a worker that joined first
    # would otherwise start them all); a later rebalance drains them (10 s timeout).
    drain_rebalances = "decaton.group.rebalance.timeout.ms=10000"
    sup = await start_supervisor(topic, group, "--workers", "2", "--property", drain_rebalances)

    def one_partition_each() -> bool:
        return sorted(sup.owned().values()) == [1, 1]

    await eventually(one_partition_each, "one partition assigned to each worker", 90)
    producer = await task_producer(topic)
    for i in range(40):
        await producer.put(f"k{i}", b'{"sleep_s": 2.0}')

    def both_running() -> bool:
        started = {name.split("-")[0] for name, run in sup.logs().items() if run}
        return started == {"w1", "w2"}

    await eventually(both_running, "tasks running in both workers", 90)
    sup.proc.send_signal(signal.SIGINT)
    assert await sup.wait() == 0
    begun = {(p, o) for run in sup.logs().values() for k, p, o in run if k == "start"}
    assert begun, "no task had started"
    assert begun <= sup.ended(), "a running task was cut instead of drained"
    for event in sup.events("worker started"):
        with pytest.raises(ProcessLookupError):
            os.kill(event["pid"], 0)
    assert len(sup.events("worker stopped")) == 2
    assert all(e["exit"] == "exit code 0" for e in sup.events("worker stopped"))
    committed = await committed_offsets(kafka_broker.bootstrap_servers, group, topic, range(2))
    for p, end in committed.items():
        assert end is not None
        done = {o for q, o in sup.ended() if q == p}
        assert set(range(end)) <= done  # the commit covers only finished tasks
        assert end == max(done) + 1  # and every finished one: the drain committed them


async def test_a_worker_that_keeps_crashing_ends_the_supervisor(
    topic_factory: Any, start_supervisor: Callable[..., Awaitable[Supervisor]]
) -> None:
    """Workers that exit as they start are restarted with backoff, then the supervisor
    gives up: one line naming the worker and how it ended, a non-zero exit."""
    topic = await topic_factory(partitions=1)
    sup = await start_supervisor(
        topic,
        "never-joins",
        *("--workers", "2", "--max-worker-restarts", "2"),
        *("--worker-restart-backoff-ms", "50"),
        CRASH_AT_START="1",
    )
    code = await sup.wait()
    assert code == 1
    last = [line for line in sup.lines if line.startswith("decaton-aio:")]
    assert len(last) == 1
    assert re.match(
        r"decaton-aio: worker [12] exited 3 times in a row, each within 60 s of starting "
        r"\(last: exit code 3\); gave up after 2 restarts",
        last[0],
    ), last[0]
    restarts = sup.events("worker exited: restarting")
    assert [e["after_s"] for e in restarts if e["worker"] == restarts[0]["worker"]][:2] == [
        0.05,
        0.1,
    ]


async def test_auto_gives_every_worker_the_same_share_of_partitions(
    topic_factory: Any, start_supervisor: Callable[..., Awaitable[Supervisor]]
) -> None:
    """``--workers auto`` on 3 partitions asks the cluster, logs its choice with the
    partitions and the CPUs (3 workers on 2 CPUs), runs that many workers and each holds
    the same number of partitions; SIGINT drains them all."""
    topic = await topic_factory(partitions=3)
    group = f"workers-{uuid.uuid4().hex[:8]}"
    choice = choose_workers(3, usable_cpus())
    sup = await start_supervisor(topic, group, "--workers", "auto")
    [line] = await eventually(lambda: sup.events("workers chosen"), "the worker count")
    assert line["level"] == "info"
    assert (line["workers"], line["partitions"], line["cpus"]) == (choice.workers, 3, choice.cpus)
    assert line["topics"] == {topic: 3}

    def balanced() -> bool:
        shares = sorted(sup.owned().values())
        return shares == [3 // choice.workers] * choice.workers

    await eventually(balanced, "every worker holding the same share", 90)
    sup.proc.send_signal(signal.SIGINT)
    assert await sup.wait() == 0


async def test_auto_with_a_missing_topic_runs_one_worker_per_cpu(
    topic_factory: Any,
    task_producer: Any,
    start_supervisor: Callable[..., Awaitable[Supervisor]],
) -> None:
    """A task topic that does not exist at start: a warning, one worker per CPU, each
    waiting for the topic, and the topic is processed once it is created."""
    topic = f"later-{uuid.uuid4().hex[:8]}"
    group = f"workers-{uuid.uuid4().hex[:8]}"
    sup = await start_supervisor(topic, group, "--workers", "auto")
    [line] = await eventually(lambda: sup.events("workers chosen"), "the worker count")
    assert line["level"] == "warning"
    assert line["workers"] == line["cpus"] == usable_cpus()
    assert topic in line["why"]

    def waiting() -> bool:
        return len(sup.events("waiting for task topics to be created")) >= usable_cpus()

    await eventually(waiting, "every worker waiting for the topic")
    assert not sup.events("worker exited: restarting")
    await topic_factory(partitions=2, name=topic)
    producer = await task_producer(topic)
    for i in range(20):
        await producer.put(f"k{i}", b'{"sleep_s": 0.01}')
    await eventually(lambda: len(sup.ended()) >= 20, "the tasks of the topic created later", 90)
    sup.proc.send_signal(signal.SIGINT)
    assert await sup.wait() == 0


async def test_a_bad_property_is_refused_once_before_any_worker_starts(
    tmp_path: Path, topic_factory: Any, start_supervisor: Callable[..., Awaitable[Supervisor]]
) -> None:
    """A property every worker would refuse at its start (from the command line and from
    a properties file here) ends `run --workers` at once: exit 2, one line naming each
    problem and where it is, no worker started (none restarted again and again)."""
    topic = await topic_factory(partitions=1)
    bad = tmp_path / "bad.properties"
    bad.write_text("decaton.commit.interval.ms=-5\n")
    sup = await start_supervisor(
        topic,
        "bad-property",
        *("--workers", "2", "--property", "decaton.partition.concurrency=-1"),
        *("--properties-file", str(bad)),
    )
    code = await sup.wait(30)
    assert code == 2
    errors = [line for line in sup.lines if line.startswith("decaton-aio:")]
    assert len(errors) == 1, sup.lines
    assert "decaton.partition.concurrency" in errors[0]
    assert "(from --property)" in errors[0]
    assert "decaton.commit.interval.ms" in errors[0]
    assert f"(in the file {bad})" in errors[0]
    assert not sup.events("worker started")


async def test_a_spool_left_by_a_run_of_one_process_is_delivered_by_the_workers(
    tmp_path: Path,
    kafka_broker: BrokerHandle,
    topic_factory: Any,
    start_supervisor: Callable[..., Awaitable[Supervisor]],
) -> None:
    """Tasks a run of one process left in its spool D (the cluster away) are delivered by
    a later ``run --workers 2 --spool-dir D``: worker 1 takes them over before the workers
    start (the workers' own spools are D/worker-<n>), and the workers run them."""
    topic = await topic_factory(partitions=2)
    spool = tmp_path / "spool"
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(f'{{"key": "k{n}", "task": {{"sleep_s": 0}}}}\n' for n in range(6)))
    argv = [sys.executable, "-m", "decaton_aio", "produce", "--topic", topic]
    argv += ["--spool-dir", str(spool), "--file", str(tasks)]
    argv += ["--bootstrap-servers", "127.0.0.1:1", "--drain-timeout-s", "0"]
    left = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.DEVNULL)
    assert await left.wait() == 69
    assert summarize_spool(spool).entries == 6

    group = f"workers-{uuid.uuid4().hex[:8]}"
    sup = await start_supervisor(topic, group, "--workers", "2", "--spool-dir", str(spool))
    await eventually(lambda: len(sup.ended()) == 6, "the 6 spooled tasks run", 90)
    (handed,) = sup.events("spools of a run with another worker count go to worker 1's spool")
    assert handed["entries"] == 6
    assert summarize_spool(spool).entries == 0
    sup.proc.send_signal(signal.SIGTERM)
    assert await sup.wait() == 0
