"""What the runtime counts: plain attributes per partition and per subscription.

The runtime mutates these objects directly on its event loop (an attribute increment or a
histogram append per event); `decaton_aio.metrics` reads them at scrape time from
its HTTP thread. Durations that accumulate while a state lasts (paused, starved) keep the
start of the open interval and are read up to "now", so a scrape in the middle of a long
pause sees it grow.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from decaton_aio._histogram import LOOP_BUCKETS_S, FastHistogram

__all__ = ["PartitionStats", "SubscriptionStats"]

# Counters added together by merge_counters (ints and float seconds alike).
_SUMMED = (
    "processed", "errors", "discarded", "retries", "compactions", "timeouts", "throttled_s",
    "consumed", "with_metadata", "without_metadata", "retry_queued", "retry_failed",
    "dead_letter_queued", "dead_letter_failed", "shaping_queued", "shaping_failed",
)  # fmt: skip
_HISTOGRAMS = (
    "process_duration", "completion_duration", "done_at_once", "delivery_latency",
    "scheduling_delay", "lane_wait", "slot_wait",
)  # fmt: skip


class PartitionStats:
    """What the runtime counts about one assigned partition; it mutates the fields directly.

    Counters only grow: ``processed``, ``errors``, ``discarded``, ``retries``,
    ``compactions``, ``timeouts`` (deferred completions past their timeout), ``consumed``
    (records fetched), ``with_metadata`` and ``without_metadata`` (tasks with and without
    a ``dt_meta`` header, both counted when they first run), ``retry_queued`` /
    ``retry_failed``,
    ``dead_letter_queued`` / ``dead_letter_failed`` and ``shaping_queued`` /
    ``shaping_failed`` (records sent to a side topic, and failed sends, each retried),
    ``throttled_s`` (float seconds), and the time counters read through
    `paused_total()` and `starved_total()`. Gauges are set by the runtime:
    ``pending`` (records fetched and not completed), ``pending_bytes`` (the bytes of their
    values), ``paused`` (fetching paused for
    back-pressure), ``committed_offset`` (last committed, i.e. the next offset a restart
    reads), ``consumed_offset`` (one past the last fetched record) and ``high_watermark``
    (the partition's end offset, for the lag); ``-1`` means unknown and the gauge is not
    exported. ``commit_current_at`` is when the committer last found the partition's
    commit up to date (it committed, or had nothing new to commit; the assignment to
    begin with), read as an age through `commit_age()`. Histograms: ``done_at_once``
    (seconds the processor ran, for tasks complete when it returned: their process and
    completion durations are the same, observed once on the hot path),
    ``process_duration`` and ``completion_duration`` (the same two
    durations of the other tasks: deferred, retried, dead-lettered; the completion is
    longer), read together through `process_total()` and `completion_total()`;
    ``delivery_latency`` (record timestamp to processing start), ``scheduling_delay``
    (seconds a scheduled task waited for its time), ``lane_wait`` (seconds a record waited
    behind an earlier record of its key) and ``slot_wait`` (seconds a ready record waited
    for a concurrency slot or a rate token); a record started as soon as it was fed waits
    in neither and is not observed there, and one offset in 16 is sampled.

    Caller: the event loop that owns the partition (writes); the scrape thread (reads).

    Args:
        clock: the monotonic clock of the time counters (tests pass a fake one).
        starved: start a starved interval now (a fresh partition has nothing pending);
            ``False`` for accumulators and copies.
    """

    __slots__ = (
        *_SUMMED, *_HISTOGRAMS, "clock", "commit_current_at", "committed_offset",
        "consumed_offset", "high_watermark", "paused", "paused_s", "paused_since", "pending",
        "pending_bytes",
        "starved_s", "starved_since",
    )  # fmt: skip

    def __init__(
        self, clock: Callable[[], float] = time.monotonic, *, starved: bool = True
    ) -> None:
        """Create stats with zero counters, empty histograms and unknown offsets; the
        partition counts as starved (nothing pending) from now."""
        for name in _SUMMED:
            setattr(self, name, 0)
        self.throttled_s = 0.0
        self.clock = clock
        self.pending = 0
        self.pending_bytes = 0
        self.paused = False
        self.paused_s = 0.0
        self.paused_since = -1.0
        self.starved_s = 0.0
        self.starved_since = clock() if starved else -1.0
        self.committed_offset = -1
        self.commit_current_at = clock()
        self.consumed_offset = -1
        self.high_watermark = -1
        self.process_duration = FastHistogram()
        self.completion_duration = FastHistogram()
        self.done_at_once = FastHistogram()
        self.delivery_latency = FastHistogram()
        self.scheduling_delay = FastHistogram()
        self.lane_wait = FastHistogram()
        self.slot_wait = FastHistogram()

    # Declared for type checkers; set in __init__ from _SUMMED.
    processed: int
    errors: int
    discarded: int
    retries: int
    compactions: int
    timeouts: int
    throttled_s: float
    consumed: int
    with_metadata: int
    without_metadata: int
    retry_queued: int
    retry_failed: int
    dead_letter_queued: int
    dead_letter_failed: int
    shaping_queued: int
    shaping_failed: int

    def set_paused(self, paused: bool) -> None:
        """Record a pause or a resume of fetching (the paused gauge and the paused time)."""
        if paused == self.paused:
            return
        now = self.clock()
        if paused:
            self.paused_since = now
        else:
            self.paused_s += now - self.paused_since
            self.paused_since = -1.0
        self.paused = paused

    def starving(self) -> None:
        """Record that the partition has nothing pending from now (it waits for records)."""
        if self.starved_since < 0:
            self.starved_since = self.clock()

    def fed(self) -> None:
        """Record that records arrived: a starved interval ends now."""
        since = self.starved_since
        if since >= 0:
            self.starved_s += self.clock() - since
            self.starved_since = -1.0

    def paused_total(self) -> float:
        """Seconds fetching was paused so far, the pause in progress included."""
        since = self.paused_since
        return self.paused_s + (self.clock() - since if since >= 0 else 0.0)

    def starved_total(self) -> float:
        """Seconds the partition had nothing pending so far, the interval in progress
        included."""
        since = self.starved_since
        return self.starved_s + (self.clock() - since if since >= 0 else 0.0)

    def process_total(self) -> FastHistogram:
        """Seconds the processor ran, every task (a new histogram)."""
        return _sum(self.done_at_once, self.process_duration)

    def completion_total(self) -> FastHistogram:
        """Seconds from processing start to completion, every task (a new histogram)."""
        return _sum(self.done_at_once, self.completion_duration)

    @property
    def histograms(self) -> tuple[FastHistogram, ...]:
        """Every histogram of the partition; the committer folds their queued
        observations (`FastHistogram.fold()`) once per commit interval."""
        return tuple(getattr(self, name) for name in _HISTOGRAMS)

    def commit_current(self) -> None:
        """Record that the partition's commit is up to date now."""
        self.commit_current_at = self.clock()

    def commit_age(self) -> float:
        """Seconds since the partition's commit was last up to date: about a commit
        interval while commits succeed; it grows while they fail."""
        return max(0.0, self.clock() - self.commit_current_at)

    @property
    def lag(self) -> int:
        """Records between the high watermark and the committed offset, or -1 if unknown.

        Clamped at 0: the high watermark is refreshed by fetches and may trail a commit.
        """
        high, committed = self.high_watermark, self.committed_offset
        if high < 0 or committed < 0:
            return -1
        return max(0, high - committed)

    def merge_counters(self, other: PartitionStats) -> None:
        """Add another object's counters and histograms to this one's; gauges are untouched.

        Time counters are taken up to now (an interval still open in ``other`` is cut).

        Args:
            other: the stats to fold in, for example a revoked partition's.
        """
        for name in _SUMMED:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.paused_s += other.paused_total()
        self.starved_s += other.starved_total()
        for name in _HISTOGRAMS:
            getattr(self, name).merge(getattr(other, name))

    def snapshot(self) -> PartitionStats:
        """Return a copy that later updates of this object do not change."""
        copy = PartitionStats(self.clock, starved=False)
        copy.merge_counters(self)
        copy.pending, copy.paused = self.pending, self.paused
        copy.pending_bytes = self.pending_bytes
        copy.committed_offset, copy.consumed_offset = self.committed_offset, self.consumed_offset
        copy.high_watermark = self.high_watermark
        copy.commit_current_at = self.commit_current_at
        return copy


def _sum(a: FastHistogram, b: FastHistogram) -> FastHistogram:
    total = FastHistogram(a.bounds)
    total.merge(a)
    total.merge(b)
    return total


class SubscriptionStats:
    """What the runtime counts about one subscription (not per partition).

    Attributes:
        state: the subscription's state (``SubscriptionState`` value), set on transitions.
        states: every state the subscription can be in (one gauge series each).
        fetch_latency: seconds each fetch call took to return records or time out.
        loop_lag: seconds a timer due every 10 ms fired late (how long the event loop was
            held by anything: the runtime, processors, the garbage collector).
        gc_pause: seconds each collection of the cyclic garbage collector took.
        step_duration: CPU seconds of one step of the runtime's own work on the event loop
            (a share of a fetch batch handed to its partitions, their first tasks started).
        longest_step_s: the longest of those steps so far.
        fetch_wait: seconds from a record's timestamp to the fetch that returned it (one
            record sampled per step: the first, the oldest of its step).
        feed_wait: seconds from the fetch to the step that fed the records (one
            observation per step).
        tasks: asyncio tasks alive on the subscription's event loop, counted once per
            commit interval (``-1`` until first counted).
        parked: those of them that are the runtime's idle workers, parked for the next
            task (``-1`` until first counted).
        rebalances: reconciliations the member went through (each change of its
            partitions the group decided: assigned, revoked or lost ones).
        partitions_assigned: partitions the group gave the member, all reconciliations
            together.
        partitions_revoked: partitions the member gave up (drained and committed).
        partitions_lost: partitions the member lost without committing (fenced, or its
            session expired).
        member_epoch: the member epoch (consumer protocol) or generation (classic) of
            the member's last reconciliation (``-1`` while not in the group).
        assigned_partitions: the partitions the member owns now.
        unassigned_since: ``time.monotonic()`` when the member last found itself with no
            partition (``-1.0`` while it owns some).
    """

    __slots__ = (
        "assigned_partitions", "feed_wait", "fetch_latency", "fetch_wait", "gc_pause",
        "longest_step_s", "loop_lag", "member_epoch", "parked", "partitions_assigned",
        "partitions_lost", "partitions_revoked", "rebalances", "state", "states",
        "step_duration", "tasks", "unassigned_since",
    )  # fmt: skip

    def __init__(self, states: tuple[str, ...]) -> None:
        self.states = states
        self.state = states[0] if states else ""
        self.fetch_latency = FastHistogram()
        self.loop_lag = FastHistogram(LOOP_BUCKETS_S)
        self.gc_pause = FastHistogram(LOOP_BUCKETS_S)
        self.step_duration = FastHistogram(LOOP_BUCKETS_S)
        self.longest_step_s = 0.0
        self.fetch_wait = FastHistogram()
        self.feed_wait = FastHistogram()
        self.tasks = -1
        self.parked = -1
        self.rebalances = 0
        self.partitions_assigned = 0
        self.partitions_revoked = 0
        self.partitions_lost = 0
        self.member_epoch = -1
        self.assigned_partitions = 0
        self.unassigned_since = -1.0

    def unassigned_s(self, now: float) -> float:
        """Seconds the member has had no partition, as of ``now`` (``time.monotonic()``);
        0 while it owns some."""
        since = self.unassigned_since
        return 0.0 if since < 0 else max(0.0, now - since)

    def step(self, seconds: float) -> None:
        """Observe one step of the runtime's own work of ``seconds``."""
        self.step_duration.observe(seconds)
        if seconds > self.longest_step_s:
            self.longest_step_s = seconds

    def fold(self) -> None:
        """Sort the histograms' queued observations into buckets (once per commit
        interval, so the queues stay short)."""
        for histogram in (
            self.fetch_latency, self.loop_lag, self.gc_pause, self.step_duration,
            self.fetch_wait, self.feed_wait,
        ):  # fmt: skip
            histogram.fold()
