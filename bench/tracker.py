"""S4: the watermark tracker alone, against the two baselines of ``bench.baselines``.

A cycle registers ``pending`` consecutive offsets (continuing where the previous cycle
ended, as a partition's offsets do), then completes them in a random order, asking for the
committable offset every ``COMMIT_EVERY`` completions (the runtime asks once per commit
interval, far less often). Completions per second is ``pending`` over the time of the
completion phase, which includes those ``committable()`` calls; cycles repeat until
``min_time_s`` has passed and the median is kept. Each cycle checks the watermark reached
the end of the batch with nothing left pending.

Each tracker completes through the call its runtime would use: ours through
``tracker.mark`` (a C-level append that queues the offset; ``committable()`` folds the
queue into the ring, vectorized, so the fold's cost is inside the measured time), the
baselines through ``complete``.
"""

from __future__ import annotations

import random
import statistics
import time
from typing import Any, Protocol

from bench.baselines import DequeFlagsTracker, HeapqTracker

__all__ = ["COMMIT_EVERY", "TRACKERS", "measure_tracker"]

COMMIT_EVERY = 1000


class _Tracker(Protocol):
    @property
    def pending(self) -> int: ...
    def register_batch(self, offsets: Any) -> Any: ...
    def complete(self, offset: int) -> Any: ...
    def committable(self) -> int | None: ...


#: name -> the tracker's hot-path completion method, when it is not ``complete``
_COMPLETE_WITH = {"ours": "mark"}


def _ours() -> _Tracker:
    from decaton_aio.consumer._watermark import WatermarkTracker

    return WatermarkTracker()


#: name -> (factory, description)
TRACKERS: dict[str, tuple[Any, str]] = {
    "ours": (
        _ours,
        "decaton_aio.consumer._watermark.WatermarkTracker (numpy/bytearray ring, mark())",
    ),
    "heapq": (HeapqTracker, "heapq priority queue (Decaton's first design)"),
    "deque": (DequeFlagsTracker, "deque of per-offset flags (Decaton's later design)"),
}


def measure_tracker(name: str, pending: int, min_time_s: float, seed: int = 3) -> dict[str, Any]:
    """Measure one tracker at one pending size.

    Returns:
        ``completions_per_s`` (median over cycles), ``registrations_per_s``, ``cycles``.
    """
    factory = TRACKERS[name][0]
    tracker = factory()
    rng = random.Random(seed)
    shuffled = list(range(pending))
    rng.shuffle(shuffled)
    complete_rates: list[float] = []
    register_rates: list[float] = []
    base = 0
    started = time.perf_counter()
    while len(complete_rates) < 3 or time.perf_counter() - started < min_time_s:
        offsets = range(base, base + pending)
        chunks = [
            [base + o for o in shuffled[i : i + COMMIT_EVERY]]
            for i in range(0, pending, COMMIT_EVERY)
        ]
        t0 = time.perf_counter()
        tracker.register_batch(offsets)
        t1 = time.perf_counter()
        complete = getattr(tracker, _COMPLETE_WITH.get(name, "complete"))
        committable = tracker.committable
        for chunk in chunks:
            for offset in chunk:
                complete(offset)
            committable()
        t2 = time.perf_counter()
        if committable() != base + pending or tracker.pending:
            raise AssertionError(
                f"{name}: watermark {committable()} != {base + pending}"
                f" or {tracker.pending} still pending"
            )
        register_rates.append(pending / (t1 - t0))
        complete_rates.append(pending / (t2 - t1))
        base += pending
    return {
        "completions_per_s": round(statistics.median(complete_rates)),
        "registrations_per_s": round(statistics.median(register_rates)),
        "cycles": len(complete_rates),
    }
