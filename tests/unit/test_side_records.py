"""The records written to side topics: what their headers say."""

from __future__ import annotations

from decaton_aio.metadata import METADATA_HEADER, TaskMetadata, decode_metadata, encode_metadata
from decaton_aio.retry import dead_letter_headers, retry_headers


def _dead(headers: list[tuple[str, bytes]]) -> dict[str, bytes]:
    return dict(
        dead_letter_headers(
            headers,
            error_type="ValueError",
            message="bad",
            exc=None,
            topic="orders",
            partition=1,
            offset=42,
            attempts=1,
            timestamp_ms=1_000,
            now_ms=9_000,
        )
    )


def test_a_dead_letter_of_a_plain_record_gets_dt_meta_with_the_task_time() -> None:
    out = _dead([("trace", b"t")])
    assert decode_metadata(out[METADATA_HEADER]) == TaskMetadata(1_000)
    assert out["trace"] == b"t"
    assert out["dt_dlq_last_failure_ms"] == b"9000"


def test_a_dead_letter_keeps_the_dt_meta_it_has_even_a_malformed_one() -> None:
    """The original header is evidence (a poison pill's may not decode): kept byte for byte."""
    meta = encode_metadata(TaskMetadata(5, "shop", retry_count=2))
    assert _dead([(METADATA_HEADER, meta)])[METADATA_HEADER] == meta
    assert _dead([(METADATA_HEADER, b"\xff\xff")])[METADATA_HEADER] == b"\xff\xff"


def test_a_retry_keeps_the_task_time_and_schedules_after_the_backoff() -> None:
    meta = TaskMetadata(1_000, "shop", retry_count=1)
    out = dict(
        retry_headers(
            [(METADATA_HEADER, encode_metadata(meta))],
            meta,
            topic="orders",
            partition=0,
            offset=7,
            delay_s=0.5,
            now_ms=9_000,
        )
    )
    retried = decode_metadata(out[METADATA_HEADER])
    assert (retried.timestamp_ms, retried.retry_count) == (1_000, 2)
    assert retried.scheduled_time_ms == 9_500
    assert out["dt_origin_offset"] == b"7"
