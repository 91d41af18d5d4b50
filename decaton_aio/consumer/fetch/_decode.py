"""A partition's fetched bytes, read into the runtime's records.

aiokafka's batch reader (its C extension when built with it) reads each record batch of
every format and codec; each record it yields becomes a `TaskRecord` at once
(`task_record()`), the object the runtime's partitions keep. Skipped on the way:

- records before the fetch offset (a batch is returned whole, from its first record);
- control batches (transaction markers), whatever the isolation level;
- under ``read_committed``, the batches of aborted transactions: the response lists each
  aborted transaction's producer and first offset; from that offset on, that producer's
  transactional batches are skipped until its abort marker.

What is read here is pure: bytes and the aborted list in, records and the next fetch
offset out. `end_offset()` gives that offset from the batches' headers alone, so the
fetch loop can ask for what follows before it reads the records.
"""

from __future__ import annotations

import struct
from typing import Any, Final

from aiokafka.errors import CorruptRecordException

from decaton_aio._aiokafka import MemoryRecords
from decaton_aio.consumer._records import TaskRecord, task_record

__all__ = ["ABORT_MARKER", "end_offset", "read_records"]

#: The type of a control record whose transaction was aborted (its key: version, type).
ABORT_MARKER: Final = 0
_CONTROL_KEY = struct.Struct(">hh")


def _is_abort(batch: Any) -> bool:
    for record in batch:
        key = record.key
        return (
            key is not None and len(key) >= 4 and _CONTROL_KEY.unpack_from(key)[1] == ABORT_MARKER
        )
    return False


def end_offset(data: bytes, fetch_offset: int) -> int:
    """The offset to fetch after ``data`` (from ``fetch_offset``): past its last complete
    batch, as `read_records()` returns it, read from the batches' headers only."""
    next_offset = fetch_offset
    if not data:
        return next_offset
    batches = MemoryRecords(data)
    while batches.has_next():
        batch = batches.next_batch()
        if batch is None:
            break
        next_offset = max(next_offset, batch.next_offset)
    return next_offset


def read_records(
    data: bytes,
    fetch_offset: int,
    aborted: list[tuple[int, int]] | None = None,
    *,
    read_committed: bool = False,
    check_crcs: bool = True,
) -> tuple[list[TaskRecord], int]:
    """The records of one partition's fetched bytes from ``fetch_offset`` on, and the
    offset to fetch next (past skipped batches too).

    Args:
        data: the record batches as fetched.
        aborted: ``(producer id, first offset)`` of the aborted transactions the response
            lists for the partition.

    Raises:
        CorruptRecordException: a batch's checksum is wrong (``check_crcs``).
    """
    records: list[TaskRecord] = []
    next_offset = fetch_offset
    if not data:
        return records, next_offset
    append = records.append
    pending = sorted(aborted, key=lambda a: a[1]) if read_committed and aborted else []
    aborting: set[int] = set()
    batches = MemoryRecords(data)
    while batches.has_next():
        batch = batches.next_batch()
        if batch is None:
            break
        if check_crcs and not batch.validate_crc():
            raise CorruptRecordException(f"a record batch at offset {next_offset} is corrupt")
        if read_committed and batch.producer_id is not None:
            while pending and pending[0][1] <= batch.base_offset:
                aborting.add(pending.pop(0)[0])
            if batch.is_control_batch and batch.producer_id in aborting and _is_abort(batch):
                aborting.discard(batch.producer_id)
                next_offset = max(next_offset, batch.next_offset)
                continue
            if batch.is_transactional and batch.producer_id in aborting:
                next_offset = max(next_offset, batch.next_offset)
                continue
        if batch.is_control_batch:
            next_offset = max(next_offset, batch.next_offset)
            continue
        for record in batch:
            if record.offset >= next_offset:
                append(task_record(record))
        next_offset = max(next_offset, batch.next_offset)
    return records, next_offset
