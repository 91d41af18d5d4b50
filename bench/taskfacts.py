"""Per-task facts: what every contender writes and everything the harness derives from them.

Every contender, Python or Java, one process or several, writes one record per finished
task to a file of its own in the run's facts directory: five little-endian signed 64-bit
integers, ``key, partition, offset, start_ns, end_ns`` (the key id of the task body, where
the record came from, and when the processor body started and ended, in wall-clock
nanoseconds: ``time.time_ns()``, Java's ``Instant.now()``, one clock for every process).
Records are appended in blocks; a block cut by the end of the process is ignored.

From them the harness computes, for every contender the same way: throughput over a
window, per-key order and overlap, duplicates, processing latency, produce-to-done latency
(joined with the producer's own record of when each offset was sent), the offsets a commit
must cover, and a per-second timeline.
"""

from __future__ import annotations

import contextlib
import os
import time
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "FIELDS",
    "Facts",
    "FactsWriter",
    "count_facts",
    "load_facts",
    "pacer_ack_ms",
    "produce_to_done_ms",
]

FIELDS = ("key", "partition", "offset", "start_ns", "end_ns")
_WIDTH = len(FIELDS)
_FLUSH_RECORDS = 2048
_FLUSH_S = 0.2


class FactsWriter:
    """Appends facts to ``<dir>/<pid>.facts``; Python contenders call :meth:`add` per task.

    Records are buffered and written every ``_FLUSH_RECORDS`` tasks, or by a timer of the
    running event loop every ``_FLUSH_S`` seconds so an idle contender's last tasks are on
    disk too.

    Args:
        directory: the run's facts directory.
    """

    def __init__(self, directory: str | Path) -> None:
        self._path = Path(directory) / f"{os.getpid()}.facts"
        self._file = open(self._path, "ab", buffering=0)  # noqa: SIM115  # closed at exit
        self._buf: array[int] = array("q")
        self._limit = _FLUSH_RECORDS * _WIDTH
        self._timer = False

    def add(self, key: int, partition: int, offset: int, start_ns: int, end_ns: int) -> None:
        """Record one finished task."""
        buf = self._buf
        buf.extend((key, partition, offset, start_ns, end_ns))
        if len(buf) >= self._limit:
            self.flush()
        elif not self._timer:
            self._arm()

    def _arm(self) -> None:
        import asyncio

        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._timer = True
        loop.call_later(_FLUSH_S, self._tick)

    def _tick(self) -> None:
        self._timer = False
        self.flush()

    def flush(self) -> None:
        """Write what is buffered."""
        if self._buf:
            buf, self._buf = self._buf, array("q")
            self._file.write(buf.tobytes())

    def close(self) -> None:
        """Flush and close the file (a contender is stopped instead)."""
        self.flush()
        self._file.close()


