"""Per-key state (``ctx.state``) on a real broker: changelog, restore, checkpoints."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from structlog.testing import capture_logs

from decaton_aio import Application, DurableSender, ProcessingContext, StateStoreConfig
from decaton_aio._connect import start_admin
from decaton_aio.testing import BrokerHandle, read_records, wait_until

pytestmark = pytest.mark.integration


async def produce(task_producer: Any, topic: str, keys: list[str]) -> None:
    producer = await task_producer(topic)
    futures = [await producer.submit(key, b"1") for key in keys]
    await asyncio.gather(*futures)


def counting_app(topic: str, store: StateStoreConfig, seen: dict[str, int]) -> Application:
    async def process(ctx: ProcessingContext, task: bytes) -> None:
        count = ctx.state.get(0) + 1
        ctx.state.set(count)
        seen[ctx.key.decode()] = count  # type: ignore[union-attr]

    return Application(process, topics=(topic,), state=store)


async def run_until(
    broker: BrokerHandle, app: Application, group: str, done: Any, what: str
) -> Any:
    sub = broker.subscription(app, group_id=group)
    async with sub:
        await wait_until(done, what=what, timeout_s=60)
        metrics.append(sub.metrics.render().decode())
        return sub.state_store.reader.history[:] if sub.state_store else []


metrics: list[str] = []  # the last scrape of each run_until


async def test_counts_survive_a_restart_and_reach_the_changelog(
    kafka_broker: BrokerHandle, topic_factory: Any, task_producer: Any, tmp_path: Path
) -> None:
    """A per-key counter kept in ctx.state counts every task of its key once; the changelog
    holds each change (the last record of a key is its count); a second subscription of
    the group (a restart, on the same directory) goes on counting from the restored values,
    and replays only the changes made after the first one's checkpoint (none)."""
    topic = await topic_factory(partitions=2)
    keys = [f"user-{i % 7}" for i in range(140)]
    await produce(task_producer, topic, keys)
    group = f"state-{uuid.uuid4().hex[:8]}"
    store = StateStoreConfig("counts", directory=tmp_path)
    seen: dict[str, int] = {}
    app = counting_app(topic, store, seen)
    await run_until(
        kafka_broker, app, group, lambda: all(seen.get(k) == 20 for k in set(keys)), "20 per key"
    )

    changelog = store.changelog_topic(group)
    records = await read_records(kafka_broker.bootstrap_servers, changelog, 140)
    last = {r.key.decode(): r.value for r in records if r.key is not None}
    assert {k: msgspec.msgpack.decode(v) for k, v in last.items()} == {k: 20 for k in set(keys)}

    await produce(task_producer, topic, keys)
    seen.clear()
    history = await run_until(
        kafka_broker, app, group, lambda: all(seen.get(k) == 40 for k in set(keys)), "40 per key"
    )
    assert sorted(h.partition for h in history) == [0, 1]
    assert sum(h.replayed for h in history) == 0  # the files' checkpoints were at the end
    assert Counter(seen.values()) == Counter({40: 7})


async def fill(
    broker: BrokerHandle, task_producer: Any, topic: str, count: int, keys: int
) -> list[str]:
    names = [f"k{i % keys}" for i in range(count)]
    await produce(task_producer, topic, names)
    return names


async def test_in_memory_copy_replays_the_whole_changelog(
    kafka_broker: BrokerHandle, topic_factory: Any, task_producer: Any
) -> None:
    """Without a directory nothing survives the subscription: the next one restores each
    partition from the changelog's start (every record replayed) and counts on from the
    restored values."""
    topic = await topic_factory(partitions=1)
    keys = await fill(kafka_broker, task_producer, topic, 300, keys=30)
    group = f"state-{uuid.uuid4().hex[:8]}"
    seen: dict[str, int] = {}
    app = counting_app(topic, StateStoreConfig("counts"), seen)
    await run_until(
        kafka_broker,
        app,
        group,
        lambda: len(seen) == 30 and all(v == 10 for v in seen.values()),
        "10 per key",
    )
    await produce(task_producer, topic, keys[:30])
    seen.clear()
    history = await run_until(kafka_broker, app, group, lambda: len(seen) == 30, "one more per key")
    assert [h.replayed for h in history] == [300]
    assert (
        'decaton_state_restored_records_total{store="counts",subscription="decaton-aio"} 300.0'
        in metrics[-1]
    )
    assert set(seen.values()) == {11}


