"""The stalled-partition alert on a real Prometheus: Debian's server scrapes a running
``python -m decaton_aio run`` whose processor hangs on one key, fires
DecatonPartitionStalled within the time the rule promises, and resolves once the hang
ends.

The server loads the shipped rules with every duration divided by ``DIVISOR`` (the copy
``test_prometheus_rules`` proves differs in durations only) and scrapes and evaluates
every second, so the test takes about a minute where production takes ten.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from decaton_aio.embedded import find_free_port
from decaton_aio.testing import BrokerHandle
from tests.deploy import promql

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

DIVISOR = 20
INTERVAL_S = 1.0  # scrape and evaluation
COMMIT_INTERVAL_S = 1.0  # decaton.commit.interval.ms, the runtime's default
#: Beyond the rule's own bound: a machine shared with other test runs may start the
#: process, a scrape or an evaluation late by this much.
SLACK_S = 10.0

APP = textwrap.dedent(
    """
    import asyncio
    from decaton_aio import Application, JsonSerializer

    released = asyncio.Event()

    async def process(ctx, task):
        if task["action"] == "hang":  # until a task of another key releases it
            await released.wait()
        elif task["action"] == "release":
            released.set()

    app = Application(process, topics=("unused",), serializer=JsonSerializer(dict))
    """
)


@dataclass
class Prometheus:
    url: str

    def get(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=5) as answer:
            body = json.load(answer)
        assert body["status"] == "success", body
        return body["data"]

    async def stalled_alert(self, topic: str) -> dict[str, Any] | None:
        """The DecatonPartitionStalled alert of ``topic``, pending or firing, or None."""
        data = await asyncio.to_thread(self.get, "/api/v1/alerts")
        for alert in data["alerts"]:
            labels = alert["labels"]
            if labels["alertname"] == "DecatonPartitionStalled" and labels["topic"] == topic:
                return dict(alert)
        return None

    async def value(self, expr: str) -> float | None:
        data = await asyncio.to_thread(self.get, "/api/v1/query", query=expr)
        return float(data["result"][0]["value"][1]) if data["result"] else None


@pytest.fixture
def metrics_port() -> int:
    return find_free_port()


@pytest.fixture
def prometheus(tmp_path: Path, metrics_port: int) -> Iterator[Prometheus]:
    """A Prometheus server on a free loopback port, scraping 127.0.0.1:metrics_port every
    second with the shortened rules; stopped by its own PID."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("the Prometheus server is not installed: make prometheus installs it")
    rules = tmp_path / "decaton-aio.rules.yaml"
    rules.write_text(yaml.safe_dump(promql.scaled_rules(DIVISOR)))
    config = tmp_path / "prometheus.yml"
    interval = promql.format_ms(int(INTERVAL_S * 1000))
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": interval, "evaluation_interval": interval},
                "rule_files": [str(rules)],
                "scrape_configs": [
                    {
                        "job_name": "page-view-counter",
                        "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"]}],
                    }
                ],
            }
        )
    )
    port = find_free_port()
    log = (tmp_path / "prometheus.log").open("w")
    argv = [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}"]
    argv += [f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"]
    server = subprocess.Popen(
        argv,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, server, tmp_path / "prometheus.log")
        yield Prometheus(url)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


def wait_ready(url: str, server: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(f"prometheus exited {server.returncode}: {log.read_text()}")
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)  # polling a server that has no readiness event to await
    raise AssertionError(f"prometheus not ready within 30 s: {log.read_text()}")


@pytest.fixture
async def processor(
    tmp_path: Path, kafka_broker: BrokerHandle, topic_factory: Any, metrics_port: int
) -> AsyncIterator[str]:
    """``python -m decaton_aio run`` of the hanging app on a fresh one-partition topic,
    serving its metrics on ``metrics_port``; yields the topic."""
    topic = await topic_factory(partitions=1)
    (tmp_path / "hang_app.py").write_text(APP)
    argv = [sys.executable, "-m", "decaton_aio", "--log-format", "json", "run", "hang_app:app"]
    argv += ["--bootstrap-servers", kafka_broker.bootstrap_servers, "--topic", topic]
    argv += ["--group", f"alerts-{uuid.uuid4().hex[:8]}", "--metrics-port", str(metrics_port)]
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        yield topic
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, stderr.decode()[-3000:]


async def until(what: str, check: Any, timeout_s: float) -> float:
    """Poll ``check()`` (an HTTP API: there is no event to await) every 0.2 s until it is
    true; the monotonic time it was first seen true."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await check():
            return time.monotonic()
        await asyncio.sleep(0.2)
    raise AssertionError(f"{what}: not within {timeout_s:g} s")


async def put_ok(producer: Any, count: int) -> None:
    for i in range(count):
        await producer.put(f"user-{i}", b'{"action": "ok"}')


def committed_offset(topic: str) -> str:
    return f'decaton_partition_committed_offset{{topic="{topic}"}}'


async def until_committed(prometheus: Prometheus, topic: str, offset: int) -> None:
    """Until Prometheus has scraped the partition's commit at ``offset``."""

    async def scraped() -> bool:
        return await prometheus.value(committed_offset(topic)) == offset

    await until(f"offset {offset} committed and scraped", scraped, 60)


async def test_a_hung_partition_fires_the_stalled_alert_and_resolves_after_the_hang(
    prometheus: Prometheus, processor: str, task_producer: Any
) -> None:
    """Given a processor whose partition is committed and scraped, when a task hangs with
    records behind it, then Prometheus fires DecatonPartitionStalled within the rule's
    window plus its ``for`` (a scrape, an evaluation and a commit interval on top) and not
    before; when a task of another key releases it, the alert resolves within a commit, a
    scrape and an evaluation."""
    topic = processor
    stalled = promql.alert_rules(promql.scaled_rules(DIVISOR))["DecatonPartitionStalled"]
    (window,) = {promql.duration_ms(d) / 1000 for d in promql.expr_durations(stalled["expr"])}
    hold_s = promql.duration_ms(stalled["for"]) / 1000
    pipeline_s = COMMIT_INTERVAL_S + 2 * INTERVAL_S
    producer = await task_producer(topic)
    await put_ok(producer, 5)
    await until_committed(prometheus, topic, 5)

    await producer.put("stuck", b'{"action": "hang"}')
    await put_ok(producer, 5)  # they finish, but the watermark waits for the hung task
    hung = time.monotonic()

    async def firing() -> bool:
        alert = await prometheus.stalled_alert(topic)
        return alert is not None and alert["state"] == "firing"

    fired = await until("the stalled alert firing", firing, window + hold_s + 60)
    alert = await prometheus.stalled_alert(topic)
    assert alert is not None
    assert alert["labels"]["partition"] == "0"
    assert alert["labels"]["severity"] == "critical"
    assert float(alert["value"]) >= 1  # the hung task and the five behind it
    assert await prometheus.value(committed_offset(topic)) == 5

    await producer.put("other-key", b'{"action": "release"}')
    released = time.monotonic()

    async def resolved() -> bool:
        return await prometheus.stalled_alert(topic) is None

    cleared = await until("the stalled alert resolved", resolved, 60)
    fired_s, resolved_s = fired - hung, cleared - released
    print(
        f"\nDecatonPartitionStalled (window {window:g} s, for {hold_s:g} s): fired "
        f"{fired_s:.1f} s after the hang, resolved {resolved_s:.1f} s after the release"
    )
    assert window + hold_s - INTERVAL_S - 1 <= fired_s <= window + hold_s + pipeline_s + SLACK_S
    assert resolved_s <= pipeline_s + SLACK_S
    await until_committed(prometheus, topic, 12)


async def test_the_dashboard_queries_answer_from_a_running_processor(
    prometheus: Prometheus, processor: str, task_producer: Any
) -> None:
    """Every query of the Grafana dashboard runs on the server scraping a processor, and
    the panels of throughput, lag, latency, loop lag and partitions show its data."""
    topic = processor
    producer = await task_producer(topic)
    await put_ok(producer, 5)
    # The counters' series exist from here on: the next tasks raise them, so rates show.
    await until_committed(prometheus, topic, 5)
    await put_ok(producer, 20)
    await until_committed(prometheus, topic, 25)

    async def counted() -> bool:  # a rate needs two samples after the increase
        return (
            await prometheus.value("sum(rate(decaton_tasks_processed_total[1m])) > 0") is not None
        )

    await until("a rate of processed tasks", counted, 30)
    answered: dict[str, list[bool]] = {}
    for title, expr in promql.dashboard_queries():
        data = await asyncio.to_thread(prometheus.get, "/api/v1/query", query=expr)
        answered.setdefault(title, []).append(bool(data["result"]))
    for title in (
        "Tasks processed per second",
        "Consumer lag per partition",
        "Produce to start (delivery latency)",
        "Event loop lag p99 and GC pauses",
        "Rebalances and partitions per member",
        "Memory per member",
    ):
        assert any(answered[title]), title
