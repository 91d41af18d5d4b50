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

The workers are scraped at the same time, each in its own thread, so the page answers
within :data:`SCRAPE_TIMEOUT_S` however many workers there are (under the 10 s a
Prometheus scrape waits by default). A worker that does not answer in that time, as one
whose cores are saturated by a backlog may not, is left out of that scrape (and counted
in ``decaton_supervisor_scrape_errors_total``).
"""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from decaton_aio.metrics import MetricsEndpoint

__all__ = ["SCRAPE_TIMEOUT_S", "Federation", "WorkerEndpoint"]

SCRAPE_TIMEOUT_S = 5.0


class WorkerEndpoint(Protocol):
    """What the federation needs of a worker: its number, port and restart count."""

    index: int
    restarts: int

    def metrics_port(self) -> int | None: ...


class _Collector:
    def __init__(self, workers: Sequence[WorkerEndpoint], timeout_s: float) -> None:
        self._workers = workers
        self._timeout_s = timeout_s
        self._scrape_errors = 0
        self._lock = threading.Lock()

    def _scrape(self, port: int) -> str | None:
        url = f"http://127.0.0.1:{port}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=self._timeout_s) as response:
                text: str = response.read().decode()
                return text
        except OSError:
            with self._lock:
                self._scrape_errors += 1
            return None

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        running = [(w, port) for w in self._workers if (port := w.metrics_port()) is not None]
        with ThreadPoolExecutor(max_workers=max(1, len(running))) as pool:
            texts = list(pool.map(self._scrape, [port for _, port in running]))
        for (worker, _), text in zip(running, texts, strict=True):
            if text is None:
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
        up.add_metric([], len(running))
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


class Federation(MetricsEndpoint):
    """The supervisor's metrics endpoint over its workers.

    Args:
        workers: the worker slots; read at each scrape (from the HTTP server's thread).
        timeout_s: how long a scrape waits for the workers' pages.
    """

    def __init__(
        self, workers: Sequence[WorkerEndpoint], timeout_s: float = SCRAPE_TIMEOUT_S
    ) -> None:
        super().__init__(CollectorRegistry())
        self.registry.register(_Collector(workers, timeout_s))
