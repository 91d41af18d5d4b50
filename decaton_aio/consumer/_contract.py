"""The contract between a partition and the executor that runs its tasks.

A `PartitionProcessor` grants a record a slot and
calls its executor's ``start`` (`TaskExecutor`);
the executor reports the outcome back through `TaskHost`, exactly once per record:

- `TaskHost.finish()`: done; the slot and the key lane are freed and the offset
  completes;
- `TaskHost.release()`, later `TaskHost.finish_released()`: the slot and lane
  are freed now, the offset completes when what replaces the task is durable (deferred
  completion, a retry or dead letter record being sent);
- `TaskHost.postpone()` (or `TaskHost.run_again()`, which also counts the run):
  the slot is freed, the lane stays taken, the record runs again after a delay
  (scheduled tasks, in-place retries).

A record the partition hands to the executor's ``shape`` took neither slot nor lane: the
executor calls `TaskHost.hand_off()`, then `TaskHost.finish_released()`.
Once the partition is closed, every call is ignored.

One word for done: a record is *finished* when its task is done and its offset may be
committed (``finish``, ``finish_released``; the executor's ``_finish``). A processor that
returned or raised has *ended*; what that means (finish, defer, retry, dead letter) is
decided once, by ``consumer/_outcome.py``.

Caller: both sides, on the event loop that owns the consumer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from aiokafka import TopicPartition

from decaton_aio._histogram import FastHistogram
from decaton_aio.context import OutputRecord, ProcessingContext, TaskSource
from decaton_aio.state import KeyState
from decaton_aio.typing import Record

__all__ = ["Committable", "OutputSink", "StateWriter", "TaskHost"]


class TaskHost(TaskSource, Protocol):
    """The partition, as the executor sees it: what its tasks' contexts read
    (`TaskSource`: ``tp``, ``stats``, ``store``,
    ``store_type``, ``closed``), and the calls that report their outcomes. A wrapper of a partition
    (the traced executor's host) forwards all of it."""

    @property
    def outputs(self) -> OutputSink | None:
        """Where its tasks' outputs go (the partition's transaction with exactly-once);
        ``None``: the executor's default sink."""
        ...

    def finish(self, record: Record) -> None: ...
    def release(self, record: Record) -> None: ...
    def hand_off(self, record: Record) -> None: ...
    def finish_released(self, record: Record) -> None: ...
    def postpone(self, record: Record, delay_s: float) -> None: ...
    def run_again(self, record: Record, attempt: int, delay_s: float) -> None: ...


class OutputSink(Protocol):
    """Where a partition's outputs go."""

    async def deliver(
        self, partition: TaskHost, record: Record, outputs: Sequence[OutputRecord]
    ) -> None:
        """Make ``outputs`` safe, then ``partition.finish_released(record)``; raise
        (completing nothing) when they could not be."""
        ...


class StateWriter(Protocol):
    """Where a task's ``ctx.state`` change goes before the task completes."""

    async def write_task(
        self, partition: TaskHost, ctx: ProcessingContext, state: KeyState, then: Callable[[], None]
    ) -> None:
        """Make the change safe for the task's completion, then call ``then()`` (which
        completes the task); never call it when the partition closed first."""
        ...


class Committable(Protocol):
    """A partition as the committer sees it: what to commit, and what was committed.

    The committer reads a snapshot (`committable()`, or `export_completed()` with
    checkpoints), lets the watermark pass offsets the consumer skipped
    (`skip_to()`), records a commit (`committed()`, or `up_to_date()` when
    there was nothing new) and, at assignment, imports a checkpoint
    (`import_completed()`). Nothing else of a partition is its business.
    """

    tp: TopicPartition

    @property
    def closed(self) -> bool:
        """Whether the assignment ended (nothing is committed for it any more)."""
        ...

    @property
    def pending(self) -> int:
        """Records fetched and not yet finished."""
        ...

    @property
    def last_committed(self) -> int | None:
        """The offset last committed, ``None`` before the first commit."""
        ...

    @property
    def first_offset(self) -> int | None:
        """The first offset fed to this assignment, ``None`` before any."""
        ...

    def committable(self) -> int | None:
        """The offset to commit, ``None`` before the partition has a position."""
        ...

    def export_completed(self) -> tuple[int, bytes] | None:
        """The offset to commit with the bitmap of what is done above it."""
        ...

    def import_completed(self, base: int, bitmap: bytes) -> None:
        """Take a checkpoint in: the offsets it marks done are not run again."""
        ...

    def skip_to(self, position: int) -> bool:
        """Let the watermark pass offsets the consumer skipped; whether it moved."""
        ...

    def committed(self, offset: int) -> None:
        """Record that ``offset`` was committed."""
        ...

    def up_to_date(self) -> None:
        """Record that a commit round found nothing new to commit."""
        ...

    def fold_stats(self) -> Sequence[FastHistogram]:
        """Bring the partition's gauges up to date (once per commit round); return its
        histograms, whose queued observations the caller folds (one at a time, so a
        busy partition's fold does not hold the event loop in one piece)."""
        ...
