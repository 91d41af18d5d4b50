"""The ``dt_meta`` header codec: golden vectors, protobuf cross-checks, malformed input."""

from __future__ import annotations

import re
from typing import Any

import msgspec
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from decaton_aio.consumer._records import scheduled_time_in
from decaton_aio.errors import DecodeError
from decaton_aio.metadata import (
    METADATA_HEADER,
    TaskMetadata,
    decode_metadata,
    encode_metadata,
    metadata_from_headers,
    scheduled_time_of,
)
from tests.unit.protobuf_helpers import task_metadata_proto_class

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

# Golden vectors, worked out by hand from the protobuf wire format: a tag byte is
# (field_number << 3) | wire_type, so 0x08 = field 1 varint, 0x12 = field 2 length-delimited,
# 0x1a = field 3 length-delimited, 0x20 = field 4 varint, 0x28 = field 5 varint. A varint
# holds 7 bits per byte, least significant group first, high bit set on all but the last.
GOLDEN = [
    pytest.param(TaskMetadata(0), b"", id="all-defaults-are-omitted"),
    pytest.param(TaskMetadata(1), b"\x08\x01", id="timestamp-1"),
    # 150 = 0b1_0010110 -> 0x96 (0x16 | 0x80), 0x01
    pytest.param(TaskMetadata(150), b"\x08\x96\x01", id="timestamp-150"),
    # 1700000000000 = 0x18BCFE56800 in 7-bit groups: 0x00 0x50 0x15 0x7f 0x3c 0x31
    pytest.param(
        TaskMetadata(1_700_000_000_000), b"\x08\x80\xd0\x95\xff\xbc\x31", id="timestamp-2023"
    ),
    pytest.param(TaskMetadata(0, source_application_id="app"), b"\x12\x03app", id="application-id"),
    pytest.param(TaskMetadata(0, source_instance_id="i-1"), b"\x1a\x03i-1", id="instance-id"),
    pytest.param(TaskMetadata(0, retry_count=3), b"\x20\x03", id="retry-count"),
    # 300 = 0b10_0101100 -> 0xac (0x2c | 0x80), 0x02
    pytest.param(TaskMetadata(0, scheduled_time_ms=300), b"\x28\xac\x02", id="scheduled-time"),
    pytest.param(
        TaskMetadata(150, "app", "i-1", 3, 300),
        b"\x08\x96\x01\x12\x03app\x1a\x03i-1\x20\x03\x28\xac\x02",
        id="all-fields-in-field-order",
    ),
    # int64 -1 is 0xFFFF_FFFF_FFFF_FFFF: nine 0xff groups of 7 bits, then the last bit (0x01).
    pytest.param(
        TaskMetadata(0, retry_count=-1), b"\x20" + b"\xff" * 9 + b"\x01", id="retry-count-minus-1"
    ),
    # int64 min is 0x8000_0000_0000_0000: nine empty groups, then bit 63 alone (0x01).
    pytest.param(
        TaskMetadata(INT64_MIN), b"\x08" + b"\x80" * 9 + b"\x01", id="timestamp-int64-min"
    ),
    # int64 max is 63 one bits: eight full groups (0xff) and a last group of 7 ones (0x7f).
    pytest.param(
        TaskMetadata(0, scheduled_time_ms=INT64_MAX),
        b"\x28" + b"\xff" * 8 + b"\x7f",
        id="scheduled-time-int64-max",
    ),
    # UTF-8: 주 EC A3 BC, 문 EB AC B8, - 2D, 서 EC 84 9C, 비 EB B9 84, 스 EC 8A A4 = 16 bytes.
    pytest.param(
        TaskMetadata(0, source_application_id="주문-서비스"),
        b"\x12\x10\xec\xa3\xbc\xeb\xac\xb8-\xec\x84\x9c\xeb\xb9\x84\xec\x8a\xa4",
        id="korean-application-id",
    ),
    # U+1F680 (rocket) is F0 9F 9A 80 in UTF-8: "node-" + 4 bytes = 9 bytes.
    pytest.param(
        TaskMetadata(0, source_instance_id="node-🚀"),
        b"\x1a\x09node-\xf0\x9f\x9a\x80",
        id="emoji-instance-id",
    ),
    # A 200-byte id needs a two-byte length varint: 200 = 0b1_1001000 -> 0xc8, 0x01.
    pytest.param(
        TaskMetadata(0, source_application_id="a" * 200),
        b"\x12\xc8\x01" + b"a" * 200,
        id="long-application-id",
    ),
]

