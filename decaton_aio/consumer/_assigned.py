"""The subscription's fetching: no group, the partitions it is told.

Two fetchers of the same shape (`PartitionFetcher`): a `LoopFetcher` runs the consumer's
own fetch loop (`decaton_aio.consumer.fetch.Fetcher`) on a client of its own; an
`AssignedFetcher` wraps an aiokafka consumer made with ``group_id=None``: the group
membership (``decaton_aio.consumer.group``) decides which partitions this member owns, and
the subscription hands each change to the fetcher (`AssignedFetcher.assign()`,
`AssignedFetcher.unassign()`). It keeps what aiokafka's manual assignment would lose:

- aiokafka's ``assign()`` replaces the whole assignment and starts every partition
  afresh, so the partitions kept across a change are sought back to their positions (the
  next offset the fetch hands out: records fetched and not handed out yet are fetched
  again) and paused again;
- a new partition starts at the offset given (the group's committed offset), or, without
  one, where ``auto_offset_reset`` says;
- pauses are tracked here by partition, so a partition paused before it is assigned (a
  partition whose checkpoint loads first) is never fetched before it is resumed.

Caller: the subscription's event loop; no method awaits, so a change of assignment and
the pauses that go with it happen in one step (no fetch sees half of it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import IllegalStateError

from decaton_aio._aiokafka import AIOKafkaClient, fetch_positions
from decaton_aio.consumer._records import TaskRecord
from decaton_aio.consumer.fetch import Fetcher

__all__ = ["AssignedFetcher", "LoopFetcher", "PartitionFetcher"]


class PartitionFetcher(Protocol):
    """What the subscription, its assignment and its committer ask of a fetcher."""

    @property
    def consumer(self) -> Any:
        """What answers ``getmany()``, ``highwater()``, ``last_stable_offset()``,
        ``position()`` (a coroutine) and ``partitions_for_topic()`` as aiokafka's consumer
        does."""

    @property
    def assigned(self) -> frozenset[TopicPartition]:
        """The partitions fetched (unless paused)."""

    @property
    def paused(self) -> frozenset[TopicPartition]:
        """The partitions paused, assigned or not yet."""

    def assign(self, positions: Mapping[TopicPartition, int | None]) -> None:
        """Add the partitions of ``positions`` (see `AssignedFetcher.assign()`)."""

    def unassign(self, partitions: Iterable[TopicPartition]) -> None:
        """Stop fetching ``partitions``."""

    def unassign_all(self) -> None:
        """Stop fetching every partition."""

    def pause(self, tp: TopicPartition) -> None:
        """Stop fetching ``tp`` until `resume()`."""

    def resume(self, tp: TopicPartition) -> None:
        """Fetch ``tp`` again."""

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Fetch ``tp`` from ``offset`` next."""


