"""The assignment's one fetch decision: the consumer pauses exactly the partitions that
something holds, and pause/resume are called only when that changes (property-based)."""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka import TopicPartition
from hypothesis import given, settings
from hypothesis import strategies as st

from decaton_aio.consumer._assigned import AssignedFetcher
from decaton_aio.consumer._assignment import Assignment, Hold
from decaton_aio.consumer._partition import PartitionState


class FakeProcessor:
    """What the assignment reads of a partition processor."""

    def __init__(self, tp: TopicPartition) -> None:
        self.tp = tp
        self.closed = False
        self.needs_pause = False
        self.paused = False
        self.state = PartitionState.ACTIVE

    def set_paused(self, paused: bool) -> None:
        self.paused = paused

    def close(self) -> None:
        self.closed = True


class FakeConsumer:
    """A group-less consumer as the fetcher sees it: ``assign()`` replaces the assignment
    and forgets the pauses (as aiokafka's does)."""

    def __init__(self) -> None:
        self.paused: set[TopicPartition] = set()
        self.assigned: set[TopicPartition] = set()
        self.positions: dict[TopicPartition, int] = {}
        self.calls: list[tuple[str, TopicPartition]] = []

    def assign(self, tps: list[TopicPartition]) -> None:
        self.assigned = set(tps)
        self.paused = set()
        self.positions = {}

    def pause(self, *tps: TopicPartition) -> None:
        for tp in tps:
            assert tp not in self.paused, f"{tp} paused twice"
            self.paused.add(tp)
            self.calls.append(("pause", tp))

    def resume(self, *tps: TopicPartition) -> None:
        for tp in tps:
            assert tp in self.paused, f"{tp} resumed while fetched"
            self.paused.discard(tp)
            self.calls.append(("resume", tp))

    def seek(self, tp: TopicPartition, offset: int) -> None:
        assert tp in self.assigned, f"{tp} sought while not assigned"
        self.positions[tp] = offset
        self.calls.append(("seek", tp))


class FakeCommitter:
    loads = False

    def __init__(self) -> None:
        self.adopted: list[tuple[Any, Any, bool]] = []

    def transaction(self, tp: Any) -> None:
        return None

    def adopt(self, old: Any, new: Any, *, at_last_commit: bool = True) -> None:
        self.adopted.append((old, new, at_last_commit))


TPS = [TopicPartition("t", n) for n in range(3)]


def build(restoring: set[int]) -> tuple[Assignment, FakeConsumer]:
    assignment = Assignment(
        make=FakeProcessor,  # type: ignore[arg-type]
        committer=FakeCommitter(),  # type: ignore[arg-type]
        restoring=lambda n: n in restoring,
        retire=lambda tp: None,
    )
    consumer = FakeConsumer()
    fetcher = AssignedFetcher(consumer, positions=lambda c: c.positions)  # type: ignore[arg-type, attr-defined]
    assignment.attach(fetcher)
    return assignment, consumer


