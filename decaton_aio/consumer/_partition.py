"""One assigned partition: per-key lanes, the concurrency bound, pacing and the watermark.

A `PartitionProcessor` lives for one assignment of one partition. Fetched records
enter in offset order through `PartitionProcessor.feed()`; each is registered with the
`WatermarkTracker`, then

- if an earlier record of its key is still outstanding, it waits in that key's lane
  (created only while the key is busy, so an idle key costs nothing);
- otherwise it is *ready*: it waits in the ready queue (FIFO) for a slot (fewer than
  ``limit`` tasks running) and, when a rate is set, for a token of the partition's bucket.

The executor runs a started record and reports back (the contract is in
`decaton_aio.consumer._contract`) with one of: `finish()`
(done), `release()` then
`finish_released()` (the slot and lane are free now, the offset
completes later: deferred completion, a retry or dead letter being sent), or
`postpone()` (the slot is free, the lane stays taken, the record
runs again after a delay: scheduled tasks and in-place retries). Waiting never holds a
slot, so a waiting key never blocks other keys.

States: ACTIVE (starting tasks) -> DRAINING (no new starts; queued and postponed records
are dropped, they are redelivered from the committed watermark) -> CLOSED (completions
are ignored, so a task outliving a rebalance never moves a watermark the consumer no
longer owns).

Caller: the event loop that owns the consumer. Nothing here is thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections import deque
from collections.abc import Callable, Collection
from time import monotonic
from typing import TYPE_CHECKING, Any, Final, TypeAlias

import structlog
from aiokafka import TopicPartition

from decaton_aio.consumer._ratelimit import TokenBucket
from decaton_aio.consumer._records import TaskRecord, task_record
from decaton_aio.consumer._watermark import WatermarkTracker
from decaton_aio.metrics import PartitionStats
from decaton_aio.typing import Record

if TYPE_CHECKING:
    from decaton_aio._histogram import FastHistogram
    from decaton_aio.consumer._contract import OutputSink
    from decaton_aio.consumer._execution import TaskExecutor
    from decaton_aio.consumer._hotkeys import HotKeyDetector
    from decaton_aio.state import LocalCopy

__all__ = ["PartitionProcessor", "PartitionState", "PendingBytes"]

log = structlog.get_logger("decaton_aio.consumer")


_Lane: TypeAlias = list[TaskRecord] | deque[TaskRecord]
_SHORT_LANE: Final = 32  # a lane turns from a list into a deque at this many waiting records
# Lane and slot waits are observed for records whose offset has these bits clear: one in
# 16, so measuring costs nothing noticeable per task.
_WAIT_SAMPLE: Final = 15


class PendingBytes:
    """The bytes (values) of the records pending in all partitions of one subscription,
    against ``decaton.max.pending.bytes.total``.

    Callers: every partition of the subscription adds what it is fed and takes away what
    completes (on the event loop); once the total falls below the limit again, the paused
    partitions are asked to resume (`wake()`).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._partitions: set[PartitionProcessor] = set()

    @property
    def full(self) -> bool:
        """Whether the pending records hold the limit or more."""
        return self.used >= self.limit

    def join(self, partition: PartitionProcessor) -> None:
        """``partition`` takes part (from its creation to its close)."""
        self._partitions.add(partition)

    def leave(self, partition: PartitionProcessor, held: int) -> None:
        """``partition`` closed holding ``held`` bytes: they no longer count."""
        self._partitions.discard(partition)
        self.release(held)

    def release(self, nbytes: int) -> None:
        """``nbytes`` were completed; wake the paused partitions if that made room."""
        was_full = self.used >= self.limit
        self.used -= nbytes
        if was_full and self.used < self.limit:
            self.wake()

    def set_limit(self, limit: int) -> None:
        """Change the limit (a live property); a raise may make room."""
        self.limit = limit
        self.wake()

    def wake(self) -> None:
        """Ask every paused partition to resume (each resumes only if nothing else
        holds it)."""
        for partition in list(self._partitions):
            partition.maybe_resume()


