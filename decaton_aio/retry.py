"""Where failed and diverted tasks go: retry, dead letter and shaping topics.

This module owns the naming of the side topics and the records written to them:

- a *retry* record (``<topic>-retry``) is the original key, body and headers with the
  ``dt_meta`` retry count raised by one and a scheduled time set to now plus the backoff,
  plus headers remembering where the task first came from and when it first failed;
- a *dead letter* record (``<topic>-dlq``) is the original key, body and headers plus
  headers saying what went wrong (`DLQ_HEADERS`), readable by the Spark backfill
  job;
- a *shaping* record (``<topic>-shaping``) is the original record, unchanged.

Retry and dead letter records are stamped with the time they are sent, so retention on
their topics counts from the failure; when the task was produced stays in ``dt_meta``.

Retries of a retry go to the same retry topic: names are derived from the *origin* topic,
with a known suffix stripped.

[`RetryConfig`][decaton_aio.RetryConfig] lives with the policy it carries in
`decaton_aio.backoff`; it is importable from here too.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass

from decaton_aio.backoff import RetryConfig
from decaton_aio.errors import ConfigError
from decaton_aio.metadata import METADATA_HEADER, TaskMetadata, encode_metadata

__all__ = [
    "DLQ_HEADERS",
    "ORIGIN_HEADERS",
    "RetryConfig",
    "SideTopics",
    "dead_letter_headers",
    "retry_headers",
]

Headers = list[tuple[str, bytes]]

#: Headers a retry record carries so later attempts and the dead letter know the origin.
ORIGIN_HEADERS = (
    "dt_origin_topic",
    "dt_origin_partition",
    "dt_origin_offset",
    "dt_first_failure_ms",
)

#: Headers added to a dead letter record (UTF-8 text values).
DLQ_HEADERS = (
    "dt_dlq_error_type",
    "dt_dlq_error_message",
    "dt_dlq_traceback",
    "dt_dlq_origin_topic",
    "dt_dlq_origin_partition",
    "dt_dlq_origin_offset",
    "dt_dlq_attempts",
    "dt_dlq_first_failure_ms",
    "dt_dlq_last_failure_ms",
)

_TRACEBACK_FRAMES = 8
_MAX_MESSAGE = 1000


@dataclass(frozen=True)
class SideTopics:
    """Names and shape of the side topics of a task topic.

    Attributes:
        retry: the retry topic is the origin topic plus this.
        dead_letter: the dead letter topic is the origin topic plus this.
        shaping: the shaping topic (hot keys over their quota) is the origin plus this.
        replication_factor: replicas of a side topic the subscription creates; ``None``:
            3, or the number of brokers when the cluster has fewer. Partition count,
            ``retention.ms`` and ``max.message.bytes`` are copied from the task topic.
    """

    retry: str = "-retry"
    dead_letter: str = "-dlq"
    shaping: str = "-shaping"
    replication_factor: int | None = None

    def __post_init__(self) -> None:
        suffixes = (self.retry, self.dead_letter, self.shaping)
        if any(not s for s in suffixes) or len(set(suffixes)) != 3:
            raise ConfigError(f"side topic suffixes must be distinct and non-empty: {suffixes}")
        if self.replication_factor is not None and self.replication_factor < 1:
            raise ConfigError(
                f"side topic replication_factor must be >= 1 (or None for up to 3), "
                f"got {self.replication_factor}"
            )

    def origin(self, topic: str) -> str:
        """The task topic a (possibly side) topic belongs to."""
        for suffix in (self.retry, self.shaping):
            if topic.endswith(suffix):
                return topic[: -len(suffix)]
        return topic

    def retry_topic(self, topic: str) -> str:
        """Where retries of tasks from ``topic`` go."""
        return self.origin(topic) + self.retry

    def dead_letter_topic(self, topic: str) -> str:
        """Where tasks from ``topic`` that cannot be processed go."""
        return self.origin(topic) + self.dead_letter

    def shaping_topic(self, topic: str) -> str:
        """Where tasks of hot keys from ``topic`` go."""
        return self.origin(topic) + self.shaping

    def is_shaping(self, topic: str) -> bool:
        """Whether ``topic`` is a shaping topic."""
        return topic.endswith(self.shaping)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _without(headers: Sequence[tuple[str, bytes]], names: Sequence[str]) -> Headers:
    drop = set(names)
    return [(k, v) for k, v in headers if k not in drop]


def _header(headers: Sequence[tuple[str, bytes]], name: str) -> bytes | None:
    found = None
    for k, v in headers:
        if k == name:
            found = v
    return found


def retry_headers(
    headers: Sequence[tuple[str, bytes]],
    meta: TaskMetadata,
    *,
    topic: str,
    partition: int,
    offset: int,
    delay_s: float,
    now_ms: int | None = None,
) -> Headers:
    """The headers of the retry record of a task that failed now.

    Args:
        headers: the failed record's headers.
        meta: its task metadata.
        topic: the failed record's topic (origin headers are kept from an earlier retry).
        partition: its partition.
        offset: its offset.
        delay_s: the backoff; the retry is scheduled at now plus this.
        now_ms: the time of the failure (for tests).

    Returns:
        Headers with a ``dt_meta`` of retry count + 1 and the scheduled time, and the
        origin headers.
    """
    now = _now_ms() if now_ms is None else now_ms
    retried = TaskMetadata(
        timestamp_ms=meta.timestamp_ms,
        source_application_id=meta.source_application_id,
        source_instance_id=meta.source_instance_id,
        retry_count=meta.retry_count + 1,
        scheduled_time_ms=now + round(delay_s * 1000),
    )
    out = _without(headers, (METADATA_HEADER,))
    if _header(headers, "dt_origin_topic") is None:
        out += [
            ("dt_origin_topic", topic.encode()),
            ("dt_origin_partition", str(partition).encode()),
            ("dt_origin_offset", str(offset).encode()),
            ("dt_first_failure_ms", str(now).encode()),
        ]
    out.append((METADATA_HEADER, encode_metadata(retried)))
    return out


def dead_letter_headers(
    headers: Sequence[tuple[str, bytes]],
    *,
    error_type: str,
    message: str,
    exc: BaseException | None,
    topic: str,
    partition: int,
    offset: int,
    attempts: int,
    timestamp_ms: int,
    now_ms: int | None = None,
) -> Headers:
    """The headers of the dead letter record of a task.

    Args:
        headers: the record's headers (kept, with the DLQ headers appended).
        error_type: the exception class name, or ``DecodeError:body``-style for poison pills.
        message: one line saying what went wrong.
        exc: the exception, for a short traceback (``None`` for decode failures).
        topic: the record's topic; the origin headers of a retried task win over it.
        partition: its partition.
        offset: its offset.
        attempts: how many times it was processed.
        timestamp_ms: the record's timestamp. The dead letter record is stamped with the
            time it is sent, so a record without ``dt_meta`` gets one holding this time:
            when the task was produced stays readable.
        now_ms: the time of the last failure (for tests).

    Returns:
        The original headers (without DLQ headers from an earlier dead-lettering) plus
        `DLQ_HEADERS`, and a ``dt_meta`` if the record had none.
    """
    now = _now_ms() if now_ms is None else now_ms
    origin_topic = _header(headers, "dt_origin_topic") or topic.encode()
    origin_partition = _header(headers, "dt_origin_partition") or str(partition).encode()
    origin_offset = _header(headers, "dt_origin_offset") or str(offset).encode()
    first = _header(headers, "dt_first_failure_ms") or str(now).encode()
    trace = ""
    if exc is not None:
        trace = "".join(traceback.format_exception(exc, limit=-_TRACEBACK_FRAMES))
    out = _without(headers, DLQ_HEADERS)
    if _header(headers, METADATA_HEADER) is None:
        out.append((METADATA_HEADER, encode_metadata(TaskMetadata(timestamp_ms))))
    out += [
        ("dt_dlq_error_type", error_type.encode()),
        ("dt_dlq_error_message", message[:_MAX_MESSAGE].encode(errors="replace")),
        ("dt_dlq_traceback", trace[-4000:].encode(errors="replace")),
        ("dt_dlq_origin_topic", origin_topic),
        ("dt_dlq_origin_partition", origin_partition),
        ("dt_dlq_origin_offset", origin_offset),
        ("dt_dlq_attempts", str(attempts).encode()),
        ("dt_dlq_first_failure_ms", first),
        ("dt_dlq_last_failure_ms", str(now).encode()),
    ]
    return out
