"""The consumer-protocol membership's own code around its state machine, without a
broker: a fake aiokafka client answers what the membership sends.

- a commit names only partitions the member owns (the coordinator checks the member
  epoch, not who owns a partition: a revoked partition's late commit would be accepted
  and overwrite its new owner's);
- commits and offset reads do not queue behind heartbeats on the coordination connection;
- `stop()` lets a cancellation of its caller through; the routine closes the connections
  however it ends, also when an owner that gave `stop()` up cancels it.
"""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import CommitFailedError
from aiokafka.structs import OffsetAndMetadata

from decaton_aio._aiokafka import ConnectionGroup
from decaton_aio.consumer.group._consumer_messages import (
    ConsumerGroupHeartbeatRequest,
    OffsetCommitRequest,
)
from decaton_aio.consumer.group._consumer_protocol import ConsumerProtocolMembership
from decaton_aio.consumer.group._consumer_state import Answer, Phase

TOPIC_ID = uuid.UUID(int=7)
T0, T1 = TopicPartition("t", 0), TopicPartition("t", 1)


class FakeClient:
    """Records what is sent; answers commits without error and offset reads with
    ``offsets``."""

    def __init__(self, commit_error: int = 0) -> None:
        self.sent: list[tuple[Any, Any]] = []
        self.closed = False
        self.commit_error = commit_error

    async def send(self, node_id: int, request: Any, group: Any = None) -> Any:
        self.sent.append((request, group))
        if isinstance(request, OffsetCommitRequest):
            topics = [
                (topic, [(p[0], self.commit_error, {}) for p in parts], {})
                for topic, parts, _ in request.topics
            ]
            return SimpleNamespace(topics=topics)
        wanted = [(t, parts) for t, parts, _ in request._topics]
        return SimpleNamespace(
            error_code=0,
            topics=[(t, [(p, 5, -1, "", 0, {}) for p in parts], {}) for t, parts in wanted],
        )

    async def close(self) -> None:
        self.closed = True


def stable_member(
    owned: frozenset[tuple[uuid.UUID, int]],
) -> tuple[ConsumerProtocolMembership, FakeClient]:
    """A member in its group at epoch 3 whose listener started ``owned``."""
    m = ConsumerProtocolMembership("g", "localhost:9092", topics=["t"], clock=lambda: 0.0)
    client = FakeClient()
    m._client = client  # type: ignore[assignment]
    m._coordinator_id = 1
    state = m._state
    seq, _ = state.next_heartbeat(0.0)  # type: ignore[misc]
    state.heartbeat_answered(
        seq, Answer(0, member_epoch=3, heartbeat_interval_ms=500, assignment=owned), 0.0
    )
    state.learn_names({TOPIC_ID: "t"})
    step = state.next_step()
    assert step is not None
    assert step.kind == "assign"
    state.step_done(step)
    assert state.phase is Phase.STABLE
    return m, client


async def test_commit_of_a_partition_the_member_does_not_own_is_refused_unsent() -> None:
    m, client = stable_member(frozenset({(TOPIC_ID, 0)}))
    await m.commit({T0: OffsetAndMetadata(10, "")})
    assert len(client.sent) == 1
    with pytest.raises(CommitFailedError, match="t-1"):
        await m.commit({T0: OffsetAndMetadata(11, ""), T1: OffsetAndMetadata(4, "")})
    assert len(client.sent) == 1


async def test_commit_of_a_partition_being_revoked_is_sent_and_after_it_refused() -> None:
    m, client = stable_member(frozenset({(TOPIC_ID, 0), (TOPIC_ID, 1)}))
    state = m._state
    seq, _ = state.next_heartbeat(1.0)  # type: ignore[misc]
    state.heartbeat_answered(
        seq,
        Answer(0, member_epoch=4, heartbeat_interval_ms=500, assignment=frozenset({(TOPIC_ID, 0)})),
        1.0,
    )
    revoke = state.next_step()
    assert revoke is not None
    assert revoke.kind == "revoke"
    await m.commit({T1: OffsetAndMetadata(9, "")})  # the revocation's own commit
    state.step_done(revoke)
    with pytest.raises(CommitFailedError):
        await m.commit({T1: OffsetAndMetadata(9, "")})
    assert len(client.sent) == 1


