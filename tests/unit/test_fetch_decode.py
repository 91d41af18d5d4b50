"""Reading fetched bytes into the runtime's records, and the fetch response read in one
pass: built with aiokafka's batch builder and schema, read with the fetch loop's code."""

from __future__ import annotations

import asyncio
import struct

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import CorruptRecordException
from hypothesis import given
from hypothesis import strategies as st

from decaton_aio._aiokafka import (
    DefaultRecordBatch,
    DefaultRecordBatchBuilder,
    RequestStruct,
    protocol_fetch,
)
from decaton_aio.consumer._records import TaskRecord
from decaton_aio.consumer.fetch import FetchConfig, Fetcher, FetchSession
from decaton_aio.consumer.fetch._decode import fetch_end, read_records
from decaton_aio.consumer.fetch._protocol import (
    FetchRequest,
    FetchRequestV11,
    FetchRequestV12,
    FetchResponse,
    FetchResponseV12,
    PartitionData,
)
from decaton_aio.consumer.fetch._session import FetchPlan
from decaton_aio.metadata import METADATA_HEADER

CODECS = {
    "none": DefaultRecordBatch.CODEC_NONE,
    "gzip": DefaultRecordBatch.CODEC_GZIP,
    "snappy": DefaultRecordBatch.CODEC_SNAPPY,
    "lz4": DefaultRecordBatch.CODEC_LZ4,
    "zstd": DefaultRecordBatch.CODEC_ZSTD,
}
_CONTROL = 0x20  # the attributes bit of a control batch


def batch(
    base: int,
    values: list[bytes],
    *,
    codec: int = 0,
    producer_id: int = -1,
    transactional: bool = False,
    headers: list[tuple[str, bytes | None]] | None = None,
    epoch: int = 0,
) -> bytes:
    """A version 2 record batch of ``values`` from offset ``base``, written by the leader
    of ``epoch``."""
    builder = DefaultRecordBatchBuilder(
        2, codec, int(transactional), producer_id, 0 if producer_id >= 0 else -1, -1, 1 << 20
    )
    for i, value in enumerate(values):
        builder.append(i, 1_700_000_000_000 + i, b"k", value, headers or [])
    data = bytearray(builder.build())
    struct.pack_into(">q", data, 0, base)  # the base offset is outside the checksum
    struct.pack_into(">i", data, 12, epoch)  # and so is the partition leader epoch
    return bytes(data)


def marker(offset: int, producer_id: int, *, abort: bool, epoch: int = 0) -> bytes:
    """A control batch of one transaction marker (its checksum left stale: read with
    ``check_crcs=False``)."""
    builder = DefaultRecordBatchBuilder(2, 0, 1, producer_id, 0, -1, 1 << 20)
    builder.append(0, 1_700_000_000_000, struct.pack(">hh", 0, 0 if abort else 1), b"", [])
    data = bytearray(builder.build())
    struct.pack_into(">q", data, 0, offset)
    struct.pack_into(">i", data, 12, epoch)
    (attributes,) = struct.unpack_from(">h", data, 21)
    struct.pack_into(">h", data, 21, attributes | _CONTROL)
    return bytes(data)


def values(records: list[TaskRecord]) -> list[bytes | None]:
    return [r.value for r in records]


@pytest.mark.parametrize("codec", list(CODECS))
def test_records_of_every_codec_are_read_from_the_fetch_offset(codec: str) -> None:
    data = batch(10, [b"a", b"b", b"c"], codec=CODECS[codec]) + batch(13, [b"d"])
    records, next_offset = read_records(data, 11)
    assert [r.offset for r in records] == [11, 12, 13]
    assert values(records) == [b"b", b"c", b"d"]
    assert all(isinstance(r, TaskRecord) and r.key == b"k" for r in records)
    assert records[0].timestamp == 1_700_000_000_001
    assert next_offset == 14


def test_the_metadata_header_is_kept_packed_and_others_as_they_are() -> None:
    data = batch(0, [b"x"], headers=[(METADATA_HEADER, b"\x08\x01")])
    data += batch(1, [b"y"], headers=[("a", b"1"), ("b", None)])
    records, _ = read_records(data, 0)
    assert records[0].packed_headers == b"\x08\x01"
    assert list(records[0].headers) == [(METADATA_HEADER, b"\x08\x01")]
    assert list(records[1].headers) == [("a", b"1"), ("b", None)]


def test_nothing_fetched_leaves_the_offset() -> None:
    assert read_records(b"", 5) == ([], 5)


