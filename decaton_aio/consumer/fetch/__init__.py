"""The consumer's fetch loop of its own, on aiokafka's connections, protocol types and
record batch reader: fetch sessions, one request in flight per broker, records read
straight into the runtime's `TaskRecord` (see
`decaton_aio.consumer.fetch._fetcher`)."""

from __future__ import annotations

from decaton_aio.consumer.fetch._config import FetchConfig, FetchCounters
from decaton_aio.consumer.fetch._fetcher import Fetcher, LogTruncationError
from decaton_aio.consumer.fetch._session import FetchPlan, FetchSession

__all__ = [
    "FetchConfig",
    "FetchCounters",
    "FetchPlan",
    "FetchSession",
    "Fetcher",
    "LogTruncationError",
]
