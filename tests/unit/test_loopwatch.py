"""The event loop watch: a late timer's lateness and the collector's pauses, with injected
clocks (no wall-clock timing)."""

from __future__ import annotations

import asyncio
import gc

import pytest

from decaton_aio._histogram import LOOP_BUCKETS_S, FastHistogram
from decaton_aio.consumer._loopwatch import GcWatch, LoopWatch


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_tick_observes_how_late_it_came_and_schedules_the_next_from_now() -> None:
    lag = FastHistogram(LOOP_BUCKETS_S)
    clock = FakeClock()
    watch = LoopWatch(lag, interval_s=0.01, clock=clock)
    assert watch.tick() == 100.01  # the first tick only sets the due time
    assert lag.count == 0
    clock.now = 100.0105  # 0.5 ms late
    due = watch.tick()
    clock.now = due + 0.030  # held for 30 ms
    watch.tick()
    assert lag.count == 2
    assert abs(lag.sum - 0.0305) < 1e-9
    # A long stall is one late tick: the next is due an interval after it ran.
    assert watch.tick() == clock.now + 0.01


def test_an_early_tick_counts_as_on_time() -> None:
    lag = FastHistogram(LOOP_BUCKETS_S)
    clock = FakeClock()
    watch = LoopWatch(lag, interval_s=0.01, clock=clock)
    watch.tick()
    clock.now = 100.005  # a loop may run a timer a little before it is due
    watch.tick()
    assert lag.sum == 0.0
    assert lag.count == 1


async def test_the_watch_ticks_on_a_running_loop_until_stopped() -> None:
    lag = FastHistogram(LOOP_BUCKETS_S)
    seen: list[float] = []
    three = asyncio.Event()

    def observe(value: float) -> None:
        seen.append(value)
        if len(seen) == 3:
            three.set()

    lag.observe = observe
    watch = LoopWatch(lag, interval_s=0.001)
    watch.start(asyncio.get_running_loop())
    watch.start(asyncio.get_running_loop())  # idempotent: one timer
    await three.wait()
    watch.stop()
    ticks = len(seen)
    await asyncio.sleep(0.005)  # several intervals: a timer left running would tick
    assert len(seen) == ticks
    assert all(value >= 0 for value in seen)
    watch.stop()  # idempotent


def test_the_gc_watch_observes_each_collection_from_start_to_stop() -> None:
    pause = FastHistogram(LOOP_BUCKETS_S)
    clock = FakeClock()
    watch = GcWatch(pause, clock=clock)
    watch("stop", {"generation": 0})  # a stop without its start (registered mid-way)
    assert pause.count == 0
    watch("start", {"generation": 2})
    clock.now += 0.004
    watch("stop", {"generation": 2})
    assert pause.count == 1
    assert abs(pause.sum - 0.004) < 1e-9


def test_the_gc_watch_sees_real_collections_while_registered_only() -> None:
    pause = FastHistogram(LOOP_BUCKETS_S)
    watch = GcWatch(pause)
    watch.start()
    watch.start()  # idempotent: registered once
    try:
        gc.collect()
        assert pause.count == 1
    finally:
        watch.stop()
    watch.stop()
    gc.collect()
    assert pause.count == 1


async def test_a_step_past_its_budget_lets_the_loop_run_once() -> None:
    from decaton_aio.consumer._loopwatch import yield_if_due

    ran: list[str] = []
    asyncio.get_running_loop().call_soon(ran.append, "waiting callback")
    began = await yield_if_due(float("inf"))  # began "now": within its budget
    assert began == float("inf")
    assert ran == []  # the loop did not run
    began = await yield_if_due(0.0)  # began long ago: past its budget
    assert ran == ["waiting callback"]
    assert 0.0 < began < float("inf")  # a new step begins now


async def test_a_step_timer_yields_on_wall_time_and_reports_cpu_time() -> None:
    """The budget is wall time (a preempted step still lets the loop run), the observed
    length the thread's CPU time (what the runtime itself spent)."""
    from decaton_aio.consumer._loopwatch import STEP_BUDGET_S, StepTimer

    wall, cpu = [100.0], [7.0]
    observed: list[float] = []
    steps = StepTimer(observed.append, clock=lambda: wall[0], cpu_clock=lambda: cpu[0])
    ran: list[str] = []
    asyncio.get_running_loop().call_soon(ran.append, "waiting callback")
    assert steps.start() == 100.0
    wall[0] += STEP_BUDGET_S / 2
    await steps.yield_if_due()  # within the budget: goes on
    assert (ran, observed) == ([], [])
    wall[0] += STEP_BUDGET_S * 10  # preempted: 5 ms of wall time...
    cpu[0] += 0.0003  # ...of which 0.3 ms on the CPU
    await steps.yield_if_due()
    assert ran == ["waiting callback"]
    assert observed == [pytest.approx(0.0003)]
    assert steps.began == wall[0]  # the next step began after the yield
    cpu[0] += 0.0001
    steps.end()
    assert observed[1] == pytest.approx(0.0001)