def test_an_incomplete_batch_at_the_end_is_left_for_the_next_fetch() -> None:
    whole = batch(0, [b"a", b"b"])
    records, next_offset = read_records(whole + batch(2, [b"c"])[:20], 0)
    assert values(records) == [b"a", b"b"]
    assert next_offset == 2


def _transactions() -> tuple[bytes, list[tuple[int, int]]]:
    # producer 7: c-0 c-1 committed (marker 2), a-0 a-1 aborted (marker 5); producer 8: p-0
    # (not transactional), producer 7: c-2 (marker 8)
    data = (
        batch(0, [b"c-0", b"c-1"], producer_id=7, transactional=True)
        + marker(2, 7, abort=False)
        + batch(3, [b"a-0", b"a-1"], producer_id=7, transactional=True)
        + marker(5, 7, abort=True)
        + batch(6, [b"p-0"], producer_id=8)
        + batch(7, [b"c-2"], producer_id=7, transactional=True)
        + marker(8, 7, abort=False)
    )
    return data, [(7, 3)]


def test_read_committed_skips_aborted_transactions_and_markers() -> None:
    data, aborted = _transactions()
    records, next_offset = read_records(data, 0, aborted, read_committed=True, check_crcs=False)
    assert values(records) == [b"c-0", b"c-1", b"p-0", b"c-2"]
    assert next_offset == 9


def test_read_uncommitted_drops_only_the_markers() -> None:
    data, aborted = _transactions()
    records, next_offset = read_records(data, 0, aborted, check_crcs=False)
    assert values(records) == [b"c-0", b"c-1", b"a-0", b"a-1", b"p-0", b"c-2"]
    assert next_offset == 9


def test_a_fetch_of_markers_only_moves_the_offset_on() -> None:
    records, next_offset = read_records(marker(4, 7, abort=True), 4, [], check_crcs=False)
    assert records == []
    assert next_offset == 5


@given(
    st.lists(
        st.tuples(st.sampled_from(["records", "commit", "abort"]), st.integers(1, 4)),
        max_size=6,
    ),
    st.integers(0, 30),
    st.integers(0, 40),
    st.booleans(),
)
def test_the_end_offset_from_the_headers_is_where_reading_ends(
    layout: list[tuple[str, int]], skip: int, cut: int, committed: bool
) -> None:
    """`fetch_end()` reads headers only; the fetch loop asks for the next records from
    it before reading these, so it must be the offset `read_records()` ends at, whatever
    the batches (records, markers, aborted transactions) and a cut tail; and the epoch
    history gains each whole batch's epoch newer than the last, at its base offset."""
    data, offset, aborted, epochs = b"", 0, [], []
    for i, (kind, size) in enumerate(layout):
        epoch, base = 3 + i // 2, offset  # two batches an epoch
        if kind == "records":
            data += batch(offset, [b"v"] * size, producer_id=7, transactional=True, epoch=epoch)
            offset += size
        else:
            if kind == "abort":
                aborted.append((7, offset))
            data += marker(offset, 7, abort=kind == "abort", epoch=epoch)
            offset += 1
        epochs.append((len(data), epoch, base))
    data = data[: max(0, len(data) - cut)]
    fetch_offset = min(skip, offset)
    _, read_to = read_records(
        data, fetch_offset, aborted, read_committed=committed, check_crcs=False
    )
    history = [(2, 0)]  # an older epoch, from an earlier fetch
    assert fetch_end(data, fetch_offset, history) == read_to
    whole = [(epoch, base) for end, epoch, base in epochs if end <= len(data)]
    firsts = [entry for i, entry in enumerate(whole) if i == 0 or whole[i - 1][0] < entry[0]]
    assert history == [(2, 0), *firsts]


def test_a_batch_shorter_than_its_header_is_refused() -> None:
    short = bytearray(batch(0, [b"a"]))
    struct.pack_into(">i", short, 8, 40)  # a version 2 header needs 49 bytes after it
    with pytest.raises(CorruptRecordException):
        fetch_end(bytes(short[:52]), 0, [])
    history: list[tuple[int, int]] = []
    assert fetch_end(bytes(short[:51]), 0, history) == 0  # not whole yet: no batch
    assert history == []


def test_a_corrupt_batch_is_refused() -> None:
    data = bytearray(batch(0, [b"abc"]))
    data[-1] ^= 0xFF
    with pytest.raises(CorruptRecordException):
        read_records(bytes(data), 0)


