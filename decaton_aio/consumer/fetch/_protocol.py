"""The fetch loop's requests on the wire: Fetch versions 11 and 12 with their session
fields, their responses read in one pass, and ListOffsets for the reset policy.

Fetch 11 is the newest version aiokafka's protocol types describe, and it has what the
loop needs but one thing: fetch sessions (from version 7), ``read_committed`` (aborted
transactions in the response), the current leader epoch per partition (from 9) and the
rack (11). Version 12, the first flexible one (compact strings and arrays, tagged fields),
adds each partition's last fetched epoch: the leader epoch of the last record batch the
client read. The leader checks it against its own log and, where the log diverged from
what the client read (a leader elected without the records the client had fetched), answers
with the epoch and end offset where its log and the client's history part
(``diverging``) instead of records. Version 12 is sent to a broker that serves it
(aiokafka's connection picks the highest version both sides know), version 11 otherwise.
The request is built on aiokafka's schema types; the responses are read here with `struct`
over the bytes of the frame rather than through aiokafka's generic schema decoder: one
pass, no tuple per field, and each partition's records kept as the bytes the batch reader
takes.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from io import BytesIO
from typing import Any, Final

from aiokafka import TopicPartition

from decaton_aio._aiokafka import (
    CompactArray,
    CompactBytes,
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
    protocol_fetch,
    protocol_offset,
)
from decaton_aio.consumer.fetch._session import FetchPlan

__all__ = [
    "EARLIEST",
    "LATEST",
    "NO_EPOCH",
    "FetchRequest",
    "FetchRequestV11",
    "FetchRequestV12",
    "FetchResponse",
    "FetchResponseV12",
    "PartitionData",
    "list_offsets_request",
    "read_list_offsets",
]

#: ListOffsets timestamps of the reset policy.
EARLIEST: Final = -2
LATEST: Final = -1
#: No leader epoch: the broker checks none.
NO_EPOCH: Final = -1

_HEAD = struct.Struct(">ihii")  # throttle_time_ms, error_code, session_id, topic count
_PARTITION = struct.Struct(">ihqqqi")  # partition, error, hw, lso, log start, aborted count
_ABORTED = struct.Struct(">qq")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I32I32 = struct.Struct(">ii")
# flexible versions (12)
_HEAD12 = struct.Struct(">ihi")  # throttle_time_ms, error_code, session_id
_PARTITION12 = struct.Struct(">ihqqq")  # partition, error, hw, lso, log start
_EPOCH_END = struct.Struct(">iq")  # the diverging epoch's epoch and end offset
#: The tag of a partition's diverging epoch in a version 12 response.
_DIVERGING_EPOCH_TAG: Final = 0


class PartitionData:
    """One partition of a fetch response.

    Attributes:
        tp: the partition.
        error_code: its error (0: none).
        highwater, last_stable_offset, log_start_offset: as the leader knows them (-1:
            unknown).
        aborted: ``(producer id, first offset)`` of the aborted transactions among the
            records (``read_committed`` only), or None.
        records: the record batches, as bytes (``b""`` for none).
        preferred_read_replica: the replica the leader asks the client to fetch the
            partition from instead (KIP-392; -1: the leader itself). Its records are
            then empty.
        diverging: ``(epoch, end offset)`` where the leader's log parts from the last
            fetched epoch the request named (version 12 on), or None. Its records are
            then empty.
    """

    __slots__ = (
        "aborted",
        "diverging",
        "error_code",
        "highwater",
        "last_stable_offset",
        "log_start_offset",
        "preferred_read_replica",
        "records",
        "tp",
    )

    def __init__(
        self,
        tp: TopicPartition,
        error_code: int,
        highwater: int,
        last_stable_offset: int,
        log_start_offset: int,
        aborted: list[tuple[int, int]] | None,
        records: bytes,
        preferred_read_replica: int = -1,
        diverging: tuple[int, int] | None = None,
    ) -> None:
        self.tp = tp
        self.error_code = error_code
        self.highwater = highwater
        self.last_stable_offset = last_stable_offset
        self.log_start_offset = log_start_offset
        self.aborted = aborted
        self.records = records
        self.preferred_read_replica = preferred_read_replica
        self.diverging = diverging

    def __repr__(self) -> str:
        return (
            f"PartitionData({self.tp.topic}-{self.tp.partition}, error={self.error_code}, "
            f"hw={self.highwater}, records={len(self.records)} bytes)"
        )


class FetchResponse(Response):  # type: ignore[misc]
    """A fetch response of version 11, read by `decode()`.

    Attributes:
        throttle_time_ms: how long the broker asks the client to wait before the next
            request to it.
        error_code: the error of the whole response (a session error).
        session_id: the session the broker holds for the client (0: none).
        partitions: the partitions answered, in the response's order.
    """

    API_KEY = 1
    API_VERSION = 11
    SCHEMA = protocol_fetch.FetchResponse_v11.SCHEMA

    def __init__(
        self,
        throttle_time_ms: int,
        error_code: int,
        session_id: int,
        partitions: list[PartitionData],
    ) -> None:
        self.throttle_time_ms = throttle_time_ms
        self.error_code = error_code
        self.session_id = session_id
        self.partitions = partitions

    @classmethod
    def decode(cls, data: BytesIO | bytes) -> FetchResponse:
        """Read a response body (after its header)."""
        if isinstance(data, BytesIO):
            buf = data.getvalue()
            pos = data.tell()
        else:
            buf, pos = data, 0
        throttle, error, session_id, topics = _HEAD.unpack_from(buf, pos)
        pos += _HEAD.size
        partitions: list[PartitionData] = []
        unpack_partition, unpack_i32, unpack_aborted = (
            _PARTITION.unpack_from,
            _I32.unpack_from,
            _ABORTED.unpack_from,
        )
        for _ in range(max(topics, 0)):
            (length,) = _I16.unpack_from(buf, pos)
            pos += 2
            topic = buf[pos : pos + length].decode("utf-8")
            pos += length
            (count,) = unpack_i32(buf, pos)
            pos += 4
            for _ in range(max(count, 0)):
                partition, code, high, stable, start, n_aborted = unpack_partition(buf, pos)
                pos += _PARTITION.size
                aborted: list[tuple[int, int]] | None = None
                if n_aborted >= 0:
                    aborted = []
                    for _ in range(n_aborted):
                        aborted.append(unpack_aborted(buf, pos))
                        pos += 16
                replica, size = _I32I32.unpack_from(buf, pos)
                pos += 8
                records = b""
                if size > 0:
                    records = buf[pos : pos + size]
                    pos += size
                partitions.append(
                    PartitionData(
                        TopicPartition(topic, partition),
                        code,
                        high,
                        stable,
                        start,
                        aborted,
                        records,
                        replica,
                    )
                )
        return cls(throttle, error, session_id, partitions)

    def __repr__(self) -> str:
        return (
            f"FetchResponse(throttle_time_ms={self.throttle_time_ms}, error={self.error_code}, "
            f"session_id={self.session_id}, partitions={len(self.partitions)})"
        )


def _uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    """An unsigned varint at ``pos`` and the position after it."""
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 28:
            raise ValueError("an unsigned varint longer than 5 bytes")


def _diverging(buf: bytes, pos: int) -> tuple[tuple[int, int] | None, int]:
    """A partition's tagged fields at ``pos``: its diverging epoch (None without one) and
    the position after them."""
    diverging = None
    count, pos = _uvarint(buf, pos)
    for _ in range(count):
        tag, pos = _uvarint(buf, pos)
        size, pos = _uvarint(buf, pos)
        if tag == _DIVERGING_EPOCH_TAG:
            diverging = _EPOCH_END.unpack_from(buf, pos)
        pos += size
    return diverging, pos


def _skip_tags(buf: bytes, pos: int) -> int:
    count, pos = _uvarint(buf, pos)
    for _ in range(count):
        _, pos = _uvarint(buf, pos)
        size, pos = _uvarint(buf, pos)
        pos += size
    return pos


class FetchResponseV12(FetchResponse):
    """A fetch response of version 12 (flexible), read by `decode()`; each partition's
    diverging epoch (tag 0) is read, its other tagged fields skipped."""

    API_VERSION = 12
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("error_code", Int16),
        ("session_id", Int32),
        (
            "responses",
            CompactArray(
                ("topic", CompactString("utf-8")),
                (
                    "partitions",
                    CompactArray(
                        ("partition_index", Int32),
                        ("error_code", Int16),
                        ("high_watermark", Int64),
                        ("last_stable_offset", Int64),
                        ("log_start_offset", Int64),
                        (
                            "aborted_transactions",
                            CompactArray(
                                ("producer_id", Int64),
                                ("first_offset", Int64),
                                ("tags", TaggedFields),
                            ),
                        ),
                        ("preferred_read_replica", Int32),
                        ("records", CompactBytes),
                        # tag 0: the diverging epoch (epoch Int32, end offset Int64, tags)
                        ("tags", TaggedFields),
                    ),
                ),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )

    @classmethod
    def decode(cls, data: BytesIO | bytes) -> FetchResponseV12:
        """Read a response body (after its header)."""
        if isinstance(data, BytesIO):
            buf = data.getvalue()
            pos = data.tell()
        else:
            buf, pos = data, 0
        throttle, error, session_id = _HEAD12.unpack_from(buf, pos)
        pos += _HEAD12.size
        partitions: list[PartitionData] = []
        unpack_partition, unpack_aborted = _PARTITION12.unpack_from, _ABORTED.unpack_from
        unpack_i32 = _I32.unpack_from
        topics, pos = _uvarint(buf, pos)
        for _ in range(topics - 1):
            length, pos = _uvarint(buf, pos)
            topic = buf[pos : pos + length - 1].decode("utf-8")
            pos += length - 1
            count, pos = _uvarint(buf, pos)
            for _ in range(count - 1):
                partition, code, high, stable, start = unpack_partition(buf, pos)
                pos += _PARTITION12.size
                n_aborted, pos = _uvarint(buf, pos)
                aborted: list[tuple[int, int]] | None = None
                if n_aborted:
                    aborted = []
                    for _ in range(n_aborted - 1):
                        aborted.append(unpack_aborted(buf, pos))
                        pos = _skip_tags(buf, pos + 16)
                (replica,) = unpack_i32(buf, pos)
                size, pos = _uvarint(buf, pos + 4)
                records = b""
                if size > 1:
                    records = buf[pos : pos + size - 1]
                    pos += size - 1
                diverging = None
                if buf[pos]:
                    diverging, pos = _diverging(buf, pos)
                else:
                    pos += 1
                partitions.append(
                    PartitionData(
                        TopicPartition(topic, partition),
                        code,
                        high,
                        stable,
                        start,
                        aborted,
                        records,
                        replica,
                        diverging,
                    )
                )
            pos = _skip_tags(buf, pos)
        return cls(throttle, error, session_id, partitions)


class FetchRequestV11(RequestStruct):  # type: ignore[misc]
    """Fetch version 11 as aiokafka's schema has it, answered by `FetchResponse`."""

    API_KEY = 1
    API_VERSION = 11
    RESPONSE_TYPE = FetchResponse
    SCHEMA = protocol_fetch.FetchRequest_v11.SCHEMA


