"""The on-disk spool: records kept in local files until they are delivered.

The durable sender (:mod:`decaton_aio.durable`) appends a record here when the cluster
cannot take it; the record counts as durable once its line is written and fsynced. A
background replayer reads the oldest entries back, produces them, and removes the ones
the broker acknowledged. This module owns only the files: appending with a shared
(batched) fsync, reading back in append order, removing delivered entries, and moving
unreadable lines aside. It knows nothing about Kafka.

Directory layout::

    spool_dir/
      .lock                       flock'ed by the one Spool using the directory
      spool-000000000001.jsonl    segments, oldest first (the number grows)
      spool-000000000001.corrupt  lines of that segment that could not be parsed
      spool-000000000001.rejected entries the broker refused for good (e.g. too large)

Line schema: one JSON object per line, UTF-8, ``\\n``-terminated; bytes are standard
base64 with padding; unknown fields are ignored when reading::

    {"v": 1,                      format version; other versions are treated as corrupt
     "id": "5f0c...",             unique entry id (uuid4 hex)
     "topic": "orders",
     "partition": null,           the requested partition; null: chosen by key at replay
     "key_b64": "dXNlci0x",       null for a record without a key
     "value_b64": "eyJ...",       null for a tombstone
     "headers": [["dt_meta", "CgQI..."]],   [name, base64 value] pairs, in order
     "timestamp_ms": 1700000000123,         the record's CreateTime (null: replay time)
     "spooled_at_ms": 1700000000456}

``*.rejected`` lines use the same schema plus ``"error"``. The Spark backfill job reads
both kinds of file.

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
import re
import time
import uuid
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Final

import msgspec
import structlog

from decaton_aio.errors import ConfigError, ProducerError

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no cross-process guard
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "DEFAULT_SEGMENT_BYTES",
    "SPOOL_FORMAT_VERSION",
    "Spool",
    "SpoolEntry",
]

SPOOL_FORMAT_VERSION: Final = 1
"""The ``v`` written in every spool line."""
DEFAULT_SEGMENT_BYTES: Final = 1024 * 1024
"""A segment is closed and a new one started once it holds this many bytes."""

log = structlog.get_logger("decaton_aio.spool")

_SEGMENT_RE = re.compile(r"^spool-(\d{12})\.jsonl$")
_LOCK_NAME = ".lock"


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class SpoolEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One spooled record, exactly as it is written to a spool line.

    Attributes:
        id: unique id of the entry (uuid4 hex).
        topic: the destination topic.
        partition: the requested partition; ``None`` lets the partitioner pick by key.
        key: the record key (``key_b64`` on disk).
        value: the record value (``value_b64`` on disk); ``None`` for a tombstone.
        headers: ``(name, value)`` pairs, in order.
        timestamp_ms: the record timestamp; ``None`` lets the client stamp it at replay.
        spooled_at_ms: when the entry was created, in epoch milliseconds.
        v: the line format version.
    """

    v: int = SPOOL_FORMAT_VERSION
    id: str
    topic: str
    partition: int | None
    key: bytes | None = msgspec.field(name="key_b64")
    value: bytes | None = msgspec.field(name="value_b64")
    headers: tuple[tuple[str, bytes], ...]
    timestamp_ms: int | None
    spooled_at_ms: int

    @classmethod
    def new(
        cls,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Iterable[tuple[str, bytes]] = (),
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> SpoolEntry:
        """Make an entry with a fresh id, stamped with the current time.

        Args:
            topic: the destination topic.
            value: the record value.
            key: the record key.
            headers: the record headers.
            partition: an explicit partition, or ``None``.
            timestamp_ms: the record timestamp, or ``None``.

        Returns:
            The new entry.
        """
        return cls(
            id=uuid.uuid4().hex,
            topic=topic,
            partition=partition,
            key=key,
            value=value,
            headers=tuple((name, bytes(data)) for name, data in headers),
            timestamp_ms=timestamp_ms,
            spooled_at_ms=_now_ms(),
        )


class _RejectedEntry(SpoolEntry, frozen=True, kw_only=True):
    """A spool line moved to ``*.rejected``: the entry plus why the broker refused it."""

    error: str


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(SpoolEntry)


def _encode(entry: SpoolEntry) -> bytes:
    return _encoder.encode(entry) + b"\n"


@dataclass(eq=False)
class _Segment:
    """One segment file. ``lines`` counts entries written (or found at start)."""

    seq: int
    path: Path
    lines: int = 0
    nbytes: int = 0

    def aside(self, suffix: str) -> Path:
        return self.path.with_suffix(suffix)


@dataclass(frozen=True, slots=True)
class _CorruptLine:
    number: int
    raw: bytes
    reason: str


# ------------------------------------------------------------- blocking file helpers
# These run in worker threads (asyncio.to_thread); they touch only what they are given.


def _fsync_dir(directory: Path) -> None:
    # A new or deleted file is durable only once its directory entry is.
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_durably(handle: IO[bytes] | None, path: Path, data: bytes) -> IO[bytes]:
    created = handle is None
    if handle is None:
        handle = open(path, "ab")  # noqa: SIM115 - kept open across appends, closed on seal
    try:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
        if created:
            _fsync_dir(path.parent)
    except BaseException:
        handle.close()
        raise
    return handle


def _append_lines(path: Path, data: bytes) -> None:
    with open(path, "ab") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    _fsync_dir(path.parent)


def _delete(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    _fsync_dir(path.parent)


def _parse(data: bytes) -> tuple[list[SpoolEntry], list[_CorruptLine]]:
    entries: list[SpoolEntry] = []
    corrupt: list[_CorruptLine] = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            entry = _decoder.decode(raw)
        except msgspec.DecodeError as exc:  # ValidationError is a DecodeError
            corrupt.append(_CorruptLine(number, raw, str(exc)))
            continue
        if entry.v != SPOOL_FORMAT_VERSION:
            corrupt.append(_CorruptLine(number, raw, f"unsupported format version {entry.v}"))
            continue
        entries.append(entry)
    return entries, corrupt


def _read_segment(path: Path) -> tuple[list[SpoolEntry], list[_CorruptLine]]:
    return _parse(path.read_bytes())


def _scan(directory: Path) -> list[_Segment]:
    found: list[_Segment] = []
    for child in directory.iterdir():
        match = _SEGMENT_RE.match(child.name)
        if match is None or not child.is_file():
            continue
        data = child.read_bytes()
        # A torn last line without "\n" is counted too; it turns out corrupt when read.
        lines = sum(1 for raw in data.split(b"\n") if raw.strip())
        found.append(_Segment(int(match.group(1)), child, lines, len(data)))
    found.sort(key=lambda seg: seg.seq)
    return found


def _lock(directory: Path) -> int | None:
    if fcntl is None:  # pragma: no cover
        return None
    fd = os.open(directory / _LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ConfigError(
            f"the spool directory {directory} is in use by another producer: give each "
            "producer its own spool_dir, or share one DurableSender"
        ) from None
    return fd


# ----------------------------------------------------------------------------- spool


class Spool:
    """A directory of append-only JSON-lines segments holding undelivered records.

    ::

        spool = Spool("/var/lib/app/spool")
        await spool.open()
        await spool.append(SpoolEntry.new("orders", b"...", key=b"user-1"))
        batch = await spool.pending(500)      # oldest first
        ...                                   # deliver them
        await spool.remove(batch)             # forget the delivered ones
        await spool.close()

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
        self._active: _Segment | None = None
        self._active_handle: IO[bytes] | None = None
        self._sealed: deque[_Segment] = deque()
        # The oldest sealed segment, read into memory: its undelivered entries by id.
        self._loaded: _Segment | None = None
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

        Raises:
            ConfigError: another producer (process or object) uses the directory.
            ProducerError: the directory cannot be created or read.
        """
        if self._opened:
            return
        try:
            await asyncio.to_thread(self._dir.mkdir, parents=True, exist_ok=True)
            self._lock_fd = await asyncio.to_thread(_lock, self._dir)
            found = await asyncio.to_thread(_scan, self._dir)
        except OSError as exc:
            self._release_lock()
            raise ProducerError(f"cannot open the spool directory {self._dir}: {exc}") from exc
        self._sealed.extend(found)
        if found:
            self._next_seq = found[-1].seq + 1
            log.info(
                "found a spool left by an earlier run; it is replayed first",
                spool_dir=str(self._dir),
                segments=len(found),
                entries=sum(seg.lines for seg in found),
            )
        self._opened = True

    async def close(self) -> None:
        """Finish pending appends, close the current segment, and release the directory.

        Undelivered entries stay on disk for the next :meth:`open`.
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

    def _release_lock(self) -> None:
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            os.close(fd)  # closing the descriptor drops the flock

    # ----------------------------------------------------------------------- append

    def append_nowait(self, entry: SpoolEntry) -> asyncio.Future[Path]:
        """Queue an entry for the next batched write, without waiting.

        Cancelling the returned future does not take the entry back.

        Args:
            entry: the record to keep.

        Returns:
            A future resolving to the segment path once the line is fsynced; it fails
            with :class:`ProducerError` when the write failed.

        Raises:
            ProducerError: the spool is not open.
        """
        if not self._opened:
            raise ProducerError(f"the spool {self._dir} is not open")
        waiter: asyncio.Future[Path] = asyncio.get_running_loop().create_future()
        self._buffer.append((_encode(entry), waiter))
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

    async def _write_locked(self, data: bytes) -> _Segment:
        active = self._active
        if active is not None and active.lines and active.nbytes + len(data) > self._segment_bytes:
            await self._seal_active_locked()
            active = None
        if active is None:
            seq, self._next_seq = self._next_seq, self._next_seq + 1
            active = self._active = _Segment(seq, self._dir / f"spool-{seq:012d}.jsonl")
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
            await asyncio.to_thread(_delete, active.path)

    # ------------------------------------------------------------------- read/remove

    async def pending(self, limit: int) -> list[SpoolEntry]:
        """Return up to ``limit`` of the oldest undelivered entries, in append order.

        The same entries are returned again until :meth:`remove` or :meth:`reject`
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

    async def _load(self, segment: _Segment) -> None:
        try:
            entries, corrupt = await asyncio.to_thread(_read_segment, segment.path)
        except FileNotFoundError:
            return
        except OSError as exc:
            # Left on disk for the next start; nothing is deleted that was not read.
            log.error("cannot read a spool segment", file=str(segment.path), error=str(exc))
            return
        if corrupt:
            await self._move_aside(segment, corrupt)
        if not entries:
            await asyncio.to_thread(_delete, segment.path)
            return
        self._loaded = segment
        self._loaded_entries = {entry.id: entry for entry in entries}

    async def _move_aside(self, segment: _Segment, corrupt: Sequence[_CorruptLine]) -> None:
        target = segment.aside(".corrupt")
        data = b"".join(line.raw + b"\n" for line in corrupt)
        await asyncio.to_thread(_append_lines, target, data)
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

        Entries not returned by :meth:`pending` (or already removed) are ignored.

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
        data = b"".join(
            _encoder.encode(_RejectedEntry(**msgspec.structs.asdict(entry), error=error)) + b"\n"
            for entry in rejected
        )
        await asyncio.to_thread(_append_lines, loaded.aside(".rejected"), data)
        await self.remove(rejected)

    async def _maybe_delete_loaded(self) -> None:
        loaded = self._loaded
        if loaded is None or self._loaded_entries:
            return
        self._loaded = None
        try:
            await asyncio.to_thread(_delete, loaded.path)
        except OSError as exc:
            # Only costs duplicates: the segment is replayed again on the next start.
            log.error(
                "cannot delete a delivered spool segment", file=str(loaded.path), error=str(exc)
            )


def _retrieve(future: asyncio.Future[Path]) -> None:
    if not future.cancelled():
        future.exception()
