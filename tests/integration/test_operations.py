"""Production operations on a real broker: probes, tracing, lifespan hooks, consumer
settings, and the metrics a dashboard reads."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
import uuid
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from decaton_aio import (
    Application,
    ConsumerConfig,
    JsonSerializer,
    ProcessingContext,
    RetryConfig,
    RetryPolicy,
    TaskProducer,
)
from decaton_aio._aiokafka import (
    client_of,
    connections_of,
    fetch_pacing,
)
from decaton_aio.consumer import HealthCheck, HealthConfig, RunOptions, run_application
from decaton_aio.consumer import _subscription as subscription_module
from decaton_aio.testing import TEST_CONSUMER_SETTINGS, BrokerHandle, wait_until
from decaton_aio.tracing import OUTCOME_ATTRIBUTE, Tracing

pytestmark = pytest.mark.integration


async def http_get(url: str) -> tuple[int, bytes]:
    """GET from a thread (the endpoint asks the event loop, which must stay free)."""

    def get() -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    return await asyncio.to_thread(get)


async def eventually(check: Any, what: str, timeout_s: float = 30.0) -> Any:
    """Await ``check()`` every 100 ms until it returns something true; return that."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not (result := await check()):
        if loop.time() > deadline:
            raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.1)
    return result


async def probe(port: int, path: str) -> tuple[int, dict[str, Any]]:
    status, body = await http_get(f"http://127.0.0.1:{port}{path}")
    return status, json.loads(body)


async def test_readiness_follows_the_subscription_and_fails_on_a_stuck_processor(
    kafka_broker: BrokerHandle, topic_factory: Any, task_producer: Any
) -> None:
    """/healthz answers while the loop runs. /readyz is 503 before the start, 200 once the
    subscription runs, is assigned and fetches, 503 naming the partition while a task at
    its head does not finish for longer than the stall timeout, 200 again once it does,
    and 503 after the stop. The metrics on the same port show the state and fetches."""
    topic = await topic_factory(partitions=1)
    producer = await task_producer(topic)
    await producer.put("a", b"fine")  # the topic is known to the cluster before the start
    release = asyncio.Event()
    stuck = asyncio.Event()

    async def process(ctx: ProcessingContext, task: bytes) -> None:
        if task == b"stuck":
            stuck.set()
            await release.wait()

    app = Application(process, topics=(topic,), group_id="probes")
    sub = kafka_broker.subscription(app)
    health = HealthCheck(sub, HealthConfig(stall_timeout_ms=1000))
    port = sub.metrics.start_http_server(0, probes=health)
    try:
        assert (await probe(port, "/healthz"))[0] == 200
        status, body = await probe(port, "/readyz")
        assert status == 503
        assert body["state"] == "initializing"
        async with sub:

            async def ready() -> bool:
                return (await probe(port, "/readyz"))[0] == 200

            await eventually(ready, "ready", timeout_s=60)
            await producer.put("b", b"stuck")
            await stuck.wait()

            async def stalled() -> dict[str, Any] | None:
                status, body = await probe(port, "/readyz")
                return body if status == 503 and "stalled" in body else None

            body = await eventually(stalled, "a stalled partition")
            assert body["state"] == "running"
            (entry,) = body["stalled"]
            assert (entry["topic"], entry["partition"], entry["pending"]) == (topic, 0, 1)
            assert entry["stalled_s"] >= 1.0
            assert (await probe(port, "/healthz"))[0] == 200  # alive, only not ready
            release.set()
            await eventually(ready, "ready again")
            _, text = await http_get(f"http://127.0.0.1:{port}/metrics")
            families = {f.name: f for f in text_string_to_metric_families(text.decode())}
            states = {
                s.labels["state"]: s.value for s in families["decaton_subscription_state"].samples
            }
            assert states["running"] == 1
            assert sum(states.values()) == 1
            fetches = [
                s.value
                for s in families["decaton_consumer_fetch_latency_seconds"].samples
                if s.name.endswith("_count")
            ]
            assert fetches[0] > 0
        status, body = await probe(port, "/readyz")
        assert status == 503
        assert body["state"] == "terminated"
    finally:
        sub.metrics.stop()


