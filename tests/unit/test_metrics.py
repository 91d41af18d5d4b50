"""Unit tests of the Prometheus metrics: histogram, collector, retirement, HTTP endpoint."""

from __future__ import annotations

import gc
import socket
import sys
import threading
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from decaton_aio.errors import ConfigError
from decaton_aio.metrics import (
    DEFAULT_BUCKETS_S,
    DecatonCollector,
    FastHistogram,
    Metrics,
    PartitionLabels,
    PartitionStats,
)


def samples(metrics: Metrics) -> dict[str, list[Sample]]:
    """Parse ``metrics.render()`` back into family name -> samples."""
    text = metrics.render().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def value(metrics: Metrics, sample_name: str, **labels: str) -> float | None:
    """The value of the one sample with this name and these labels, or None if absent."""
    found = [
        s.value
        for fam in samples(metrics).values()
        for s in fam
        if s.name == sample_name and s.labels == labels
    ]
    assert len(found) <= 1, found
    return found[0] if found else None


P0 = {"subscription": "sub", "topic": "t", "partition": "0"}
P1 = {"subscription": "sub", "topic": "t", "partition": "1"}


# ---------------------------------------------------------------- FastHistogram


def test_histogram_bucket_boundaries_are_inclusive_upper_bounds() -> None:
    """A value equal to a bound counts in that bound's bucket (Prometheus ``le``)."""
    hist = FastHistogram((1.0, 2.0, 5.0))
    for v in (0.5, 1.0, 1.0000001, 2.0, 5.0):
        hist.observe(v)
    assert hist.counts == [2, 2, 1, 0]
    assert hist.cumulative() == [("1.0", 2.0), ("2.0", 4.0), ("5.0", 5.0), ("+Inf", 5.0)]


def test_histogram_folding_from_another_thread_loses_no_observation() -> None:
    """A scrape thread folds while the loop observes: every observation is counted once,
    in its bucket, and observations made between folds wait in the queue."""
    hist = FastHistogram((1.0, 2.0))
    stop = threading.Event()

    def scrape() -> None:
        while not stop.is_set():
            hist.fold()

    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        for i in range(200_000):
            hist.observe((0.5, 1.5, 9.0)[i % 3])
    finally:
        stop.set()
        scraper.join()
    assert hist.counts == [66_667, 66_667, 66_666]
    assert hist.sum == pytest.approx(66_667 * 0.5 + 66_667 * 1.5 + 66_666 * 9.0)


def test_histogram_overflow_sum_and_count() -> None:
    """Values above every bound go to ``+Inf``; sum and count cover every observation."""
    hist = FastHistogram((1.0, 2.0))
    for v in (0.25, 3.0, 100.0, -0.5):
        hist.observe(v)
    assert hist.counts == [2, 0, 2]  # the negative value (clock skew) is in the first bucket
    assert hist.count == 4
    assert hist.sum == pytest.approx(102.75)
    assert hist.cumulative()[-1] == ("+Inf", 4.0)


def test_histogram_default_bounds_cover_sub_millisecond_to_a_minute() -> None:
    """The default buckets span 0.5 ms to 60 s, increasing, with ``+Inf`` added on export."""
    hist = FastHistogram()
    assert hist.bounds == DEFAULT_BUCKETS_S
    assert DEFAULT_BUCKETS_S[0] == 0.0005
    assert DEFAULT_BUCKETS_S[-1] == 60.0
    assert list(DEFAULT_BUCKETS_S) == sorted(set(DEFAULT_BUCKETS_S))
    assert len(hist.cumulative()) == len(DEFAULT_BUCKETS_S) + 1


@pytest.mark.parametrize("bounds", [(), (1.0, 1.0), (2.0, 1.0), (1.0, float("inf"))])
def test_histogram_rejects_bad_bounds(bounds: tuple[float, ...]) -> None:
    """Empty, unordered, repeated or infinite bounds are a configuration error."""
    with pytest.raises(ConfigError, match="strictly increasing"):
        FastHistogram(bounds)