@dataclass
class Facts:
    """All facts of one run, as numpy columns (int64)."""

    key: np.ndarray[Any, Any]
    partition: np.ndarray[Any, Any]
    offset: np.ndarray[Any, Any]
    start_ns: np.ndarray[Any, Any]
    end_ns: np.ndarray[Any, Any]

    def __len__(self) -> int:
        return int(self.key.size)

    def select(self, mask: np.ndarray[Any, Any]) -> Facts:
        return Facts(*(getattr(self, f)[mask] for f in FIELDS))

    def ended_in(self, t0_ns: int, t1_ns: int) -> Facts:
        """The tasks that ended within ``[t0_ns, t1_ns)``."""
        return self.select((self.end_ns >= t0_ns) & (self.end_ns < t1_ns))

    def last_offsets(self) -> dict[int, int]:
        """The highest offset per partition."""
        out: dict[int, int] = {}
        for p in np.unique(self.partition):
            out[int(p)] = int(self.offset[self.partition == p].max())
        return out

    def duplicates(self) -> int:
        """Tasks recorded more than once (the same partition and offset)."""
        pairs = (self.partition << 48) | self.offset
        return int(pairs.size - np.unique(pairs).size)

    def order_checks(self) -> dict[str, Any]:
        """Per-key order over these tasks: a key's task starting before the previous one
        of the key ended is an overlap; one whose offset is not above the previous one's
        is an order violation (a task run twice counts as one)."""
        if len(self) < 2:
            return {"order_violations": 0, "key_overlaps": 0, "violation_samples": []}
        idx = np.lexsort((self.start_ns, self.key))
        key, off = self.key[idx], self.offset[idx]
        start, end = self.start_ns[idx], self.end_ns[idx]
        same = key[1:] == key[:-1]
        overlap = same & (start[1:] < end[:-1])
        order = same & (off[1:] <= off[:-1])
        samples = []
        for kind, mask in (("overlap", overlap), ("order", order)):
            for i in np.flatnonzero(mask)[:3]:
                samples.append(
                    {
                        "kind": kind,
                        "key": int(key[i + 1]),
                        "offset": int(off[i + 1]),
                        "previous_offset": int(off[i]),
                    }
                )
        return {
            "order_violations": int(order.sum()),
            "key_overlaps": int(overlap.sum()),
            "violation_samples": samples,
        }

    def processing_ms(self) -> tuple[float | None, float | None]:
        """p50 and p99 of end minus start, in ms."""
        return _p50_p99_ms(self.end_ns - self.start_ns)

    def timeline(self, t0_ns: int, t1_ns: int, slice_s: float = 1.0) -> list[int]:
        """Tasks ended per ``slice_s`` within the window, as tasks/s."""
        step = int(slice_s * 1e9)
        bins = np.arange(t0_ns, t1_ns + 1, step)
        if bins.size < 2:
            return []
        counts, _ = np.histogram(self.end_ns, bins=bins)
        return [round(int(c) / slice_s) for c in counts]


def _p50_p99_ms(values_ns: np.ndarray[Any, Any]) -> tuple[float | None, float | None]:
    if values_ns.size == 0:
        return None, None
    p50, p99 = np.percentile(values_ns, [50, 99])
    return round(float(p50) / 1e6, 3), round(float(p99) / 1e6, 3)


def load_facts(directory: Path) -> Facts:
    """Every complete record of every ``*.facts`` file in ``directory``."""
    parts = []
    for path in sorted(directory.glob("*.facts")):
        raw = path.read_bytes()
        usable = len(raw) - len(raw) % (8 * _WIDTH)
        if usable:
            parts.append(np.frombuffer(raw[:usable], dtype="<i8").reshape(-1, _WIDTH))
    table = np.concatenate(parts) if parts else np.empty((0, _WIDTH), dtype=np.int64)
    return Facts(*(np.ascontiguousarray(table[:, i]) for i in range(_WIDTH)))


def count_facts(directory: Path) -> int:
    """How many records the contender's files hold now (a cheap progress count)."""
    total = 0
    for path in directory.glob("*.facts"):
        with contextlib.suppress(OSError):
            total += path.stat().st_size // (8 * _WIDTH)
    return total


def pacer_ack_ms(sent: dict[str, np.ndarray[Any, Any]], t0_ns: int, t1_ns: int) -> dict[str, Any]:
    """The pacer's send call to the broker's acknowledgement, p50 and p99, for the records
    sent within ``[t0_ns, t1_ns)`` (``sent`` as for :func:`produce_to_done_ms`, with an
    ``acked_ns`` column): the transport's part of produce-to-done, before any consumer."""
    if "acked_ns" not in sent:
        return {}
    window = (sent["sent_ns"] >= t0_ns) & (sent["sent_ns"] < t1_ns)
    p50, p99 = _p50_p99_ms(sent["acked_ns"][window] - sent["sent_ns"][window])
    return {"pacer_ack_p50_ms": p50, "pacer_ack_p99_ms": p99}


