"""The task producer: puts tasks on a topic with Decaton's ``dt_meta`` header.

Each task is serialized by the producer's serializer, and its metadata (timestamp, source
application and instance, retry count, scheduled time) travels in the ``dt_meta`` header,
so Decaton consumers on the JVM read the same records. Puts from many coroutines are in
flight together and are batched by the client: a put waits for its own acknowledgement
(``acks=all``), not for the ones before it.

Records go through a :class:`~decaton_aio.durable.DurableSender`. With
``ProducerConfig.spool_dir`` set, a task the cluster does not take (after the client's own
retries, or with no broker reachable at all) is appended to a local spool and replayed
later: its put returns a :class:`RecordLocation` with ``spooled=True`` instead of raising.
Without a spool, such a put raises :class:`~decaton_aio.errors.ProducerError`.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import Generic, Literal, TypeVar

from decaton_aio.durable import DurableSender, RecordLocation
from decaton_aio.errors import ConfigError, ProducerError
from decaton_aio.metadata import METADATA_HEADER, TaskMetadata, encode_metadata
from decaton_aio.typing import Serializer

__all__ = ["COMPRESSION_TYPES", "Idempotence", "ProducerConfig", "RecordLocation", "TaskProducer"]

T = TypeVar("T")

#: ``"auto"``: idempotent where the cluster grants it; ``True``: required; ``False``: off.
Idempotence = bool | Literal["auto"]

#: Codecs a producer can compress batches with (every one is installed with the package).
COMPRESSION_TYPES = ("gzip", "snappy", "lz4", "zstd")

DEFAULT_LINGER_MS = 5
DEFAULT_MAX_BATCH_BYTES = 256 * 1024
DEFAULT_REQUEST_TIMEOUT_MS = 30_000
DEFAULT_REPLAY_BACKOFF_MS = 500
DEFAULT_REPLAY_BACKOFF_MAX_MS = 30_000


def _default_instance_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class ProducerConfig:
    """Settings of a :class:`TaskProducer`.

    Attributes:
        bootstrap_servers: ``host:port[,host:port]`` of the cluster.
        idempotence: use the idempotent producer (no duplicates from client retries):
            ``"auto"`` (the default) where the cluster grants it, else a plain producer
            and one warning; ``True`` requires it (the start fails where the cluster
            refuses); ``False`` never.
        compression_type: the codec of produced batches: ``None`` (uncompressed),
            ``"gzip"``, ``"snappy"``, ``"lz4"`` or ``"zstd"``.
        application_id: written to ``dt_meta`` as the source application id.
        instance_id: written to ``dt_meta`` as the source instance id (host-pid default).
        linger_ms: how long the client waits to fill a batch.
        max_batch_bytes: the largest batch the client sends per partition.
        request_timeout_ms: how long a produce request may take before it is retried; a
            non-idempotent client also gives up on a batch this long after creating it.
        delivery_timeout_ms: how long a record may wait for its acknowledgement before the
            producer gives up on it (spools it, or fails the put without a spool); the
            client may still deliver it later (a duplicate). ``None``: twice
            ``request_timeout_ms`` plus ``linger_ms``, so a non-idempotent client reports
            its own error first; an idempotent client never gives up by itself.
        spool_dir: the local spool directory of the durable producer; ``None``: no spool,
            an undeliverable put raises :class:`ProducerError`. One producer (one
            :class:`~decaton_aio.durable.DurableSender`) per directory.
        replay_backoff_ms: the wait after the first failed replay of the spool; it doubles
            (with jitter) after each further failure.
        replay_backoff_max_ms: the longest wait between replay attempts.
    """

    bootstrap_servers: str
    idempotence: Idempotence = "auto"
    compression_type: str | None = None
    application_id: str = "decaton-aio"
    instance_id: str = field(default_factory=_default_instance_id)
    linger_ms: int = DEFAULT_LINGER_MS
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES
    request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS
    delivery_timeout_ms: int | None = None
    spool_dir: str | os.PathLike[str] | None = None
    replay_backoff_ms: int = DEFAULT_REPLAY_BACKOFF_MS
    replay_backoff_max_ms: int = DEFAULT_REPLAY_BACKOFF_MAX_MS

    def __post_init__(self) -> None:
        if not self.bootstrap_servers.strip():
            raise ConfigError("bootstrap_servers is empty: give host:port of the cluster")
        if self.idempotence not in (True, False, "auto"):
            raise ConfigError(
                f"idempotence must be 'auto', True or False, got {self.idempotence!r}"
            )
        if self.compression_type is not None and self.compression_type not in COMPRESSION_TYPES:
            raise ConfigError(
                f"compression_type must be None or one of {COMPRESSION_TYPES}, "
                f"got {self.compression_type!r}"
            )
        if self.linger_ms < 0:
            raise ConfigError(f"linger_ms must be >= 0, got {self.linger_ms}")
        if self.max_batch_bytes < 1024:
            raise ConfigError(f"max_batch_bytes must be >= 1024, got {self.max_batch_bytes}")
        if self.request_timeout_ms < 1:
            raise ConfigError(f"request_timeout_ms must be >= 1, got {self.request_timeout_ms}")
        if self.delivery_timeout_ms is not None and self.delivery_timeout_ms < 1:
            raise ConfigError(
                f"delivery_timeout_ms must be >= 1 (or None for the default), "
                f"got {self.delivery_timeout_ms}"
            )
        if self.spool_dir is not None and not os.fspath(self.spool_dir):
            raise ConfigError("spool_dir is empty: name a directory, or None for no spool")
        if self.replay_backoff_ms < 1:
            raise ConfigError(f"replay_backoff_ms must be >= 1, got {self.replay_backoff_ms}")
        if self.replay_backoff_max_ms < self.replay_backoff_ms:
            raise ConfigError(
                f"replay_backoff_max_ms ({self.replay_backoff_max_ms}) must be >= "
                f"replay_backoff_ms ({self.replay_backoff_ms})"
            )

    @property
    def effective_delivery_timeout_ms(self) -> int:
        """``delivery_timeout_ms``, or its default when it is ``None``."""
        if self.delivery_timeout_ms is not None:
            return self.delivery_timeout_ms
        return 2 * self.request_timeout_ms + self.linger_ms


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
        config: connection and batching settings; ``spool_dir`` makes it durable.
        topic: the task topic.
        serializer: turns a task into the record value.
        sender: a started sender to share (e.g. with the runtime's retry path); the
            producer then neither starts nor stops it, and ``config`` only supplies the
            metadata (application and instance id). By default the producer owns one
            built from ``config``.
    """

    def __init__(
        self,
        config: ProducerConfig,
        topic: str,
        serializer: Serializer[T],
        *,
        sender: DurableSender | None = None,
    ) -> None:
        if not topic:
            raise ConfigError("topic is empty: name the task topic")
        self.config = config
        self.topic = topic
        self._serializer = serializer
        self._shared = sender
        self._sender: DurableSender | None = sender

    @property
    def sender(self) -> DurableSender | None:
        """The sender records go through (``None`` before :meth:`start`)."""
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
            A future resolving to the task's :class:`RecordLocation` (``spooled=True``
            when it was spooled).

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
        puts are batched together by the client. Arguments as :meth:`submit`.

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
        return await sender.submit(
            self.topic,
            self._serializer.encode(task),
            key=_key_bytes(key),
            partition=partition,
            timestamp_ms=timestamp_ms,
            headers=[(METADATA_HEADER, encode_metadata(meta))],
        )

    async def flush(self) -> None:
        """Wait until every task handed over so far was delivered, spooled or failed."""
        if self._sender is not None:
            await self._sender.flush()
