"""Task metadata and its ``dt_meta`` record header, wire-compatible with Decaton 9.

This module owns [`TaskMetadata`][decaton_aio.TaskMetadata] and the codec for the header
that carries it. Decaton 9 writes the metadata of every task into a record header named
``dt_meta`` holding the protobuf message
``com.linecorp.decaton.protocol.TaskMetadataProto``:

```text
message TaskMetadataProto {
    int64  timestamp_millis      = 1;
    string source_application_id = 2;
    string source_instance_id    = 3;
    int64  retry_count           = 4;
    int64  scheduled_time_millis = 5;
}
```

The codec is written by hand instead of using generated protobuf code: it runs once per
consumed record and once per produced task, and a few integer operations beat building a
protobuf message object. It produces the same bytes as the protobuf runtimes (proto3: a
zero or empty field is omitted, fields are written in field-number order, a negative int64
is a 10-byte two's complement varint).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

import msgspec

from decaton_aio.errors import DecodeError

__all__ = [
    "METADATA_HEADER",
    "TaskMetadata",
    "decode_metadata",
    "encode_metadata",
    "metadata_from_headers",
    "scheduled_time_of",
]

METADATA_HEADER: Final = "dt_meta"
"""The record header key under which Decaton stores ``TaskMetadataProto``."""


class TaskMetadata(msgspec.Struct, frozen=True, gc=False):
    """What the runtime knows about a task apart from its body.

    Attributes:
        timestamp_ms: when the task was produced, in epoch milliseconds.
        source_application_id: the application that produced the task; empty if unknown.
        source_instance_id: the instance of that application; empty if unknown.
        retry_count: how many times the task has been retried; 0 on the first attempt.
        scheduled_time_ms: do not process before this epoch millisecond; 0 for no schedule.
    """

    timestamp_ms: int
    source_application_id: str = ""
    source_instance_id: str = ""
    retry_count: int = 0
    scheduled_time_ms: int = 0


# Tags (field_number << 3 | wire_type) of the fields, all single-byte on the wire.
_TAG_TIMESTAMP: Final = 0x08  # field 1, varint
_TAG_APPLICATION: Final = 0x12  # field 2, length-delimited
_TAG_INSTANCE: Final = 0x1A  # field 3, length-delimited
_TAG_RETRY: Final = 0x20  # field 4, varint
_TAG_SCHEDULED: Final = 0x28  # field 5, varint

_WIRE_VARINT: Final = 0
_WIRE_FIXED64: Final = 1
_WIRE_LEN: Final = 2
_WIRE_START_GROUP: Final = 3
_WIRE_END_GROUP: Final = 4
_WIRE_FIXED32: Final = 5

_WIRE_NAMES: Final = {
    _WIRE_VARINT: "varint",
    _WIRE_FIXED64: "64-bit",
    _WIRE_LEN: "length-delimited",
    _WIRE_START_GROUP: "start group",
    _WIRE_END_GROUP: "end group",
    _WIRE_FIXED32: "32-bit",
    6: "invalid",
    7: "invalid",
}

# field number -> (proto name, wire type it is written with), for error messages.
_KNOWN_FIELDS: Final = {
    1: ("timestamp_millis", _WIRE_VARINT),
    2: ("source_application_id", _WIRE_LEN),
    3: ("source_instance_id", _WIRE_LEN),
    4: ("retry_count", _WIRE_VARINT),
    5: ("scheduled_time_millis", _WIRE_VARINT),
}

_MAX_TAG_BYTES: Final = 5
_UINT32_MAX: Final = (1 << 32) - 1
_INT64_MIN: Final = -(1 << 63)
_INT64_MAX: Final = (1 << 63) - 1
_UINT64_MASK: Final = (1 << 64) - 1
_TWO_TO_64: Final = 1 << 64
# A varint carries 7 bits per byte, so 64 bits need at most 10 bytes.
_MAX_VARINT_BYTES: Final = 10


# --------------------------------------------------------------------------- encoding


def _write_int64(out: bytearray, tag: int, value: int, name: str) -> None:
    """Append ``tag`` and ``value`` as an int64 varint; the caller has skipped zero."""
    if value < 0:
        if value < _INT64_MIN:
            raise ValueError(f"{name}={value} is below the int64 minimum {_INT64_MIN}")
        # int64 negatives go on the wire as their 64-bit two's complement, 10 bytes long.
        value += _TWO_TO_64
    elif value > _INT64_MAX:
        raise ValueError(f"{name}={value} is above the int64 maximum {_INT64_MAX}")
    out.append(tag)
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _write_string(out: bytearray, tag: int, value: str) -> None:
    """Append ``tag``, the UTF-8 length as a varint, then the UTF-8 bytes."""
    raw = value.encode()
    length = len(raw)
    out.append(tag)
    while length > 0x7F:
        out.append((length & 0x7F) | 0x80)
        length >>= 7
    out.append(length)
    out += raw


def encode_metadata(meta: TaskMetadata) -> bytes:
    """Encode metadata as the bytes of a Decaton ``TaskMetadataProto``.

    Args:
        meta: the metadata to encode.

    Returns:
        The serialized message, byte for byte what protobuf produces; empty if every field
        holds its default.

    Raises:
        ValueError: an integer field does not fit in a signed 64-bit integer.
        UnicodeEncodeError: an id holds a lone surrogate, which UTF-8 cannot represent.
    """
    out = bytearray()
    # Field-number order and omitted defaults match protobuf's output exactly, so a header
    # written here is indistinguishable from one written by Decaton's Java producer.
    if meta.timestamp_ms:
        _write_int64(out, _TAG_TIMESTAMP, meta.timestamp_ms, "timestamp_ms")
    if meta.source_application_id:
        _write_string(out, _TAG_APPLICATION, meta.source_application_id)
    if meta.source_instance_id:
        _write_string(out, _TAG_INSTANCE, meta.source_instance_id)
    if meta.retry_count:
        _write_int64(out, _TAG_RETRY, meta.retry_count, "retry_count")
    if meta.scheduled_time_ms:
        _write_int64(out, _TAG_SCHEDULED, meta.scheduled_time_ms, "scheduled_time_ms")
    return bytes(out)


# --------------------------------------------------------------------------- decoding


def _read_varint(data: bytes, pos: int, what: str) -> tuple[int, int]:
    """Read an unsigned varint at ``pos``; return it (truncated to 64 bits) and the next pos.

    ``what`` names the thing being read, for the error message.
    """
    result = 0
    shift = 0
    # Iterating a slice is faster than indexing byte by byte, and bounds the read to the
    # longest legal varint.
    for byte in data[pos : pos + _MAX_VARINT_BYTES]:
        result |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            # Like the protobuf runtimes, keep the low 64 bits of an over-wide 10th byte.
            return result & _UINT64_MASK, pos + shift // 7
    if shift == 7 * _MAX_VARINT_BYTES:
        raise DecodeError("header", f"varint longer than 10 bytes in {what} at byte {pos}")
    raise DecodeError("header", f"truncated varint in {what} at byte {pos}")


def _read_int64(data: bytes, pos: int, what: str) -> tuple[int, int]:
    """Read a varint at ``pos`` as a signed int64; return it and the next pos."""
    value, pos = _read_varint(data, pos, what)
    if value > _INT64_MAX:
        value -= _TWO_TO_64
    return value, pos


def _read_string(data: bytes, pos: int, what: str) -> tuple[str, int]:
    """Read a length-delimited UTF-8 string at ``pos``; return it and the next pos."""
    # Ids are short: take a one-byte length without the varint loop (and its f-string).
    length = data[pos] if pos < len(data) else 0x80
    if length < 0x80:
        start = pos + 1
    else:
        length, start = _read_varint(data, pos, f"length of {what}")
    end = start + length
    if end > len(data):
        raise DecodeError(
            "header",
            f"truncated {what} at byte {pos}: length {length} but {len(data) - start} bytes left",
        )
    try:
        return data[start:end].decode(), end
    except UnicodeDecodeError as exc:
        raise DecodeError(
            "header", f"{what} at byte {pos} is not valid UTF-8: {exc.reason}"
        ) from exc


def _read_tag(data: bytes, pos: int) -> tuple[int, int]:
    """Read a tag (a varint of at most 5 bytes and 32 bits, as protobuf reads it)."""
    tag, nxt = _read_varint(data, pos, "tag")
    if nxt - pos > _MAX_TAG_BYTES or tag > _UINT32_MAX:
        raise DecodeError("header", f"tag at byte {pos} is longer than 32 bits")
    return tag, nxt


def _skip_field(data: bytes, pos: int, tag: int, tag_pos: int, *, in_group: bool = False) -> int:
    """Skip the value of a field the decoder does not keep; return the next position.

    Like protobuf, a field of a known number but an unexpected wire type is skipped as an
    unknown field (the message keeps its default), and a group is skipped to its matching
    end. Raises ``DecodeError`` for an invalid field number or wire type, an end of group
    that ends nothing, and truncated values. Inside a group, protobuf's parser takes field
    number 0 like any other, so this does too (found by coverage-guided fuzzing).
    """
    field_number = tag >> 3
    wire_type = tag & 0x07
    if field_number == 0 and not in_group:  # 2**29 - 1, the largest, fits a 32-bit tag
        raise DecodeError("header", f"invalid field number 0 at byte {tag_pos}")
    known = _KNOWN_FIELDS.get(field_number)
    what = f"field {field_number} ({known[0]})" if known else f"unknown field {field_number}"
    if wire_type == _WIRE_VARINT:
        return _read_varint(data, pos, what)[1]
    if wire_type == _WIRE_LEN:
        length, start = _read_varint(data, pos, f"length of {what}")
        end = start + length
        if end > len(data):
            raise DecodeError(
                "header",
                f"truncated {what} at byte {tag_pos}: "
                f"length {length} but {len(data) - start} bytes left",
            )
        return end
    if wire_type in (_WIRE_FIXED64, _WIRE_FIXED32):
        size = 8 if wire_type == _WIRE_FIXED64 else 4
        if pos + size > len(data):
            raise DecodeError(
                "header",
                f"truncated {what} at byte {tag_pos}: "
                f"{_WIRE_NAMES[wire_type]} value needs {size} bytes, {len(data) - pos} left",
            )
        return pos + size
    if wire_type == _WIRE_START_GROUP:
        # Skip every field up to the end of this group (nested groups included).
        while pos < len(data):
            inner_pos = pos
            inner, pos = _read_tag(data, pos)
            if inner & 0x07 == _WIRE_END_GROUP:
                if inner >> 3 != field_number:
                    raise DecodeError(
                        "header",
                        f"group of {what} at byte {tag_pos} ends with field {inner >> 3} "
                        f"at byte {inner_pos}",
                    )
                return pos
            pos = _skip_field(data, pos, inner, inner_pos, in_group=True)
        raise DecodeError("header", f"group of {what} at byte {tag_pos} has no end")
    if wire_type == _WIRE_END_GROUP:
        raise DecodeError("header", f"end of group {field_number} at byte {tag_pos} ends no group")
    raise DecodeError("header", f"{what} at byte {tag_pos} has invalid wire type {wire_type}")


def decode_metadata(data: bytes) -> TaskMetadata:
    """Decode the bytes of a Decaton ``TaskMetadataProto``.

    It accepts and rejects exactly what protobuf's own parser does, with the same values:
    fields may come in any order; when one repeats, the last value wins; fields this
    version does not know, groups, and a known field number with an unexpected wire type
    are skipped; a missing field holds its default, so empty bytes decode to all defaults.

    Args:
        data: the value of the ``dt_meta`` header.

    Returns:
        The decoded metadata.

    Raises:
        DecodeError: with ``part == "header"`` when the bytes are not a valid message: a
            truncated varint or length-delimited field, a varint over 10 bytes, a tag over
            32 bits, an id that is not UTF-8, an unmatched group, an invalid wire type or
            field number.
    """
    timestamp = 0
    application = ""
    instance = ""
    retry = 0
    scheduled = 0
    pos = 0
    end = len(data)
    while pos < end:
        tag_pos = pos
        tag = data[pos]
        if tag < 0x80:
            # Every tag of TaskMetadataProto fits in one byte: skip the varint loop.
            pos += 1
        else:
            tag, pos = _read_tag(data, pos)
        if tag == _TAG_TIMESTAMP:
            timestamp, pos = _read_int64(data, pos, "field 1 (timestamp_millis)")
        elif tag == _TAG_APPLICATION:
            application, pos = _read_string(data, pos, "field 2 (source_application_id)")
        elif tag == _TAG_INSTANCE:
            instance, pos = _read_string(data, pos, "field 3 (source_instance_id)")
        elif tag == _TAG_RETRY:
            retry, pos = _read_int64(data, pos, "field 4 (retry_count)")
        elif tag == _TAG_SCHEDULED:
            scheduled, pos = _read_int64(data, pos, "field 5 (scheduled_time_millis)")
        else:
            pos = _skip_field(data, pos, tag, tag_pos)
    return TaskMetadata(timestamp, application, instance, retry, scheduled)


def metadata_from_headers(
    headers: Sequence[tuple[str, bytes | None]], record_timestamp_ms: int
) -> TaskMetadata:
    """Return the metadata of a consumed record.

    A record without a ``dt_meta`` header (produced by a plain Kafka producer) is still a
    task: its metadata then holds the record timestamp and defaults elsewhere. A header that
    is present is used as is, even if its timestamp is 0, so what the producer wrote is
    what the processor sees. As in Kafka's ``Headers.lastHeader``, the last ``dt_meta``
    header wins.

    Args:
        headers: the record headers as ``(key, value)`` pairs, in record order.
        record_timestamp_ms: the record timestamp, used when there is no header.

    Returns:
        The decoded or derived metadata.

    Raises:
        DecodeError: with ``part == "header"`` when the ``dt_meta`` header is malformed or
            has a null value.
    """
    # Scan from the end: the last header wins and there are usually very few headers.
    for index in range(len(headers) - 1, -1, -1):
        key, value = headers[index]
        if key == METADATA_HEADER:
            if value is None:
                raise DecodeError("header", f"{METADATA_HEADER} header has a null value")
            if native_parse is not None:
                try:
                    m = native_parse(value)
                except Exception:
                    pass  # malformed: the strict decoder below raises with the reason
                else:
                    return TaskMetadata(
                        m.timestamp_millis,
                        m.source_application_id,
                        m.source_instance_id,
                        m.retry_count,
                        m.scheduled_time_millis,
                    )
            return decode_metadata(value)
    return TaskMetadata(record_timestamp_ms)


def scheduled_time_of(headers: Sequence[tuple[str, bytes]]) -> int:
    """The scheduled time (epoch ms, 0 for none) in a record's ``dt_meta`` header.

    The consume path's check: cheaper than `metadata_from_headers()`, and it validates
    the header the same way.

    Raises:
        DecodeError: with ``part == "header"`` when the ``dt_meta`` header is malformed.
    """
    for index in range(len(headers) - 1, -1, -1):
        key, value = headers[index]
        if key == METADATA_HEADER:
            if value is not None and native_parse is not None:
                try:
                    return int(native_parse(value).scheduled_time_millis)
                except Exception:
                    pass  # malformed: the strict path below raises with the reason
            return metadata_from_headers(headers, 0).scheduled_time_ms
    return 0


def _native_class() -> type[Any] | None:
    """``TaskMetadataProto`` of the protobuf runtime's C implementation (upb).

    On the consume path it reads a header about twice as fast as the pure-Python decoder
    and accepts exactly the same inputs with the same values (a property test holds the
    two together), so either may read a header. A header it cannot parse is handed to
    `decode_metadata()`, whose error says why.
    """
    try:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
        from google.protobuf.internal import api_implementation
    except ImportError:  # pragma: no cover - protobuf is a dependency
        return None
    if api_implementation.Type() != "upb":
        return None
    field = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(
        name="decaton_aio/task_metadata.proto",
        package="com.linecorp.decaton.protocol",
        syntax="proto3",
    )
    message = proto.message_type.add(name="TaskMetadataProto")
    for number, (name, kind) in enumerate(
        [
            ("timestamp_millis", field.TYPE_INT64),
            ("source_application_id", field.TYPE_STRING),
            ("source_instance_id", field.TYPE_STRING),
            ("retry_count", field.TYPE_INT64),
            ("scheduled_time_millis", field.TYPE_INT64),
        ],
        start=1,
    ):
        message.field.add(name=name, number=number, type=kind, label=field.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    message_class: type[Any] = message_factory.GetMessageClass(
        pool.FindMessageTypeByName("com.linecorp.decaton.protocol.TaskMetadataProto")
    )
    return message_class


_NATIVE_CLASS = _native_class()

#: ``TaskMetadataProto.FromString`` of the protobuf runtime's C implementation, or
#: ``None`` without it; the consume path's cheapest way to read a ``dt_meta`` field.
native_parse: Callable[[bytes], Any] | None = (
    _NATIVE_CLASS.FromString if _NATIVE_CLASS is not None else None
)


def new_native_message() -> Any | None:
    """A ``TaskMetadataProto`` of the C implementation to parse into again and again
    (``ParseFromString`` clears it first; a quarter cheaper than ``FromString``), or
    ``None`` without the C implementation. One per event loop: it is not thread-safe."""
    return _NATIVE_CLASS() if _NATIVE_CLASS is not None else None
