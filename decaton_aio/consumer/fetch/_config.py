"""The fetch loop's settings and counters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

__all__ = [
    "DEFAULT_MAX_BUFFERED_BYTES",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_PARTITION_BYTES",
    "DEFAULT_MAX_WAIT_MS",
    "FetchConfig",
    "FetchCounters",
]

DEFAULT_MAX_WAIT_MS: Final = 500
DEFAULT_MAX_BYTES: Final = 52_428_800
DEFAULT_MAX_PARTITION_BYTES: Final = 1_048_576
DEFAULT_MAX_BUFFERED_BYTES: Final = 33_554_432

IsolationLevel = Literal["read_uncommitted", "read_committed"]
OffsetReset = Literal["earliest", "latest", "none"]


@dataclass(frozen=True)
class FetchConfig:
    """How the fetch loop asks the brokers for records.

    Attributes:
        min_bytes: the bytes a broker gathers before it answers (``fetch.min.bytes``),
            unless ``max_wait_ms`` passes first; `Fetcher.set_pacing()` changes both while
            the loop runs.
        max_wait_ms: the longest a broker holds a request for ``min_bytes``.
        max_bytes: the most bytes of one response (``fetch.max.bytes``).
        max_partition_bytes: the most bytes of one partition per response
            (``max.partition.fetch.bytes``); a larger first batch still comes whole.
        max_buffered_bytes: the fetched bytes waiting for `Fetcher.getmany()` above which
            no broker is asked for more.
        isolation_level: ``read_committed`` hides aborted transactions' records.
        auto_offset_reset: where a partition without a valid offset starts: ``earliest``,
            ``latest`` or ``none`` (`Fetcher.getmany()` raises instead).
        check_crcs: verify each batch's checksum.
        sessions: fetch sessions (incremental requests); ``False``: every request names
            every partition.
        retry_backoff_ms: the wait after a failed request, between forced metadata updates
            while a leader is unknown, and before a partition a broker failed with an
            unknown error is fetched again.
        rack_id: the consumer's rack, sent with each request ("" for none).
    """

    min_bytes: int = 1
    max_wait_ms: int = DEFAULT_MAX_WAIT_MS
    max_bytes: int = DEFAULT_MAX_BYTES
    max_partition_bytes: int = DEFAULT_MAX_PARTITION_BYTES
    max_buffered_bytes: int = DEFAULT_MAX_BUFFERED_BYTES
    isolation_level: IsolationLevel = "read_uncommitted"
    auto_offset_reset: OffsetReset = "latest"
    check_crcs: bool = True
    sessions: bool = True
    retry_backoff_ms: int = 100
    rack_id: str = ""

    def __post_init__(self) -> None:
        for name in ("min_bytes", "max_bytes", "max_partition_bytes", "max_buffered_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"FetchConfig.{name} must be at least 1")
        for name in ("max_wait_ms", "retry_backoff_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"FetchConfig.{name} must not be negative")
        if self.isolation_level not in ("read_uncommitted", "read_committed"):
            raise ValueError(
                "FetchConfig.isolation_level is read_uncommitted or read_committed, "
                f"not {self.isolation_level!r}"
            )
        if self.auto_offset_reset not in ("earliest", "latest", "none"):
            raise ValueError(
                "FetchConfig.auto_offset_reset is earliest, latest or none, "
                f"not {self.auto_offset_reset!r}"
            )

    @property
    def read_committed(self) -> bool:
        """Whether aborted transactions are hidden."""
        return self.isolation_level == "read_committed"


@dataclass
class FetchCounters:
    """What the fetch loop did since it started.

    Attributes:
        cycles: `Fetcher.getmany()` calls.
        requests: fetch requests sent, of which ``full_requests`` named every partition
            and ``incremental_requests`` only what changed in their session.
        responses: fetch responses taken.
        bytes: record bytes received.
        records: records handed out.
        session_resets: times a session started over.
        sessions_closed: sessions the brokers closed at `Fetcher.stop()`.
        throttled_ms: time the brokers asked the loop to wait.
        offset_resets: partitions placed by the reset policy.
        errors: requests that failed, partitions answered with an error.
        truncations: times a leader's log parted from records fetched before (a leader
            elected without them): the partition fetched again from where they part.
    """

    cycles: int = 0
    requests: int = 0
    full_requests: int = 0
    incremental_requests: int = 0
    responses: int = 0
    bytes: int = 0
    records: int = 0
    session_resets: int = 0
    sessions_closed: int = 0
    throttled_ms: int = 0
    offset_resets: int = 0
    errors: int = 0
    truncations: int = 0
