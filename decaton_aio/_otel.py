"""OpenTelemetry glue: trace context in Kafka record headers, and span attributes.

Imported only when tracing is on (it needs the ``tracing`` extra). Record headers are
``(name, bytes)`` pairs; the propagator reads and writes text, UTF-8 encoded.
"""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.context import Context
from opentelemetry.propagators.textmap import Getter, Setter, TextMapPropagator

__all__ = [
    "HeaderGetter",
    "HeaderSetter",
    "extract_context",
    "inject_context",
    "messaging_attributes",
]

Headers = list[tuple[str, bytes]]


class HeaderGetter(Getter[Sequence[tuple[str, bytes]]]):
    """Reads propagation fields from record headers (the last header of a name wins)."""

    def get(self, carrier: Sequence[tuple[str, bytes]], key: str) -> list[str] | None:
        found = None
        for name, value in carrier:
            if name == key and value is not None:
                found = value
        if found is None:
            return None
        return [found.decode(errors="replace")]

    def keys(self, carrier: Sequence[tuple[str, bytes]]) -> list[str]:
        return [name for name, _ in carrier]


class HeaderSetter(Setter[Headers]):
    """Writes propagation fields as record headers, replacing any of the same name."""

    def set(self, carrier: Headers, key: str, value: str) -> None:
        carrier[:] = [(name, v) for name, v in carrier if name != key]
        carrier.append((key, value.encode()))


_GETTER = HeaderGetter()
_SETTER = HeaderSetter()


def extract_context(propagator: TextMapPropagator, headers: Sequence[tuple[str, bytes]]) -> Context:
    """The trace context (and baggage) the record headers carry; empty without any."""
    return propagator.extract(headers, getter=_GETTER)


def inject_context(
    propagator: TextMapPropagator, headers: Sequence[tuple[str, bytes]], context: Context
) -> Headers:
    """``headers`` with the propagator's fields replaced by those of ``context``."""
    out = [(name, value) for name, value in headers if name not in propagator.fields]
    propagator.inject(out, context=context, setter=_SETTER)
    return out


def messaging_attributes(
    topic: str, partition: int | None, key: bytes | None
) -> dict[str, str | int]:
    """OpenTelemetry's messaging attributes of a Kafka record."""
    attributes: dict[str, str | int] = {
        "messaging.system": "kafka",
        "messaging.destination.name": topic,
    }
    if partition is not None:
        attributes["messaging.destination.partition.id"] = str(partition)
    if key is not None:
        attributes["messaging.kafka.message.key"] = key.decode(errors="replace")
    return attributes
