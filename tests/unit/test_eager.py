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
