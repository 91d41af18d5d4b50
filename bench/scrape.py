"""What a scrape of our metrics endpoint costs, by partition count and worker form.

``python -m bench.scrape`` starts an embedded Apache Kafka and, for each partition count
(``--partitions``, default 3 and 96) and worker form (``--workers``, default 1 and auto),
runs ``python -m decaton_aio run`` (the benchmark's processor) on an idle topic of that
many partitions with a metrics port. Once every partition is assigned and the page's
length holds still (no partition moving between workers), it scrapes the page
``--scrapes`` times in each format (the Prometheus text format, then OpenMetrics as
Prometheus asks for it) and prints one JSON line per form and format: the page's lines
and bytes, the scrape time's median and range in ms, and the CPU the contender's process
tree spent per scrape (its idle work over the same time included: a few ms a second).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench import procs, reaper
from bench.loopstats import free_port

__all__ = ["main", "measure"]

_OPENMETRICS = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"


def _get(port: int, accept: str | None) -> tuple[float, bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics")
    if accept:
        request.add_header("Accept", accept)
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=30) as response:
        body = bytes(response.read())
    return time.perf_counter() - started, body


async def _settled(port: int, partitions: int, timeout_s: float = 180) -> None:
    """Until the page shows a pending gauge for every partition (each assigned) and its
    length stays the same over three scrapes 2 s apart (no partition still moving
    between workers)."""
    deadline = time.monotonic() + timeout_s
    lengths: list[int] = []
    while time.monotonic() < deadline:
        try:
            _, body = await asyncio.to_thread(_get, port, None)
        except OSError:
            body = b""
        if body.count(b"decaton_partition_tasks_pending{") >= partitions:
            lengths.append(body.count(b"\n"))
            if len(lengths) >= 3 and len(set(lengths[-3:])) == 1:
                return
        await asyncio.sleep(2)
    raise TimeoutError(f"the page of {partitions} partitions did not settle in {timeout_s} s")


async def measure(
    bootstrap: str, topic: str, partitions: int, workers: str, scrapes: int, workdir: Path
) -> list[dict[str, Any]]:
    """Scrape one form's page ``scrapes`` times in each format; one row per format."""
    port = free_port()
    argv = [
        sys.executable, "-m", "decaton_aio", "--log-level", "warning", "run",
        "bench.contenders.ours_app:app", "--bootstrap-servers", bootstrap, "--topic", topic,
        "--group", f"{topic}-{workers}", "--workers", workers, "--metrics-port", str(port),
    ]  # fmt: skip
    env = {**os.environ, "BENCH_FACTS_DIR": str(workdir)}
    proc = await procs.start_process(argv, env=env, cwd=Path.cwd(), log=workdir / "run.log")
    rows = []
    try:
        await _settled(port, partitions)
        for fmt, accept in (("text", None), ("openmetrics", _OPENMETRICS)):
            await asyncio.to_thread(_get, port, accept)  # once before: imports, caches
            before = procs.cpu_times([proc.pid])
            times, body = [], b""
            for _ in range(scrapes):
                took, body = await asyncio.to_thread(_get, port, accept)
                times.append(took * 1000)
            cpu = procs.cpu_delta(before, procs.cpu_times([proc.pid]))
            rows.append(
                {
                    "event": "scrape",
                    "partitions": partitions,
                    "workers": workers,
                    "format": fmt,
                    "lines": body.count(b"\n"),
                    "bytes": len(body),
                    "scrape_ms_median": round(statistics.median(times), 1),
                    "scrape_ms_min": round(min(times), 1),
                    "scrape_ms_max": round(max(times), 1),
                    "cpu_ms_per_scrape": round(cpu * 1000 / scrapes, 1),
                }
            )
    finally:
        await procs.stop_process(proc)
    return rows


async def _run(args: argparse.Namespace) -> int:
    from decaton_aio.embedded import EmbeddedBroker
    from decaton_aio.testing import TopicAdmin

    with tempfile.TemporaryDirectory(prefix="bench-scrape-") as tmp:
        workdir = Path(tmp)
        broker = EmbeddedBroker(flavor="apache", log_path=workdir / "broker.log")
        reaper.adopt_broker(broker)
        broker.start()
        admin = TopicAdmin(broker.bootstrap_servers)
        try:
            for partitions in args.partitions:
                topic = await admin.create(partitions, prefix=f"bench-scrape-p{partitions}")
                for workers in args.workers:
                    for row in await measure(
                        broker.bootstrap_servers, topic, partitions, workers, args.scrapes, workdir
                    ):
                        print(json.dumps(row), flush=True)
        finally:
            await admin.close(delete=True)
            broker.stop()
            reaper.release_broker(broker)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scrape", description=__doc__)
    parser.add_argument("--partitions", type=int, nargs="+", default=[3, 96])
    parser.add_argument("--workers", nargs="+", default=["1", "auto"])
    parser.add_argument("--scrapes", type=int, default=10)
    args = parser.parse_args(argv)
    reaper.install()
    return asyncio.run(_run(args))


if __name__ == "__main__":
    sys.exit(main())
