"""Prometheus metrics: Decaton's metric set plus consumer lag, at near-zero hot-path cost.

This module owns the per-partition statistics the runtime updates while it processes tasks,
and their export (an HTTP endpoint and `Metrics.render()`; the page itself is written by
`decaton_aio._exposition`).

Hot path: one process must handle hundreds of thousands of tasks per second on one core,
and a prometheus_client ``Counter.labels(...).inc()`` costs a label lookup, a lock and
several calls per task. So the runtime never touches prometheus_client while processing:
it increments plain attributes of a `PartitionStats` (one per assigned partition)
and observes durations into `FastHistogram`. `DecatonCollector` reads those
objects only when Prometheus scrapes.

Threads: stats are written by the event loop and read by the endpoint's HTTP threads.
Reading an attribute is atomic under the GIL; a histogram's queued observations are folded
under its lock, so none is lost or counted twice. Registering and retiring a partition
hold the lock a scrape holds while it copies the stats, so a partition is never counted
twice or missed during a rebalance.

Rebalances: counters must not go backwards. A revoked partition's counters and histograms
are folded into a retired accumulator kept per (subscription, topic, partition) and added
to the partition's series from then on; its gauges disappear. The accumulator is per
partition, not per topic: moving counts from a partition's series into a topic-wide series
would make Prometheus' ``rate()`` count them twice (once on each series). A partition not
assigned again within `RETIRED_SERIES_S` of its revocation has its series end there (the
page no longer lists them): a process that held many partitions over its life exports
those it holds and those it gave up lately, not every one it ever held. Should it be
assigned that partition later, its series start again from zero, which ``rate()`` takes
as a counter reset, as it takes a restart.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

import prometheus_client
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import InfoMetricFamily, Metric
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from decaton_aio._endpoint import DEFAULT_METRICS_ADDR, Endpoint, Probes
from decaton_aio._exposition import Family, label_text
from decaton_aio._histogram import DEFAULT_BUCKETS_S, FastHistogram
from decaton_aio._stats import PartitionStats, SubscriptionStats

__all__ = [
    "DEFAULT_BUCKETS_S",
    "DEFAULT_METRICS_ADDR",
    "RETIRED_SERIES_S",
    "DecatonCollector",
    "FastHistogram",
    "Metrics",
    "MetricsEndpoint",
    "PartitionLabels",
    "PartitionStats",
    "Probes",
    "StatsSource",
    "SubscriptionStats",
]


_LABEL_NAMES = ("subscription", "topic", "partition")

#: How long a revoked partition's counter and histogram series are still exported: ten
#: minutes, many scrapes at any usual interval, so its last counts are stored.
RETIRED_SERIES_S = 600.0


class PartitionLabels(NamedTuple):
    """The Prometheus labels of one partition's series."""

    subscription: str
    topic: str
    partition: int


StatsSource = Callable[[], Iterable[tuple[PartitionLabels, PartitionStats]]]
"""Returns the live partitions and their stats; called by a scrape under the collector lock."""