ALL_FIELDS = TaskMetadata(150, "app", "i-1", 3, 300)

# Inputs a Decaton 9 reader accepts, though our encoder never writes them this way.
DECODE_ONLY = [
    pytest.param(
        b"\x08\x96\x01"
        b"\x30\x96\x01"  # field 6, varint
        b"\x12\x03app"
        b"\x39\x01\x02\x03\x04\x05\x06\x07\x08"  # field 7, 64-bit
        b"\x1a\x03i-1"
        b"\x42\x03xyz"  # field 8, length-delimited
        b"\x20\x03"
        b"\x4d\x01\x02\x03\x04"  # field 9, 32-bit
        b"\x28\xac\x02"
        b"\xa0\x06\x01",  # field 100 (tag 800 -> two-byte varint a0 06), varint
        ALL_FIELDS,
        id="unknown-fields-of-every-wire-type-are-skipped",
    ),
    pytest.param(
        b"\x28\xac\x02\x20\x03\x1a\x03i-1\x12\x03app\x08\x96\x01",
        ALL_FIELDS,
        id="fields-in-reverse-order",
    ),
    pytest.param(
        b"\x08\x01\x12\x01a\x08\x96\x01\x12\x03app",
        TaskMetadata(150, source_application_id="app"),
        id="repeated-field-last-wins",
    ),
    pytest.param(b"\x08\x00\x12\x00", TaskMetadata(0), id="explicit-defaults"),
    pytest.param(b"\x08\x81\x80\x00", TaskMetadata(1), id="padded-varint"),
    pytest.param(
        b"\x08" + b"\xff" * 9 + b"\x7f",
        TaskMetadata(-1),
        id="bits-above-64-in-tenth-byte-are-dropped",
    ),
    pytest.param(
        b"\xf8\xff\xff\xff\x0f\x01" + b"\x08\x01",
        TaskMetadata(1),
        id="highest-field-number-is-skipped",
    ),
    pytest.param(b"\x0a\x01x", TaskMetadata(0), id="timestamp-as-length-delimited-is-skipped"),
    pytest.param(b"\x10\x01", TaskMetadata(0), id="string-as-varint-is-skipped"),
    pytest.param(
        b"\x08\x01\x21\x01\x02\x03\x04\x05\x06\x07\x08",
        TaskMetadata(1),
        id="retry-count-as-64-bit-is-skipped",
    ),
    pytest.param(b"\x33\x34", TaskMetadata(0), id="empty-group-is-skipped"),
    pytest.param(
        b"\x33\x3b\x08\x05\x3c\x34\x08\x02",
        TaskMetadata(2),
        id="nested-group-and-its-fields-are-skipped",
    ),
    pytest.param(b"\x88\x80\x80\x80\x00\x05", TaskMetadata(5), id="5-byte-tag"),
]

