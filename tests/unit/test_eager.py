"""Starting coroutines: eagerly when they finish at once, as tasks when they wait."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import weakref

import pytest

from decaton_aio.consumer._eager import MAX_PARKED, PROBE_EVERY, CoroutineStarter

var: contextvars.ContextVar[int] = contextvars.ContextVar("var", default=0)


async def instant(n: int) -> int:
    var.set(n)
    return n


async def waits(n: int) -> int:
    var.set(n)
    await asyncio.sleep(0)
    assert var.get() == n  # its own context survives the suspension
    return n


async def fails() -> None:
    await asyncio.sleep(0)
    raise ValueError("boom")


def _append(results: list[BaseException | None], _: object, exc: BaseException | None) -> None:
    results.append(exc)


async def test_instant_coroutine_finishes_inside_the_call() -> None:
    """A coroutine that never suspends is done before start returns (which says so), with
    no task and no callback."""
    results: list[BaseException | None] = []
    starter = CoroutineStarter()
    assert starter.start(instant(1), _append, results, None) is True
    assert results == []
    assert not starter.tasks
    assert var.get() == 0  # the context variable it set did not leak


async def test_instant_coroutine_returning_a_value_finishes_without_error() -> None:
    """The value a processor returns is ignored; it counts as finished, not failed."""
    results: list[BaseException | None] = []

    async def returns_value() -> int:
        return 42

    assert CoroutineStarter().start(returns_value(), _append, results, None) is True
    assert results == []


async def test_coroutine_raising_at_once_is_reported_with_the_arguments() -> None:
    """An exception in the first step goes to the callback, with the two arguments."""
    calls: list[tuple[object, object, BaseException | None]] = []

    async def raises() -> None:
        raise KeyError("x")

    started = CoroutineStarter().start(
        raises(), lambda a, b, exc: calls.append((a, b, exc)), "first", 2
    )
    assert started is False
    assert [(a, b, type(exc)) for a, b, exc in calls] == [("first", 2, KeyError)]


async def test_suspending_coroutine_goes_on_in_a_task_and_reports_errors() -> None:
    """A coroutine that suspends continues in a tracked task; its exception is reported."""
    results: list[BaseException | None] = []
    starter = CoroutineStarter()
    starter.start(waits(2), _append, results, None)
    starter.start(fails(), _append, results, None)
    assert len(starter.tasks) == 2
    assert results == []
    await asyncio.sleep(0.01)
    assert results[0] is None
    assert isinstance(results[1], ValueError)
    assert starter.parked == 2  # the workers wait for the next coroutines
    await _released(starter)


async def test_cancelling_the_continuation_reports_cancellation() -> None:
    """Cancelling a continuation task throws into the coroutine and reports it; the
    worker then ends."""
    results: list[BaseException | None] = []
    starter = CoroutineStarter()
    starter.start(asyncio.sleep(10), _append, results, None)
    tasks = set(starter.tasks)
    for task in tasks:
        task.cancel()
    await asyncio.wait(tasks, timeout=5)  # a cancelled worker ends rather than parks
    assert len(results) == 1
    assert isinstance(results[0], asyncio.CancelledError)
    assert starter.parked == 0
    assert not starter.tasks


async def test_starter_switches_to_tasks_for_waiting_processors_and_back() -> None:
    """After a run of suspending coroutines the starter uses plain tasks, still probing
    eagerly now and then; when coroutines stop suspending it returns to eager starts."""
    starter = CoroutineStarter()
    done: list[BaseException | None] = []
    for n in range(20):
        starter.start(waits(n), _append, done, None)
    assert starter.task_mode
    await asyncio.sleep(0.01)
    assert done == [None] * 20
    at_once = 0
    for n in range(PROBE_EVERY * 12):
        at_once += starter.start(instant(n), _append, done, None)
    await asyncio.sleep(0.01)
    assert not starter.task_mode
    # Every coroutine ended exactly once: at once (no callback) or as a task (callback).
    assert at_once > 0
    assert at_once + len(done) == 20 + PROBE_EVERY * 12
    await _released(starter)


async def test_closing_a_continuation_closes_the_coroutine_even_if_closed_first() -> None:
    """Teardown closes coroutines in any order: closing the continuation closes the
    processor's coroutine, and is quiet when that one was closed already."""
    for close_inner_first in (False, True):
        results: list[BaseException | None] = []
        starter = CoroutineStarter()
        inner = asyncio.sleep(10)
        starter.start(inner, _append, results, None)
        (task,) = starter.tasks
        await asyncio.sleep(0)  # the continuation runs up to the coroutine's wait
        if close_inner_first:
            inner.close()
        task.get_coro().close()
        assert inner.cr_frame is None  # closed
        task.cancel()
        await asyncio.sleep(0)


