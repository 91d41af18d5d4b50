"""OpenTelemetry tracing of tasks, an optional extra (``pip install decaton-aio[tracing]``).

[`Tracing`][decaton_aio.tracing.Tracing] turns it on for an application
(``Application(tracing=Tracing())``) or a task producer
(``TaskProducer(..., tracing=Tracing())``):

- the producer opens a ``<topic> publish`` span per task and writes its context into the
  record headers (W3C ``traceparent``, through the configured propagator), so the trace
  of the code that put the task continues into its processing;
- the runtime opens a ``<topic> process`` span per task, from the start of processing to
  its completion (a deferred completion, or the retry or dead letter record being durable,
  included), a child of the context in the record headers, with the topic, partition,
  offset, key, attempt and the outcome (``decaton.outcome``: ``ok``, ``error``,
  ``retry``, ``dead_letter``, ``skipped``, ``cancelled``, ``timeout``). The span is the
  current one while the processor runs, so spans the processor opens are its children;
- retry and dead letter records carry the task span's context, so the next attempt (and
  whoever reads the dead letter) continues the same trace; shaping records carry the
  original headers unchanged.

Without it (the default) none of this code runs: the runtime's hot path is the same as
without the extra installed. This module imports nothing from OpenTelemetry until a
[`Tracing`][decaton_aio.tracing.Tracing] is used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from decaton_aio.errors import ConfigError

if TYPE_CHECKING:
    from opentelemetry.propagators.textmap import TextMapPropagator
    from opentelemetry.trace import Tracer

__all__ = ["OUTCOME_ATTRIBUTE", "Tracing", "require_opentelemetry"]

#: The span attribute holding how a task ended.
OUTCOME_ATTRIBUTE = "decaton.outcome"

_INSTRUMENTATION = "decaton_aio"


@dataclass(frozen=True)
class Tracing:
    """Where spans go and how their context travels in record headers.

    Attributes:
        tracer_provider: an ``opentelemetry.trace.TracerProvider``; the global one (set by
            ``opentelemetry-instrument`` or ``trace.set_tracer_provider``) when ``None``.
        propagator: an ``opentelemetry.propagators.textmap.TextMapPropagator``; the
            global one (W3C trace context and baggage by default) when ``None``.
    """

    tracer_provider: Any = None
    propagator: Any = None

    def tracer(self) -> Tracer:
        """The tracer spans are made with.

        Raises:
            ConfigError: OpenTelemetry is not installed.
        """
        trace = _import("opentelemetry.trace")
        from decaton_aio._version import __version__

        return trace.get_tracer(  # type: ignore[no-any-return]
            _INSTRUMENTATION, __version__, tracer_provider=self.tracer_provider
        )

    def textmap(self) -> TextMapPropagator:
        """The propagator trace context is written and read with.

        Raises:
            ConfigError: OpenTelemetry is not installed.
        """
        if self.propagator is not None:
            return self.propagator  # type: ignore[no-any-return]
        propagate = _import("opentelemetry.propagate")
        return propagate.get_global_textmap()  # type: ignore[no-any-return]


def require_opentelemetry() -> None:
    """Check that the OpenTelemetry API is installed.

    Raises:
        ConfigError: it is not; the message says what to install.
    """
    _import("opentelemetry.trace")


def _import(name: str) -> Any:
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ConfigError(
            "tracing needs OpenTelemetry: pip install 'decaton-aio[tracing]' "
            "(and an SDK with an exporter to see the spans)"
        ) from exc