async def failover(
    broker: BrokerHandle, topic: str, task_producer: Any, directory: Path, standbys: int
) -> tuple[int, int]:
    """Two instances count 2,000 tasks over two partitions; the first stops and the second
    restores its partition. Returns (records replayed, changelog end) of that restore."""
    group = f"standby-{uuid.uuid4().hex[:8]}"
    seen: dict[str, int] = {}
    apps = [
        counting_app(
            topic,
            StateStoreConfig("counts", directory=directory / str(i), num_standby_replicas=standbys),
            seen,
        )
        for i in range(2)
    ]
    first = broker.subscription(apps[0], group_id=group)
    second = broker.subscription(apps[1], group_id=group)
    await first.start()
    await second.start()
    try:
        store = second.state_store
        assert store is not None
        await wait_until(
            lambda: len(first.partitions) == 1 == len(second.partitions),
            what="one partition each",
            timeout_s=60,
        )
        await fill(broker, task_producer, topic, 2000, keys=200)
        await wait_until(
            lambda: len(seen) == 200 and set(seen.values()) == {10},
            what="all counted",
            timeout_s=60,
        )
        (moved,) = [tp.partition for tp in first.partitions]
        if standbys:
            await wait_until(
                lambda: store.reader.following() == {moved: False},
                what="a standby of the first's partition",
            )
        before = len(store.reader.history)
        await first.stop()
        await wait_until(lambda: len(second.partitions) == 2, what="failover", timeout_s=60)
        await wait_until(
            lambda: any(h.partition == moved for h in store.reader.history[before:]),
            what="restore of the moved partition",
        )
        (restore,) = [h for h in store.reader.history[before:] if h.partition == moved]
        return restore.replayed, restore.end_offset
    finally:
        await first.stop()
        await second.stop()


async def test_a_failover_to_a_standby_replays_a_small_fraction(
    kafka_broker: BrokerHandle, topic_factory: Any, task_producer: Any, tmp_path: Path
) -> None:
    """Two instances with one standby each: when one stops, the other takes its partition
    and replays at most a tenth of that partition's changelog (its warm copy followed it);
    without standbys the same failover replays the whole partition."""
    with_standby = await failover(
        kafka_broker, await topic_factory(partitions=2), task_producer, tmp_path / "s", 1
    )
    without = await failover(
        kafka_broker, await topic_factory(partitions=2), task_producer, tmp_path / "n", 0
    )
    assert without[0] == without[1] > 0  # the whole partition
    assert with_standby[0] <= with_standby[1] // 10