caller: contextvars.ContextVar[int] = contextvars.ContextVar("caller", default=0)


async def test_a_worker_runs_the_coroutine_started_while_it_reports_the_last() -> None:
    """A coroutine started from inside a worker's report (a completion starting the next
    record) runs next in that worker: a chain of waiting coroutines uses one asyncio task.
    Each runs in a copy of the context its start was called in (what a tracer attached
    there), and a context variable one of them sets is not seen by the next."""
    starter = CoroutineStarter()
    seen: list[tuple[int, int]] = []
    ended: list[BaseException | None] = []
    task_counts: list[int] = []
    ran_in: set[asyncio.Task[object] | None] = set()

    async def step(n: int) -> None:
        seen.append((var.get(), caller.get()))  # var: 0 unless the last one's value leaked
        var.set(n)
        await asyncio.sleep(0)
        ran_in.add(asyncio.current_task())
        assert (var.get(), caller.get()) == (n, 100 + n)

    all_ended = asyncio.Event()

    def report(chain: list[int], _: object, exc: BaseException | None) -> None:
        ended.append(exc)
        task_counts.append(len(starter.tasks))
        if not chain:
            all_ended.set()
        if chain:
            n = chain.pop(0)
            token = caller.set(100 + n)  # as a tracer attaches the task's span
            try:
                starter.start(step(n), report, chain, None)
            finally:
                caller.reset(token)

    chain = list(range(2, 11))
    token = caller.set(101)
    starter.start(step(1), report, chain, None)
    caller.reset(token)
    (task,) = starter.tasks
    await all_ended.wait()
    await _released(starter)
    assert task.done()
    assert ended == [None] * 10
    assert seen == [(0, 100 + n) for n in range(1, 11)]
    assert ran_in == {task}  # every coroutine ran in the one worker
    assert task_counts == [1] * 10  # and no second task was made
    assert var.get() == 0


async def test_a_cancelled_worker_hands_the_next_coroutine_to_a_new_one() -> None:
    """A worker whose task was cancelled does not run more coroutines in that task: the
    coroutine started during its report gets a worker of its own and runs to its end."""
    starter = CoroutineStarter()
    ended: list[tuple[str, type[BaseException] | None]] = []
    follower_done = asyncio.Event()
    follower_ran_in: list[asyncio.Task[object] | None] = []

    async def follower() -> None:
        follower_ran_in.append(asyncio.current_task())
        await asyncio.sleep(0)
        follower_done.set()

    def report(name: str, _: object, exc: BaseException | None) -> None:
        ended.append((name, type(exc) if exc else None))
        if name == "first":
            starter.start(follower(), report, "second", None)

    starter.start(asyncio.sleep(10), report, "first", None)
    (first_task,) = starter.tasks
    await asyncio.sleep(0)  # the worker waits inside the coroutine
    first_task.cancel()
    await follower_done.wait()
    await asyncio.sleep(0)
    assert ended == [("first", asyncio.CancelledError), ("second", None)]
    assert len(follower_ran_in) == 1
    assert follower_ran_in[0] is not first_task
    assert first_task.done()
    assert starter.tasks == {follower_ran_in[0]}  # parked
    await _released(starter)


async def _released(starter: CoroutineStarter) -> None:
    """Release the parked workers and check that they, the only tasks left, end."""
    assert starter.parked == len(starter.tasks)
    tasks = set(starter.tasks)
    starter.release()
    await asyncio.wait(tasks, timeout=5)
    assert not starter.tasks
    assert all(not task.cancelled() and task.exception() is None for task in tasks)


