"""The task producer: puts tasks on a topic with Decaton's ``dt_meta`` header.

Each task is serialized by the producer's serializer, and its metadata (timestamp, source
application and instance, retry count, scheduled time) travels in the ``dt_meta`` header,
so Decaton consumers on the JVM read the same records. Puts from many coroutines are in
flight together and are batched by the client: a put waits for its own acknowledgement
(``acks=all``), not for the ones before it.

Records go through a [`DurableSender`][decaton_aio.DurableSender]. With
``ProducerConfig.spool_dir`` set, a task the cluster does not take (after the client's own
retries, or with no broker reachable at all) is appended to a local spool and replayed
later: its put returns a [`RecordLocation`][decaton_aio.RecordLocation] with
    ``spooled=True`` instead of raising.
Without a spool, such a put raises [`ProducerError`][decaton_aio.errors.ProducerError].

With ``tracing`` set, each task gets a ``<topic> publish`` span (a child of the caller's
current span) whose context travels in the record headers (W3C ``traceparent``), so its
processing continues the trace (see `decaton_aio.tracing`).
"""

from __future__ import annotations

import asyncio
import time
from types import TracebackType
from typing import Any, Generic, TypeVar

from decaton_aio.errors import ConfigError, ProducerError
from decaton_aio.metadata import METADATA_HEADER, TaskMetadata, encode_metadata
from decaton_aio.producer._config import ProducerConfig
from decaton_aio.producer._inflight import RecordLocation
from decaton_aio.producer._sender import DurableSender
from decaton_aio.tracing import Tracing
from decaton_aio.typing import Serializer

__all__ = ["TaskProducer"]

T = TypeVar("T")


def _key_bytes(key: str | bytes | None) -> bytes | None:
    if key is None or isinstance(key, bytes):
        return key
    if isinstance(key, str):
        return key.encode()
    raise TypeError(f"a task key must be str, bytes or None, not {type(key).__name__}")


class TaskProducer(Generic[T]):
    """Puts tasks of one type on one topic.

    ```python
    async with TaskProducer(ProducerConfig("localhost:9092"), "orders", serializer) as p:
        where = await p.put("user-1", Order(...))
    ```

    Args:
        config: connection and batching settings; ``spool_dir`` makes it durable.
        topic: the task topic.
        serializer: turns a task into the record value.
        sender: a started sender to share (e.g. with the runtime's retry path); the
            producer then neither starts nor stops it, and ``config`` only supplies the
            metadata (application and instance id). By default the producer owns one
            built from ``config``.
        tracing: write each task's trace context into its headers (needs the
            ``tracing`` extra); ``None`` (the default): no tracing code runs.
    """

    def __init__(
        self,
        config: ProducerConfig,
        topic: str,
        serializer: Serializer[T],
        *,
        sender: DurableSender | None = None,
        tracing: Tracing | None = None,
    ) -> None:
        if not topic:
            raise ConfigError("topic is empty: name the task topic")
        self._publish: Any = None
        if tracing is not None:
            from decaton_aio.tracing import require_opentelemetry

            require_opentelemetry()
            from decaton_aio.producer._tracing import Publisher

            self._publish = Publisher(tracing, topic)
        self.config = config
        self.topic = topic
        self._serializer = serializer
        self._shared = sender
        self._sender: DurableSender | None = sender

    @property
    def sender(self) -> DurableSender | None:
        """The sender records go through (``None`` before
        [`start()`][decaton_aio.TaskProducer.start])."""
        return self._sender

    async def start(self) -> None:
        """Connect to the cluster (and open the spool, when configured).

        Raises:
            ProducerError: when the cluster refuses the producer (a refused idempotent
                producer says how to turn idempotence off), or, without a spool, when it
                cannot be reached; with a spool an unreachable cluster is not an error.
        """
        if self._sender is not None:
            return
        sender = DurableSender(self.config)
        await sender.start()
        self._sender = sender

    async def stop(self) -> None:
        """Deliver (or spool) what is in flight, then disconnect."""
        sender, self._sender = self._sender, self._shared
        if sender is not None and sender is not self._shared:
            await sender.stop()

    async def __aenter__(self) -> TaskProducer[T]:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def submit(
        self,
        key: str | bytes | None,
        task: T,
        *,
        timestamp_ms: int | None = None,
        scheduled_time_ms: int | None = None,
        partition: int | None = None,
    ) -> asyncio.Future[RecordLocation]:
        """Hand a task to the client and return a future of where it lands.

        Awaiting this call only waits for buffer space; awaiting the returned future
        waits for the broker's acknowledgement (or the spool's fsync). Use it to keep
        many tasks in flight from one coroutine.

        Args:
            key: the task key (str is UTF-8 encoded); tasks of one key keep their order.
            task: the task, encoded by the producer's serializer.
            timestamp_ms: the record and metadata timestamp; now when omitted.
            scheduled_time_ms: do not process before this time (0 or None: at once).
            partition: an explicit partition; the key's partition when omitted.

        Returns:
            A future resolving to the task's [`RecordLocation`][decaton_aio.RecordLocation]
            (``spooled=True`` when it was spooled).

        Raises:
            ProducerError: when the producer is not started or the client refuses it.
        """
        return await self._send(key, task, timestamp_ms, scheduled_time_ms, partition)

    async def put(
        self,
        key: str | bytes | None,
        task: T,
        *,
        timestamp_ms: int | None = None,
        scheduled_time_ms: int | None = None,
        partition: int | None = None,
    ) -> RecordLocation:
        """Put a task and wait until it is durable.

        Durable means acknowledged by the broker (``acks=all``); with a spool, also
        appended to the spool and fsynced when the broker cannot take it. Concurrent
        puts are batched together by the client. Arguments as
        [`submit()`][decaton_aio.TaskProducer.submit].

        Returns:
            Where the task landed; for a spooled task ``spooled=True``, ``offset=-1``.

        Raises:
            ProducerError: when the broker did not take the task after the client's
                retries and there is no spool (or the spool could not be written).
        """
        sent = await self._send(key, task, timestamp_ms, scheduled_time_ms, partition)
        return await sent

    async def _send(
        self,
        key: str | bytes | None,
        task: T,
        timestamp_ms: int | None,
        scheduled_time_ms: int | None,
        partition: int | None,
    ) -> asyncio.Future[RecordLocation]:
        sender = self._sender
        if sender is None:
            raise ProducerError("the producer is not started: use 'async with' or start()")
        if timestamp_ms is None:
            timestamp_ms = time.time_ns() // 1_000_000
        meta = TaskMetadata(
            timestamp_ms=timestamp_ms,
            source_application_id=self.config.application_id,
            source_instance_id=self.config.instance_id,
            scheduled_time_ms=scheduled_time_ms or 0,
        )
        key_bytes = _key_bytes(key)
        headers = [(METADATA_HEADER, encode_metadata(meta))]
        value = self._serializer.encode(task)
        if self._publish is not None:
            with self._publish.span(key_bytes, partition, headers) as headers:
                return await sender.submit(
                    self.topic,
                    value,
                    key=key_bytes,
                    partition=partition,
                    timestamp_ms=timestamp_ms,
                    headers=headers,
                )
        return await sender.submit(
            self.topic,
            value,
            key=key_bytes,
            partition=partition,
            timestamp_ms=timestamp_ms,
            headers=headers,
        )

    async def flush(self) -> None:
        """Wait until every task handed over so far was delivered, spooled or failed."""
        if self._sender is not None:
            await self._sender.flush()
