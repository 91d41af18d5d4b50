"""Where checkpoints live: the commit metadata, or a compacted checkpoint topic.

The `CheckpointStore` turns each partition's `Checkpoint` into the metadata
string committed with its offset, and reads them back when partitions are assigned.

- A checkpoint whose text fits the broker's ``offset.metadata.max.bytes`` (4,096 by
  default) is the metadata itself (``dc1:...``): stored atomically with the offset.
- A larger one is first written to the group's compacted checkpoint topic (key
  ``<group>/<topic>/<partition>``, partition 0, created on first use) and the metadata is
  a reference to that record (``dc1ref:<partition>:<offset>:<base>``). There is no size
  budget, so a long-blocked record never stalls commits.
- A broker that drops commit metadata (Tansu) is noticed after the first commit that
  carried one: from then on every checkpoint goes to the topic, and loading finds it by
  reading the topic for the partition's key.

Loading (`CheckpointStore.load()`) reads the group's committed offsets with their
metadata (with exactly-once, once no open transaction holds them: see ``_group_txn``); a
checkpoint that cannot be read, is corrupt, or does not belong to the committed offset is
ignored with a warning (its records are processed again: at-least-once still holds).
Writes to the topic can go through a caller's producer (the transactional producer, so
the record commits with the offset) or the store's own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError

from decaton_aio._connect import start_or_close
from decaton_aio.consumer._loopwatch import yield_if_due
from decaton_aio.consumer.commit._checkpoint_codec import (
    TEXT_PREFIX,
    Checkpoint,
    CorruptCheckpointError,
    decode,
    encode,
    from_text,
    to_text,
    untrusted_reason,
)
from decaton_aio.consumer.commit._group_txn import read_stable_offsets
from decaton_aio.security import PLAINTEXT, SecuritySettings

__all__ = ["DEFAULT_METADATA_MAX_BYTES", "CheckpointStore", "Loaded", "SendCheckpoint"]

log = structlog.get_logger("decaton_aio.consumer")

#: Kafka's default ``offset.metadata.max.bytes``.
DEFAULT_METADATA_MAX_BYTES = 4096
_REF_PREFIX = "dc1ref:"
_READ_TIMEOUT_S = 10.0
_FETCH_WAIT_MS = 100

#: ``send(topic, partition, key, value)`` writes a checkpoint record and returns its offset.
SendCheckpoint = Callable[[str, int, bytes, bytes], Awaitable[int]]


@dataclass(frozen=True, slots=True)
class Loaded:
    """What the group stored for one partition.

    Attributes:
        committed: the committed offset, ``None`` when the group has none.
        checkpoint: the checkpoint to import, only when it belongs to ``committed``.
        metadata: the commit metadata that holds ``checkpoint`` (``""`` without one).
    """

    committed: int | None
    checkpoint: Checkpoint | None
    metadata: str = ""


class CheckpointStore:
    """Saves and loads the checkpoints of one consumer group.

    Args:
        bootstrap_servers: the cluster.
        group_id: the consumer group.
        topic: the compacted checkpoint topic (created on first use).
        metadata_max_bytes: the broker's ``offset.metadata.max.bytes``; larger
            checkpoints go to the topic.
        replication_factor: of the checkpoint topic when it is created (at most 3, at
            most the number of brokers, when omitted).
        security: TLS and SASL settings of the store's clients (the subscription's).
    """

    def __init__(
        self,
        bootstrap_servers: str,
        group_id: str,
        topic: str,
        *,
        metadata_max_bytes: int = DEFAULT_METADATA_MAX_BYTES,
        replication_factor: int | None = None,
        security: SecuritySettings = PLAINTEXT,
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self._client_kwargs = security.client_kwargs()
        self.group_id = group_id
        self.topic = topic
        self.metadata_max_bytes = metadata_max_bytes
        self._replication_factor = replication_factor
        #: With exactly-once, how long loading waits for a transaction that holds offsets
        #: (a previous owner's, still committing); ``None``: offsets are read as they are.
        self.stable_timeout_s: float | None = None
        #: Whether the broker keeps commit metadata (``None`` until a commit tells).
        self.metadata_kept: bool | None = None
        self._topic_ready = False
        self._admin: AIOKafkaAdminClient | None = None
        self._producer: Any = None
        self._lock = asyncio.Lock()
        self._clients_lock = asyncio.Lock()  # one admin client and one producer, ever

    def key(self, tp: TopicPartition) -> bytes:
        """The checkpoint topic key of a partition of this group."""
        return f"{self.group_id}/{tp.topic}/{tp.partition}".encode()

    # ----------------------------------------------------------------------- saving

    async def metadata(
        self, checkpoints: dict[TopicPartition, Checkpoint], send: SendCheckpoint | None = None
    ) -> dict[TopicPartition, str]:
        """The commit metadata of each checkpoint, writing to the topic what does not fit.

        Args:
            checkpoints: the checkpoints to commit with their offsets.
            send: writes a record to the topic (default: the store's own producer).

        Returns:
            The metadata per partition; ``""`` for an empty checkpoint, or when a
            checkpoint could not be written (logged; its records would be redone).
        """
        result: dict[TopicPartition, str] = {}
        began = time.monotonic()
        for tp, checkpoint in checkpoints.items():
            began = await yield_if_due(began)  # many partitions: encoded in steps
            if checkpoint.empty:
                result[tp] = ""
                continue
            data = encode(checkpoint)
            text = to_text(data)
            if self.metadata_kept is not False and len(text) <= self.metadata_max_bytes:
                result[tp] = text
                continue
            try:
                offset = await (send or self._send)(self.topic, 0, self.key(tp), data)
            except (KafkaError, OSError) as exc:
                log.warning(
                    "cannot write a checkpoint; its records are processed again after a restart",
                    partition=f"{tp.topic}-{tp.partition}",
                    checkpoint_topic=self.topic,
                    error=repr(exc),
                )
                result[tp] = ""
                continue
            result[tp] = f"{_REF_PREFIX}0:{offset}:{checkpoint.base}"
        return result

    async def ensure_topic(self) -> None:
        """Create the compacted checkpoint topic unless it exists."""
        if self._topic_ready:
            return
        async with self._lock:
            if self._topic_ready:
                return
            admin = await self._admin_client()
            if self.topic not in set(await admin.list_topics()):
                replication = self._replication_factor
                if replication is None:
                    brokers = len((await admin.describe_cluster()).get("brokers") or []) or 1
                    replication = min(3, brokers)
                topic = NewTopic(self.topic, 1, replication, topic_configs=_COMPACTED)
                response = await admin.create_topics([topic])
                for item in getattr(response, "topic_errors", []):
                    if item[1] not in (0, TopicAlreadyExistsError.errno):
                        raise KafkaError(f"cannot create {self.topic}: error {item[1]}")
                log.info("created the checkpoint topic", topic=self.topic)
            self._topic_ready = True

    async def _send(self, topic: str, partition: int, key: bytes, value: bytes) -> int:
        await self.ensure_topic()
        async with self._clients_lock:
            if self._producer is None:
                producer = AIOKafkaProducer(
                    bootstrap_servers=self.bootstrap_servers,
                    acks="all",
                    client_id=f"decaton-aio-checkpoints-{self.group_id}",
                    **self._client_kwargs,
                )
                await start_or_close(producer)  # cancelled with the commit: closed
                self._producer = producer
        sent = await self._producer.send_and_wait(topic, value, key=key, partition=partition)
        return int(sent.offset)

    async def check_kept(self, tp: TopicPartition, text: str) -> None:
        """After the first commit that carried inline metadata, read it back: a broker that
        dropped it (Tansu) gets every later checkpoint in the topic instead."""
        if self.metadata_kept is not None or not text.startswith(TEXT_PREFIX):
            return
        try:
            found = await self._committed([tp])
        except KafkaError as exc:
            log.debug("cannot read the commit metadata back", error=repr(exc))
            return
        kept = bool(found.get(tp, (None, ""))[1])
        self.metadata_kept = kept
        if not kept:
            log.warning(
                "the broker drops commit metadata: checkpoints go to the checkpoint topic",
                checkpoint_topic=self.topic,
            )

    # ---------------------------------------------------------------------- loading

    async def load(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, Loaded]:
        """The committed offset and usable checkpoint of each partition.

        A checkpoint that cannot be read or trusted is dropped with a warning.

        Raises:
            KafkaError: the committed offsets could not be read.
        """
        wanted = list(tps)
        found = await self._committed(wanted)
        loaded: dict[TopicPartition, Loaded] = {}
        scan: list[TopicPartition] = []
        for tp in wanted:
            committed, text = found.get(tp, (None, ""))
            checkpoint: Checkpoint | None = None
            if committed is not None and text:
                checkpoint = await self._read_text(tp, text)
            elif committed is not None and self.metadata_kept is not True:
                scan.append(tp)  # metadata dropped (or never written): try the topic
            loaded[tp] = Loaded(committed, checkpoint, text if checkpoint is not None else "")
        if scan:
            latest = await self._scan(scan)
            for tp in scan:
                if tp in latest:
                    loaded[tp] = Loaded(loaded[tp].committed, latest[tp])
        for tp, entry in list(loaded.items()):
            if entry.checkpoint is None:
                continue
            reason = untrusted_reason(entry.checkpoint, entry.committed)
            if reason is not None:
                log.warning(
                    "ignoring a stale checkpoint; its records are processed again",
                    partition=f"{tp.topic}-{tp.partition}",
                    reason=reason,
                )
                loaded[tp] = Loaded(entry.committed, None)
        return loaded

    async def _committed(
        self, tps: list[TopicPartition]
    ) -> dict[TopicPartition, tuple[int | None, str]]:
        admin = await self._admin_client()
        if self.stable_timeout_s is not None:
            found = await read_stable_offsets(
                admin, self.group_id, tps, timeout_s=self.stable_timeout_s
            )
        else:
            found = await admin.list_consumer_group_offsets(self.group_id, partitions=tps)
        return {
            tp: (meta.offset if meta.offset >= 0 else None, meta.metadata or "")
            for tp, meta in found.items()
        }

    async def _read_text(self, tp: TopicPartition, text: str) -> Checkpoint | None:
        where = f"{tp.topic}-{tp.partition}"
        try:
            if text.startswith(_REF_PREFIX):
                partition, offset, _base = (int(x) for x in text[len(_REF_PREFIX) :].split(":"))
                data = await self._read_at(partition, offset, self.key(tp))
                if data is None:
                    log.warning("the checkpoint record is gone; ignoring it", partition=where)
                    return None
                return decode(data)
            if text.startswith(TEXT_PREFIX):
                return from_text(text)
        except (CorruptCheckpointError, ValueError) as exc:
            log.warning("ignoring a corrupt checkpoint", partition=where, error=str(exc))
            return None
        except (KafkaError, TimeoutError) as exc:
            log.warning("cannot read a checkpoint; ignoring it", partition=where, error=repr(exc))
            return None
        return None  # metadata some other tool wrote: not ours

    async def _read_at(self, partition: int, offset: int, key: bytes) -> bytes | None:
        # The record at ``offset`` if it is still there and has ``key`` (compaction may
        # have removed it once a newer checkpoint of the key was written).
        async with self._reader() as consumer:
            tp = TopicPartition(self.topic, partition)
            consumer.assign([tp])
            consumer.seek(tp, offset)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + _READ_TIMEOUT_S
            while loop.time() < deadline:
                batch = await consumer.getmany(tp, timeout_ms=_FETCH_WAIT_MS, max_records=1)
                for record in batch.get(tp, []):
                    if record.offset == offset and record.key == key:
                        return bytes(record.value) if record.value is not None else None
                    return None
            raise TimeoutError(f"no answer for {self.topic}-{partition}@{offset}")

    async def _scan(self, tps: list[TopicPartition]) -> dict[TopicPartition, Checkpoint]:
        # Read the whole checkpoint topic for these partitions' keys (the fallback when the
        # broker drops commit metadata); the last readable record of each key wins.
        keys = {self.key(tp): tp for tp in tps}
        latest: dict[TopicPartition, bytes] = {}
        try:
            admin = await self._admin_client()
            if self.topic not in set(await admin.list_topics()):
                return {}
            async with self._reader() as consumer:
                tp = TopicPartition(self.topic, 0)
                consumer.assign([tp])
                await consumer.seek_to_beginning(tp)
                loop = asyncio.get_running_loop()
                deadline = loop.time() + _READ_TIMEOUT_S
                while True:
                    batch = await consumer.getmany(tp, timeout_ms=_FETCH_WAIT_MS)
                    for record in batch.get(tp, []):
                        owner = keys.get(record.key)
                        if owner is not None and record.value is not None:
                            latest[owner] = bytes(record.value)
                    end = consumer.last_stable_offset(tp)
                    if end is not None and await consumer.position(tp) >= end:
                        break
                    if loop.time() > deadline:
                        raise TimeoutError(f"reading {self.topic} took over {_READ_TIMEOUT_S}s")
        except (KafkaError, TimeoutError) as exc:
            log.warning("cannot read the checkpoint topic", topic=self.topic, error=repr(exc))
            return {}
        result: dict[TopicPartition, Checkpoint] = {}
        for tp, data in latest.items():
            try:
                result[tp] = decode(data)
            except CorruptCheckpointError as exc:
                where = f"{tp.topic}-{tp.partition}"
                log.warning("ignoring a corrupt checkpoint", partition=where, error=str(exc))
        return result

    def _reader(self) -> _Reader:
        return _Reader(self.bootstrap_servers, self._client_kwargs)

    async def _admin_client(self) -> AIOKafkaAdminClient:
        async with self._clients_lock:
            if self._admin is None:
                admin = AIOKafkaAdminClient(
                    bootstrap_servers=self.bootstrap_servers, **self._client_kwargs
                )
                await start_or_close(admin)  # cancelled with the commit: closed
                self._admin = admin
            return self._admin

    async def close(self) -> None:
        """Close the store's clients."""
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None
        if self._admin is not None:
            await self._admin.close()
            self._admin = None


_COMPACTED = {"cleanup.policy": "compact"}


class _Reader:
    """A short-lived ``read_committed`` consumer without a group (checkpoint records
    written in a transaction count only once it committed)."""

    def __init__(self, bootstrap_servers: str, client_kwargs: dict[str, Any]) -> None:
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap_servers,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            fetch_max_wait_ms=_FETCH_WAIT_MS,
            client_id="decaton-aio-checkpoints",
            **client_kwargs,
        )

    async def __aenter__(self) -> AIOKafkaConsumer:
        await start_or_close(self._consumer)  # __aexit__ does not run when this fails
        return self._consumer

    async def __aexit__(self, *exc: object) -> None:
        await self._consumer.stop()