async def _waiting(gate: asyncio.Event, n: int = 0) -> int:
    await gate.wait()
    return n


class _Ends:
    """A done callback that records each end and lets a test wait for a count of them.
    A worker parks within the step that reported, so once a wait returns, the worker
    that reported last is parked (or ended)."""

    def __init__(self) -> None:
        self.results: list[BaseException | None] = []
        self._changed = asyncio.Event()

    def __call__(self, _: object, __: object, exc: BaseException | None) -> None:
        self.results.append(exc)
        self._changed.set()

    async def wait(self, count: int) -> None:
        while len(self.results) < count:
            self._changed.clear()
            await self._changed.wait()


async def _parked_worker(starter: CoroutineStarter, ends: _Ends) -> asyncio.Task[object]:
    """A worker that ran one coroutine to its end and parked."""
    gate = asyncio.Event()
    starter.start(_waiting(gate), ends, None, None)
    (worker,) = starter.tasks
    gate.set()
    await ends.wait(len(ends.results) + 1)
    assert starter.parked == 1
    assert not worker.done()
    return worker


async def test_a_parked_worker_runs_the_next_coroutine_that_suspends() -> None:
    """A worker whose coroutine ended with nothing to run next parks; a coroutine started
    later that suspends runs in it, with no new task, and ends there."""
    starter, ends = CoroutineStarter(), _Ends()
    worker = await _parked_worker(starter, ends)
    starter.start(waits(5), ends, None, None)  # suspends in its first step
    assert starter.tasks == {worker}
    assert starter.parked == 0
    await ends.wait(2)
    assert ends.results == [None, None]
    assert starter.parked == 1
    await _released(starter)


async def test_a_parked_worker_holds_nothing_of_its_last_coroutine() -> None:
    """The owner a parked worker's last coroutine was started with can be freed."""

    class Owner:
        pass

    starter, ends = CoroutineStarter(), _Ends()
    owner = Owner()
    gone = weakref.ref(owner)
    gate = asyncio.Event()
    starter.start(_waiting(gate), ends, None, owner)
    del owner
    gate.set()
    await ends.wait(1)
    assert starter.parked == 1
    gc.collect()
    assert gone() is None
    await _released(starter)


async def test_at_most_max_parked_workers_park_and_none_after_release() -> None:
    """Workers past the bound end instead of parking; after release none parks."""
    starter, ends = CoroutineStarter(), _Ends()
    gate = asyncio.Event()
    for n in range(MAX_PARKED + 10):
        starter.start(_waiting(gate, n), ends, None, None)
    workers = set(starter.tasks)
    gate.set()
    await ends.wait(MAX_PARKED + 10)
    assert starter.parked == MAX_PARKED
    ended = {task for task in workers if task.done()}
    assert len(ended) == 10
    await asyncio.wait(ended)  # their tasks leave the starter's set
    await _released(starter)
    starter.start(waits(1), ends, None, None)  # a new worker, which then ends
    (task,) = starter.tasks
    await task
    assert starter.parked == 0
    assert not starter.tasks


@pytest.mark.parametrize("handed_a_coroutine", [False, True])
async def test_a_cancelled_parked_worker_leaves_the_park(handed_a_coroutine: bool) -> None:
    """A parked worker cancelled while it waits leaves the park (the next coroutine gets
    another worker); one cancelled after a coroutine was handed to it, before it ran,
    reports that coroutine as cancelled and closes it."""
    starter, ends = CoroutineStarter(), _Ends()
    worker = await _parked_worker(starter, ends)
    handed = waits(7)
    if handed_a_coroutine:
        starter.start(handed, ends, None, None)
    worker.cancel()
    await asyncio.wait({worker})
    assert starter.parked == 0
    assert not starter.tasks
    if handed_a_coroutine:
        assert len(ends.results) == 2
        assert isinstance(ends.results[1], asyncio.CancelledError)
        assert handed.cr_frame is None  # closed
    else:
        starter.start(handed, ends, None, None)
        (other,) = starter.tasks
        assert other is not worker
        await ends.wait(2)
        assert ends.results == [None, None]
        await _released(starter)
