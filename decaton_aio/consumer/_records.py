"""The records the runtime processes, as aiokafka's fetcher decodes them.

aiokafka turns every fetched record into a ``ConsumerRecord``: a dataclass with an instance
dictionary and eleven fields, built by a Python call per record. On a no-op workload that
construction is a third of a plain consumer's CPU time, and each one costs about 350 bytes
while it waits. The runtime needs five fields (offset, timestamp, key, value, headers), and
the record objects aiokafka's batch reader already made (C extension types) carry them, so
a consumer made with `RAW_RECORDS` as its key deserializer gets those objects as they
are. Topic and partition are known from the partition a record was fetched for.

`install_raw_records()` adds that choice to aiokafka's ``PartitionRecords`` once per
process (`decaton_aio._aiokafka.install_record_hook()`). Consumers without the marker
get ``ConsumerRecord`` exactly as before (one identity check per record). If aiokafka's
internals ever change shape, nothing is hooked and the marker behaves as an identity key
deserializer: the runtime then receives ``ConsumerRecord`` objects, which carry the same
five fields.

A partition keeps each record it is fed as a `TaskRecord` (`task_record()`):
its fields read once, compact while it waits for its key or a slot.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mypy_extensions import i64

from decaton_aio.metadata import METADATA_HEADER
from decaton_aio.typing import Record

__all__ = ["RAW_RECORDS", "TaskRecord", "install_raw_records", "scheduled_time_in", "task_record"]


class TaskRecord:
    """A record as its partition keeps it, from the feed until its offset completes.

    The fetched record's five fields, read once when it is fed (each later read is a
    plain attribute of a compiled class, where aiokafka's record type answers each one
    through a descriptor), in about 60% of the memory of aiokafka's record while it
    waits: most records carry exactly one header, ``dt_meta``, which aiokafka keeps as a
    list holding a tuple of a new key string and the value (about 230 bytes); this keeps
    only the value then (``packed_headers`` is the ``bytes``), and any other header list
    as it is. A partition with 100,000 pending records holds mostly these.

    Attributes:
        offset, timestamp, key, value: the fetched record's.
        packed_headers: the ``dt_meta`` header's value when it is the only header, else
            the header list as fetched.
        size: the bytes it counts for while pending (``decaton.max.pending.bytes``): its
            value's length when it was fed.
        queued_at: when it last started waiting for its key or a slot
            (``time.monotonic()``), for the lane and slot wait metrics (sampled: see
            ``consumer/_partition.py``).
    """

    __slots__ = ("key", "offset", "packed_headers", "queued_at", "size", "timestamp", "value")

    def __init__(
        self,
        offset: int,
        timestamp: int,
        key: bytes | None,
        value: bytes | None,
        packed_headers: bytes | Sequence[tuple[str, bytes]],
        queued_at: float = 0.0,
    ) -> None:
        self.offset = offset
        self.timestamp = timestamp
        self.key = key
        self.value = value
        self.packed_headers = packed_headers
        self.size = len(value) if value is not None else 0
        self.queued_at = queued_at

    @property
    def headers(self) -> Sequence[tuple[str, bytes]]:
        """The record headers, as fetched."""
        packed = self.packed_headers
        if type(packed) is bytes:
            return [(METADATA_HEADER, packed)]
        return packed  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"TaskRecord(offset={self.offset}, key={self.key!r})"


def task_record(record: Record) -> TaskRecord:
    """The record as a partition keeps it (itself when it is one already)."""
    if isinstance(record, TaskRecord):
        return record
    fetched: Any = record  # its fields as they are (compiled, no int unboxed and boxed again)
    headers: Any = fetched.headers  # Kafka allows a null header value
    packed: bytes | Sequence[tuple[str, bytes]] = headers or ()
    # A list of one (name, value) pair, as aiokafka fetches it: read as typed values,
    # compiled, without a generic item lookup or comparison.
    if type(headers) is list:
        listed: list[Any] = headers
        if len(listed) == 1:
            header = listed[0]
            if type(header) is tuple and len(header) == 2:
                pair: tuple[Any, Any] = header
                name, value = pair
                if isinstance(name, str) and name == METADATA_HEADER and type(value) is bytes:
                    packed = value
    elif len(headers) == 1:  # another sequence (a ConsumerRecord's)
        header = headers[0]
        if header[0] == METADATA_HEADER and type(header[1]) is bytes:
            packed = header[1]
    return TaskRecord(fetched.offset, fetched.timestamp, fetched.key, fetched.value, packed)


def scheduled_time_in(raw: bytes) -> int | None:
    """The scheduled time (epoch ms, 0 for none) in a ``dt_meta`` header's value, read
    without a protobuf message; ``None`` when the header is not in the plain shape read here.

    The plain shape is what producers write: the five fields of ``TaskMetadataProto`` in
    any order, each with its declared wire type, integers shorter than 10 bytes (not
    negative), ids of ASCII shorter than 128 bytes. Every header in that shape is valid,
    and the value read is the one protobuf reads (the last of repeated fields). For
    anything else (an unknown field, a negative or truncated integer, an id in UTF-8
    beyond ASCII), ``None`` says to parse the header with protobuf, which accepts it or
    says what is wrong. Compiled, this costs a fraction of a protobuf parse.
    """
    # Native 64-bit integers, compiled: plain machine arithmetic.
    end: i64 = len(raw)
    pos: i64 = 0
    scheduled: i64 = 0
    while pos < end:
        tag: i64 = raw[pos]
        pos += 1
        if tag == 0x12 or tag == 0x1A:  # an id (fields 2 and 3): length, then ASCII
            if pos >= end:
                return None
            length: i64 = raw[pos]
            stop = pos + 1 + length
            if length >= 0x80 or stop > end:
                return None
            pos += 1
            while pos < stop:
                if raw[pos] >= 0x80:
                    return None
                pos += 1
        elif tag == 0x08 or tag == 0x20 or tag == 0x28:  # an int64 (fields 1, 4 and 5)
            value: i64 = 0
            shift: i64 = 0
            while True:
                if pos >= end or shift == 63:  # truncated, or 10 bytes long: protobuf's
                    return None
                byte: i64 = raw[pos]
                pos += 1
                value |= (byte & 0x7F) << shift
                shift += 7
                if byte < 0x80:
                    break
            if tag == 0x28:
                scheduled = value
        else:
            return None
    return scheduled


def RAW_RECORDS(key: bytes | None) -> bytes | None:
    """Key deserializer that marks a consumer as taking aiokafka's records as they are.

    Called only if `install_raw_records()` could not hook aiokafka; it returns the
    key as is.
    """
    return key


def install_raw_records() -> bool:
    """Hook aiokafka so consumers marked with `RAW_RECORDS` skip ``ConsumerRecord``.

    Idempotent.

    Returns:
        Whether the hook is in place (``False``: this aiokafka version is not supported
        and marked consumers get ordinary ``ConsumerRecord`` objects).
    """
    from decaton_aio._aiokafka import install_record_hook

    return install_record_hook(RAW_RECORDS)