def test_histogram_merge_adds_and_checks_bounds() -> None:
    """Merging adds bucket counts and sums; different bounds cannot be merged."""
    a, b = FastHistogram((1.0,)), FastHistogram((1.0,))
    a.observe(0.5)
    b.observe(2.0)
    b.observe(0.1)
    a.merge(b)
    assert a.counts == [2, 1]
    assert a.sum == pytest.approx(2.6)
    with pytest.raises(ValueError, match="different bucket bounds"):
        a.merge(FastHistogram((2.0,)))


# ---------------------------------------------------------------- collector output


def test_counters_and_histograms_are_exported_per_partition() -> None:
    """Each counter and histogram has one series per partition with the three labels."""
    metrics = Metrics(process_metrics=False)
    s0 = metrics.register_partition("sub", "t", 0)
    s1 = metrics.register_partition("sub", "t", 1)
    s0.processed += 5
    s0.errors += 2
    s0.discarded += 1
    s0.retries += 3
    s0.compactions += 4
    s0.throttled_s += 1.5
    s1.processed += 7
    s0.process_duration.observe(0.003)
    s0.process_duration.observe(120.0)
    s0.completion_duration.observe(0.2)
    s0.delivery_latency.observe(0.0001)

    assert value(metrics, "decaton_tasks_processed_total", **P0) == 5
    assert value(metrics, "decaton_tasks_processed_total", **P1) == 7
    assert value(metrics, "decaton_tasks_error_total", **P0) == 2
    assert value(metrics, "decaton_tasks_discarded_total", **P0) == 1
    assert value(metrics, "decaton_tasks_retried_total", **P0) == 3
    assert value(metrics, "decaton_tasks_compacted_total", **P0) == 4
    assert value(metrics, "decaton_partition_throttled_seconds_total", **P0) == 1.5
    name = "decaton_task_process_duration_seconds"
    assert value(metrics, f"{name}_count", **P0) == 2
    assert value(metrics, f"{name}_sum", **P0) == pytest.approx(120.003)
    assert value(metrics, f"{name}_bucket", **P0, le="0.0025") == 0
    assert value(metrics, f"{name}_bucket", **P0, le="0.005") == 1
    assert value(metrics, f"{name}_bucket", **P0, le="60.0") == 1
    assert value(metrics, f"{name}_bucket", **P0, le="+Inf") == 2
    assert value(metrics, "decaton_task_completion_duration_seconds_count", **P0) == 1
    assert value(metrics, "decaton_task_delivery_latency_seconds_bucket", **P0, le="0.0005") == 1
    assert value(metrics, f"{name}_count", **P1) == 0


def test_every_family_has_type_and_help() -> None:
    """Every decaton_ family (Decaton's set, lag, subscription state, fetch latency) is
    exported with the right type and a help text."""
    metrics = Metrics(process_metrics=False)
    metrics.register_subscription("sub", ("initializing", "running"))
    stats = metrics.register_partition("sub", "t", 0)
    stats.committed_offset, stats.consumed_offset, stats.high_watermark = 1, 2, 3
    text = metrics.render().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    expected = {
        "decaton_tasks_processed": "counter",
        "decaton_tasks_error": "counter",
        "decaton_tasks_discarded": "counter",
        "decaton_tasks_retried": "counter",
        "decaton_tasks_compacted": "counter",
        "decaton_tasks_timeout": "counter",
        "decaton_partition_throttled_seconds": "counter",
        "decaton_partition_paused_seconds": "counter",
        "decaton_partition_queue_starved_seconds": "counter",
        "decaton_retry_queued_tasks": "counter",
        "decaton_retry_queueing_failed": "counter",
        "decaton_dead_letter_queued_tasks": "counter",
        "decaton_dead_letter_queueing_failed": "counter",
        "decaton_shaping_queued_tasks": "counter",
        "decaton_shaping_queueing_failed": "counter",
        "decaton_records_consumed": "counter",
        "decaton_task_process_duration_seconds": "histogram",
        "decaton_task_completion_duration_seconds": "histogram",
        "decaton_task_delivery_latency_seconds": "histogram",
        "decaton_task_scheduling_delay_seconds": "histogram",
        "decaton_task_lane_wait_seconds": "histogram",
        "decaton_task_slot_wait_seconds": "histogram",
        "decaton_partition_tasks_pending": "gauge",
        "decaton_partition_bytes_pending": "gauge",
        "decaton_partition_paused": "gauge",
        "decaton_partition_committed_offset": "gauge",
        "decaton_partition_consumed_offset": "gauge",
        "decaton_consumer_lag": "gauge",
        "decaton_partition_commit_age_seconds": "gauge",
        "decaton_subscription_state": "gauge",
        "decaton_event_loop_tasks": "gauge",
        "decaton_parked_workers": "gauge",
        "decaton_consumer_fetch_latency_seconds": "histogram",
        "decaton_event_loop_lag_seconds": "histogram",
        "decaton_gc_pause_seconds": "histogram",
        "decaton_runtime_step_duration_seconds": "histogram",
        "decaton_task_fetch_wait_seconds": "histogram",
        "decaton_task_feed_wait_seconds": "histogram",
        "decaton_group_rebalances": "counter",
        "decaton_group_partitions_assigned": "counter",
        "decaton_group_partitions_revoked": "counter",
        "decaton_group_partitions_lost": "counter",
        "decaton_group_member_epoch": "gauge",
        "decaton_group_assigned_partitions": "gauge",
        "decaton_group_unassigned_seconds": "gauge",
    }
    assert {name: fam.type for name, fam in families.items()} == expected
    assert all(len(fam.documentation) > 20 for fam in families.values())