async def test_commits_and_offset_reads_do_not_use_the_heartbeats_connection() -> None:
    m, client = stable_member(frozenset({(TOPIC_ID, 0)}))
    await m.commit({T0: OffsetAndMetadata(10, "")})
    assert await m.committed([T0]) == {T0: OffsetAndMetadata(5, "")}
    assert [group for _, group in client.sent] == [ConnectionGroup.DEFAULT] * 2


async def test_stop_lets_its_callers_cancellation_through() -> None:
    m = ConsumerProtocolMembership(
        "g", "localhost:9092", topics=["t"], rebalance_timeout_ms=0, request_timeout_s=0.0
    )
    m._client = FakeClient()  # type: ignore[assignment]
    release = asyncio.Event()
    cancelled = asyncio.Event()

    async def slow_to_cancel() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            await release.wait()
            raise

    m._task = asyncio.create_task(slow_to_cancel())
    stopping = asyncio.create_task(m.stop())
    await cancelled.wait()  # stop() gave the routine up and waits for it to end
    stopping.cancel()
    release.set()
    await asyncio.wait({stopping})
    assert stopping.cancelled()


@pytest.mark.parametrize("code", [25, 110])  # UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH
async def test_a_commit_refused_as_fenced_sends_the_next_heartbeat_at_once(code: int) -> None:
    m, client = stable_member(frozenset({(TOPIC_ID, 0)}))
    seq, _ = m._state.next_heartbeat(1.0)  # type: ignore[misc]
    m._state.heartbeat_answered(seq, Answer(0, member_epoch=3, heartbeat_interval_ms=5000), 1.0)
    assert m._state.heartbeat_delay(2.0) == pytest.approx(4.0)
    client.commit_error = code
    with pytest.raises(CommitFailedError):
        await m.commit({T0: OffsetAndMetadata(10, "")})
    assert m._state.heartbeat_delay(2.0) == 0.0


class SilentCoordinator(FakeClient):
    """Never answers a heartbeat."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = asyncio.Event()

    async def send(self, node_id: int, request: Any, group: Any = None) -> Any:
        self.asked.set()
        await asyncio.Event().wait()


async def test_the_routine_closes_the_connections_when_cancelled() -> None:
    m = ConsumerProtocolMembership("g", "localhost:9092", topics=["t"])
    client = SilentCoordinator()
    m._client = client  # type: ignore[assignment]
    m._coordinator_id = 1
    m._task = asyncio.create_task(m._membership_routine())
    await client.asked.wait()  # joining
    stopping = asyncio.create_task(m.stop())
    await asyncio.wait({stopping}, timeout=0)
    stopping.cancel()  # the owner gives the stop up...
    m.routine.cancel()  # ...and cancels the routine
    await asyncio.wait({stopping, m.routine})
    assert client.closed


class FencingCoordinator(FakeClient):
    """Fences the first ``fences`` heartbeats (it still counts the member's old epoch),
    then lets the member in."""

    def __init__(self, fences: int) -> None:
        super().__init__()
        self.fences = fences
        self.heartbeats = 0
        self.joined = asyncio.Event()

    async def send(self, node_id: int, request: Any, group: Any = None) -> Any:
        if not isinstance(request, ConsumerGroupHeartbeatRequest):
            return await super().send(node_id, request, group)
        self.heartbeats += 1
        answer = SimpleNamespace(
            error_code=110, member_epoch=0, heartbeat_interval_ms=60_000, assignment=None,
            member_id=None, error_message=None,
        )  # fmt: skip
        if self.heartbeats > self.fences:
            answer.error_code, answer.member_epoch = 0, 5
            self.joined.set()
        return answer


async def test_a_member_fenced_while_it_owns_nothing_joins_again() -> None:
    """A fence with no partition to lose decides the rejoin without a listener call: the
    heartbeat routine is woken for it, not left waiting."""
    m = ConsumerProtocolMembership("g", "localhost:9092", topics=["t"])
    client = FencingCoordinator(fences=2)
    m._client = client  # type: ignore[assignment]
    m._coordinator_id = 1
    m._task = asyncio.create_task(m._membership_routine())
    try:
        await asyncio.wait_for(client.joined.wait(), 30)
        assert m._state.epoch == 5
    finally:
        m.routine.cancel()
        await asyncio.wait({m.routine})
