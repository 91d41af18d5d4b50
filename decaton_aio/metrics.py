"""Prometheus metrics: Decaton's metric set plus consumer lag, at near-zero hot-path cost.

This module owns the per-partition statistics the runtime updates while it processes tasks,
and their export in the Prometheus text format (an HTTP endpoint and :meth:`Metrics.render`).

Hot path: one process must handle hundreds of thousands of tasks per second on one core,
and a prometheus_client ``Counter.labels(...).inc()`` costs a label lookup, a lock and
several calls per task. So the runtime never touches prometheus_client while processing:
it increments plain attributes of a :class:`PartitionStats` (one per assigned partition)
and observes durations into :class:`FastHistogram`. :class:`DecatonCollector` reads those
objects only when Prometheus scrapes.

Threads: stats are written by the event loop and read by prometheus_client's HTTP thread.
Reading an attribute is atomic under the GIL; a histogram's queued observations are folded
under its lock, so none is lost or counted twice. Registering and retiring a partition
hold the lock a scrape holds while it copies the stats, so a partition is never counted
twice or missed during a rebalance.

Rebalances: counters must not go backwards. A revoked partition's counters and histograms
are folded into a retired accumulator kept per (subscription, topic, partition) and added
to the partition's series from then on; its gauges disappear. The accumulator is per
partition, not per topic: moving counts from a partition's series into a topic-wide series
would make Prometheus' ``rate()`` count them twice (once on each series).
"""

from __future__ import annotations

import functools
import math
import threading
from array import array
from collections.abc import Callable, Iterable, Iterator
from itertools import accumulate, pairwise
from typing import NamedTuple
from wsgiref.simple_server import WSGIServer

import numpy as np
import prometheus_client
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from decaton_aio.errors import ConfigError

__all__ = [
    "DEFAULT_BUCKETS_S",
    "DEFAULT_METRICS_ADDR",
    "DecatonCollector",
    "FastHistogram",
    "Metrics",
    "MetricsEndpoint",
    "PartitionLabels",
    "PartitionStats",
    "StatsSource",
]

DEFAULT_BUCKETS_S: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
"""Histogram upper bounds in seconds: sub-millisecond processors up to minute-long retries."""

DEFAULT_METRICS_ADDR = "127.0.0.1"
"""Loopback by default so metrics are not exposed on every interface by accident; pass
``"0.0.0.0"`` (or ``"::"``) when Prometheus scrapes from another host."""

_LABEL_NAMES = ("subscription", "topic", "partition")


class FastHistogram:
    """A fixed-bucket histogram whose :meth:`observe` is one C-level append.

    Observations are queued in an ``array`` and sorted into buckets in bulk (numpy) by
    :meth:`fold`, which every reader calls first and the runtime calls once per commit
    interval, so the queue stays short (8 bytes per queued observation). Folding may run
    in a scrape thread while the event loop observes: it takes only the observations
    queued when it started and leaves later ones queued.

    Args:
        bounds: the bucket upper bounds in seconds, strictly increasing. A value equal to a
            bound lands in that bound's bucket (Prometheus' ``le``: less than or equal).

    Raises:
        ConfigError: the bounds are empty, not finite or not strictly increasing.

    Attributes:
        bounds: the bucket upper bounds.
        observe: record one value (a finite duration in seconds; a negative one, from
            clock skew, lands in the first bucket). Hot path: no validation.
    """

    __slots__ = ("_counts", "_edges", "_lock", "_queued", "_sum", "bounds", "observe")

    def __init__(self, bounds: tuple[float, ...] = DEFAULT_BUCKETS_S) -> None:
        # The default is known good; skipping its check keeps scrape-time copies cheap.
        if bounds is not DEFAULT_BUCKETS_S and not (
            bounds and all(map(math.isfinite, bounds)) and all(a < b for a, b in pairwise(bounds))
        ):
            raise ConfigError(f"histogram bounds must be finite and strictly increasing: {bounds}")
        self.bounds = bounds
        self._edges = np.asarray(bounds, dtype=np.float64)
        self._counts = np.zeros(len(bounds) + 1, dtype=np.int64)
        self._sum = 0.0
        self._queued = array("d")
        self.observe: Callable[[float], None] = self._queued.append
        self._lock = threading.Lock()

    def fold(self) -> None:
        """Sort the queued observations into their buckets."""
        with self._lock:
            queued = self._queued
            n = len(queued)
            if not n:
                return
            values = np.frombuffer(queued[:n], dtype=np.float64)  # a copy: appends go on
            del queued[:n]
            self._counts += np.bincount(
                np.searchsorted(self._edges, values, side="left"), minlength=len(self._counts)
            )
            self._sum += float(values.sum())

    @property
    def counts(self) -> list[int]:
        """Observations per bucket (not cumulative); the last one is the overflow bucket
        (``+Inf``) for values above every bound."""
        self.fold()
        return [int(n) for n in self._counts]

    @property
    def sum(self) -> float:
        """The sum of every observed value."""
        self.fold()
        return self._sum

    @property
    def count(self) -> int:
        """The number of observations."""
        self.fold()
        return int(self._counts.sum())

    def merge(self, other: FastHistogram) -> None:
        """Add another histogram's observations to this one.

        Args:
            other: a histogram with the same bounds.

        Raises:
            ValueError: the bounds differ.
        """
        if other.bounds != self.bounds:
            raise ValueError("cannot merge histograms with different bucket bounds")
        other.fold()
        with other._lock:
            counts, total = other._counts.copy(), other._sum
        with self._lock:
            self._counts += counts
            self._sum += total

    def cumulative(self) -> list[tuple[str, float]]:
        """Return the Prometheus buckets: ``(le, observations <= le)`` ending with ``+Inf``."""
        counts = self.counts  # one copy, so buckets are consistent with each other
        return list(zip(_le_labels(self.bounds), map(float, accumulate(counts)), strict=True))


