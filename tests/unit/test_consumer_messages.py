"""The consumer group protocol's requests (ConsumerGroupHeartbeat v0/v1, OffsetCommit v9,
Metadata v12): their bytes checked against Kafka's schemas, written out by hand here, and
their answers decoded from bytes built the same way."""

from __future__ import annotations

import struct
import uuid
from io import BytesIO

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import IncompatibleBrokerVersion
from aiokafka.structs import OffsetAndMetadata

from decaton_aio.consumer.group._consumer_messages import (
    ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse_v1,
    HeartbeatFields,
    MetadataResponse_v12,
    OffsetCommitRequest,
    OffsetCommitResponse_v9,
    TopicIdsRequest,
    Uuid,
    kafka_uuid_string,
    read_assignment,
)

T1 = uuid.UUID("00112233-4455-6677-8899-aabbccddeeff")
T2 = uuid.UUID(int=7)


def uvarint(n: int) -> bytes:
    out = b""
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out += bytes([byte | 0x80])
        else:
            return out + bytes([byte])


def cstr(text: str | None) -> bytes:
    # COMPACT_(NULLABLE_)STRING: unsigned varint length + 1 (0: null), then UTF-8.
    if text is None:
        return b"\x00"
    data = text.encode()
    return uvarint(len(data) + 1) + data


def carray(items: list[bytes] | None) -> bytes:
    # COMPACT_ARRAY: unsigned varint count + 1 (0: null), then the items.
    if items is None:
        return b"\x00"
    return uvarint(len(items) + 1) + b"".join(items)


def i32s(values: list[int]) -> bytes:
    return carray([struct.pack(">i", v) for v in values])


NO_TAGS = b"\x00"


def test_full_heartbeat_v1_bytes() -> None:
    fields = HeartbeatFields(
        member_id="m-1",
        member_epoch=0,
        instance_id="i-1",
        rebalance_timeout_ms=30_000,
        subscribed_topic_names=("a", "b"),
        server_assignor="uniform",
        owned=frozenset({(T1, 2), (T1, 0), (T2, 5)}),
    )
    built = ConsumerGroupHeartbeatRequest("g", fields).prepare({68: (0, 1)})
    assert built.API_VERSION == 1
    assert built.FLEXIBLE_VERSION
    topic_partitions = carray(
        [
            T2.bytes + i32s([5]) + NO_TAGS,  # sorted by id: T2 (int 7) < T1
            T1.bytes + i32s([0, 2]) + NO_TAGS,
        ]
    )
    expected = (
        cstr("g")
        + cstr("m-1")
        + struct.pack(">i", 0)
        + cstr("i-1")
        + cstr(None)  # rack id
        + struct.pack(">i", 30_000)
        + carray([cstr("a"), cstr("b")])
        + cstr(None)  # regex (v1)
        + cstr("uniform")
        + topic_partitions
        + NO_TAGS
    )
    assert built.encode() == expected


def test_partial_heartbeat_v0_bytes_and_no_pattern_on_v0() -> None:
    fields = HeartbeatFields(member_id="m", member_epoch=4)
    built = ConsumerGroupHeartbeatRequest("g", fields).prepare({68: (0, 0)})
    assert built.API_VERSION == 0
    expected = (
        cstr("g")
        + cstr("m")
        + struct.pack(">i", 4)
        + cstr(None)
        + cstr(None)
        + struct.pack(">i", -1)
        + carray(None)
        + cstr(None)
        + carray(None)
        + NO_TAGS
    )
    assert built.encode() == expected
    with_pattern = HeartbeatFields(member_id="m", member_epoch=0, subscribed_topic_regex="a.*")
    with pytest.raises(IncompatibleBrokerVersion, match="version 1"):
        ConsumerGroupHeartbeatRequest("g", with_pattern).prepare({68: (0, 0)})