MALFORMED = [
    pytest.param(b"\x80", "truncated varint in tag at byte 0", id="truncated-tag"),
    pytest.param(
        b"\x08\x96",
        r"truncated varint in field 1 \(timestamp_millis\) at byte 1",
        id="truncated-timestamp",
    ),
    pytest.param(
        b"\x20" + b"\xff" * 9,
        r"truncated varint in field 4 \(retry_count\) at byte 1",
        id="truncated-10-byte-varint",
    ),
    pytest.param(
        b"\x12",
        r"truncated varint in length of field 2 \(source_application_id\) at byte 1",
        id="missing-string-length",
    ),
    pytest.param(
        b"\x12\x05ab",
        r"truncated field 2 \(source_application_id\) at byte 1: length 5 but 2 bytes left",
        id="truncated-string",
    ),
    pytest.param(
        b"\x1a\x80\x80\x80\x80\x08i-1",
        r"truncated field 3 \(source_instance_id\) at byte 1: length 2147483648 but 3 bytes",
        id="huge-string-length",
    ),
    pytest.param(
        b"\x42\x05ab",
        "truncated unknown field 8 at byte 0: length 5 but 2 bytes left",
        id="truncated-unknown-length-delimited",
    ),
    pytest.param(
        b"\x30\x96",
        "truncated varint in unknown field 6 at byte 1",
        id="truncated-unknown-varint",
    ),
    pytest.param(
        b"\x39\x01\x02\x03",
        "truncated unknown field 7 at byte 0: 64-bit value needs 8 bytes, 3 left",
        id="truncated-unknown-64-bit",
    ),
    pytest.param(
        b"\x4d\x01",
        "truncated unknown field 9 at byte 0: 32-bit value needs 4 bytes, 1 left",
        id="truncated-unknown-32-bit",
    ),
    pytest.param(
        b"\x12\x02\xc3\x28",
        r"field 2 \(source_application_id\) at byte 1 is not valid UTF-8: invalid continuation",
        id="invalid-utf8",
    ),
    pytest.param(
        b"\x1a\x03\xed\xa0\x80",
        r"field 3 \(source_instance_id\) at byte 1 is not valid UTF-8",
        id="utf8-encoded-surrogate",
    ),
    pytest.param(b"\x34", "end of group 6 at byte 0 ends no group", id="end-group"),
    pytest.param(
        b"\x33\x08\x01", r"group of unknown field 6 at byte 0 has no end", id="open-group"
    ),
    pytest.param(
        b"\x33\x3c",
        "group of unknown field 6 at byte 0 ends with field 7 at byte 1",
        id="group-ends-with-another-field",
    ),
    pytest.param(
        b"\x88\x80\x80\x80\x80\x00\x05",
        "tag at byte 0 is longer than 32 bits",
        id="6-byte-tag",
    ),
    pytest.param(b"\x36", "unknown field 6 at byte 0 has invalid wire type 6", id="wire-type-6"),
    pytest.param(b"\x37", "unknown field 6 at byte 0 has invalid wire type 7", id="wire-type-7"),
    pytest.param(b"\x00\x01", "invalid field number 0 at byte 0", id="field-number-0"),
    pytest.param(
        b"\x80\x80\x80\x80\x10\x01",
        "tag at byte 0 is longer than 32 bits",
        id="field-number-too-large",
    ),
    pytest.param(
        b"\x08" + b"\xff" * 10 + b"\x01",
        r"varint longer than 10 bytes in field 1 \(timestamp_millis\) at byte 1",
        id="11-byte-varint",
    ),
    pytest.param(
        b"\x80" * 11,
        "varint longer than 10 bytes in tag at byte 0",
        id="11-byte-tag",
    ),
]

int64s = st.integers(min_value=INT64_MIN, max_value=INT64_MAX)
task_metadata = st.builds(TaskMetadata, int64s, st.text(), st.text(), int64s, int64s)


def to_proto(meta: TaskMetadata) -> Any:
    """Build the reference ``TaskMetadataProto`` holding the same values as ``meta``."""
    return task_metadata_proto_class()(
        timestamp_millis=meta.timestamp_ms,
        source_application_id=meta.source_application_id,
        source_instance_id=meta.source_instance_id,
        retry_count=meta.retry_count,
        scheduled_time_millis=meta.scheduled_time_ms,
    )


def from_proto(message: Any) -> TaskMetadata:
    """Read a reference ``TaskMetadataProto`` back into ``TaskMetadata``."""
    return TaskMetadata(
        message.timestamp_millis,
        message.source_application_id,
        message.source_instance_id,
        message.retry_count,
        message.scheduled_time_millis,
    )


# --------------------------------------------------------------------------- golden vectors


@pytest.mark.parametrize(("meta", "wire"), GOLDEN)
def test_encode_matches_golden_vector(meta: TaskMetadata, wire: bytes) -> None:
    """Encoding writes exactly the hand-derived protobuf bytes."""
    assert encode_metadata(meta) == wire


@pytest.mark.parametrize(("meta", "wire"), GOLDEN)
def test_decode_matches_golden_vector(meta: TaskMetadata, wire: bytes) -> None:
    """Decoding the hand-derived protobuf bytes gives back the metadata."""
    assert decode_metadata(wire) == meta


@pytest.mark.parametrize(("meta", "wire"), GOLDEN)
def test_golden_vector_agrees_with_protobuf(meta: TaskMetadata, wire: bytes) -> None:
    """The hand-derived vectors are what the protobuf library itself writes and reads."""
    assert to_proto(meta).SerializeToString() == wire
    assert from_proto(task_metadata_proto_class().FromString(wire)) == meta


@pytest.mark.parametrize(("wire", "meta"), DECODE_ONLY)
def test_decode_accepts_what_protobuf_accepts(wire: bytes, meta: TaskMetadata) -> None:
    """Unknown fields, any order, repeats and padded varints decode as protobuf decodes them."""
    assert decode_metadata(wire) == meta
    assert from_proto(task_metadata_proto_class().FromString(wire)) == meta


# --------------------------------------------------------------------------- malformed input


