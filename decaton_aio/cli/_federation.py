"""One metrics endpoint for the workers of ``run --workers N``.

Each worker serves its own metrics on a loopback port it chooses and writes to a file
the supervisor gave it. The supervisor's endpoint scrapes every running worker when it is
scraped itself and returns their series together, each with a ``worker`` label (the
worker's number, kept across restarts), followed by the supervisor's own series
(``decaton_supervisor_workers_running``, ``decaton_supervisor_worker_restarts_total``).

Why scraping and not prometheus_client's multiprocess mode: that mode only shares the
metric types it writes to memory-mapped files, and the runtime's metrics come from a
custom collector that reads its statistics when scraped. With a ``worker`` label nothing
is summed by the supervisor, so a restarted worker's counters start again at zero as a
new process's do, which ``rate()`` handles; ``sum without (worker)`` gives the totals.

A worker that does not answer within :data:`SCRAPE_TIMEOUT_S` is left out of that scrape
(and counted in ``decaton_supervisor_scrape_errors_total``).
"""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Iterator, Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from decaton_aio.metrics import MetricsEndpoint

__all__ = ["SCRAPE_TIMEOUT_S", "Federation", "WorkerEndpoint"]

SCRAPE_TIMEOUT_S = 2.0


class WorkerEndpoint(Protocol):
    """What the federation needs of a worker: its number, port and restart count."""

    index: int
    restarts: int

    def metrics_port(self) -> int | None: ...


class _Collector:
    def __init__(self, workers: Sequence[WorkerEndpoint]) -> None:
        self._workers = workers
        self._scrape_errors = 0
        self._lock = threading.Lock()

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        running = 0
        for worker in self._workers:
            port = worker.metrics_port()
            if port is None:
                continue
            running += 1
            try:
                text = _scrape(port)
            except OSError:
                with self._lock:
                    self._scrape_errors += 1
                continue
            for family in text_string_to_metric_families(text):
                merged = families.get(family.name)
                if merged is None:
                    merged = families[family.name] = Metric(
                        family.name, family.documentation, family.type, family.unit
                    )
                label = str(worker.index)
                merged.samples += [
                    s._replace(labels={**s.labels, "worker": label}) for s in family.samples
                ]
        yield from families.values()
        up = GaugeMetricFamily(
            "decaton_supervisor_workers_running", "Workers with a metrics endpoint now"
        )
        up.add_metric([], running)
        yield up
        restarts = CounterMetricFamily(
            "decaton_supervisor_worker_restarts",
            "Times the supervisor restarted a worker after it died",
            labels=["worker"],
        )
        for worker in self._workers:
            restarts.add_metric([str(worker.index)], worker.restarts)
        yield restarts
        errors = CounterMetricFamily(
            "decaton_supervisor_scrape_errors", "Worker scrapes that failed or timed out"
        )
        errors.add_metric([], self._scrape_errors)
        yield errors


def _scrape(port: int) -> str:
    url = f"http://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as response:
        text: str = response.read().decode()
        return text


class Federation(MetricsEndpoint):
    """The supervisor's metrics endpoint over its workers.

    Args:
        workers: the worker slots; read at each scrape (from the HTTP server's thread).
    """

    def __init__(self, workers: Sequence[WorkerEndpoint]) -> None:
        super().__init__(CollectorRegistry())
        self.registry.register(_Collector(workers))
