"""Our runtime's own view of a paced rung, read from its metrics page.

The harness starts ``python -m decaton_aio run`` with a metrics port and scrapes it when
a rung's window opens and when it ends; the difference of the two scrapes is the
window's. From it: the event loop's lag (p99 and the largest), the garbage collector's
pauses, the runtime's longest step of its own, and where tasks waited before they
started (fetch, feed, lane, concurrency slot), how many fetch calls it made, and the
records pending when the rung's load ended. Histogram quantiles are bucket bounds:
"p99 <= 2 ms" means the 99th percentile fell in the bucket that ends at 2 ms.

With ``--workers N`` the supervisor's endpoint serves every worker's series (a
``worker`` label each); they are summed here.
"""

from __future__ import annotations

import asyncio
import math
import socket
import urllib.request
from collections import defaultdict
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["FAMILIES", "GAUGES", "Buckets", "free_port", "scrape", "window_figures"]

#: Histogram families read, by the short name the figures use.
FAMILIES = {
    "loop_lag": "decaton_event_loop_lag_seconds",
    "gc_pause": "decaton_gc_pause_seconds",
    "step": "decaton_runtime_step_duration_seconds",
    "fetch": "decaton_consumer_fetch_latency_seconds",  # its count: fetch calls in the window
    "wait_fetch": "decaton_task_fetch_wait_seconds",
    "wait_feed": "decaton_task_feed_wait_seconds",
    "wait_lane": "decaton_task_lane_wait_seconds",
    "wait_slot": "decaton_task_slot_wait_seconds",
    "delivery": "decaton_task_delivery_latency_seconds",
}

#: Gauges read at the window's end, summed over every series (partitions, workers).
GAUGES = {"pending": "decaton_partition_tasks_pending"}

#: short name -> {upper bound: cumulative count} (summed over every series); a gauge of
#: :data:`GAUGES` is kept as ``{0.0: sum}`` under ``gauge:<short name>``.
Buckets = dict[str, dict[float, float]]


def free_port() -> int:
    """A loopback port free right now (for the contender's metrics endpoint)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def parse(text: str) -> Buckets:
    """The cumulative buckets of :data:`FAMILIES` in a metrics page."""
    wanted = {family: short for short, family in FAMILIES.items()}
    gauges = {family: f"gauge:{short}" for short, family in GAUGES.items()}
    out: Buckets = {short: defaultdict(float) for short in FAMILIES}
    for family in text_string_to_metric_families(text):
        if family.name in gauges:
            key = gauges[family.name]
            out[key] = defaultdict(float)
            for sample in family.samples:
                out[key][0.0] += sample.value
            continue
        short = wanted.get(family.name)
        if short is None:
            continue
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                out[short][float(sample.labels["le"])] += sample.value
    return {short: dict(buckets) for short, buckets in out.items()}


async def scrape(port: int, timeout_s: float = 30.0) -> Buckets | None:
    """Read the metrics page on ``port``; ``None`` when it does not answer."""

    def get() -> str:
        url = f"http://127.0.0.1:{port}/metrics"
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            body: bytes = response.read()
            return body.decode()

    try:
        return parse(await asyncio.to_thread(get))
    except OSError:
        return None


def _quantile_ms(cumulative: dict[float, float], q: float) -> float | None:
    # The upper bound (ms) of the bucket holding quantile q; None without observations.
    bounds = sorted(cumulative)
    total = cumulative.get(math.inf, 0.0)
    if total <= 0:
        return None
    for bound in bounds:
        if cumulative[bound] >= q * total:
            return bound * 1000 if bound != math.inf else math.inf
    return math.inf


def window_figures(
    before: Buckets, after: Buckets, at_end: Buckets | None = None
) -> dict[str, Any]:
    """p50, p99 and the largest bucket of each family over the window between two
    scrapes, and how many observations each had (``None``: none in the window); each
    gauge's sum in ``at_end`` (a scrape when the load ended; default ``after``):
    ``pending_at_end``, records fetched and not completed."""
    out: dict[str, Any] = {}
    for short in GAUGES:
        value = (at_end if at_end is not None else after).get(f"gauge:{short}", {}).get(0.0)
        out[f"{short}_at_end"] = None if value is None else int(value)
    for short in FAMILIES:
        start, end = before.get(short, {}), after.get(short, {})
        diff = {bound: end[bound] - start.get(bound, 0.0) for bound in end}
        out[f"{short}_count"] = int(diff.get(math.inf, 0.0))
        for name, q in (("p50", 0.5), ("p99", 0.99), ("max", 1.0)):
            value = _quantile_ms(diff, q)
            out[f"{short}_{name}_ms"] = None if value is None else round(value, 3)
    return out
