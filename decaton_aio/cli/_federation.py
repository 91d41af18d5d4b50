"""One metrics endpoint for the workers of ``run --workers N``.

Each worker serves its own metrics on a loopback port it chooses and writes to a file
the supervisor gave it. The supervisor's endpoint scrapes every running worker when it is
scraped itself, in the format it was asked for, and returns their series together, each
with a ``worker`` label (the worker's number, kept across restarts), followed by the
supervisor's own series (``decaton_supervisor_workers_running``,
``decaton_supervisor_worker_restarts_total``). The pages are merged as text
(`decaton_aio._exposition.merge_pages`), not parsed.

Why scraping and not prometheus_client's multiprocess mode: that mode only shares the
metric types it writes to memory-mapped files, and the runtime's metrics come from a
custom collector that reads its statistics when scraped. With a ``worker`` label nothing
is summed by the supervisor, so a restarted worker's counters start again at zero as a
new process's do, which ``rate()`` handles; ``sum without (worker)`` gives the totals.

``/healthz`` and ``/readyz`` answer for the workers together (`WorkerProbes`): each
running worker's probe is asked, and the answer passes when every one passes; a worker
being restarted (no endpoint yet) fails readiness but not liveness, since the supervisor
is already bringing it back.

The workers are scraped at the same time, each in its own thread, so the page answers
within `SCRAPE_TIMEOUT_S` however many workers there are (under the 10 s a
Prometheus scrape waits by default). A worker that does not answer in that time, as one
whose cores are saturated by a backlog may not, is left out of that scrape (and counted
in ``decaton_supervisor_scrape_errors_total``).
"""

from __future__ import annotations

import http.client
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from decaton_aio._exposition import OPENMETRICS_TYPE, merge_pages
from decaton_aio.metrics import MetricsEndpoint, encode

__all__ = ["SCRAPE_TIMEOUT_S", "Federation", "WorkerEndpoint", "WorkerProbes"]

SCRAPE_TIMEOUT_S = 5.0


class WorkerEndpoint(Protocol):
    """What the federation needs of a worker: its number, port and restart count."""

    index: int
    restarts: int

    def metrics_port(self) -> int | None: ...


class _Collector:
    """The supervisor's own series, and its workers' pages."""

    def __init__(self, workers: Sequence[WorkerEndpoint], timeout_s: float) -> None:
        self._workers = workers
        self._timeout_s = timeout_s
        self._scrape_errors = 0
        self._lock = threading.Lock()

    def pages(self, openmetrics: bool) -> list[tuple[str, str]]:
        """Every running worker's page: ``(its worker label, the page)``; a worker that
        does not answer is left out (and counted)."""
        running = [(w, port) for w in self._workers if (port := w.metrics_port()) is not None]
        accept = OPENMETRICS_TYPE if openmetrics else None
        with ThreadPoolExecutor(max_workers=max(1, len(running))) as pool:
            texts = list(
                pool.map(self._scrape, [port for _, port in running], [accept] * len(running))
            )
        return [
            (f'worker="{worker.index}"', text)
            for (worker, _), text in zip(running, texts, strict=True)
            if text is not None
        ]

    def _scrape(self, port: int, accept: str | None) -> str | None:
        try:
            status, body = _get(port, "/metrics", self._timeout_s, accept)
            text = body.decode() if status == 200 else None
        except (OSError, http.client.HTTPException, UnicodeDecodeError):
            text = None  # no answer, or one cut short (a worker ending mid-page)
        if text is None:
            with self._lock:
                self._scrape_errors += 1
        return text

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "decaton_supervisor_workers_running", "Workers with a metrics endpoint now"
        )
        up.add_metric([], sum(w.metrics_port() is not None for w in self._workers))
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

    Attributes:
        registry: the supervisor's own series (its workers' come with `page()`).
    """

    def __init__(
        self, workers: Sequence[WorkerEndpoint], timeout_s: float = SCRAPE_TIMEOUT_S
    ) -> None:
        super().__init__(CollectorRegistry())
        self._collector = _Collector(workers, timeout_s)
        self.registry.register(self._collector)

    def page(self, openmetrics: bool = False) -> str:
        merged = merge_pages(self._collector.pages(openmetrics))
        return merged + encode(self.registry, openmetrics)


class WorkerProbes:
    """The supervisor's ``/healthz`` and ``/readyz``: every worker's, asked at once.

    Args:
        workers: the worker slots; read at each probe (from the HTTP server's thread).
        timeout_s: how long a probe waits for the workers' answers.
    """

    def __init__(
        self, workers: Sequence[WorkerEndpoint], timeout_s: float = SCRAPE_TIMEOUT_S
    ) -> None:
        self._workers = workers
        self._timeout_s = timeout_s

    def liveness(self) -> tuple[bool, Mapping[str, object]]:
        return self._ask("/healthz", missing_ok=True)

    def readiness(self) -> tuple[bool, Mapping[str, object]]:
        return self._ask("/readyz", missing_ok=False)

    def _ask(self, path: str, *, missing_ok: bool) -> tuple[bool, Mapping[str, object]]:
        ports = {w.index: w.metrics_port() for w in self._workers}
        running = {index: port for index, port in ports.items() if port is not None}
        with ThreadPoolExecutor(max_workers=max(1, len(running))) as pool:
            asked = pool.map(self._probe, running.values(), [path] * len(running))
            answers = dict(zip(running, asked, strict=True))
        workers = {str(index): answers.get(index, "restarting") for index in ports}
        ok = all(answer == "ok" for answer in answers.values())
        ok = ok and (missing_ok or len(running) == len(ports))
        return ok, {"status": "ok" if ok else "failing", "workers": workers}

    def _probe(self, port: int, path: str) -> object:
        """``"ok"``, or why not: the worker's JSON reasons, or that it did not answer."""
        try:
            status, body = _get(port, path, self._timeout_s)
        except OSError as exc:
            return f"no answer: {exc}"
        if status == 200:
            return "ok"
        try:
            reasons: object = json.loads(body)
        except ValueError:
            reasons = f"HTTP {status}"
        return reasons


def _get(port: int, path: str, timeout_s: float, accept: str | None = None) -> tuple[int, bytes]:
    """A page of a worker's endpoint: its HTTP status and body.

    Raises:
        OSError: the worker did not answer in time.
        http.client.HTTPException: its answer was cut short (a worker ending mid-page).
    """
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if accept is not None:
        request.add_header("Accept", accept)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return int(response.status), bytes(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, bytes(exc.read())