@functools.cache
def _le_labels(bounds: tuple[float, ...]) -> tuple[str, ...]:
    # Formatted once per bound set, in the exact form prometheus_client uses for ``le``.
    return (*map(floatToGoString, bounds), "+Inf")


class PartitionStats:
    """What the runtime counts about one assigned partition; it mutates the fields directly.

    Counters only grow: ``processed``, ``errors``, ``discarded``, ``retries``,
    ``compactions`` (ints) and ``throttled_s`` (float seconds). Gauges are set by the
    runtime: ``pending`` (records fetched and not completed), ``paused`` (fetching paused
    for back-pressure), ``committed_offset`` (last committed, i.e. the next offset a
    restart reads), ``consumed_offset`` (one past the last fetched record) and
    ``high_watermark`` (the partition's end offset, for the lag); ``-1`` means unknown and
    the gauge is not exported. Histograms: ``process_duration`` (seconds the processor
    ran), ``completion_duration`` (processing start to completion; longer than the process
    duration with deferred completion) and ``delivery_latency`` (record timestamp to
    processing start).

    Caller: the event loop that owns the partition (writes); the scrape thread (reads).
    """

    __slots__ = (
        "committed_offset", "compactions", "completion_duration", "consumed_offset",
        "delivery_latency", "discarded", "errors", "high_watermark", "paused", "pending",
        "process_duration", "processed", "retries", "throttled_s",
    )  # fmt: skip

    def __init__(self) -> None:
        """Create stats with zero counters, empty histograms and unknown offsets."""
        self.processed = 0
        self.errors = 0
        self.discarded = 0
        self.retries = 0
        self.compactions = 0
        self.throttled_s = 0.0
        self.pending = 0
        self.paused = False
        self.committed_offset = -1
        self.consumed_offset = -1
        self.high_watermark = -1
        self.process_duration = FastHistogram()
        self.completion_duration = FastHistogram()
        self.delivery_latency = FastHistogram()

    def fold(self) -> None:
        """Sort the histograms' queued observations into buckets (see
        :meth:`FastHistogram.fold`); the runtime calls it once per commit interval."""
        self.process_duration.fold()
        self.completion_duration.fold()
        self.delivery_latency.fold()

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

        Args:
            other: the stats to fold in, for example a revoked partition's.
        """
        self.processed += other.processed
        self.errors += other.errors
        self.discarded += other.discarded
        self.retries += other.retries
        self.compactions += other.compactions
        self.throttled_s += other.throttled_s
        self.process_duration.merge(other.process_duration)
        self.completion_duration.merge(other.completion_duration)
        self.delivery_latency.merge(other.delivery_latency)

    def snapshot(self) -> PartitionStats:
        """Return a copy that later updates of this object do not change."""
        copy = PartitionStats()
        copy.merge_counters(self)
        copy.pending, copy.paused = self.pending, self.paused
        copy.committed_offset, copy.consumed_offset = self.committed_offset, self.consumed_offset
        copy.high_watermark = self.high_watermark
        return copy


class PartitionLabels(NamedTuple):
    """The Prometheus labels of one partition's series."""

    subscription: str
    topic: str
    partition: int


StatsSource = Callable[[], Iterable[tuple[PartitionLabels, PartitionStats]]]
"""Returns the live partitions and their stats; called by a scrape under the collector lock."""

