"""The soak's timeline, what it reads from the instances, and the checks that judge a run.

Each check returns the failures it found as sentences (an empty list passes), so a run
reports every one of them; ``tests/unit/test_soak_checks.py`` shows each check failing on
bad data.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from tests.soak.soak_app import DEAD, fate

#: How often the instances are restarted one after another in the long form.
ROLL_PERIOD_S = 300.0

#: RSS may grow this much (a fraction) after warm-up.
RSS_GROWTH_LIMIT = 0.05

#: Late asyncio tasks may exceed the most seen before by this much (a fraction).
TASKS_SLACK = 0.05


@dataclass(frozen=True)
class Plan:
    """What happens when, in seconds from the start of the paced phase.

    Attributes:
        duration_s: how long tasks are produced at half the capacity.
        sample_s: how often the instances and the group are read.
        warmup_s: how long an incarnation runs (under the paced load) before its memory,
            descriptors and tasks are judged.
        capacity_s: how long the capacity is measured (unpaced), before the paced phase.
        rolls: when each rolling restart begins (the instances one after another).
        roll_gap_s: the wait between two instances' restarts in a roll.
        broker_at_s: when the broker is restarted: right before a roll, so that the
            catch-up after it (the load's peak, which lifts the high-water mark of a
            process's memory) comes early in the lives of the incarnations judged next.
        recovery_limit_s: how long after a disturbance the group may take to commit
            every record that was there when it ended.
    """

    duration_s: float
    sample_s: float
    warmup_s: float
    capacity_s: float
    rolls: tuple[float, ...]
    roll_gap_s: float
    broker_at_s: float
    recovery_limit_s: float


def plan(minutes: float) -> Plan:
    """The timeline of a soak of ``minutes``: a rolling restart every 5 minutes, the
    middle one right after the broker restart; a shorter soak scales the period down to
    a third of its length, so each disturbance happens at least once."""
    duration = minutes * 60
    period = min(ROLL_PERIOD_S, duration / 3)
    rolls = tuple(period * k for k in range(1, math.ceil(duration / period)))
    return Plan(
        duration_s=duration,
        sample_s=min(10.0, max(2.0, duration / 60)),
        warmup_s=min(60.0, max(30.0, duration / 30)),
        capacity_s=min(30.0, max(15.0, duration / 60)),
        rolls=rolls,
        roll_gap_s=period / 10,
        broker_at_s=rolls[len(rolls) // 2],
        recovery_limit_s=min(120.0, period),
    )


# ---------------------------------------------------------------- instance readings


@dataclass(frozen=True)
class Reading:
    """One incarnation's metrics page at one moment.

    Attributes:
        rss_mb: resident memory (``process_resident_memory_bytes``), in MiB.
        fds: open file descriptors (``process_open_fds``).
        tasks: asyncio tasks alive on its event loop (``decaton_event_loop_tasks``), -1
            before the runtime first counted them.
        parked: the runtime's idle workers among them (``decaton_parked_workers``).
        pending: records fetched and not completed, over its partitions.
        commit_age_s: the oldest commit age of its partitions (0 with none).
        lag: the consumer lag of its partitions.
    """

    rss_mb: float
    fds: float
    tasks: float
    parked: float
    pending: float
    commit_age_s: float
    lag: float


def parse_metrics(text: str) -> Reading:
    """Read an instance's metrics page (Prometheus text format)."""
    values: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values.setdefault(sample.name, []).append(sample.value)

    def one(name: str, default: float = -1.0) -> float:
        found = values.get(name)
        return found[0] if found else default

    return Reading(
        rss_mb=one("process_resident_memory_bytes") / 2**20,
        fds=one("process_open_fds"),
        tasks=one("decaton_event_loop_tasks"),
        parked=one("decaton_parked_workers", 0.0),
        pending=sum(values.get("decaton_partition_tasks_pending", [])),
        commit_age_s=max(values.get("decaton_partition_commit_age_seconds", [0.0])),
        lag=sum(values.get("decaton_consumer_lag", [])),
    )


@dataclass
class Incarnation:
    """One run of one instance: when it started and what it read like.

    Attributes:
        name: ``i0#2`` for the second run of instance ``i0``.
        started: seconds from the start of the paced phase (negative before it).
        readings: ``(seconds, reading)`` in time order.
    """

    name: str
    started: float
    readings: list[tuple[float, Reading]] = field(default_factory=list)


def _count(reading: Reading, what: str) -> float:
    if what == "tasks":
        return reading.tasks - max(reading.parked, 0.0)
    return reading.fds


def steady_window(
    started: float, warmup_s: float, episodes: Sequence[tuple[float, float]]
) -> tuple[float, float]:
    """The stretch of an incarnation's life that is judged: from its warm-up (counted
    from the paced phase at the earliest) and the end of the episode it was born in, to
    the beginning of the next episode (seconds; ``inf`` at the end of the run).

    An episode is a rolling restart or the broker restart, from its beginning until the
    lag it left went back to 0. Each moves partitions and brings a burst (a bigger share
    of the partitions, a backlog to catch up with), after which a process keeps the
    high-water mark of its memory and the workers it parked: the growth that matters is
    the one under the steady load between them.
    """
    since = max(started, 0.0) + warmup_s
    for began, ended in sorted(episodes):
        if began <= started < ended or began <= since < ended:
            since = max(since, ended)
    until = min((began for began, _ in episodes if began >= since), default=math.inf)
    return since, until


def growth_failures(
    incarnation: Incarnation, warm_from: float, until: float = math.inf
) -> tuple[dict[str, Any], list[str]]:
    """Judge an incarnation's readings from ``warm_from`` to ``until`` (seconds).

    The readings after warm-up are cut in thirds. RSS: the median of the last third is
    less than :data:`RSS_GROWTH_LIMIT` above the first third's. Descriptors and tasks do
    not grow: the median (tasks: the lowest) of the last third is no higher than the most
    seen before it, warm-up included (tasks: :data:`TASKS_SLACK` higher). Both come and
    go: a broker restart closes connections for a while, tasks run with the load (a burst
    wakes many workers at once); a leak lifts the count, and its lows, above anything
    seen. The tasks counted leave out the runtime's parked workers:
    up to 1,024 of them wait for the next task, as many as the highest concurrency so far
    needed, so their number steps up with each new peak. Fewer than six readings are not
    judged.

    Returns:
        The figures (empty when not judged) and the failures.
    """
    counted = [(t, r) for t, r in incarnation.readings if r.tasks >= 0 and t < until]
    warm = [r for t, r in counted if t >= warm_from]
    if len(warm) < 6:
        return {}, []
    third = len(warm) // 3
    first, last = warm[:third], warm[-third:]
    before = [r for _, r in counted[:-third]]
    rss_first = statistics.median(r.rss_mb for r in first)
    rss_last = statistics.median(r.rss_mb for r in last)
    figures: dict[str, Any] = {
        "readings": len(warm),
        "rss_mb": [round(rss_first, 1), round(rss_last, 1)],
        "rss_growth_pct": round(100 * (rss_last / rss_first - 1), 2),
    }
    failures = []
    if rss_last > rss_first * (1 + RSS_GROWTH_LIMIT):
        failures.append(
            f"{incarnation.name}: RSS grew {figures['rss_growth_pct']}% after warm-up "
            f"({rss_first:.1f} -> {rss_last:.1f} MiB)"
        )
    for what, slack, late_of in (("fds", 0.0, statistics.median), ("tasks", TASKS_SLACK, min)):
        most = max(_count(r, what) for r in before)
        late = late_of(_count(r, what) for r in last)
        figures[what] = [most, late]
        if late > most * (1 + slack):
            failures.append(
                f"{incarnation.name}: {what} grew (at most {most:g} before, {late:g} late)"
            )
    return figures, failures


# ---------------------------------------------------------------- disturbances


@dataclass
class Disturbance:
    """A restart and how the group got over it.

    Attributes:
        what: ``restart i1`` or ``broker restart``.
        began: when it began (seconds from the start of the paced phase).
        ended: when it was over (the instance joined again, the broker answered).
        recovered: when the group had committed every record that was in the task and
            retry topics when it ended: the lag it left went back to 0 (``None``: not
            within the limit).
    """

    what: str
    began: float
    ended: float | None = None
    recovered: float | None = None

    @property
    def recovery_s(self) -> float | None:
        """Seconds from its end to the recovery."""
        if self.ended is None or self.recovered is None:
            return None
        return self.recovered - self.ended


def recovery_failures(disturbances: Sequence[Disturbance], limit_s: float) -> list[str]:
    """Every disturbance ended and its lag went back to 0 within ``limit_s``."""
    failures = []
    for d in disturbances:
        took = d.recovery_s
        if d.ended is None:
            failures.append(f"{d.what} at {d.began:.0f} s never ended")
        elif took is None or took > limit_s:
            failures.append(
                f"{d.what} at {d.began:.0f} s: the lag did not go back to 0 within "
                f"{limit_s:.0f} s" + (f" (it took {took:.0f} s)" if took is not None else "")
            )
    return failures


def disturbance_figures(disturbances: Sequence[Disturbance]) -> list[dict[str, Any]]:
    """The disturbances as JSON objects, with their recovery times."""
    return [{**asdict(d), "recovery_s": d.recovery_s} for d in disturbances]


# ---------------------------------------------------------------- task logs


_FIELDS = {"s": 6, "e": 7}  # fields of a start line and of an end line


class TaskLog:
    """What the instances' task logs say, read one incarnation at a time.

    Within an incarnation, between two rebalances, each key's tasks (per topic and
    partition) start in offset order and one at a time; a rebalance lets a key start
    again at its committed point.

    Args:
        tasks: how many tasks were produced (numbered from 0).
    """

    def __init__(self, tasks: int) -> None:
        self.tasks = tasks
        self.ok = np.zeros(tasks, dtype=np.uint32)  # successful runs per task
        self.runs = 0
        self.out_of_order: list[str] = []
        self.overlaps: list[str] = []
        self.unknown: list[str] = []
        self.cut = 0  # lines cut short (a process that died mid-write)

    def read(self, name: str, lines: Iterable[str]) -> None:
        """Read one incarnation's log."""
        last: dict[tuple[str, str, str], int] = {}
        running: dict[tuple[str, str, str], int] = {}
        for line in lines:
            parts = line.split()
            if parts == ["epoch"]:
                last.clear()
                continue
            if len(parts) != _FIELDS.get(parts[0] if parts else "", -1):
                self.cut += 1
                continue
            kind, topic, partition, offset_text, key, n_text = parts[:6]
            lane = (topic, partition, key)
            offset, n = int(offset_text), int(n_text)
            if not 0 <= n < self.tasks:
                if kind == "s":
                    self.unknown.append(f"{name}: task {n} was never produced")
                continue
            if kind == "s":
                self.runs += 1
                where = f"{name}: key {key} in {topic}-{partition}"
                if lane in running:
                    self.overlaps.append(f"{where}: {offset} started while {running[lane]} ran")
                if offset <= last.get(lane, -1):
                    self.out_of_order.append(f"{where}: {offset} started after {last[lane]}")
                last[lane] = running[lane] = offset
            else:
                if running.get(lane) == offset:
                    del running[lane]
                if parts[6] == "ok":
                    self.ok[n] += 1

    def failures(self, dead_lettered: Iterable[int]) -> tuple[dict[str, Any], list[str]]:
        """Judge the logs with the task numbers found in the dead letter topic: every
        task processed or dead-lettered, only tasks meant to be dead-lettered there, and
        keys in order.

        Returns:
            The counts and the failures.
        """
        dead = np.zeros(self.tasks, dtype=bool)
        wrong = sorted({n for n in dead_lettered if not 0 <= n < self.tasks or fate(n) not in DEAD})
        meant = [n for n in dead_lettered if 0 <= n < self.tasks and fate(n) in DEAD]
        dead[meant] = True
        processed = self.ok > 0
        missing = np.flatnonzero(~processed & ~dead)
        counts: dict[str, Any] = {
            "tasks": self.tasks,
            "runs": self.runs,
            "processed": int(processed.sum()),
            "processed_more_than_once": int((self.ok > 1).sum()),
            "dead_lettered": int(dead.sum()),
            "out_of_order": len(self.out_of_order),
            "overlaps": len(self.overlaps),
            "lines_cut": self.cut,
        }
        failures = [*self.unknown[:5], *self.out_of_order[:5], *self.overlaps[:5]]
        if missing.size:
            failures.append(
                f"{missing.size} tasks neither processed nor dead-lettered, e.g. "
                f"{missing[:10].tolist()}"
            )
        if wrong:
            failures.append(f"{len(wrong)} tasks dead-lettered that should not be: {wrong[:10]}")
        both = np.flatnonzero(processed & dead)
        if both.size:
            failures.append(f"{both.size} tasks both processed and dead-lettered: {both[:10]}")
        return counts, failures