def test_gauges_report_pending_paused_and_offsets() -> None:
    """Gauges carry the runtime's current pending count, pause flag and offsets."""
    metrics = Metrics(process_metrics=False)
    stats = metrics.register_partition("sub", "t", 0)
    stats.pending = 42
    stats.pending_bytes = 4096
    stats.paused = True
    stats.committed_offset = 100
    stats.consumed_offset = 150
    assert value(metrics, "decaton_partition_tasks_pending", **P0) == 42
    assert value(metrics, "decaton_partition_bytes_pending", **P0) == 4096
    assert value(metrics, "decaton_partition_paused", **P0) == 1
    assert value(metrics, "decaton_partition_committed_offset", **P0) == 100
    assert value(metrics, "decaton_partition_consumed_offset", **P0) == 150
    stats.paused = False
    assert value(metrics, "decaton_partition_paused", **P0) == 0


def test_lag_is_high_watermark_minus_committed_offset() -> None:
    """Lag = high watermark - committed offset, clamped at 0 when the watermark trails."""
    metrics = Metrics(process_metrics=False)
    stats = metrics.register_partition("sub", "t", 0)
    stats.committed_offset, stats.high_watermark = 100, 130
    assert stats.lag == 30
    assert value(metrics, "decaton_consumer_lag", **P0) == 30
    stats.committed_offset = 140  # committed past a stale high watermark
    assert value(metrics, "decaton_consumer_lag", **P0) == 0


def test_commit_age_counts_from_the_last_up_to_date_commit() -> None:
    """The commit age counts from the assignment until a commit round finds the commit up
    to date, then from there; a copy keeps the moment."""
    clock = FakeClock()
    stats = PartitionStats(clock)
    clock.now += 3
    assert stats.commit_age() == 3
    stats.commit_current()
    clock.now += 0.5
    assert stats.commit_age() == 0.5
    frozen = stats.snapshot()
    clock.now += 10
    assert (frozen.commit_age(), stats.commit_age()) == (10.5, 10.5)
    metrics = Metrics(process_metrics=False)
    live = metrics.register_partition("sub", "t", 0)
    live.commit_current_at -= 7
    age = value(metrics, "decaton_partition_commit_age_seconds", **P0)
    assert age is not None
    assert age >= 7


def test_event_loop_tasks_are_exported_once_counted() -> None:
    """The asyncio task count and the parked workers among them are absent until the
    runtime counted them, then exported per subscription."""
    metrics = Metrics(process_metrics=False)
    sub = metrics.register_subscription("sub", ("running",))
    assert value(metrics, "decaton_event_loop_tasks", subscription="sub") is None
    sub.tasks, sub.parked = 12, 5
    assert value(metrics, "decaton_event_loop_tasks", subscription="sub") == 12
    assert value(metrics, "decaton_parked_workers", subscription="sub") == 5


