"""confluent-kafka (librdkafka) consumers: the C client polled from asyncio.

``Consumer.consume(num_messages=batch_records, timeout=0.1)`` runs in a thread (it
blocks), the batch runs on the event loop the ``keyed`` (ordered) or ``gather`` way of
:mod:`bench.contenders.plain`, then ``commit(asynchronous=True)`` commits the consumed
positions. Options: ``batch_records`` (default 500, up to 10,000), ``max_in_flight``.
A secured broker's settings reach librdkafka under its own names
(:func:`~bench.workload.librdkafka_security`).
"""

from __future__ import annotations

import asyncio
from typing import Any, NamedTuple

from bench.body import Body
from bench.contenders.plain import capped, run_batch
from bench.workload import RunSpec, librdkafka_security

__all__ = ["main"]


class _Record(NamedTuple):
    partition: int
    offset: int
    key: bytes
    value: bytes


async def main(spec: RunSpec, body: Body) -> None:
    from confluent_kafka import Consumer

    mode = spec.contender.removeprefix("confluent-")
    consumer = Consumer(
        {
            "bootstrap.servers": spec.bootstrap,
            "group.id": spec.group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": spec.session_timeout_ms,
            "heartbeat.interval.ms": max(100, spec.session_timeout_ms // 10),
            **librdkafka_security(spec.security),
        }
    )
    consumer.subscribe([spec.topic])
    loop = asyncio.get_running_loop()
    run = capped(body.run_raw, spec.options.get("max_in_flight"))
    batch = int(spec.options.get("batch_records", 500))
    while True:
        messages: list[Any] = await loop.run_in_executor(None, consumer.consume, batch, 0.1)
        records = [
            _Record(m.partition(), m.offset(), m.key(), m.value())
            for m in messages
            if m.error() is None
        ]
        if not records:
            continue
        await run_batch(mode, records, run)
        consumer.commit(asynchronous=True)
