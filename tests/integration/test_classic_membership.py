"""The classic group membership (`ClassicMembership`) against a real broker: joining,
splitting a group, a graceful leave, a killed member's eviction, static members, commits
in a generation, the state store's assignor, and the refusals."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiokafka import TopicPartition

from decaton_aio.consumer.group import ClassicMembership
from decaton_aio.testing import BrokerHandle, wait_until

pytestmark = pytest.mark.integration

#: Group timings of these tests: quick heartbeats, a session timeout the broker accepts.
TIMINGS: dict[str, Any] = {"session_timeout_ms": 3000, "heartbeat_interval_ms": 300}


class Recorder:
    """A listener that records its calls (kind, partitions, time) and what it owns."""

    def __init__(self, name: str = "member", *, revoke_s: float = 0.0) -> None:
        self.name = name
        self.calls: list[tuple[str, frozenset[TopicPartition], float]] = []
        self.owned: set[TopicPartition] = set()
        self.revoke_s = revoke_s

    async def partitions_revoked(self, partitions: frozenset[TopicPartition]) -> None:
        assert partitions <= self.owned, (partitions, self.owned)
        if self.revoke_s:
            await asyncio.sleep(self.revoke_s)
        self.owned -= partitions
        self.calls.append(("revoked", partitions, time.monotonic()))

    async def partitions_assigned(self, partitions: frozenset[TopicPartition]) -> None:
        assert not partitions & self.owned
        self.owned |= partitions
        self.calls.append(("assigned", partitions, time.monotonic()))

    async def partitions_lost(self, partitions: frozenset[TopicPartition]) -> None:
        assert partitions <= self.owned
        self.owned -= partitions
        self.calls.append(("lost", partitions, time.monotonic()))

    def kinds(self) -> list[str]:
        return [kind for kind, _, _ in self.calls]

    def assigned_at(self, after: float = 0.0) -> float | None:
        for kind, parts, at in self.calls:
            if kind == "assigned" and at > after and parts:
                return at
        return None


def partitions_of(topic: str, count: int) -> frozenset[TopicPartition]:
    return frozenset(TopicPartition(topic, p) for p in range(count))


@pytest.fixture
async def members(
    kafka_broker: BrokerHandle,
) -> AsyncIterator[Callable[..., Any]]:
    """``await members(group, topics, listener, **config)``: started memberships, stopped
    (without leaving) after the test."""
    started: list[ClassicMembership] = []

    async def make(
        group: str, topics: list[str], listener: Recorder, **settings: Any
    ) -> ClassicMembership:
        assignors = settings.pop("assignors", None)
        config = kafka_broker.consumer_config(group, **{**TIMINGS, **settings})
        membership = ClassicMembership(config, topics, assignors=assignors)
        await membership.start(listener)
        started.append(membership)
        return membership

    try:
        yield make
    finally:
        for membership in started:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(membership.stop(leave=True), 10)


def group_name() -> str:
    return f"classic-{uuid.uuid4().hex[:8]}"


async def test_a_member_alone_gets_every_partition(
    topic_factory: Any, members: Callable[..., Any]
) -> None:
    """Given a topic of 4 partitions, when one member joins a new group, then the listener
    is told to start all 4, the member is in a generation, and a stop revokes them."""
    topic = await topic_factory(partitions=4)
    listener = Recorder()
    began = time.monotonic()
    membership = await members(group_name(), [topic], listener)
    await wait_until(lambda: bool(listener.owned), timeout_s=20, what="an assignment")
    join_s = time.monotonic() - began
    assert listener.owned == partitions_of(topic, 4)
    assert membership.owned == partitions_of(topic, 4)
    assert membership.identity.joined
    assert membership.protocol == "classic"
    await membership.stop()
    assert listener.kinds() == ["assigned", "revoked"]
    assert membership.routine.done()
    assert membership.routine.exception() is None
    print(f"join alone: {join_s:.3f} s")
