"""The subscription's fetching consumer: no group, the partitions it is told.

An `AssignedFetcher` wraps an aiokafka consumer made with ``group_id=None``: the group
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

from aiokafka import AIOKafkaConsumer, TopicPartition

from decaton_aio._aiokafka import fetch_positions

__all__ = ["AssignedFetcher"]


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
