"""The requests of the consumer group protocol that aiokafka does not speak, on its own
protocol classes: ``ConsumerGroupHeartbeat`` (versions 0 and 1), ``OffsetCommit`` version 9
(the first a member of a consumer-protocol group may commit with: it carries the member
epoch) and ``Metadata`` version 12 (the first that answers topic ids for names and names
for topic ids; the coordinator speaks of topics by id only).

Every version here is a flexible one: compact strings and arrays, tagged fields after each
structure. A topic id is Kafka's ``uuid`` (16 bytes, `Uuid`), a `uuid.UUID` here.
"""

from __future__ import annotations

import base64
import collections
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from io import BytesIO
from typing import Any, Final

from aiokafka import TopicPartition
from aiokafka.errors import IncompatibleBrokerVersion
from aiokafka.structs import OffsetAndMetadata

from decaton_aio._aiokafka import (
    AbstractType,
    Boolean,
    CompactArray,
    CompactString,
    Int8,
    Int16,
    Int32,
    Int64,
    Request,
    RequestStruct,
    Response,
    Schema,
    TaggedFields,
)

__all__ = [
    "CONSUMER_GROUP_HEARTBEAT",
    "ZERO_UUID",
    "Assignment",
    "ConsumerGroupHeartbeatRequest",
    "ConsumerGroupHeartbeatResponse_v0",
    "ConsumerGroupHeartbeatResponse_v1",
    "HeartbeatFields",
    "MetadataRequest_v12",
    "MetadataResponse_v12",
    "OffsetCommitRequest",
    "OffsetCommitResponse_v9",
    "TopicIdPartition",
    "TopicIdsRequest",
    "Uuid",
    "kafka_uuid_string",
    "read_assignment",
]

#: The API key of ``ConsumerGroupHeartbeat``.
CONSUMER_GROUP_HEARTBEAT: Final = 68
#: Kafka's zero uuid: no topic id (a topic created before ids, or unknown).
ZERO_UUID: Final = uuid.UUID(int=0)

_NO_TAGS: Final[dict[int, bytes]] = {}

#: A partition as the coordinator names it: ``(topic id, partition)``.
TopicIdPartition = tuple[uuid.UUID, int]
#: A member's partitions by topic id.
Assignment = frozenset[TopicIdPartition]


def kafka_uuid_string(value: uuid.UUID) -> str:
    """A uuid as Kafka prints it (URL-safe base64 of its 16 bytes, no padding)."""
    return base64.urlsafe_b64encode(value.bytes).decode().rstrip("=")


class Uuid(AbstractType[uuid.UUID]):  # type: ignore[misc]
    """Kafka's ``uuid`` type: 16 bytes, most significant first."""

    @classmethod
    def encode(cls, value: uuid.UUID) -> bytes:
        return value.bytes

    @classmethod
    def decode(cls, data: BytesIO) -> uuid.UUID:
        raw = data.read(16)
        if len(raw) != 16:
            raise ValueError("a uuid needs 16 bytes")
        return uuid.UUID(bytes=raw)


class _NullableStruct:
    """A nullable structure of a flexible version: ``-1`` (Int8) for null, ``1`` then
    the structure's fields."""

    def __init__(self, *fields: tuple[str, Any]) -> None:
        self.schema = Schema(*fields)

    def encode(self, value: Sequence[Any] | None) -> bytes:
        head: bytes = Int8.encode(-1 if value is None else 1)
        if value is None:
            return head
        body: bytes = self.schema.encode(value)
        return head + body

    def decode(self, data: BytesIO) -> tuple[Any, ...] | None:
        if Int8.decode(data) < 0:
            return None
        fields: tuple[Any, ...] = self.schema.decode(data)
        return fields

    def repr(self, value: Any) -> str:
        return "NULL" if value is None else self.schema.repr(value)


def _string() -> CompactString:
    return CompactString("utf-8")


# ------------------------------------------------------------- ConsumerGroupHeartbeat

_TOPIC_PARTITIONS = CompactArray(
    ("topic_id", Uuid),
    ("partitions", CompactArray(Int32)),
    ("tags", TaggedFields),
)

_HEARTBEAT_RESPONSE = Schema(
    ("throttle_time_ms", Int32),
    ("error_code", Int16),
    ("error_message", _string()),
    ("member_id", _string()),
    ("member_epoch", Int32),
    ("heartbeat_interval_ms", Int32),
    (
        "assignment",
        _NullableStruct(("topic_partitions", _TOPIC_PARTITIONS), ("tags", TaggedFields)),
    ),
    ("tags", TaggedFields),
)


class ConsumerGroupHeartbeatResponse_v0(Response):  # type: ignore[misc]
    API_KEY = CONSUMER_GROUP_HEARTBEAT
    API_VERSION = 0
    SCHEMA = _HEARTBEAT_RESPONSE


