"""Delivering a finished task's outputs (``ctx.produce``), then completing its offset.

A task that produced outputs is released when it succeeds; `deliver_outputs()` hands
its records to the partition's `OutputSink` and the sink completes the offset once
they are safe:

- `DurableOutputs` (the default, at-least-once): the records are sent through the
  subscription's durable sender and the offset completes once all are acknowledged (or
  spooled). A crash in between produces them again on redelivery.
- with exactly-once, the subscription's ``Transaction``: the records join the open
  transaction and the offset completes in the same step, so the next commit covers both.

A delivery that fails is tried again with backoff until it works or the partition is
closed (then the record is redelivered to the partition's next owner).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import structlog

from decaton_aio.backoff import send_retry_delay
from decaton_aio.consumer._contract import OutputSink, TaskHost
from decaton_aio.context import OutputRecord
from decaton_aio.typing import Record, RecordSender

__all__ = ["DurableOutputs", "OutputSink", "deliver_outputs"]

log = structlog.get_logger("decaton_aio.consumer")


class DurableOutputs:
    """At-least-once outputs through a durable sender."""

    def __init__(self, sender: RecordSender) -> None:
        self._sender = sender

    async def deliver(
        self, partition: TaskHost, record: Record, outputs: Sequence[OutputRecord]
    ) -> None:
        for out in outputs:  # in order, each durable before the next
            await self._sender.send(out.topic, out.value, key=out.key, headers=out.headers)
        partition.finish_released(record)


async def deliver_outputs(
    sink: OutputSink, partition: TaskHost, record: Record, outputs: Sequence[OutputRecord]
) -> None:
    """Deliver a released task's outputs with ``sink``, trying again with backoff while
    the partition is open. Never raises (a closed partition gives up: its next owner, or
    its rewound self, processes the record again)."""
    attempt = 0
    while not partition.closed:
        try:
            await sink.deliver(partition, record, outputs)
            if not partition.closed:
                return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            attempt += 1
            delay = send_retry_delay(attempt)
            log.error(
                "cannot deliver a task's outputs; the task stays pending",
                origin=f"{partition.tp.topic}-{partition.tp.partition}@{record.offset}",
                outputs=len(outputs),
                error=repr(exc),
                retry_in_s=round(delay, 3),
            )
            await asyncio.sleep(delay)
    # The partition closed first: nothing to complete (the record comes again), but what
    # the task opened ends (a traced task's span).
    partition.finish_released(record)
