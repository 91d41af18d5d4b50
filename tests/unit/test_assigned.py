"""The fetcher of a group-less consumer: a change of assignment keeps the positions and
pauses of the partitions that stay (aiokafka's ``assign()`` starts every partition
afresh), new partitions start at the offsets given, and pauses hold for partitions not
assigned yet (property-based against a model)."""

from __future__ import annotations

from typing import Any

from aiokafka import TopicPartition
from hypothesis import given, settings
from hypothesis import strategies as st

from decaton_aio.consumer._assigned import AssignedFetcher

TPS = [TopicPartition("t", n) for n in range(4)]


class FakeConsumer:
    """aiokafka's manual assignment: ``assign()`` replaces everything, positions and
    pauses included; a partition without a position starts where the reset policy says
    (``RESET``)."""

    RESET = -100

    def __init__(self) -> None:
        self.assigned: set[TopicPartition] = set()
        self.paused: set[TopicPartition] = set()
        self.positions: dict[TopicPartition, int] = {}

    def assign(self, tps: list[TopicPartition]) -> None:
        self.assigned, self.paused, self.positions = set(tps), set(), {}

    def seek(self, tp: TopicPartition, offset: int) -> None:
        assert tp in self.assigned
        self.positions[tp] = offset

    def pause(self, tp: TopicPartition) -> None:
        assert tp in self.assigned
        self.paused.add(tp)

    def resume(self, tp: TopicPartition) -> None:
        assert tp in self.assigned
        self.paused.discard(tp)

    def fetch(self, tp: TopicPartition, count: int) -> None:
        """Hand out ``count`` records of ``tp`` (its position moves)."""
        if tp in self.assigned and tp not in self.paused:
            self.positions[tp] = self.positions.get(tp, self.RESET) + count


def fetcher() -> tuple[AssignedFetcher, FakeConsumer]:
    consumer = FakeConsumer()
    return AssignedFetcher(consumer, positions=lambda c: dict(c.positions)), consumer  # type: ignore[arg-type, attr-defined]


def test_kept_partitions_keep_their_positions_and_pauses_across_an_assignment() -> None:
    """Partition 0 fetched to 15 and paused; partition 1 added at its commit 7, partition
    2 without one (the reset policy): 0 stays at 15 and paused."""
    f, consumer = fetcher()
    f.assign({TPS[0]: 10})
    consumer.fetch(TPS[0], 5)
    f.pause(TPS[0])
    f.assign({TPS[1]: 7, TPS[2]: None})
    assert consumer.assigned == {TPS[0], TPS[1], TPS[2]}
    assert consumer.positions == {TPS[0]: 15, TPS[1]: 7}
    assert consumer.paused == {TPS[0]}
    assert f.assigned == frozenset(TPS[:3])


def test_a_partition_paused_before_it_is_assigned_is_never_fetched_until_resumed() -> None:
    """A partition whose checkpoint loads first is paused before the assignment: it is
    paused the moment it is assigned."""
    f, consumer = fetcher()
    f.pause(TPS[1])
    assert consumer.paused == set()
    f.assign({TPS[1]: 3})
    assert consumer.paused == {TPS[1]}
    f.resume(TPS[1])
    assert consumer.paused == set()


def test_unassigned_partitions_forget_their_pause() -> None:
    """A revoked partition assigned again later starts unpaused, at the offset given."""
    f, consumer = fetcher()
    f.assign({TPS[0]: 1, TPS[1]: 2})
    f.pause(TPS[0])
    f.unassign([TPS[0]])
    assert consumer.assigned == {TPS[1]}
    assert f.paused == frozenset()
    f.assign({TPS[0]: 9})
    assert consumer.paused == set()
    assert consumer.positions[TPS[0]] == 9
    f.unassign_all()
    assert consumer.assigned == set()


ops = st.lists(
    st.tuples(
        st.sampled_from(["assign", "unassign", "pause", "resume", "fetch"]),
        st.integers(0, 3),
        st.one_of(st.none(), st.integers(0, 50)),
    ),
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_the_consumer_always_matches_the_model(steps: list[tuple[str, int, Any]]) -> None:
    """Whatever the order of changes, the consumer fetches exactly the assigned partitions
    that are not paused, each from where the model says it is."""
    f, consumer = fetcher()
    assigned: set[TopicPartition] = set()
    paused: set[TopicPartition] = set()
    positions: dict[TopicPartition, int] = {}
    for op, n, offset in steps:
        tp = TPS[n]
        if op == "assign":
            f.assign({tp: offset})
            assigned.add(tp)
            if offset is not None:
                positions[tp] = offset
        elif op == "unassign":
            f.unassign([tp])
            assigned.discard(tp)
            paused.discard(tp)
            positions.pop(tp, None)
        elif op == "pause":
            f.pause(tp)
            paused.add(tp)
        elif op == "resume":
            f.resume(tp)
            paused.discard(tp)
        elif tp in assigned and tp not in paused and tp in positions:
            consumer.fetch(tp, 3)
            positions[tp] += 3
        assert consumer.assigned == assigned
        assert consumer.paused == paused & assigned
        assert {tp: p for tp, p in consumer.positions.items() if tp in positions} == positions