@pytest.mark.parametrize(("wire", "reason"), MALFORMED)
def test_decode_rejects_malformed_header(wire: bytes, reason: str) -> None:
    """Malformed bytes raise DecodeError for the header, with a reason naming field and byte."""
    with pytest.raises(DecodeError) as info:
        decode_metadata(wire)
    assert info.value.part == "header"
    assert re.match(reason, info.value.reason), info.value.reason


def test_decode_error_on_invalid_utf8_is_chained() -> None:
    """The UnicodeDecodeError behind an invalid id is kept as the cause."""
    with pytest.raises(DecodeError) as info:
        decode_metadata(b"\x12\x01\xff")
    assert isinstance(info.value.__cause__, UnicodeDecodeError)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


# Field-shaped bytes: tags of known and unknown fields with every wire type (groups,
# invalid ones), followed by plausible or truncated values; random bytes rarely form these.
_fields = st.lists(
    st.tuples(
        st.sampled_from([0, 1, 2, 3, 4, 5, 6, 9, (1 << 29) - 1, 1 << 29]),
        st.integers(min_value=0, max_value=7),
        st.one_of(
            st.integers(min_value=0, max_value=(1 << 64) - 1).map(_varint),
            st.binary(max_size=6).map(lambda b: _varint(len(b)) + b),
            st.binary(max_size=9),
        ),
    ),
    max_size=8,
).map(lambda fields: b"".join(_varint(n << 3 | w) + v for n, w, v in fields))


def _protobuf_reading(wire: bytes) -> TaskMetadata | None:
    try:
        return from_proto(task_metadata_proto_class().FromString(wire))
    except Exception:
        return None


def _our_reading(wire: bytes) -> TaskMetadata | None:
    try:
        return decode_metadata(wire)
    except DecodeError as exc:
        if exc.part != "header":
            raise
        return None


@given(st.one_of(st.binary(max_size=64), _fields))
# Found by coverage-guided fuzzing: field number 0 inside a group is taken by protobuf.
@example(b"\x13" + b"\x18" * 27 + b"\x01\x00\x00\x00\x14\x10\x10\x14")
@example(b"\x13\x1b\x03\x00\x00\x04\x1c\x14")
@example(b"\x00\x00")
def test_decode_agrees_with_protobuf_on_any_input(wire: bytes) -> None:
    """One meaning for a header: our decoder and protobuf's parser (the one the consume
    path uses) accept the same bytes and read the same values, and reject the same bytes;
    reading it from the record headers agrees too."""
    ours = _our_reading(wire)
    assert ours == _protobuf_reading(wire)
    headers = [(METADATA_HEADER, wire)]
    if ours is None:
        with pytest.raises(DecodeError):
            metadata_from_headers(headers, 0)
        with pytest.raises(DecodeError):
            scheduled_time_of(headers)
    else:
        assert metadata_from_headers(headers, 0) == ours
        assert scheduled_time_of(headers) == ours.scheduled_time_ms


@given(st.one_of(st.binary(max_size=64), _fields))
@example(b"\x12\x01\xff")  # an id that is not UTF-8
@example(b"\x28" + b"\xff" * 9 + b"\x01")  # a negative scheduled time
@example(b"\x28\x05\x28\x07")  # repeated: the last one counts
def test_plain_header_read_agrees_with_protobuf(wire: bytes) -> None:
    """The consume path's read of a plain header: whatever it reads, protobuf accepts
    with the same scheduled time; what it leaves to protobuf (``None``) is all it says."""
    plain = scheduled_time_in(wire)
    if plain is not None:
        reading = _protobuf_reading(wire)
        assert reading is not None
        assert plain == reading.scheduled_time_ms


ascii_ids = st.text(st.characters(max_codepoint=0x7F), max_size=127)
plain_ints = st.integers(min_value=0, max_value=2**63 - 1)


# The known fields, each with its wire type: integers (0) and ids (2).
plain_fields = st.lists(
    st.one_of(
        st.tuples(st.sampled_from([1 << 3, 4 << 3, 5 << 3]), plain_ints.map(_varint)),
        st.tuples(
            st.sampled_from([2 << 3 | 2, 3 << 3 | 2]),
            ascii_ids.map(lambda text: _varint(len(text)) + text.encode()),
        ),
    ),
    max_size=8,
).map(lambda fields: b"".join(bytes([tag]) + value for tag, value in fields))


@given(plain_fields)
def test_plain_header_is_read_without_protobuf(wire: bytes) -> None:
    """What producers write (known fields in any order, repeated or not, non-negative
    integers, ASCII ids) is read without protobuf, to the value protobuf reads."""
    reading = _protobuf_reading(wire)
    assert reading is not None
    assert scheduled_time_in(wire) == reading.scheduled_time_ms