# (name, help, attribute of PartitionStats). CounterMetricFamily appends ``_total``.
_COUNTERS = (
    ("decaton_tasks_processed", "Tasks the processor finished, successfully or with an "
     "error (tasks_error_total counts the failed ones).", "processed"),
    ("decaton_tasks_error", "Tasks whose processor raised an error.", "errors"),
    ("decaton_tasks_discarded", "Records completed without running the processor "
     "(ignored keys, undecodable records sent to the dead letter topic).", "discarded"),
    ("decaton_tasks_retried", "Tasks handed to retry (retry topic or in-place retry).",
     "retries"),
    ("decaton_tasks_compacted", "Tasks dropped by task compaction because the compactor "
     "kept another task of the same key.", "compactions"),
    ("decaton_partition_throttled_seconds", "Seconds tasks of the partition waited for "
     "the rate limiter.", "throttled_s"),
)  # fmt: skip
_HISTOGRAMS = (
    ("decaton_task_process_duration_seconds", "Seconds the processor ran per task.",
     "process_duration"),
    ("decaton_task_completion_duration_seconds", "Seconds from processing start to task "
     "completion; longer than the process duration when completion is deferred.",
     "completion_duration"),
    ("decaton_task_delivery_latency_seconds", "Seconds from the record timestamp (the "
     "task's produce time) to processing start.", "delivery_latency"),
)  # fmt: skip
# Gauges of live partitions only; a value below 0 means unknown and the sample is left out.
_GAUGES: tuple[tuple[str, str, Callable[[PartitionStats], int]], ...] = (
    ("decaton_partition_tasks_pending", "Records fetched from the partition and not "
     "completed yet.", lambda s: s.pending),
    ("decaton_partition_paused", "1 while fetching from the partition is paused for "
     "back-pressure, else 0.", lambda s: int(s.paused)),
    ("decaton_partition_committed_offset", "Last offset committed for the partition (the "
     "next offset a restart reads); absent until known.", lambda s: s.committed_offset),
    ("decaton_partition_consumed_offset", "One past the offset of the last record fetched "
     "from the partition; absent until known.", lambda s: s.consumed_offset),
    ("decaton_consumer_lag", "Records between the partition's high watermark and its "
     "committed offset; absent while either is unknown.", lambda s: s.lag),
)  # fmt: skip


class DecatonCollector:
    """A prometheus_client collector that reads :class:`PartitionStats` at scrape time.

    Args:
        source: returns the live partitions; called under :attr:`lock`.

    Attributes:
        lock: held while a scrape copies the stats. Change what the source returns and call
            :meth:`retire` inside one ``with lock`` block, so a scrape sees a partition's
            counts either live or retired, never both or neither. Re-entrant.
    """

    def __init__(self, source: StatsSource) -> None:
        self.lock = threading.RLock()
        self._source = source
        self._retired: dict[PartitionLabels, PartitionStats] = {}

    def retire(self, labels: PartitionLabels, stats: PartitionStats) -> None:
        """Fold a revoked partition's counters and histograms into its retired accumulator.

        The partition's counter and histogram series keep exporting the accumulator (plus
        the live stats if it is assigned again), so they never go backwards; its gauges are
        exported only while it is live. Later updates to ``stats`` are not counted.

        Args:
            labels: the partition's labels.
            stats: its stats, which the source must no longer return.
        """
        with self.lock:
            acc = self._retired.setdefault(labels, PartitionStats())
            acc.merge_counters(stats)

    def describe(self) -> Iterator[Metric]:
        """Yield the metric families without samples, so the registry knows their names."""
        counters, histograms, gauges = self._families()
        yield from (*counters, *histograms, *gauges)

    def collect(self) -> Iterator[Metric]:
        """Yield every metric family with one series per partition (runs at scrape time)."""
        with self.lock:  # copy under the lock, format outside it
            rows = self._snapshot()
        counters, histograms, gauges = self._families()
        for labels, stats, live in rows:
            values = (labels.subscription, labels.topic, str(labels.partition))
            for counter, (_, _, attr) in zip(counters, _COUNTERS, strict=True):
                counter.add_metric(values, float(getattr(stats, attr)))
            for histogram, (_, _, attr) in zip(histograms, _HISTOGRAMS, strict=True):
                hist: FastHistogram = getattr(stats, attr)
                histogram.add_metric(values, hist.cumulative(), hist.sum)
            for gauge, (_, _, read) in zip(gauges, _GAUGES, strict=True):
                value = read(stats)
                if live and value >= 0:
                    gauge.add_metric(values, float(value))
        yield from (*counters, *histograms, *gauges)

    def _snapshot(self) -> list[tuple[PartitionLabels, PartitionStats, bool]]:
        """Copy every partition's numbers (caller holds the lock); True marks live ones."""
        rows = {labels: (stats.snapshot(), True) for labels, stats in self._source()}
        for labels, retired in self._retired.items():
            copy, live = rows.get(labels) or (PartitionStats(), False)
            copy.merge_counters(retired)
            rows[labels] = (copy, live)
        return [(labels, *rows[labels]) for labels in sorted(rows)]

    @staticmethod
    def _families() -> tuple[
        list[CounterMetricFamily], list[HistogramMetricFamily], list[GaugeMetricFamily]
    ]:
        return (
            [CounterMetricFamily(n, doc, labels=_LABEL_NAMES) for n, doc, _ in _COUNTERS],
            [HistogramMetricFamily(n, doc, labels=_LABEL_NAMES) for n, doc, _ in _HISTOGRAMS],
            [GaugeMetricFamily(n, doc, labels=_LABEL_NAMES) for n, doc, _ in _GAUGES],
        )


