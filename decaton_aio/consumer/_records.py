"""The records the runtime processes, as aiokafka's fetcher decodes them.

aiokafka turns every fetched record into a ``ConsumerRecord``: a dataclass with an instance
dictionary and eleven fields, built by a Python call per record. On a no-op workload that
construction is a third of a plain consumer's CPU time, and each one costs about 350 bytes
while it waits. The runtime needs five fields (offset, timestamp, key, value, headers), and
the record objects aiokafka's batch reader already made (C extension types) carry them, so
a consumer made with :data:`RAW_RECORDS` as its key deserializer gets those objects as they
are. Topic and partition are known from the partition a record was fetched for.

:func:`install_raw_records` adds that choice to aiokafka's ``PartitionRecords`` once per
process. Consumers without the marker get ``ConsumerRecord`` exactly as before (one
identity check per record). If aiokafka's internals ever change shape, nothing is hooked
and the marker behaves as an identity key deserializer: the runtime then receives
``ConsumerRecord`` objects, which carry the same five fields.

A record that has to wait for its key or for a slot is kept as a :class:`QueuedRecord`
(:func:`queued`), a compact tuple, so a partition with many pending records stays small.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import structlog
from mypy_extensions import mypyc_attr

from decaton_aio.metadata import METADATA_HEADER
from decaton_aio.typing import Record

__all__ = ["RAW_RECORDS", "QueuedRecord", "install_raw_records", "new_queued", "queued"]

log = structlog.get_logger("decaton_aio.consumer")


class _Fields(NamedTuple):
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    packed_headers: bytes | Sequence[tuple[str, bytes]]
    queued_at: float = 0.0


@mypyc_attr(native_class=False)  # compiled, a tuple subclass stays a Python class
class QueuedRecord(_Fields):
    """A record waiting for its turn, in about 60% of the memory of aiokafka's record.

    Most records carry exactly one header, ``dt_meta``; aiokafka keeps it as a list
    holding a tuple of a new key string and the value (about 230 bytes). A queued record
    keeps only the value then (``packed_headers`` is the ``bytes``), and any other header
    list as it is. A partition with 100,000 pending records holds mostly these.
    ``queued_at`` is when it started waiting (``time.monotonic()``), for the lane and slot
    wait metrics (sampled: see ``consumer/_partition.py``).
    """

    __slots__ = ()

    @property
    def headers(self) -> Sequence[tuple[str, bytes]]:
        """The record headers, as fetched."""
        packed = self.packed_headers
        if type(packed) is bytes:
            return [(METADATA_HEADER, packed)]
        return packed  # type: ignore[return-value]


#: ``new_queued(QueuedRecord, fields)``: skips NamedTuple's Python-level ``__new__``.
new_queued = tuple.__new__


def queued(record: Record, key: bytes | None, now: float) -> QueuedRecord:
    """The compact form of a record that has to wait (in a key lane or the ready queue),
    waiting from ``now``.

    Args:
        record: the fetched record, or a queued one that starts waiting again.
        key: its key (equal to ``record.key``): pass the key object of the records already
            waiting for the same key, so they all share one.
        now: ``time.monotonic()``, when it starts waiting.
    """
    if type(record) is QueuedRecord:
        return new_queued(QueuedRecord, (*record[:5], now))
    fetched: Any = record  # its fields as they are (compiled, no int unboxed and boxed again)
    headers: Sequence[Any] = fetched.headers  # Kafka allows a null header value
    packed: bytes | Sequence[tuple[str, bytes]] = headers or ()
    if len(headers) == 1:
        header = headers[0]
        if header[0] == METADATA_HEADER and type(header[1]) is bytes:
            packed = header[1]
    fields = (fetched.offset, fetched.timestamp, key, fetched.value, packed, now)
    return new_queued(QueuedRecord, fields)


def RAW_RECORDS(key: bytes | None) -> bytes | None:
    """Key deserializer that marks a consumer as taking aiokafka's records as they are.

    Called only if :func:`install_raw_records` could not hook aiokafka; it returns the
    key as is.
    """
    return key


def install_raw_records() -> bool:
    """Hook aiokafka so consumers marked with :data:`RAW_RECORDS` skip ``ConsumerRecord``.

    Idempotent.

    Returns:
        Whether the hook is in place (``False``: this aiokafka version is not supported
        and marked consumers get ordinary ``ConsumerRecord`` objects).
    """
    try:
        from aiokafka.consumer.fetcher import PartitionRecords
    except ImportError:  # pragma: no cover - aiokafka moved its fetcher
        return False
    build = getattr(PartitionRecords, "_consumer_record", None)
    if build is None:  # pragma: no cover - aiokafka changed its record building
        log.warning("aiokafka's fetcher has changed; consuming ConsumerRecord objects")
        return False
    if getattr(build, "__wrapped__", None) is not None:
        return True  # installed already

    def consumer_record(self: Any, tp: Any, record: Any) -> Any:
        if self._key_deserializer is RAW_RECORDS:
            return record
        return build(self, tp, record)

    consumer_record.__wrapped__ = build  # type: ignore[attr-defined]
    PartitionRecords._consumer_record = consumer_record
    return True