def produce_to_done_ms(
    facts: Facts, sent: dict[str, np.ndarray[Any, Any]], t0_ns: int, t1_ns: int
) -> dict[str, Any]:
    """Latency from the producer's send call to the end of the task, for the tasks sent
    within ``[t0_ns, t1_ns)``; ``sent`` has ``partition``, ``offset`` and ``sent_ns``
    columns. Tasks sent but never finished are counted: a percentile that falls among
    them is reported as a lower bound (``*_lower_bound``).

    ``wait_p99_ms`` (send to start) and ``run_p99_ms`` (start to end) split the finished
    tasks' latency: a long wait is queueing before the task (fetch, pause, per-key order,
    slots), a long run is a task slowed down while it ran (a stalled event loop).
    ``wait_own_p99_ms`` is the wait without the part spent behind the key's previous task
    (from the later of the send and that task's end to the start), which per-key order
    imposes on every key-ordered runtime alike; ``behind_key_share`` is the share of tasks
    sent while their key's previous task had not ended."""
    window = (sent["sent_ns"] >= t0_ns) & (sent["sent_ns"] < t1_ns)
    s_part, s_off, s_ns = sent["partition"][window], sent["offset"][window], sent["sent_ns"][window]
    sent_keys = (s_part << 48) | s_off
    done_keys = (facts.partition << 48) | facts.offset
    # The first end of each offset (a task run twice is done at its first end).
    order = np.lexsort((facts.end_ns, done_keys))
    done_keys, done_end = done_keys[order], facts.end_ns[order]
    done_start, done_key = facts.start_ns[order], facts.key[order]
    first = np.ones(done_keys.size, dtype=bool)
    first[1:] = done_keys[1:] != done_keys[:-1]
    done_keys, done_end, done_start = done_keys[first], done_end[first], done_start[first]
    done_key = done_key[first]
    # When the key's previous task (by offset, in the partition) ended: no key-ordered
    # runtime may start a task before that, so the wait that is the runtime's own begins
    # at whichever is later, the send or that end.
    by_key = np.lexsort((done_keys, done_key, done_keys >> 48))
    prev_end = np.full(done_keys.size, np.iinfo(np.int64).min, dtype=np.int64)
    if by_key.size > 1:
        k_key, k_slot = done_key[by_key], done_keys[by_key]
        same = (k_key[1:] == k_key[:-1]) & ((k_slot[1:] >> 48) == (k_slot[:-1] >> 48))
        prev_end[by_key[1:][same]] = done_end[by_key[:-1][same]]
    pos = np.searchsorted(done_keys, sent_keys)
    pos_ok = pos < done_keys.size
    found = np.zeros(sent_keys.size, dtype=bool)
    found[pos_ok] = done_keys[pos[pos_ok]] == sent_keys[pos_ok]
    sent_at, started, ended = s_ns[found], done_start[pos[found]], done_end[pos[found]]
    latency = ended - sent_at
    missing = int((~found).sum())
    out: dict[str, Any] = {"sent": int(sent_keys.size), "not_done": missing}
    out["wait_p99_ms"] = _p50_p99_ms(started - sent_at)[1]
    behind = prev_end[pos[found]]
    ready = np.maximum(sent_at, behind)
    out["wait_own_p99_ms"] = _p50_p99_ms(np.maximum(started - ready, 0))[1]
    out["behind_key_share"] = round(float(np.mean(behind > sent_at)), 4) if sent_at.size else None
    out["run_p99_ms"] = _p50_p99_ms(ended - started)[1]
    total = latency.size + missing
    for q, name in ((50, "p50_ms"), (99, "p99_ms")):
        if total == 0:
            out[name] = None
        elif missing and q / 100 * total > latency.size:
            out[name] = None
            waited = (time.time_ns() - t1_ns) / 1e6
            out[f"{name}_lower_bound"] = round(waited, 1)
        else:
            # Unfinished tasks sort last: take the percentile among all sent ones.
            ranked = np.sort(latency)
            index = min(int(np.ceil(q / 100 * total)) - 1, ranked.size - 1)
            out[name] = round(float(ranked[max(index, 0)]) / 1e6, 3)
    return out