_FETCH_PARTITION_V12 = CompactArray(
    ("partition", Int32),
    ("current_leader_epoch", Int32),
    ("fetch_offset", Int64),
    ("last_fetched_epoch", Int32),
    ("log_start_offset", Int64),
    ("partition_max_bytes", Int32),
    ("tags", TaggedFields),
)


_HEAD_V12 = struct.Struct(">iiiibii")  # replica id ... session epoch
_FETCH_PARTITION = struct.Struct(">iiqiqi")  # partition ... partition max bytes
_NO_TAG: Final = b"\x00"  # an empty tagged-field section


def _uvarint_bytes(value: int) -> bytes:
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _compact_string(text: str) -> bytes:
    raw = text.encode("utf-8")
    return _uvarint_bytes(len(raw) + 1) + raw


class FetchRequestV12(RequestStruct):  # type: ignore[misc]
    """Fetch version 12, the first flexible one: each partition's last fetched epoch.

    Written by `encode()` with `struct` rather than by the schema's generic writer (a
    seventh of the time on 96 partitions); no tagged field is written (the loop sends
    none). The schema reads it back.
    """

    API_KEY = 1
    API_VERSION = 12
    FLEXIBLE_VERSION = True
    RESPONSE_TYPE = FetchResponseV12
    SCHEMA = Schema(
        ("replica_id", Int32),
        ("max_wait_ms", Int32),
        ("min_bytes", Int32),
        ("max_bytes", Int32),
        ("isolation_level", Int8),
        ("session_id", Int32),
        ("session_epoch", Int32),
        (
            "topics",
            CompactArray(
                ("topic", CompactString("utf-8")),
                ("partitions", _FETCH_PARTITION_V12),
                ("tags", TaggedFields),
            ),
        ),
        (
            "forgotten_topics_data",
            CompactArray(
                ("topic", CompactString("utf-8")),
                ("partitions", CompactArray(Int32)),
                ("tags", TaggedFields),
            ),
        ),
        ("rack_id", CompactString("utf-8")),
        ("tags", TaggedFields),
    )

    def encode(self) -> bytes:
        fields = self.__dict__
        out = [
            _HEAD_V12.pack(
                fields["replica_id"],
                fields["max_wait_ms"],
                fields["min_bytes"],
                fields["max_bytes"],
                fields["isolation_level"],
                fields["session_id"],
                fields["session_epoch"],
            ),
            _uvarint_bytes(len(fields["topics"]) + 1),
        ]
        append, pack = out.append, _FETCH_PARTITION.pack
        for topic, partitions, _ in fields["topics"]:
            append(_compact_string(topic))
            append(_uvarint_bytes(len(partitions) + 1))
            for partition, leader_epoch, offset, epoch, log_start, max_bytes, _ in partitions:
                append(pack(partition, leader_epoch, offset, epoch, log_start, max_bytes))
                append(_NO_TAG)
            append(_NO_TAG)
        forgotten = fields["forgotten_topics_data"]
        append(_uvarint_bytes(len(forgotten) + 1))
        for topic, partitions, _ in forgotten:
            append(_compact_string(topic))
            append(_uvarint_bytes(len(partitions) + 1))
            append(struct.pack(f">{len(partitions)}i", *partitions))
            append(_NO_TAG)
        append(_compact_string(fields["rack_id"]))
        append(_NO_TAG)
        return b"".join(out)


