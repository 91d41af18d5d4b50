"""Watching the event loop: how late it runs timers, and how long the collector stops it.

A runtime whose loop is held (a long synchronous step, a garbage collection walking many
objects) starts tasks late and finishes their sleeps late, however fast its processor is.
Two numbers tell an overloaded loop from a slow processor:

- **loop lag**: a timer due every `LAG_INTERVAL_S` measures how late it fired. A
  loop that is never held for long fires it within a fraction of a millisecond.
- **GC pauses**: ``gc.callbacks`` time every collection of the cyclic garbage collector
  (every generation), wherever it was triggered.

Both go to histograms of the subscription's stats (``SubscriptionStats.loop_lag`` and
``gc_pause``), exported on the metrics page. The runtime's own loops over many items (a
fetch batch, a commit's partitions) run in steps of `STEP_BUDGET_S`
(`yield_if_due()`, or a `StepTimer` that also reports each step's length).
A step's length is the CPU time the loop's thread spent in it: on a machine whose cores
are busy with other processes, the wall time of a step includes the time the process was
not scheduled, which the loop lag shows and the runtime did not cause.

Caller: `LoopWatch` is started and stopped by its subscription on the event loop;
the GC callback runs in whichever thread triggered the collection (an array append,
atomic under the GIL).
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable
from typing import Any

from decaton_aio._histogram import FastHistogram

__all__ = [
    "LAG_INTERVAL_S",
    "STEP_BUDGET_S",
    "GcWatch",
    "LoopWatch",
    "StepTimer",
    "yield_if_due",
]

#: How often the lag timer is due (100 times a second: a few microseconds of CPU each).
LAG_INTERVAL_S = 0.01

#: How long one step of the runtime's own work may hold the loop before it lets the loop
#: run what waits (timers, I/O, completions): feeding a fetch batch, preparing a commit.
STEP_BUDGET_S = 0.001


async def yield_if_due(began: float) -> float:
    """Let the event loop run once when the step that began at ``began``
    (``time.monotonic()``) took its budget; return when the current step began."""
    if time.monotonic() - began <= STEP_BUDGET_S:
        return began
    await asyncio.sleep(0)
    return time.monotonic()


class StepTimer:
    """Cuts one routine's work into steps of `STEP_BUDGET_S` and reports each
    step's CPU time to ``observe``. ``clock`` (wall, for the budget) and ``cpu_clock``
    (the thread's CPU time) are injectable for tests.

    Callers (one routine each, on the loop): `start()` when the routine resumes after
    an await of its own, `yield_if_due()` between items, `end()` before it awaits
    again.

    Attributes:
        began: ``time.monotonic()`` when the current step began.
    """

    __slots__ = ("_clock", "_cpu", "_cpu_clock", "_observe", "began")

    def __init__(
        self,
        observe: Callable[[float], None],
        clock: Callable[[], float] = time.monotonic,
        cpu_clock: Callable[[], float] = time.thread_time,
    ) -> None:
        self._observe = observe
        self._clock = clock
        self._cpu_clock = cpu_clock
        self.began = 0.0
        self._cpu = 0.0

    def start(self) -> float:
        """A step begins now; returns `began`."""
        self._cpu = self._cpu_clock()
        self.began = self._clock()
        return self.began

    def end(self) -> None:
        """The current step ends: its CPU time is observed."""
        self._observe(self._cpu_clock() - self._cpu)

    async def yield_if_due(self) -> None:
        """End the step and let the loop run once when the step took its budget (wall
        time), then start the next."""
        if self._clock() - self.began <= STEP_BUDGET_S:
            return
        self.end()
        await asyncio.sleep(0)
        self.start()


class LoopWatch:
    """Measures the lateness of a periodic timer on the running loop.

    Args:
        lag: where each lateness (seconds) is observed.
        interval_s: how often the timer is due.
        clock: the loop's clock (``loop.time`` when started on a loop).
    """

    def __init__(
        self,
        lag: FastHistogram,
        interval_s: float = LAG_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._observe = lag.observe
        self._interval = interval_s
        self._clock = clock
        self._due: float | None = None
        self._handle: asyncio.TimerHandle | None = None

    def tick(self) -> float:
        """Observe how late this tick came and return when the next one is due.

        The next tick is due one interval after this one ran, not after it was due, so a
        long stall is counted once rather than as a burst of late ticks.
        """
        now = self._clock()
        if self._due is not None:
            self._observe(max(0.0, now - self._due))
        self._due = now + self._interval
        return self._due

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start ticking on ``loop`` (its clock replaces the one given)."""
        if self._handle is not None:
            return
        self._clock = loop.time
        self._due = None

        def fire() -> None:
            self._handle = loop.call_at(self.tick(), fire)

        fire()

    def stop(self) -> None:
        """Stop ticking; idempotent."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


class GcWatch:
    """Times every collection of the cyclic garbage collector while registered.

    Args:
        pause: where each collection's duration (seconds) is observed.
        clock: a monotonic clock.
    """

    def __init__(self, pause: FastHistogram, clock: Callable[[], float] = time.perf_counter):
        self._observe = pause.observe
        self._clock = clock
        self._began: float | None = None

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        """The ``gc.callbacks`` entry: ``phase`` is ``"start"`` or ``"stop"``."""
        if phase == "start":
            self._began = self._clock()
        elif self._began is not None:
            self._observe(self._clock() - self._began)
            self._began = None

    def start(self) -> None:
        """Register with ``gc.callbacks``; idempotent."""
        if self not in gc.callbacks:
            gc.callbacks.append(self)

    def stop(self) -> None:
        """Unregister; idempotent."""
        if self in gc.callbacks:
            gc.callbacks.remove(self)