@pytest.mark.parametrize(("committed", "high"), [(-1, -1), (-1, 10), (10, -1)])
def test_unknown_offsets_and_lag_are_omitted(committed: int, high: int) -> None:
    """An offset of -1 is unknown: its gauge is not exported, nor is the lag it needs."""
    metrics = Metrics(process_metrics=False)
    stats = metrics.register_partition("sub", "t", 0)
    stats.committed_offset, stats.high_watermark = committed, high
    assert stats.lag == -1
    assert value(metrics, "decaton_consumer_lag", **P0) is None
    assert value(metrics, "decaton_partition_consumed_offset", **P0) is None
    expected = None if committed < 0 else committed
    assert value(metrics, "decaton_partition_committed_offset", **P0) == expected
    assert value(metrics, "decaton_partition_tasks_pending", **P0) == 0


# ---------------------------------------------------------------- rebalances


def test_retiring_keeps_counters_and_removes_gauges() -> None:
    """A revoked partition's counters keep their totals; its gauges disappear."""
    metrics = Metrics(process_metrics=False)
    stats = metrics.register_partition("sub", "t", 0)
    stats.processed += 10
    stats.process_duration.observe(0.01)
    stats.pending, stats.committed_offset, stats.high_watermark = 3, 5, 9
    metrics.retire_partition("sub", "t", 0)
    stats.processed += 99  # a straggler after revocation is not counted

    assert value(metrics, "decaton_tasks_processed_total", **P0) == 10
    assert value(metrics, "decaton_task_process_duration_seconds_count", **P0) == 1
    for gauge in ("decaton_partition_tasks_pending", "decaton_consumer_lag"):
        assert value(metrics, gauge, **P0) is None


def test_reassigned_partition_counters_stay_monotonic() -> None:
    """Revoke then reassign: the new stats add to the retired totals, never go backwards."""
    metrics = Metrics(process_metrics=False)
    first = metrics.register_partition("sub", "t", 0)
    first.processed += 10
    first.throttled_s += 0.5
    first.completion_duration.observe(2.0)
    before = value(metrics, "decaton_tasks_processed_total", **P0)
    metrics.retire_partition("sub", "t", 0)
    second = metrics.register_partition("sub", "t", 0)
    assert second is not first
    assert value(metrics, "decaton_tasks_processed_total", **P0) == before == 10
    second.processed += 1
    second.completion_duration.observe(0.1)
    second.pending = 7
    assert value(metrics, "decaton_tasks_processed_total", **P0) == 11
    assert value(metrics, "decaton_partition_throttled_seconds_total", **P0) == 0.5
    assert value(metrics, "decaton_task_completion_duration_seconds_count", **P0) == 2
    assert value(metrics, "decaton_task_completion_duration_seconds_sum", **P0) == 2.1
    assert value(metrics, "decaton_partition_tasks_pending", **P0) == 7


def _processed(collector: DecatonCollector) -> dict[str, float]:
    """The processed counter by partition, as a scrape of ``collector`` shows it."""
    return {
        s.labels["partition"]: s.value
        for family in collector.collect()
        if family.name == "decaton_tasks_processed"
        for s in family.samples
    }


def test_a_revoked_partitions_series_end_after_the_retired_series_time() -> None:
    """Kept for ``retired_series_s`` after the revocation, unless assigned again (then
    from the next revocation); once ended, a later assignment starts again from zero."""
    now = [0.0]
    live: dict[PartitionLabels, PartitionStats] = {}
    collector = DecatonCollector(lambda: live.items(), retired_series_s=600, clock=lambda: now[0])
    a, b = PartitionLabels("s", "t", 0), PartitionLabels("s", "t", 1)
    for labels, count in ((a, 3), (b, 5)):
        live[labels] = PartitionStats()
        live[labels].processed = count
        collector.retire(labels, live.pop(labels))
    now[0] = 300.0
    live[b] = PartitionStats()  # b assigned again
    live[b].processed = 1
    now[0] = 599.0
    assert _processed(collector) == {"0": 3.0, "1": 6.0}
    now[0] = 601.0
    assert _processed(collector) == {"1": 6.0}  # a's series ended; b is live
    collector.retire(b, live.pop(b))
    now[0] = 1200.0
    assert _processed(collector) == {"1": 6.0}
    now[0] = 1202.0
    assert _processed(collector) == {}
    live[a] = PartitionStats()  # a assigned again after its series ended
    live[a].processed = 2
    assert _processed(collector) == {"0": 2.0}


