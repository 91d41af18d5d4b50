"""What a contender process measures: the processor body every contender runs, and the window.

Every contender calls the same ``process(ctx, task)`` built by :meth:`Recorder.processor`,
so the measuring costs the same everywhere. It records:

- per-key order: a task starting while an earlier task of its key still runs is an
  *overlap*; a task starting with a sequence number not above the last one started for its
  key is an *order violation*;
- processing latency (completion minus start) of the tasks completed in the window;
- delivery latency (processing start minus produce time) in paced runs, the hot key apart.

The measured window opens after ``warmup`` completions (or ``warmup_max_s`` after the first
one) and closes after ``measured`` more (or ``measure_max_s``), so the group join (which the
Tansu delays by half the session timeout) and the first fetches are not measured.
CPU time is the process's own (``time.process_time``), read when the window opens and closes.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import resource
import sys
import time
from array import array
from collections.abc import Callable, Coroutine
from typing import Any

import numpy as np

from bench.workload import Spec, Task

__all__ = ["Recorder", "emit"]

_TICK_S = 0.02
_SLICE_S = 0.5


def emit(obj: dict[str, Any]) -> None:
    """Write one JSON line to stdout (the orchestrator reads them)."""
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _percentiles_ms(values: array[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    arr = np.frombuffer(values, dtype=np.float64)
    p50, p99 = np.percentile(arr, [50, 99])
    return round(float(p50) * 1000, 3), round(float(p99) * 1000, 3)


class Recorder:
    """Counts completions, keeps the measured window and checks per-key order.

    Args:
        spec: the contender's spec.
    """

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        slots = spec.keys + 1  # the last slot is the hot key of S6
        self._last_seq = [-1] * slots
        self._running = [0] * slots
        self.order_violations = 0
        self.overlaps = 0
        self.violation_samples: list[dict[str, Any]] = []
        self.hot_violations = {"overlap": 0, "order": 0}
        self.completed = 0
        self.t_first: float | None = None
        self.measuring = False
        self.closed = False
        self._opened_at = 0.0
        self._opened_cpu = 0.0
        self._opened_count = 0
        self._closed_at = 0.0
        self._closed_cpu = 0.0
        self._closed_count = 0
        self._end_count = spec.warmup + spec.measured
        self.latencies: array[float] = array("d")
        self.delivery_others: array[float] = array("d")
        self.delivery_hot: array[float] = array("d")
        self.others_started = 0
        self.others_expected: int | None = None
        self.extra: dict[str, Any] = {}
        self.timeline: list[list[float]] = []  # [tasks/s, cpu util] per half second
        self.gc_s = 0.0  # CPU time in the cyclic garbage collector during the window
        self.gc_collections = [0, 0, 0]
        self.gc_s_by_generation = [0.0, 0.0, 0.0]
        self._gc_started = 0.0
        self._finished = asyncio.Event()  # an Event: several waiters may be cancelled

    # ------------------------------------------------------------------ processor

    def processor(self) -> Callable[[Any, Task], Coroutine[Any, Any, None]]:
        """The processor body every contender runs: ``await process(ctx, task)``."""
        last_seq, running = self._last_seq, self._running
        hot_slot = self.spec.keys
        paced = self.spec.paced
        perf_counter, wall = time.perf_counter, time.time
        sleep = asyncio.sleep
        done = self._done

        async def process(_ctx: Any, task: Task) -> None:
            start = perf_counter()
            k = task.k
            i = k if k < hot_slot else hot_slot
            if running[i]:
                self._violation(i == hot_slot, "overlap", k, task, _ctx)
            running[i] += 1
            if task.s <= last_seq[i]:
                self._violation(i == hot_slot, "order", k, task, _ctx)
            else:
                last_seq[i] = task.s
            if paced:
                self._delivered(i == hot_slot, wall() - task.t)
            if task.d:
                await sleep(task.d / 1000)
            running[i] -= 1
            done(start)

        return process

    def _violation(self, hot: bool, kind: str, k: int, task: Task, ctx: Any) -> None:
        # The hot key of S6 is counted apart: per-key quota shapes it to another topic,
        # which relaxes its order by design.
        if hot:
            self.hot_violations[kind] += 1
            return
        if kind == "overlap":
            self.overlaps += 1
        else:
            self.order_violations += 1
        if len(self.violation_samples) < 5:
            self.violation_samples.append(
                {"kind": kind, "key": k, "seq": task.s, "offset": getattr(ctx, "offset", None)}
            )

    def _delivered(self, hot: bool, latency: float) -> None:
        if hot:
            self.delivery_hot.append(latency)
            return
        self.delivery_others.append(latency)
        self.others_started += 1
        if self.others_expected is not None and self.others_started >= self.others_expected:
            self._close()

    def _done(self, start: float) -> None:
        end = time.perf_counter()
        self.completed += 1
        if self.measuring:
            self.latencies.append(end - start)
        if self.t_first is None:
            self.t_first = end
            if self.spec.paced:
                self._open()
                return
        if self.spec.paced:
            return
        if self.completed == self.spec.warmup and not self.measuring and not self.closed:
            self._open()
        elif self.completed >= self._end_count and self.measuring:
            self._close()

    # -------------------------------------------------------------------- window

    def _open(self) -> None:
        if self.closed:
            return
        self.measuring = True
        self._opened_at = time.perf_counter()
        self._opened_cpu = time.process_time()
        self._opened_count = self.completed
        self._end_count = self.completed + self.spec.measured
        gc.callbacks.append(self._on_gc)
        if self.spec.announce_window:
            emit({"event": "window"})

    def _close(self) -> None:
        if self.closed:
            return
        if not self.measuring:
            self._open()
        self.measuring = False
        self.closed = True
        self._closed_at = time.perf_counter()
        self._closed_cpu = time.process_time()
        self._closed_count = self.completed
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        self._finished.set()

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        # CPU time, not wall time: under contention a collection may be preempted.
        if phase == "start":
            self._gc_started = time.process_time()
        else:
            spent = time.process_time() - self._gc_started
            self.gc_s += spent
            self.gc_collections[info["generation"]] += 1
            self.gc_s_by_generation[info["generation"]] += spent

    def others_done(self, expected: int) -> None:
        """Paced runs: production ended with ``expected`` tasks of the ordinary keys."""
        self.others_expected = expected
        if self.others_started >= expected:
            self._close()

    async def ticker(self) -> None:
        """Close the window on time limits; run it as a background task.

        Also samples the window's progress every half second (``timeline``: tasks/s and
        CPU use per slice), to show drift within a window.
        """
        spec = self.spec
        last = (time.perf_counter(), time.process_time(), self.completed)
        while not self.closed:
            await asyncio.sleep(_TICK_S)
            now = time.perf_counter()
            if self.measuring and now - last[0] >= _SLICE_S:
                cpu = time.process_time()
                span = now - last[0]
                rate = (self.completed - last[2]) / span
                self.timeline.append([round(rate), round((cpu - last[1]) / span, 2)])
                last = (now, cpu, self.completed)
            elif not self.measuring:
                last = (now, time.process_time(), self.completed)
            if self.closed or spec.paced or self.t_first is None:
                continue
            if not self.measuring and now - self.t_first >= spec.warmup_max_s:
                self._open()
            elif self.measuring and now - self._opened_at >= spec.measure_max_s:
                self._close()

    async def wait(self) -> None:
        """Wait until the measured window closed."""
        await self._finished.wait()

    def force_close(self, reason: str) -> None:
        """End the window now (a drain timeout); ``reason`` goes into the result."""
        self.extra["closed_by"] = reason
        self._close()

    # -------------------------------------------------------------------- result

    def result(self) -> dict[str, Any]:
        """The measurements as a JSON-able dict."""
        window = max(self._closed_at - self._opened_at, 1e-9)
        measured = self._closed_count - self._opened_count
        p50, p99 = _percentiles_ms(self.latencies)
        out: dict[str, Any] = {
            "event": "result",
            "scenario": self.spec.scenario,
            "contender": self.spec.contender,
            "tasks_per_s": round(measured / window, 1),
            "measured_tasks": measured,
            "window_s": round(window, 3),
            "cpu_s_per_1000": round(
                (self._closed_cpu - self._opened_cpu) / max(measured, 1) * 1000, 5
            ),
            "cpu_util": round((self._closed_cpu - self._opened_cpu) / window, 3),
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "latency_p50_ms": p50,
            "latency_p99_ms": p99,
            "completed_total": self.completed,
            "order_violations": self.order_violations,
            "key_overlaps": self.overlaps,
            "violation_samples": self.violation_samples,
            "options": self.spec.options,
            "loadavg_1m": round(os.getloadavg()[0], 2),
            "timeline": self.timeline,
            "gc_s": round(self.gc_s, 4),
            "gc_collections": self.gc_collections,
            "gc_s_by_generation": [round(x, 4) for x in self.gc_s_by_generation],
        }
        if self.spec.paced:
            d50, d99 = _percentiles_ms(self.delivery_others)
            # Tasks of other keys not started by the end (stuck behind a paused partition)
            # waited at least the drain time: a percentile that falls among them is only
            # known from below.
            missing = max(0, (self.others_expected or 0) - self.others_started)
            total = len(self.delivery_others) + missing
            for q, name in ((0.50, "delivery_p50_ms"), (0.99, "delivery_p99_ms")):
                if total and missing and q * total > len(self.delivery_others):
                    out[f"{name}_lower_bound"] = round(self.spec.drain_s * 1000, 1)
                    if name == "delivery_p50_ms":
                        d50 = None
                    else:
                        d99 = None
            h50, h99 = _percentiles_ms(self.delivery_hot)
            out.update(
                delivery_p50_ms=d50,
                delivery_p99_ms=d99,
                hot_delivery_p50_ms=h50,
                hot_delivery_p99_ms=h99,
                others_expected=self.others_expected,
                others_started=self.others_started,
                hot_started=len(self.delivery_hot),
                hot_key_order_violations=self.hot_violations["order"],
                hot_key_overlaps=self.hot_violations["overlap"],
            )
        out.update(self.extra)
        return out

    def finish(self) -> None:
        """Emit the result and end the process at once (no graceful drain to wait for)."""
        emit(self.result())
        sys.stderr.flush()
        os._exit(0)
