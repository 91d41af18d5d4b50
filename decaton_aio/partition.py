"""One assigned partition: per-key lanes, the concurrency bound and the watermark.

A :class:`PartitionProcessor` lives for one assignment of one partition. Fetched records
enter in offset order through :meth:`PartitionProcessor.feed`; each is registered with the
:class:`~decaton_aio.watermark.WatermarkTracker`, then

- if an earlier record of its key is still outstanding, it waits in that key's lane
  (a deque created only while the key is busy, so an idle key costs nothing);
- otherwise it is *ready*: it starts at once when fewer than ``limit`` tasks run, or waits
  in the ready queue (FIFO) for a slot.

When a task completes, its offset is marked in the tracker, the next record of its key (if
any) becomes ready, and ready records start while slots are free. Records without a key
have no lane: they are ordered by nothing but the slots.

States: ACTIVE (starting tasks) -> DRAINING (no new starts; queued records are dropped,
they are redelivered from the committed watermark) -> CLOSED (completions are ignored, so
a task outliving a rebalance never moves a watermark the consumer no longer owns).

Caller: the event loop that owns the consumer. Nothing here is thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import time
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any, TypeAlias

import structlog
from aiokafka import TopicPartition

from decaton_aio.context import ProcessingContext
from decaton_aio.eager import start_eagerly
from decaton_aio.errors import DecodeError
from decaton_aio.metrics import PartitionStats
from decaton_aio.watermark import WatermarkTracker

__all__ = ["PartitionProcessor", "PartitionState", "TaskFunction"]

TaskFunction = Callable[[ProcessingContext, Any], Coroutine[Any, Any, Any]]
Decoder = Callable[[bytes], Any]
#: An ``aiokafka.ConsumerRecord``; aiokafka ships no type information.
Record: TypeAlias = Any

log = structlog.get_logger("decaton_aio.partition")


class PartitionState(enum.Enum):
    """Lifecycle of one partition assignment."""

    ACTIVE = "active"
    DRAINING = "draining"
    CLOSED = "closed"


class PartitionProcessor:
    """Runs the tasks of one partition assignment.

    Args:
        tp: the partition.
        subscription_id: bound into each task's logger.
        process: the user's processor, ``async def process(ctx, task)``.
        decode: turns a record value into a task; raises ``DecodeError``.
        limit: how many tasks may run at once (``decaton.partition.concurrency``).
        stats: counters the metrics endpoint reads.
        on_below_max_pending: called when pending records fall below the pause threshold
            while the partition is paused, so the consumer can resume it.
    """

    def __init__(
        self,
        tp: TopicPartition,
        *,
        subscription_id: str,
        process: TaskFunction,
        decode: Decoder,
        limit: int,
        max_pending: int,
        stats: PartitionStats,
        on_below_max_pending: Callable[[PartitionProcessor], None],
    ) -> None:
        self.tp = tp
        self.state = PartitionState.ACTIVE
        self.tracker = WatermarkTracker()
        self.stats = stats
        self.paused = False
        self.last_committed: int | None = None
        self._subscription_id = subscription_id
        self._process = process
        self._decode = decode
        self._limit = limit
        self._max_pending = max_pending
        self._on_below_max_pending = on_below_max_pending
        # key -> None (busy, nothing queued) or a deque of records waiting behind it.
        self._lanes: dict[bytes, deque[Record] | None] = {}
        self._ready: deque[Record] = deque()
        self._in_flight = 0
        self._pumping = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._idle: asyncio.Event | None = None

    # ----------------------------------------------------------------- inspection

    @property
    def in_flight(self) -> int:
        """Tasks started and not yet complete."""
        return self._in_flight

    @property
    def pending(self) -> int:
        """Records fetched and not yet complete (running, ready or waiting in a lane)."""
        return self.tracker.pending

    @property
    def limit(self) -> int:
        """The current concurrency bound."""
        return self._limit

    @property
    def active_keys(self) -> int:
        """Keys with an outstanding record (idle keys are not kept)."""
        return len(self._lanes)

    @property
    def needs_pause(self) -> bool:
        """Whether pending records reached ``max_pending``."""
        return self.tracker.pending >= self._max_pending

    def committable(self) -> int | None:
        """The offset to commit for this partition, or ``None`` if there is none yet."""
        return self.tracker.committable()

    # ---------------------------------------------------------------- live settings

    def set_limit(self, limit: int) -> None:
        """Change the concurrency bound now: a raise starts waiting tasks at once, a cut
        lets running tasks finish and starts new ones only under the new bound.

        Caller: the property listener of ``decaton.partition.concurrency``.
        """
        self._limit = limit
        self._pump()

    def set_max_pending(self, max_pending: int) -> None:
        """Change the pause threshold (``decaton.max.pending.records``)."""
        self._max_pending = max_pending
        if self.paused and self.tracker.pending < max_pending:
            self._on_below_max_pending(self)

    # ------------------------------------------------------------------- feeding

    def feed(self, records: list[Record]) -> None:
        """Take a fetch batch of this partition, in offset order.

        Caller: the fetch routine. Affects: the tracker, lanes, ready queue; starts tasks.
        """
        if self.state is not PartitionState.ACTIVE:
            return
        done = self.tracker.register_batch([r.offset for r in records])
        skip = set(done.tolist()) if done.size else None
        stats = self.stats
        stats.consumed_offset = records[-1].offset + 1
        lanes = self._lanes
        ready = self._ready
        # Completions that happen synchronously inside _start must not start other tasks
        # while this loop still hands out records in offset order.
        self._pumping = True
        try:
            for record in records:
                if skip is not None and record.offset in skip:
                    continue  # completed before a restart (checkpoint); never run twice
                key = record.key
                if key is not None:
                    if key in lanes:
                        queue = lanes[key]
                        if queue is None:
                            lanes[key] = deque((record,))
                        else:
                            queue.append(record)
                        continue
                    lanes[key] = None
                if self._in_flight < self._limit:
                    self._start(record)
                else:
                    ready.append(record)
        finally:
            self._pumping = False
        self._pump()

    def _pump(self) -> None:
        # Start ready records while slots are free. Re-entrant calls (a task that completes
        # synchronously inside _start) return at once; the outer loop carries on.
        if self._pumping:
            return
        self._pumping = True
        try:
            ready = self._ready
            while ready and self._in_flight < self._limit and self.state is PartitionState.ACTIVE:
                self._start(ready.popleft())
        finally:
            self._pumping = False

    # ------------------------------------------------------------------- running

    def _start(self, record: Record) -> None:
        self._in_flight += 1
        ctx = ProcessingContext(self._subscription_id, record)
        try:
            task = self._decode(record.value)
        except DecodeError as exc:
            self._discard(ctx, exc)
            return
        ctx.started_at = time.perf_counter()
        self.stats.delivery_latency.observe(max(0.0, time.time() - record.timestamp / 1000))
        try:
            coro = self._process(ctx, task)
        except Exception as exc:  # a processor that is not a coroutine function
            self._finish(ctx, exc)
            return
        start_eagerly(coro, lambda exc: self._finish(ctx, exc), self._tasks)

    def _discard(self, ctx: ProcessingContext, exc: DecodeError) -> None:
        self.stats.discarded += 1
        log.warning(
            "discarding a task that cannot be decoded",
            topic=ctx.topic,
            partition=ctx.partition,
            offset=ctx.offset,
            reason=exc.reason,
            part=exc.part,
        )
        self._complete(ctx.record)

    def _finish(self, ctx: ProcessingContext, exc: BaseException | None) -> None:
        elapsed = time.perf_counter() - ctx.started_at
        stats = self.stats
        stats.process_duration.observe(elapsed)
        stats.processed += 1
        if exc is not None and not isinstance(exc, asyncio.CancelledError):
            # Decaton's default: a failed task is logged, counted and completed; it never
            # stops the partition. Retry policies come on top of this.
            stats.errors += 1
            ctx.logger.error("processor failed", error=f"{type(exc).__name__}: {exc}", exc_info=exc)
        self._complete(ctx.record)

    def _complete(self, record: Record) -> None:
        if self.state is PartitionState.CLOSED:
            return  # outlived its assignment: must not move a watermark we no longer own
        self._in_flight -= 1
        self.tracker.complete(record.offset)
        key = record.key
        if key is not None:
            queue = self._lanes.get(key)
            if queue:
                nxt = queue.popleft()
                if not queue:
                    self._lanes[key] = None
                self._ready.append(nxt)
            else:
                self._lanes.pop(key, None)
        if self.paused and self.tracker.pending < self._max_pending:
            self._on_below_max_pending(self)
        if self._ready:
            self._pump()
        if self._in_flight == 0 and self._idle is not None:
            self._idle.set()

    # ------------------------------------------------------------------ stopping

    def revoke(self) -> None:
        """Stop starting tasks and drop the queued records (they are redelivered).

        Caller: the rebalance listener, before it waits for running tasks and commits.
        """
        self.state = PartitionState.DRAINING
        self._ready.clear()
        self._lanes.clear()

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no task runs. While ACTIVE that also means none waits: a completion
        starts the next waiting record before the count can reach zero.

        Returns:
            True when the partition went idle within the timeout.
        """
        # The idle event can fire in the middle of a synchronous chain of completions
        # that goes on to start more tasks: check the count again after each wake-up.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self._in_flight:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            self._idle = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), remaining)
        return True

    def close(self) -> None:
        """End the assignment: later completions are ignored.

        Tasks still running keep running (they are not cancelled, like Decaton), but they
        can no longer affect this partition's watermark.
        """
        self.state = PartitionState.CLOSED
        self._ready.clear()
        self._lanes.clear()
        if self._tasks:
            log.warning(
                "tasks still running after their partition was closed",
                topic=self.tp.topic,
                partition=self.tp.partition,
                running=len(self._tasks),
            )
