"""The encoding of TxnOffsetCommit v3 and OffsetFetch v7 (checked byte by byte against
Kafka's schema), and how the offset commit handler reads the coordinator's answers."""

from __future__ import annotations

import struct
from io import BytesIO
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import CommitFailedError, NotCoordinatorError, ProducerFenced
from aiokafka.structs import OffsetAndMetadata

from decaton_aio._aiokafka import TransactionManager, txn_manager
from decaton_aio.consumer.commit._group_txn import (
    GroupMetadata,
    OffsetFetchRequest,
    OffsetFetchResponse_v7,
    TxnOffsetCommitRequest,
    TxnOffsetCommitResponse_v3,
    _GroupOffsetsHandler,
)

VERSIONS = {28: (0, 5), 9: (0, 9)}


def compact(text: str | None) -> bytes:
    # Kafka's COMPACT_NULLABLE_STRING: unsigned varint length + 1 (0: null), then UTF-8.
    if text is None:
        return b"\x00"
    data = text.encode()
    assert len(data) < 127
    return bytes([len(data) + 1]) + data


def test_txn_offset_commit_v3_bytes() -> None:
    member = GroupMetadata(7, "member-1", "instance-a")
    offsets = {
        TopicPartition("t", 1): OffsetAndMetadata(42, "m"),
        TopicPartition("t", 0): OffsetAndMetadata(5, ""),
    }
    request = TxnOffsetCommitRequest("txn", "group", 1000, 3, member, offsets)
    built = request.prepare(VERSIONS)
    assert built.API_VERSION == 3
    assert built.FLEXIBLE_VERSION
    expected = (
        compact("txn")
        + compact("group")
        + struct.pack(">qh", 1000, 3)
        + struct.pack(">i", 7)
        + compact("member-1")
        + compact("instance-a")
        + b"\x02"  # one topic
        + compact("t")
        + b"\x03"  # two partitions, in order
        + struct.pack(">iqi", 0, 5, -1)
        + compact("")
        + b"\x00"
        + struct.pack(">iqi", 1, 42, -1)
        + compact("m")
        + b"\x00"
        + b"\x00"  # topic tags
        + b"\x00"  # request tags
    )
    assert built.encode() == expected
    header = built.build_request_header(correlation_id=9, client_id="c").encode()
    assert header == struct.pack(">hhih", 28, 3, 9, 1) + b"c" + b"\x00"  # v2 header


def test_txn_offset_commit_without_a_static_member_sends_a_null_instance_id() -> None:
    request = TxnOffsetCommitRequest("x", "g", 1, 0, GroupMetadata(1, "m"), {})
    encoded = request.prepare(VERSIONS).encode()
    assert encoded.endswith(compact("m") + b"\x00" + b"\x01" + b"\x00")


def test_an_old_broker_is_refused() -> None:
    request = TxnOffsetCommitRequest("x", "g", 1, 0, GroupMetadata(1, "m"), {})
    with pytest.raises(NotImplementedError):
        request.prepare({28: (0, 2)})


def test_offset_fetch_v7_asks_for_stable_offsets() -> None:
    built = OffsetFetchRequest("g", [TopicPartition("b", 2), TopicPartition("a", 0)]).prepare(
        VERSIONS
    )
    assert built.API_VERSION == 7
    expected = (
        compact("g")
        + b"\x03"
        + compact("a")
        + b"\x02"
        + struct.pack(">i", 0)
        + b"\x00"
        + compact("b")
        + b"\x02"
        + struct.pack(">i", 2)
        + b"\x00"
        + b"\x01"  # require_stable
        + b"\x00"
    )
    assert built.encode() == expected


def test_offset_fetch_v7_response_decodes() -> None:
    data = (
        struct.pack(">i", 0)
        + b"\x02"
        + compact("a")
        + b"\x03"
        + struct.pack(">iqi", 0, 17, -1)
        + compact("dc1:x")
        + struct.pack(">h", 0)
        + b"\x00"
        + struct.pack(">iqi", 1, -1, -1)
        + compact(None)
        + struct.pack(">h", 88)
        + b"\x00"
        + b"\x00"
        + struct.pack(">h", 0)
        + b"\x00"
    )
    response = OffsetFetchResponse_v7.decode(BytesIO(data))
    assert response.error_code == 0
    [(name, partitions, _)] = response.topics
    assert name == "a"
    fields = [(p[0], p[1], p[3], p[4]) for p in partitions]
    assert fields == [(0, 17, "dc1:x", 0), (1, -1, None, 88)]


# ------------------------------------------------------------------ the handler


class _Sender:
    _retry_backoff = 0.05

    def __init__(self) -> None:
        self._txn_manager = TransactionManager("txn", 60_000)
        self._txn_manager.set_pid_and_epoch(5, 1)
        self.dead: list[Any] = []

    def _coordinator_dead(self, kind: Any) -> None:
        self.dead.append(kind)


def respond(*partition_codes: tuple[int, int]) -> TxnOffsetCommitResponse_v3:
    parts = [(p, code, {}) for p, code in partition_codes]
    return TxnOffsetCommitResponse_v3(0, [("t", parts, {})], {})


async def pending(sender: _Sender, *parts: int) -> tuple[_GroupOffsetsHandler, Any]:
    txn = txn_manager(sender)
    txn.begin_transaction()
    offsets = {TopicPartition("t", p): OffsetAndMetadata(10 + p, "") for p in parts}
    future = txn.add_offsets_to_txn(dict(offsets), "g")
    txn.consumer_group_added("g")
    handler = _GroupOffsetsHandler(sender, offsets, "g", GroupMetadata(4, "m1"))
    return handler, future


async def test_the_handler_completes_the_offsets_it_committed() -> None:
    sender = _Sender()
    handler, future = await pending(sender, 0, 1)
    assert handler.handle_response(respond((0, 0), (1, 0))) is None
    assert future.done()
    assert future.exception() is None


@pytest.mark.parametrize("code", [22, 25, 27, 82])
async def test_a_generation_that_is_over_fails_the_transaction(code: int) -> None:
    sender = _Sender()
    handler, future = await pending(sender, 0)
    assert handler.handle_response(respond((0, code))) is None
    assert isinstance(future.exception(), CommitFailedError)
    assert "generation 4 of member m1" in str(future.exception())
    assert txn_manager(sender).state.name == "ABORTABLE_ERROR"


async def test_a_moved_coordinator_is_asked_again() -> None:
    sender = _Sender()
    handler, future = await pending(sender, 0)
    assert handler.handle_response(respond((0, NotCoordinatorError.errno))) == 0.05
    assert sender.dead
    assert not future.done()


async def test_a_fenced_producer_raises() -> None:
    sender = _Sender()
    handler, _ = await pending(sender, 0)
    with pytest.raises(ProducerFenced):
        handler.handle_response(respond((0, 90)))
