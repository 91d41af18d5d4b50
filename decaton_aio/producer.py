"""The task producer: puts tasks on a topic with Decaton's ``dt_meta`` header.

Each task is serialized by the producer's serializer, and its metadata (timestamp, source
application and instance, retry count, scheduled time) travels in the ``dt_meta`` header,
so Decaton consumers on the JVM read the same records. Puts from many coroutines are in
flight together and are batched by the client: a put waits for its own acknowledgement
(``acks=all``), not for the ones before it.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import Generic, TypeVar

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError, UnknownError

from decaton_aio.errors import ConfigError, ProducerError
from decaton_aio.metadata import METADATA_HEADER, TaskMetadata, encode_metadata
from decaton_aio.typing import Serializer

__all__ = ["ProducerConfig", "RecordLocation", "TaskProducer"]

T = TypeVar("T")

DEFAULT_LINGER_MS = 5
DEFAULT_MAX_BATCH_BYTES = 256 * 1024
DEFAULT_REQUEST_TIMEOUT_MS = 30_000

_IDEMPOTENCE_HINT = (
    "the broker refused an idempotent producer (InitProducerId failed). The embedded "
    "broker (Tansu) does not support aiokafka's idempotent producer: "
    "set ProducerConfig(idempotence=False), or pass --no-idempotence on the command line"
)


def _default_instance_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class ProducerConfig:
    """Settings of a :class:`TaskProducer`.

    Attributes:
        bootstrap_servers: ``host:port[,host:port]`` of the cluster.
        idempotence: use the idempotent producer (no duplicates from client retries). On
            for real Kafka; the embedded broker needs it off.
        application_id: written to ``dt_meta`` as the source application id.
        instance_id: written to ``dt_meta`` as the source instance id (host-pid default).
        linger_ms: how long the client waits to fill a batch.
        max_batch_bytes: the largest batch the client sends per partition.
        request_timeout_ms: how long a produce request may take before it is retried.
    """

    bootstrap_servers: str
    idempotence: bool = True
    application_id: str = "decaton-aio"
    instance_id: str = field(default_factory=_default_instance_id)
    linger_ms: int = DEFAULT_LINGER_MS
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES
    request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS

    def __post_init__(self) -> None:
        if not self.bootstrap_servers.strip():
            raise ConfigError("bootstrap_servers is empty: give host:port of the cluster")
        if self.linger_ms < 0:
            raise ConfigError(f"linger_ms must be >= 0, got {self.linger_ms}")
        if self.max_batch_bytes < 1024:
            raise ConfigError(f"max_batch_bytes must be >= 1024, got {self.max_batch_bytes}")
        if self.request_timeout_ms < 1:
            raise ConfigError(f"request_timeout_ms must be >= 1, got {self.request_timeout_ms}")


@dataclass(frozen=True, slots=True)
class RecordLocation:
    """Where a task landed."""

    topic: str
    partition: int
    offset: int


def _key_bytes(key: str | bytes | None) -> bytes | None:
    if key is None or isinstance(key, bytes):
        return key
    if isinstance(key, str):
        return key.encode()
    raise TypeError(f"a task key must be str, bytes or None, not {type(key).__name__}")


class TaskProducer(Generic[T]):
    """Puts tasks of one type on one topic.

    ::

        async with TaskProducer(ProducerConfig("localhost:9092"), "orders", serializer) as p:
            where = await p.put("user-1", Order(...))

    Args:
        config: connection and batching settings.
        topic: the task topic.
        serializer: turns a task into the record value.
    """

    def __init__(self, config: ProducerConfig, topic: str, serializer: Serializer[T]) -> None:
        if not topic:
            raise ConfigError("topic is empty: name the task topic")
        self.config = config
        self.topic = topic
        self._serializer = serializer
        self._client: AIOKafkaProducer | None = None

    async def start(self) -> None:
        """Connect to the cluster.

        Raises:
            ProducerError: when the cluster cannot be reached or refuses the producer; a
                refused idempotent producer says how to turn idempotence off.
        """
        if self._client is not None:
            return
        cfg = self.config
        client = AIOKafkaProducer(
            bootstrap_servers=cfg.bootstrap_servers,
            acks="all",
            enable_idempotence=cfg.idempotence,
            linger_ms=cfg.linger_ms,
            max_batch_size=cfg.max_batch_bytes,
            request_timeout_ms=cfg.request_timeout_ms,
            client_id=f"decaton-aio-producer-{cfg.application_id}",
        )
        try:
            await client.start()
        except UnknownError as exc:
            await client.stop()
            if cfg.idempotence:
                raise ProducerError(_IDEMPOTENCE_HINT) from exc
            raise ProducerError(f"the producer could not start: {exc!r}") from exc
        except KafkaError as exc:
            await client.stop()
            raise ProducerError(
                f"cannot reach the cluster at {cfg.bootstrap_servers}: {exc}"
            ) from exc
        self._client = client

    async def stop(self) -> None:
        """Deliver what is buffered, then disconnect."""
        client, self._client = self._client, None
        if client is not None:
            await client.stop()

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
        waits for the broker's acknowledgement. Use it to keep many tasks in flight from
        one coroutine.

        Args:
            key: the task key (str is UTF-8 encoded); tasks of one key keep their order.
            task: the task, encoded by the producer's serializer.
            timestamp_ms: the record and metadata timestamp; now when omitted.
            scheduled_time_ms: do not process before this time (0 or None: at once).
            partition: an explicit partition; the key's partition when omitted.

        Returns:
            A future resolving to the task's :class:`RecordLocation`.

        Raises:
            ProducerError: when the producer is not started or the client refuses it.
        """
        sent = await self._send(key, task, timestamp_ms, scheduled_time_ms, partition)
        return asyncio.ensure_future(self._locate(sent))

    async def put(
        self,
        key: str | bytes | None,
        task: T,
        *,
        timestamp_ms: int | None = None,
        scheduled_time_ms: int | None = None,
        partition: int | None = None,
    ) -> RecordLocation:
        """Put a task and wait until the broker acknowledged it (``acks=all``).

        Concurrent puts are batched together by the client. Arguments as :meth:`submit`.

        Returns:
            Where the task landed.

        Raises:
            ProducerError: when the broker did not take the task after the client's retries.
        """
        sent = await self._send(key, task, timestamp_ms, scheduled_time_ms, partition)
        return await self._locate(sent)

    async def _send(
        self,
        key: str | bytes | None,
        task: T,
        timestamp_ms: int | None,
        scheduled_time_ms: int | None,
        partition: int | None,
    ) -> asyncio.Future[object]:
        client = self._client
        if client is None:
            raise ProducerError("the producer is not started: use 'async with' or start()")
        if timestamp_ms is None:
            timestamp_ms = time.time_ns() // 1_000_000
        meta = TaskMetadata(
            timestamp_ms=timestamp_ms,
            source_application_id=self.config.application_id,
            source_instance_id=self.config.instance_id,
            scheduled_time_ms=scheduled_time_ms or 0,
        )
        try:
            sent: asyncio.Future[object] = await client.send(
                self.topic,
                self._serializer.encode(task),
                key=_key_bytes(key),
                partition=partition,
                timestamp_ms=timestamp_ms,
                headers=[(METADATA_HEADER, encode_metadata(meta))],
            )
        except KafkaError as exc:
            raise ProducerError(f"cannot send to {self.topic}: {exc!r}") from exc
        return sent

    async def flush(self) -> None:
        """Wait until every task handed to the client so far was sent."""
        if self._client is not None:
            await self._client.flush()

    async def _locate(self, sent: asyncio.Future[object]) -> RecordLocation:
        try:
            meta = await sent
        except UnknownError as exc:
            if self.config.idempotence:
                raise ProducerError(_IDEMPOTENCE_HINT) from exc
            raise ProducerError(f"the broker did not take the task: {exc!r}") from exc
        except KafkaError as exc:
            raise ProducerError(f"the broker did not take the task: {exc!r}") from exc
        return RecordLocation(meta.topic, meta.partition, meta.offset)  # type: ignore[attr-defined]
