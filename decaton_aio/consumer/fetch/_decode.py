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
offset out. `fetch_end()` gives that offset from the batches' headers alone, so the
fetch loop can ask for what follows before it reads the records, and notes where each
partition leader epoch the batches carry starts (the partition's epoch history: the last
one is what the next request names as its last fetched epoch).
"""

from __future__ import annotations

import struct
from typing import Any, Final

from aiokafka.errors import CorruptRecordException

from decaton_aio._aiokafka import MemoryRecords
from decaton_aio.consumer._records import TaskRecord, task_record

__all__ = ["ABORT_MARKER", "fetch_end", "read_records"]

#: The type of a control record whose transaction was aborted (its key: version, type).
ABORT_MARKER: Final = 0
_CONTROL_KEY = struct.Struct(">hh")
# A batch's header as far as fetch_end() reads it: base offset and length, the magic, and
# from a version 2 batch's partition leader epoch (after the length) to its last offset
# delta (skipping magic, checksum and attributes).
_BATCH_HEAD = struct.Struct(">qi")
_EPOCH_DELTA = struct.Struct(">i1x4x2xi")
_LOG_OVERHEAD: Final = 12  # base offset and length
_MAGIC_AT: Final = 16
_MIN_BATCH: Final = 26  # the smallest legacy message
_MIN_BATCH_V2: Final = 61  # a version 2 batch's header


def _is_abort(batch: Any) -> bool:
    for record in batch:
        key = record.key
        return (
            key is not None and len(key) >= 4 and _CONTROL_KEY.unpack_from(key)[1] == ABORT_MARKER
        )
    return False


def fetch_end(data: bytes, fetch_offset: int, epochs: list[tuple[int, int]]) -> int:
    """The offset to fetch after ``data`` (fetched from ``fetch_offset``), past its last
    complete batch as `read_records()` returns it, read from the batches' headers only.

    ``epochs``, the partition's epoch history (``(epoch, first offset)`` in offset order),
    gains each partition leader epoch of a complete batch that is newer than its last, at
    that batch's base offset (a legacy batch has none).

    Raises:
        CorruptRecordException: a batch is shorter than its header.
    """
    last = epochs[-1][0] if epochs else -1
    next_offset = fetch_offset
    size = len(data)
    pos = 0
    unpack_head, unpack_epoch_delta = _BATCH_HEAD.unpack_from, _EPOCH_DELTA.unpack_from
    while size - pos >= _LOG_OVERHEAD:
        base, length = unpack_head(data, pos)
        end = pos + _LOG_OVERHEAD + length
        if end > size:
            break  # the start of a batch larger than the bytes asked for
        magic = data[pos + _MAGIC_AT] if length >= _MIN_BATCH - _LOG_OVERHEAD else -1
        if length < (_MIN_BATCH_V2 if magic >= 2 else _MIN_BATCH) - _LOG_OVERHEAD:
            raise CorruptRecordException(
                f"a record batch at offset {base} is shorter than its header ({length} bytes)"
            )
        if magic >= 2:
            epoch, delta = unpack_epoch_delta(data, pos + _LOG_OVERHEAD)
            next_offset = max(next_offset, base + delta + 1)
            if epoch > last:
                epochs.append((epoch, base))
                last = epoch
        else:
            next_offset = max(next_offset, base + 1)  # a legacy wrapper's is its last
        pos = end
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
