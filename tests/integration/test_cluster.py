"""A three-node Apache Kafka cluster losing a node while tasks are produced and processed
(the leader of the task topic's partitions, or the group's coordinator): nothing is lost
and the group's commits reach the end. And a leader elected without the records a consumer
had read (an unclean election): the fetch loop notices and reads the new leader's records
from where its log parts, skipping none."""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError

from decaton_aio import (
    Application,
    BytesSerializer,
    ProcessingContext,
    SubscriptionState,
)
from decaton_aio._aiokafka import AIOKafkaClient
from decaton_aio.admin import TopicAdmin
from decaton_aio.consumer.fetch import FetchConfig, Fetcher
from decaton_aio.embedded import resolve_kafka_classpath
from decaton_aio.embedded._apache_kafka import java_executable
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


async def _replicas(servers: str, topic: str) -> tuple[int, list[int]]:
    """The leader and the in-sync replicas of ``topic``'s partition (it has one)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=servers)
    try:
        await admin.start()
        (described,) = await admin.describe_topics([topic])
    except KafkaError:
        return -1, []  # asked a node that is down: asked again
    finally:
        await admin.close()
    for partition in described["partitions"]:
        return partition["leader"], sorted(partition["isr"])
    return -1, []  # not created yet


async def _until_replicas(
    servers: str, topic: str, check: Callable[[tuple[int, list[int]]], bool], what: str
) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while not check(found := await _replicas(servers, topic)):
        assert loop.time() < deadline, f"waiting for {what}: leader and ISR {found}"
        await asyncio.sleep(0.2)


async def _elect_unclean(servers: str, topic: str) -> None:
    """Have the cluster elect a leader of ``topic``-0 among any live replica (Apache
    Kafka's own tool)."""
    run = functools.partial(
        subprocess.run,
        [
            java_executable(),
            "-cp",
            resolve_kafka_classpath(),
            "org.apache.kafka.tools.LeaderElectionCommand",
            "--bootstrap-server",
            servers,
            "--election-type",
            "unclean",
            "--topic",
            topic,
            "--partition",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    result = await asyncio.to_thread(run)
    assert result.returncode == 0, result.stdout + result.stderr


async def _put(servers: str, topic: str, values: list[bytes]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=servers, acks="all")
    await producer.start()
    try:
        for value in values:
            await producer.send_and_wait(topic, value, partition=0)
    finally:
        await producer.stop()


async def test_records_an_unclean_election_lost_are_noticed_and_the_new_ones_all_read(
    cluster: BrokerHandle,
) -> None:
    """Partition 0 on nodes 2 (leader) and 3. Node 3 stops and leaves the in-sync replicas;
    ten records are written to node 2 alone and read; node 2 stops, node 3 comes back and
    is elected without them; fifteen new records are written at offsets 0-14. The loop,
    paused meanwhile at offset 10, must read all fifteen from offset 0: asked from offset
    10 without its last fetched epoch, the new leader would hand out 10-14 and the loop
    would skip five records without a word."""
    embedded = cluster.embedded
    assert embedded is not None
    servers = cluster.bootstrap_servers
    topic = f"unclean-{uuid.uuid4().hex[:8]}"
    tp = TopicPartition(topic, 0)
    admin = AIOKafkaAdminClient(bootstrap_servers=servers)
    await admin.start()
    try:
        await admin.create_topics(
            [
                NewTopic(
                    topic,
                    -1,
                    -1,
                    replica_assignments={0: [2, 3]},
                    topic_configs={
                        "unclean.leader.election.enable": "true",
                        "min.insync.replicas": "1",
                    },
                )
            ]
        )
    finally:
        await admin.close()
    await _until_replicas(servers, topic, lambda found: found == (2, [2, 3]), "leader 2")
    client = AIOKafkaClient(bootstrap_servers=servers)
    await client.bootstrap()
    fetcher = Fetcher(client, FetchConfig(max_wait_ms=100, retry_backoff_ms=50))
    await fetcher.start()
    try:
        embedded.kill_node(3)
        await _until_replicas(servers, topic, lambda found: found == (2, [2]), "ISR [2]")
        old = [f"old-{i}".encode() for i in range(10)]
        await _put(servers, topic, old)
        fetcher.assign(tp, 0)
        read: list[bytes | None] = []
        while len(read) < len(old):
            read.extend(r.value for r in (await fetcher.getmany(timeout_ms=5000)).get(tp, []))
        assert read == old
        fetcher.pause(tp)
        embedded.kill_node(2)
        await asyncio.to_thread(embedded.restart_node, 3)
        await _elect_unclean(servers, topic)
        await _until_replicas(servers, topic, lambda found: found[0] == 3, "leader 3")
        new = [f"new-{i}".encode() for i in range(15)]
        await _put(servers, topic, new)
        fetcher.resume(tp)
        got: list[tuple[int, bytes | None]] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while len(got) < len(new) and loop.time() < deadline:
            batch = (await fetcher.getmany(timeout_ms=1000)).get(tp, [])
            got.extend((r.offset, r.value) for r in batch)
        assert got == list(enumerate(new))
        assert fetcher.counters.truncations == 1
    finally:
        await fetcher.stop()
        await client.close()
