"""A three-node Apache Kafka cluster losing a node while tasks are produced and processed
(the leader of the task topic's partitions, or the group's coordinator): nothing is lost
and the group's commits reach the end."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from decaton_aio import (
    Application,
    BytesSerializer,
    ProcessingContext,
    SubscriptionState,
)
from decaton_aio.admin import TopicAdmin
from decaton_aio.offsets import group_positions
from decaton_aio.producer import TaskProducer
from decaton_aio.testing import BROKER_ENV_VAR, BrokerHandle, wait_until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        os.environ.get(BROKER_ENV_VAR, "apache") == "tansu",
        reason="a three-node cluster is Apache Kafka's (Tansu runs one node)",
    ),
]

TASKS = 600
PARTITIONS = 3


@pytest.fixture
def cluster(three_node_cluster: BrokerHandle) -> BrokerHandle:
    return three_node_cluster


async def _leaders(servers: str, topic: str) -> dict[int, int]:
    """Partition -> the node id leading it."""
    admin = AIOKafkaAdminClient(bootstrap_servers=servers)
    await admin.start()
    try:
        (described,) = await admin.describe_topics([topic])
    finally:
        await admin.close()
    return {p["partition"]: p["leader"] for p in described["partitions"]}


async def _coordinator(servers: str, group: str) -> int:
    """The node id coordinating ``group``."""
    admin = AIOKafkaAdminClient(bootstrap_servers=servers)
    await admin.start()
    try:
        return await admin.find_coordinator(group)
    finally:
        await admin.close()


async def _stream_through_a_kill(
    cluster: BrokerHandle,
    group: str,
    victim_of: Callable[[str], Awaitable[int]],
    **consumer: Any,
) -> tuple[int, str]:
    """Produce TASKS tasks to a new replicated topic and process them in ``group``; halfway,
    kill the node ``victim_of(topic)`` names. Every task put must be processed (at least
    once), the group's commits must reach the end of every partition and the subscription
    must still run. Returns the victim and the topic."""
    assert cluster.embedded is not None
    servers = cluster.bootstrap_servers
    topics = TopicAdmin(servers)
    topic = await topics.create(PARTITIONS, prefix=group, replication_factor=3)
    processed: set[bytes] = set()

    async def process(ctx: ProcessingContext, task: bytes) -> None:
        await asyncio.sleep(0.001)
        processed.add(task)

    app = Application(process, topics=(topic,), serializer=BytesSerializer())
    producer: TaskProducer[bytes] = TaskProducer(
        cluster.producer_config(), topic, BytesSerializer()
    )
    put: list[bytes] = []
    try:
        async with producer, cluster.subscription(app, group, **consumer) as sub:

            async def put_range(start: int, stop: int) -> None:
                for i in range(start, stop):
                    task = f"task-{i:04d}".encode()
                    await producer.put(f"key-{i % 20}", task)
                    put.append(task)

            await put_range(0, TASKS // 2)
            await wait_until(lambda: len(processed) >= 50, what="processing before the kill")
            victim = await victim_of(topic)
            cluster.embedded.kill_node(victim)
            await put_range(TASKS // 2, TASKS)
            await wait_until(
                lambda: processed >= set(put), timeout_s=90, what="every task processed"
            )
            positions: list[int] = []

            async def at_end() -> bool:
                found = await group_positions(servers, group, topic)
                positions[:] = [p.lag for p in found]
                return all(p.committed == p.high_watermark for p in found)

            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30
            while not await at_end():
                assert loop.time() < deadline, f"commits stuck, lag per partition {positions}"
                await asyncio.sleep(0.2)
            assert sub.state is SubscriptionState.RUNNING
    finally:
        await topics.close()
    assert len(put) == TASKS
    assert processed == set(put)
    return victim, topic


@pytest.mark.parametrize("fetch_loop", ["aiokafka", "own"])
async def test_leader_killed_mid_stream_loses_nothing(
    cluster: BrokerHandle, fetch_loop: str
) -> None:
    """Given a replication factor 3 topic and min.insync.replicas=2, when the node leading
    the most partitions is killed halfway through producing, every task put is processed
    (at least once), and the group's committed offsets reach the end of every partition;
    with either fetch loop."""
    servers = cluster.bootstrap_servers

    async def most_leading(topic: str) -> int:
        leaders = list((await _leaders(servers, topic)).values())
        return max(set(leaders), key=leaders.count)

    victim, topic = await _stream_through_a_kill(
        cluster, f"leader-kill-{fetch_loop}", most_leading, fetch_loop=fetch_loop
    )
    assert victim not in (await _leaders(servers, topic)).values()


async def test_the_group_coordinators_node_killed_mid_stream_loses_nothing(
    cluster: BrokerHandle,
) -> None:
    """When the node coordinating the group (leading its offsets partition) is killed
    halfway through producing, the member finds the next coordinator and goes on: every
    task is processed, the group's commits reach the end of every partition, and the
    subscription keeps running; on the group protocol the runtime chooses (the consumer
    protocol here; ``make test-classic`` runs it on the classic one)."""
    servers = cluster.bootstrap_servers
    group = f"coordinator-kill-{uuid.uuid4().hex[:8]}"

    async def coordinator(topic: str) -> int:
        return await _coordinator(servers, group)

    victim, _ = await _stream_through_a_kill(cluster, group, coordinator)
    assert await _coordinator(servers, group) != victim