# (name, help, read). CounterMetricFamily appends ``_total``.
_COUNTERS: tuple[tuple[str, str, Callable[[PartitionStats], float]], ...] = (
    ("decaton_tasks_processed", "Tasks the processor finished, successfully or with an "
     "error (tasks_error_total counts the failed ones).", lambda s: s.processed),
    ("decaton_tasks_error", "Tasks whose processor raised an error.", lambda s: s.errors),
    ("decaton_tasks_discarded", "Records completed without running the processor "
     "(ignored keys, undecodable records sent to the dead letter topic).",
     lambda s: s.discarded),
    ("decaton_tasks_retried", "Tasks handed to retry (retry topic or in-place retry).",
     lambda s: s.retries),
    ("decaton_tasks_compacted", "Tasks dropped by task compaction because the compactor "
     "kept another task of the same key.", lambda s: s.compactions),
    ("decaton_tasks_timeout", "Deferred completions still open after "
     "decaton.deferred.complete.timeout.ms (then given up, extended or retried as the "
     "application's policy says).", lambda s: s.timeouts),
    ("decaton_partition_throttled_seconds", "Seconds tasks of the partition waited for "
     "the rate limiter.", lambda s: s.throttled_s),
    ("decaton_partition_paused_seconds", "Seconds fetching from the partition was paused "
     "(pending records at decaton.max.pending.records, or a rate of 0).",
     lambda s: s.paused_total()),
    ("decaton_partition_queue_starved_seconds", "Seconds the partition had no pending "
     "record: it waited for records to arrive.", lambda s: s.starved_total()),
    ("decaton_retry_queued_tasks", "Tasks sent to the retry topic (durable).",
     lambda s: s.retry_queued),
    ("decaton_retry_queueing_failed", "Sends to the retry topic that failed (each is "
     "tried again; the task stays pending meanwhile).", lambda s: s.retry_failed),
    ("decaton_dead_letter_queued_tasks", "Tasks sent to the dead letter topic (durable).",
     lambda s: s.dead_letter_queued),
    ("decaton_dead_letter_queueing_failed", "Sends to the dead letter topic that failed "
     "(each is tried again).", lambda s: s.dead_letter_failed),
    ("decaton_shaping_queued_tasks", "Tasks of keys over their quota sent to the shaping "
     "topic (durable).", lambda s: s.shaping_queued),
    ("decaton_shaping_queueing_failed", "Sends to the shaping topic that failed (each is "
     "tried again).", lambda s: s.shaping_failed),
)  # fmt: skip
# Records run, by format: one series per value of the ``format`` label.
_CONSUMED_DOC = (
    "decaton_records_consumed",
    "Records of the partition run as tasks, by format: with_dt_meta (a Decaton task with "
    "its metadata header) or without_dt_meta (a plain record); each counted when it first "
    "runs.",
)
_HISTOGRAMS: tuple[tuple[str, str, Callable[[PartitionStats], FastHistogram]], ...] = (
    ("decaton_task_process_duration_seconds", "Seconds the processor ran per task.",
     lambda s: s.process_total()),
    ("decaton_task_completion_duration_seconds", "Seconds from processing start to task "
     "completion, for every task; longer than the process duration when completion is "
     "deferred or a retry or dead letter record is being sent.",
     lambda s: s.completion_total()),
    ("decaton_task_delivery_latency_seconds", "Seconds from the record timestamp (the "
     "task's produce time) to processing start.", lambda s: s.delivery_latency),
    ("decaton_task_scheduling_delay_seconds", "Seconds a scheduled task (dt_meta "
     "scheduled time) waited for its time once fetched.", lambda s: s.scheduling_delay),
    ("decaton_task_lane_wait_seconds", "Seconds a record waited behind an earlier record "
     "of its key (per-key order); records that did not wait are not counted; sampled: one "
     "offset in 16.",
     lambda s: s.lane_wait),
    ("decaton_task_slot_wait_seconds", "Seconds a ready record waited for a concurrency "
     "slot (decaton.partition.concurrency) or a rate token; records started as soon as "
     "they were fed are not counted; sampled: one offset in 16.", lambda s: s.slot_wait),
)  # fmt: skip
# Gauges of live partitions only; a value below 0 means unknown and the sample is left out.
_GAUGES: tuple[tuple[str, str, Callable[[PartitionStats], float]], ...] = (
    ("decaton_partition_tasks_pending", "Records fetched from the partition and not "
     "completed yet.", lambda s: s.pending),
    ("decaton_partition_bytes_pending", "Bytes of the values of the records fetched from "
     "the partition and not completed yet (decaton.max.pending.bytes pauses at its limit).",
     lambda s: s.pending_bytes),
    ("decaton_partition_paused", "1 while fetching from the partition is paused for "
     "back-pressure, else 0.", lambda s: int(s.paused)),
    ("decaton_partition_committed_offset", "Last offset committed for the partition (the "
     "next offset a restart reads); absent until known.", lambda s: s.committed_offset),
    ("decaton_partition_consumed_offset", "One past the offset of the last record fetched "
     "from the partition; absent until known.", lambda s: s.consumed_offset),
    ("decaton_consumer_lag", "Records between the partition's high watermark and its "
     "committed offset; absent while either is unknown.", lambda s: s.lag),
    ("decaton_partition_commit_age_seconds", "Seconds since the partition's commit was last "
     "up to date (committed, or nothing new to commit): about decaton.commit.interval.ms "
     "while commits succeed; it grows while they fail.", lambda s: s.commit_age()),
)  # fmt: skip
_STATE_DOC = (
    "decaton_subscription_state",
    "1 for the state the subscription is in (label state), 0 for the others.",
)
# Per subscription: (name, help, read); a value below 0 means unknown, left out.
_SUBSCRIPTION_GAUGES: tuple[tuple[str, str, Callable[[SubscriptionStats], float]], ...] = (
    ("decaton_event_loop_tasks", "Asyncio tasks alive on the subscription's event loop "
     "(the runtime's and the processors'), counted once per commit interval.",
     lambda s: s.tasks),
    ("decaton_parked_workers", "Of those tasks, the runtime's idle workers parked for the "
     "next task (up to 1,024; as many as the highest concurrency seen needed).",
     lambda s: s.parked),
    ("decaton_group_member_epoch", "The member epoch (consumer group protocol) or "
     "generation (classic) of the member's last reconciliation; absent while not in the "
     "group.", lambda s: s.member_epoch),
    ("decaton_group_assigned_partitions", "Partitions the member owns now.",
     lambda s: s.assigned_partitions),
    ("decaton_group_unassigned_seconds", "Seconds the member has owned no partition (its "
     "current stretch; 0 while it owns some): a member waiting for the group, or one too "
     "many for the partitions.", lambda s: s.unassigned_s(time.monotonic())),
)  # fmt: skip