def test_registering_a_live_partition_again_retires_the_old_stats() -> None:
    """A second registration without a revoke keeps the first one's counts."""
    metrics = Metrics(process_metrics=False)
    metrics.register_partition("sub", "t", 0).processed += 4
    metrics.register_partition("sub", "t", 0).processed += 1
    assert value(metrics, "decaton_tasks_processed_total", **P0) == 5


def test_retiring_an_unknown_partition_is_a_no_op() -> None:
    """Retiring a partition that was never registered exports nothing for it."""
    metrics = Metrics(process_metrics=False)
    metrics.retire_partition("sub", "t", 3)
    assert samples(metrics)["decaton_tasks_processed"] == []


def test_collector_reads_any_source_and_retires_per_partition() -> None:
    """The collector works over a plain callable; retirement is keyed by all three labels."""
    live: dict[PartitionLabels, PartitionStats] = {}
    collector = DecatonCollector(lambda: live.items())
    a, b = PartitionLabels("s", "t", 0), PartitionLabels("s", "t", 1)
    live[a], live[b] = PartitionStats(), PartitionStats()
    live[a].errors, live[b].errors = 1, 2
    with collector.lock:
        collector.retire(b, live.pop(b))
    families = {f.name: f for f in collector.collect()}
    errors = {s.labels["partition"]: s.value for s in families["decaton_tasks_error"].samples}
    assert errors == {"0": 1.0, "1": 2.0}
    assert {f.name for f in collector.describe()} == set(families)
    assert all(not f.samples for f in collector.describe())


def test_scrapes_stay_monotonic_while_partitions_churn() -> None:
    """Scrapes from another thread during register/retire cycles never see totals drop."""
    metrics = Metrics(process_metrics=False)
    cycles = 5000
    done = threading.Event()

    def churn() -> None:
        for _ in range(cycles):
            metrics.register_partition("sub", "t", 0).processed += 1
            metrics.retire_partition("sub", "t", 0)
        done.set()

    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often, so a race would show up
    try:
        writer = threading.Thread(target=churn)
        writer.start()
        seen = 0.0
        while not done.is_set():
            # registry.collect() skips text formatting, so scrapes are frequent
            current = sum(
                s.value
                for family in metrics.registry.collect()
                if family.name == "decaton_tasks_processed"
                for s in family.samples
            )
            assert current >= seen
            seen = current
        writer.join()
    finally:
        sys.setswitchinterval(switch_interval)
    assert value(metrics, "decaton_tasks_processed_total", **P0) == cycles


# ---------------------------------------------------------------- isolation and HTTP


def test_two_metrics_objects_do_not_interfere() -> None:
    """Each Metrics owns its registry: same labels, separate counts, no duplicate errors."""
    m1, m2 = Metrics(), Metrics()
    m1.register_partition("sub", "t", 0).processed += 1
    m2.register_partition("sub", "t", 0).processed += 2
    assert value(m1, "decaton_tasks_processed_total", **P0) == 1
    assert value(m2, "decaton_tasks_processed_total", **P0) == 2
    assert "process_cpu_seconds" in samples(m1)  # the process metrics are on by default


