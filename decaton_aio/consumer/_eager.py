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

A worker whose report starts nothing parks instead of ending, up to `MAX_PARKED`
of them: the next coroutine that suspends (or starts in task mode) wakes one rather than
creating a task. At a paced load, where records arrive a few at a time and each finds no
worker reporting, this replaces a task's creation and end per record with the resolution
of a future. `CoroutineStarter.release()` ends the parked workers at shutdown.

For a processor that nearly always waits, the eager first step outside a worker only adds
the cost of handing the suspended coroutine over. `CoroutineStarter` watches how
often tasks suspend and, when most do, starts them directly in a new worker; one start in
`PROBE_EVERY` still goes the eager way, so a change of behaviour is noticed.

Every coroutine runs each of its steps in its own copy of the caller's context, so a
context variable a processor sets never leaks into the runtime or into the next coroutine
a worker runs. The ``second`` argument of `CoroutineStarter.start()` (its owner: the
executor passes the task's context) is a local of the worker's frame, so log lines inside
the coroutine find their task (`decaton_aio.logs.current_task_context()`) without any
per-task work; the worker is in `decaton_aio.consumer._steps`, which stays Python
when this module is compiled (``setup.py``). A first step that runs here, inside the
executor's start, is found through the executor.

Caller: the executor, on the event loop that owns the consumer. Nothing here is
thread-safe.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from contextvars import copy_context
from typing import Any, Final

from decaton_aio.consumer._steps import (
    FINISHED,
    NOT_STARTED,
    Done,
    Job,
    Worker,
    as_task,
    work,
)

__all__ = ["MAX_PARKED", "PROBE_EVERY", "CoroutineStarter"]

# What every start uses, as module constants: compiled, a name imported from a Python
# module (or a builtin) is looked up in a namespace at every use, a constant is not.
_COPY_CONTEXT: Final = copy_context
_NEXT: Final = next
_FINISHED: Final = FINISHED

#: Workers kept parked, waiting for a coroutine, at most.
MAX_PARKED: Final = 1024

#: In task mode, one start in this many still runs eagerly to measure suspension.
PROBE_EVERY: Final = 32
# Suspension score: +1 when a probed coroutine suspends, -1 when it finishes at once,
# clamped to [0, _SCORE_MAX]; task mode while the score is above _TASK_MODE_ABOVE.
_SCORE_MAX: Final = 16
_TASK_MODE_ABOVE: Final = 8


class CoroutineStarter:
    """Starts coroutines for one executor and keeps the workers that run them.

    Attributes:
        tasks: the asyncio tasks running now (to wait for or cancel them at shutdown):
            the workers, and tasks the caller adds.
    """

    __slots__ = ("_count", "_parked", "_released", "_score", "_vacant", "tasks")

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[Any]] = set()
        self._score = 0
        self._count = 0
        # The worker reporting the end of its coroutine right now: the next start is its.
        self._vacant: Worker | None = None
        self._parked: list[Worker] = []  # the most recently parked last
        self._released = False

    @property
    def parked(self) -> int:
        """Workers parked now, waiting for a coroutine (they are in `tasks`)."""
        return len(self._parked)

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
        context = _COPY_CONTEXT()
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
            yielded = context.run(_NEXT, coro.__await__(), _FINISHED)
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

    def release(self) -> None:
        """End the parked workers, and park none from now on (at shutdown, before waiting
        for `tasks`)."""
        self._released = True
        parked, self._parked = self._parked, []
        for worker in parked:
            wake, worker.wake = worker.wake, None
            if wake is not None and not wake.done():
                wake.set_result(None)  # with no first_job: the worker ends

    def _park(self, worker: Worker) -> asyncio.Future[None] | None:
        # Called by a worker whose report started nothing: the future it waits on, or
        # None when it should end instead.
        parked = self._parked
        if self._released or len(parked) >= MAX_PARKED:
            return None
        wake: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        worker.wake = wake
        parked.append(worker)
        return wake

    def _unpark(self, worker: Worker) -> None:
        # Called by a parked worker that was cancelled or closed.
        worker.wake = None
        if worker in self._parked:
            self._parked.remove(worker)

    def _spawn(self, job: Job, yielded: Any = NOT_STARTED) -> None:
        # A worker for ``job``, parked or new: it carries on from ``yielded`` (a first
        # step that suspended), or takes the first step itself. A new worker's own context
        # (where it reports ends) is a copy of the caller's; each coroutine steps in its
        # own.
        parked = self._parked
        while parked:
            idle = parked.pop()
            wake, idle.wake = idle.wake, None
            if wake is not None and not wake.done():
                idle.first_job = job
                idle.yielded = yielded
                wake.set_result(None)
                return
        worker = Worker(job)
        worker.yielded = yielded
        task = asyncio.get_running_loop().create_task(as_task(work(self, worker)))
        worker.task = task
        self.track(task)
        task.add_done_callback(worker.ended)

    def track(self, task: asyncio.Task[Any]) -> None:
        """Keep ``task`` in `tasks` until it is done, so a shutdown waits for it."""
        tasks = self.tasks
        tasks.add(task)
        task.add_done_callback(tasks.discard)