# Per subscription: (name, help, read). CounterMetricFamily appends ``_total``.
_SUBSCRIPTION_COUNTERS: tuple[tuple[str, str, Callable[[SubscriptionStats], float]], ...] = (
    ("decaton_group_rebalances", "Reconciliations of the member's partitions: each change "
     "of what it owns that the group decided (partitions assigned, revoked or lost).",
     lambda s: s.rebalances),
    ("decaton_group_partitions_assigned", "Partitions the group gave the member.",
     lambda s: s.partitions_assigned),
    ("decaton_group_partitions_revoked", "Partitions the member gave up: drained (up to "
     "decaton.group.rebalance.timeout.ms) and committed.", lambda s: s.partitions_revoked),
    ("decaton_group_partitions_lost", "Partitions the member lost without committing "
     "(fenced, or its session expired): their work since the last commit runs again "
     "elsewhere.", lambda s: s.partitions_lost),
)  # fmt: skip
_SubscriptionHistogram = tuple[str, str, Callable[[SubscriptionStats], FastHistogram]]
_SUBSCRIPTION_HISTOGRAMS: tuple[_SubscriptionHistogram, ...] = (
    ("decaton_consumer_fetch_latency_seconds", "Seconds each fetch call took to return "
     "records, or to time out (100 ms) when none arrived; rebalance callbacks run inside it.",
     lambda s: s.fetch_latency),
    ("decaton_event_loop_lag_seconds", "Seconds a timer due every 10 ms fired late: how "
     "long the event loop was held (by the runtime, processors or the garbage collector). "
     "High lag with short process durations means an overloaded loop, not a slow processor.",
     lambda s: s.loop_lag),
    ("decaton_gc_pause_seconds", "Seconds each collection of Python's cyclic garbage "
     "collector held the process.", lambda s: s.gc_pause),
    ("decaton_runtime_step_duration_seconds", "CPU seconds of one step of the runtime's own "
     "work on the event loop (a share of a fetch batch handed to its partitions).",
     lambda s: s.step_duration),
    ("decaton_task_fetch_wait_seconds", "Seconds from a record's timestamp to the fetch that "
     "returned it (the first record of each feed step, sampled).", lambda s: s.fetch_wait),
    ("decaton_task_feed_wait_seconds", "Seconds fetched records waited for the feed step "
     "that handed them to their partition.", lambda s: s.feed_wait),
)  # fmt: skip


