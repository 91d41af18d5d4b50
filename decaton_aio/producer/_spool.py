"""The on-disk spool: records kept in local files until they are delivered.

The durable sender (`decaton_aio.producer._sender`) appends a record here when the cluster
cannot take it; the record counts as durable once its line is written and fsynced. A
background replayer reads the oldest entries back, produces them, and removes the ones
the broker acknowledged. This module owns only the files: appending with a shared
(batched) fsync, reading back in append order, removing delivered entries, and moving
unreadable lines aside. It knows nothing about Kafka. The directory layout and the
blocking file operations are in `decaton_aio.producer._spool_files`, the line schema (of
segments and ``*.rejected`` files, which the Spark backfill job reads) in
`decaton_aio.producer._spool_format`.

Durability: an append is answered only after its line was written and fsynced (and, for
a new segment file, the directory too). Appends made in the same loop turn, or while a
write is running, share one ``write`` + ``fsync``, done in a worker thread so the event
loop keeps running. A failed write starts a new segment, so a torn line can never glue
itself to a later, acknowledged one.

Removal is crash-safe and at-least-once: delivered entries are forgotten in memory, and a
segment file is deleted once every entry in it was delivered (or moved aside). A crash
before that deletion replays the whole segment on the next start: duplicates, never
loss. Segments are rotated at ``segment_bytes``, which bounds those duplicates. A
process never appends to a segment left by an earlier process.

Corrupt lines (a torn write from a crash, a hand edit) are reported with a structlog
warning naming file and line number, appended to the segment's ``.corrupt`` file, and
skipped; the rest of the segment is replayed.

Caller: one event loop. The blocking file I/O runs in threads, serialized by a lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
from collections import deque
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO, Final

import structlog

from decaton_aio.errors import ConfigError, ProducerError
from decaton_aio.producer import _spool_files as spool_files
from decaton_aio.producer._spool_files import Segment
from decaton_aio.producer._spool_format import (
    SPOOL_FORMAT_VERSION,
    CorruptLine,
    SpoolEntry,
    encode_line,
)

__all__ = [
    "DEFAULT_SEGMENT_BYTES",
    "SPOOL_FORMAT_VERSION",
    "Spool",
    "SpoolEntry",
]

DEFAULT_SEGMENT_BYTES: Final = 1024 * 1024
"""A segment is closed and a new one started once it holds this many bytes."""

# Tries to take a spool directory's lock, a short wait apart (a summary's probe of it).
_LOCK_TRIES: Final = 10
_LOCK_RETRY_S: Final = 0.05

log = structlog.get_logger("decaton_aio.producer")

# Writes each batch; looked up here at every write, so tests can patch it.
_write_durably = spool_files.write_durably


class Spool:
    """A directory of append-only JSON-lines segments holding undelivered records.

    ```python
    spool = Spool("/var/lib/app/spool")
    await spool.open()
    await spool.append(SpoolEntry.new("orders", b"...", key=b"user-1"))
    batch = await spool.pending(500)      # oldest first
    ...                                   # deliver them
    await spool.remove(batch)             # forget the delivered ones
    await spool.close()
    ```

    Args:
        directory: where the segments live; created when missing.
        segment_bytes: rotate to a new segment once the current one holds this much.

    Raises:
        ConfigError: ``segment_bytes`` is not positive.
    """

    def __init__(
        self, directory: str | os.PathLike[str], *, segment_bytes: int = DEFAULT_SEGMENT_BYTES
    ) -> None:
        if segment_bytes < 1:
            raise ConfigError(f"segment_bytes must be >= 1, got {segment_bytes}")
        self._dir = Path(directory)
        self._segment_bytes = segment_bytes
        self._lock_fd: int | None = None
        self._opened = False
        self._next_seq = 1
        # Appends waiting for the next write, with the futures their callers await.
        self._buffer: list[tuple[bytes, asyncio.Future[Path]]] = []
        self._writing = 0
        self._flusher: asyncio.Task[None] | None = None
        # Serializes the threads that touch the active segment (write, seal, close).
        self._io_lock = asyncio.Lock()
        self._active: Segment | None = None
        self._active_handle: IO[bytes] | None = None
        self._sealed: deque[Segment] = deque()
        # The oldest sealed segment, read into memory: its undelivered entries by id.
        self._loaded: Segment | None = None
        self._loaded_entries: dict[str, SpoolEntry] = {}

    @property
    def directory(self) -> Path:
        """The spool directory."""
        return self._dir

    @property
    def size(self) -> int:
        """How many entries are kept and not yet delivered (for metrics).

        Lines of segments not read yet are counted as found, so a corrupt line counts
        until it is read and moved aside.
        """
        active = self._active.lines if self._active is not None else 0
        sealed = sum(seg.lines for seg in self._sealed)
        return len(self._buffer) + self._writing + active + sealed + len(self._loaded_entries)

    def is_empty(self) -> bool:
        """Whether nothing is kept: no entry buffered, being written, or undelivered."""
        return (
            not self._buffer
            and not self._writing
            and (self._active is None or self._active.lines == 0)
            and not self._sealed
            and not self._loaded_entries
        )

    async def open(self) -> None:
        """Create the directory, take its lock, and find segments left by earlier runs.

        Those segments are replayed first, oldest first; this run appends to new ones.
        Segments of worker spools below the directory (``worker-<n>``, left by ``run
        --workers``) that no process holds are taken over and replayed after them.

        Raises:
            ConfigError: another producer (process or object) uses the directory.
            ProducerError: the directory cannot be created or read.
        """
        if self._opened:
            return
        try:
            await asyncio.to_thread(self._dir.mkdir, parents=True, exist_ok=True)
            self._lock_fd = await self._take_lock()
            workers = await asyncio.to_thread(spool_files.worker_spools, self._dir)
            found, adopted, busy = await asyncio.to_thread(
                spool_files.take_over, self._dir, workers
            )
        except OSError as exc:
            self._release_lock()
            raise ProducerError(f"cannot open the spool directory {self._dir}: {exc}") from exc
        found += adopted
        self._sealed.extend(found)
        if found:
            self._next_seq = found[-1].seq + 1
            log.info(
                "found a spool left by an earlier run; it is replayed first",
                spool_dir=str(self._dir),
                segments=len(found),
                entries=sum(seg.lines for seg in found),
                taken_from_workers=sum(seg.lines for seg in adopted),
            )
        if busy:
            log.info(
                "the spools of running workers below this one are left to them",
                spool_dir=str(self._dir),
                in_use=[str(path) for path in busy],
            )
        self._opened = True

    async def close(self) -> None:
        """Finish pending appends, close the current segment, and release the directory.

        Undelivered entries stay on disk for the next `open()`.
        """
        if not self._opened:
            return
        await self.wait_flushed()
        async with self._io_lock:
            await self._seal_active_locked()
        self._opened = False
        self._sealed.clear()
        self._loaded, self._loaded_entries = None, {}
        self._release_lock()

    async def _take_lock(self) -> int | None:
        # A summary of the parent directory (produce) holds a worker spool's lock for an
        # instant to tell whether it is in use: tried again for a short while.
        for _ in range(_LOCK_TRIES - 1):
            with contextlib.suppress(ConfigError):
                return await asyncio.to_thread(spool_files.lock, self._dir)
            await asyncio.sleep(_LOCK_RETRY_S)
        return await asyncio.to_thread(spool_files.lock, self._dir)

    def _release_lock(self) -> None:
        fd, self._lock_fd = self._lock_fd, None
        spool_files.unlock(fd)

    # ----------------------------------------------------------------------- append

    def append_nowait(self, entry: SpoolEntry) -> asyncio.Future[Path]:
        """Queue an entry for the next batched write, without waiting.

        Cancelling the returned future does not take the entry back.

        Args:
            entry: the record to keep.

        Returns:
            A future resolving to the segment path once the line is fsynced; it fails
            with [`ProducerError`][decaton_aio.errors.ProducerError] when the write failed.

        Raises:
            ProducerError: the spool is not open.
        """
        if not self._opened:
            raise ProducerError(f"the spool {self._dir} is not open")
        waiter: asyncio.Future[Path] = asyncio.get_running_loop().create_future()
        self._buffer.append((encode_line(entry), waiter))
        if self._flusher is None:
            # Started as a task, so every append made in this loop turn joins its first
            # write: many concurrent appends share one fsync.
            self._flusher = asyncio.get_running_loop().create_task(self._flush_routine())
        return waiter

    async def append(self, entry: SpoolEntry) -> Path:
        """Append an entry and wait until it is on disk (written and fsynced).

        Args:
            entry: the record to keep.

        Returns:
            The segment file holding the entry.

        Raises:
            ProducerError: the spool is not open, or the write failed.
        """
        return await self.append_nowait(entry)

    async def wait_flushed(self) -> None:
        """Wait until every entry appended so far was written (or its write failed)."""
        while self._flusher is not None:
            # Shielded: a cancelled caller must not cancel the write others wait for.
            await asyncio.shield(self._flusher)

    async def _flush_routine(self) -> None:
        try:
            while self._buffer:
                batch, self._buffer = self._buffer, []
                self._writing = len(batch)
                data = b"".join(line for line, _ in batch)
                try:
                    async with self._io_lock:
                        segment = await self._write_locked(data)
                except Exception as exc:
                    # Any failure must answer the waiters: a sender waits on them.
                    error = ProducerError(f"cannot write to the spool {self._dir}: {exc}")
                    error.__cause__ = exc
                    log.error("spool write failed", spool_dir=str(self._dir), error=str(exc))
                    for _, waiter in batch:
                        if not waiter.done():
                            waiter.set_exception(error)
                            # Callers that went away must not leave an unretrieved error.
                            waiter.add_done_callback(_retrieve)
                    continue
                finally:
                    self._writing = 0
                segment.lines += len(batch)
                segment.nbytes += len(data)
                for _, waiter in batch:
                    if not waiter.done():
                        waiter.set_result(segment.path)
        finally:
            self._flusher = None

    async def _write_locked(self, data: bytes) -> Segment:
        active = self._active
        if active is not None and active.lines and active.nbytes + len(data) > self._segment_bytes:
            await self._seal_active_locked()
            active = None
        if active is None:
            seq, self._next_seq = self._next_seq, self._next_seq + 1
            active = self._active = Segment(seq, self._dir / Segment.name(seq))
        handle = self._active_handle
        try:
            self._active_handle = await asyncio.to_thread(_write_durably, handle, active.path, data)
        except Exception:
            # Part of the data may be on disk without its newline; never append after it.
            if handle is not None:
                with contextlib.suppress(OSError):
                    handle.close()
            self._active_handle = None
            self._active = None
            if active.path.exists():
                self._sealed.append(active)
            raise
        return active

    async def _seal_active_locked(self) -> None:
        """Close the current segment so it can be read; the next append starts a new one."""
        active, handle = self._active, self._active_handle
        self._active, self._active_handle = None, None
        if handle is not None:
            await asyncio.to_thread(handle.close)
        if active is None:
            return
        if active.lines:
            self._sealed.append(active)
        elif active.path.exists():
            await asyncio.to_thread(spool_files.delete, active.path)

    # ------------------------------------------------------------------- read/remove

    async def pending(self, limit: int) -> list[SpoolEntry]:
        """Return up to ``limit`` of the oldest undelivered entries, in append order.

        The same entries are returned again until `remove()` or `reject()`
        takes them. Reading reaches the segment being appended to by closing it (new
        appends go to a new segment). Corrupt lines met on the way are moved aside.

        Args:
            limit: the most entries to return; >= 1.

        Returns:
            The entries; empty when nothing undelivered is on disk.

        Raises:
            ProducerError: the spool is not open.
        """
        if not self._opened:
            raise ProducerError(f"the spool {self._dir} is not open")
        while not self._loaded_entries:
            if not self._sealed:
                async with self._io_lock:
                    await self._seal_active_locked()
                if not self._sealed:
                    return []
            await self._load(self._sealed.popleft())
        return list(itertools.islice(self._loaded_entries.values(), max(1, limit)))

    async def _load(self, segment: Segment) -> None:
        try:
            entries, corrupt = await asyncio.to_thread(spool_files.read_segment, segment.path)
        except FileNotFoundError:
            return
        except OSError as exc:
            # Left on disk for the next start; nothing is deleted that was not read.
            log.error("cannot read a spool segment", file=str(segment.path), error=str(exc))
            return
        if corrupt:
            await self._move_aside(segment, corrupt)
        if not entries:
            await asyncio.to_thread(spool_files.delete, segment.path)
            return
        self._loaded = segment
        self._loaded_entries = {entry.id: entry for entry in entries}

    async def _move_aside(self, segment: Segment, corrupt: Sequence[CorruptLine]) -> None:
        target = await asyncio.to_thread(spool_files.move_aside, segment, corrupt)
        for line in corrupt:
            log.warning(
                "corrupt spool line moved aside",
                file=str(segment.path),
                line=line.number,
                reason=line.reason,
                moved_to=str(target),
            )

    async def remove(self, entries: Iterable[SpoolEntry]) -> None:
        """Forget delivered entries; a segment is deleted once all of it is delivered.

        Entries not returned by `pending()` (or already removed) are ignored.

        Args:
            entries: entries the broker acknowledged.
        """
        for entry in entries:
            self._loaded_entries.pop(entry.id, None)
        await self._maybe_delete_loaded()

    async def reject(self, entries: Iterable[SpoolEntry], error: str) -> None:
        """Move entries the broker refused for good to the segment's ``.rejected`` file.

        Args:
            entries: entries that can never be delivered (too large, invalid topic...).
            error: why; written to each line's ``error`` field.
        """
        loaded = self._loaded
        rejected = [entry for entry in entries if entry.id in self._loaded_entries]
        if loaded is None or not rejected:
            return
        await asyncio.to_thread(spool_files.append_rejected, loaded, rejected, error)
        await self.remove(rejected)

    async def _maybe_delete_loaded(self) -> None:
        loaded = self._loaded
        if loaded is None or self._loaded_entries:
            return
        self._loaded = None
        try:
            await asyncio.to_thread(spool_files.delete, loaded.path)
        except OSError as exc:
            # Only costs duplicates: the segment is replayed again on the next start.
            log.error(
                "cannot delete a delivered spool segment", file=str(loaded.path), error=str(exc)
            )


def _retrieve(future: asyncio.Future[Path]) -> None:
    if not future.cancelled():
        future.exception()
