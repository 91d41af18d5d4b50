"""A subscribed topic deleted while the group rejoins: no member keeps a partition the
cluster does not have, and the other topic goes on being processed and committed."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from decaton_aio import Application, ProcessingContext
from decaton_aio._connect import start_admin
from decaton_aio.consumer import Subscription, SubscriptionState
from decaton_aio.errors import BrokerError
from decaton_aio.offsets import group_positions
from decaton_aio.testing import BrokerHandle, wait_until

pytestmark = pytest.mark.integration


async def cluster_partitions(client: AIOKafkaAdminClient, topic: str) -> set[int]:
    """The partitions of ``topic`` the cluster has now (listing topics creates none,
    unlike asking for one by name on a broker that creates topics on demand)."""
    if topic not in set(await client.list_topics()):
        return set()
    (described,) = await client.describe_topics([topic])
    return {p["partition"] for p in described.get("partitions") or []}


def live(*subs: Subscription) -> set[TopicPartition]:
    """The partitions the subscriptions feed now (held ones left out)."""
    return {tp for sub in subs for tp, p in sub.partitions.items() if not p.closed}


async def test_a_topic_deleted_during_a_rejoin_leaves_no_stale_partition(
    kafka_broker: BrokerHandle, topic_factory: Any, task_producer: Any
) -> None:
    """Given a member holding two topics, one of them with tasks still running, when a
    second member joins and that topic is deleted while the group rejoins: within a
    rebalance or two no member feeds a partition the cluster does not have (a broker
    that creates topics on demand may have made a new, smaller one of that name), and
    the tasks of the other topic produced afterwards are all processed and committed.

    The race: the revoke's final commit names the deleted topic, and the new member,
    leading the group meanwhile, assigns from metadata it read before the deletion. Left
    alone, such an assignment lasts until the client's next metadata refresh (5 minutes
    here), and the other topic's partitions on the same broker are not fetched."""
    if kafka_broker.flavor == "tansu":
        pytest.skip("Tansu's topic deletion does not end the topic's partitions")
    keep = await topic_factory(partitions=2)
    deleting = kafka_broker.topic_admin()
    gone = await deleting.create(
        2, prefix="gone", replication_factor=kafka_broker.replication_factor
    )
    for topic in (keep, gone):
        producer = await task_producer(topic)
        await asyncio.gather(*[await producer.submit(f"k{i % 4}", b"x") for i in range(20)])
    seen: list[tuple[str, int, int]] = []
    early, release = asyncio.Event(), asyncio.Event()

    def of(topic: str) -> set[tuple[str, int, int]]:
        return {task for task in seen if task[0] == topic}  # each once (redeliveries too)

    async def process(ctx: ProcessingContext, task: bytes) -> None:
        seen.append((ctx.topic, ctx.partition, ctx.offset))
        # Of the topic that goes, the first few finish as it goes (the revoke's final
        # commit names it), the others are still running.
        if ctx.topic == gone:
            await (early if ctx.offset < 3 else release).wait()

    group = f"deleted-{uuid.uuid4().hex[:8]}"
    properties = {"decaton.commit.interval.ms": 200, "decaton.group.rebalance.timeout.ms": 500}
    first, second = (
        kafka_broker.subscription(
            Application(process, topics=(keep, gone), properties=properties),
            group,
            metadata_max_age_ms=300_000,  # the client's own refresh: none during the test
        )
        for _ in range(2)
    )
    admin = await start_admin(kafka_broker.bootstrap_servers, kafka_broker.security)
    try:
        await first.start()
        await wait_until(
            lambda: len(of(keep)) == 20 and bool(of(gone)),
            what="the first member's tasks",
            timeout_s=60,
        )
        rejoining = asyncio.Event()
        first.on_state_change(
            lambda state: state is SubscriptionState.REBALANCING and rejoining.set()
        )
        await second.start()  # its client reads the cluster's metadata: the topic is there
        await rejoining.wait()  # the first member's revoke began: it drains, then commits
        await deleting.close()  # deletes the topic
        early.set()
        producer = await task_producer(keep)
        await asyncio.gather(*[await producer.submit(f"k{i % 4}", b"y") for i in range(20)])

        async def unsettled() -> str | None:
            # What still differs from the settled group (None: nothing).
            existing = {TopicPartition(gone, p) for p in await cluster_partitions(admin, gone)}
            fed = live(first, second)
            stale = {tp for tp in fed if tp.topic == gone} - existing
            kept = {tp for tp in fed if tp.topic == keep}
            positions = await group_positions(kafka_broker.bootstrap_servers, group, keep)
            processed = len(of(keep))
            if (
                not stale
                and len(kept) == 2
                and processed == 40
                and all(p.lag == 0 for p in positions)
            ):
                return None
            return (
                f"stale {sorted(stale)}, {keep} fed {sorted(kept)}, {processed} of its 40 "
                f"tasks processed, {positions}"
            )

        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        wrong: str | None = "not looked at yet"
        while wrong is not None:
            assert loop.time() < deadline, wrong
            try:
                wrong = await unsettled()
            except (KafkaError, BrokerError) as exc:  # a request the busy broker dropped
                wrong = repr(exc)
            if wrong is not None:
                await asyncio.sleep(0.2)
    finally:
        release.set()
        await first.stop()
        await second.stop()
        if await cluster_partitions(admin, gone):  # what the clients made of that name
            await admin.delete_topics([gone])
        await admin.close()
