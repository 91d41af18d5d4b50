"""The spool's files: the directory layout, segments, and the blocking file operations.

Directory layout:

```text
spool_dir/
  .lock                       flock'ed by the one Spool using the directory
  spool-000000000001.jsonl    segments, oldest first (the number grows)
  spool-000000000001.corrupt  lines of that segment that could not be parsed
  spool-000000000001.rejected entries the broker refused for good (e.g. too large)
  worker-1/ ...               the spools of ``run --workers N`` (one per worker), each
                              laid out the same way
```

A spool takes over the segments of spools no process holds when it opens
(`take_over()`): a spool on ``D`` those of ``D/worker-<n>``, and before ``run --workers N``
starts its workers, ``D/worker-1`` those of ``D`` and of ``D/worker-<n>`` for n > N
(`gather_for_workers()`). A spool left by a run with other settings is so delivered by the next.

`Spool` runs these functions in worker threads
(``asyncio.to_thread``); each touches only what it is given. They write durably (data,
then ``fsync`` of the file and, for a new or deleted file, of its directory), read and
find segment files, and take the directory's ``flock``. Their lines are in the format of
`decaton_aio.producer._spool_format`.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Final

from decaton_aio.errors import ConfigError
from decaton_aio.producer._spool_format import (
    CorruptLine,
    SpoolEntry,
    encode_rejected_line,
    parse_lines,
)

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no cross-process guard
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "LOCK_NAME",
    "SEGMENT_RE",
    "WORKER_SPOOL_RE",
    "Segment",
    "append_lines",
    "append_rejected",
    "delete",
    "fsync_dir",
    "gather_for_workers",
    "lock",
    "move_aside",
    "read_segment",
    "scan",
    "summarize",
    "take_over",
    "unlock",
    "worker_spool",
    "worker_spools",
    "write_durably",
]

SEGMENT_RE: Final = re.compile(r"^spool-(\d{12})\.jsonl$")
"""The name of a segment file; the number grows with each new segment."""
LOCK_NAME: Final = ".lock"
"""The file ``flock``-ed by the one spool using a directory."""
WORKER_SPOOL_RE: Final = re.compile(r"^worker-(\d+)$")
"""The name of the spool directory of ``run --workers``' worker n, below the run's own."""


@dataclass(eq=False)
class Segment:
    """One segment file. ``lines`` counts entries written (or found at start)."""

    seq: int
    path: Path
    lines: int = 0
    nbytes: int = 0

    @staticmethod
    def name(seq: int) -> str:
        """The file name of segment number ``seq``."""
        return f"spool-{seq:012d}.jsonl"

    def aside(self, suffix: str) -> Path:
        """The file next to the segment where its lines are moved aside (``.corrupt``...)."""
        return self.path.with_suffix(suffix)


def fsync_dir(directory: Path) -> None:
    """Make the entries of ``directory`` (new or deleted files) durable."""
    # A new or deleted file is durable only once its directory entry is.
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(handle: IO[bytes] | None, path: Path, data: bytes) -> IO[bytes]:
    """Append ``data`` to ``path`` and fsync it; returns the handle to append with next.

    ``handle`` is ``None`` for a new file. On failure the handle is closed.
    """
    created = handle is None
    if handle is None:
        handle = open(path, "ab")  # noqa: SIM115 - kept open across appends, closed on seal
    try:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
        if created:
            fsync_dir(path.parent)
    except BaseException:
        handle.close()
        raise
    return handle


def append_lines(path: Path, data: bytes) -> None:
    """Append ``data`` to a side file (``.corrupt``, ``.rejected``) and fsync it."""
    with open(path, "ab") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    fsync_dir(path.parent)


def move_aside(segment: Segment, corrupt: Sequence[CorruptLine]) -> Path:
    """Append unreadable lines to the segment's ``.corrupt`` file; returns that file."""
    target = segment.aside(".corrupt")
    append_lines(target, b"".join(line.raw + b"\n" for line in corrupt))
    return target


def append_rejected(segment: Segment, entries: Sequence[SpoolEntry], error: str) -> None:
    """Append entries the broker refused for good to the segment's ``.rejected`` file."""
    data = b"".join(encode_rejected_line(entry, error) for entry in entries)
    append_lines(segment.aside(".rejected"), data)


