"""The consumer group protocol's membership against the embedded Apache Kafka: joins,
incremental handovers (only the moved partitions are revoked), leaves with epoch -1 and -2,
a killed member given up after the session timeout, commits with the member epoch."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.structs import OffsetAndMetadata

from decaton_aio.consumer.group import (
    ConsumerProtocolMembership,
    _consumer_protocol,
    offers_consumer_protocol,
)
from decaton_aio.pytest_plugin import TopicFactory
from decaton_aio.testing import BrokerHandle, wait_until

pytestmark = pytest.mark.integration

#: The embedded broker's consumer group session timeout (see its configuration).
SESSION_TIMEOUT_S = 6.0


class Recorder:
    """A listener that records each call with its time, and what it owns."""

    def __init__(self) -> None:
        self.owned: set[TopicPartition] = set()
        self.calls: list[tuple[str, frozenset[TopicPartition], float]] = []

    async def partitions_revoked(self, partitions: frozenset[TopicPartition]) -> None:
        self.calls.append(("revoke", partitions, time.monotonic()))
        self.owned -= partitions

    async def partitions_assigned(self, partitions: frozenset[TopicPartition]) -> None:
        self.calls.append(("assign", partitions, time.monotonic()))
        self.owned |= partitions

    async def partitions_lost(self, partitions: frozenset[TopicPartition]) -> None:
        self.calls.append(("lose", partitions, time.monotonic()))
        self.owned -= partitions

    def stopped(self) -> set[TopicPartition]:
        """Every partition this listener was told to stop (revoked or lost)."""
        return {tp for kind, parts, _ in self.calls if kind != "assign" for tp in parts}


Members = Callable[..., Any]


@pytest.fixture
async def members(kafka_broker: BrokerHandle) -> AsyncIterator[Members]:
    """``await members(group, topic, instance_id=None)``: a started membership and its
    recorder; every one still running is stopped after the test."""
    if kafka_broker.flavor == "tansu":
        pytest.skip("Tansu does not serve the consumer group protocol")
    made: list[ConsumerProtocolMembership] = []

    async def make(
        group: str, topic: str, **kwargs: Any
    ) -> tuple[ConsumerProtocolMembership, Recorder]:
        membership = ConsumerProtocolMembership(
            group,
            kafka_broker.bootstrap_servers,
            topics=[topic],
            security=kafka_broker.security,
            rebalance_timeout_ms=10_000,
            **kwargs,
        )
        recorder = Recorder()
        await membership.start(recorder)
        made.append(membership)
        return membership, recorder

    try:
        yield make
    finally:
        for membership in made:
            await membership.stop()


def all_of(topic: str, count: int) -> set[TopicPartition]:
    return {TopicPartition(topic, p) for p in range(count)}


def group_name() -> str:
    return f"cgp-{uuid.uuid4().hex[:8]}"


async def test_offered_by_the_embedded_kafka(kafka_broker: BrokerHandle) -> None:
    if kafka_broker.flavor == "tansu":
        assert not await offers_consumer_protocol(
            kafka_broker.bootstrap_servers, kafka_broker.security
        )
    else:
        assert await offers_consumer_protocol(kafka_broker.bootstrap_servers, kafka_broker.security)


async def test_a_lone_member_gets_every_partition(
    topic_factory: TopicFactory, members: Members
) -> None:
    topic = await topic_factory(partitions=6)
    began = time.monotonic()
    a, rec = await members(group_name(), topic)
    await wait_until(lambda: rec.owned == all_of(topic, 6), timeout_s=20, what="all partitions")
    print(f"join: all 6 partitions after {time.monotonic() - began:.2f} s")
    assert a.member_epoch > 0
    assert a.identity.generation_id == a.member_epoch
    assert a.identity.member_id == a.member_id
    assert a.owned == all_of(topic, 6)
    assert [kind for kind, *_ in rec.calls] == ["assign"]


async def test_a_second_member_takes_only_what_moves(
    topic_factory: TopicFactory, members: Members
) -> None:
    topic = await topic_factory(partitions=6)
    group = group_name()
    _a, rec_a = await members(group, topic)
    await wait_until(lambda: rec_a.owned == all_of(topic, 6), timeout_s=20, what="all to a")
    _b, rec_b = await members(group, topic)
    await wait_until(
        lambda: len(rec_a.owned) == 3 and len(rec_b.owned) == 3,
        timeout_s=20,
        what="3 partitions each",
    )
    assert rec_a.owned | rec_b.owned == all_of(topic, 6)
    assert not rec_a.owned & rec_b.owned
    # a kept 3 partitions; only the 3 that moved were ever revoked from it
    assert rec_a.stopped() == rec_b.owned
    assert not rec_a.stopped() & rec_a.owned
    # the revocation came before b started anything
    revoked_at = max(at for kind, _, at in rec_a.calls if kind == "revoke")
    assigned_at = min(at for kind, _, at in rec_b.calls if kind == "assign")
    assert revoked_at <= assigned_at
    print(f"second member: a kept {len(rec_a.owned)} of 6, moved {len(rec_b.owned)}")


async def test_a_leave_hands_over_at_once(topic_factory: TopicFactory, members: Members) -> None:
    topic = await topic_factory(partitions=4)
    group = group_name()
    a, rec_a = await members(group, topic)
    await wait_until(lambda: rec_a.owned == all_of(topic, 4), timeout_s=20, what="all to a")
    b, rec_b = await members(group, topic)
    await wait_until(lambda: len(rec_b.owned) == 2, timeout_s=20, what="2 to b")
    kept_by_a = set(rec_a.owned)
    began = time.monotonic()
    await b.stop()
    assert [kind for kind, *_ in rec_b.calls] == ["assign", "revoke"]
    await wait_until(lambda: rec_a.owned == all_of(topic, 4), timeout_s=10, what="all back to a")
    handover = time.monotonic() - began
    print(f"leave: handed over after {handover:.2f} s")
    assert handover < 0.5 + 1.0 + 1.0  # the heartbeat interval plus a second, and slack
    assert not rec_a.stopped() & kept_by_a
    assert a.member_epoch > 0


async def test_a_killed_member_is_given_up_after_its_session(
    topic_factory: TopicFactory, members: Members
) -> None:
    topic = await topic_factory(partitions=4)
    group = group_name()
    _a, rec_a = await members(group, topic)
    await wait_until(lambda: rec_a.owned == all_of(topic, 4), timeout_s=20, what="all to a")
    b, rec_b = await members(group, topic)
    await wait_until(lambda: len(rec_b.owned) == 2, timeout_s=20, what="2 to b")
    kept_by_a = set(rec_a.owned)
    calls_before = len(rec_a.calls)
    # killed: its routine ends and its connections close, without a leave
    b.routine.cancel()
    await asyncio.gather(b.routine, return_exceptions=True)
    await b.stop()
    began = time.monotonic()
    await wait_until(
        lambda: rec_a.owned == all_of(topic, 4),
        timeout_s=SESSION_TIMEOUT_S + 10,
        what="b's partitions to a",
    )
    takeover = time.monotonic() - began
    print(f"kill: taken over after {takeover:.2f} s (session timeout {SESSION_TIMEOUT_S} s)")
    assert takeover > SESSION_TIMEOUT_S - 1.5
    # a never stopped its own partitions meanwhile
    assert [kind for kind, *_ in rec_a.calls[calls_before:]] == ["assign"]
    assert not rec_a.stopped() & kept_by_a


async def test_a_static_member_leaves_and_gets_its_partitions_back(
    topic_factory: TopicFactory, members: Members
) -> None:
    topic = await topic_factory(partitions=4)
    group = group_name()
    _a, rec_a = await members(group, topic, instance_id="static-a")
    await wait_until(lambda: rec_a.owned == all_of(topic, 4), timeout_s=20, what="all to a")
    b, rec_b = await members(group, topic, instance_id="static-b")
    await wait_until(lambda: len(rec_b.owned) == 2, timeout_s=20, what="2 to b")
    held_by_b = set(rec_b.owned)
    kept_by_a = set(rec_a.owned)
    calls_of_a = len(rec_a.calls)
    await b.stop()  # epoch -2: the coordinator keeps b's partitions for it
    await asyncio.sleep(2.0)
    assert rec_a.owned == kept_by_a
    b2, rec_b2 = await members(group, topic, instance_id="static-b")
    await wait_until(lambda: len(rec_b2.owned) == 2, timeout_s=20, what="b's partitions back")
    assert rec_b2.owned == held_by_b
    assert b2.member_id != b.member_id
    assert rec_a.owned == kept_by_a
    assert rec_a.calls[calls_of_a:] == []  # a never heard of b's leave nor of its return


async def test_commits_carry_the_member_epoch(
    topic_factory: TopicFactory, members: Members
) -> None:
    topic = await topic_factory(partitions=2)
    group = group_name()
    a, rec = await members(group, topic)
    await wait_until(lambda: rec.owned == all_of(topic, 2), timeout_s=20, what="all to a")
    tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    assert await a.committed([tp0, tp1]) == {tp0: None, tp1: None}
    await a.commit({tp0: OffsetAndMetadata(5, "meta"), tp1: OffsetAndMetadata(7, "")})
    found = await a.committed([tp0, tp1])
    assert found == {tp0: OffsetAndMetadata(5, "meta"), tp1: OffsetAndMetadata(7, "")}


async def test_a_commit_with_a_stale_epoch_is_retried(
    topic_factory: TopicFactory, members: Members, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = await topic_factory(partitions=2)
    group = group_name()
    a, rec = await members(group, topic)
    await wait_until(lambda: rec.owned == all_of(topic, 2), timeout_s=20, what="all to a")
    sent: list[int] = []
    real = _consumer_protocol.OffsetCommitRequest

    def stale_first(group_id: str, epoch: int, *rest: Any) -> Any:
        # the first commit goes out with an epoch the coordinator has moved past
        sent.append(epoch - 1 if not sent else epoch)
        return real(group_id, sent[-1], *rest)

    monkeypatch.setattr(_consumer_protocol, "OffsetCommitRequest", stale_first)
    tp = TopicPartition(topic, 0)
    await a.commit({tp: OffsetAndMetadata(11, "")})
    assert sent == [a.member_epoch - 1, a.member_epoch]
    assert (await a.committed([tp]))[tp] == OffsetAndMetadata(11, "")
