"""Property values from a Kafka topic, so every instance sees the same change.

This module owns the Kafka property source: the record shapes of the property topic
(`encode_record()`, `decode_record()`, `apply_record()`) and
[`KafkaPropertySource`][decaton_aio.properties.KafkaPropertySource], which reads the topic's
backlog for the strict start and then applies new records leniently. The other sources
(environment variables, files) and the `PropertySource` protocol are in
`decaton_aio.properties._sources`.

Background work follows the routine vocabulary (`decaton_aio._routines`).
An undecodable record or a failed fetch is logged and skipped; anything else ends the
routine, is logged, and is re-raised by ``stop()``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, Protocol

import msgspec
import structlog
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from decaton_aio._connect import start_client
from decaton_aio._routines import cancel_and_wait, spawn
from decaton_aio.offsets import topic_partitions
from decaton_aio.properties._properties import RESET, Properties
from decaton_aio.security import PLAINTEXT, SecuritySettings

__all__ = ["KafkaPropertySource", "apply_record", "decode_record", "encode_record"]

_log = structlog.get_logger("decaton_aio.properties")


def encode_record(name: str, value: object) -> tuple[bytes, bytes | None]:
    """Encode one property change as a Kafka record ``(key, value)`` for the property topic.

    Args:
        name: the property name (the record key).
        value: the new value (encoded as JSON), or `RESET` for a tombstone.

    Returns:
        Key and value bytes; the value is None for a reset.
    """
    if value is RESET:
        return name.encode(), None
    return name.encode(), msgspec.json.encode(value)


def decode_record(key: bytes | None, value: bytes | None) -> dict[str, object]:
    """Decode one property record.

    Two shapes are accepted:

    * keyed: the key is the property name, the value its JSON-encoded value; a tombstone
      (no value) or JSON ``null`` means reset to the start value. Compaction keeps the
      latest per name.
    * key-less: the value is a JSON object ``{name: value, ...}`` applied as one batch.

    Args:
        key: record key bytes.
        value: record value bytes.

    Returns:
        Name to value, `RESET` for a reset.

    Raises:
        ValueError: the record is not one of the shapes above.
    """
    if key is not None:
        name = key.decode("utf-8")
        decoded = None if value is None else msgspec.json.decode(value)
        return {name: RESET if decoded is None else decoded}
    if value is None:
        raise ValueError("a record without key and value means nothing")
    batch = msgspec.json.decode(value)
    if not isinstance(batch, dict):
        raise ValueError(f"a key-less record must hold a JSON object, got {type(batch).__name__}")
    return {name: RESET if item is None else item for name, item in batch.items()}


def apply_record(
    properties: Properties,
    key: bytes | None,
    value: bytes | None,
    *,
    layer: int | None = None,
) -> dict[str, bool]:
    """Decode one property record and apply it (leniently) to ``properties``.

    Args:
        properties: where the change goes.
        key: record key bytes (see `decode_record()`).
        value: record value bytes.
        layer: the layer of ``properties`` the record changes (see ``Properties.update``).

    Returns:
        Name to whether it was accepted; empty when the record cannot be decoded (logged).
    """
    changes = _decode_or_log(key, value)
    return properties.update(changes, layer=layer) if changes else {}


def _decode_or_log(key: bytes | None, value: bytes | None) -> dict[str, object]:
    try:
        return decode_record(key, value)
    except ValueError as exc:  # msgspec.DecodeError and UnicodeDecodeError included
        _log.warning("undecodable property record skipped", key=key, value=value, reason=str(exc))
        return {}


class _Consumer(Protocol):
    """The part of ``aiokafka.AIOKafkaConsumer`` the Kafka source uses."""

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    def assignment(self) -> set[Any]: ...
    async def seek_to_beginning(self, *partitions: Any) -> Any: ...
    async def end_offsets(self, partitions: list[Any]) -> dict[Any, int]: ...
    async def position(self, partition: Any) -> int: ...
    async def getmany(self, *, timeout_ms: int) -> dict[Any, list[Any]]: ...


_FETCH_RETRY_BACKOFF_S: Final = 1.0


class KafkaPropertySource:
    """Property changes read from a Kafka topic, so every instance sees the same change.

    No consumer group: the source is assigned every partition of ``topic`` and reads it
    from the beginning, because the topic may not be compacted on every broker. It folds
    the backlog (latest value per name wins) and applies it once, then applies each new
    batch of records as it arrives. Record shapes: see `decode_record()`. Use keyed
    records (or a single partition) so changes to one name keep their order.

    Args:
        bootstrap_servers: Kafka bootstrap servers, e.g. ``"localhost:9092"``.
        topic: the property topic.
        poll_timeout_ms: how long one fetch waits for new records.
        consumer_factory: builds the consumer (for tests); it must be assigned all
            partitions of ``topic`` without a group once started. Defaults to an
            ``AIOKafkaConsumer`` with ``security``.
        security: TLS and SASL settings of the default consumer.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        *,
        poll_timeout_ms: int = 500,
        consumer_factory: Callable[[], _Consumer] | None = None,
        security: SecuritySettings = PLAINTEXT,
    ) -> None:
        self._bootstrap_servers = bootstrap_servers
        self._security = security
        self._topic = topic
        self._poll_timeout_ms = poll_timeout_ms
        self._consumer_factory = consumer_factory or self._default_consumer
        self._task: asyncio.Task[None] | None = None

    def _default_consumer(self) -> _Consumer:
        # Not subscribed: the partitions are assigned by hand once metadata is known, so
        # the backlog read sees every partition from the first call.
        consumer: _Consumer = AIOKafkaConsumer(
            bootstrap_servers=self._bootstrap_servers,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            client_id="decaton-aio-properties",
            **self._security.client_kwargs(),
        )
        return consumer

    async def _started_consumer(self) -> _Consumer:
        consumer = self._consumer_factory()
        await start_client(consumer, self._bootstrap_servers, self._security)
        return consumer

    async def load(self) -> dict[str, object]:
        """Read the topic to its current end and return the latest value per name.

        Returns:
            Name to value; names whose latest record is a reset are left out.

        Raises:
            SecurityError: TLS or SASL failed.
            BrokerError: the broker cannot be reached.
        """
        consumer = await self._started_consumer()
        try:
            pending = await self._read_backlog(consumer)
        finally:
            await consumer.stop()
        return {name: value for name, value in pending.items() if value is not RESET}

    async def start(self, properties: Properties, *, layer: int | None = None) -> None:
        """Apply the topic's backlog once, then apply new records in the background.

        Args:
            properties: where changes go.
            layer: the layer of ``properties`` the topic's values replace (higher layers
                keep precedence); ``None`` applies them over every layer.

        Raises:
            RuntimeError: already started.
            SecurityError: TLS or SASL failed.
            BrokerError: the broker cannot be reached.
        """
        if self._task is not None:
            raise RuntimeError("KafkaPropertySource already started")
        consumer = await self._started_consumer()
        try:
            properties.update(await self._read_backlog(consumer), layer=layer)
        except BaseException:
            await consumer.stop()
            raise
        self._task = spawn(
            self._apply_routine(consumer, properties, layer), f"property-topic:{self._topic}"
        )

    async def stop(self) -> None:
        """Stop applying; cancel and await the routine (re-raises an unexpected failure)."""
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)

    async def _read_backlog(self, consumer: _Consumer) -> dict[str, object]:
        """Read from the beginning up to the end offsets seen now; fold latest per name."""
        partitions = list(consumer.assignment())
        if not partitions and isinstance(consumer, AIOKafkaConsumer):
            found = await topic_partitions(consumer, self._topic)
            partitions = [TopicPartition(self._topic, p) for p in found]
            consumer.assign(partitions)
        pending: dict[str, object] = {}
        if not partitions:
            return pending
        await consumer.seek_to_beginning(*partitions)
        end = await consumer.end_offsets(partitions)
        while not await self._caught_up(consumer, end):
            batch = await consumer.getmany(timeout_ms=self._poll_timeout_ms)
            _fold(batch, pending)
        return pending

    @staticmethod
    async def _caught_up(consumer: _Consumer, end: Mapping[Any, int]) -> bool:
        for partition, end_offset in end.items():
            if await consumer.position(partition) < end_offset:
                return False
        return True

    async def _apply_routine(
        self, consumer: _Consumer, properties: Properties, layer: int | None
    ) -> None:
        try:
            while True:
                try:
                    batch = await consumer.getmany(timeout_ms=self._poll_timeout_ms)
                except KafkaError as exc:
                    # aiokafka retries what it can itself; what reaches us (authorization,
                    # a deleted topic) may heal, and properties must not stop the processor.
                    _log.warning("property topic fetch failed", topic=self._topic, error=repr(exc))
                    await asyncio.sleep(_FETCH_RETRY_BACKOFF_S)
                    continue
                pending: dict[str, object] = {}
                _fold(batch, pending)
                if pending:
                    properties.update(pending, layer=layer)
        finally:
            await consumer.stop()


def _fold(batch: Mapping[Any, Iterable[Any]], into: dict[str, object]) -> None:
    """Fold fetched records into ``into`` so only the latest value per name remains.

    Applying the fold, not each record, avoids flapping listeners through stale values.
    """
    for records in batch.values():
        for record in records:
            into.update(_decode_or_log(record.key, record.value))
