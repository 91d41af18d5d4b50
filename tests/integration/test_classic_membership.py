"""The classic group membership (`ClassicMembership`) against a real broker: joining,
splitting a group, a graceful leave, a killed member's eviction, static members, commits
in a generation (and a transaction's), the state store's assignor, a rejoin, the
refusals (no shared assignor, a fenced instance id, no access to the group on a broker
with an authorizer) and the coordinator's node killed in a three-node cluster.

The last two start brokers of their own (one secured node with an authorizer, three
nodes); on Tansu they and the static membership tests are skipped, saying why.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import CommitFailedError
from aiokafka.structs import OffsetAndMetadata

from decaton_aio._aiokafka import RangePartitionAssignor
from decaton_aio.app import ConsumerConfig
from decaton_aio.consumer.group import ClassicMembership
from decaton_aio.consumer.state._assignor import MemberState, StateAwareAssignor
from decaton_aio.embedded import BrokerSecurity, EmbeddedBroker, default_flavor
from decaton_aio.errors import GroupRefusedError
from decaton_aio.testing import BrokerHandle, wait_until
from tests.integration.test_exactly_once import needs_transactions
from tests.integration.test_group_txn import transactional

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


#: Why the static membership tests do not run on Tansu.
TANSU_STATIC = (
    "Tansu does not keep a static member's place: a process coming back with a known "
    "group.instance.id rebalances the whole group (which did not settle within 20 s "
    "here), and a second process with the same id does not fence the first"
)


def skip_static_on_tansu(broker: BrokerHandle) -> None:
    if broker.flavor == "tansu":
        pytest.skip(TANSU_STATIC)


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


async def settled(*listeners: Recorder, partitions: frozenset[TopicPartition]) -> None:
    """Wait until the listeners own ``partitions`` between them, each one once."""

    def split() -> bool:
        owned = [listener.owned for listener in listeners]
        return (
            all(owned)
            and sum(map(len, owned)) == len(partitions)
            and set().union(*owned) == partitions
        )

    await wait_until(split, timeout_s=30, what="the partitions split between the members")


async def test_a_second_member_splits_the_partitions_revoke_before_assign(
    topic_factory: Any, members: Callable[..., Any]
) -> None:
    """Given one member owning 4 partitions, when a second joins, then the first revokes
    all 4 (eager) before it is assigned its half, and the second gets the other half."""
    topic = await topic_factory(partitions=4)
    group = group_name()
    first, second = Recorder("first"), Recorder("second")
    one = await members(group, [topic], first)
    await wait_until(lambda: len(first.owned) == 4, timeout_s=20, what="the first member")
    generation = one.identity.generation_id
    began = time.monotonic()
    two = await members(group, [topic], second)
    await settled(first, second, partitions=partitions_of(topic, 4))
    rebalance_s = time.monotonic() - began
    assert first.kinds() == ["assigned", "revoked", "assigned"]
    assert first.calls[1][1] == partitions_of(topic, 4)
    assert len(first.owned) == len(second.owned) == 2
    assert second.kinds() == ["assigned"]
    assert one.identity.generation_id == two.identity.generation_id
    assert one.identity.generation_id > generation
    print(f"second member's join, both assigned after: {rebalance_s:.3f} s")


async def test_a_graceful_leave_hands_the_partitions_over(
    topic_factory: Any, members: Callable[..., Any]
) -> None:
    """Given two members, when one stops (revoke, LeaveGroup), then the other is assigned
    every partition well within the session timeout."""
    topic = await topic_factory(partitions=4)
    group = group_name()
    first, second = Recorder("first"), Recorder("second")
    one = await members(group, [topic], first)
    await members(group, [topic], second)
    await settled(first, second, partitions=partitions_of(topic, 4))
    began = time.monotonic()
    await one.stop()
    await wait_until(lambda: len(second.owned) == 4, timeout_s=20, what="the handover")
    handover_s = time.monotonic() - began
    assert first.kinds()[-1] == "revoked"
    assert not first.owned
    assert handover_s < TIMINGS["session_timeout_ms"] / 1000
    print(f"handover after a graceful leave: {handover_s:.3f} s")


async def test_a_killed_member_is_evicted_after_its_session_timeout(
    topic_factory: Any, members: Callable[..., Any]
) -> None:
    """Given two members, when one dies without leaving (its routine cancelled, its
    connections closed), then the other gets every partition once the coordinator gave
    up on the dead one: after the session timeout, not before."""
    topic = await topic_factory(partitions=4)
    group = group_name()
    first, second = Recorder("first"), Recorder("second")
    one = await members(group, [topic], first)
    await members(group, [topic], second)
    await settled(first, second, partitions=partitions_of(topic, 4))
    began = time.monotonic()
    one.routine.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await one.routine
    await wait_until(lambda: len(second.owned) == 4, timeout_s=30, what="the takeover")
    takeover_s = time.monotonic() - began
    session_s = TIMINGS["session_timeout_ms"] / 1000
    assert takeover_s >= session_s - 0.5  # not before the coordinator evicts it
    assert takeover_s < session_s + 5
    print(f"takeover after a kill: {takeover_s:.3f} s (session timeout {session_s} s)")


async def test_a_static_member_restarting_within_its_session_keeps_its_partitions(
    kafka_broker: BrokerHandle, topic_factory: Any, members: Callable[..., Any]
) -> None:
    """Given two static members, when one stops (no LeaveGroup) and starts again with the
    same instance id within the session timeout, then it gets the same partitions and the
    other member is never told to revoke anything."""
    skip_static_on_tansu(kafka_broker)
    topic = await topic_factory(partitions=4)
    group = group_name()
    first, second = Recorder("first"), Recorder("second")
    one = await members(group, [topic], first, group_instance_id="pod-a")
    await members(group, [topic], second, group_instance_id="pod-b")
    await settled(first, second, partitions=partitions_of(topic, 4))
    before = set(first.owned)
    calls_of_second = len(second.calls)
    await one.stop()
    again = Recorder("first again")
    began = time.monotonic()
    await members(group, [topic], again, group_instance_id="pod-a")
    await wait_until(lambda: bool(again.owned), timeout_s=20, what="the restarted member")
    restart_s = time.monotonic() - began
    await asyncio.sleep(1.0)  # a rebalance of the others would show by now
    assert again.owned == before
    assert len(second.calls) == calls_of_second
    print(f"static member back with its partitions after: {restart_s:.3f} s")


async def test_commit_and_committed_round_trip_in_the_generation(
    kafka_broker: BrokerHandle, topic_factory: Any, members: Callable[..., Any]
) -> None:
    """A member commits its partitions' offsets in its generation and reads them back
    (stable); a partition without a commit reads None; a partition it does not own is
    not committed."""
    topic = await topic_factory(partitions=2)
    listener = Recorder()
    membership = await members(group_name(), [topic], listener)
    await wait_until(lambda: len(listener.owned) == 2, timeout_s=20, what="an assignment")
    tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    await membership.commit({tp0: OffsetAndMetadata(42, "checkpoint")})
    found = await membership.committed([tp0, tp1])
    kept = "checkpoint" if kafka_broker.keeps_commit_metadata else ""
    assert found[tp0] == OffsetAndMetadata(42, kept)
    assert found[tp1] is None
    with pytest.raises(CommitFailedError, match="does not own"):
        await membership.commit({TopicPartition(topic, 7): OffsetAndMetadata(1, "")})


async def test_a_commit_of_a_member_replaced_by_another_process_fails_clearly(
    kafka_broker: BrokerHandle, topic_factory: Any, members: Callable[..., Any]
) -> None:
    """Given a static member, when another process joins with its instance id (the
    coordinator gives it the first one's place at once), then a commit of the first one,
    still in its old generation as far as it knows, is refused by the coordinator and
    fails saying its generation is over."""
    skip_static_on_tansu(kafka_broker)
    topic = await topic_factory(partitions=2)
    group = group_name()
    first = Recorder("first")
    # Rare heartbeats: the first member learns of its replacement by its commit.
    one = await members(
        group,
        [topic],
        first,
        group_instance_id="pod-z",
        heartbeat_interval_ms=5000,
        session_timeout_ms=12000,
    )
    await wait_until(lambda: len(first.owned) == 2, timeout_s=20, what="the first member")
    second = Recorder("second")
    two = await members(group, [topic], second, group_instance_id="pod-z")
    await wait_until(lambda: len(second.owned) == 2, timeout_s=20, what="the replacement")
    still_joined = one.identity.joined
    offsets = {tp: OffsetAndMetadata(5, "") for tp in partitions_of(topic, 2)}
    with pytest.raises(CommitFailedError, match="generation") as failed:
        await one.commit(offsets)
    if still_joined:  # else its heartbeat told it first: refused before sending
        assert "FENCED_INSTANCE_ID" in str(failed.value)
        assert "is over" in str(failed.value)
    assert (await two.committed(list(offsets))) == dict.fromkeys(offsets)
    with pytest.raises(GroupRefusedError, match="pod-z"):  # fenced: it stops
        await asyncio.wait_for(one.routine, 20)


async def test_the_state_stores_assignor_assigns_and_hands_out_standbys(
    topic_factory: Any, members: Callable[..., Any]
) -> None:
    """Two members offering only the state store's assignor split the partitions by
    number, and each learns the other's partitions as its standbys."""
    topic = await topic_factory(partitions=4)
    group = group_name()
    recorders = (Recorder("a"), Recorder("b"))
    assignors = [StateAwareAssignor(MemberState, num_standby_replicas=1) for _ in recorders]
    for recorder, assignor in zip(recorders, assignors, strict=True):
        await members(group, [topic], recorder, assignors=[assignor])
    await settled(*recorders, partitions=partitions_of(topic, 4))
    for recorder, assignor, other in zip(recorders, assignors, reversed(recorders), strict=True):
        await wait_until(
            lambda a=assignor, o=other: a.standbys == {tp.partition for tp in o.owned},
            timeout_s=10,
            what="the standbys",
        )
        assert len(recorder.owned) == 2


async def test_no_shared_assignor_is_refused_naming_the_assignors(
    topic_factory: Any, members: Callable[..., Any]
) -> None:
    """A member offering only roundrobin to a group whose member offers only range ends
    with GroupRefusedError naming what it offered and what Decaton uses."""
    topic = await topic_factory(partitions=2)
    group = group_name()
    first = Recorder("range")
    await members(group, [topic], first, partition_assignment_strategy=("range",))
    await wait_until(lambda: len(first.owned) == 2, timeout_s=20, what="the first member")
    odd = await members(
        group, [topic], Recorder("roundrobin"), partition_assignment_strategy=("roundrobin",)
    )
    with pytest.raises(GroupRefusedError, match="roundrobin") as refused:
        await asyncio.wait_for(odd.routine, 20)
    assert "range" in str(refused.value)
    assert refused.value.group_id == group


async def test_a_second_process_with_the_same_instance_id_fences_the_first(
    kafka_broker: BrokerHandle, topic_factory: Any, members: Callable[..., Any]
) -> None:
    """When another process joins with this member's group.instance.id, the first one's
    partitions are lost (not revoked: no commit) and it ends with GroupRefusedError
    naming the instance id."""
    skip_static_on_tansu(kafka_broker)
    topic = await topic_factory(partitions=2)
    group = group_name()
    first = Recorder("first")
    one = await members(group, [topic], first, group_instance_id="pod-x")
    await wait_until(lambda: len(first.owned) == 2, timeout_s=20, what="the first member")
    second = Recorder("second")
    await members(group, [topic], second, group_instance_id="pod-x")
    with pytest.raises(GroupRefusedError, match="pod-x"):
        await asyncio.wait_for(one.routine, 20)
    assert first.kinds() == ["assigned", "lost"]
    await wait_until(lambda: len(second.owned) == 2, timeout_s=20, what="the second member")


#: The users of the broker with an authorizer: a super user, and one with no ACL at all.
ADMIN, NOBODY = "decaton-admin", "no-acls"


@pytest.fixture
def acl_broker() -> Iterator[tuple[EmbeddedBroker, str]]:
    """A secured Apache Kafka of its own with an authorizer, and the password of
    ``NOBODY``, who has no ACL (so no access to any group); ``ADMIN`` may do anything."""
    if default_flavor() != "apache":
        pytest.skip("the broker with an authorizer is the embedded Apache Kafka")
    password = secrets.token_urlsafe(12)
    security = BrokerSecurity({ADMIN: secrets.token_urlsafe(12), NOBODY: password})
    broker = EmbeddedBroker(
        flavor="apache",
        security=security,
        settings={
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            # The brokers' own listeners (controller, inter-broker) are unauthenticated.
            "super.users": f"User:ANONYMOUS;User:{ADMIN}",
        },
        startup_timeout_s=180,
    ).start()
    try:
        yield broker, password
    finally:
        broker.stop()


@pytest.mark.timeout(300)  # a JVM of its own
async def test_no_access_to_the_group_is_refused_saying_what_to_grant(
    acl_broker: tuple[EmbeddedBroker, str],
) -> None:
    """A principal without ACLs on its group ends the membership with GroupRefusedError
    (exit code 77 in the CLI) saying to grant READ on the group to it, not a traceback."""
    broker, password = acl_broker
    listener = broker.listeners["SASL_SSL"]
    security = dataclasses.replace(listener.security, sasl_username=NOBODY, sasl_password=password)
    group = group_name()
    config = ConsumerConfig(listener.bootstrap_servers, group, security=security, **TIMINGS)
    membership = ClassicMembership(config, ["any-topic"])
    recorder = Recorder()
    await membership.start(recorder)
    try:
        with pytest.raises(GroupRefusedError, match=f"grant READ on group '{group}'") as refused:
            await asyncio.wait_for(membership.routine, 60)
        assert refused.value.code == 30
        assert refused.value.group_id == group
        assert recorder.calls == []
    finally:
        await membership.stop()


async def test_a_transactions_offsets_carry_the_generation_and_hold_the_stable_read(
    kafka_broker: BrokerHandle, topic_factory: Any, members: Callable[..., Any]
) -> None:
    """Exactly-once's transactional offset commit with the membership's identity is
    accepted by the coordinator, and `committed()` waits while that transaction is open."""
    needs_transactions(kafka_broker)
    topic = await topic_factory(partitions=1)
    group = group_name()
    tp = TopicPartition(topic, 0)
    listener = Recorder()
    membership = await members(group, [topic], listener)
    await wait_until(lambda: bool(listener.owned), timeout_s=20, what="an assignment")
    producer = await transactional(kafka_broker, lambda: membership.identity)
    try:
        await producer.begin_transaction()
        await producer.send_offsets_to_transaction({tp: OffsetAndMetadata(3, "")}, group)
        reading = asyncio.ensure_future(membership.committed([tp]))
        done, _ = await asyncio.wait([reading], timeout=1.0)
        assert not done  # the open transaction holds the offsets
        await producer.commit_transaction()
        found = await asyncio.wait_for(reading, 20)
        assert found[tp] is not None
        assert found[tp].offset == 3
    finally:
        await producer.stop()


class BrokenAssignor(RangePartitionAssignor):  # type: ignore[misc]
    """An assignor that fails when it assigns."""

    name = "broken"

    @classmethod
    def assign(cls, cluster: Any, members: Any) -> Any:
        raise RuntimeError("the assignor broke")


async def test_an_unexpected_error_ends_the_routine_with_it(
    topic_factory: Any, members: Callable[..., Any]
) -> None:
    """An error nobody expects (the leader's assignor raising) ends the membership's
    routine with that error, for the subscription's supervisor to see."""
    topic = await topic_factory(partitions=1)
    membership = await members(group_name(), [topic], Recorder(), assignors=[BrokenAssignor])
    with pytest.raises(RuntimeError, match="the assignor broke"):
        await asyncio.wait_for(membership.routine, 20)


async def test_rejoin_revokes_and_assigns_again_in_a_new_generation(
    kafka_broker: BrokerHandle, topic_factory: Any, members: Callable[..., Any]
) -> None:
    """The owner's rejoin (a topic gone, the subscription changed) revokes what the member
    owns and has it assigned again in the next generation."""
    topic = await topic_factory(partitions=2)
    listener = Recorder()
    membership = await members(group_name(), [topic], listener)
    await wait_until(lambda: len(listener.owned) == 2, timeout_s=20, what="an assignment")
    generation = membership.identity.generation_id
    membership.rejoin("a test asked")
    await wait_until(lambda: len(listener.calls) == 3, timeout_s=20, what="the new assignment")
    assert listener.kinds() == ["assigned", "revoked", "assigned"]
    assert listener.owned == partitions_of(topic, 2)
    if kafka_broker.flavor != "tansu":  # Tansu keeps the generation of a lone member
        assert membership.identity.generation_id > generation


@pytest.fixture
def cluster(three_node_cluster: BrokerHandle) -> BrokerHandle:
    return three_node_cluster


@pytest.mark.timeout(420)  # three JVMs start on a loaded machine
async def test_the_coordinators_node_killed_members_find_the_next_one_and_keep_their_partitions(
    cluster: BrokerHandle,
) -> None:
    """Given two members of a three-node cluster's group, when the node coordinating the
    group is killed, then both find the next coordinator and keep heartbeating: neither
    loses a partition, and commits go on in the same generation."""
    admin = cluster.topic_admin()
    try:
        topic = await admin.create(4, replication_factor=3)
    finally:
        await admin.close(delete=False)
    group = group_name()
    settings = {"session_timeout_ms": 10_000, "heartbeat_interval_ms": 500}
    recorders = (Recorder("a"), Recorder("b"))
    memberships = [
        ClassicMembership(cluster.consumer_config(group, **settings), [topic]) for _ in recorders
    ]
    try:
        for membership, recorder in zip(memberships, recorders, strict=True):
            await membership.start(recorder)
        await settled(*recorders, partitions=partitions_of(topic, 4))
        generation = memberships[0].identity.generation_id
        coordinator = memberships[0].coordinator_id
        assert coordinator is not None
        assert cluster.embedded is not None
        began = time.monotonic()
        cluster.embedded.kill_node(coordinator)
        await wait_until(
            lambda: all(m.coordinator_id not in (None, coordinator) for m in memberships),
            timeout_s=30,
            what="the next coordinator",
        )
        moved_s = time.monotonic() - began
        await asyncio.sleep(2.0)  # heartbeats to the new coordinator
        for membership, recorder in zip(memberships, recorders, strict=True):
            assert "lost" not in recorder.kinds()
            assert membership.identity.generation_id == generation
            owned = next(iter(recorder.owned))
            await membership.commit({owned: OffsetAndMetadata(1, "")})
        print(f"coordinator moved in {moved_s:.3f} s; no partition lost")
    finally:
        for membership in memberships:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(membership.stop(), 20)
