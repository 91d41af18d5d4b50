"""Transactional offset commits that carry the consumer group's metadata, and offset reads
that wait for them.

aiokafka 0.14 commits a transaction's offsets with ``TxnOffsetCommit`` version 0, which
names the group only: the group coordinator cannot tell a member that lost its partitions
(a zombie: frozen past its session timeout, cut off from the coordinator) from their new
owner. This module adds, on aiokafka's own protocol classes:

- ``TxnOffsetCommit`` version 3 (a flexible version: compact strings, tagged fields),
  which carries the member's generation, member id and group instance id. The coordinator
  refuses the offsets of a member whose generation is over (``ILLEGAL_GENERATION``,
  ``UNKNOWN_MEMBER_ID``, ``FENCED_INSTANCE_ID``), so a zombie's transaction cannot commit:
  it aborts. `send_group_metadata()` makes a transactional producer send its offset
  commits this way.
- ``OffsetFetch`` version 7 with ``require_stable``: while a transaction holding offsets
  of a partition is still open, the coordinator answers ``UNSTABLE_OFFSET_COMMIT`` for it.
  `read_stable_offsets()` asks again until every partition is stable, so a new owner
  never starts from an offset a transaction of the previous owner may still change.

Together they let one transactional producer serve all the partitions of a consumer, with
a transactional id of its own (the model of Kafka's ``exactly_once_v2``), instead of one
producer per partition fenced by a shared transactional id.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import (
    CommitFailedError,
    GroupAuthorizationFailedError,
    IncompatibleBrokerVersion,
    KafkaError,
    ProducerFenced,
    UnsupportedVersionError,
    for_code,
)
from aiokafka.structs import OffsetAndMetadata

from decaton_aio._aiokafka import (
    Boolean,
    CompactArray,
    CompactString,
    CoordinationType,
    Int16,
    Int32,
    Int64,
    OffsetCommitHandler,
    Request,
    RequestStruct,
    Response,
    Schema,
    TaggedFields,
    client_of,
    find_coordinator,
    group_member,
    mark_coordinator_dead,
    replace_txn_offset_commit,
    sender_of,
    txn_manager,
)

__all__ = [
    "GenerationOverError",
    "GroupMetadata",
    "OffsetFetchRequest",
    "TxnOffsetCommitRequest",
    "group_metadata",
    "read_stable_offsets",
    "send_group_metadata",
]

# Error codes (Kafka's protocol).
_NOT_COORDINATOR = {14, 15, 16}  # load in progress, not available, not coordinator
_LOAD_IN_PROGRESS = 14
_UNKNOWN_TOPIC_OR_PARTITION = 3
_REQUEST_TIMED_OUT = 7
#: The member's generation is over: the group gave its partitions to someone else.
_GENERATION_OVER = {
    22: "ILLEGAL_GENERATION",
    25: "UNKNOWN_MEMBER_ID",
    27: "REBALANCE_IN_PROGRESS",
    82: "FENCED_INSTANCE_ID",
    110: "FENCED_MEMBER_EPOCH",  # a consumer-protocol member's epoch is over
    113: "STALE_MEMBER_EPOCH",  # a consumer-protocol member's epoch moved on
}
_FENCED_PRODUCER = {47, 90}  # INVALID_PRODUCER_EPOCH, PRODUCER_FENCED
UNSTABLE_OFFSET_COMMIT = 88

_NO_TAGS: dict[int, bytes] = {}


class GenerationOverError(CommitFailedError):  # type: ignore[misc]
    """The group refused a transaction's offsets: the member's generation is over (its
    partitions belong to another member now) or it is not in the group."""

    def __init__(self, message: str) -> None:
        KafkaError.__init__(self, message)


@dataclass(frozen=True, slots=True)
class GroupMetadata:
    """Who commits: the consumer's place in its group, as the coordinator checks it.

    Attributes:
        generation_id: the group generation the member joined (``-1`` when not joined).
        member_id: the member id the coordinator gave it (empty when not joined).
        group_instance_id: its static membership id, if any.
    """

    generation_id: int
    member_id: str
    group_instance_id: str | None = None

    @property
    def joined(self) -> bool:
        """Whether the member is in a generation (a commit without one is not checked)."""
        return self.generation_id >= 0 and bool(self.member_id)


def group_metadata(consumer: Any) -> GroupMetadata:
    """The group metadata of an aiokafka consumer, as of now."""
    member = group_member(consumer)
    if member is None:
        return GroupMetadata(-1, "")
    return GroupMetadata(*member)


# --------------------------------------------------------------- TxnOffsetCommit v3


class TxnOffsetCommitResponse_v3(Response):  # type: ignore[misc]
    API_KEY = 28
    API_VERSION = 3
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "topics",
            CompactArray(
                ("name", CompactString("utf-8")),
                (
                    "partitions",
                    CompactArray(
                        ("partition_index", Int32),
                        ("error_code", Int16),
                        ("tags", TaggedFields),
                    ),
                ),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class TxnOffsetCommitRequest_v3(RequestStruct):  # type: ignore[misc]
    API_KEY = 28
    API_VERSION = 3
    FLEXIBLE_VERSION = True
    RESPONSE_TYPE = TxnOffsetCommitResponse_v3
    SCHEMA = Schema(
        ("transactional_id", CompactString("utf-8")),
        ("group_id", CompactString("utf-8")),
        ("producer_id", Int64),
        ("producer_epoch", Int16),
        ("generation_id", Int32),
        ("member_id", CompactString("utf-8")),
        ("group_instance_id", CompactString("utf-8")),
        (
            "topics",
            CompactArray(
                ("name", CompactString("utf-8")),
                (
                    "partitions",
                    CompactArray(
                        ("partition_index", Int32),
                        ("committed_offset", Int64),
                        ("committed_leader_epoch", Int32),
                        ("committed_metadata", CompactString("utf-8")),
                        ("tags", TaggedFields),
                    ),
                ),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class TxnOffsetCommitRequest(Request[TxnOffsetCommitRequest_v3]):  # type: ignore[misc]
    """A transaction's offsets for a group, with the committing member's metadata."""

    API_KEY = 28

    def __init__(
        self,
        transactional_id: str,
        group_id: str,
        producer_id: int,
        producer_epoch: int,
        member: GroupMetadata,
        offsets: dict[TopicPartition, OffsetAndMetadata],
    ) -> None:
        self._fields = (transactional_id, group_id, producer_id, producer_epoch)
        self._member = member
        by_topic: dict[str, list[tuple[Any, ...]]] = collections.defaultdict(list)
        for tp, committed in sorted(offsets.items()):
            # -1: no leader epoch known (the coordinator then does not check it)
            by_topic[tp.topic].append(
                (tp.partition, committed.offset, -1, committed.metadata, _NO_TAGS)
            )
        self._topics = [(topic, parts, _NO_TAGS) for topic, parts in by_topic.items()]

    def build(self, request_struct_class: type[TxnOffsetCommitRequest_v3]) -> Any:
        member = self._member
        return request_struct_class(
            *self._fields,
            member.generation_id,
            member.member_id,
            member.group_instance_id,
            self._topics,
            _NO_TAGS,
        )


class _GroupOffsetsHandler(OffsetCommitHandler):
    """aiokafka's handler of a transaction's offset commit, sending version 3."""

    def __init__(
        self,
        sender: Any,
        offsets: dict[TopicPartition, OffsetAndMetadata],
        group_id: str,
        member: GroupMetadata,
    ) -> None:
        super().__init__(sender, offsets, group_id)
        self._member = member

    def create_request(self) -> TxnOffsetCommitRequest:
        txn = txn_manager(self.sender)
        return TxnOffsetCommitRequest(
            txn.transactional_id,
            self.group_id,
            txn.producer_id,
            txn.producer_epoch,
            self._member,
            self.offsets,
        )

    async def do(self, node_id: int) -> bool:
        try:
            return bool(await super().do(node_id))
        except (IncompatibleBrokerVersion, NotImplementedError):
            txn_manager(self.sender).error_transaction(
                UnsupportedVersionError(
                    "exactly-once needs TxnOffsetCommit version 3 (Apache Kafka 2.5 or newer)"
                )
            )
            return True

    def handle_response(self, resp: Any) -> float | None:
        txn = txn_manager(self.sender)
        for topic, partitions, _ in resp.topics:
            for partition, code, _ in partitions:
                tp = TopicPartition(topic, partition)
                if code == 0:
                    txn.offset_committed(tp, self.offsets[tp].offset, self.group_id)
                elif code in _NOT_COORDINATOR or code == _REQUEST_TIMED_OUT:
                    if code != _LOAD_IN_PROGRESS:
                        mark_coordinator_dead(self.sender, CoordinationType.GROUP)
                    return self.default_backoff
                elif code == _UNKNOWN_TOPIC_OR_PARTITION:
                    return self.default_backoff
                elif code in _FENCED_PRODUCER:
                    raise ProducerFenced()
                else:
                    # The transaction cannot commit; the caller aborts it.
                    txn.error_transaction(self._failure(code))
                    return None
        return None

    def _failure(self, code: int) -> KafkaError:
        member = self._member
        if code in _GENERATION_OVER:
            return GenerationOverError(
                f"{_GENERATION_OVER[code]}: generation {member.generation_id} of member "
                f"{member.member_id} is over; the partitions belong to another member"
            )
        error: KafkaError = for_code(code)()
        return error


def send_group_metadata(producer: Any, member: Callable[[], GroupMetadata]) -> None:
    """Make a transactional aiokafka producer commit its transactions' offsets with
    ``TxnOffsetCommit`` version 3 and the metadata ``member()`` gives at each commit.

    A member not in a generation (``member().joined`` is false) commits nothing: its
    transaction fails with `GenerationOverError`, as does one the coordinator finds
    out of date.
    """
    sender = sender_of(producer)

    async def txn_offset_commit(
        offsets: dict[TopicPartition, OffsetAndMetadata], group_id: str
    ) -> None:
        if not offsets:
            return
        txn = txn_manager(sender)
        metadata = member()
        if not metadata.joined:
            # Version 3 without a generation is not checked: never commit that way.
            txn.error_transaction(GenerationOverError("the consumer is not in its group now"))
            return
        try:
            node_id = await find_coordinator(sender, CoordinationType.GROUP, group_id)
        except GroupAuthorizationFailedError as exc:
            txn.error_transaction(exc)
            return
        await _GroupOffsetsHandler(sender, offsets, group_id, metadata).do(node_id)

    replace_txn_offset_commit(producer, txn_offset_commit)


# ----------------------------------------------------- OffsetFetch v7, require_stable


class OffsetFetchResponse_v7(Response):  # type: ignore[misc]
    API_KEY = 9
    API_VERSION = 7
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "topics",
            CompactArray(
                ("name", CompactString("utf-8")),
                (
                    "partitions",
                    CompactArray(
                        ("partition_index", Int32),
                        ("committed_offset", Int64),
                        ("committed_leader_epoch", Int32),
                        ("metadata", CompactString("utf-8")),
                        ("error_code", Int16),
                        ("tags", TaggedFields),
                    ),
                ),
                ("tags", TaggedFields),
            ),
        ),
        ("error_code", Int16),
        ("tags", TaggedFields),
    )


class OffsetFetchRequest_v7(RequestStruct):  # type: ignore[misc]
    API_KEY = 9
    API_VERSION = 7
    FLEXIBLE_VERSION = True
    RESPONSE_TYPE = OffsetFetchResponse_v7
    SCHEMA = Schema(
        ("group_id", CompactString("utf-8")),
        (
            "topics",
            CompactArray(
                ("name", CompactString("utf-8")),
                ("partition_indexes", CompactArray(Int32)),
                ("tags", TaggedFields),
            ),
        ),
        ("require_stable", Boolean),
        ("tags", TaggedFields),
    )


class OffsetFetchRequest(Request[OffsetFetchRequest_v7]):  # type: ignore[misc]
    """The committed offsets of a group's partitions, refused (``UNSTABLE_OFFSET_COMMIT``)
    for a partition whose offsets an open transaction holds."""

    API_KEY = 9

    def __init__(self, group_id: str, tps: Iterable[TopicPartition]) -> None:
        by_topic: dict[str, list[int]] = collections.defaultdict(list)
        for tp in sorted(tps):
            by_topic[tp.topic].append(tp.partition)
        self._group_id = group_id
        self._topics = [(topic, parts, _NO_TAGS) for topic, parts in by_topic.items()]

    def build(self, request_struct_class: type[OffsetFetchRequest_v7]) -> Any:
        return request_struct_class(self._group_id, self._topics, True, _NO_TAGS)


#: How long to wait between two reads while a transaction holds offsets.
STABLE_RETRY_S = 0.1


async def read_stable_offsets(
    admin: Any, group_id: str, tps: list[TopicPartition], *, timeout_s: float
) -> dict[TopicPartition, OffsetAndMetadata]:
    """The committed offsets of ``tps`` (offset ``-1``: none) once no open transaction
    holds any of them.

    Args:
        admin: a started aiokafka admin client.

    Raises:
        TimeoutError: a transaction held them for ``timeout_s``.
        KafkaError: the coordinator refused the request.
    """
    found: dict[TopicPartition, OffsetAndMetadata] = {}
    wanted = list(tps)
    async with asyncio.timeout(timeout_s):
        node_id = await admin.find_coordinator(group_id)
        while wanted:
            try:
                response = await client_of(admin).send(
                    node_id, OffsetFetchRequest(group_id, wanted)
                )
            except (IncompatibleBrokerVersion, NotImplementedError) as exc:
                raise UnsupportedVersionError(
                    "exactly-once needs OffsetFetch version 7 (Apache Kafka 2.5 or newer)"
                ) from exc
            if response.error_code in _NOT_COORDINATOR:
                await asyncio.sleep(STABLE_RETRY_S)
                node_id = await admin.find_coordinator(group_id)
                continue
            if response.error_code:
                raise for_code(response.error_code)(f"cannot read the offsets of {group_id}")
            pending: list[TopicPartition] = []
            for topic, partitions, _ in response.topics:
                for partition, offset, _epoch, metadata, code, _ in partitions:
                    tp = TopicPartition(topic, partition)
                    if code == UNSTABLE_OFFSET_COMMIT or code in _NOT_COORDINATOR:
                        pending.append(tp)
                    elif code:
                        raise for_code(code)(f"cannot read the offset of {topic}-{partition}")
                    else:
                        found[tp] = OffsetAndMetadata(offset, metadata or "")
            wanted = pending
            if wanted:
                await asyncio.sleep(STABLE_RETRY_S)
    return found