async def changelog_records(bootstrap_servers: str, topic: str) -> int:
    """How many records a reader from the start of partition 0 gets, up to its end."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap_servers, enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        end = (await consumer.end_offsets([tp]))[tp]
        consumer.seek(tp, 0)  # a compacted log starts at its first kept record
        count = 0
        while await consumer.position(tp) < end:
            batches = await consumer.getmany(tp, timeout_ms=500)
            count += sum(len(records) for records in batches.values())
        return count
    finally:
        await consumer.stop()


async def test_the_changelog_is_compacted_and_restores_from_it(
    kafka_broker: BrokerHandle, topic_factory: Any, task_producer: Any
) -> None:
    """The changelog is created compacted: once Kafka's cleaner ran, it holds about one
    record per key, and a restore from it replays those and yields the same counts."""
    if not kafka_broker.compacts_topics:
        pytest.skip(f"{kafka_broker.flavor} never compacts topics")
    topic = await topic_factory(partitions=1)
    group = f"compact-{uuid.uuid4().hex[:8]}"
    store = StateStoreConfig("counts")
    changelog = store.changelog_topic(group)
    # The changelog as the runtime would make it, with a cleaner that runs at once.
    await topic_factory(
        partitions=1,
        name=changelog,
        configs={
            "cleanup.policy": "compact",
            "segment.ms": "100",
            "min.cleanable.dirty.ratio": "0.01",
            "delete.retention.ms": "100",
        },
    )
    keys = await fill(kafka_broker, task_producer, topic, 500, keys=10)
    seen: dict[str, int] = {}
    app = counting_app(topic, store, seen)
    async with kafka_broker.subscription(app, group_id=group):
        await wait_until(lambda: len(seen) == 10 and set(seen.values()) == {50}, what="50 each")
        producer = await task_producer(topic)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 90
        while await changelog_records(kafka_broker.bootstrap_servers, changelog) > 100:
            assert loop.time() < deadline, "the cleaner did not compact the changelog"
            await producer.put("tick", b"1")  # rolls the active segment
            await asyncio.sleep(1.0)
    assert len(keys) == 500
    seen.clear()
    await produce(task_producer, topic, [f"k{i}" for i in range(10)])
    history = await run_until(kafka_broker, app, group, lambda: len(seen) == 10, "one each")
    assert set(seen.values()) == {51}
    assert history[0].replayed <= 100


async def test_a_restore_reads_every_record_of_a_long_changelog(
    kafka_broker: BrokerHandle, topic_factory: Any, tmp_path: Path
) -> None:
    """A changelog partition longer than one read (25,000 records) is replayed to its end
    before the partition processes, also when another partition's restore ends meanwhile:
    the restore counts every record and the task sees the last value."""
    topic = await topic_factory(partitions=2)
    group = f"long-{uuid.uuid4().hex[:8]}"
    store = StateStoreConfig("counts")
    changelog = await topic_factory(
        partitions=2, name=store.changelog_topic(group), configs={"cleanup.policy": "compact"}
    )
    async with DurableSender(kafka_broker.producer_config(linger_ms=20)) as sender:
        futures = [
            await sender.submit(
                changelog, msgspec.msgpack.encode(i), key=f"k{i % 50}".encode(), partition=0
            )
            for i in range(25_000)
        ]
        await asyncio.gather(*futures)
    seen: dict[str, int] = {}
    app = counting_app(topic, store, seen)
    producer = await DurableSender(kafka_broker.producer_config()).__aenter__()
    try:
        await producer.send(topic, b"1", key=b"k49", partition=0)
    finally:
        await producer.stop()
    history = await run_until(kafka_broker, app, group, lambda: "k49" in seen, "k49 counted")
    assert sorted((h.partition, h.replayed) for h in history) == [(0, 25_000), (1, 0)]
    assert seen == {"k49": 24_999 + 1}


async def test_a_failed_changelog_reader_still_closes_every_client(
    kafka_broker: BrokerHandle, topic_factory: Any, tmp_path: Path
) -> None:
    """When the changelog reader's routine fails, the subscription stops and re-raises
    that failure, and every client it made is closed all the same: the reader's consumer,
    the changelog's sender and the subscription's own sender, and the state directory is
    unlocked (a stop that ended at the first failure left the others' connections open)."""
    topic = await topic_factory(partitions=1)
    app = counting_app(topic, StateStoreConfig("counts", directory=tmp_path), {})
    sub = kafka_broker.subscription(app)
    await sub.start()
    store = sub.state_store
    assert store is not None
    reader, changelog_sender = store.reader, store._sender
    assert changelog_sender is not None
    try:
        await wait_until(lambda: len(sub.partitions) == 1, what="the assignment", timeout_s=60)

        async def broken(*args: Any) -> None:
            raise RuntimeError("the changelog reader broke")

        reader._reassign = broken  # type: ignore[method-assign]
        reader._changed.set()  # the read routine looks at its partitions again
        with pytest.raises(RuntimeError, match="the changelog reader broke"):
            async with asyncio.timeout(60):
                await sub.wait_stopped()
        assert reader._consumer is None
        assert changelog_sender._client is None
        assert sub._sender._client is None
        assert store._lock is None
    finally:
        await sub.stop()


async def test_an_at_least_once_restore_skips_changes_of_aborted_transactions(
    kafka_broker: BrokerHandle, topic_factory: Any, task_producer: Any
) -> None:
    """An exactly-once run before this one may leave changes of aborted transactions in
    the changelog; an at-least-once run restores without them (it read the changelog
    with its consumer's isolation level: a counter went on from the aborted value)."""
    if not kafka_broker.hides_aborted_transactions or not kafka_broker.supports_idempotence:
        pytest.skip(f"{kafka_broker.flavor}: no transactions to abort, or no reader kept from them")
    topic = await topic_factory(partitions=1)
    group = f"aborted-{uuid.uuid4().hex[:8]}"
    store = StateStoreConfig("counts")
    seen: dict[str, int] = {}
    app = counting_app(topic, store, seen)
    await produce(task_producer, topic, ["k"])
    await run_until(kafka_broker, app, group, lambda: seen.get("k") == 1, "the first count")

    aborted = AIOKafkaProducer(
        bootstrap_servers=kafka_broker.bootstrap_servers, transactional_id=f"{group}-aborted"
    )
    await aborted.start()
    try:
        await aborted.begin_transaction()
        changelog = store.changelog_topic(group)
        await aborted.send_and_wait(changelog, msgspec.msgpack.encode(99), key=b"k", partition=0)
        await aborted.abort_transaction()
    finally:
        await aborted.stop()
    await produce(task_producer, topic, ["k"])
    seen.clear()
    await run_until(kafka_broker, app, group, lambda: "k" in seen, "the second count")
    assert seen == {"k": 2}


async def test_a_recreated_changelog_drops_the_copy_restored_from_the_old_one(
    kafka_broker: BrokerHandle, topic_factory: Any, task_producer: Any, tmp_path: Path
) -> None:
    """A copy on disk whose checkpoint is past the end of its changelog (deleted and made
    again, e.g. to reset the application's state) is dropped and restored from the new
    changelog: the counter starts again. It was trusted as it was: its values came back
    and its checkpoint stayed past every new change."""
    topic = await topic_factory(partitions=1)
    group = f"recreated-{uuid.uuid4().hex[:8]}"
    store = StateStoreConfig("counts", directory=tmp_path)
    seen: dict[str, int] = {}
    app = counting_app(topic, store, seen)
    await produce(task_producer, topic, ["k"] * 3)
    await run_until(kafka_broker, app, group, lambda: seen.get("k") == 3, "three counts")

    admin = await start_admin(kafka_broker.bootstrap_servers, kafka_broker.security)
    try:
        await admin.delete_topics([store.changelog_topic(group)])
    finally:
        await admin.close()
    await produce(task_producer, topic, ["k"])
    seen.clear()
    with capture_logs() as logs:
        await run_until(kafka_broker, app, group, lambda: "k" in seen, "the next count")
    assert seen == {"k": 1}
    assert any(e["event"].startswith("the changelog ends before this copy") for e in logs)