def _by_topic(
    partitions: Mapping[TopicPartition, Any] | Sequence[TopicPartition],
) -> dict[str, list[Any]]:
    grouped: dict[str, list[Any]] = {}
    for tp in partitions:
        grouped.setdefault(tp.topic, []).append(tp)
    return grouped


_NO_TAGS: Final[dict[int, bytes]] = {}


class FetchRequest(Request[FetchRequestV11 | FetchRequestV12]):  # type: ignore[misc]
    """The fetch request of a session's plan, in the newest version the broker serves
    of 11 and 12 (11 leaves the last fetched epochs out).

    Args:
        plan: what the request names (see `FetchSession.plan()`).
        max_wait_ms, min_bytes: how long the broker may hold the request for how many
            bytes.
        max_bytes: the most bytes of the whole response.
        isolation_level: 0 read_uncommitted, 1 read_committed.
        rack_id: the client's rack ("" for none).
    """

    API_KEY = 1

    def __init__(
        self,
        plan: FetchPlan,
        max_wait_ms: int,
        min_bytes: int,
        max_bytes: int,
        isolation_level: int,
        rack_id: str = "",
    ) -> None:
        self.plan = plan
        self.fields = (max_wait_ms, min_bytes, max_bytes, isolation_level)
        self.rack_id = rack_id

    def build(self, request_struct_class: type[FetchRequestV11 | FetchRequestV12]) -> Any:
        plan = self.plan
        named = plan.named
        grouped = _by_topic(named).items()
        forgotten = _by_topic(plan.forgotten).items()
        # NO_EPOCH as the current leader epoch: the leader checks none; -1 as the log
        # start offset: a consumer's is none.
        if request_struct_class.API_VERSION < 12:
            return request_struct_class(
                -1,  # replica id: a consumer
                *self.fields,
                plan.session_id,
                plan.epoch,
                [
                    (
                        topic,
                        [(tp.partition, NO_EPOCH, named[tp][0], -1, named[tp][1]) for tp in tps],
                    )
                    for topic, tps in grouped
                ],
                [(topic, [tp.partition for tp in tps]) for topic, tps in forgotten],
                self.rack_id,
            )
        return request_struct_class(
            -1,
            *self.fields,
            plan.session_id,
            plan.epoch,
            [
                (
                    topic,
                    [
                        (tp.partition, NO_EPOCH, offset, epoch, -1, max_bytes, _NO_TAGS)
                        for tp in tps
                        for offset, max_bytes, epoch in (named[tp],)
                    ],
                    _NO_TAGS,
                )
                for topic, tps in grouped
            ],
            [(topic, [tp.partition for tp in tps], _NO_TAGS) for topic, tps in forgotten],
            self.rack_id,
            _NO_TAGS,
        )


def list_offsets_request(wanted: Mapping[TopicPartition, int], isolation_level: int) -> Any:
    """A ListOffsets request for ``wanted`` (partition -> `EARLIEST` or `LATEST`)."""
    topics = [
        (topic, [(tp.partition, wanted[tp]) for tp in tps])
        for topic, tps in _by_topic(wanted).items()
    ]
    return protocol_offset.OffsetRequest(-1, isolation_level, topics)


def read_list_offsets(response: Any) -> dict[TopicPartition, tuple[int, int]]:
    """``partition -> (error code, offset)`` of a ListOffsets response (version 1 on)."""
    found: dict[TopicPartition, tuple[int, int]] = {}
    for topic, partitions in response.topics:
        for partition, error_code, _timestamp, offset, *_ in partitions:
            found[TopicPartition(topic, partition)] = (error_code, offset)
    return found
