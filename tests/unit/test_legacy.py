"""The pre-Decaton-9 ``DecatonTaskRequest`` wrapper: decoding, unwrapping, the hint."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from decaton_aio.consumer._legacy import decode_task_request, legacy_hint, unwrap
from decaton_aio.consumer._records import TaskRecord
from decaton_aio.errors import DecodeError
from decaton_aio.metadata import METADATA_HEADER, TaskMetadata, decode_metadata, encode_metadata
from tests.unit.protobuf_helpers import decaton_task_request_class


def _wrapped(task: bytes = b"body", **metadata: Any) -> bytes:
    request = decaton_task_request_class()()
    for name, value in metadata.items():
        setattr(request.metadata, name, value)
    request.serialized_task = task
    return bytes(request.SerializeToString())


def _record(value: bytes | None, headers: list[tuple[str, bytes]] | None = None) -> TaskRecord:
    return TaskRecord(7, 1_700_000_000_000, b"key", value, headers or [])


def test_decode_splits_metadata_and_task() -> None:
    """The metadata and task protobuf wrote come back out: the metadata as bytes that
    decode to the same fields, the task unchanged."""
    value = _wrapped(
        b"\x00task\xff",
        timestamp_millis=1_600_000_000_123,
        source_application_id="app",
        source_instance_id="host-1",
        retry_count=2,
        scheduled_time_millis=1_600_000_009_000,
    )
    metadata, task = decode_task_request(value)
    assert task == b"\x00task\xff"
    assert decode_metadata(metadata) == TaskMetadata(
        1_600_000_000_123, "app", "host-1", 2, 1_600_000_009_000
    )


def test_a_value_that_is_no_wrapper_is_a_body_error_naming_the_format() -> None:
    """A value protobuf cannot parse as a DecatonTaskRequest is a DecodeError of the body
    that says what was expected."""
    with pytest.raises(DecodeError, match="not a pre-Decaton-9 DecatonTaskRequest") as caught:
        decode_task_request(b'{"json": true}')
    assert caught.value.part == "body"


def _protobuf_reading(value: bytes) -> tuple[TaskMetadata, bytes] | None:
    request = decaton_task_request_class()()
    try:
        request.ParseFromString(value)
    except Exception:
        return None
    m = request.metadata
    meta = TaskMetadata(
        m.timestamp_millis,
        m.source_application_id,
        m.source_instance_id,
        m.retry_count,
        m.scheduled_time_millis,
    )
    return meta, bytes(request.serialized_task)


def _our_reading(value: bytes) -> tuple[TaskMetadata, bytes] | None:
    try:
        metadata, task = decode_task_request(value)
    except DecodeError:
        return None
    return decode_metadata(metadata), task


_field_shaped = st.lists(
    st.one_of(
        st.binary(max_size=6),
        st.builds(
            lambda tag, body: bytes([tag, len(body)]) + body,
            st.sampled_from([0x0A, 0x12, 0x1A, 0x08]),
            st.binary(max_size=12),
        ),
        st.builds(
            lambda ts, app: _wrapped(b"t", timestamp_millis=ts, source_application_id=app),
            st.integers(-(2**63), 2**63 - 1),
            st.text(max_size=4),
        ),
    ),
    max_size=4,
).map(b"".join)


@given(st.one_of(st.binary(max_size=40), _field_shaped))
@example(b"\n\x07!\x00\x00\x00\x00\x00\x00\n\x02\x00\x00\x08\x00")  # truncated halves
def test_reads_what_protobuf_reads(value: bytes) -> None:
    """For random and field-shaped bytes, the decoder accepts exactly what protobuf's
    parser accepts, with the same metadata and task."""
    assert _our_reading(value) == _protobuf_reading(value)


def test_unwrap_moves_metadata_into_a_header_and_keeps_the_record() -> None:
    """The unwrapped record has the task as its value and the metadata in dt_meta after
    the record's own headers; offset, timestamp and key are unchanged."""
    record = _record(_wrapped(b"task", timestamp_millis=5, retry_count=1), [("trace", b"t")])
    out = unwrap(record)
    assert (out.offset, out.timestamp, out.key, out.value) == (7, record.timestamp, b"key", b"task")
    assert [name for name, _ in out.headers] == ["trace", METADATA_HEADER]
    assert decode_metadata(out.headers[-1][1]) == TaskMetadata(5, retry_count=1)


def test_hint_names_the_property_for_a_wrapped_record_only() -> None:
    """The hint appears for a wrapper without dt_meta; not for a record with dt_meta, nor
    for a value that is no wrapper, nor for a wrapper without a production time."""
    wrapped = _wrapped(b"task", timestamp_millis=1_600_000_000_000, source_application_id="a")
    hint = legacy_hint(_record(wrapped))
    assert hint is not None
    assert "decaton.legacy.parse.fallback.enabled=true" in hint
    meta = encode_metadata(TaskMetadata(1))
    assert legacy_hint(_record(wrapped, [(METADATA_HEADER, meta)])) is None
    assert legacy_hint(_record(b'{"n": 1}')) is None
    assert legacy_hint(_record(_wrapped(b"task", source_application_id="a"))) is None
    assert legacy_hint(_record(None)) is None
