"""The partitions a subscription holds: their lifecycle, and whether each is fetched.

An `Assignment` owns the live ``PartitionProcessor`` of every partition assigned to
one subscription. It makes a fresh one per assignment (`new()`), imports
its checkpoint before any record reaches it (`load()`), replaces it when
its state must start again (`restart()` when the fetch position went back,
`rewind()` when a transaction failed), stops it when its topic is gone
(`gone()`) and closes it (`close()`; every
one for good when the subscription stops, `close_all()`).
Reloadable settings reach every live partition the moment they change
(`follow()`).

Fetching is decided in one place. A partition is not fetched while one of these holds,
checked in this order (the first one found is its `Hold`):

- ``STOPPED``: stopped here (its topic was deleted); it waits for the rebalance that
  takes it away;
- ``LOADING``: its checkpoint is being imported (with exactly-once, once its previous
  owner's transactions ended): a record fetched now would run again;
- ``RESTORING``: its state is being restored;
- ``BACK_PRESSURE``: its pending records reached ``decaton.max.pending.records``, or its
  rate is 0.

`Assignment.update()` asks a partition what holds it, and calls the fetcher's
``pause`` or ``resume`` only when the answer changes: it is the only caller of either.
Callers: the fetch routine (after feeding a partition), a partition whose pending records
fell below the threshold, the state store when a restore ends, a live property change,
and the lifecycle methods here. `Assignment.hold()` says why a partition is not
fetched (``None``: it is).

Caller: the subscription's event loop. Nothing here is thread-safe.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence

import structlog
from aiokafka import TopicPartition

from decaton_aio.consumer._assigned import PartitionFetcher
from decaton_aio.consumer._partition import PartitionProcessor, PartitionState, PendingBytes
from decaton_aio.consumer.commit import Checkpoint, Committer
from decaton_aio.properties import (
    IGNORE_KEYS,
    MAX_PENDING_BYTES,
    MAX_PENDING_BYTES_TOTAL,
    MAX_PENDING_RECORDS,
    PARTITION_CONCURRENCY,
    PER_KEY_QUOTA_PROCESSING_RATE,
    PROCESSING_RATE_PER_PARTITION,
    SHAPING_RATE_PER_PARTITION,
    Properties,
)
from decaton_aio.retry import SideTopics

__all__ = ["Assignment", "Hold", "key_set"]

log = structlog.get_logger("decaton_aio.consumer")


class Hold(enum.Enum):
    """Why a partition is not fetched."""

    STOPPED = "stopped"
    LOADING = "loading"
    RESTORING = "restoring"
    BACK_PRESSURE = "back-pressure"


class Assignment:
    """The live partitions of one subscription.

    Args:
        make: builds the processor of a newly assigned partition (its settings, stats and
            state store); it calls back `update()` when its pending records fall.
        committer: prepares new processors, imports checkpoints and hands a rewound
            partition's commit state over.
        restoring: ``restoring(partition_number)``: whether that partition's state is
            still being restored (always ``False`` without a state store).
        retire: ``retire(tp)`` stops exporting a closed partition's gauges.

    Attributes:
        partitions: the partitions fed now, with their processors (loading ones join once
            their checkpoint is in).
    """

    def __init__(
        self,
        *,
        make: Callable[[TopicPartition], PartitionProcessor],
        committer: Committer[PartitionProcessor],
        restoring: Callable[[int], bool],
        retire: Callable[[TopicPartition], None],
    ) -> None:
        self._make = make
        self._committer = committer
        self._restoring = restoring
        self._retire = retire
        self.partitions: dict[TopicPartition, PartitionProcessor] = {}
        self._loading: dict[TopicPartition, PartitionProcessor] = {}
        self._held: dict[TopicPartition, Hold] = {}  # what the fetcher pauses, and why
        self._consumer: PartitionFetcher | None = None
        self._ended = False  # close_all(): nothing goes live any more

    def attach(self, fetcher: PartitionFetcher) -> None:
        """Use ``fetcher`` for assigning, pausing and seeking (once it is started)."""
        self._consumer = fetcher

    # ------------------------------------------------------------------ fetching

    def hold(self, processor: PartitionProcessor) -> Hold | None:
        """Why ``processor``'s partition must not be fetched now (``None``: it may)."""
        tp = processor.tp
        if processor.closed:
            return Hold.STOPPED
        if self._loading.get(tp) is processor:
            return Hold.LOADING
        if self._restoring(tp.partition):
            return Hold.RESTORING
        if processor.needs_pause:
            return Hold.BACK_PRESSURE
        return None

    def update(self, processor: PartitionProcessor) -> None:
        """Pause or resume fetching ``processor``'s partition as `hold()` says, if the
        answer changed; a processor that is no longer live is ignored."""
        tp = processor.tp
        if self.partitions.get(tp) is not processor and self._loading.get(tp) is not processor:
            return
        hold = self.hold(processor)
        processor.set_paused(hold is Hold.BACK_PRESSURE)  # completions ask to resume
        was = self._held.get(tp)
        if hold is was:
            return
        consumer = self._consumer
        if hold is None:
            del self._held[tp]
            if consumer is not None:
                consumer.resume(tp)
            return
        self._held[tp] = hold
        if was is None and consumer is not None:
            consumer.pause(tp)

    # ----------------------------------------------------------------- lifecycle

    def new(self, tp: TopicPartition) -> PartitionProcessor:
        """A fresh processor for ``tp``, prepared for commits (not live yet)."""
        processor = self._make(tp)
        processor.outputs = self._committer.transaction(tp)
        return processor

    async def load(
        self,
        fresh: list[PartitionProcessor],
        positions: Mapping[TopicPartition, int | None] | None = None,
    ) -> None:
        """Make newly assigned processors live: the fetcher starts their partitions at
        ``positions`` (the group's committed offsets; ``None``: the reset policy); with
        checkpoints (or exactly-once), their checkpoints are imported first, the partitions
        held until then so no record arrives before.

        Raises:
            Exception: what the committer raised (a transactional producer that cannot
                start); the processors stay held.
        """
        consumer = self._consumer
        loads = bool(fresh) and self._committer.loads and consumer is not None
        if loads:
            for processor in fresh:  # before any await, and before they are fetched
                self._loading[processor.tp] = processor
                self.update(processor)
        if consumer is not None and fresh:
            consumer.assign({p.tp: (positions or {}).get(p.tp) for p in fresh})
        if loads:
            assert consumer is not None
            try:
                await self._committer.assign(consumer, fresh)
            except BaseException:
                for processor in fresh:
                    del self._loading[processor.tp]
                    self._held.pop(processor.tp, None)
                    processor.close()
                    self._retire(processor.tp)
                raise
            for processor in fresh:
                del self._loading[processor.tp]
        for processor in fresh:  # visible (and fed) once ready
            if self._ended:  # the subscription stopped while they loaded
                self._held.pop(processor.tp, None)
                self.close(processor)
                continue
            self.partitions[processor.tp] = processor
            self.update(processor)

    def close(self, processor: PartitionProcessor) -> None:
        """End ``processor``'s assignment: its later completions are ignored."""
        processor.close()
        tp = processor.tp
        if self.partitions.get(tp) is processor:
            del self.partitions[tp]
            self._held.pop(tp, None)  # the consumer forgets a revoked partition's pause
        self._retire(tp)

    def close_all(self) -> None:
        """End every assignment for good (the subscription stops): the live partitions are
        closed, and so is each one a rebalance listener is still loading when its load
        ends, instead of going live (the consumer's stop lets that listener finish)."""
        self._ended = True
        for processor in list(self.partitions.values()):
            self.close(processor)

    def restart(self, old: PartitionProcessor, offset: int) -> PartitionProcessor:
        """The fetch position went back (a reset, a seek, a recreated topic): the
        partition's state starts again from ``offset``; tasks of the old state still
        running can no longer complete anything."""
        tp = old.tp
        log.warning(
            "fetched offsets went back; the partition starts again from the new position",
            topic=tp.topic,
            partition=tp.partition,
            offset=offset,
            expected=old.tracker.next_offset,
        )
        processor = self._replace(old)
        self._committer.adopt(old, processor, at_last_commit=False)
        return processor

    def rewind(
        self, old: PartitionProcessor, offset: int | None, checkpoint: Checkpoint | None
    ) -> None:
        """A transaction failed: what it held is gone, so the partition starts again at its
        last commit (the records and outputs since then come again). A partition being
        revoked is closed instead: it leaves, its final commit must not cover what the
        transaction lost, and its next owner starts from the last commit."""
        if self.partitions.get(old.tp) is not old or self._consumer is None:
            return
        if old.state is PartitionState.DRAINING:
            old.close()
            return
        # Before the new processor takes a record: what the old one started until now
        # belongs to the transaction that failed.
        log.info(
            "partition rewound to its last commit",
            topic=old.tp.topic,
            partition=old.tp.partition,
            offset=offset,
        )
        processor = self._replace(old)
        self._committer.adopt(old, processor)
        if checkpoint is not None and not checkpoint.empty:
            processor.import_completed(checkpoint.base, checkpoint.bitmap)
        if offset is not None:
            self._consumer.seek(old.tp, offset)

    def gone(self, processor: PartitionProcessor) -> None:
        """The partition's topic no longer exists: stop it here (nothing of it is fed or
        committed any more) and hold it until the rebalance that takes it away."""
        processor.close()
        self.update(processor)

    def restored(self, number: int) -> None:
        """Partition number ``number``'s state is restored: its topics may be fetched."""
        for tp, processor in list(self.partitions.items()):
            if tp.partition == number:
                self.update(processor)

    # ------------------------------------------------------------ live properties

    def follow(
        self,
        properties: Properties,
        *,
        pending_bytes: PendingBytes,
        side_topics: SideTopics,
        shaping: bool,
    ) -> list[Callable[[], None]]:
        """Apply reloadable settings to every live partition the moment they change
        (fetching follows a rate set to or from 0); returns the unsubscribe calls."""

        def each(apply: Callable[[PartitionProcessor], None]) -> None:
            for processor in list(self.partitions.values()):
                apply(processor)

        def on_rate(on_shaping_topics: bool) -> Callable[[int, int], None]:
            def changed(old: int, new: int) -> None:
                for processor in list(self.partitions.values()):
                    if side_topics.is_shaping(processor.tp.topic) == on_shaping_topics:
                        processor.set_rate(new)
                        self.update(processor)

            return changed

        def on_quota(old: int, new: int) -> None:
            if not shaping:
                log.warning("per-key quota needs Application(shaping=True); ignored")
                return
            for processor in list(self.partitions.values()):
                if processor.hot_keys is not None:
                    processor.hot_keys.set_rate(new)  # keeps the counts of the window

        props = properties
        return [
            props[PARTITION_CONCURRENCY].subscribe(lambda o, n: each(lambda p: p.set_limit(n))),
            props[MAX_PENDING_RECORDS].subscribe(lambda o, n: each(lambda p: p.set_max_pending(n))),
            props[MAX_PENDING_BYTES].subscribe(
                lambda o, n: each(lambda p: p.set_max_pending_bytes(n))
            ),
            props[MAX_PENDING_BYTES_TOTAL].subscribe(lambda o, n: pending_bytes.set_limit(n)),
            props[IGNORE_KEYS].subscribe(
                lambda o, n: each(lambda p: p.set_ignore_keys(key_set(n)))
            ),
            props[PROCESSING_RATE_PER_PARTITION].subscribe(on_rate(False)),
            props[SHAPING_RATE_PER_PARTITION].subscribe(on_rate(True)),
            props[PER_KEY_QUOTA_PROCESSING_RATE].subscribe(on_quota),
        ]

    def _replace(self, old: PartitionProcessor) -> PartitionProcessor:
        tp = old.tp
        held = self._held.get(tp)
        self.close(old)
        if held is not None:
            self._held[tp] = held  # still paused in the consumer: update() decides
        processor = self.partitions[tp] = self.new(tp)
        self.update(processor)
        return processor


def key_set(keys: Sequence[str]) -> frozenset[bytes]:
    """The keys of ``decaton.ignore.keys`` as record keys."""
    return frozenset(k.encode() for k in keys)