class ConsumerGroupHeartbeatResponse_v1(Response):  # type: ignore[misc]
    API_KEY = CONSUMER_GROUP_HEARTBEAT
    API_VERSION = 1
    SCHEMA = _HEARTBEAT_RESPONSE


_HEARTBEAT_HEAD = (
    ("group_id", _string()),
    ("member_id", _string()),
    ("member_epoch", Int32),
    ("instance_id", _string()),
    ("rack_id", _string()),
    ("rebalance_timeout_ms", Int32),
    ("subscribed_topic_names", CompactArray(_string())),
)
_HEARTBEAT_TAIL = (
    ("server_assignor", _string()),
    ("topic_partitions", _TOPIC_PARTITIONS),
    ("tags", TaggedFields),
)


class ConsumerGroupHeartbeatRequest_v0(RequestStruct):  # type: ignore[misc]
    API_KEY = CONSUMER_GROUP_HEARTBEAT
    API_VERSION = 0
    FLEXIBLE_VERSION = True
    RESPONSE_TYPE = ConsumerGroupHeartbeatResponse_v0
    SCHEMA = Schema(*_HEARTBEAT_HEAD, *_HEARTBEAT_TAIL)


class ConsumerGroupHeartbeatRequest_v1(RequestStruct):  # type: ignore[misc]
    API_KEY = CONSUMER_GROUP_HEARTBEAT
    API_VERSION = 1
    FLEXIBLE_VERSION = True
    RESPONSE_TYPE = ConsumerGroupHeartbeatResponse_v1
    SCHEMA = Schema(*_HEARTBEAT_HEAD, ("subscribed_topic_regex", _string()), *_HEARTBEAT_TAIL)


@dataclass(frozen=True, slots=True)
class HeartbeatFields:
    """What one heartbeat says; ``None`` (and ``-1`` for the rebalance timeout) where a
    field did not change since the last heartbeat the coordinator answered.

    Attributes:
        member_id: the member id (made by the member, kept for its lifetime).
        member_epoch: the member's epoch; ``0`` joins, ``-1`` leaves, ``-2`` leaves as a
            static member that comes back.
        instance_id: the static member's instance id.
        rebalance_timeout_ms: how long the coordinator waits for a revocation.
        subscribed_topic_names: the subscribed topics.
        subscribed_topic_regex: the subscribed pattern (Kafka's RE2/J syntax).
        server_assignor: the coordinator's assignor to use.
        owned: the partitions the member owns.
    """

    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rebalance_timeout_ms: int = -1
    subscribed_topic_names: tuple[str, ...] | None = None
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    owned: Assignment | None = None

    @property
    def full(self) -> bool:
        """Whether every field is set (a join, or the first heartbeat after an error)."""
        return self.rebalance_timeout_ms >= 0 and self.owned is not None


def _topic_partitions(partitions: Assignment | None) -> list[tuple[Any, ...]] | None:
    if partitions is None:
        return None
    by_topic: dict[uuid.UUID, list[int]] = collections.defaultdict(list)
    for topic_id, partition in sorted(partitions):
        by_topic[topic_id].append(partition)
    return [(topic_id, parts, _NO_TAGS) for topic_id, parts in by_topic.items()]


def read_assignment(topic_partitions: Iterable[tuple[Any, ...]] | None) -> Assignment:
    """The partitions of a ``topic_partitions`` array (as decoded)."""
    return frozenset(
        (topic_id, partition)
        for topic_id, partitions, _ in topic_partitions or ()
        for partition in partitions
    )


class ConsumerGroupHeartbeatRequest(
    Request[ConsumerGroupHeartbeatRequest_v0 | ConsumerGroupHeartbeatRequest_v1]  # type: ignore[misc]
):
    """One heartbeat of a member of ``group_id`` (version 1, or 0 without a pattern)."""

    API_KEY = CONSUMER_GROUP_HEARTBEAT

    def __init__(self, group_id: str, fields: HeartbeatFields) -> None:
        self.group_id = group_id
        self.fields = fields

    def build(self, request_struct_class: type[Any]) -> Any:
        f = self.fields
        head = (
            self.group_id,
            f.member_id,
            f.member_epoch,
            f.instance_id,
            None,  # rack id: the member names no rack
            f.rebalance_timeout_ms,
            None if f.subscribed_topic_names is None else list(f.subscribed_topic_names),
        )
        tail = (f.server_assignor, _topic_partitions(f.owned), _NO_TAGS)
        if request_struct_class.API_VERSION == 0:
            if f.subscribed_topic_regex is not None:
                raise IncompatibleBrokerVersion(
                    "subscribing by pattern needs ConsumerGroupHeartbeat version 1 "
                    "(Apache Kafka 4.0 or newer)"
                )
            return request_struct_class(*head, *tail)
        return request_struct_class(*head, f.subscribed_topic_regex, *tail)


