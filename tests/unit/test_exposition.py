"""The metrics page as the runtime writes it: what prometheus_client writes for the same
families, in both formats; workers' pages merged and filtered as text; the endpoint's
format, compression and ``name[]`` filter."""

from __future__ import annotations

import gzip
import urllib.request
from collections.abc import Iterable

import pytest
from prometheus_client import Counter, Gauge, generate_latest
from prometheus_client.core import Metric
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from decaton_aio._exposition import Family, keep_names, merge_pages, negotiate
from decaton_aio.metrics import Metrics


class _Families(Collector):
    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterable[Metric]:
        return self._families


def _busy_metrics() -> Metrics:
    """Live and retired partitions, unknown gauges, large and fractional values, and a
    subscription id that needs escaping."""
    metrics = Metrics(process_metrics=False)
    sub = 'orders "eu"\\west\nline\r\u2028end'
    metrics.register_subscription(sub, ("starting", "running")).fetch_latency.observe(0.02)
    for partition in range(3):
        stats = metrics.register_partition(sub, "tasks.v1", partition)
        stats.processed = 12_345_678 * (partition + 1)
        stats.errors = partition
        stats.with_metadata = 3
        stats.pending = partition
        stats.committed_offset = -1 if partition == 0 else 41
        for seconds in (0.0004, 0.003, 0.7, 42.0):
            stats.delivery_latency.observe(seconds * (partition + 1))
    metrics.retire_partition(sub, "tasks.v1", 2)
    return metrics


def test_the_text_page_is_what_prometheus_client_writes_for_its_families() -> None:
    page = _busy_metrics().page(openmetrics=False)
    families = list(text_string_to_metric_families(page))
    assert generate_latest(_Families(families)).decode() == page
    names = {family.name for family in families}
    assert {"decaton_tasks_processed", "decaton_task_delivery_latency_seconds"} <= names


def test_the_openmetrics_page_is_what_prometheus_client_writes_for_its_families() -> None:
    page = _busy_metrics().page(openmetrics=True)
    families = list(openmetrics_families(page))
    assert openmetrics_latest(_Families(families)).decode() == page
    assert page.endswith("\n# EOF\n")
    assert page.count("# EOF") == 1


def _samples(page: str) -> list[tuple[str, str, tuple[tuple[str, str], ...], float]]:
    return [
        (family.name, s.name, tuple(sorted(s.labels.items())), s.value)
        for family in text_string_to_metric_families(page)
        for s in family.samples
    ]


def test_merged_pages_hold_every_sample_of_every_page_with_its_worker_label() -> None:
    one = _busy_metrics().page()
    two = Metrics(process_metrics=False)
    two.register_partition("other", "t", 7).processed = 5
    pages = {"1": one, "2": two.page()}

    merged = merge_pages([(f'worker="{worker}"', page) for worker, page in pages.items()])

    expected = sorted(
        (family, name, tuple(sorted((*labels, ("worker", worker)))), value)
        for worker, page in pages.items()
        for family, name, labels, value in _samples(page)
    )
    assert sorted(_samples(merged)) == expected
    assert merged.count("# TYPE decaton_tasks_processed_total counter") == 1
    assert 'decaton_tasks_processed_total{worker="2",partition="7",' in merged


def test_merging_openmetrics_pages_leaves_their_end_marks_out() -> None:
    page = _busy_metrics().page(openmetrics=True)
    merged = merge_pages([('worker="1"', page), ('worker="2"', page)]) + "# EOF\n"
    families = {f.name: f for f in openmetrics_families(merged)}
    workers = {s.labels["worker"] for s in families["decaton_tasks_processed"].samples}
    assert workers == {"1", "2"}


def test_a_worker_label_a_sample_had_already_is_kept_as_exported_worker() -> None:
    page = (
        "# HELP pool Busy.\n# TYPE pool gauge\n"
        'pool{worker="io-3",note="a worker=\\"x\\" b"} 2.0\n'
        'pool{note="worker=\\"y\\""} 1.0\n'
    )
    merged = merge_pages([('worker="1"', page)])
    [family] = text_string_to_metric_families(merged)
    assert [s.labels for s in family.samples] == [
        {"worker": "1", "exported_worker": "io-3", "note": 'a worker="x" b'},
        {"worker": "1", "note": 'worker="y"'},
    ]


def test_a_sample_without_labels_gains_braces() -> None:
    merged = merge_pages([('worker="3"', "# HELP up Up.\n# TYPE up gauge\nup 1.0\n")])
    assert merged == '# HELP up Up.\n# TYPE up gauge\nup{worker="3"} 1.0\n'


@pytest.mark.parametrize(
    "names",
    [
        ["decaton_tasks_processed_total"],
        ["decaton_task_delivery_latency_seconds_count", "decaton_partition_tasks_pending"],
        ["no_such_metric"],
    ],
)
def test_keeping_names_keeps_those_samples_and_their_headers(names: list[str]) -> None:
    page = _busy_metrics().page()
    kept = keep_names(page, names)
    assert _samples(kept) == [s for s in _samples(page) if s[1] in names]
    assert kept.count("# HELP") == len({s[0] for s in _samples(kept)})


def _get(port: int, query: str = "", **headers: str) -> tuple[str, str, bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics{query}", headers=headers)
    with urllib.request.urlopen(request, timeout=5) as response:
        return (
            response.headers["Content-Type"],
            response.headers.get("Content-Encoding", ""),
            response.read(),
        )


def test_the_endpoint_serves_the_format_asked_for_gzipped_and_filtered() -> None:
    metrics = _busy_metrics()
    port = metrics.start_http_server(0)
    try:
        content_type, encoding, body = _get(port)
        assert content_type.startswith("text/plain; version=0.0.4")
        assert encoding == ""
        assert _samples(body.decode())[:5] == _samples(metrics.page())[:5]  # counters

        accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
        content_type, encoding, body = _get(
            port,
            "?name[]=decaton_tasks_processed_total",
            Accept=accept,
            **{"Accept-Encoding": "gzip"},
        )
        assert content_type.startswith("application/openmetrics-text; version=1.0.0")
        assert encoding == "gzip"
        page = gzip.decompress(body).decode()
        families = list(openmetrics_families(page))
        assert [f.name for f in families] == ["decaton_tasks_processed"]
        assert len(families[0].samples) == 3
    finally:
        metrics.stop()


def test_collectors_registered_beside_the_runtime_are_on_its_page_and_checked_against_it() -> None:
    metrics = _busy_metrics()
    gauge = Gauge("app_queue_depth", "Depth.", registry=metrics.registry)
    gauge.set(3)
    assert "app_queue_depth 3.0\n" in metrics.page()
    with pytest.raises(ValueError, match="Duplicated"):
        Counter("decaton_tasks_processed", "Clash.", registry=metrics.registry)
    restricted = metrics.registry.restricted_registry(["decaton_tasks_processed_total"])
    assert len(_samples(generate_latest(restricted).decode())) == 3
    metrics.registry.unregister(gauge)
    assert "app_queue_depth" not in metrics.page()


def test_the_page_says_the_escaping_it_uses_whatever_the_scraper_asked_for() -> None:
    accept = "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8"
    openmetrics, content_type = negotiate(accept)
    assert openmetrics
    assert content_type.endswith("escaping=underscores")
    assert negotiate(None) == (False, "text/plain; version=0.0.4; charset=utf-8")


def test_a_histogram_whose_labels_sort_before_le_is_refused() -> None:
    with pytest.raises(ValueError, match="after 'le'"):
        Family("h", "doc", "histogram", ("app",))
