"""Reading and committing a group's offsets through either membership, without a broker: a
fake coordinator holds the offsets in an open transaction (``UNSTABLE_OFFSET_COMMIT``) or
has moved (``NOT_COORDINATOR``, ``COORDINATOR_NOT_AVAILABLE``) for a while.

Both memberships read the same way: what is stable is returned at once and the rest asked
again, after a wait that grows (not a fixed poll of the coordinator for as long as it
takes), and a coordinator that moved is looked up again. A commit sent while the
coordinator moves is sent again (a few times, after the same growing waits), not failed at
once: a revocation's commit made then would be lost.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaError
from aiokafka.structs import OffsetAndMetadata

from decaton_aio.app import ConsumerConfig
from decaton_aio.consumer.commit import UNSTABLE_OFFSET_COMMIT
from decaton_aio.consumer.group._classic import ClassicMembership
from decaton_aio.consumer.group._classic_state import Join, Sync
from decaton_aio.consumer.group._consumer_messages import (
    OffsetCommitRequest as ConsumerOffsetCommitRequest,
)
from decaton_aio.consumer.group._consumer_protocol import ConsumerProtocolMembership
from decaton_aio.consumer.group._consumer_state import Answer
from decaton_aio.consumer.group._offsets import COMMIT_ATTEMPTS

T0, T1 = TopicPartition("t", 0), TopicPartition("t", 1)
NOT_COORDINATOR = 16
COORDINATOR_NOT_AVAILABLE = 15
TOPIC_ID = uuid.UUID(int=7)


class Coordinator:
    """Answers offset reads: the first ``moved`` with ``NOT_COORDINATOR``, then ``t-1``
    unstable ``unstable`` times; ``t-0`` is at 5, ``t-1`` at 8 once stable."""

    def __init__(self, *, moved: int = 0, unstable: int = 0, commits_moved: int = 0) -> None:
        self.moved, self.unstable, self.commits_moved = moved, unstable, commits_moved
        self.commits = 0
        self.asked: list[list[TopicPartition]] = []
        self.lookups = 0

    async def coordinator_lookup(self, *_: Any) -> int:
        self.lookups += 1
        return 1

    async def send(self, node_id: int, request: Any, group: Any = None) -> Any:
        if request.API_KEY == 8:  # OffsetCommit
            self.commits += 1
            code = COORDINATOR_NOT_AVAILABLE if self.commits_moved else 0
            self.commits_moved = max(0, self.commits_moved - 1)
            if isinstance(request, ConsumerOffsetCommitRequest):
                return SimpleNamespace(topics=[("t", [(0, code, {})], {})])
            return SimpleNamespace(topics=[("t", [(0, code)])])
        wanted = [TopicPartition(t, p) for t, parts, _ in request._topics for p in parts]
        self.asked.append(wanted)
        if self.moved:
            self.moved -= 1
            return SimpleNamespace(error_code=NOT_COORDINATOR, topics=[])
        parts = []
        for tp in wanted:
            code = 0
            if tp == T1 and self.unstable:
                self.unstable -= 1
                code = UNSTABLE_OFFSET_COMMIT
            parts.append((tp.partition, 5 if tp == T0 else 8, -1, "m", code, {}))
        return SimpleNamespace(error_code=0, topics=[("t", parts, {})])


def classic(coordinator: Coordinator) -> Any:
    m = ClassicMembership(ConsumerConfig("localhost:9092", "g"), ["t"])
    m._client = coordinator  # type: ignore[assignment]
    return m


def consumer(coordinator: Coordinator) -> Any:
    m = ConsumerProtocolMembership("g", "localhost:9092", topics=["t"])
    m._client = coordinator  # type: ignore[assignment]
    return m


MEMBERSHIPS: list[Callable[[Coordinator], Any]] = [classic, consumer]


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    waited: list[float] = []

    async def sleep(seconds: float) -> None:
        waited.append(seconds)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    return waited


def assert_growing(waits: list[float]) -> None:
    """The waits grow, up to a second."""
    assert waits == sorted(waits)
    assert waits[0] < waits[-1] <= 1.0


@pytest.mark.parametrize("make", MEMBERSHIPS, ids=["classic", "consumer"])
async def test_unstable_offsets_are_asked_again_alone_after_growing_waits(
    make: Callable[[Coordinator], Any], waits: list[float]
) -> None:
    coordinator = Coordinator(unstable=6)
    found = await make(coordinator).committed([T1, T0])
    assert found == {T0: OffsetAndMetadata(5, "m"), T1: OffsetAndMetadata(8, "m")}
    assert coordinator.asked[0] == [T0, T1]
    assert all(asked == [T1] for asked in coordinator.asked[1:])
    assert len(waits) == 6
    assert_growing(waits)


@pytest.mark.parametrize("make", MEMBERSHIPS, ids=["classic", "consumer"])
async def test_a_moved_coordinator_is_looked_up_again_after_growing_waits(
    make: Callable[[Coordinator], Any], waits: list[float]
) -> None:
    coordinator = Coordinator(moved=5)
    found = await make(coordinator).committed([T0])
    assert found == {T0: OffsetAndMetadata(5, "m")}
    # the first lookup, then one after each NOT_COORDINATOR
    assert coordinator.lookups == 6
    assert_growing(waits)


def owning_t0(m: Any) -> Any:
    """``m`` in its group, its listener running ``t-0``."""
    if isinstance(m, ClassicMembership):
        member = m.member
        found = member.start()[0]
        join = member.coordinator_found(found.request)[0]  # type: ignore[union-attr]
        assert isinstance(join, Join)
        sync = member.joined_group(
            join.request, 0, generation=1, member_id="m1", leader_id="m2", protocol="range"
        )[0]
        assert isinstance(sync, Sync)
        member.synced(sync.request, 0, frozenset({T0}))
        member.listener_done()
        return m
    state = m._state
    seq, _ = state.next_heartbeat(0.0)
    state.heartbeat_answered(
        seq, Answer(0, member_epoch=3, assignment=frozenset({(TOPIC_ID, 0)})), 0.0
    )
    state.learn_names({TOPIC_ID: "t"})
    state.step_done(state.next_step())
    return m


@pytest.mark.parametrize("make", MEMBERSHIPS, ids=["classic", "consumer"])
async def test_a_commit_is_sent_again_while_the_coordinator_moves(
    make: Callable[[Coordinator], Any], waits: list[float]
) -> None:
    coordinator = Coordinator(commits_moved=3)
    await owning_t0(make(coordinator)).commit({T0: OffsetAndMetadata(7, "")})
    assert coordinator.commits == 4
    assert_growing(waits)


@pytest.mark.parametrize("make", MEMBERSHIPS, ids=["classic", "consumer"])
async def test_a_commit_fails_when_the_coordinator_stays_away(
    make: Callable[[Coordinator], Any], waits: list[float]
) -> None:
    coordinator = Coordinator(commits_moved=100)
    with pytest.raises(KafkaError):
        await owning_t0(make(coordinator)).commit({T0: OffsetAndMetadata(7, "")})
    assert coordinator.commits == COMMIT_ATTEMPTS