# ------------------------------------------------------------------- OffsetCommit v9


class OffsetCommitResponse_v9(Response):  # type: ignore[misc]
    API_KEY = 8
    API_VERSION = 9
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "topics",
            CompactArray(
                ("name", _string()),
                (
                    "partitions",
                    CompactArray(
                        ("partition_index", Int32), ("error_code", Int16), ("tags", TaggedFields)
                    ),
                ),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class OffsetCommitRequest_v9(RequestStruct):  # type: ignore[misc]
    API_KEY = 8
    API_VERSION = 9
    FLEXIBLE_VERSION = True
    RESPONSE_TYPE = OffsetCommitResponse_v9
    SCHEMA = Schema(
        ("group_id", _string()),
        ("generation_id_or_member_epoch", Int32),
        ("member_id", _string()),
        ("group_instance_id", _string()),
        (
            "topics",
            CompactArray(
                ("name", _string()),
                (
                    "partitions",
                    CompactArray(
                        ("partition_index", Int32),
                        ("committed_offset", Int64),
                        ("committed_leader_epoch", Int32),
                        ("committed_metadata", _string()),
                        ("tags", TaggedFields),
                    ),
                ),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class OffsetCommitRequest(Request[OffsetCommitRequest_v9]):  # type: ignore[misc]
    """Offsets of a group's partitions, committed as the member with ``member_epoch``."""

    API_KEY = 8

    def __init__(
        self,
        group_id: str,
        member_epoch: int,
        member_id: str,
        instance_id: str | None,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
    ) -> None:
        self.head = (group_id, member_epoch, member_id, instance_id)
        by_topic: dict[str, list[tuple[Any, ...]]] = collections.defaultdict(list)
        for tp, committed in sorted(offsets.items()):
            # -1: no leader epoch known (the coordinator then does not check it)
            by_topic[tp.topic].append(
                (tp.partition, committed.offset, -1, committed.metadata, _NO_TAGS)
            )
        self.topics = [(topic, parts, _NO_TAGS) for topic, parts in by_topic.items()]

    def build(self, request_struct_class: type[OffsetCommitRequest_v9]) -> Any:
        return request_struct_class(*self.head, self.topics, _NO_TAGS)


# ---------------------------------------------------------------------- Metadata v12


class MetadataResponse_v12(Response):  # type: ignore[misc]
    API_KEY = 3
    API_VERSION = 12
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "brokers",
            CompactArray(
                ("node_id", Int32),
                ("host", _string()),
                ("port", Int32),
                ("rack", _string()),
                ("tags", TaggedFields),
            ),
        ),
        ("cluster_id", _string()),
        ("controller_id", Int32),
        (
            "topics",
            CompactArray(
                ("error_code", Int16),
                ("name", _string()),
                ("topic_id", Uuid),
                ("is_internal", Boolean),
                (
                    "partitions",
                    CompactArray(
                        ("error_code", Int16),
                        ("partition_index", Int32),
                        ("leader_id", Int32),
                        ("leader_epoch", Int32),
                        ("replica_nodes", CompactArray(Int32)),
                        ("isr_nodes", CompactArray(Int32)),
                        ("offline_replicas", CompactArray(Int32)),
                        ("tags", TaggedFields),
                    ),
                ),
                ("topic_authorized_operations", Int32),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class MetadataRequest_v12(RequestStruct):  # type: ignore[misc]
    API_KEY = 3
    API_VERSION = 12
    FLEXIBLE_VERSION = True
    RESPONSE_TYPE = MetadataResponse_v12
    SCHEMA = Schema(
        ("topics", CompactArray(("topic_id", Uuid), ("name", _string()), ("tags", TaggedFields))),
        ("allow_auto_topic_creation", Boolean),
        ("include_topic_authorized_operations", Boolean),
        ("tags", TaggedFields),
    )


class TopicIdsRequest(Request[MetadataRequest_v12]):  # type: ignore[misc]
    """The metadata of topics named by name or by id (``None``: every topic), never
    creating one."""

    API_KEY = 3

    def __init__(
        self, names: Iterable[str] = (), ids: Iterable[uuid.UUID] = (), *, every: bool = False
    ) -> None:
        topics: list[tuple[Any, ...]] = [(ZERO_UUID, n, _NO_TAGS) for n in sorted(set(names))]
        topics += [(topic_id, None, _NO_TAGS) for topic_id in sorted(set(ids))]
        self.topics: list[tuple[Any, ...]] | None = None if every else topics

    def build(self, request_struct_class: type[MetadataRequest_v12]) -> Any:
        return request_struct_class(self.topics, False, False, _NO_TAGS)
