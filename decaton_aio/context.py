"""The processing context: what a processor knows about the task it is running.

One :class:`ProcessingContext` is made per task and handed to ``process(ctx, task)``. It
carries the record's coordinates, the task metadata and a structlog logger bound with
topic, partition, offset, key and subscription id (Decaton's MDC), built only when used.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import structlog

from decaton_aio.metadata import TaskMetadata, metadata_from_headers

if TYPE_CHECKING:
    from aiokafka import ConsumerRecord

__all__ = ["ProcessingContext"]


class ProcessingContext:
    """The record behind a task, and the tools a processor uses while running it.

    Attributes:
        subscription_id: the subscription processing the task.
        record: the Kafka record the task came from.
    """

    __slots__ = ("_logger", "_metadata", "record", "started_at", "subscription_id")

    def __init__(self, subscription_id: str, record: ConsumerRecord[Any, Any]) -> None:
        self.subscription_id = subscription_id
        self.record = record
        self.started_at = 0.0
        self._metadata: TaskMetadata | None = None
        self._logger: structlog.typing.FilteringBoundLogger | None = None

    @property
    def key(self) -> bytes | None:
        """The record key (``None`` for a record without one)."""
        key: bytes | None = self.record.key
        return key

    @property
    def topic(self) -> str:
        """The topic the task came from."""
        topic: str = self.record.topic
        return topic

    @property
    def partition(self) -> int:
        """The partition the task came from."""
        partition: int = self.record.partition
        return partition

    @property
    def offset(self) -> int:
        """The record's offset in its partition."""
        offset: int = self.record.offset
        return offset

    @property
    def headers(self) -> Sequence[tuple[str, bytes]]:
        """The record headers, ``dt_meta`` included."""
        headers: Sequence[tuple[str, bytes]] = self.record.headers
        return headers

    @property
    def metadata(self) -> TaskMetadata:
        """The task metadata from ``dt_meta``, or from the record timestamp without it.

        Raises:
            DecodeError: when the ``dt_meta`` header is malformed.
        """
        if self._metadata is None:
            self._metadata = metadata_from_headers(self.record.headers, self.record.timestamp)
        return self._metadata

    @property
    def logger(self) -> structlog.typing.FilteringBoundLogger:
        """A structlog logger bound with topic, partition, offset, key and subscription."""
        if self._logger is None:
            key = self.record.key
            self._logger = structlog.get_logger("decaton_aio.task").bind(
                subscription=self.subscription_id,
                topic=self.record.topic,
                partition=self.record.partition,
                offset=self.record.offset,
                key=key.decode(errors="replace") if key is not None else None,
            )
        return self._logger

    def __repr__(self) -> str:
        return (
            f"ProcessingContext({self.subscription_id!r}, {self.record.topic}-"
            f"{self.record.partition}@{self.record.offset}, key={self.record.key!r})"
        )