def test_http_endpoint_serves_text_format_and_stops_cleanly() -> None:
    """The endpoint on a free loopback port serves the text format; stop() leaves nothing."""
    metrics = Metrics(process_metrics=False)
    metrics.register_partition("sub", "t", 0).processed += 3
    baseline = set(threading.enumerate())
    port = metrics.start_http_server(0)
    assert port > 0
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/plain")
            body = response.read().decode()
        processed = next(
            s
            for family in text_string_to_metric_families(body)
            for s in family.samples
            if s.name == "decaton_tasks_processed_total"
        )
        assert (processed.labels, processed.value) == (P0, 3.0)
    finally:
        metrics.stop()
    metrics.stop()  # idempotent
    # Request handler threads are daemons the server does not join; they end right away.
    deadline = time.monotonic() + 5
    while set(threading.enumerate()) - baseline and time.monotonic() < deadline:
        time.sleep(0.01)
    assert set(threading.enumerate()) - baseline == set()
    gc.collect()  # a leaked socket would raise ResourceWarning here (warnings are errors)
    with pytest.raises(ConnectionRefusedError):  # the listening socket is closed
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_http_server_can_restart_after_stop() -> None:
    """After stop() the same object can serve again; a second start while running fails."""
    metrics = Metrics(process_metrics=False)
    metrics.start_http_server(0)
    try:
        with pytest.raises(RuntimeError, match="already running"):
            metrics.start_http_server(0)
    finally:
        metrics.stop()
    port = metrics.start_http_server(0)
    metrics.stop()
    assert port > 0