def delete(path: Path) -> None:
    """Delete a file (gone already is fine) and fsync its directory."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    fsync_dir(path.parent)


def read_segment(path: Path) -> tuple[list[SpoolEntry], list[CorruptLine]]:
    """The entries of a segment file and its lines that cannot be read."""
    return parse_lines(path.read_bytes())


def scan(directory: Path) -> list[Segment]:
    """The segment files in ``directory``, oldest first, with their line counts."""
    found: list[Segment] = []
    for child in directory.iterdir():
        match = SEGMENT_RE.match(child.name)
        if match is None or not child.is_file():
            continue
        data = child.read_bytes()
        # A torn last line without "\n" is counted too; it turns out corrupt when read.
        lines = sum(1 for raw in data.split(b"\n") if raw.strip())
        found.append(Segment(int(match.group(1)), child, lines, len(data)))
    found.sort(key=lambda seg: seg.seq)
    return found


@dataclass(frozen=True)
class SpoolSummary:
    """What a spool directory holds: its entries (lines of its segments) and when the
    oldest readable one was spooled (epoch ms; ``None`` when there is none)."""

    entries: int
    oldest_spooled_at_ms: int | None


def summarize(directory: Path) -> SpoolSummary:
    """Read what ``directory`` holds, with the spools of its workers that a producer on it
    would take over (those no running process holds), without taking its lock (a producer
    using it may be changing it meanwhile). A missing directory holds nothing."""
    if not directory.is_dir():
        return SpoolSummary(0, None)
    entries, oldest = 0, None
    for spool in (directory, *(w for w in worker_spools(directory) if not _in_use(w))):
        segments = scan(spool)
        entries += sum(s.lines for s in segments)
        for segment in segments:
            readable, _ = read_segment(segment.path)
            if readable:
                first = readable[0].spooled_at_ms
                oldest = first if oldest is None else min(oldest, first)
                break
    return SpoolSummary(entries, oldest)


def worker_spools(directory: Path) -> list[Path]:
    """The spools of ``run --workers``' workers below ``directory``, by worker number."""
    if not directory.is_dir():
        return []
    found = [
        child
        for child in directory.iterdir()
        if WORKER_SPOOL_RE.match(child.name) is not None and child.is_dir()
    ]
    return sorted(found, key=_worker_number)


def take_over(
    directory: Path, sources: Sequence[Path]
) -> tuple[list[Segment], list[Segment], list[Path]]:
    """The segments ``directory`` holds, oldest first, then those of the spools in
    ``sources`` moved into it and numbered after them, in their order; and the sources
    another producer holds (left as they are).

    The caller holds ``directory``'s lock. Each segment is renamed, so an entry is in
    exactly one spool at every moment, a crash included; the ``.corrupt`` and
    ``.rejected`` files stay where they are.
    """
    found = scan(directory)
    next_seq = found[-1].seq + 1 if found else 1
    adopted: list[Segment] = []
    busy: list[Path] = []
    for source in sources:
        try:
            fd = lock(source)
        except ConfigError:
            busy.append(source)
            continue
        try:
            moved = []
            for segment in scan(source):
                target = directory / Segment.name(next_seq)
                os.rename(segment.path, target)
                moved.append(Segment(next_seq, target, segment.lines, segment.nbytes))
                next_seq += 1
            if moved:
                fsync_dir(directory)
                fsync_dir(source)
            adopted.extend(moved)
        finally:
            unlock(fd)
    return found, adopted, busy


def _in_use(directory: Path) -> bool:
    """Whether another producer holds ``directory``'s lock now (asked with a lock held for
    an instant; a spool that opens meanwhile tries again, see `Spool.open()`)."""
    if fcntl is None:  # pragma: no cover
        return False
    try:
        fd = os.open(directory / LOCK_NAME, os.O_RDWR)  # no lock file: never opened
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def worker_spool(directory: Path, worker: int) -> Path:
    """The spool of ``run --workers``' worker number ``worker`` below ``directory``."""
    return directory / f"worker-{worker}"


def gather_for_workers(directory: Path, workers: int) -> tuple[int, list[Path]]:
    """Before ``run --workers N`` starts its workers: worker 1's spool takes over the
    segments no worker of this run would deliver, those of ``directory`` itself (left by
    a run of one process) and of ``worker-<n>`` for n > N (left by a run of more workers),
    by `take_over()` under its lock. Returns how many entries moved, and the spools
    another producer holds (left as they are).

    Raises:
        ConfigError: another producer uses worker 1's spool.
    """
    target = worker_spool(directory, 1)
    target.mkdir(parents=True, exist_ok=True)
    sources = [directory]
    sources += [path for path in worker_spools(directory) if _worker_number(path) > workers]
    fd = lock(target)
    try:
        _, adopted, busy = take_over(target, sources)
    finally:
        unlock(fd)
    return sum(s.lines for s in adopted), busy


def _worker_number(path: Path) -> int:
    match = WORKER_SPOOL_RE.match(path.name)
    assert match is not None
    return int(match.group(1))


def unlock(fd: int | None) -> None:
    """Release a lock `lock()` took (closing its descriptor drops the ``flock``)."""
    if fd is not None:
        os.close(fd)


def lock(directory: Path) -> int | None:
    """Take the directory's ``flock``; returns the descriptor that holds it.

    Raises:
        ConfigError: another spool holds it.
    """
    if fcntl is None:  # pragma: no cover
        return None
    fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ConfigError(
            f"the spool directory {directory} is in use by another producer: give each "
            "producer its own spool_dir, or share one DurableSender"
        ) from None
    return fd