def test_the_response_is_read_as_aiokafka_writes_it() -> None:
    records = batch(0, [b"a"])
    body = protocol_fetch.FetchResponse_v11(
        7,
        0,
        99,
        [
            ("t", [(0, 0, 10, 9, 0, [(7, 3)], -1, records), (1, 6, -1, -1, -1, None, -1, None)]),
            ("u", [(2, 0, 5, 5, 1, [], 1, b"")]),
        ],
    ).encode()
    response = FetchResponse.decode(body)
    assert (response.throttle_time_ms, response.error_code, response.session_id) == (7, 0, 99)
    first, second, third = response.partitions
    assert first.tp == TopicPartition("t", 0)
    assert (first.error_code, first.highwater, first.last_stable_offset) == (0, 10, 9)
    assert first.aborted == [(7, 3)]
    assert first.records == records
    assert (second.tp, second.error_code, second.aborted, second.records) == (
        TopicPartition("t", 1),
        6,
        None,
        b"",
    )
    assert (third.tp, third.log_start_offset, third.aborted) == (TopicPartition("u", 2), 1, [])


def test_the_request_carries_the_plan_of_its_session() -> None:
    session = FetchSession(1)
    a0, a1, b0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)
    plan = session.plan({a0: (1, 100, 0), a1: (2, 100, 0), b0: (3, 100, 0)})
    session.answered(plan, 0, 5, [])
    plan = session.plan({a0: (4, 100, 6), a1: (2, 100, 0)})
    built = FetchRequest(plan, 500, 1, 1000, 1, "rack").build(FetchRequestV11)
    fields = built.to_object()
    assert fields["session_id"] == 5
    assert fields["session_epoch"] == 1
    assert fields["isolation_level"] == 1
    assert fields["topics"] == [
        {
            "topic": "a",
            "partitions": [
                {
                    "partition": 0,
                    "current_leader_epoch": -1,
                    "fetch_offset": 4,
                    "log_start_offset": -1,
                    "max_bytes": 100,
                }
            ],
        }
    ]
    assert fields["forgotten_topics_data"] == [{"topic": "b", "partitions": [0]}]
    assert FetchRequestV11.decode(built.encode()).to_object() == fields


def test_version_12_carries_each_partitions_last_fetched_epoch() -> None:
    session = FetchSession(1)
    a0, b0 = TopicPartition("a", 0), TopicPartition("b", 0)
    plan = session.plan({a0: (4, 100, 6), b0: (3, 100, -1)})
    request = FetchRequest(plan, 500, 1, 1000, 0)
    assert isinstance(request.prepare({1: (4, 17)}), FetchRequestV12)  # the newest both know
    assert isinstance(request.prepare({1: (4, 11)}), FetchRequestV11)
    built = request.build(FetchRequestV12)
    # Written field by field as Kafka's message schema has it.
    written = struct.pack(">iiiibii", -1, 500, 1, 1000, 0, 0, 0) + _uvarint(3)
    for topic, offset, epoch in ((b"a", 4, 6), (b"b", 3, -1)):
        written += _compact(topic) + _uvarint(2)
        written += struct.pack(">iiqiqi", 0, -1, offset, epoch, -1, 100) + _tags() + _tags()
    written += _uvarint(1) + _compact(b"") + _tags()  # nothing forgotten, no rack
    assert built.encode() == written
    # And as the schema's generic writer writes it, with forgotten partitions and a rack.
    a0, c1, c2 = TopicPartition("a", 0), TopicPartition("c", 1), TopicPartition("c", 2)
    wanted = {a0: (8, 100, 2)}
    other = FetchRequest(FetchPlan(9, 4, False, wanted, (c1, c2), wanted), 5, 16, 99, 1, "r1")
    again = other.build(FetchRequestV12)
    assert again.encode() == RequestStruct.encode(again)
    fields = FetchRequestV12.decode(built.encode()).to_object()
    assert [(t["topic"], t["partitions"]) for t in fields["topics"]] == [
        (
            topic,
            [
                {
                    "partition": 0,
                    "current_leader_epoch": -1,
                    "fetch_offset": offset,
                    "last_fetched_epoch": epoch,
                    "log_start_offset": -1,
                    "partition_max_bytes": 100,
                    "tags": {},
                }
            ],
        )
        for topic, offset, epoch in (("a", 4, 6), ("b", 3, -1))
    ]


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _compact(raw: bytes | None) -> bytes:
    return _uvarint(0) if raw is None else _uvarint(len(raw) + 1) + raw


