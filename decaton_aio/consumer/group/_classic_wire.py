"""The classic group protocol's requests beyond the versions aiokafka builds.

aiokafka's ``Heartbeat`` (v0-1), ``LeaveGroup`` (v0-1) and ``OffsetCommit`` (v2-3) carry no
``group.instance.id``: a static member's heartbeat could then not be told it was fenced
by another process with its id (``FENCED_INSTANCE_ID``), and its commits would not be
checked against it. Each request here adds the version that carries it (``Heartbeat``
v3, ``LeaveGroup`` v3, ``OffsetCommit`` v7, all of them still non-flexible) to aiokafka's
older ones; the connection picks the highest version the broker offers.
``JoinGroup`` (v5) and ``SyncGroup`` (v3) are aiokafka's.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from typing import Any

from aiokafka import TopicPartition
from aiokafka.structs import OffsetAndMetadata

from decaton_aio._aiokafka import (
    Array,
    Int16,
    Int32,
    Int64,
    Request,
    RequestStruct,
    Response,
    Schema,
    String,
    protocol_commit,
    protocol_group,
)

__all__ = [
    "HeartbeatRequest",
    "JoinGroupRequest",
    "LeaveGroupRequest",
    "OffsetCommitRequest",
    "SyncGroupRequest",
]

JoinGroupRequest = protocol_group.JoinGroupRequest
SyncGroupRequest = protocol_group.SyncGroupRequest

# ------------------------------------------------------------------- Heartbeat v3


class HeartbeatResponse_v3(Response):  # type: ignore[misc]
    API_KEY = 12
    API_VERSION = 3
    SCHEMA = Schema(("throttle_time_ms", Int32), ("error_code", Int16))


class HeartbeatRequest_v3(RequestStruct):  # type: ignore[misc]
    API_KEY = 12
    API_VERSION = 3
    RESPONSE_TYPE = HeartbeatResponse_v3
    SCHEMA = Schema(
        ("group", String("utf-8")),
        ("generation_id", Int32),
        ("member_id", String("utf-8")),
        ("group_instance_id", String("utf-8")),
    )


_HeartbeatStructs = (
    protocol_group.HeartbeatRequest_v0 | protocol_group.HeartbeatRequest_v1 | HeartbeatRequest_v3
)


class HeartbeatRequest(Request[_HeartbeatStructs]):  # type: ignore[misc]
    """A member's heartbeat; from version 3 with its instance id."""

    API_KEY = 12

    def __init__(
        self, group: str, generation_id: int, member_id: str, group_instance_id: str | None
    ) -> None:
        self._fields = (group, generation_id, member_id)
        self._instance = group_instance_id

    def build(self, request_struct_class: Any) -> Any:
        if request_struct_class.API_VERSION >= 3:
            return request_struct_class(*self._fields, self._instance)
        return request_struct_class(*self._fields)


# ------------------------------------------------------------------ LeaveGroup v3


class LeaveGroupResponse_v3(Response):  # type: ignore[misc]
    API_KEY = 13
    API_VERSION = 3
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("error_code", Int16),
        (
            "members",
            Array(
                ("member_id", String("utf-8")),
                ("group_instance_id", String("utf-8")),
                ("error_code", Int16),
            ),
        ),
    )


class LeaveGroupRequest_v3(RequestStruct):  # type: ignore[misc]
    API_KEY = 13
    API_VERSION = 3
    RESPONSE_TYPE = LeaveGroupResponse_v3
    SCHEMA = Schema(
        ("group", String("utf-8")),
        ("members", Array(("member_id", String("utf-8")), ("group_instance_id", String("utf-8")))),
    )


_LeaveStructs = (
    protocol_group.LeaveGroupRequest_v0 | protocol_group.LeaveGroupRequest_v1 | LeaveGroupRequest_v3
)


class LeaveGroupRequest(Request[_LeaveStructs]):  # type: ignore[misc]
    """One member leaving its group."""

    API_KEY = 13

    def __init__(self, group: str, member_id: str, group_instance_id: str | None) -> None:
        self._group = group
        self._member = (member_id, group_instance_id)

    def build(self, request_struct_class: Any) -> Any:
        if request_struct_class.API_VERSION >= 3:
            return request_struct_class(self._group, [self._member])
        return request_struct_class(self._group, self._member[0])


# ---------------------------------------------------------------- OffsetCommit v7


class OffsetCommitResponse_v7(Response):  # type: ignore[misc]
    API_KEY = 8
    API_VERSION = 7
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "topics",
            Array(
                ("topic", String("utf-8")),
                ("partitions", Array(("partition", Int32), ("error_code", Int16))),
            ),
        ),
    )


class OffsetCommitRequest_v7(RequestStruct):  # type: ignore[misc]
    API_KEY = 8
    API_VERSION = 7
    RESPONSE_TYPE = OffsetCommitResponse_v7
    SCHEMA = Schema(
        ("group", String("utf-8")),
        ("generation_id", Int32),
        ("member_id", String("utf-8")),
        ("group_instance_id", String("utf-8")),
        (
            "topics",
            Array(
                ("topic", String("utf-8")),
                (
                    "partitions",
                    Array(
                        ("partition", Int32),
                        ("offset", Int64),
                        ("leader_epoch", Int32),
                        ("metadata", String("utf-8")),
                    ),
                ),
            ),
        ),
    )


_CommitStructs = (
    protocol_commit.OffsetCommitRequest_v2
    | protocol_commit.OffsetCommitRequest_v3
    | OffsetCommitRequest_v7
)


class OffsetCommitRequest(Request[_CommitStructs]):  # type: ignore[misc]
    """A member's offsets, checked against its generation (and from version 7 its
    instance id). Responses of every version read ``topics`` as
    ``(topic, [(partition, error_code)])``."""

    API_KEY = 8

    def __init__(
        self,
        group: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
    ) -> None:
        self._member = (group, generation_id, member_id)
        self._instance = group_instance_id
        by_topic: dict[str, list[tuple[int, int, str]]] = collections.defaultdict(list)
        for tp, committed in sorted(offsets.items()):
            by_topic[tp.topic].append((tp.partition, committed.offset, committed.metadata))
        self._topics = sorted(by_topic.items())

    def build(self, request_struct_class: Any) -> Any:
        if request_struct_class.API_VERSION >= 7:
            topics = [
                (topic, [(p, offset, -1, metadata) for p, offset, metadata in parts])
                for topic, parts in self._topics
            ]
            return request_struct_class(*self._member, self._instance, topics)
        # v2-3: a retention time (-1: the broker's) instead of the instance id
        return request_struct_class(*self._member, -1, self._topics)
