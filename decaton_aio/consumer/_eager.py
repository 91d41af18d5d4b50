"""Starting processor coroutines cheaply: eagerly when they finish at once, as tasks when
they wait.

Most time in a no-op or cache-hit processor would go to creating and scheduling an
``asyncio.Task``. The eager path runs the coroutine's first step at once, in the caller's
turn of the loop, and only a coroutine that actually suspends (awaits I/O) is handed to a
task that carries on from where it stopped (what Python 3.12 calls an eager task, without
the task object for the common case, on every supported version).

For a processor that nearly always waits (I/O-bound), the eager step only adds the cost of
handing the suspended coroutine over. :class:`CoroutineStarter` watches how often tasks
suspend and, when most do, starts them as plain tasks; one task in :data:`PROBE_EVERY`
still goes the eager way, so a change of behaviour is noticed.

Every coroutine runs in its own copy of the caller's context, so a context variable a
processor sets never leaks into the runtime or into other tasks. A coroutine that runs on
as a task is kept with the ``second`` argument of :meth:`CoroutineStarter.start` (its
owner: the executor passes the task's context), so log lines inside it find their task
(:func:`decaton_aio.logs.current_task_context`) without any per-task work.
"""

from __future__ import annotations

import asyncio
import contextvars
import weakref
from collections.abc import Callable, Coroutine, Generator
from typing import Any

from decaton_aio.logs import register_task_lookup

__all__ = ["PROBE_EVERY", "CoroutineStarter"]

#: ``done(first, second, exc_or_none)``: a callback with its two arguments passed along, so
#: a start needs no closure or ``functools.partial`` per coroutine.
Done = Callable[[Any, Any, BaseException | None], None]

#: In task mode, one start in this many still runs eagerly to measure suspension.
PROBE_EVERY = 32
# Suspension score: +1 when a probed coroutine suspends, -1 when it finishes at once,
# clamped to [0, _SCORE_MAX]; task mode while the score is above _TASK_MODE_ABOVE.
_SCORE_MAX = 16
_FINISHED: Any = object()  # what the first step gives back when the coroutine ended
_TASK_MODE_ABOVE = 8


class CoroutineStarter:
    """Starts coroutines for one executor and keeps the ones that run.

    Attributes:
        tasks: the tasks running now (to wait for or cancel them at shutdown), each with
            its owner (the ``second`` argument it was started with; ``None`` for tasks
            added by the caller).
    """

    __slots__ = ("__weakref__", "_count", "_score", "tasks")

    def __init__(self) -> None:
        self.tasks: dict[asyncio.Task[Any], Any] = {}
        self._score = 0
        self._count = 0
        _STARTERS.add(self)

    @property
    def task_mode(self) -> bool:
        """Whether most recent coroutines suspended, so new ones start as plain tasks."""
        return self._score > _TASK_MODE_ABOVE

    def start(self, coro: Coroutine[Any, Any, Any], done: Done, first: Any, second: Any) -> bool:
        """Start ``coro``.

        Returns:
            ``True`` when the coroutine returned at once without raising (the common case
            of a processor that never waits): ``done`` is not called, the caller carries
            on. Otherwise ``False``, and ``done(first, second, exc_or_none)`` is called
            exactly once when the coroutine ends (before this returns if it raised at once).
        """
        score = self._score
        if score > _TASK_MODE_ABOVE:
            self._count += 1
            if self._count % PROBE_EVERY:
                # create_task copies the current context itself.
                task = asyncio.get_running_loop().create_task(coro)
                self._track(task, done, first, second)
                return False
        # Eager path: the first step runs here, in a copy of the current context.
        # next() with a default reports the end without raising StopIteration (when the
        # coroutine returns None, nothing is even created): 130 ns less than send(None).
        context = contextvars.copy_context()
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
        # It suspended: a task carries on from there, in the same context.
        loop = asyncio.get_running_loop()
        task = loop.create_task(_resume(coro, yielded), context=context)
        self._track(task, done, first, second)
        if score < _SCORE_MAX:
            self._score = score + 1
        return False

    def _track(self, task: asyncio.Task[Any], done: Done, first: Any, second: Any) -> None:
        tasks = self.tasks
        tasks[task] = second

        def finished(t: asyncio.Task[Any]) -> None:
            tasks.pop(t, None)
            done(first, second, asyncio.CancelledError() if t.cancelled() else t.exception())

        task.add_done_callback(finished)


async def _resume(coro: Coroutine[Any, Any, Any], yielded: Any) -> Any:
    return await _Continue(coro, yielded)


_STARTERS: weakref.WeakSet[CoroutineStarter] = weakref.WeakSet()


def _owner_of_current_task() -> Any:
    # The owner of the asyncio task running now, if a starter started it.
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running loop
        return None
    if task is None:
        return None
    for starter in list(_STARTERS):
        owner = starter.tasks.get(task)
        if owner is not None:
            return owner
    return None


register_task_lookup(_owner_of_current_task)


class _Continue:
    """Delegates to a coroutine that already ran its first step, as ``yield from`` would.

    The future the coroutine yielded goes up to the task unchanged (with its blocking flag
    set by the coroutine), the task's answer goes back down, and a cancellation thrown into
    the task is thrown into the coroutine; closing it closes the coroutine.
    """

    __slots__ = ("_coro", "_yielded")

    def __init__(self, coro: Coroutine[Any, Any, Any], yielded: Any) -> None:
        self._coro = coro
        self._yielded = yielded

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, yielded = self._coro, self._yielded
        while True:
            try:
                sent = yield yielded
            except GeneratorExit:  # closed (e.g. a task destroyed at loop teardown)
                coro.close()  # as yield from does: close, not throw (a no-op if done)
                raise
            except BaseException as exc:  # forwarded, as yield from does
                try:
                    yielded = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    yielded = coro.send(sent)
                except StopIteration as stop:
                    return stop.value
