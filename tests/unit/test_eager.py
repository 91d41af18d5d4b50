"""Starting coroutines: eagerly when they finish at once, as tasks when they wait."""

from __future__ import annotations

import asyncio
import contextvars

from decaton_aio.consumer._eager import PROBE_EVERY, CoroutineStarter

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
    assert not starter.tasks


async def test_cancelling_the_continuation_reports_cancellation() -> None:
    """Cancelling a continuation task throws into the coroutine and reports it."""
    results: list[BaseException | None] = []
    starter = CoroutineStarter()
    starter.start(asyncio.sleep(10), _append, results, None)
    for task in list(starter.tasks):
        task.cancel()
    await asyncio.sleep(0.01)
    assert len(results) == 1
    assert isinstance(results[0], asyncio.CancelledError)


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
    assert not starter.tasks


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

    def report(chain: list[int], _: object, exc: BaseException | None) -> None:
        ended.append(exc)
        task_counts.append(len(starter.tasks))
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
    await task
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
    assert not starter.tasks