async def test_a_producer_trace_continues_through_processing_and_retries(
    kafka_broker: BrokerHandle, topic_factory: Any
) -> None:
    """A task put inside a span is processed in a span of the same trace (a child of the
    producer's publish span); its retry, read back from the retry topic, is processed in
    a child of the failed attempt's span."""
    topic = await topic_factory(partitions=1)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = Tracing(tracer_provider=provider)
    attempts = 0

    async def process(ctx: ProcessingContext, task: dict[str, Any]) -> None:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            ctx.retry(0.0)

    serializer: JsonSerializer[Any] = JsonSerializer(Any)
    config = kafka_broker.producer_config(application_id="traced")
    async with TaskProducer(config, topic, serializer, tracing=tracing) as producer:
        with provider.get_tracer("test").start_as_current_span("request") as request:
            await producer.put("user-1", {"n": 1})
    app = Application(
        process,
        topics=(topic,),
        group_id="traced",
        serializer=serializer,
        retry=RetryConfig(RetryPolicy(max_attempts=3, backoff_base_ms=10, jitter=0)),
        tracing=tracing,
    )
    async with kafka_broker.subscription(app):

        def processed() -> list[Any]:
            spans = exporter.get_finished_spans()
            return [s for s in spans if s.name.endswith(" process")]

        await wait_until(lambda: len(processed()) == 2, what="two attempts", timeout_s=60)
    trace_id = request.get_span_context().trace_id
    (publish,) = [s for s in exporter.get_finished_spans() if s.name == f"{topic} publish"]
    first, second = sorted(processed(), key=lambda s: s.start_time or 0)
    assert publish.kind is trace.SpanKind.PRODUCER
    assert {publish.context.trace_id, first.context.trace_id, second.context.trace_id} == {trace_id}
    assert publish.parent is not None
    assert publish.parent.span_id == request.get_span_context().span_id
    assert first.parent is not None
    assert first.parent.span_id == publish.context.span_id
    assert second.parent is not None
    assert second.parent.span_id == first.context.span_id
    assert first.name == f"{topic} process"
    assert second.name == f"{topic}-retry process"
    assert (first.attributes or {})[OUTCOME_ATTRIBUTE] == "retry"
    assert (second.attributes or {})[OUTCOME_ATTRIBUTE] == "ok"


async def test_lifespan_hooks_run_once_around_consuming(
    kafka_broker: BrokerHandle, topic_factory: Any, task_producer: Any
) -> None:
    """run awaits the startup hooks before the first task and the shutdown hooks after
    the last in-flight task finished, once each."""
    topic = await topic_factory(partitions=2)
    producer = await task_producer(topic)
    for i in range(20):
        await producer.put(f"k{i}", b"x")
    events: list[str] = []

    async def open_pool() -> None:
        await asyncio.sleep(0.05)
        events.append("startup")

    async def close_pool() -> None:
        events.append("shutdown")

    async def process(ctx: ProcessingContext, task: bytes) -> None:
        events.append("task")
        await asyncio.sleep(0.2)
        events.append("task done")

    app = Application(
        process,
        topics=(topic,),
        group_id=f"lifespan-{uuid.uuid4().hex[:8]}",
        on_startup=open_pool,
        on_shutdown=[close_pool],
    )
    consumer = ConsumerConfig(kafka_broker.bootstrap_servers, app.group, **TEST_CONSUMER_SETTINGS)
    options = RunOptions(consumer, producer=kafka_broker.producer_config())

    async def on_started(sub: Any) -> None:
        async def stop_after_some() -> None:
            await wait_until(lambda: events.count("task") >= 3, what="tasks", timeout_s=60)
            await sub.stop()

        _ = asyncio.get_running_loop().create_task(stop_after_some())

    await asyncio.wait_for(
        run_application(app, options, on_started=on_started, install_signal_handlers=False), 90
    )
    assert events[0] == "startup"
    assert events[-1] == "shutdown"
    assert events.count("startup") == events.count("shutdown") == 1
    assert events.count("task") == events.count("task done")  # drained before shutdown


async def test_a_failing_startup_hook_stops_before_any_task(
    kafka_broker: BrokerHandle, topic_factory: Any, task_producer: Any
) -> None:
    """A startup hook that raises ends run with its error; no task runs and the shutdown
    hooks do not run."""
    topic = await topic_factory(partitions=1)
    await (await task_producer(topic)).put("k", b"x")
    ran: list[str] = []

    async def broken() -> None:
        raise ConnectionError("database unreachable")

    async def close() -> None:
        ran.append("shutdown")

    async def process(ctx: ProcessingContext, task: bytes) -> None:
        ran.append("task")

    app = Application(
        process, topics=(topic,), group_id="broken-start", on_startup=broken, on_shutdown=close
    )
    consumer = ConsumerConfig(kafka_broker.bootstrap_servers, app.group, **TEST_CONSUMER_SETTINGS)
    with pytest.raises(ConnectionError, match="database unreachable"):
        await run_application(
            app,
            RunOptions(consumer, producer=kafka_broker.producer_config()),
            install_signal_handlers=False,
        )
    assert ran == []


