"""S5: resident memory per pending record at ``decaton.max.pending.records`` = 100,000.

The topic (one partition, or several: S5's shapes) holds exactly ``target`` tasks, and
no partition's ``max_pending`` is below its share. The processor never
finishes (it waits on an event), so every fetched record stays pending: up to
``concurrency`` of them as suspended coroutines, the rest queued in key lanes or the ready
queue. RSS is read after the subscription started (before any record arrived) and again
once pending reached the maximum and the partition paused; the difference over the pending
count is the cost of one pending record, everything included (the record object, its
bytes, the decoded task, lane entries, the coroutine of a running task, the tracker slot,
and whatever the Kafka client keeps for it).
"""

from __future__ import annotations

import asyncio
import gc
import os
import time
from typing import Any

from bench.workload import Spec, Task

__all__ = ["rss_bytes", "run"]

_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    """The process's resident set size now (Linux ``/proc/self/statm``)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


async def run(spec: Spec) -> dict[str, Any]:
    from bench.contenders.ours import build_subscription

    forever = asyncio.Event()

    async def process(_ctx: Any, task: Task) -> None:
        await forever.wait()

    # Pending records to wait for: the topic's (max_pending per partition may be more).
    target = int(spec.options.get("target", spec.options.get("max_pending", 100_000)))
    subscription = build_subscription(spec, process)
    await subscription.start()
    gc.collect()
    before = rss_bytes()
    deadline = time.monotonic() + spec.measure_max_s
    pending = 0
    while time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        pending = sum(p.pending for p in subscription.partitions.values())
        if pending >= target:
            await asyncio.sleep(0.5)  # let the fetcher settle after the pause
            break
    gc.collect()
    pending = sum(p.pending for p in subscription.partitions.values())
    after = rss_bytes()
    in_flight = sum(p.in_flight for p in subscription.partitions.values())
    return {
        "event": "result",
        "scenario": spec.scenario,
        "contender": spec.contender,
        "pending": pending,
        "in_flight": in_flight,
        "rss_before_bytes": before,
        "rss_after_bytes": after,
        "bytes_per_pending": round((after - before) / max(pending, 1), 1),
        "options": spec.options,
    }
