"""The fetch loop's requests on the wire: Fetch version 11 with its session fields, its
response read in one pass, and ListOffsets for the reset policy.

Fetch 11 is the newest version aiokafka's protocol types describe, and it has what the
loop needs: fetch sessions (from version 7), ``read_committed`` (aborted transactions in
the response), the current leader epoch per partition (from 9) and the rack (11). The
request is aiokafka's schema; the response is read here with `struct` over the bytes of
the frame rather than through aiokafka's generic schema decoder: one pass, no tuple per
field, and each partition's records kept as the bytes the batch reader takes.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from io import BytesIO
from typing import Any, Final

from aiokafka import TopicPartition

from decaton_aio._aiokafka import Request, RequestStruct, Response, protocol_fetch, protocol_offset
from decaton_aio.consumer.fetch._session import FetchPlan

__all__ = [
    "EARLIEST",
    "LATEST",
    "FetchRequest",
    "FetchResponse",
    "PartitionData",
    "list_offsets_request",
    "read_list_offsets",
]

#: ListOffsets timestamps of the reset policy.
EARLIEST: Final = -2
LATEST: Final = -1

_HEAD = struct.Struct(">ihii")  # throttle_time_ms, error_code, session_id, topic count
_PARTITION = struct.Struct(">ihqqqi")  # partition, error, hw, lso, log start, aborted count
_ABORTED = struct.Struct(">qq")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I32I32 = struct.Struct(">ii")


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
    """

    __slots__ = (
        "aborted",
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
    ) -> None:
        self.tp = tp
        self.error_code = error_code
        self.highwater = highwater
        self.last_stable_offset = last_stable_offset
        self.log_start_offset = log_start_offset
        self.aborted = aborted
        self.records = records
        self.preferred_read_replica = preferred_read_replica

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


class FetchRequestV11(RequestStruct):  # type: ignore[misc]
    """Fetch version 11 as aiokafka's schema has it, answered by `FetchResponse`."""

    API_KEY = 1
    API_VERSION = 11
    RESPONSE_TYPE = FetchResponse
    SCHEMA = protocol_fetch.FetchRequest_v11.SCHEMA


def _by_topic(
    partitions: Mapping[TopicPartition, Any] | Sequence[TopicPartition],
) -> dict[str, list[Any]]:
    grouped: dict[str, list[Any]] = {}
    for tp in partitions:
        grouped.setdefault(tp.topic, []).append(tp)
    return grouped


class FetchRequest(Request[FetchRequestV11]):  # type: ignore[misc]
    """The fetch request of a session's plan.

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

    def build(self, request_struct_class: type[FetchRequestV11]) -> Any:
        plan = self.plan
        named = plan.named
        topics = [
            (
                topic,
                [
                    # -1: no current leader epoch known (the leader does not check it),
                    # -1: the log start offset (a consumer's is none)
                    (tp.partition, -1, named[tp][0], -1, named[tp][1])
                    for tp in tps
                ],
            )
            for topic, tps in _by_topic(named).items()
        ]
        forgotten = [
            (topic, [tp.partition for tp in tps])
            for topic, tps in _by_topic(plan.forgotten).items()
        ]
        return request_struct_class(
            -1,  # replica id: a consumer
            *self.fields,
            plan.session_id,
            plan.epoch,
            topics,
            forgotten,
            self.rack_id,
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