events = st.lists(
    st.tuples(
        st.sampled_from(["pending_high", "pending_low", "restore", "restored", "fence"]),
        st.integers(0, 2),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(events)
def test_the_consumer_pauses_exactly_what_is_held(steps: list[tuple[str, int]]) -> None:
    restoring: set[int] = set()
    assignment, consumer = build(restoring)
    processors = [assignment.new(tp) for tp in TPS]
    asyncio.run(assignment.load(processors))  # type: ignore[arg-type]
    for event, n in steps:
        p: Any = assignment.partitions[TPS[n]]
        if event == "pending_high":
            p.needs_pause = True
            assignment.update(p)
        elif event == "pending_low":
            p.needs_pause = False
            if p.paused:  # a completion asks only while held for back-pressure
                assignment.update(p)
        elif event == "restore":
            restoring.add(n)
            assignment.update(p)
        elif event == "restored":
            restoring.discard(n)
            assignment.restored(n)
        else:
            assignment.gone(p)
        held = {tp for tp, q in assignment.partitions.items() if assignment.hold(q) is not None}
        assert consumer.paused == held
        for q in assignment.partitions.values():
            assert q.paused == (assignment.hold(q) is Hold.BACK_PRESSURE)


def test_a_stopped_partition_stays_held_whatever_else_changes() -> None:
    assignment, consumer = build(set())
    (p,) = [assignment.new(TPS[0])]
    asyncio.run(assignment.load([p]))
    assignment.gone(p)
    assert assignment.hold(p) is Hold.STOPPED
    p.needs_pause = False  # type: ignore[misc]
    assignment.update(p)
    assert consumer.paused == {TPS[0]}


def test_a_restart_keeps_the_pause_until_the_new_state_decides() -> None:
    """The position went back while back-pressure held the partition: the new processor
    has nothing pending, so fetching resumes; a stale update of the old one is ignored."""
    assignment, consumer = build(set())
    old: Any = assignment.new(TPS[0])
    asyncio.run(assignment.load([old]))
    old.needs_pause = True
    assignment.update(old)
    assert consumer.paused == {TPS[0]}
    old.tracker = type("T", (), {"next_offset": 10})()
    new = assignment.restart(old, 0)
    assert new is not old
    assert old.closed
    assert consumer.paused == set()
    assignment.update(old)  # no longer live: ignored
    assert consumer.paused == set()
    assert consumer.calls == [("pause", TPS[0]), ("resume", TPS[0])]
    # The transactions commit the new processor from now on, not the last commit's.
    assert assignment._committer.adopted == [(old, new, False)]  # type: ignore[attr-defined]


class HeldCommitter(FakeCommitter):
    """Loads checkpoints: each assign waits until the test lets it end."""

    loads = True

    def __init__(self) -> None:
        self.assigning = asyncio.Event()
        self.release = asyncio.Event()

    async def assign(self, consumer: Any, processors: list[Any]) -> list[Any]:
        self.assigning.set()
        await self.release.wait()
        return []


async def test_a_partition_whose_load_ends_after_close_all_is_closed_not_live() -> None:
    """The subscription stops (close_all) while a rebalance listener loads a partition's
    checkpoint: when the load ends the partition is closed, never live, its gauges
    retired, and the consumer holds no pause for it."""
    committer = HeldCommitter()
    retired: list[TopicPartition] = []
    assignment = Assignment(
        make=FakeProcessor,  # type: ignore[arg-type]
        committer=committer,  # type: ignore[arg-type]
        restoring=lambda n: False,
        retire=retired.append,
    )
    consumer = FakeConsumer()
    assignment.attach(AssignedFetcher(consumer, positions=lambda c: {}))  # type: ignore[arg-type]
    live: Any = assignment.new(TPS[0])
    committer.release.set()
    await assignment.load([live])
    committer.release.clear()
    committer.assigning.clear()
    loading: Any = assignment.new(TPS[1])
    load = asyncio.create_task(assignment.load([loading]))
    await committer.assigning.wait()
    assert consumer.paused == {TPS[1]}  # held while loading
    assignment.close_all()
    assert live.closed
    assert TPS[0] not in assignment.partitions
    committer.release.set()
    await load
    assert loading.closed
    assert assignment.partitions == {}
    assert retired == [TPS[0], TPS[1]]
    assert assignment.hold(loading) is Hold.STOPPED


def test_a_partition_assigned_after_close_all_never_goes_live() -> None:
    """Without checkpoints a listener makes its partitions live at once: after close_all
    they are closed instead."""
    assignment, _ = build(set())
    assignment.close_all()
    p: Any = assignment.new(TPS[0])
    asyncio.run(assignment.load([p]))
    assert p.closed
    assert assignment.partitions == {}


def test_a_failed_transaction_rewinds_a_live_partition_and_closes_a_revoked_one() -> None:
    """A rewind replaces a live partition's processor; one being revoked (the commit
    failed while the rebalance drained it) is closed and stays the one the revoke closes,
    so no fresh processor outlives the revoke."""
    assignment, consumer = build(set())
    live, revoked = (assignment.new(tp) for tp in TPS[:2])
    asyncio.run(assignment.load([live, revoked]))
    revoked.state = PartitionState.DRAINING  # type: ignore[attr-defined]
    assignment.rewind(live, 0, None)
    assignment.rewind(revoked, 0, None)
    assert live.closed
    assert assignment.partitions[TPS[0]] is not live
    assert revoked.closed
    assert assignment.partitions[TPS[1]] is revoked
    assert [c for c in consumer.calls if c[0] == "seek"] == [("seek", TPS[0])]
