"""The executor with OpenTelemetry spans: one per task, from start to completion.

`TracedTaskExecutor` is what a subscription uses when its application has
``tracing`` set; otherwise the plain `TaskExecutor`
runs and none of this code is on the hot path.

Each started task gets a `_TracedHost` in place of its partition: the executor
reports the task's outcome through it as usual, and the host forwards every call to the
partition and ends the span when the task completes (finish, or the completion of a
released task) or is run again (an in-place retry ends its attempt's span). The
executor's outcome hook names how it ended. The span is the current span while the
processor runs (the coroutine starts in a copy of the current context, which holds it).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from aiokafka import TopicPartition
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context

from decaton_aio._otel import extract_context, inject_context, messaging_attributes
from decaton_aio.consumer._contract import OutputSink, TaskHost
from decaton_aio.consumer._execution import TaskExecutor
from decaton_aio.errors import DecodeError
from decaton_aio.metadata import scheduled_time_of
from decaton_aio.metrics import PartitionStats
from decaton_aio.state import LocalCopy
from decaton_aio.tracing import OUTCOME_ATTRIBUTE, Tracing
from decaton_aio.typing import Record

__all__ = ["TracedTaskExecutor"]


class _TracedHost:
    """One task's view of its partition: forwards everything, ends the task's span."""

    __slots__ = ("_partition", "outcome", "parent", "span", "stats", "tp")

    def __init__(self, partition: TaskHost, span: trace.Span, parent: Context) -> None:
        self._partition = partition
        self.tp: TopicPartition = partition.tp
        self.stats: PartitionStats = partition.stats
        self.span = span
        self.parent = parent
        self.outcome = "ok"

    @property
    def closed(self) -> bool:
        return self._partition.closed

    @property
    def outputs(self) -> OutputSink | None:
        return self._partition.outputs

    @property
    def store(self) -> LocalCopy | None:
        return self._partition.store

    @property
    def store_type(self) -> Any:
        return self._partition.store_type

    def end(self) -> None:
        span = self.span
        if span.is_recording():
            span.set_attribute(OUTCOME_ATTRIBUTE, self.outcome)
            span.end()

    def finish(self, record: Record) -> None:
        self._partition.finish(record)
        self.end()

    def release(self, record: Record) -> None:
        self._partition.release(record)

    def hand_off(self, record: Record) -> None:
        self._partition.hand_off(record)

    def finish_released(self, record: Record) -> None:
        self._partition.finish_released(record)
        self.end()

    def postpone(self, record: Record, delay_s: float) -> None:
        self._partition.postpone(record, delay_s)
        self.end()

    def run_again(self, record: Record, attempt: int, delay_s: float) -> None:
        self._partition.run_again(record, attempt, delay_s)
        self.end()


class TracedTaskExecutor(TaskExecutor):
    """A `TaskExecutor` that traces each task (arguments as the base, plus
    ``tracing``)."""

    def __init__(self, *, tracing: Tracing, group_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._tracer = tracing.tracer()
        self._propagator = tracing.textmap()
        self._group_id = group_id

    def start(self, partition: TaskHost, record: Record, attempt: int) -> None:
        """Start the task inside its span (none for a scheduled task not due yet: it is
        postponed, and traced when it runs)."""
        headers = record.headers
        try:
            scheduled = scheduled_time_of(headers)
        except DecodeError:
            scheduled = 0  # a poison pill: traced, it is dead-lettered
        if scheduled and scheduled > time.time() * 1000:
            super().start(partition, record, attempt)
            return
        parent = extract_context(self._propagator, headers)
        tp = partition.tp
        attributes: dict[str, Any] = messaging_attributes(tp.topic, tp.partition, record.key)
        attributes["messaging.operation.type"] = "process"
        attributes["messaging.kafka.offset"] = record.offset
        attributes["decaton.attempt"] = attempt
        if self._group_id is not None:
            attributes["messaging.consumer.group.name"] = self._group_id
        span = self._tracer.start_span(
            f"{tp.topic} process",
            context=parent,
            kind=trace.SpanKind.CONSUMER,
            attributes=attributes,
        )
        host = _TracedHost(partition, span, parent)
        token = otel_context.attach(trace.set_span_in_context(span, parent))
        try:
            super().start(host, record, attempt)
        finally:
            otel_context.detach(token)

    def _outcome(self, partition: TaskHost, outcome: str, exc: BaseException | None = None) -> None:
        if not isinstance(partition, _TracedHost):
            return
        partition.outcome = outcome
        if exc is not None:
            span = partition.span
            span.record_exception(exc)
            span.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))

    def _send_then_finish(
        self,
        partition: TaskHost,
        record: Record,
        topic: str,
        headers: Sequence[tuple[str, bytes]],
        what: str,
        *,
        timestamp_ms: int | None = None,
        started_at: float | None = None,
    ) -> None:
        # A retry or dead letter record carries the task span's context: the next attempt
        # continues the trace as a child of this one.
        if isinstance(partition, _TracedHost):
            context = trace.set_span_in_context(partition.span, partition.parent)
            headers = inject_context(self._propagator, headers, context)
        super()._send_then_finish(
            partition,
            record,
            topic,
            headers,
            what,
            timestamp_ms=timestamp_ms,
            started_at=started_at,
        )