def _tags(*fields: tuple[int, bytes]) -> bytes:
    return _uvarint(len(fields)) + b"".join(
        _uvarint(tag) + _uvarint(len(raw)) + raw for tag, raw in fields
    )


def _partition_v12(
    index: int,
    error: int,
    aborted: list[tuple[int, int]] | None,
    records: bytes | None,
    *tags: tuple[int, bytes],
) -> bytes:
    head = struct.pack(">ihqqq", index, error, 10, 9, 0)
    if aborted is None:
        listed = _uvarint(0)
    else:
        listed = _uvarint(len(aborted) + 1) + b"".join(
            struct.pack(">qq", *a) + _tags() for a in aborted
        )
    return head + listed + struct.pack(">i", -1) + _compact(records) + _tags(*tags)


def test_a_version_12_response_is_read_with_its_diverging_epochs() -> None:
    """Written field by field as Kafka's message schema has it (compact arrays and strings,
    tagged fields after each structure), not with the reader's own code."""
    records = batch(0, [b"a"])
    long_topic = "t" * 150  # its length takes a varint of two bytes
    diverging = (0, struct.pack(">iq", 4, 17) + _tags())
    current_leader = (1, struct.pack(">ii", 2, 5) + _tags())
    unknown = (9, bytes(200))  # a tag this reader does not know, of two-byte size
    topics = [
        (
            long_topic,
            [
                _partition_v12(0, 0, [(7, 3)], records, unknown),
                _partition_v12(1, 0, None, None, diverging, current_leader),
            ],
        ),
        ("u", [_partition_v12(2, 6, [], b"")]),
    ]
    body = struct.pack(">ihi", 7, 0, 99) + _uvarint(len(topics) + 1)
    for topic, partitions in topics:
        body += _compact(topic.encode()) + _uvarint(len(partitions) + 1)
        body += b"".join(partitions) + _tags()
    body += _tags()
    response = FetchResponseV12.decode(body)
    assert (response.throttle_time_ms, response.error_code, response.session_id) == (7, 0, 99)
    first, second, third = response.partitions
    assert (first.tp, first.aborted, first.records, first.diverging) == (
        TopicPartition(long_topic, 0),
        [(7, 3)],
        records,
        None,
    )
    assert (first.highwater, first.last_stable_offset, first.preferred_read_replica) == (10, 9, -1)
    assert (second.tp, second.aborted, second.records, second.diverging) == (
        TopicPartition(long_topic, 1),
        None,
        b"",
        (4, 17),
    )
    assert (third.tp, third.error_code, third.aborted, third.diverging) == (
        TopicPartition("u", 2),
        6,
        [],
        None,
    )


class _Client:
    """What an unstarted fetcher asks of its client."""

    def add_topic(self, topic: str) -> asyncio.Future[None]:
        added: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        added.set_result(None)
        return added


async def test_a_corrupt_batch_is_raised_by_getmany_after_what_came_before_it() -> None:
    """The fetch loop reads fetched bytes when `getmany()` takes them: a corrupt batch is
    raised there, after the records before it, and fetched again from its offset."""
    tp = TopicPartition("t", 0)
    fetcher = Fetcher(_Client(), FetchConfig())
    fetcher.assign(tp, 0)
    bad = bytearray(batch(2, [b"c"], epoch=2))
    bad[-1] ^= 0xFF
    for asked, raw in ((0, batch(0, [b"a", b"b"], epoch=1)), (2, bytes(bad))):
        fetch = {tp: (asked, 1 << 20, -1)}
        plan = FetchPlan(1, 1, False, fetch, (), fetch)
        fetcher._take(1, plan, [PartitionData(tp, 0, 3, -1, 0, None, raw)])
    assert values((await fetcher.getmany())[tp]) == [b"a", b"b"]
    with pytest.raises(CorruptRecordException):
        await fetcher.getmany()
    assert fetcher.position(tp) == 2
    assert fetcher.last_fetched_epoch(tp) == 1  # the next request names 1, not 2
    # Fetched again from there: a response to a request from offset 2 is taken.
    fetch = {tp: (2, 1 << 20, -1)}
    again = [PartitionData(tp, 0, 3, -1, 0, None, batch(2, [b"c"]))]
    fetcher._take(1, FetchPlan(1, 2, False, fetch, (), fetch), again)
    assert values((await fetcher.getmany())[tp]) == [b"c"]
