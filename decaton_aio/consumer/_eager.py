"""Starting processor coroutines cheaply: eagerly when they finish at once, and in few
asyncio tasks when they wait.

Two costs dominate a task that does little: creating and scheduling an ``asyncio.Task``
for it, and reporting its end through a done callback scheduled on the loop. Neither is
needed most of the time.

- Eager start: the coroutine's first step runs at once, in the caller's turn of the loop;
  a coroutine that returns there needs no task at all (what Python 3.12 calls an eager
  task, without the task object, on every supported version).
- Workers: a coroutine that suspends goes on in a *worker*, an asyncio task that reports
  the end of its coroutine by calling ``done`` itself. When that call starts the next task
  (a completion frees a slot, and the partition fills it at once), the new coroutine is
  handed to the worker, which runs it next in the same asyncio task. Under load, where
  every completion starts a waiting record, no task is created per record.

For a processor that nearly always waits, the eager first step outside a worker only adds
the cost of handing the suspended coroutine over. :class:`CoroutineStarter` watches how
often tasks suspend and, when most do, starts them directly in a new worker; one start in
:data:`PROBE_EVERY` still goes the eager way, so a change of behaviour is noticed.

Every coroutine runs each of its steps in its own copy of the caller's context, so a
context variable a processor sets never leaks into the runtime or into the next coroutine
a worker runs. The ``second`` argument of :meth:`CoroutineStarter.start` (its owner: the
executor passes the task's context) is a local of the worker's frame, so log lines inside
the coroutine find their task (:func:`decaton_aio.logs.current_task_context`) without any
per-task work.

Caller: the executor, on the event loop that owns the consumer. Nothing here is
thread-safe.
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
import types
from collections.abc import Callable, Coroutine, Generator
from typing import Any

from decaton_aio.logs import register_task_frame

__all__ = ["PROBE_EVERY", "CoroutineStarter"]

#: ``done(first, second, exc_or_none)``: a callback with its two arguments passed along, so
#: a start needs no closure or ``functools.partial`` per coroutine.
Done = Callable[[Any, Any, BaseException | None], None]

#: In task mode, one start in this many still runs eagerly to measure suspension.
PROBE_EVERY = 32
# Suspension score: +1 when a probed coroutine suspends, -1 when it finishes at once,
# clamped to [0, _SCORE_MAX]; task mode while the score is above _TASK_MODE_ABOVE.
_SCORE_MAX = 16
_FINISHED: Any = object()  # what a first step gives back when the coroutine ended
_NOT_STARTED: Any = object()  # a worker's first coroutine whose first step is the worker's
_TASK_MODE_ABOVE = 8

# A coroutine to run: with its done callback, the callback's two arguments, and the copy of
# its starter's context it steps in.
_Job = tuple[Coroutine[Any, Any, Any], Done, Any, Any, contextvars.Context]


class _Worker:
    """A worker's mailbox (the coroutine handed to it while it reported the last one),
    and its first coroutine until it runs (a task cancelled before its first step never
    runs its coroutine: the end is reported when the task ends)."""

    __slots__ = ("first_job", "next", "task")

    def __init__(self, first_job: _Job) -> None:
        self.first_job: _Job | None = first_job
        self.next: _Job | None = None
        self.task: asyncio.Task[None] | None = None

    def ended(self, task: asyncio.Task[None]) -> None:
        job = self.first_job
        if job is not None:  # cancelled before it ran
            coro, done, first, second, _ = job
            coro.close()
            done(first, second, asyncio.CancelledError())


class CoroutineStarter:
    """Starts coroutines for one executor and keeps the workers that run them.

    Attributes:
        tasks: the asyncio tasks running now (to wait for or cancel them at shutdown):
            the workers, and tasks the caller adds.
    """

    __slots__ = ("_count", "_score", "_vacant", "tasks")

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[Any]] = set()
        self._score = 0
        self._count = 0
        # The worker reporting the end of its coroutine right now: the next start is its.
        self._vacant: _Worker | None = None

    @property
    def task_mode(self) -> bool:
        """Whether most recent coroutines suspended, so new ones start in a new worker."""
        return self._score > _TASK_MODE_ABOVE

    def start(self, coro: Coroutine[Any, Any, Any], done: Done, first: Any, second: Any) -> bool:
        """Start ``coro``.

        Returns:
            ``True`` when the coroutine returned at once without raising (the common case
            of a processor that never waits): ``done`` is not called, the caller carries
            on. Otherwise ``False``, and ``done(first, second, exc_or_none)`` is called
            exactly once when the coroutine ends (before this returns if it raised at once).
        """
        # The coroutine steps in a copy of the current context, wherever it runs.
        context = contextvars.copy_context()
        vacant = self._vacant
        if vacant is not None:
            # Called from inside a worker's report: it runs this coroutine next.
            self._vacant = None
            vacant.next = (coro, done, first, second, context)
            return False
        score = self._score
        if score > _TASK_MODE_ABOVE:
            self._count += 1
            if self._count % PROBE_EVERY:
                self._spawn((coro, done, first, second, context))
                return False
        # Eager path: the first step runs here. next() with a default reports the end
        # without raising StopIteration (when the coroutine returns None, nothing is even
        # created): 130 ns less than send(None).
        try:
            yielded = context.run(next, coro.__await__(), _FINISHED)
        except BaseException as exc:  # the processor's own failure is the caller's
            if score:
                self._score = score - 1
            done(first, second, exc)
            return False
        if yielded is _FINISHED:
            if score:
                self._score = score - 1
            return True
        # It suspended: a worker carries on from there, in the same context.
        self._spawn((coro, done, first, second, context), yielded)
        if score < _SCORE_MAX:
            self._score = score + 1
        return False

    def _spawn(self, job: _Job, yielded: Any = _NOT_STARTED) -> None:
        # A new worker for ``job``: it carries on from ``yielded`` (a first step that
        # suspended), or takes the first step itself. The worker's own context (where it
        # reports ends) is a copy of the caller's; each coroutine steps in its own.
        worker = _Worker(job)
        task = asyncio.get_running_loop().create_task(_as_task(self._work(worker, yielded)))
        worker.task = task
        self.track(task)
        task.add_done_callback(worker.ended)

    def track(self, task: asyncio.Task[Any]) -> None:
        """Keep ``task`` in :attr:`tasks` until it is done, so a shutdown waits for it."""
        tasks = self.tasks
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    @types.coroutine
    def _work(self, worker: _Worker, yielded: Any) -> Generator[Any, Any, None]:
        # Runs coroutines one after the other, reporting each end through its ``done``,
        # for as long as each report hands it the next one. ``second`` names the running
        # coroutine's owner for log lines (register_task_frame below). A coroutine that
        # suspends is driven from here as ``yield from`` would drive it, each step in its
        # own context: the future it yields goes up to the task unchanged (with its
        # blocking flag set by the coroutine), the task's answer goes back down, a
        # cancellation thrown into the task is thrown into the coroutine, and closing the
        # worker closes the coroutine.
        assert worker.first_job is not None
        coro, done, first, second, context = worker.first_job
        worker.first_job = None
        while True:
            exc: BaseException | None = None
            run = context.run
            try:
                if yielded is _NOT_STARTED:
                    yielded = run(next, coro.__await__(), _FINISHED)
                if yielded is not _FINISHED:
                    step = coro.__await__()
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
                                yielded = run(next, step, _FINISHED)
                                if yielded is _FINISHED:
                                    break
                            else:
                                try:
                                    yielded = run(coro.send, sent)
                                except StopIteration:
                                    break
            except (Exception, asyncio.CancelledError) as error:
                exc = error
            self._vacant = worker
            try:
                done(first, second, exc)
            except Exception as error:  # as the loop treats a failing done callback
                asyncio.get_running_loop().call_exception_handler(
                    {"message": "reporting the end of a task failed", "exception": error}
                )
            finally:
                if self._vacant is worker:
                    self._vacant = None
            job = worker.next
            if job is None:
                return
            worker.next = None
            task = worker.task
            if task is not None and task.cancelling():
                # This worker was asked to stop: the next coroutine gets a worker of its own.
                self._spawn(job)
                return
            coro, done, first, second, context = job
            yielded = _NOT_STARTED


register_task_frame(CoroutineStarter._work.__code__, "second")
register_task_frame(CoroutineStarter.start.__code__, "second")  # an eager first step


if sys.version_info >= (3, 12):
    # asyncio tasks take only native coroutines from Python 3.12 on: one await around it.
    async def _as_task(steps: Generator[Any, Any, None]) -> None:
        await steps

else:

    def _as_task(steps: Generator[Any, Any, None]) -> Any:
        return steps  # a generator-based coroutine is a task's coroutine as it is