def test_heartbeat_response_decodes_assignment_and_null_assignment() -> None:
    body = (
        struct.pack(">ih", 0, 0)
        + cstr(None)
        + cstr("m-1")
        + struct.pack(">ii", 12, 500)
        + b"\x01"  # assignment present
        + carray([T1.bytes + i32s([0, 3]) + NO_TAGS, T2.bytes + i32s([]) + NO_TAGS])
        + NO_TAGS
        + NO_TAGS
    )
    response = ConsumerGroupHeartbeatResponse_v1.decode(body)
    assert (response.error_code, response.member_id, response.member_epoch) == (0, "m-1", 12)
    assert response.heartbeat_interval_ms == 500
    assert read_assignment(response.assignment[0]) == {(T1, 0), (T1, 3)}

    fenced = struct.pack(">ih", 0, 110) + cstr("fenced") + cstr(None) + struct.pack(">ii", 3, 500)
    fenced += b"\xff" + NO_TAGS  # null assignment
    response = ConsumerGroupHeartbeatResponse_v1.decode(fenced)
    assert (response.error_code, response.error_message, response.assignment) == (
        110,
        "fenced",
        None,
    )
    # the structure round-trips
    assert ConsumerGroupHeartbeatResponse_v1.decode(response.encode()) == response


def test_offset_commit_v9_bytes() -> None:
    offsets = {
        TopicPartition("t", 1): OffsetAndMetadata(42, "m"),
        TopicPartition("t", 0): OffsetAndMetadata(5, ""),
    }
    built = OffsetCommitRequest("g", 9, "member", None, offsets).prepare({8: (2, 10)})
    assert built.API_VERSION == 9
    expected = (
        cstr("g")
        + struct.pack(">i", 9)
        + cstr("member")
        + cstr(None)
        + carray(
            [
                cstr("t")
                + carray(
                    [
                        struct.pack(">iqi", 0, 5, -1) + cstr("") + NO_TAGS,
                        struct.pack(">iqi", 1, 42, -1) + cstr("m") + NO_TAGS,
                    ]
                )
                + NO_TAGS
            ]
        )
        + NO_TAGS
    )
    assert built.encode() == expected
    answer = (
        struct.pack(">i", 0)
        + carray([cstr("t") + carray([struct.pack(">ih", 0, 113) + NO_TAGS]) + NO_TAGS])
        + NO_TAGS
    )
    response = OffsetCommitResponse_v9.decode(answer)
    assert response.topics == [("t", [(0, 113, {})], {})]


def test_metadata_v12_by_id_and_name_bytes() -> None:
    built = TopicIdsRequest(names=["n"], ids=[T1]).prepare({3: (0, 13)})
    assert built.API_VERSION == 12
    zero = b"\x00" * 16
    expected = (
        carray([zero + cstr("n") + NO_TAGS, T1.bytes + cstr(None) + NO_TAGS])
        + b"\x00"  # allow auto topic creation: false
        + b"\x00"  # include topic authorized operations: false
        + NO_TAGS
    )
    assert built.encode() == expected
    assert TopicIdsRequest(every=True).prepare({3: (0, 12)}).encode() == b"\x00\x00\x00" + NO_TAGS


def test_metadata_v12_response_decodes_topic_ids() -> None:
    partition = struct.pack(">hiii", 0, 0, 1, 5) + i32s([1]) + i32s([1]) + i32s([]) + NO_TAGS
    body = (
        struct.pack(">i", 0)
        + carray(
            [
                struct.pack(">i", 1)
                + cstr("localhost")
                + struct.pack(">i", 9092)
                + cstr(None)
                + NO_TAGS
            ]
        )
        + cstr("cluster")
        + struct.pack(">i", 1)
        + carray(
            [
                struct.pack(">h", 0)
                + cstr("orders")
                + T1.bytes
                + b"\x00"
                + carray([partition])
                + struct.pack(">i", -2147483648)
                + NO_TAGS,
                struct.pack(">h", 100)
                + cstr(None)
                + T2.bytes
                + b"\x00"
                + carray([])
                + struct.pack(">i", -2147483648)
                + NO_TAGS,
            ]
        )
        + NO_TAGS
    )
    response = MetadataResponse_v12.decode(body)
    found = {topic_id: name for code, name, topic_id, *_ in response.topics if code == 0}
    assert found == {T1: "orders"}
    assert response.topics[1][0] == 100  # UNKNOWN_TOPIC_ID
    assert response.brokers[0][1:3] == ("localhost", 9092)


def test_uuid_type_and_kafka_string() -> None:
    assert Uuid.encode(T1) == bytes.fromhex("00112233445566778899aabbccddeeff")
    with pytest.raises(ValueError, match="16 bytes"):
        Uuid.decode(BytesIO(b"\x00" * 3))
    assert kafka_uuid_string(uuid.UUID(int=0)) == "AAAAAAAAAAAAAAAAAAAAAA"