async def test_static_membership_and_fetch_settings_reach_the_broker(
    kafka_broker: BrokerHandle, topic_factory: Any, task_producer: Any
) -> None:
    """A subscription with a group instance id, client id and rack, and fetch and poll
    settings processes its tasks, and the broker lists the member under its instance id
    and client id (Apache Kafka; Tansu lists one member without them)."""
    topic = await topic_factory(partitions=2)
    producer = await task_producer(topic)
    for i in range(50):
        await producer.put(f"k{i}", b"x")
    done = 0

    async def process(ctx: ProcessingContext, task: bytes) -> None:
        nonlocal done
        done += 1

    group = f"static-{uuid.uuid4().hex[:8]}"
    app = Application(process, topics=(topic,), group_id=group)
    settings = dict(
        group_instance_id="pod-0",
        client_id="orders-service",
        client_rack="zone-a",
        fetch_min_bytes=1,
        fetch_max_bytes=1024 * 1024,
        fetch_max_wait_ms=50,
        max_poll_interval_ms=60_000,
        group_protocol="classic",  # described by DescribeGroups (the classic protocol's)
    )
    async with kafka_broker.subscription(app, group_id=group, **settings):
        await wait_until(lambda: done == 50, what="50 tasks", timeout_s=60)
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap_servers)
        await admin.start()
        try:
            (response,) = await admin.describe_consumer_groups([group])
        finally:
            await admin.close()
    (described,) = response.groups
    ((member_id, client_id, *_),) = described[5]  # (member id, client id, host, ...)
    if kafka_broker.flavor != "tansu":  # Tansu describes members with neither
        assert client_id == "orders-service"
        # A static member's id is its group instance id plus a suffix the broker adds.
        assert member_id.startswith("pod-0-")


@pytest.mark.parametrize("fetch_loop", ["own", "aiokafka"])
async def test_fetches_gather_while_records_flow_and_answer_at_once_when_idle(
    fetch_loop: str, kafka_broker: BrokerHandle, topic_factory: Any, task_producer: Any
) -> None:
    """While fetch calls return records, the fetch requests ask the broker to gather
    busy_fetch_min_bytes (or wait busy_fetch_max_wait_ms); once one returns nothing, they
    ask with fetch_min_bytes and fetch_max_wait_ms again; a burst after the quiet spell is
    processed whole, on each side of every switch. Both fetch loops: the runtime's own
    takes them as settings of its loop, aiokafka's consumer in its fetcher."""
    topic = await topic_factory(partitions=2)
    producer = await task_producer(topic)
    done = 0

    async def process(ctx: ProcessingContext, task: bytes) -> None:
        nonlocal done
        done += 1

    app = Application(process, topics=(topic,))
    settings = dict(
        fetch_min_bytes=1,
        fetch_max_wait_ms=50,
        busy_fetch_min_bytes=8192,
        busy_fetch_max_wait_ms=7,
        fetch_loop=fetch_loop,
    )
    async with kafka_broker.subscription(app, **settings) as subscription:
        consumer = subscription._consumer
        loop = subscription._loop_fetcher
        assert (loop is None) == (fetch_loop == "aiokafka")

        def asks() -> tuple[int, int] | None:
            return loop.fetcher.pacing if loop is not None else fetch_pacing(consumer)

        await wait_until(lambda: asks() == (1, 50), what="idle fetches", timeout_s=30)
        for burst in (1, 2):
            for i in range(2000):
                await producer.put(f"k{i}", b"x" * 100)
            await wait_until(lambda: asks() == (8192, 7), what="busy fetches", timeout_s=30)
            await wait_until(lambda n=2000 * burst: done == n, what="the burst", timeout_s=60)
            await wait_until(lambda: asks() == (1, 50), what="idle again", timeout_s=30)


async def test_a_stop_whose_group_coordination_hangs_ends_and_loses_nothing(
    kafka_broker: BrokerHandle,
    topic_factory: Any,
    task_producer: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The membership's stop (revoke, leave) can hang (a coordinator that does not
    answer). The subscription's stop still ends: after the leave timeout the membership's
    routine is cancelled (its connections closed) without leaving the group, and the
    consumer's connections are closed; the next member gets the partitions after the
    session timeout and processes every record not committed, the ones produced
    meanwhile too."""
    monkeypatch.setattr(subscription_module, "LEAVE_TIMEOUT_S", 1.0)
    topic = await topic_factory(partitions=2)
    group = f"hung-{uuid.uuid4().hex[:8]}"
    done: set[tuple[int, int]] = set()

    async def process(ctx: ProcessingContext, task: bytes) -> None:
        done.add((ctx.partition, ctx.offset))

    app = Application(process, topics=(topic,), properties={"decaton.commit.interval.ms": 100})
    producer = await task_producer(topic)
    for n in range(20):
        await producer.put(f"k{n}", b"task")
    first = kafka_broker.subscription(app, group)
    await first.start()
    await wait_until(lambda: len(done) == 20, what="the first 20 tasks")
    loop = first._loop_fetcher
    client = loop.client if loop is not None else client_of(first._consumer)
    membership: Any = first._membership
    hung = asyncio.Event()

    async def hang(*, leave: bool = True) -> None:
        hung.set()
        await asyncio.Event().wait()

    monkeypatch.setattr(membership, "stop", hang)
    async with asyncio.timeout(30):
        await first.stop()
    assert hung.is_set()
    assert membership.routine.done()
    assert not any(conn.connected() for conn in connections_of(client))
    for n in range(20, 30):
        await producer.put(f"k{n}", b"task")
    async with kafka_broker.subscription(app, group):
        await wait_until(lambda: len(done) == 30, what="every task", timeout_s=60)
