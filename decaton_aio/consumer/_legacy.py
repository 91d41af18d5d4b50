"""Task records written before Decaton 9: the ``DecatonTaskRequest`` wrapper.

Before Decaton 9 a task record had no ``dt_meta`` header: its value was the protobuf
message ``com.linecorp.decaton.protocol.internal.DecatonTaskRequest``:

```text
message DecatonTaskRequest {
    TaskMetadataProto metadata = 1;
    bytes serialized_task = 2;
}
```

Decaton 9 still writes it when asked to (``DecatonClient``'s deprecated
``produceInOldTaskRequest``, a subscription's ``decaton.retry.task.in.legacy.format``)
and reads it with ``decaton.legacy.parse.fallback.enabled``, as the runtime does with the
same property: `unwrap()` turns such a record into the current format (body in the
value, metadata in ``dt_meta``) before anything else reads it. Without the property,
`legacy_hint()` makes the dead letter reason of an undecodable body say when the
value is such a wrapper.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from decaton_aio.consumer._records import TaskRecord
from decaton_aio.errors import DecodeError
from decaton_aio.metadata import (
    METADATA_HEADER,
    _read_tag,
    _read_varint,
    _skip_field,
    decode_metadata,
)
from decaton_aio.typing import Record

__all__ = ["decode_task_request", "has_metadata_header", "legacy_hint", "unwrap"]

_TAG_METADATA: Final = 0x0A  # field 1, length-delimited
_TAG_TASK: Final = 0x12  # field 2, length-delimited


def has_metadata_header(headers: Sequence[tuple[str, bytes]]) -> bool:
    """Whether a record carries a ``dt_meta`` header."""
    return any(key == METADATA_HEADER for key, _ in headers)


def _length_delimited(data: bytes, pos: int, what: str) -> tuple[bytes, int]:
    length, start = _read_varint(data, pos, f"length of {what}")
    end = start + length
    if end > len(data):
        raise DecodeError(
            "body",
            f"truncated {what} at byte {pos}: length {length} but {len(data) - start} bytes left",
        )
    return data[start:end], end


def decode_task_request(value: bytes) -> tuple[bytes, bytes]:
    """Split a ``DecatonTaskRequest`` into its metadata bytes and its task bytes.

    As protobuf's parser: fields in any order, a repeated ``metadata`` merges (each one
    must parse on its own; their bytes concatenate), a repeated ``serialized_task`` keeps
    the last, unknown fields are skipped, absent fields are empty.

    Raises:
        DecodeError: with ``part == "body"`` when the value is not such a message or its
            metadata is not a ``TaskMetadataProto``.
    """
    metadata = b""
    task = b""
    pos = 0
    try:
        while pos < len(value):
            tag_pos = pos
            tag, pos = _read_tag(value, pos)
            if tag == _TAG_METADATA:
                part, pos = _length_delimited(value, pos, "field 1 (metadata)")
                # Each occurrence must parse on its own (two truncated halves can join
                # into a valid message); valid occurrences concatenate into a valid one.
                decode_metadata(part)
                metadata += part
            elif tag == _TAG_TASK:
                task, pos = _length_delimited(value, pos, "field 2 (serialized_task)")
            else:
                pos = _skip_field(value, pos, tag, tag_pos)
    except DecodeError as exc:
        raise DecodeError(
            "body",
            "no dt_meta header and the value is not a pre-Decaton-9 DecatonTaskRequest "
            f"(decaton.legacy.parse.fallback.enabled is on): {exc.reason}",
        ) from exc
    return metadata, task


def unwrap(record: Record) -> TaskRecord:
    """The record in the current format: the wrapped task as the value, its metadata in
    a ``dt_meta`` header after the record's own headers; offset, timestamp and key kept.

    Raises:
        DecodeError: the value is not a ``DecatonTaskRequest`` (see
            `decode_task_request()`).
    """
    metadata, task = decode_task_request(record.value or b"")
    headers = [*record.headers, (METADATA_HEADER, metadata)]
    unwrapped = TaskRecord(record.offset, record.timestamp, record.key, task, headers)
    if isinstance(record, TaskRecord):
        unwrapped.size = record.size  # what its partition counts it for
    return unwrapped


def legacy_hint(record: Record) -> str | None:
    """What to add to the reason of a body that did not decode when the record looks like
    a pre-Decaton-9 one: no ``dt_meta``, and a value that is a ``DecatonTaskRequest`` with
    both fields, the metadata holding a production time; else ``None``."""
    value = record.value
    if not value or value[0] != _TAG_METADATA or has_metadata_header(record.headers):
        return None
    try:
        metadata, task = decode_task_request(value)
    except DecodeError:
        return None
    if not task or decode_metadata(metadata).timestamp_ms <= 0:
        return None
    return (
        "the value looks like a pre-Decaton-9 DecatonTaskRequest (metadata and task wrapped "
        "in the value, no dt_meta header): set decaton.legacy.parse.fallback.enabled=true "
        "to read such records"
    )