def test_http_server_reports_a_busy_port_as_config_error() -> None:
    """Binding a port already in use raises ConfigError naming the address."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"127.0.0.1:{port}"):
            Metrics(process_metrics=False).start_http_server(port)


def test_http_server_rejects_out_of_range_port() -> None:
    """A port outside 0..65535 is rejected before anything is bound."""
    with pytest.raises(ConfigError, match="between 0 and 65535"):
        Metrics(process_metrics=False).start_http_server(70000)


# ------------------------------------------------------- time counters, formats, state


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_paused_and_starved_time_count_open_intervals_up_to_now() -> None:
    """Paused and starved seconds add closed intervals and the one in progress; a pause or
    resume reported twice counts once; a copy freezes the open interval."""
    clock = FakeClock()
    stats = PartitionStats(clock)  # starved (nothing pending) from the start
    clock.now += 2
    assert stats.starved_total() == 2
    stats.fed()
    clock.now += 3
    stats.starving()
    stats.starving()  # already starving: the interval keeps its start
    clock.now += 1
    assert stats.starved_total() == 3
    stats.set_paused(True)
    clock.now += 4
    stats.set_paused(True)
    assert stats.paused_total() == 4
    stats.set_paused(False)
    stats.set_paused(False)
    clock.now += 10
    assert stats.paused_total() == 4
    frozen = stats.snapshot()
    clock.now += 5
    assert (frozen.paused_total(), frozen.starved_total()) == (4, 17)
    assert stats.starved_total() == 22


def test_time_counters_consumed_formats_and_new_counters_are_exported() -> None:
    """The paused and starved seconds, the records consumed by format and the side-topic
    counters reach the text format under their Decaton names."""
    metrics = Metrics(process_metrics=False)
    stats = metrics.register_partition("sub", "t", 0)
    stats.consumed, stats.with_metadata, stats.without_metadata = 10, 7, 3
    stats.retry_queued, stats.retry_failed, stats.timeouts = 2, 1, 4
    stats.paused_s, stats.starved_since = 1.5, -1.0
    stats.starved_s = 2.5
    assert value(metrics, "decaton_records_consumed_total", **P0, format="with_dt_meta") == 7
    assert value(metrics, "decaton_records_consumed_total", **P0, format="without_dt_meta") == 3
    assert value(metrics, "decaton_retry_queued_tasks_total", **P0) == 2
    assert value(metrics, "decaton_retry_queueing_failed_total", **P0) == 1
    assert value(metrics, "decaton_tasks_timeout_total", **P0) == 4
    assert value(metrics, "decaton_partition_paused_seconds_total", **P0) == 1.5
    assert value(metrics, "decaton_partition_queue_starved_seconds_total", **P0) == 2.5
    metrics.retire_partition("sub", "t", 0)  # counters survive the partition
    assert value(metrics, "decaton_partition_paused_seconds_total", **P0) == 1.5
    assert value(metrics, "decaton_records_consumed_total", **P0, format="with_dt_meta") == 7


def test_the_formats_of_records_fetched_and_not_run_yet_never_go_down() -> None:
    """Records are counted by format when they first run, both formats alike: fetched
    plain records waiting to run were counted as with_dt_meta (fetched minus those run
    without it) until they ran, and that counter then went down."""
    metrics = Metrics(process_metrics=False)
    stats = metrics.register_partition("sub", "t", 0)
    stats.consumed = 100  # fetched, none run yet
    assert value(metrics, "decaton_records_consumed_total", **P0, format="with_dt_meta") == 0
    stats.without_metadata = 100  # they run: plain records
    assert value(metrics, "decaton_records_consumed_total", **P0, format="with_dt_meta") == 0
    assert value(metrics, "decaton_records_consumed_total", **P0, format="without_dt_meta") == 100


def test_subscription_state_is_one_series_per_state() -> None:
    """The state gauge is 1 for the current state and 0 for every other one; the fetch
    latency histogram counts fetches per subscription."""
    metrics = Metrics(process_metrics=False)
    sub = metrics.register_subscription("sub", ("initializing", "running", "terminated"))
    sub.state = "running"
    sub.fetch_latency.observe(0.02)
    sub.fetch_latency.observe(0.2)
    states = {
        s.labels["state"]: s.value
        for s in samples(metrics)["decaton_subscription_state"]
        if s.labels["subscription"] == "sub"
    }
    assert states == {"initializing": 0, "running": 1, "terminated": 0}
    assert value(metrics, "decaton_consumer_fetch_latency_seconds_count", subscription="sub") == 2


def test_loop_lag_gc_pauses_and_steps_are_exported_per_subscription() -> None:
    """The loop's health is on the metrics page in fine buckets: a 3 ms lag lands above
    the 2 ms bound and within the 5 ms one, and the longest step is kept."""
    metrics = Metrics(process_metrics=False)
    sub = metrics.register_subscription("sub", ("running",))
    sub.loop_lag.observe(0.0001)
    sub.loop_lag.observe(0.003)
    sub.gc_pause.observe(0.0004)
    sub.step(0.0015)
    sub.step(0.0007)
    sub.fold()

    def bucket(name: str, le: str) -> float:
        return value(metrics, f"{name}_bucket", subscription="sub", le=le)

    assert bucket("decaton_event_loop_lag_seconds", "0.002") == 1
    assert bucket("decaton_event_loop_lag_seconds", "0.005") == 2
    assert value(metrics, "decaton_gc_pause_seconds_count", subscription="sub") == 1
    assert bucket("decaton_runtime_step_duration_seconds", "0.001") == 1
    assert sub.longest_step_s == 0.0015


def test_group_rebalance_series_are_exported_per_subscription() -> None:
    """The reconciliation counters, the member epoch (absent until the member joined),
    the partitions owned, and the seconds without a partition (0 while it owns some)."""
    metrics = Metrics(process_metrics=False)
    sub = metrics.register_subscription("sub", ("running",))
    assert value(metrics, "decaton_group_member_epoch", subscription="sub") is None
    assert value(metrics, "decaton_group_unassigned_seconds", subscription="sub") == 0
    sub.rebalances, sub.partitions_assigned, sub.partitions_revoked = 3, 12, 9
    sub.partitions_lost, sub.member_epoch, sub.assigned_partitions = 2, 7, 3
    assert value(metrics, "decaton_group_rebalances_total", subscription="sub") == 3
    assert value(metrics, "decaton_group_partitions_assigned_total", subscription="sub") == 12
    assert value(metrics, "decaton_group_partitions_revoked_total", subscription="sub") == 9
    assert value(metrics, "decaton_group_partitions_lost_total", subscription="sub") == 2
    assert value(metrics, "decaton_group_member_epoch", subscription="sub") == 7
    assert value(metrics, "decaton_group_assigned_partitions", subscription="sub") == 3
    sub.unassigned_since = time.monotonic() - 5
    unassigned = value(metrics, "decaton_group_unassigned_seconds", subscription="sub")
    assert unassigned is not None
    assert unassigned >= 5
    assert sub.unassigned_s(sub.unassigned_since + 2.5) == 2.5
