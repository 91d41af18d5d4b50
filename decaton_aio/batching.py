"""Batching: hand tasks to a processor in lists, by size or linger time.

[`BatchingProcessor`][decaton_aio.BatchingProcessor] wraps an
``async def process_batch(items)``. Each incoming task is held with a deferred completion
(so its offset is never committed while it waits) and added to the current batch of its
partition; the batch is processed when it holds ``max_size`` tasks or ``linger_s`` after its
first task arrived. Every item is completed or retried on its own: ``item.retry()`` sends
just that task to its retry topic (or dead letter topic when its attempts are used up) and
``item.fail(exc)`` fails it; items left unresolved complete when ``process_batch`` returns,
or fail with its exception when it raises (then the retry policy decides).

Key order: tasks of one key stay in offset order inside a batch; batches of one
partition run one at a time, so a key's tasks in later batches run after earlier ones.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from decaton_aio.completion import Completion
from decaton_aio.context import ProcessingContext
from decaton_aio.errors import ConfigError

__all__ = ["BatchItem", "BatchingProcessor"]

T = TypeVar("T")


@dataclass(slots=True)
class BatchItem(Generic[T]):
    """One task of a batch, resolved individually."""

    ctx: ProcessingContext
    task: T
    _completion: Completion

    @property
    def resolved(self) -> bool:
        """Whether the item was completed or retried already."""
        return self._completion.done

    def complete(self) -> None:
        """Complete this task."""
        self._completion.complete()

    def retry(self, delay_s: float | None = None) -> None:
        """Retry this task alone (queue retries), or dead-letter it when exhausted."""
        self._completion.retry(delay_s)

    def fail(self, exc: BaseException) -> None:
        """Fail this task alone: it follows the retry policy like a raised exception."""
        self._completion.fail(exc)


@dataclass(slots=True)
class _Batch:
    items: list[BatchItem[Any]] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None


class BatchingProcessor(Generic[T]):
    """Wraps a batch processor as a per-task processor.

    ```python
    async def store_all(items: list[BatchItem[Event]]) -> None:
        await db.insert_many([item.task for item in items])

    app = Application(BatchingProcessor(store_all, max_size=100, linger_s=0.05), ...)
    ```

    Args:
        process_batch: called with each batch, in arrival order.
        max_size: a batch is processed once it holds this many tasks.
        linger_s: ... or this long after its first task arrived.
    """

    def __init__(
        self,
        process_batch: Callable[[list[BatchItem[T]]], Awaitable[None]],
        *,
        max_size: int,
        linger_s: float,
    ) -> None:
        if max_size < 1:
            raise ConfigError(f"max_size must be >= 1, got {max_size}")
        if linger_s < 0:
            raise ConfigError(f"linger_s must be >= 0, got {linger_s}")
        self._process_batch = process_batch
        self._max_size = max_size
        self._linger_s = linger_s
        self._open: dict[tuple[str, int], _Batch] = {}
        # One batch at a time per partition keeps each key's order across batches.
        self._locks: dict[tuple[str, int], asyncio.Lock] = {}
        self._running: set[asyncio.Task[None]] = set()

    async def __call__(self, ctx: ProcessingContext, task: T) -> None:
        """Add the task to its partition's open batch."""
        slot = (ctx.topic, ctx.partition)
        batch = self._open.get(slot)
        if batch is None:
            batch = self._open[slot] = _Batch()
            batch.timer = asyncio.get_running_loop().call_later(self._linger_s, self._flush, slot)
        batch.items.append(BatchItem(ctx, task, ctx.deferred()))
        if len(batch.items) >= self._max_size:
            self._flush(slot)

    def _flush(self, slot: tuple[str, int]) -> None:
        batch = self._open.pop(slot, None)
        if batch is None:
            return
        if batch.timer is not None:
            batch.timer.cancel()
        lock = self._locks.setdefault(slot, asyncio.Lock())
        task = asyncio.get_running_loop().create_task(self._run(lock, batch.items))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _run(self, lock: asyncio.Lock, items: Sequence[BatchItem[T]]) -> None:
        async with lock:
            try:
                await self._process_batch(list(items))
            except Exception as exc:
                # Each unresolved item fails on its own and follows the retry policy.
                for item in items:
                    if not item.resolved:
                        item.fail(exc)
                return
            for item in items:
                if not item.resolved:
                    item.complete()
