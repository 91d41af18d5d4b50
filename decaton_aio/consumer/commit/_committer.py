"""Committing partitions: offsets with checkpoints, at-least-once or in transactions.

The `Committer` is the subscription's commit and assignment machinery:

- at assignment (`Committer.assign()`): with exactly-once, start the subscription's
  transactional producer first; then read the committed offsets and checkpoints (with
  exactly-once, once no transaction of a previous owner holds them), import each usable
  checkpoint into the partition's tracker and move the fetcher to the committed offset,
  so finished records are skipped;
- at commit (`Committer.commit()`), one walk over the partitions: their metrics are
  brought up to date, an idle one whose fetch position passed its watermark (offsets the
  consumer skipped) moves past them, and a partition whose watermark or checkpoint
  changed is committed, with its checkpoint as metadata (see ``_checkpoints``).
  At-least-once, one ``OffsetCommit`` for all of them, through the group membership
  (`GroupCommits`: it carries the member's generation or epoch); exactly-once, one
  transaction for all of them (with every live partition's offset, see
  ``_transactions``);
- a transaction that fails rewinds every partition to its last commit (their records and
  outputs come again; the aborted outputs were never visible). The committer says so to
  the partitions' owner (a `PartitionLifecycle`) at once, in the same step as the
  failure: no task may deliver into the next transaction before it. A final commit
  (revoke, shutdown) that fails rewinds nothing: the partitions leave, and their next
  owner starts from the last commit.

The committer sees a partition through `Committable`
only.

Caller: the subscription, on its event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

import structlog
from aiokafka import TopicPartition
from aiokafka.errors import KafkaError, OffsetMetadataTooLargeError
from aiokafka.structs import OffsetAndMetadata

from decaton_aio.consumer._contract import Committable, OutputSink
from decaton_aio.consumer._loopwatch import StepTimer
from decaton_aio.consumer.commit._checkpoint_codec import TEXT_PREFIX, Checkpoint
from decaton_aio.consumer.commit._checkpoints import CheckpointStore, SendCheckpoint
from decaton_aio.consumer.commit._transactions import (
    CommitPlan,
    Transaction,
    TransactionFailedError,
)

if TYPE_CHECKING:
    from decaton_aio.consumer._assigned import PartitionFetcher

__all__ = ["Committer", "GroupCommits", "PartitionLifecycle"]

log = structlog.get_logger("decaton_aio.consumer")

#: How long one offset commit may take. The client retries a retriable error forever (a
#: deleted topic answers UnknownTopicOrPartition until it exists again): past this the
#: commit is given up (the next interval tries again; a revoke goes on without it).
COMMIT_TIMEOUT_S = 10.0

#: How long asking the consumer for a partition's fetch position may take.
POSITION_TIMEOUT_S = 1.0

P = TypeVar("P", bound=Committable)
P_contra = TypeVar("P_contra", bound=Committable, contravariant=True)


def _ignore(_: float) -> None:
    return None


class GroupCommits(Protocol):
    """Where offsets are committed: the group membership, as the member it is now."""

    async def commit(self, offsets: Mapping[TopicPartition, OffsetAndMetadata]) -> None:
        """Commit ``offsets``.

        Raises:
            KafkaError: the commit failed.
        """
        ...


class PartitionLifecycle(Protocol[P_contra]):
    """The owner of the partitions, told when a transaction's commit failed."""

    def rewind(self, old: P_contra, offset: int | None, checkpoint: Checkpoint | None) -> None:
        """The transaction was aborted: the partition starts again at ``offset`` with
        ``checkpoint`` (its last commit)."""
        ...


@dataclass(frozen=True, slots=True)
class _Saved(Generic[P]):
    """The last state committed for a partition assignment."""

    processor: P
    offset: int | None
    checkpoint: Checkpoint | None
    metadata: str = ""  # as committed


