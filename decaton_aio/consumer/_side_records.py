"""Sending the records that replace a task: retry, dead letter and shaping records.

The executor decides that a task goes to a side topic; `SideRecords` makes the
record durable, then finishes the task (``finish_released``), never before:

- at-least-once, through the durable sender: a failed send is tried again with backoff
  until it works or the partition is closed (the record is then redelivered to the new
  owner); a record the cluster can never take as it is (too large, too many headers) is
  replaced by an empty reference record in the dead letter topic that names its origin;
- with exactly-once, into the partition's transaction, with the task's completion: an
  aborted transaction takes it back, and the task's next run sends it again.

Caller: the executor, on the event loop that owns the consumer (one task per send).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from time import perf_counter

import structlog

from decaton_aio.backoff import send_retry_delay
from decaton_aio.consumer._contract import TaskHost
from decaton_aio.consumer.commit import deliver_outputs
from decaton_aio.context import OutputRecord
from decaton_aio.errors import RecordRejectedError
from decaton_aio.metadata import METADATA_HEADER
from decaton_aio.producer import oversized
from decaton_aio.retry import SideTopics, dead_letter_headers
from decaton_aio.typing import Record, RecordSender

__all__ = ["SideRecords"]

log = structlog.get_logger("decaton_aio.consumer")

#: Headers of a record that a reference to it keeps (small ones only: the record's own
#: size or header count may be why it could not be sent).
_REFERENCE_KEEPS = (
    METADATA_HEADER,
    "dt_origin_topic",
    "dt_origin_partition",
    "dt_origin_offset",
    "dt_first_failure_ms",
)
_REFERENCE_HEADER_MAX = 1024

# What a send to a side topic counts: (sent, failed attempts) attributes of PartitionStats.
_SEND_COUNTERS = {
    "retry": ("retry_queued", "retry_failed"),
    "dead letter": ("dead_letter_queued", "dead_letter_failed"),
    "shaping": ("shaping_queued", "shaping_failed"),
}


class SideRecords:
    """Sends side records for the partitions of one subscription.

    Args:
        sender: the durable sender; ``None`` when the application needs none (a record
            that would need one is logged and its task finished).
        topics: the side topics' names (a reference record goes to the dead letter topic).
    """

    def __init__(self, sender: RecordSender | None, topics: SideTopics) -> None:
        self._sender = sender
        self._topics = topics

    async def send(
        self,
        partition: TaskHost,
        record: Record,
        topic: str,
        headers: Sequence[tuple[str, bytes]],
        what: str,
        timestamp_ms: int | None,
        started_at: float | None,
    ) -> None:
        """Make one side record durable, then finish its task.

        The caller released (or handed off) the record. Retry and dead letter records are
        stamped with the time they are sent (``timestamp_ms`` ``None``), so time-based
        retention of their topic counts from the failure; the task's own time is in its
        ``dt_meta``. ``started_at``: when the task started processing (its completion
        duration ends when the record is durable); ``None`` for a record that never ran.
        """
        sender = self._sender
        queued, failed = _SEND_COUNTERS[what]
        if sender is None:
            log.error(f"no producer for the {what} record: completing the task", topic=topic)
            partition.finish_released(record)
            return
        value = record.value
        if record.key is None and value is None:
            value = b""  # the client sends nothing without a key or a value
        txn = partition.outputs
        if txn is not None:
            # Exactly-once: the record joins the partition's transaction with the task's
            # completion, so an aborted transaction takes it back and the task's next run
            # sends it again: read_committed readers see it once.
            key = record.key
            too_large = oversized(topic, key, value, list(headers))
            if too_large is not None:
                # The transaction's client would refuse it, attempt after attempt: the
                # dead letter topic gets a reference to it instead, as without a transaction.
                topic, headers = self._reference(partition, record, what, too_large)
                key, value = None, b""
                queued = _SEND_COUNTERS["dead letter"][0]
            out = OutputRecord(topic, value, key, list(headers))
            await deliver_outputs(txn, partition, record, [out])
            stats = partition.stats
            setattr(stats, queued, getattr(stats, queued) + 1)
            return

        key = record.key
        attempt = 0
        reference = False  # sending a reference to a record that cannot be sent as it is
        while not partition.closed:
            try:
                await sender.send(topic, value, key=key, headers=headers, timestamp_ms=timestamp_ms)
            except RecordRejectedError as exc:
                stats = partition.stats
                setattr(stats, failed, getattr(stats, failed) + 1)
                origin = f"{partition.tp.topic}-{partition.tp.partition}@{record.offset}"
                if reference:
                    # Not even the reference fits: the record stays at its origin only.
                    log.error(
                        f"cannot send a reference to the {what} record; the task completes "
                        "and the record stays only at its origin",
                        origin=origin,
                        error=repr(exc),
                    )
                    partition.finish_released(record)
                    return
                # The record as it is can never be sent (too large, too many headers):
                # the dead letter topic gets a reference to it instead, which names its
                # origin and why.
                topic, headers = self._reference(partition, record, what, exc)
                key, value, timestamp_ms, reference = None, b"", None, True
                queued, failed = _SEND_COUNTERS["dead letter"]
                continue
            except Exception as exc:
                attempt += 1
                stats = partition.stats
                setattr(stats, failed, getattr(stats, failed) + 1)
                delay = send_retry_delay(attempt)
                log.error(
                    f"cannot send the {what} record; the task stays pending",
                    topic=topic,
                    origin=f"{partition.tp.topic}-{partition.tp.partition}@{record.offset}",
                    error=repr(exc),
                    retry_in_s=round(delay, 3),
                )
                await asyncio.sleep(delay)
                continue
            stats = partition.stats
            setattr(stats, queued, getattr(stats, queued) + 1)
            if started_at is not None:
                stats.completion_duration.observe(perf_counter() - started_at)
            partition.finish_released(record)
            return
        # The partition closed first: nothing to complete (its next owner runs the task
        # again), but what the task opened ends (a traced task's span).
        partition.finish_released(record)

    def _reference(
        self, partition: TaskHost, record: Record, what: str, exc: RecordRejectedError
    ) -> tuple[str, Sequence[tuple[str, bytes]]]:
        """The topic and headers of the reference that goes to the dead letter topic for
        a side record that can never be sent as it is (logged)."""
        log.error(
            f"the {what} record can never be sent as it is; a reference to it goes to the "
            "dead letter topic",
            origin=f"{partition.tp.topic}-{partition.tp.partition}@{record.offset}",
            error=repr(exc),
        )
        topic = self._topics.dead_letter_topic(partition.tp.topic)
        return topic, _reference_headers(partition, record, what, exc)


def _reference_headers(
    partition: TaskHost, record: Record, what: str, exc: RecordRejectedError
) -> Sequence[tuple[str, bytes]]:
    # The dead letter headers of a record that cannot be sent as it is, on an empty
    # record: its origin (topic, partition, offset) says where to read it.
    kept = [
        (name, value)
        for name, value in record.headers
        if name in _REFERENCE_KEEPS and len(value) <= _REFERENCE_HEADER_MAX
    ]
    size = len(record.key or b"") + len(record.value or b"")
    return dead_letter_headers(
        kept,
        error_type="RecordRejected",
        message=f"the {what} record ({size} bytes of key and value, "
        f"{len(record.headers)} headers) can never be sent: {exc}; read it at its origin",
        exc=None,
        topic=partition.tp.topic,
        partition=partition.tp.partition,
        offset=record.offset,
        attempts=0,
        timestamp_ms=record.timestamp,
    )
