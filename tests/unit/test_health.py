"""The liveness and readiness probes without a broker, on a fake clock."""

from __future__ import annotations

import asyncio
import json
import threading
import types
import urllib.error
import urllib.request
from typing import Any

import pytest
from aiokafka import TopicPartition

from decaton_aio import Application, ConsumerConfig, Subscription
from decaton_aio.consumer import HealthCheck, HealthConfig, SubscriptionState
from decaton_aio.context import ProcessingContext
from decaton_aio.errors import ConfigError
from decaton_aio.metrics import Metrics
from tests.unit.test_partition import Gate, make, records, settle


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _noop(ctx: ProcessingContext, task: Any) -> None:
    return None


def subscription() -> Subscription:
    app = Application(_noop, topics=("tasks",), group_id="g")
    return Subscription(app, ConsumerConfig("localhost:9", "g"))


def running(sub: Subscription, clock: Clock, *processors: Any) -> None:
    """Put a never-started subscription into the state a running one would be in."""
    sub._set_state(SubscriptionState.RUNNING)
    for index, processor in enumerate(processors):
        sub._partitions[TopicPartition("tasks", index)] = processor
    sub.last_fetch_at = clock.now


async def test_not_ready_until_running_and_fetching_what_it_was_given() -> None:
    """Not running is not ready; a running member the group gave no partition is ready
    (more members than partitions, or a rolling update's extra pod: it was not ready
    forever, and the rollout stalled on it); with partitions, it is ready once a fetch
    returned, the body giving the partition count."""
    clock = Clock()
    sub = subscription()
    health = HealthCheck(sub, clock=clock)
    ready, body = health.check_readiness()
    assert not ready
    assert body["reasons"] == ["the subscription is initializing, not running"]
    sub._set_state(SubscriptionState.RUNNING)
    ready, body = health.check_readiness()
    assert ready
    assert body == {"status": "ready", "state": "running", "partitions": 0}
    sub._partitions[TopicPartition("tasks", 0)] = make(_noop)  # assigned, nothing fetched
    ready, body = health.check_readiness()
    assert not ready
    assert body["reasons"] == ["no fetch returned ever"]
    sub._partitions.clear()
    running(sub, clock, make(_noop))
    ready, body = health.check_readiness()
    assert ready
    assert body == {"status": "ready", "state": "running", "partitions": 1}


async def test_a_rebalance_and_a_silent_fetch_routine_make_it_not_ready() -> None:
    """Rebalancing is not ready; a fetch routine silent past the fetch timeout is not
    ready, and ready again once it fetches."""
    clock = Clock()
    sub = subscription()
    running(sub, clock, make(_noop))
    health = HealthCheck(sub, HealthConfig(fetch_timeout_ms=5000), clock=clock)
    sub._set_state(SubscriptionState.REBALANCING)
    assert health.check_readiness()[1]["reasons"] == [
        "the subscription is rebalancing, not running"
    ]
    sub._set_state(SubscriptionState.RUNNING)
    clock.now += 5.5
    ready, body = health.check_readiness()
    assert not ready
    assert body["reasons"] == ["no fetch returned for 5.5 s"]
    sub.last_fetch_at = clock.now
    assert health.check_readiness()[0]


class _Loop:
    """What the probe reads of the runtime's own fetch loop: since when a broker asked has
    not answered."""

    def __init__(self) -> None:
        self.since: float | None = None

    def unanswered_since(self) -> float | None:
        return self.since


async def test_fetches_no_broker_answers_make_it_not_ready() -> None:
    """With the runtime's own fetch loop, fetch calls that keep returning (empty) while a
    broker asked for records does not answer are not ready past the fetch timeout, and
    ready again once it answers; a loop asking no broker is ready."""
    clock = Clock()
    sub = subscription()
    running(sub, clock, make(_noop))
    loop = _Loop()
    sub._loop_fetcher = types.SimpleNamespace(fetcher=loop)  # type: ignore[assignment]
    health = HealthCheck(sub, HealthConfig(fetch_timeout_ms=5000), clock=clock)
    assert health.check_readiness()[0]
    loop.since = clock.now
    clock.now += 4
    sub.last_fetch_at = clock.now
    assert health.check_readiness()[0]  # within the timeout
    clock.now += 2
    sub.last_fetch_at = clock.now
    ready, body = health.check_readiness()
    assert not ready
    assert body["reasons"] == ["no fetch answered by a broker for 6.0 s"]
    loop.since = None
    assert health.check_readiness()[0]


