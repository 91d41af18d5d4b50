"""The workers of `CoroutineStarter`: asyncio tasks
that drive processor coroutines one after the other.

A worker's frame holds the running coroutine's owner (the task's context) in the local
``second``, so a log line inside a task that waited finds its task
(`decaton_aio.logs.current_task_context()`).

This module stays interpreted when the runtime is compiled (``setup.py``): a function
compiled by mypyc runs without a frame, and a compiled generator is not a coroutine that
asyncio's tasks accept.

Caller: the starter, on the event loop that owns the consumer. Nothing here is
thread-safe.
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
import types
from collections.abc import Callable, Coroutine, Generator
from typing import Any, Protocol

from decaton_aio.logs import register_task_frame

__all__ = ["FINISHED", "NOT_STARTED", "Done", "Job", "Worker", "as_task", "work"]

#: ``done(first, second, exc_or_none)``: a callback with its two arguments passed along, so
#: a start needs no closure or ``functools.partial`` per coroutine.
Done = Callable[[Any, Any, BaseException | None], None]

FINISHED: Any = object()  # what a first step gives back when the coroutine ended
NOT_STARTED: Any = object()  # a worker's first coroutine whose first step is the worker's

# A coroutine to run: with its done callback, the callback's two arguments, and the copy of
# its starter's context it steps in.
Job = tuple[Coroutine[Any, Any, Any], Done, Any, Any, contextvars.Context]


class Worker:
    """A worker's mailbox: the coroutine handed to it while it reported the last one
    (``next``), and the coroutine it runs first, when it starts or when it wakes from its
    park, until it runs (``first_job``, with ``yielded``: what that coroutine's first step
    gave, or `NOT_STARTED`). A task cancelled before it runs ``first_job`` never runs
    that coroutine: the end is reported when the task ends. ``wake`` is set while the
    worker is parked, waiting for a coroutine."""

    __slots__ = ("first_job", "next", "task", "wake", "yielded")

    def __init__(self, first_job: Job) -> None:
        self.first_job: Job | None = first_job
        self.yielded: Any = NOT_STARTED
        self.next: Job | None = None
        self.task: asyncio.Task[None] | None = None
        self.wake: asyncio.Future[None] | None = None

    def ended(self, task: asyncio.Task[None]) -> None:
        job = self.first_job
        if job is not None:  # cancelled before it ran
            coro, done, first, second, _ = job
            coro.close()
            done(first, second, asyncio.CancelledError())


class _Starter(Protocol):
    """What a worker uses of its starter."""

    # The worker reporting the end of its coroutine right now: the next start is its.
    _vacant: Worker | None

    def _spawn(self, job: Job, yielded: Any = ...) -> None: ...

    def _park(self, worker: Worker) -> asyncio.Future[None] | None: ...

    def _unpark(self, worker: Worker) -> None: ...


@types.coroutine
def work(starter: _Starter, worker: Worker) -> Generator[Any, Any, None]:
    """A worker: runs coroutines one after the other, reporting each end through its
    ``done``. When a report hands it no next one, it parks until the starter wakes it with
    a coroutine (or with none: then it ends), unless the starter has parked enough."""
    # ``second`` names the running coroutine's owner for log lines (register_task_frame
    # below). A coroutine that suspends is driven from here as ``yield from`` would drive
    # it, each step in its own context: the future it yields goes up to the task unchanged
    # (with its blocking flag set by the coroutine), the task's answer goes back down, a
    # cancellation thrown into the task is thrown into the coroutine, and closing the
    # worker closes the coroutine.
    assert worker.first_job is not None
    coro, done, first, second, context = worker.first_job
    worker.first_job = None
    yielded, worker.yielded = worker.yielded, NOT_STARTED
    while True:
        exc: BaseException | None = None
        run = context.run
        try:
            step = coro.__await__()
            if yielded is NOT_STARTED:
                yielded = run(next, step, FINISHED)
            if yielded is not FINISHED:
                while True:
                    try:
                        sent = yield yielded
                    except GeneratorExit:  # closed (a task destroyed at loop teardown)
                        run(coro.close)
                        raise
                    except BaseException as thrown:  # forwarded, as yield from does
                        try:
                            yielded = run(coro.throw, thrown)
                        except StopIteration:
                            break
                    else:
                        if sent is None:  # a wake-up: next() with a default ends quietly
                            yielded = run(next, step, FINISHED)
                            if yielded is FINISHED:
                                break
                        else:
                            try:
                                yielded = run(coro.send, sent)
                            except StopIteration:
                                break
        except (Exception, asyncio.CancelledError) as error:
            exc = error
        starter._vacant = worker
        try:
            done(first, second, exc)
        except Exception as error:  # as the loop treats a failing done callback
            asyncio.get_running_loop().call_exception_handler(
                {"message": "reporting the end of a task failed", "exception": error}
            )
        finally:
            if starter._vacant is worker:
                starter._vacant = None
        job, worker.next = worker.next, None
        task = worker.task
        if task is not None and task.cancelling():
            # This worker was asked to stop: it neither parks nor runs more coroutines (the
            # next one gets a worker of its own).
            if job is not None:
                starter._spawn(job)
            return
        if job is None:
            # Parked, it holds nothing of the coroutine that ended.
            del coro, step, done, first, second, context, run, exc
            wake = starter._park(worker)
            if wake is None:
                return
            try:
                yield from wake
            except BaseException:  # cancelled (or closed) while parked
                starter._unpark(worker)
                raise
            job = worker.first_job
            if job is None:  # released: the starter parks no more
                return
            worker.first_job = None
            coro, done, first, second, context = job
            yielded, worker.yielded = worker.yielded, NOT_STARTED
            continue
        coro, done, first, second, context = job
        yielded = NOT_STARTED


register_task_frame(work.__code__, "second")


if sys.version_info >= (3, 12):
    # asyncio tasks take only native coroutines from Python 3.12 on: one await around it.
    async def as_task(steps: Generator[Any, Any, None]) -> None:
        await steps

else:

    def as_task(steps: Generator[Any, Any, None]) -> Any:
        return steps  # a generator-based coroutine is a task's coroutine as it is
