"""Task compaction: of a key's tasks within a time window, process only the one kept.

For example, an influencer gets thousands of follow/unfollow events a second; the
count only needs the latest state. [`CompactingProcessor`][decaton_aio.CompactingProcessor]
wraps a processor. Each task is held (with a deferred completion, so its offset is never
committed while it waits) until its key's window ends; a task of the same key arriving
meanwhile is compared with the held one by the user's compactor, which keeps the left (held)
task, the right (new) task, or neither (then the held one is processed at once and the new
one opens a window). The dropped task completes without running and counts as a compaction.
When the window ends, the kept task runs through the wrapped processor, after the key's
previous survivor finished: one task of a key runs at a time, as without compaction.

A held task is pending: a crash before its window ends redelivers every task of the
window, and they are compacted again. So does the end of its partition's assignment (a
revoke, a restart of the partition): a held task of an ended assignment is dropped, never
compared with the tasks of the next assignment nor run.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import structlog

from decaton_aio.completion import Completion
from decaton_aio.context import ProcessingContext, TaskFunction
from decaton_aio.errors import ConfigError

__all__ = ["CompactedTask", "CompactingProcessor", "CompactionChoice"]

T = TypeVar("T")

log = structlog.get_logger("decaton_aio.compaction")


class CompactionChoice(enum.Enum):
    """What a compactor decides for two tasks of one key."""

    PICK_LEFT = "pick_left"  # keep the held (earlier) task, drop the new one
    PICK_RIGHT = "pick_right"  # keep the new task, drop the held one
    NO_COMPACTION = "no_compaction"  # keep both: process the held one now


@dataclass(frozen=True, slots=True)
class CompactedTask(Generic[T]):
    """A task with its context, as a compactor sees it."""

    ctx: ProcessingContext
    task: T


@dataclass(slots=True)
class _Held:
    ctx: ProcessingContext
    task: Any
    completion: Completion
    timer: asyncio.TimerHandle | None = None


class CompactingProcessor(Generic[T]):
    """Wraps a processor so each key's tasks are compacted over ``window_s``.

    ```python
    def latest(left, right):
        return CompactionChoice.PICK_RIGHT

    app = Application(CompactingProcessor(process, latest, window_s=0.5), topics=...)
    ```

    Args:
        processor: the wrapped ``async def process(ctx, task)``; runs kept tasks.
        compactor: ``(held, new) -> CompactionChoice``.
        window_s: how long a key's first task waits for others to compact with it.
    """

    def __init__(
        self,
        processor: TaskFunction,
        compactor: Callable[[CompactedTask[T], CompactedTask[T]], CompactionChoice],
        *,
        window_s: float,
    ) -> None:
        if window_s <= 0:
            raise ConfigError(f"window_s must be > 0, got {window_s}")
        self._processor = processor
        self._compactor = compactor
        self._window_s = window_s
        self._held: dict[tuple[str, int, bytes | None], _Held] = {}
        # The last survivor run of each key still going: the next one waits for it.
        self._running: dict[tuple[str, int, bytes | None], asyncio.Task[None]] = {}

    @property
    def holding(self) -> int:
        """Tasks held in open windows."""
        return len(self._held)

    async def __call__(self, ctx: ProcessingContext, task: T) -> None:
        """Hold the task in its key's window (or compact it with the one held)."""
        completion = ctx.deferred()
        slot = (ctx.topic, ctx.partition, ctx.key)
        held = self._held.get(slot)
        if held is not None and held.ctx.assignment_ended:
            self._drop(slot)  # its record comes again, to this assignment
            held = None
        if held is not None:
            choice = self._compactor(CompactedTask(held.ctx, held.task), CompactedTask(ctx, task))
            if choice is CompactionChoice.PICK_LEFT:
                self._count(ctx)
                completion.complete()
                return
            if choice is CompactionChoice.PICK_RIGHT:
                self._count(ctx)
                held.completion.complete()
                held.ctx, held.task, held.completion = ctx, task, completion
                return
            self._flush(slot)  # NO_COMPACTION: the held task runs now, this one waits
        held = _Held(ctx, task, completion)
        held.timer = asyncio.get_running_loop().call_later(self._window_s, self._flush, slot)
        self._held[slot] = held

    @staticmethod
    def _count(ctx: ProcessingContext) -> None:
        ctx.stats.compactions += 1

    def _drop(self, slot: tuple[str, int, bytes | None]) -> _Held | None:
        held = self._held.pop(slot, None)
        if held is not None and held.timer is not None:
            held.timer.cancel()
        return held

    def _flush(self, slot: tuple[str, int, bytes | None]) -> None:
        held = self._drop(slot)
        if held is None or held.ctx.assignment_ended:
            return
        previous = self._running.get(slot)
        task = asyncio.get_running_loop().create_task(self._run(held, previous))
        self._running[slot] = task

        def ended(done: asyncio.Task[None]) -> None:
            if self._running.get(slot) is done:
                del self._running[slot]

        task.add_done_callback(ended)

    async def _run(self, held: _Held, previous: asyncio.Task[None] | None) -> None:
        if previous is not None:
            await asyncio.wait([previous])  # the key's earlier survivor first
        try:
            await self._processor(held.ctx, held.task)
        except Exception as exc:
            # The task's own outcome routing ran when it was held; a failure of the kept
            # task follows the retry policy through its completion.
            held.completion.fail(exc)
            return
        if held.ctx.retry_delay_s is not None:
            held.completion.retry(None if held.ctx.retry_delay_s < 0 else held.ctx.retry_delay_s)
        else:
            held.completion.complete()
