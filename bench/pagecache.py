"""The page cache a throughput run starts from: the same, warm, for every run.

Every throughput run (S1-S3 and the S1 variants) consumes a topic of its own, produced
for it just before it starts (:mod:`bench.fair`). Before the contender starts, the
harness:

1. writes every dirty page of the machine to disk (``sync``): the new topic's log and
   the previous run's task facts are not written back during this run's window;
2. reads the new topic's log files once, so every run starts with all its records in the
   page cache (a consumer that keeps up reads from it too);
3. records how much of the log was resident before and after (``mincore``).

Why: the machine the benchmark runs on (a 2-core Firecracker VM) runs a DAMON scheme
(``kdamond``, ``/sys/kernel/mm/damon/admin``) that pages out file pages nobody touched for
about a minute, memory pressure or not: a 256 MB file written, synced and left alone
kept 254 MB resident after 20 s, 162 MB after 2 minutes and 118 MB after 2 min 40 s. A
topic that runs shared and read at different times had its head warm and its rest
partly on disk, differently for every run. :func:`damon_pageout` reports the scheme with
the machine facts. Caches are not dropped (``/proc/sys/vm/drop_caches`` is writable here,
as root): that is machine-wide, it makes the broker's and the contenders' own files cold,
and it disturbs whatever else runs on the machine.

The broker's log directory is read from its command line (Apache Kafka's
``server.properties``, ``log.dirs``); a broker without log files there (Tansu) gets the
``sync`` only, and the run records that no log was found.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = [
    "damon_pageout",
    "log_dirs",
    "resident_bytes",
    "settle_topic",
    "topic_log_files",
    "warm",
]

_DAMON = Path("/sys/kernel/mm/damon/admin/kdamonds")
_CHUNK = 8 << 20


def log_dirs(broker_pids: Iterable[int]) -> list[Path]:
    """The log directories of the Apache Kafka brokers running as ``broker_pids`` (from
    the ``server.properties`` on their command line); empty for another broker."""
    found: list[Path] = []
    for pid in broker_pids:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in argv if a]
        if "kafka.Kafka" not in args:
            continue
        config = args[args.index("kafka.Kafka") + 1 :][:1]
        if not config:
            continue
        try:
            lines = Path(config[0]).read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            name, _, value = line.partition("=")
            if name.strip() in ("log.dirs", "log.dir") and value.strip():
                found += [Path(v.strip()) for v in value.split(",") if v.strip()]
    return found


def topic_log_files(dirs: Iterable[Path], topic: str) -> list[Path]:
    """The segment files (``*.log``) of every partition of ``topic`` in ``dirs``."""
    files: list[Path] = []
    prefix = f"{topic}-"
    for directory in dirs:
        try:
            entries = sorted(directory.iterdir())
        except OSError:
            continue
        for entry in entries:
            if entry.name.startswith(prefix) and entry.name[len(prefix) :].isdigit():
                files += sorted(entry.glob("*.log"))
    return files


def _libc() -> Any:
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    return libc


def resident_bytes(path: Path) -> int | None:
    """How many bytes of ``path`` are in the page cache now (``mincore`` of a mapping
    that touches no page); ``None`` when it cannot be told (not Linux, a file gone)."""
    try:
        size = path.stat().st_size
        if size == 0:
            return 0
        libc = _libc()
        fd = os.open(path, os.O_RDONLY)
    except (OSError, AttributeError):
        return None
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr is None or addr == ctypes.c_void_p(-1).value:
            return None
        try:
            pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
            vec = (ctypes.c_ubyte * pages)()
            if libc.mincore(addr, size, vec) != 0:
                return None
            resident = sum(1 for v in bytes(vec) if v & 1)
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)
    return min(size, resident * mmap.PAGESIZE)


def warm(files: Iterable[Path]) -> int:
    """Read ``files`` once (into the page cache); the bytes read."""
    total = 0
    buf = bytearray(_CHUNK)
    for path in files:
        try:
            with open(path, "rb", buffering=0) as f:
                while n := f.readinto(buf):
                    total += n
        except OSError:
            continue
    return total


def _share(files: list[Path], size: int) -> float | None:
    counted = [resident_bytes(p) for p in files]
    if not size or any(c is None for c in counted):
        return None
    return round(sum(c or 0 for c in counted) / size, 4)


def settle_topic(broker_pids: Iterable[int], topic: str) -> dict[str, Any]:
    """``sync``, then read ``topic``'s log files once: the state every run starts from.
    Blocking (run it in a thread); returns what it found, for the run's row."""
    started = time.perf_counter()
    os.sync()
    synced = time.perf_counter()
    files = topic_log_files(log_dirs(broker_pids), topic)
    if not files:
        return {
            "log_bytes": None,
            "sync_s": round(synced - started, 2),
            "note": "no log files of the topic found (not an Apache Kafka log directory)",
        }
    size = sum(p.stat().st_size for p in files if p.exists())
    before = _share(files, size)
    warm(files)
    return {
        "log_bytes": size,
        "resident_before_warm": before,
        "resident": _share(files, size),
        "sync_s": round(synced - started, 2),
        "warm_s": round(time.perf_counter() - synced, 2),
    }


def damon_pageout() -> dict[str, Any] | None:
    """A DAMON scheme of this machine that pages out idle memory: its action and the
    idle time after which a page goes (seconds); ``None`` when there is none (or it
    cannot be read)."""
    try:
        for scheme in sorted(_DAMON.glob("*/contexts/*/schemes/*")):
            if not (scheme / "action").exists():
                continue
            action = (scheme / "action").read_text().strip()
            if action != "pageout":
                continue
            context = scheme.parent.parent
            state = (context.parent.parent / "state").read_text().strip()
            aggr_us = int((context / "monitoring_attrs/intervals/aggr_us").read_text())
            min_age = int((scheme / "access_pattern/age/min").read_text())
            return {
                "action": action,
                "state": state,
                "min_idle_s": round(min_age * aggr_us / 1e6, 1),
            }
    except (OSError, ValueError):
        return None
    return None
