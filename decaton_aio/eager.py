"""Running a processor coroutine eagerly: no scheduled task unless it suspends.

Most time in a no-op or cache-hit processor would go to creating and scheduling an
``asyncio.Task``. Here the coroutine's first step runs at once, in the caller's turn of the
loop; only a coroutine that actually suspends (awaits I/O) is handed to a task that
carries on from where it stopped. This is what Python 3.12 calls an eager task, without
the task object for the common case, and on every supported version.

Each coroutine runs in its own copy of the caller's context, so a context variable a
processor sets never leaks into the runtime or into other tasks.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Coroutine, Generator
from typing import Any

__all__ = ["start_eagerly"]

Done = Callable[[BaseException | None], None]


def start_eagerly(
    coro: Coroutine[Any, Any, Any], done: Done, tasks: set[asyncio.Task[Any]]
) -> None:
    """Run ``coro`` up to its first suspension; finish it in a task only if it suspends.

    Args:
        coro: the coroutine to run; its result is ignored.
        done: called exactly once when the coroutine ends: with ``None`` on return, with
            the exception it raised (``CancelledError`` included) otherwise. It must not
            raise.
        tasks: the set the continuation task is added to while it runs (so it can be
            awaited or cancelled, and is not garbage collected mid-flight).
    """
    context = contextvars.copy_context()
    try:
        yielded = context.run(coro.send, None)
    except StopIteration:
        done(None)
        return
    except BaseException as exc:  # the processor's own failure is the caller's to report
        done(exc)
        return
    task = asyncio.get_running_loop().create_task(_resume(coro, yielded), context=context)
    tasks.add(task)

    def finished(t: asyncio.Task[Any]) -> None:
        tasks.discard(t)
        if t.cancelled():
            done(asyncio.CancelledError())
        else:
            done(t.exception())

    task.add_done_callback(finished)


async def _resume(coro: Coroutine[Any, Any, Any], yielded: Any) -> Any:
    return await _Continue(coro, yielded)


class _Continue:
    """Delegates to a coroutine that already ran its first step, as ``yield from`` would.

    The future the coroutine yielded goes up to the task unchanged (with its blocking flag
    set by the coroutine), the task's answer goes back down, and a cancellation thrown into
    the task is thrown into the coroutine.
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
            except BaseException as exc:
                try:
                    yielded = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    yielded = coro.send(sent)
                except StopIteration as stop:
                    return stop.value