async def test_a_stuck_processor_fails_readiness_until_its_task_finishes() -> None:
    """A partition with pending records whose watermark stays put for the stall timeout
    is reported with its pending count and how long it waited; a partition that makes
    progress, or has nothing pending, never is."""
    clock = Clock()
    gate = Gate()
    stuck = make(gate)
    idle = make(_noop)
    sub = subscription()
    running(sub, clock, stuck, idle)
    health = HealthCheck(sub, HealthConfig(stall_timeout_ms=60_000), clock=clock)
    stuck.feed(records([b"a", b"b", b"a"]))
    await settle()
    assert health.check_readiness()[0]  # first sample
    clock.now += 30
    await gate.release(1)  # another key finishes; the head (offset 0) does not
    assert health.check_readiness()[0]
    clock.now += 30
    sub.last_fetch_at = clock.now
    ready, body = health.check_readiness()
    assert not ready
    assert body["stalled"] == [
        {"topic": "tasks", "partition": 0, "pending": 2, "watermark": 0, "stalled_s": 60.0}
    ]
    assert body["reasons"] == [
        "1 partition(s) with pending records whose watermark has not moved for over 60000 ms"
    ]
    await gate.release(0)  # the head finishes: the watermark moves
    assert health.check_readiness()[0]
    clock.now += 120
    sub.last_fetch_at = clock.now
    await gate.release(2)
    assert health.check_readiness()[0]  # nothing pending: not stalled however long


async def test_a_partition_paused_by_a_rate_of_zero_is_not_stalled() -> None:
    """Records waiting behind a processing rate of 0 are the operator's choice."""
    clock = Clock()
    paused = make(_noop, rate=0)
    sub = subscription()
    running(sub, clock, paused)
    health = HealthCheck(sub, HealthConfig(stall_timeout_ms=1000), clock=clock)
    paused.feed(records([b"a"]))
    assert paused.pending == 1
    health.check_readiness()
    clock.now += 10
    sub.last_fetch_at = clock.now
    assert health.check_readiness()[0]


async def test_probes_over_http_answer_from_the_event_loop() -> None:
    """/healthz and /readyz answer with JSON and 200 or 503 through the metrics port;
    other paths still serve the metrics; a loop that does not answer fails both."""
    clock = Clock()
    sub = subscription()
    health = HealthCheck(sub, HealthConfig(answer_timeout_ms=300), clock=clock)
    metrics = Metrics(process_metrics=False)
    port = metrics.start_http_server(0, probes=health)

    def get(path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    try:
        status, body = await asyncio.to_thread(get, "/healthz")
        assert (status, json.loads(body)) == (200, {"status": "alive"})
        status, body = await asyncio.to_thread(get, "/readyz")
        assert status == 503
        assert json.loads(body)["state"] == "initializing"
        running(sub, clock, make(_noop))
        status, body = await asyncio.to_thread(get, "/readyz")
        assert (status, json.loads(body)["status"]) == (200, "ready")
        status, body = await asyncio.to_thread(get, "/metrics")
        assert status == 200
        assert b"# TYPE decaton_tasks_processed_total counter" in body
        # The loop blocked (by the probe's own thread waiting here): no answer.
        result: list[tuple[int, bytes]] = []
        thread = threading.Thread(target=lambda: result.append(get("/healthz")))
        thread.start()
        thread.join()  # blocks the event loop, as a processor that never yields would
        ((status, body),) = result
        assert status == 503
        assert json.loads(body)["status"] == "blocked"
    finally:
        metrics.stop()


def test_endpoint_without_probes_and_failing_checks() -> None:
    """Without probes the probe paths are 404; a check that raises is a failed probe."""

    class Broken:
        def liveness(self) -> Any:
            raise RuntimeError("oops")

        readiness = liveness

    for probes, expected in ((None, 404), (Broken(), 503)):
        metrics = Metrics(process_metrics=False)
        port = metrics.start_http_server(0, probes=probes)
        try:
            with pytest.raises(urllib.error.HTTPError) as caught:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5)
            assert caught.value.code == expected
            assert "reason" in json.loads(caught.value.read())
        finally:
            metrics.stop()


@pytest.mark.parametrize("field", ["stall_timeout_ms", "fetch_timeout_ms", "answer_timeout_ms"])
def test_thresholds_must_be_positive(field: str) -> None:
    """A threshold below 1 ms is a config error naming the field."""
    with pytest.raises(ConfigError, match=field):
        HealthConfig(**{field: 0})
