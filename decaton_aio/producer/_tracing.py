"""The task producer's spans: ``<topic> publish`` per task, its context in the headers.

Imported only when a [`TaskProducer`][decaton_aio.TaskProducer] has ``tracing`` set.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from opentelemetry import trace

from decaton_aio._otel import inject_context, messaging_attributes
from decaton_aio.tracing import Tracing

__all__ = ["Publisher"]

Headers = list[tuple[str, bytes]]


class Publisher:
    """Opens the publish span of each task put on one topic."""

    def __init__(self, tracing: Tracing, topic: str) -> None:
        self._tracer = tracing.tracer()
        self._propagator = tracing.textmap()
        self._topic = topic

    @contextlib.contextmanager
    def span(self, key: bytes | None, partition: int | None, headers: Headers) -> Iterator[Headers]:
        """Open the task's span (a child of the current one) for the duration of the
        hand-over to the client; yields ``headers`` with its context added."""
        attributes = messaging_attributes(self._topic, partition, key)
        attributes["messaging.operation.type"] = "publish"
        with self._tracer.start_as_current_span(
            f"{self._topic} publish", kind=trace.SpanKind.PRODUCER, attributes=attributes
        ) as span:
            yield inject_context(self._propagator, headers, trace.set_span_in_context(span))