class Committer(Generic[P]):
    """Commits the partitions of one subscription.

    Args:
        group_id: the consumer group.
        store: where checkpoints go; ``None`` without checkpoints.
        transaction: the subscription's transactional producer; ``None`` without
            exactly-once.
    """

    def __init__(
        self,
        group_id: str,
        *,
        store: CheckpointStore | None,
        transaction: Transaction | None,
    ) -> None:
        self.group_id = group_id
        self.store = store
        self.txn = transaction
        # Exactly-once: the live partitions (each commit carries all of them), and the
        # transaction's commit still running (a periodic commit skips a round meanwhile).
        self._members: dict[TopicPartition, P] = {}
        self._txn_commit: asyncio.Task[None] | None = None
        self._saved: dict[TopicPartition, _Saved[P]] = {}
        self._lifecycle: PartitionLifecycle[P] | None = None
        self._periodic: asyncio.Task[None] | None = None  # a periodic commit going on
        self._group: GroupCommits | None = None

    def bind(self, lifecycle: PartitionLifecycle[P]) -> None:
        """Tell ``lifecycle`` of the rewinds and fences of transactions from now on."""
        self._lifecycle = lifecycle

    def bind_group(self, group: GroupCommits) -> None:
        """Commit offsets through ``group`` (the membership) from now on."""
        self._group = group

    @property
    def exactly_once(self) -> bool:
        """Whether commits are transactions."""
        return self.txn is not None

    @property
    def loads(self) -> bool:
        """Whether assignment needs `assign()` (checkpoints or transactions)."""
        return self.store is not None or self.txn is not None

    # ------------------------------------------------------------------ assignment

    def transaction(self, tp: TopicPartition) -> OutputSink | None:
        """Where the outputs of ``tp``'s tasks go: the transaction (exactly-once), or
        ``None`` (the executor's default)."""
        return self.txn

    async def assign(self, fetcher: PartitionFetcher, processors: list[P]) -> None:
        """Start the transaction, then import checkpoints and move to the committed
        offsets.

        Raises:
            KafkaError: the transactional producer could not start, or (exactly-once) the
                committed offsets could not be read.
        """
        if self.txn is not None:
            await self.txn.start()
            for processor in processors:
                self._members[processor.tp] = processor
        if self.store is None:
            return
        try:
            loaded = await self.store.load([p.tp for p in processors])
        except (KafkaError, TimeoutError) as exc:
            if self.exactly_once:
                raise
            log.warning("cannot read checkpoints; finished records may run again", error=repr(exc))
            return
        for processor in processors:
            entry = loaded.get(processor.tp)
            if entry is None or processor.closed:
                continue
            self._saved[processor.tp] = _Saved(
                processor, entry.committed, entry.checkpoint, entry.metadata
            )
            checkpoint = entry.checkpoint
            if checkpoint is not None and not checkpoint.empty:
                processor.import_completed(checkpoint.base, checkpoint.bitmap)
                log.info(
                    "checkpoint loaded",
                    partition=f"{processor.tp.topic}-{processor.tp.partition}",
                    committed=entry.committed,
                    done_above=int(checkpoint.offsets().size),
                )
            if entry.committed is not None and (self.exactly_once or checkpoint is not None):
                # The position the fetcher started at may predate the previous owner's
                # last transaction; the checkpoint belongs to this offset exactly.
                fetcher.seek(processor.tp, entry.committed)

    async def release(self, tps: list[TopicPartition]) -> None:
        """Forget revoked partitions (the transactional producer stays for the next)."""
        for tp in tps:
            self._saved.pop(tp, None)
            self._members.pop(tp, None)

    async def abort_transaction(self, reason: str) -> None:
        """Abort the open transaction after the commit under way, if any (exactly-once):
        the member lost its partitions, so nothing it did in that generation may commit in
        a later one."""
        running = self._txn_commit
        if running is not None:
            await asyncio.wait([running])
        if self.txn is not None:
            await self.txn.abort(reason)

    async def close(self) -> None:
        """Stop the transactional producer and the checkpoint store."""
        running = self._txn_commit
        if running is not None:
            await asyncio.wait([running])
        await self.release(list(self._members))
        if self.txn is not None:
            await self.txn.stop()
        if self.store is not None:
            await self.store.close()

    # --------------------------------------------------------------------- commits

    async def commit(
        self,
        fetcher: PartitionFetcher,
        processors: list[P],
        *,
        final: bool,
        steps: StepTimer | None = None,
    ) -> None:
        """Commit every partition whose watermark or checkpoint moved; failures are
        logged (the next interval tries again). ``steps`` reports the walk's steps.

        A final commit (revoke, shutdown) first ends a periodic one still going on: the
        client retries a commit until it succeeds (a deleted topic's partition in it:
        until it is given up), and each retry would write that commit's offsets again,
        older than the final ones, for partitions another member may own by then.
        """
        if final:
            periodic = self._periodic
            if periodic is not None and not periodic.done():
                periodic.cancel()
                await asyncio.wait([periodic])
            await self._commit(fetcher, processors, final=True, steps=steps)
            return
        periodic = self._periodic = asyncio.ensure_future(
            self._commit(fetcher, processors, final=False, steps=steps)
        )
        try:
            await periodic
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if not periodic.cancelled() or (current is not None and current.cancelling()):
                raise  # this commit's caller is cancelled, not only the commit
            log.info("periodic commit ended for a final one")

    async def _commit(
        self,
        fetcher: PartitionFetcher,
        processors: list[P],
        *,
        final: bool,
        steps: StepTimer | None,
    ) -> None:
        if final and not self.exactly_once:
            # The periodic commit this one ended may have been reading its metadata back:
            # a checkpoint the broker dropped must be written again, to the topic, now.
            await self._check_kept()
        # One walk: metrics, skipped offsets and (at-least-once) what to commit.
        entries: dict[TopicPartition, tuple[P, int, Checkpoint | None]] = {}
        steps = steps or StepTimer(_ignore)
        steps.start()
        for processor in processors:
            for histogram in processor.fold_stats():
                await steps.yield_if_due()  # many partitions, busy ones: in steps
                histogram.fold()
            if processor.pending == 0:
                offset = processor.committable()
                if offset is not None:
                    steps.end()
                    await self._past_skipped(fetcher, processor, offset)  # may ask the broker
                    steps.start()
            if not self.exactly_once:
                snapshot = self._snapshot(processor)
                if snapshot is not None:
                    entries[processor.tp] = (processor, *snapshot)
                elif not processor.closed:
                    processor.up_to_date()
        steps.end()
        if self.exactly_once:
            running = self._txn_commit
            if running is not None and not running.done():
                if not final:
                    return  # one transaction at a time: the next interval commits
                await asyncio.wait([running])  # the final commit waits for it, then runs
            # Its own task: a periodic commit cancelled for a final one lets it finish.
            task = self._txn_commit = asyncio.ensure_future(self._commit_transaction(final))
            await asyncio.shield(task)
            return
        group = self._group
        if not entries or group is None:
            return
        metadata: dict[TopicPartition, str] = {}
        if self.store is not None:
            checkpoints = {tp: c for tp, (_, _, c) in entries.items() if c is not None}
            metadata = await self.store.metadata(checkpoints)
        offsets = {
            tp: OffsetAndMetadata(offset, metadata.get(tp, ""))
            for tp, (_, offset, _) in entries.items()
        }
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a
            # cancellation that arrives as the commit ends, and a shutdown then waits forever.
            async with asyncio.timeout(COMMIT_TIMEOUT_S):
                await group.commit(offsets)
        except (KafkaError, AssertionError, TimeoutError) as exc:
            # A commit during a rebalance fails by design; the next interval retries it.
            if isinstance(exc, OffsetMetadataTooLargeError) and self.store is not None:
                log.warning("the cluster's offset.metadata.max.bytes is smaller: using the topic")
                self.store.metadata_max_bytes = 0
            log.warning(
                "commit failed; retrying at the next interval" if not final else "commit failed",
                error=repr(exc),
                offsets={f"{tp.topic}-{tp.partition}": o.offset for tp, o in offsets.items()},
            )
            return
        for tp, (processor, offset, checkpoint) in entries.items():
            processor.committed(offset)
            self._saved[tp] = _Saved(processor, offset, checkpoint, offsets[tp].metadata)
        await self._check_kept()

    async def _check_kept(self) -> None:
        # Until the store knows whether the broker keeps commit metadata, read back the
        # inline metadata of a commit made; if it was dropped, every checkpoint is written
        # again, to the topic, at the next commit.
        store = self.store
        if store is None or store.metadata_kept is not None:
            return
        inline = next(
            (
                (tp, s.metadata)
                for tp, s in self._saved.items()
                if s.metadata.startswith(TEXT_PREFIX)
            ),
            None,
        )
        if inline is None:
            return
        await store.check_kept(*inline)
        if store.metadata_kept is False:
            self._saved.clear()

    @staticmethod
    async def _past_skipped(fetcher: PartitionFetcher, processor: P, offset: int) -> None:
        # An idle partition whose fetch position is past its watermark skipped offsets it
        # was never handed (transaction markers, aborted records under read_committed):
        # commit the position, or the group's lag would never reach zero. Only asked when
        # the broker holds more than the watermark, so a quiet partition costs nothing.
        # A partition lost or revoked meanwhile is closed, and no longer assigned.
        if processor.closed:
            return
        consumer = fetcher.consumer
        try:
            high = consumer.highwater(processor.tp)
            if high is None or high <= offset:
                return
            async with asyncio.timeout(POSITION_TIMEOUT_S):
                position = int(await consumer.position(processor.tp))
        except (KafkaError, TimeoutError, AssertionError):
            # Revoked or resetting meanwhile (aiokafka asserts on an unassigned
            # partition): next interval.
            return
        processor.skip_to(position)

    def _snapshot(self, processor: P) -> tuple[int, Checkpoint | None] | None:
        # The offset (and checkpoint) to commit, or None when nothing changed.
        if processor.closed:
            return None
        checkpoint: Checkpoint | None = None
        if self.store is None:
            offset = processor.committable()
            if offset is None:
                return None
        else:
            exported = processor.export_completed()
            if exported is None:
                return None
            offset = exported[0]
            checkpoint = Checkpoint(*exported)
        saved = self._saved.get(processor.tp)
        same = saved is not None and saved.processor is processor
        if (
            offset == processor.last_committed
            and same
            and (checkpoint is None or (saved is not None and saved.checkpoint == checkpoint))
        ):
            return None
        return offset, checkpoint

    async def _commit_transaction(self, final: bool) -> None:
        txn = self.txn
        assert txn is not None
        live: list[P] = []
        taken: dict[TopicPartition, tuple[P, int, Checkpoint | None, str]] = {}

        async def plan() -> CommitPlan:
            # Read while no delivery is inside: the partitions as the transaction has them.
            live.extend(p for p in self._members.values() if not p.closed)
            snapshots = {}
            for processor in live:
                snapshot = self._snapshot(processor)
                if snapshot is not None:
                    snapshots[processor.tp] = (processor, *snapshot)
            metadata: dict[TopicPartition, str] = {}
            if self.store is not None:
                checkpoints = {tp: c for tp, (_, _, c) in snapshots.items() if c is not None}
                if checkpoints:
                    send = self._checkpoint_sender(txn)
                    metadata = await self.store.metadata(checkpoints, send=send)
            for tp, (processor, offset, checkpoint) in snapshots.items():
                taken[tp] = (processor, offset, checkpoint, metadata.get(tp, ""))
            return {tp: (offset, text) for tp, (_, offset, _, text) in taken.items()}

        def unchanged() -> CommitPlan:
            return {
                tp: (saved.offset, saved.metadata)
                for tp, saved in self._saved.items()
                if tp not in taken and saved.offset is not None and not saved.processor.closed
            }

        try:
            await txn.commit(plan, unchanged)
        except TransactionFailedError:
            if final or self._lifecycle is None:
                return  # the partitions leave: their next owner starts from the last commit
            for processor in live:
                saved = self._saved.get(processor.tp)
                offset = saved.offset if saved is not None else None
                if offset is None:
                    offset = processor.first_offset
                checkpoint = saved.checkpoint if saved is not None else None
                self._lifecycle.rewind(processor, offset, checkpoint)
            return
        for tp, (processor, offset, checkpoint, text) in taken.items():
            processor.committed(offset)
            self._saved[tp] = _Saved(processor, offset, checkpoint, text)
        for processor in live:
            if processor.tp not in taken and not processor.closed:
                processor.up_to_date()

    def _checkpoint_sender(self, txn: Transaction) -> SendCheckpoint:
        store = self.store
        assert store is not None

        async def send(topic: str, partition: int, key: bytes, value: bytes) -> int:
            await store.ensure_topic()
            return await txn.send_checkpoint(topic, partition, key, value)

        return send

    def adopt(self, old: P, new: P, *, at_last_commit: bool = True) -> None:
        """A partition's new processor takes the old one's place in the transactions:
        after a rewind (``at_last_commit``: it starts again at the last commit, which it
        keeps as its own), or after the fetch position went elsewhere (that commit stays
        the old one's, and the new one's first is a change)."""
        if self._members.get(new.tp) is old:
            self._members[new.tp] = new
        if not at_last_commit:
            return
        saved = self._saved.get(new.tp)
        if saved is not None and saved.processor is old:
            self._saved[new.tp] = _Saved(new, saved.offset, saved.checkpoint, saved.metadata)