class MetricsEndpoint:
    """A registry and the HTTP endpoint that exports it from a daemon thread.

    Args:
        registry: what :meth:`render` and the endpoint export.

    Attributes:
        registry: the registry.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def render(self) -> bytes:
        """Return every metric in the Prometheus text format (for tests and the CLI)."""
        return generate_latest(self.registry)

    def start_http_server(self, port: int, addr: str = DEFAULT_METRICS_ADDR) -> int:
        """Serve the metrics over HTTP (any path) from a daemon thread until :meth:`stop`.

        Args:
            port: the TCP port; 0 picks a free one.
            addr: the address to bind; loopback by default (see
                :data:`DEFAULT_METRICS_ADDR`).

        Returns:
            The port actually bound.

        Raises:
            ConfigError: the port is out of range or the address cannot be bound.
            RuntimeError: the server is already running.
        """
        if self._server is not None:
            raise RuntimeError("the metrics HTTP server is already running; call stop() first")
        if not 0 <= port <= 65535:
            raise ConfigError(f"metrics port must be between 0 and 65535, got {port}")
        try:
            server, thread = prometheus_client.start_http_server(
                port, addr=addr, registry=self.registry
            )
        except OSError as exc:
            raise ConfigError(
                f"cannot serve metrics on {addr}:{port}: {exc}; choose another port or address"
            ) from exc
        self._server, self._thread = server, thread
        return int(server.server_port)

    def stop(self) -> None:
        """Stop the HTTP server, close its socket and join its thread; idempotent."""
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is not None:
            server.shutdown()  # returns once serve_forever has left its loop
            server.server_close()
        if thread is not None:
            thread.join()


class Metrics(MetricsEndpoint):
    """The metrics of one runtime: partition stats, a private registry and an endpoint.

    Each object owns its own ``CollectorRegistry`` (not prometheus_client's global one), so
    several runtimes and tests in one process do not clash.

    Args:
        process_metrics: also export prometheus_client's process, platform and garbage
            collector metrics (CPU, memory, file descriptors, Python version).

    Attributes:
        registry: the registry the endpoint and :meth:`render` export.
    """

    def __init__(self, *, process_metrics: bool = True) -> None:
        super().__init__(CollectorRegistry())
        self._live: dict[PartitionLabels, PartitionStats] = {}
        self._collector = DecatonCollector(lambda: list(self._live.items()))
        self.registry.register(self._collector)
        if process_metrics:
            prometheus_client.ProcessCollector(registry=self.registry)
            prometheus_client.PlatformCollector(registry=self.registry)
            prometheus_client.GCCollector(registry=self.registry)

    def register_partition(self, subscription: str, topic: str, partition: int) -> PartitionStats:
        """Start exporting a newly assigned partition.

        If the partition is still registered (its revocation was never reported), its old
        stats are retired first, so counters stay monotonic either way.

        Args:
            subscription: the subscription (consumer group) id.
            topic: the topic name.
            partition: the partition number.

        Returns:
            The stats object the runtime updates for this partition.

        Caller: the event loop, on assignment. Briefly waits for a scrape in progress.
        """
        labels = PartitionLabels(subscription, topic, partition)
        stats = PartitionStats()
        with self._collector.lock:
            old = self._live.pop(labels, None)
            if old is not None:
                self._collector.retire(labels, old)
            self._live[labels] = stats
        return stats

    def retire_partition(self, subscription: str, topic: str, partition: int) -> None:
        """Stop exporting a revoked partition's gauges; its counters keep their totals.

        A partition that is not registered is ignored.

        Args:
            subscription: the subscription (consumer group) id.
            topic: the topic name.
            partition: the partition number.

        Caller: the event loop, on revocation, after the partition's final commit.
        """
        labels = PartitionLabels(subscription, topic, partition)
        with self._collector.lock:
            stats = self._live.pop(labels, None)
            if stats is not None:
                self._collector.retire(labels, stats)