class LoopFetcher:
    """The consumer's own fetch loop behind the subscription's fetcher shape.

    Partitions keep their positions and pauses across assignment changes (the loop
    assigns partition by partition); a partition paused before it is assigned is left out
    of the fetch sessions from its start. It answers the consumer's calls itself
    (`consumer` is itself).

    Args:
        client: the started client whose connections the loop fetches on (its owner
            closes it).
        fetcher: the loop (started or not).
    """

    def __init__(self, client: AIOKafkaClient, fetcher: Fetcher) -> None:
        self.client = client
        self.fetcher = fetcher
        self._assigned: frozenset[TopicPartition] = frozenset()
        self._paused: set[TopicPartition] = set()

    @property
    def consumer(self) -> LoopFetcher:
        """Itself: it answers what the runtime asks a consumer."""
        return self

    @property
    def assigned(self) -> frozenset[TopicPartition]:
        """The partitions fetched (unless paused)."""
        return self._assigned

    @property
    def paused(self) -> frozenset[TopicPartition]:
        """The partitions paused, assigned or not yet."""
        return frozenset(self._paused)

    def assign(self, positions: Mapping[TopicPartition, int | None]) -> None:
        """Add the partitions of ``positions``, each to start at its offset (``None``: the
        reset policy); one already assigned keeps its position and pause (moved to its
        offset if one is given)."""
        fetcher = self.fetcher
        for tp, offset in positions.items():
            if tp in self._assigned:
                if offset is not None:
                    fetcher.seek(tp, offset)
                continue
            fetcher.assign(tp, offset)
            if tp in self._paused:
                fetcher.pause(tp)
        self._assigned = self._assigned | positions.keys()

    def unassign(self, partitions: Iterable[TopicPartition]) -> None:
        """Stop fetching ``partitions`` (their pauses are forgotten)."""
        gone = set(partitions)
        self._paused -= gone
        for tp in gone & self._assigned:
            self.fetcher.unassign(tp)
        self._assigned = self._assigned - gone

    def unassign_all(self) -> None:
        """Stop fetching every partition."""
        self.unassign(self._assigned)

    def pause(self, tp: TopicPartition) -> None:
        """Leave ``tp`` out of the fetch sessions until `resume()`."""
        self._paused.add(tp)
        if tp in self._assigned:
            self.fetcher.pause(tp)

    def resume(self, tp: TopicPartition) -> None:
        """Fetch ``tp`` again."""
        self._paused.discard(tp)
        if tp in self._assigned:
            self.fetcher.resume(tp)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Fetch ``tp`` from ``offset`` next."""
        if tp not in self._assigned:
            raise IllegalStateError(f"{tp.topic}-{tp.partition} is not assigned")
        self.fetcher.seek(tp, offset)

    # ------------------------------------------------------ what a consumer answers

    async def getmany(
        self, timeout_ms: int = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[TaskRecord]]:
        """The records fetched since the last call (see `Fetcher.getmany()`)."""
        return await self.fetcher.getmany(timeout_ms=timeout_ms, max_records=max_records)

    def highwater(self, tp: TopicPartition) -> int | None:
        """The partition's end as its leader last said (None before an answer).

        Raises:
            IllegalStateError: ``tp`` is not assigned.
        """
        if tp not in self._assigned:
            raise IllegalStateError(f"{tp.topic}-{tp.partition} is not assigned")
        return self.fetcher.highwater(tp)

    def last_stable_offset(self, tp: TopicPartition) -> int | None:
        """The end a ``read_committed`` reader reaches, as the leader last said."""
        if tp not in self._assigned:
            raise IllegalStateError(f"{tp.topic}-{tp.partition} is not assigned")
        return self.fetcher.last_stable_offset(tp)

    async def position(self, tp: TopicPartition) -> int:
        """The offset of the next record handed out for ``tp``.

        Raises:
            IllegalStateError: ``tp`` is not assigned, or its position is not known yet
                (being reset).
        """
        position = self.fetcher.position(tp) if tp in self._assigned else None
        if position is None:
            raise IllegalStateError(f"no position of {tp.topic}-{tp.partition}")
        return position

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        """The topic's partitions in the client's metadata (None: not listed)."""
        partitions: set[int] | None = self.client.cluster.partitions_for_topic(topic)
        return partitions


class AssignedFetcher:
    """The partitions a group-less consumer fetches, their start positions and pauses.

    Args:
        consumer: an aiokafka consumer made with ``group_id=None`` (started or not).
        positions: reads the consumer's position of each assigned partition that has one.
    """

    def __init__(
        self,
        consumer: AIOKafkaConsumer,
        *,
        positions: Callable[[AIOKafkaConsumer], Mapping[TopicPartition, int]] = fetch_positions,
    ) -> None:
        self.consumer = consumer
        self._positions = positions
        self._assigned: frozenset[TopicPartition] = frozenset()
        self._paused: set[TopicPartition] = set()

    @property
    def assigned(self) -> frozenset[TopicPartition]:
        """The partitions fetched (unless paused)."""
        return self._assigned

    @property
    def paused(self) -> frozenset[TopicPartition]:
        """The partitions paused, assigned or not yet."""
        return frozenset(self._paused)

    def assign(self, positions: Mapping[TopicPartition, int | None]) -> None:
        """Add the partitions of ``positions``, each to start at its offset (``None``: the
        reset policy); the partitions already assigned keep their positions and pauses
        (one of them given again is moved to its offset, if one is given)."""
        added = {tp: offset for tp, offset in positions.items()}
        self._reassign(self._assigned | added.keys(), added)

    def unassign(self, partitions: Iterable[TopicPartition]) -> None:
        """Stop fetching ``partitions`` (their pauses are forgotten)."""
        gone = set(partitions)
        self._paused -= gone
        if gone & self._assigned:
            self._reassign(self._assigned - gone, {})

    def unassign_all(self) -> None:
        """Stop fetching every partition."""
        self.unassign(self._assigned)

    def pause(self, tp: TopicPartition) -> None:
        """Stop fetching ``tp`` until `resume()` (kept across assignment changes)."""
        self._paused.add(tp)
        if tp in self._assigned:
            self.consumer.pause(tp)

    def resume(self, tp: TopicPartition) -> None:
        """Fetch ``tp`` again."""
        self._paused.discard(tp)
        if tp in self._assigned:
            self.consumer.resume(tp)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Fetch ``tp`` from ``offset`` next."""
        self.consumer.seek(tp, offset)

    def _reassign(
        self, partitions: frozenset[TopicPartition], start: Mapping[TopicPartition, int | None]
    ) -> None:
        kept = self._positions(self.consumer) if self._assigned else {}
        consumer = self.consumer
        consumer.assign(list(partitions))
        self._assigned = partitions
        for tp in partitions:
            offset = start.get(tp)
            if offset is None:
                offset = kept.get(tp)
            if offset is not None:
                consumer.seek(tp, offset)
            if tp in self._paused:
                consumer.pause(tp)
