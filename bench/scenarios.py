"""The scenarios, their sizes for ``bench`` and ``bench-quick``, and who runs in each.

Sizes follow the benchmark issue: S1 measures 100,000 tasks after a warm-up; slow peers
(a sequential consumer does about 100 tasks/s at 10 ms) are cut by the time limit of the
window instead, and the result says how many tasks were measured.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["PUBLISHED", "S6_QUOTA", "Scenario", "plan"]

#: Our settings: the runtime's defaults (``decaton.partition.concurrency`` 384 tasks in
#: flight per partition, 10,000 pending). At 10 ms per task, 384 per partition saturated one
#: core here; 256 left a fifth of it idle.
OURS_IO = {"max_pending": 10_000}  # concurrency: the runtime default
OURS_NOOP = {"max_pending": 10_000}


def _quota_available() -> bool:
    # Per-key quota needs Application(shaping=True); older trees lack it.
    from dataclasses import fields

    from decaton_aio.app import Application

    return any(f.name == "shaping" for f in fields(Application))


#: S6 with per-key quota: a key above this many tasks/s is shaped to
#: ``<topic>-shaping`` (10 ms tasks run one at a time per key: ~100/s at most).
S6_QUOTA: dict[str, Any] = {
    "available": _quota_available(),
    "reason": "per-key quota is not in this tree (no Application.shaping)",
    "per_key_quota": 100,
}

#: Decaton's own figures for S1's shape, from its maintainers' comparison (Java, threads).
PUBLISHED = [
    {
        "contender": "decaton-java-10-threads",
        "label": "Decaton (Java), 10 threads per partition",
        "tasks_per_s": 2900,
    },
    {
        "contender": "decaton-java-sequential",
        "label": "plain Java consumer, sequential",
        "tasks_per_s": 250,
    },
]


@dataclass(frozen=True)
class Scenario:
    """One scenario of one run mode.

    Attributes:
        name: ``S1`` .. ``S6``.
        title: what it measures.
        contenders: contender names, in run order (S6: variants of ours).
        partitions: partitions of each contender's topic.
        keys: distinct ordinary keys.
        sleep_ms: simulated I/O per task (0: no-op).
        slow_ratio: share of tasks taking ``slow_ms`` instead (S3).
        slow_ms: simulated I/O of a slow task.
        warmup: completions before the window opens.
        measured: completions in the window.
        warmup_max_s: the warm-up ends at the latest this long after the first task.
        measure_max_s: the window closes at the latest after this long.
        options: contender name -> options.
        paced: S6 settings (rate, duration_s, hot_share, drain_s) or ``None``.
    """

    name: str
    title: str
    contenders: tuple[str, ...]
    partitions: int = 3
    keys: int = 10_000
    sleep_ms: int = 10
    slow_ratio: float = 0.0
    slow_ms: int = 500
    warmup: int = 10_000
    measured: int = 100_000
    warmup_max_s: float = 2.0
    measure_max_s: float = 10.0
    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    paced: dict[str, Any] | None = None


_PEERS = ("sequential", "gather", "keyed", "faust", "faststream")
_PEER_OPTIONS: dict[str, dict[str, Any]] = {
    "gather": {"batch_records": 500},
    "keyed": {"batch_records": 500},
    "sequential": {"batch_records": 500},
    "faust": {"concurrency": 100},
    "faststream": {"workers": 100},
}


def plan(quick: bool) -> list[Scenario]:
    """The scenarios of ``make bench`` (``quick=False``) or ``make bench-quick``."""
    warm_s, window_s = (1.0, 3.0) if quick else (2.0, 10.0)
    io = {**_PEER_OPTIONS, "ours": OURS_IO}
    noop = {**_PEER_OPTIONS, "ours": OURS_NOOP}
    return [
        Scenario(
            "S1",
            "I/O bound: 10 ms asyncio.sleep per task, 10,000 keys, 3 partitions",
            ("ours", *_PEERS),
            warmup=5_000 if quick else 10_000,
            measured=30_000 if quick else 100_000,
            warmup_max_s=warm_s,
            measure_max_s=window_s,
            options=io,
        ),
        Scenario(
            "S2",
            "no-op tasks, 10,000 keys, 3 partitions",
            ("ours", "sequential", "gather") if quick else ("ours", *_PEERS),
            sleep_ms=0,
            warmup=20_000,
            measured=100_000 if quick else 200_000,
            warmup_max_s=warm_s,
            measure_max_s=window_s,
            options=noop,
        ),
        Scenario(
            "S3",
            "outliers: as S1, 1% of tasks (random keys) take 500 ms",
            ("ours", "gather") if quick else ("ours", *_PEERS),
            slow_ratio=0.01,
            warmup=5_000 if quick else 10_000,
            measured=30_000 if quick else 100_000,
            warmup_max_s=warm_s,
            measure_max_s=window_s,
            options=io,
        ),
        Scenario(
            "S4",
            "watermark tracker alone: random-order completions at 10k and 100k pending",
            ("ours", "heapq", "deque"),
            measure_max_s=0.3 if quick else 1.0,
            options={"*": {"pending_sizes": [10_000, 100_000]}},
        ),
        Scenario(
            "S5",
            "memory: RSS per pending record at decaton.max.pending.records = 100,000",
            ("ours",),
            partitions=1,
            measured=100_000,
            measure_max_s=30.0,
            options={"ours": {**OURS_IO, "max_pending": 100_000}},
        ),
        Scenario(
            "S6",
            "hot key, paced: fixed rate, one key ~1/3 of traffic, 10 ms I/O",
            ("uniform", "hot-key", "hot-key+quota"),
            options={
                "uniform": OURS_IO,
                "hot-key": OURS_IO,
                "hot-key+quota": {**OURS_IO, "per_key_quota": S6_QUOTA["per_key_quota"]},
            },
            paced={
                "rate": 6000,
                "duration_s": 8.0 if quick else 30.0,
                "hot_share": 1 / 3,
                "drain_s": 3.0 if quick else 10.0,
            },
        ),
    ]