# --------------------------------------------------------------------------- cross-checks


@given(task_metadata)
def test_encode_is_byte_identical_to_protobuf(meta: TaskMetadata) -> None:
    """Over the whole int64 range and any text, our bytes equal protobuf's bytes."""
    assert encode_metadata(meta) == to_proto(meta).SerializeToString()


@given(task_metadata)
def test_protobuf_parses_our_encoding_field_by_field(meta: TaskMetadata) -> None:
    """The protobuf library reads every field of our encoding back unchanged."""
    parsed = task_metadata_proto_class().FromString(encode_metadata(meta))
    assert parsed.timestamp_millis == meta.timestamp_ms
    assert parsed.source_application_id == meta.source_application_id
    assert parsed.source_instance_id == meta.source_instance_id
    assert parsed.retry_count == meta.retry_count
    assert parsed.scheduled_time_millis == meta.scheduled_time_ms


@given(task_metadata)
def test_we_decode_protobuf_encoding(meta: TaskMetadata) -> None:
    """We read back every field the protobuf library writes, and round-trip our own."""
    assert decode_metadata(to_proto(meta).SerializeToString()) == meta
    assert decode_metadata(encode_metadata(meta)) == meta


# --------------------------------------------------------------------------- encoding limits


@pytest.mark.parametrize(
    ("meta", "message"),
    [
        (TaskMetadata(INT64_MAX + 1), "timestamp_ms=9223372036854775808 is above the int64"),
        (TaskMetadata(0, retry_count=INT64_MIN - 1), "retry_count=-9223372036854775809 is below"),
        (TaskMetadata(0, scheduled_time_ms=2**70), "scheduled_time_ms=1180591620717411303424"),
    ],
)
def test_encode_rejects_values_outside_int64(meta: TaskMetadata, message: str) -> None:
    """An integer that does not fit the int64 wire type is refused, naming the field."""
    with pytest.raises(ValueError, match=message):
        encode_metadata(meta)


def test_task_metadata_is_an_immutable_value() -> None:
    """TaskMetadata has protobuf's defaults, compares by value and cannot be changed."""
    meta = TaskMetadata(5)
    assert meta == TaskMetadata(5, "", "", 0, 0)
    assert hash(meta) == hash(TaskMetadata(5))
    with pytest.raises(AttributeError):
        meta.retry_count = 1  # type: ignore[misc]
    assert msgspec.structs.replace(meta, retry_count=1).retry_count == 1


# --------------------------------------------------------------------------- record headers


def test_metadata_from_headers_uses_dt_meta_header() -> None:
    """The dt_meta header is decoded; other headers and the record timestamp are ignored."""
    headers = [("trace", b"abc"), (METADATA_HEADER, encode_metadata(ALL_FIELDS))]
    assert METADATA_HEADER == "dt_meta"
    assert metadata_from_headers(headers, record_timestamp_ms=999) == ALL_FIELDS


def test_metadata_from_headers_without_header_uses_record_timestamp() -> None:
    """A record without dt_meta is still a task, stamped with the record timestamp."""
    assert metadata_from_headers([("trace", b"abc")], 1_700_000_000_000) == TaskMetadata(
        1_700_000_000_000
    )
    assert metadata_from_headers([], 7) == TaskMetadata(7)


def test_metadata_from_headers_last_header_wins() -> None:
    """With several dt_meta headers the last one counts, as in Kafka's lastHeader."""
    headers = [
        (METADATA_HEADER, encode_metadata(TaskMetadata(1))),
        ("other", b""),
        (METADATA_HEADER, encode_metadata(TaskMetadata(2, retry_count=1))),
    ]
    assert metadata_from_headers(headers, 0) == TaskMetadata(2, retry_count=1)


def test_metadata_from_headers_keeps_empty_header_as_written() -> None:
    """An empty dt_meta header means all defaults, timestamp 0 included, as Decaton reads it."""
    assert metadata_from_headers([(METADATA_HEADER, b"")], 999) == TaskMetadata(0)


def test_metadata_from_headers_rejects_malformed_or_null_header() -> None:
    """A malformed or null dt_meta header is a header DecodeError, not a silent fallback."""
    with pytest.raises(DecodeError, match="truncated varint") as info:
        metadata_from_headers([(METADATA_HEADER, b"\x08\x96")], 0)
    assert info.value.part == "header"
    with pytest.raises(DecodeError, match="dt_meta header has a null value") as info:
        metadata_from_headers([(METADATA_HEADER, None)], 0)
    assert info.value.part == "header"