class DecatonCollector:
    """A prometheus_client collector that reads `PartitionStats` at scrape time.

    Args:
        source: returns the live partitions; called under `lock`.
        subscriptions: returns the subscriptions' stats by subscription id.
        retired_series_s: how long a revoked partition's series are exported after its
            revocation, unless it is assigned again.
        clock: the time in seconds (monotonic); a test's own clock.

    Attributes:
        lock: held while a scrape copies the stats. Change what the source returns and call
            `retire()` inside one ``with lock`` block, so a scrape sees a partition's
            counts either live or retired, never both or neither. Re-entrant.
    """

    def __init__(
        self,
        source: StatsSource,
        subscriptions: Callable[[], Iterable[tuple[str, SubscriptionStats]]] = tuple,
        *,
        retired_series_s: float = RETIRED_SERIES_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.lock = threading.RLock()
        self._source = source
        self._subscriptions = subscriptions
        self._retired_series_s = retired_series_s
        self._clock = clock
        # A revoked partition's accumulated counts, and when it was last revoked.
        self._retired: dict[PartitionLabels, tuple[PartitionStats, float]] = {}
        self._label_texts: dict[PartitionLabels, str] = {}

    def retire(self, labels: PartitionLabels, stats: PartitionStats) -> None:
        """Fold a revoked partition's counters and histograms into its retired accumulator.

        The partition's counter and histogram series keep exporting the accumulator (plus
        the live stats if it is assigned again), so they never go backwards, for
        ``retired_series_s`` from now unless it is assigned again (then from its next
        revocation); its gauges are exported only while it is live. Later updates to
        ``stats`` are not counted.

        Args:
            labels: the partition's labels.
            stats: its stats, which the source must no longer return.
        """
        with self.lock:
            acc, _ = self._retired.get(labels) or (PartitionStats(starved=False), 0.0)
            acc.merge_counters(stats)
            self._retired[labels] = (acc, self._clock())

    def describe(self) -> Iterator[Metric]:
        """Yield the metric families without samples, so the registry knows their names."""
        for family in _FAMILIES:
            yield family.metric()

    def collect(self) -> Iterator[Metric]:
        """Yield every metric family with one series per partition, read back from the page
        `write()` makes: for a registry exported by other means than `Metrics`'s endpoint
        (which writes the page directly, much faster)."""
        out: list[str] = []
        self.write(out, openmetrics=False)
        yield from text_string_to_metric_families("".join(out))

    def write(self, out: list[str], openmetrics: bool) -> None:
        """Append every family's lines, in the text format or OpenMetrics (runs at scrape
        time; the stats are copied under the lock and written outside it)."""
        with self.lock:
            rows = self._snapshot()
            subscriptions = sorted(self._subscriptions())
        texts = [self._label_text(labels) for labels, _, _ in rows]
        for family, read in _PARTITION_COUNTERS:
            family.header(out, openmetrics)
            for text, (_, stats, _) in zip(texts, rows, strict=True):
                family.sample(out, text, read(stats))
        _CONSUMED.header(out, openmetrics)
        for text, (_, stats, _) in zip(texts, rows, strict=True):
            _CONSUMED.sample(out, f'format="with_dt_meta",{text}', stats.with_metadata)
            _CONSUMED.sample(out, f'format="without_dt_meta",{text}', stats.without_metadata)
        for family, read_hist in _PARTITION_HISTOGRAMS:
            family.header(out, openmetrics)
            for text, (_, stats, _) in zip(texts, rows, strict=True):
                hist = read_hist(stats)
                family.histogram(out, text, hist.cumulative(), hist.sum)
        for family, read in _PARTITION_GAUGES:
            family.header(out, openmetrics)
            for text, (_, stats, live) in zip(texts, rows, strict=True):
                value = read(stats)
                if live and value >= 0:
                    family.sample(out, text, value)
        _STATE.header(out, openmetrics)
        for subscription, sub in subscriptions:
            now = sub.state
            for name in sub.states:
                text = label_text((("state", name), ("subscription", subscription)))
                _STATE.sample(out, text, 1.0 if name == now else 0.0)
        by_subscription = [
            (label_text((("subscription", subscription),)), sub)
            for subscription, sub in subscriptions
        ]
        for family, read_sub_hist in _SUBSCRIPTION_HISTOGRAM_FAMILIES:
            family.header(out, openmetrics)
            for text, sub in by_subscription:
                hist = read_sub_hist(sub)
                family.histogram(out, text, hist.cumulative(), hist.sum)
        for family, read_sub in _SUBSCRIPTION_GAUGE_FAMILIES:
            family.header(out, openmetrics)
            for text, sub in by_subscription:
                value = read_sub(sub)
                if value >= 0:
                    family.sample(out, text, value)
        for family, read_sub in _SUBSCRIPTION_COUNTER_FAMILIES:
            family.header(out, openmetrics)
            for text, sub in by_subscription:
                family.sample(out, text, read_sub(sub))

    def _label_text(self, labels: PartitionLabels) -> str:
        text = self._label_texts.get(labels)
        if text is None:
            values = (labels.subscription, labels.topic, str(labels.partition))
            text = self._label_texts[labels] = label_text(zip(_LABEL_NAMES, values, strict=True))
        return text

    def _snapshot(self) -> list[tuple[PartitionLabels, PartitionStats, bool]]:
        """Copy every partition's numbers (caller holds the lock); True marks live ones."""
        rows = {labels: (stats.snapshot(), True) for labels, stats in self._source()}
        expired_before = self._clock() - self._retired_series_s
        for labels, (retired, revoked_at) in list(self._retired.items()):
            if labels not in rows and revoked_at < expired_before:
                del self._retired[labels]  # its series end
                self._label_texts.pop(labels, None)
                continue
            copy, live = rows.get(labels) or (PartitionStats(starved=False), False)
            copy.merge_counters(retired)
            rows[labels] = (copy, live)
        return [(labels, *rows[labels]) for labels in sorted(rows)]


_BY_SUBSCRIPTION = ("subscription",)
_PARTITION_COUNTERS = tuple(
    (Family(n, doc, "counter", _LABEL_NAMES), read) for n, doc, read in _COUNTERS
)
_CONSUMED = Family(*_CONSUMED_DOC, "counter", (*_LABEL_NAMES, "format"))
_PARTITION_HISTOGRAMS = tuple(
    (Family(n, doc, "histogram", _LABEL_NAMES), read) for n, doc, read in _HISTOGRAMS
)
_PARTITION_GAUGES = tuple((Family(n, doc, "gauge", _LABEL_NAMES), read) for n, doc, read in _GAUGES)
_STATE = Family(*_STATE_DOC, "gauge", ("subscription", "state"))
_SUBSCRIPTION_HISTOGRAM_FAMILIES = tuple(
    (Family(n, doc, "histogram", _BY_SUBSCRIPTION), read)
    for n, doc, read in _SUBSCRIPTION_HISTOGRAMS
)
_SUBSCRIPTION_GAUGE_FAMILIES = tuple(
    (Family(n, doc, "gauge", _BY_SUBSCRIPTION), read) for n, doc, read in _SUBSCRIPTION_GAUGES
)
_SUBSCRIPTION_COUNTER_FAMILIES = tuple(
    (Family(n, doc, "counter", _BY_SUBSCRIPTION), read) for n, doc, read in _SUBSCRIPTION_COUNTERS
)
_FAMILIES: tuple[Family, ...] = (
    *(f for f, _ in _PARTITION_COUNTERS),
    _CONSUMED,
    *(f for f, _ in _PARTITION_HISTOGRAMS),
    *(f for f, _ in _PARTITION_GAUGES),
    _STATE,
    *(f for f, _ in _SUBSCRIPTION_HISTOGRAM_FAMILIES),
    *(f for f, _ in _SUBSCRIPTION_GAUGE_FAMILIES),
    *(f for f, _ in _SUBSCRIPTION_COUNTER_FAMILIES),
)


def encode(collector: Collector, openmetrics: bool) -> str:
    """What prometheus_client writes for ``collector``: the text format, or OpenMetrics
    (ending with ``# EOF``)."""
    write = openmetrics_latest if openmetrics else generate_latest
    page: bytes = write(collector)
    return page.decode()


class MetricsEndpoint:
    """A registry and the HTTP endpoint that exports it from a daemon thread.

    Args:
        registry: what `page()`, `render()` and the endpoint export.

    Attributes:
        registry: the registry.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._endpoint: Endpoint | None = None

    def page(self, openmetrics: bool = False) -> str:
        """Every metric as the endpoint serves it: in the Prometheus text format, or in
        OpenMetrics (ending with ``# EOF``). Called from the endpoint's threads."""
        return encode(self.registry, openmetrics)

    def render(self) -> bytes:
        """Return every metric in the Prometheus text format (for tests and the CLI)."""
        return self.page().encode()

    def start_http_server(
        self, port: int, addr: str = DEFAULT_METRICS_ADDR, *, probes: Probes | None = None
    ) -> int:
        """Serve the metrics over HTTP from a daemon thread until `stop()`.

        ``/healthz`` and ``/readyz`` answer the ``probes`` (JSON, 200 or 503; 404 without
        probes); every other path serves the metrics.

        Args:
            port: the TCP port; 0 picks a free one.
            addr: the address to bind; loopback by default (see
                `DEFAULT_METRICS_ADDR`).
            probes: the liveness and readiness checks (the runtime's health check).

        Returns:
            The port actually bound.

        Raises:
            ConfigError: the port is out of range or the address cannot be bound.
            RuntimeError: the server is already running.
        """
        if self._endpoint is not None:
            raise RuntimeError("the metrics HTTP server is already running; call stop() first")
        self._endpoint = Endpoint.start(self.page, port, addr, probes)
        return self._endpoint.port

    def stop(self) -> None:
        """Stop the HTTP server, close its socket and join its thread; idempotent."""
        endpoint, self._endpoint = self._endpoint, None
        if endpoint is not None:
            endpoint.stop()


class Metrics(MetricsEndpoint):
    """The metrics of one runtime: partition stats, a private registry and an endpoint.

    Each object owns its own ``CollectorRegistry`` (not prometheus_client's global one), so
    several runtimes and tests in one process do not clash.

    Args:
        process_metrics: also export prometheus_client's process, platform and garbage
            collector metrics (CPU, memory, file descriptors, Python version).

    Attributes:
        registry: the registry the endpoint and `render()` export: the runtime's collector
            first, then every collector registered in it (the process's metrics, a state
            store's, an application's own). The endpoint writes the runtime's families
            itself, not through prometheus_client (`decaton_aio._exposition`); to serve
            them from a server of your own, serve `page()`: prometheus_client's writers
            given this registry read the runtime's families back from that page first,
            about 30 times slower (300 ms against 10 ms for 96 partitions).
    """

    def __init__(self, *, process_metrics: bool = True) -> None:
        self._live: dict[PartitionLabels, PartitionStats] = {}
        self._subscriptions: dict[str, SubscriptionStats] = {}
        self._collector = DecatonCollector(
            lambda: list(self._live.items()), lambda: list(self._subscriptions.items())
        )
        self._registry = _Registry(self._collector)
        super().__init__(self._registry)
        if process_metrics:
            prometheus_client.ProcessCollector(registry=self.registry)
            prometheus_client.PlatformCollector(registry=self.registry)
            prometheus_client.GCCollector(registry=self.registry)

    def page(self, openmetrics: bool = False) -> str:
        out: list[str] = []
        self._collector.write(out, openmetrics)
        out.append(encode(self._registry.others, openmetrics))
        return "".join(out)

    def register_subscription(
        self, subscription: str, states: tuple[str, ...]
    ) -> SubscriptionStats:
        """Start exporting a subscription's state and fetch latency.

        Args:
            subscription: the subscription id.
            states: the names of its states, the initial one first.

        Returns:
            The stats object the runtime updates (a second registration of the same id
            replaces the first).
        """
        stats = SubscriptionStats(states)
        with self._collector.lock:
            self._subscriptions[subscription] = stats
        return stats

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
        """Stop exporting a revoked partition's gauges; its counters keep their totals for
        `RETIRED_SERIES_S` (see `DecatonCollector.retire()`).

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


class _Registry(CollectorRegistry):
    """The registry of a `Metrics`: the runtime's collector, registered first, and every
    collector registered after it (their names checked against the runtime's as any
    registry checks them). `Metrics.page()` writes the runtime's families itself and has
    prometheus_client write the rest (`others`).

    Args:
        runtime: the runtime's collector.

    Attributes:
        others: the collectors registered after the runtime's, as one collector.
    """

    def __init__(self, runtime: DecatonCollector) -> None:
        super().__init__()
        super().register(runtime)
        self._others: list[Collector] = []
        self.others = _Others(self, self._others)

    def register(self, collector: Collector) -> None:
        super().register(collector)
        self._others.append(collector)

    def unregister(self, collector: Collector) -> None:
        super().unregister(collector)
        self._others.remove(collector)


class _Others(Collector):
    def __init__(self, registry: CollectorRegistry, collectors: list[Collector]) -> None:
        self._registry = registry
        self._collectors = collectors

    def collect(self) -> Iterator[Metric]:
        info = self._registry.get_target_info()
        if info:
            yield InfoMetricFamily("target", "Target metadata", value=info)
        for collector in list(self._collectors):
            yield from collector.collect()
