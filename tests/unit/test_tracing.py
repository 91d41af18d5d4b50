"""OpenTelemetry spans of tasks without a broker, read from the SDK's in-memory exporter."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from aiokafka import TopicPartition
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from decaton_aio import Application, ConsumerConfig, Subscription
from decaton_aio.backoff import RetryPolicy
from decaton_aio.consumer._execution import TaskExecutor
from decaton_aio.consumer._hotkeys import HotKeyDetector
from decaton_aio.consumer._partition import PartitionProcessor
from decaton_aio.consumer._tracing import TracedTaskExecutor
from decaton_aio.consumer.state import LocalStore
from decaton_aio.context import ProcessingContext
from decaton_aio.metrics import PartitionStats
from decaton_aio.properties import Properties
from decaton_aio.retry import RetryConfig
from decaton_aio.tracing import OUTCOME_ATTRIBUTE, Tracing
from tests.unit.test_execution import until
from tests.unit.test_partition import FakeRecord, FakeSender, settle

TP = TopicPartition("tasks", 3)
TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
PARENT_ID = 0xB7AD6B7169203331
TRACEPARENT = f"00-{TRACE_ID:032x}-{PARENT_ID:016x}-01".encode()
FAST = RetryPolicy(max_attempts=2, backoff_base_ms=10, backoff_max_ms=20, jitter=0)


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def tracing(exporter: InMemorySpanExporter) -> Tracing:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Tracing(tracer_provider=provider, propagator=TraceContextTextMapPropagator())


def traced(process: Any, tracing: Tracing, sender: FakeSender, **kw: Any) -> PartitionProcessor:
    executor = TracedTaskExecutor(
        tracing=tracing,
        group_id="g",
        subscription_id="test",
        process=process,
        decode=lambda value: value,
        sender=sender,
        properties=Properties(kw.pop("properties", {})),
        retry=kw.pop("retry", None),
    )
    return PartitionProcessor(
        TP,
        executor=executor,
        limit=100,
        max_pending=1000,
        stats=PartitionStats(),
        on_below_max_pending=lambda p: None,
        **kw,
    )


def task_spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == "tasks process"]


def traceparent(headers: list[tuple[str, bytes]]) -> tuple[int, int]:
    value = dict(headers)["traceparent"].decode()
    _, trace_id, span_id, _ = value.split("-")
    return int(trace_id, 16), int(span_id, 16)


async def test_a_task_span_continues_the_record_trace_and_is_current_in_the_processor(
    tracing: Tracing, exporter: InMemorySpanExporter
) -> None:
    """The task span is a child of the traceparent in the record headers, carries topic,
    partition, offset, key and outcome, and is the current span inside the processor."""
    inner = tracing.tracer()

    async def process(ctx: ProcessingContext, task: Any) -> None:
        with inner.start_as_current_span("db call"):
            pass

    proc = traced(process, tracing, FakeSender())
    proc.feed([FakeRecord(7, b"user-1", headers=[("traceparent", TRACEPARENT)])])
    assert proc.committable() == 8
    (span,) = task_spans(exporter)
    (child,) = [s for s in exporter.get_finished_spans() if s.name == "db call"]
    assert span.context.trace_id == TRACE_ID
    assert span.parent is not None
    assert span.parent.span_id == PARENT_ID
    assert span.kind is trace.SpanKind.CONSUMER
    attributes = dict(span.attributes or {})
    assert attributes["messaging.destination.name"] == "tasks"
    assert attributes["messaging.destination.partition.id"] == "3"
    assert attributes["messaging.kafka.offset"] == 7
    assert attributes["messaging.kafka.message.key"] == "user-1"
    assert attributes[OUTCOME_ATTRIBUTE] == "ok"
    assert child.parent is not None
    assert child.parent.span_id == span.context.span_id
    assert trace.get_current_span() is trace.INVALID_SPAN  # detached after the start


async def test_a_record_without_trace_context_starts_a_new_trace(
    tracing: Tracing, exporter: InMemorySpanExporter
) -> None:
    """Without a traceparent header the task span is a root span."""

    async def process(ctx: ProcessingContext, task: Any) -> None:
        return None

    proc = traced(process, tracing, FakeSender())
    proc.feed([FakeRecord(0, b"k"), FakeRecord(1, b"k")])
    spans = task_spans(exporter)
    assert [s.attributes["messaging.kafka.offset"] for s in spans] == [0, 1]  # type: ignore[index]
    assert all(s.parent is None for s in spans)
    assert spans[0].context.trace_id != spans[1].context.trace_id


async def test_a_traced_task_reads_its_partition_state(
    tracing: Tracing, exporter: InMemorySpanExporter
) -> None:
    """The traced host forwards the partition's state store and value type: ctx.state reads
    the key's value, decoded as the store's type."""
    store = LocalStore(None)
    store.replay(b"user-1", msgspec.msgpack.encode(41), 0)
    seen: list[Any] = []

    async def process(ctx: ProcessingContext, task: Any) -> None:
        seen.append(ctx.state.get())

    proc = traced(process, tracing, FakeSender())
    proc.store, proc.store_type = store, float
    proc.feed([FakeRecord(0, b"user-1")])
    assert proc.committable() == 1
    assert seen == [41.0]
    assert type(seen[0]) is float
    (span,) = task_spans(exporter)
    assert (span.attributes or {})[OUTCOME_ATTRIBUTE] == "ok"
    store.close()


async def test_a_deferred_task_span_ends_at_completion(
    tracing: Tracing, exporter: InMemorySpanExporter
) -> None:
    """A task completed later keeps its span open until the completion."""
    completions: list[Any] = []

    async def process(ctx: ProcessingContext, task: Any) -> None:
        completions.append(ctx.deferred())

    proc = traced(process, tracing, FakeSender())
    proc.feed([FakeRecord(0, b"k")])
    assert task_spans(exporter) == []
    completions[0].complete()
    (span,) = task_spans(exporter)
    assert span.attributes[OUTCOME_ATTRIBUTE] == "ok"  # type: ignore[index]
    assert proc.committable() == 1


async def test_retry_and_dead_letter_records_carry_the_task_span(
    tracing: Tracing, exporter: InMemorySpanExporter
) -> None:
    """A failed task's retry record carries the task span's context, so the next attempt
    is its child in the same trace; after the last attempt the dead letter record does
    the same, and the span records the error."""
    sender = FakeSender()

    async def process(ctx: ProcessingContext, task: Any) -> None:
        raise RuntimeError("boom")

    proc = traced(process, tracing, sender, retry=RetryConfig(FAST))
    proc.feed([FakeRecord(0, b"k", headers=[("traceparent", TRACEPARENT)])])
    await settle()
    (first,) = task_spans(exporter)
    assert first.attributes[OUTCOME_ATTRIBUTE] == "retry"  # type: ignore[index]
    assert first.status.status_code is trace.StatusCode.ERROR
    assert [e.name for e in first.events] == ["exception"]
    ((topic, _key, _value, headers),) = sender.sent
    assert topic == "tasks-retry"
    assert traceparent(headers) == (TRACE_ID, first.context.span_id)

    # The retry record comes back (as the subscription would consume it): attempt 2,
    # after its backoff (a scheduled task gets its span when it runs).
    proc.feed([FakeRecord(1, b"k", headers=headers)])
    await until(lambda: len(task_spans(exporter)) == 2 and proc.committable() == 2)
    second = task_spans(exporter)[1]
    assert second.parent is not None
    assert second.parent.span_id == first.context.span_id
    assert second.attributes[OUTCOME_ATTRIBUTE] == "dead_letter"  # type: ignore[index]
    dead = sender.sent[1]
    assert dead[0] == "tasks-dlq"
    assert traceparent(dead[3]) == (TRACE_ID, second.context.span_id)
    assert proc.committable() == 2


async def test_a_task_whose_retry_outlives_its_partition_ends_its_span(
    tracing: Tracing, exporter: InMemorySpanExporter
) -> None:
    """A failed task whose retry record the cluster does not take while its partition is
    revoked gives up with the partition (the next owner runs it again), and its span
    ends: it was never ended nor exported."""
    sender = FakeSender(failures=10**6)

    async def process(ctx: ProcessingContext, task: Any) -> None:
        raise RuntimeError("boom")

    proc = traced(process, tracing, sender, retry=RetryConfig(FAST))
    proc.feed([FakeRecord(0, b"k")])
    await settle()
    assert task_spans(exporter) == []  # the retry send keeps trying
    proc.close()
    await until(lambda: len(task_spans(exporter)) == 1)
    (span,) = task_spans(exporter)
    assert span.attributes[OUTCOME_ATTRIBUTE] == "retry"  # type: ignore[index]


async def test_skipped_and_timed_out_tasks_say_so(
    tracing: Tracing, exporter: InMemorySpanExporter
) -> None:
    """A skipped task and a deferred completion given up at its timeout end their spans
    with those outcomes."""
    from decaton_aio.backoff import SkipTask

    async def process(ctx: ProcessingContext, task: Any) -> None:
        if ctx.offset == 0:
            raise SkipTask("not mine")
        ctx.deferred()  # never completed

    proc = traced(
        process,
        tracing,
        FakeSender(),
        properties={"decaton.deferred.complete.timeout.ms": 10},
    )
    proc.feed([FakeRecord(0, b"a"), FakeRecord(1, b"b")])
    await proc.wait_idle(5.0)
    outcomes = {s.attributes["messaging.kafka.offset"]: s.attributes[OUTCOME_ATTRIBUTE]  # type: ignore[index]
                for s in task_spans(exporter)}  # fmt: skip
    assert outcomes == {0: "skipped", 1: "timeout"}
    assert proc.stats.timeouts == 1


async def test_shaping_records_keep_the_original_trace_context(
    tracing: Tracing, exporter: InMemorySpanExporter
) -> None:
    """A hot key's record goes to the shaping topic with its headers unchanged: the trace
    continues when the shaping topic is processed."""
    sender = FakeSender()

    async def process(ctx: ProcessingContext, task: Any) -> None:
        return None

    proc = traced(process, tracing, sender, hot_keys=HotKeyDetector(1, 1.0))
    headers = [("traceparent", TRACEPARENT)]
    proc.feed([FakeRecord(i, b"hot", headers=list(headers)) for i in range(10)])
    await settle()
    shaped = [s for s in sender.sent if s[0] == "tasks-shaping"]
    assert shaped
    assert all(traceparent(s[3]) == (TRACE_ID, PARENT_ID) for s in shaped)


def test_without_tracing_the_subscription_runs_the_plain_executor(tracing: Tracing) -> None:
    """No tracing configured: the executor is the plain one (no span code on the hot
    path); configured: the traced one."""

    async def process(ctx: ProcessingContext, task: Any) -> None:
        return None

    consumer = ConsumerConfig("localhost:9", "g")
    plain = Subscription(Application(process, topics=("t",), group_id="g"), consumer)
    assert type(plain._executor) is TaskExecutor
    app = Application(process, topics=("t",), group_id="g", tracing=tracing)
    assert type(Subscription(app, consumer)._executor) is TracedTaskExecutor