class PartitionState(enum.Enum):
    """Lifecycle of one partition assignment."""

    ACTIVE = "active"
    DRAINING = "draining"
    CLOSED = "closed"


class PartitionProcessor:
    """Schedules the tasks of one partition assignment.

    Args:
        tp: the partition.
        executor: runs started records and reports their outcome back.
        limit: how many tasks may run at once (``decaton.partition.concurrency``).
        max_pending: pause threshold (``decaton.max.pending.records``).
        max_pending_bytes: pause threshold in bytes of record values
            (``decaton.max.pending.bytes``).
        pending_bytes: the subscription's total of pending bytes and its limit
            (``decaton.max.pending.bytes.total``); the partition pauses while it is full.
        rate: tasks started per second (-1 unlimited, 0 paused).
        stats: counters the metrics endpoint reads.
        on_below_max_pending: called when pending records fall below the pause threshold
            while the partition is paused, so the consumer can resume it.
        ignore_keys: keys whose records are skipped and completed at once.
        hot_keys: detects keys over their quota; their records are handed to the
            executor for shaping instead of being run here.

    Attributes:
        outputs: where the outputs of this partition's tasks go (the partition's
            transaction with exactly-once); the executor's default when ``None``.
        first_offset: the first offset fed to this assignment, ``None`` before any.
    """

    def __init__(
        self,
        tp: TopicPartition,
        *,
        executor: TaskExecutor,
        limit: int,
        max_pending: int,
        stats: PartitionStats,
        on_below_max_pending: Callable[[PartitionProcessor], None],
        rate: int = -1,
        ignore_keys: Collection[bytes] = (),
        hot_keys: HotKeyDetector | None = None,
        max_pending_bytes: int = 1 << 62,
        pending_bytes: PendingBytes | None = None,
    ) -> None:
        self.tp = tp
        self.state = PartitionState.ACTIVE
        self.tracker = WatermarkTracker()
        self._mark = self.tracker.mark  # completes an offset: one C-level append
        self._pending = 0  # registered offsets not completed yet (each completes once)
        self.stats = stats
        self._paused = False
        self._last_committed: int | None = None
        # Typed as the executor's class, not a protocol: compiled, a call through a
        # protocol looks the method up (and binds it) for every record.
        self._executor = executor
        self._limit = limit
        self._max_pending = max_pending
        self._bytes = 0  # the values of the pending records
        self._max_bytes = max_pending_bytes
        self._total = pending_bytes if pending_bytes is not None else PendingBytes(1 << 62)
        self._total.join(self)
        self._on_below_max_pending = on_below_max_pending
        self._bucket = TokenBucket(rate) if rate != -1 else None
        self._ignore = frozenset(ignore_keys)
        self.hot_keys = hot_keys
        self.outputs: OutputSink | None = None
        self.first_offset: int | None = None
        # One past the last offset the consumer handed out for this assignment, taken or
        # not: the watermark may skip past the fetch position only when every record
        # handed out was taken (see skip_to).
        self._received = 0
        # key -> None (busy, nothing queued) or the records waiting behind it: a list while
        # short (a deque costs 632 bytes even for one record), a deque once longer.
        self._lanes: dict[bytes, _Lane | None] = {}
        self._ready: deque[TaskRecord] = deque()
        self._in_flight = 0
        self._awaiting = 0  # released records whose offset completes later
        self._pumping = False
        self._timers: set[asyncio.TimerHandle] = set()
        self._pump_timer: asyncio.TimerHandle | None = None
        self._idle: asyncio.Event | None = None
        self._attempts: dict[int, int] = {}  # in-place retries: offset -> next attempt
        #: The local copy of the partition's state (``ctx.state``), when the app has one.
        self.store: LocalCopy | None = None
        #: The type ``ctx.state.get`` decodes values as (``None``: plain values).
        self.store_type: Any = None

    # ----------------------------------------------------------------- inspection

    @property
    def closed(self) -> bool:
        """Whether the assignment ended: completions are ignored from now on."""
        return self.state is PartitionState.CLOSED

    @property
    def paused(self) -> bool:
        """Whether the consumer stopped fetching this partition (back-pressure)."""
        return self._paused

    @property
    def last_committed(self) -> int | None:
        """The offset last committed for this partition, ``None`` before the first."""
        return self._last_committed

    @property
    def in_flight(self) -> int:
        """Tasks started and not yet released."""
        return self._in_flight

    @property
    def pending(self) -> int:
        """Records fetched and not yet complete (running, waiting, or being handed off)."""
        return self._pending

    @property
    def limit(self) -> int:
        """The current concurrency bound."""
        return self._limit

    @property
    def active_keys(self) -> int:
        """Keys with an outstanding record (idle keys are not kept)."""
        return len(self._lanes)

    @property
    def pending_bytes(self) -> int:
        """Bytes of the values of the pending records."""
        return self._bytes

    @property
    def needs_pause(self) -> bool:
        """Whether pending records reached ``max_pending`` or ``max_pending_bytes``, the
        subscription's pending bytes their total limit, or the rate is 0."""
        return (
            self._pending >= self._max_pending
            or self._bytes >= self._max_bytes
            or self._total.full
            or self.rate_paused
        )

    @property
    def rate_paused(self) -> bool:
        """Whether the rate is 0: nothing may start, the consumer should not fetch."""
        return self._bucket is not None and self._bucket.paused

    def committable(self) -> int | None:
        """The offset to commit for this partition, or ``None`` if there is none yet."""
        return self.tracker.committable()

    def export_completed(self) -> tuple[int, bytes] | None:
        """The offset to commit and the bitmap of what is done above it (a checkpoint),
        ``None`` before the partition has a position.

        Caller: the committer, with checkpoints on.
        """
        return self.tracker.export_completed()

    def import_completed(self, base: int, bitmap: bytes) -> None:
        """Take a checkpoint in: offsets it marks done are finished when fetched, not run.

        Caller: the committer at assignment, and a rewind, before the first record.
        """
        self.tracker.import_completed(base, bitmap)

    def fold_stats(self) -> tuple[FastHistogram, ...]:
        """Bring the partition's pending gauges up to date; return its histograms, whose
        observation queues the caller folds (which keeps them short).

        Caller: the committer, once per commit round.
        """
        stats = self.stats
        stats.pending = self._pending
        stats.pending_bytes = self._bytes
        return stats.histograms

    def receive(self, end: int) -> None:
        """Note that the consumer handed out this partition's records up to ``end`` (one
        past the last offset), before they are fed: records handed out and not taken (a
        batch still being fed, or dropped because the partition is draining) keep
        `skip_to()` from passing them.

        Caller: the fetch routine, for every batch as the consumer returns it (before
        its first step), and for a fresh partition that replaces one in a batch.
        """
        if end > self._received:
            self._received = end

    def skip_to(self, position: int) -> bool:
        """Let the watermark pass offsets the consumer skipped, when nothing is pending
        and every record the consumer handed out was taken.

        Caller: the committer, with the consumer's fetch position.
        Affects: `committable()` (see ``WatermarkTracker.skip_to``).

        Returns:
            Whether the watermark moved.
        """
        if self._pending or self._received > (self.tracker.next_offset or 0):
            return False  # a record handed out was not taken: never commit past it
        return self.tracker.skip_to(position)

    def set_paused(self, paused: bool) -> None:
        """Record that the consumer paused (or resumed) fetching this partition.

        Caller: the subscription, with its ``consumer.pause`` / ``resume`` call.
        Affects: `paused`, the paused metric, whether completions ask to resume.
        """
        self._paused = paused
        self.stats.set_paused(paused)

    def committed(self, offset: int) -> None:
        """Record a successful commit of ``offset``.

        Caller: the committer. Affects: `last_committed`, the metrics (the
        committed offset, and the commit is up to date).
        """
        self._last_committed = self.stats.committed_offset = offset
        self.stats.commit_current()

    def up_to_date(self) -> None:
        """Record that a commit round found nothing new to commit.

        Caller: the committer. Affects: the commit age metric.
        """
        self.stats.commit_current()

    def run_again(self, record: Record, attempt: int, delay_s: float) -> None:
        """Run ``record`` again, as run number ``attempt``, after ``delay_s`` in its lane.

        Caller: the executor (an in-place retry; a scheduled task not due yet).
        Affects: as `postpone()`.
        """
        if attempt > 1:
            self._attempts[record.offset] = attempt
        self.postpone(record, delay_s)

    # ---------------------------------------------------------------- live settings

    def set_limit(self, limit: int) -> None:
        """Change the concurrency bound now: a raise starts waiting tasks at once, a cut
        lets running tasks finish and starts new ones only under the new bound."""
        self._limit = limit
        self._pump()

    def set_max_pending(self, max_pending: int) -> None:
        """Change the pause threshold (``decaton.max.pending.records``)."""
        self._max_pending = max_pending
        self.maybe_resume()

    def set_max_pending_bytes(self, max_pending_bytes: int) -> None:
        """Change the pause threshold in bytes (``decaton.max.pending.bytes``)."""
        self._max_bytes = max_pending_bytes
        self.maybe_resume()

    def set_rate(self, rate: int) -> None:
        """Change the rate (tasks/s; -1 unlimited, 0 paused) without losing queued work."""
        if rate == -1:
            self._bucket = None
        elif self._bucket is None:
            self._bucket = TokenBucket(rate)
        else:
            self._bucket.set_rate(rate)
        self.maybe_resume()
        self._pump()

    def set_ignore_keys(self, keys: Collection[bytes]) -> None:
        """Change the keys whose records are skipped (``decaton.ignore.keys``)."""
        self._ignore = frozenset(keys)

    # ------------------------------------------------------------------- feeding

    def feed(self, records: list[Record]) -> bool:
        """Take a fetch batch of this partition, in offset order.

        Caller: the fetch routine. Affects: the tracker, lanes, ready queue; starts tasks.

        Returns:
            ``False``, taking nothing, when the batch starts below offsets already taken
            (the consumer's position went back: a reset, a seek, a recreated topic): the
            caller replaces this partition's state with a fresh one.
        """
        if self.state is not PartitionState.ACTIVE:
            # Draining: dropped, and redelivered from the last commit (the fetch routine
            # noted the batch with receive(), so no commit passes it).
            return True
        expected = self.tracker.next_offset
        if expected is not None and records[0].offset < expected:
            return False
        if self.first_offset is None:
            self.first_offset = records[0].offset
        tasks = [task_record(r) for r in records]  # each field read once, here
        done = self.tracker.register_batch([t.offset for t in tasks])
        skip = set(done.tolist()) if done.size else None
        stats = self.stats
        stats.fed()
        stats.consumed += len(tasks)
        stats.consumed_offset = tasks[-1].offset + 1
        self._pending += len(tasks) - done.size
        if not self._pending:
            stats.starving()  # every record was completed before (a checkpoint)
        lanes = self._lanes
        ready = self._ready
        ignore = self._ignore
        hot_keys = self.hot_keys
        bucket = self._bucket
        executor = self._executor
        now = monotonic()  # when the records that wait start waiting
        total = self._total
        for record in tasks:
            if skip is not None and record.offset in skip:
                continue  # completed before a restart (checkpoint); never run twice
            size = record.size
            if size:
                self._bytes += size
                total.used += size
            key = record.key
            if key is not None:
                if ignore and key in ignore:
                    stats.discarded += 1
                    self._settle(record, True, False, False)
                    continue
                if hot_keys is not None and hot_keys.observe(key):
                    executor.shape(self, record)  # hands it off: no slot, no lane
                    continue
                if key in lanes:
                    record.queued_at = now
                    queue = lanes[key]
                    if queue is None:
                        lanes[key] = [record]
                    else:  # waiting records of a key share one key object
                        record.key = queue[0].key
                        queue.append(record)
                        if len(queue) == _SHORT_LANE and type(queue) is list:
                            lanes[key] = deque(queue)  # long lanes pop in O(1)
                    continue
                lanes[key] = None
            if ready or bucket is not None or self._in_flight >= self._limit:
                record.queued_at = now
                ready.append(record)
            else:
                # Nothing waits and a slot is free: start it here, skipping the queue.
                self._in_flight += 1
                executor.start(self, record, 1)  # only a record run again has a later attempt
        self._settle(None, False, False, False)
        return True

    def _pump(self) -> None:
        # Start ready records while slots (and tokens) are free. Re-entrant calls (a task
        # that completes synchronously inside start) return at once; the outer loop goes on.
        if self._pumping:
            return
        self._pumping = True
        try:
            ready = self._ready
            executor = self._executor
            bucket = self._bucket
            waited = self.stats.slot_wait.observe
            now = 0.0  # read at the first sampled start
            while ready and self._in_flight < self._limit and self.state is PartitionState.ACTIVE:
                if bucket is not None:
                    if bucket.paused:
                        return  # rate 0: a rate change pumps again
                    wait_s = bucket.try_acquire()
                    if wait_s > 0:
                        self._pump_later(wait_s)
                        return
                self._in_flight += 1
                record = ready.popleft()
                if not record.offset & _WAIT_SAMPLE:
                    now = now or monotonic()
                    waited(now - record.queued_at)
                attempts = self._attempts
                executor.start(self, record, attempts.pop(record.offset, 1) if attempts else 1)
        finally:
            self._pumping = False

    def _pump_later(self, wait_s: float) -> None:
        if self._pump_timer is not None:
            return  # a pump is already due
        self.stats.throttled_s += wait_s

        def fire() -> None:
            self._pump_timer = None
            self._pump()

        self._pump_timer = asyncio.get_running_loop().call_later(wait_s, fire)

    # ---------------------------------------------------------- executor callbacks

    def release(self, record: Record) -> None:
        """Free the record's slot and lane now; its offset completes later through
        `finish_released()` (deferred completion, a retry or dead letter in flight).
        """
        if self.state is PartitionState.CLOSED:
            return
        self._awaiting += 1
        self._settle(record, False)

    def hand_off(self, record: Record) -> None:
        """Like `release()` for a record that took no slot and no lane."""
        if self.state is not PartitionState.CLOSED:
            self._awaiting += 1

    def finish_released(self, record: Record) -> None:
        """Complete the offset of a record released earlier."""
        if self.state is PartitionState.CLOSED:
            return
        self._awaiting -= 1
        self._settle(record, True, False, False)

    def postpone(self, record: Record, delay_s: float) -> None:
        """Free the record's slot but keep its key lane; run it again after ``delay_s``.

        Only this key waits: other keys use the freed slot at once.
        """
        if self.state is PartitionState.CLOSED:
            return
        loop = asyncio.get_running_loop()
        handle: asyncio.TimerHandle | None = None
        again = task_record(record)

        def due() -> None:
            self._timers.discard(handle)
            if self.state is PartitionState.ACTIVE:
                # Its lane waited: it goes first.
                again.queued_at = monotonic()
                self._ready.appendleft(again)
                self._pump()

        handle = loop.call_later(delay_s, due)
        self._timers.add(handle)
        self._settle(record, False, True, False)  # the slot only: the lane stays taken

    def _settle(
        self, record: Record | None, finish: bool = True, slot: bool = True, lane: bool = True
    ) -> None:
        # The bookkeeping of every change, in one place: finish the record (complete its
        # offset; each registered offset once), free its slot, free its key's lane (the key's
        # next record becomes ready, or the key is idle again); then resume the consumer,
        # start what is ready, and wake a drain that waits for the partition to go idle.
        # A closed partition ignores it all: a task that outlived its assignment must not
        # move a watermark the consumer no longer owns.
        if self.state is PartitionState.CLOSED:
            return
        if record is not None:
            task = task_record(record)  # what the partition was fed (the executor's record)
            if finish:
                self._pending -= 1
                self._mark(task.offset)
                size = task.size
                if size:
                    self._bytes -= size
                    self._total.release(size)
                if not self._pending:
                    self.stats.starving()  # nothing left: it waits for records
            if slot:
                self._in_flight -= 1
            if lane:
                key = task.key
                if key is not None:
                    lanes = self._lanes
                    queue = lanes.get(key)
                    if queue:
                        # The key's next record is ready (waiting for a slot from now);
                        # the key stays busy.
                        waiting = queue.popleft() if isinstance(queue, deque) else queue.pop(0)
                        if not waiting.offset & _WAIT_SAMPLE:
                            now = monotonic()
                            self.stats.lane_wait.observe(now - waiting.queued_at)
                            waiting.queued_at = now  # waits for a slot from now
                        self._ready.append(waiting)
                        if not queue:
                            lanes[key] = None
                    else:
                        lanes.pop(key, None)  # the key is idle again
        if self._paused:
            self.maybe_resume()
        if self._ready:
            self._pump()
        if self._idle is not None and self._in_flight == 0 and self._awaiting == 0:
            self._idle.set()

    def finish(self, record: Record) -> None:
        """The record's task is done: complete its offset, free its slot and lane."""
        self._settle(record, True, True, True)

    def maybe_resume(self) -> None:
        """Ask the consumer to resume this partition when it is paused and nothing holds
        it any more. Callers: completions here, live settings, `PendingBytes`."""
        if self._paused and not self.needs_pause and self.state is not PartitionState.CLOSED:
            self._on_below_max_pending(self)

    # ------------------------------------------------------------------ stopping

    def revoke(self) -> None:
        """Stop starting tasks and drop queued and postponed records (redelivered later).

        Caller: the rebalance listener, before it waits for running tasks and commits.
        A closed partition stays closed.
        """
        if self.state is PartitionState.CLOSED:
            return
        self.state = PartitionState.DRAINING
        self._drop_queued()

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no task runs and no released offset awaits its completion. While
        ACTIVE that also means none waits: a completion starts the next waiting record
        before the count can reach zero.

        Returns:
            True when the partition went idle within the timeout.
        """
        # The idle event can fire in the middle of a synchronous chain of completions
        # that goes on to start more tasks: check the counts again after each wake-up.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while (self._in_flight or self._awaiting) and self.state is not PartitionState.CLOSED:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            # One event for every waiter (a shutdown and a revoke can wait together).
            if self._idle is None or self._idle.is_set():
                self._idle = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._idle.wait()
        return True

    def close(self) -> None:
        """End the assignment: later completions are ignored.

        Tasks still running keep running (they are not cancelled, like Decaton), but they
        can no longer affect this partition's watermark.
        """
        self.state = PartitionState.CLOSED
        self._drop_queued()
        held, self._bytes = self._bytes, 0
        self._total.leave(self, held)  # completions are ignored from now on
        if self._idle is not None:
            self._idle.set()  # waiters stop waiting: completions no longer count
        if self._in_flight or self._awaiting:
            log.warning(
                "tasks still running after their partition was closed",
                topic=self.tp.topic,
                partition=self.tp.partition,
                running=self._in_flight,
                awaiting_completion=self._awaiting,
            )

    def _drop_queued(self) -> None:
        self._ready.clear()
        self._lanes.clear()
        self._attempts.clear()
        for handle in self._timers:
            handle.cancel()
        self._timers.clear()
        if self._pump_timer is not None:
            self._pump_timer.cancel()
            self._pump_timer = None
