"""A three-node Apache Kafka cluster losing the leader of the task topic's partitions while
tasks are produced and processed: nothing is lost and the group's commits reach the end."""

from __future__ import annotations

import asyncio
import os

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


@pytest.mark.parametrize("fetch_loop", ["aiokafka", "own"])
async def test_leader_killed_mid_stream_loses_nothing(
    cluster: BrokerHandle, fetch_loop: str
) -> None:
    """Given a replication factor 3 topic and min.insync.replicas=2, when the node leading
    the most partitions is killed halfway through producing, every task put is processed
    (at least once), and the group's committed offsets reach the end of every partition;
    with either fetch loop."""
    assert cluster.embedded is not None
    servers = cluster.bootstrap_servers
    topics = TopicAdmin(servers)
    topic = await topics.create(PARTITIONS, prefix="leader-kill", replication_factor=3)
    processed: set[bytes] = set()

    async def process(ctx: ProcessingContext, task: bytes) -> None:
        await asyncio.sleep(0.001)
        processed.add(task)

    app = Application(process, topics=(topic,), serializer=BytesSerializer())
    producer: TaskProducer[bytes] = TaskProducer(
        cluster.producer_config(), topic, BytesSerializer()
    )
    put: list[bytes] = []
    group = f"leader-kill-{fetch_loop}"
    try:
        async with producer, cluster.subscription(app, group, fetch_loop=fetch_loop) as sub:

            async def put_range(start: int, stop: int) -> None:
                for i in range(start, stop):
                    task = f"task-{i:04d}".encode()
                    await producer.put(f"key-{i % 20}", task)
                    put.append(task)

            await put_range(0, TASKS // 2)
            await wait_until(lambda: len(processed) >= 50, what="processing before the kill")
            leaders = list((await _leaders(servers, topic)).values())
            victim = max(set(leaders), key=leaders.count)
            cluster.embedded.kill_node(victim)
            await put_range(TASKS // 2, TASKS)
            await wait_until(
                lambda: processed >= set(put), timeout_s=90, what="every task processed"
            )
            new_leaders = await _leaders(servers, topic)
            assert victim not in new_leaders.values()
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
