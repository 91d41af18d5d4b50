"""Exactly-once output on Apache Kafka: each input task's output is seen once by a
read_committed reader, across rebalances and restarts, and a restart redoes only what was
in flight. Skipped on Tansu (see ``needs_transactions``)."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError
from structlog.testing import capture_logs

from decaton_aio import Application, ProcessingContext, RetryConfig, RetryPolicy
from decaton_aio._aiokafka import client_of
from decaton_aio.consumer.commit._group_txn import TxnOffsetCommitRequest
from decaton_aio.offsets import group_positions
from decaton_aio.testing import BrokerHandle, committed_offsets, wait_until

pytestmark = pytest.mark.integration


def needs_transactions(broker: BrokerHandle) -> None:
    """Skip where the broker cannot show exactly-once output."""
    if not broker.hides_aborted_transactions or not broker.supports_idempotence:
        pytest.skip(
            f"{broker.flavor}: aiokafka's transactional producer cannot start there and "
            "read_committed readers are not kept from aborted records"
        )


async def read_committed(bootstrap_servers: str, topic: str, *, at_least: int) -> list[bytes]:
    """Every committed record value of ``topic``: read until ``at_least`` arrived and each
    partition's last stable offset is reached (so duplicates would be seen too)."""
    records = await read_all(bootstrap_servers, topic, at_least=at_least)
    return [r.value for r in records if r.value is not None]


async def read_all(
    bootstrap_servers: str,
    topic: str,
    *,
    at_least: int = 0,
    isolation_level: str = "read_committed",
) -> list[Any]:
    """Every record of ``topic`` a reader with ``isolation_level`` gets, tombstones too:
    read until ``at_least`` records arrived and each partition's end (last stable offset,
    or high watermark reading uncommitted) is reached."""
    committed = isolation_level == "read_committed"
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap_servers,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level=isolation_level,
        fetch_max_wait_ms=100,
    )
    await consumer.start()
    values: list[Any] = []
    try:
        parts = consumer.partitions_for_topic(topic) or set()
        if not parts:
            await client_of(consumer).force_metadata_update()
            parts = client_of(consumer).cluster.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while True:
            batch = await consumer.getmany(timeout_ms=200)
            for records in batch.values():
                values += records
            end_of = consumer.last_stable_offset if committed else consumer.highwater
            ends = [end_of(tp) for tp in tps]
            positions = [await consumer.position(tp) for tp in tps]
            if len(values) >= at_least and all(
                e is not None and p >= e for e, p in zip(ends, positions, strict=True)
            ):
                return values
            if loop.time() > deadline:
                raise TimeoutError(f"read {len(values)} of {at_least} records of {topic}")
    finally:
        await consumer.stop()


async def produce_inputs(
    task_producer: Any, topic: str, n: int, keys: int = 20, first: int = 0
) -> None:
    producer = await task_producer(topic)
    for i in range(first, first + n):
        await producer.submit(f"k{i % keys}".encode(), str(i).encode())
    await producer.flush()


def echo_app(topic: str, out: str, seen: list[int], **kw: Any) -> Application:
    async def process(ctx: ProcessingContext, task: bytes) -> None:
        seen.append(int(task))
        await ctx.produce(out, b"out-" + task, key=ctx.key)

    props = {"decaton.commit.interval.ms": kw.pop("interval_ms", 200)}
    props.update(kw.pop("properties", {}))
    return Application(process, topics=(topic,), exactly_once=True, properties=props, **kw)


async def test_each_task_output_is_committed_once(
    kafka_broker: BrokerHandle, topic_factory: Any, task_producer: Any
) -> None:
    """One instance: every input's output is in the output topic exactly once, and the
    group's offsets reach the end."""
    needs_transactions(kafka_broker)
    topic = await topic_factory(partitions=3)
    out = await topic_factory(partitions=2)
    await produce_inputs(task_producer, topic, 300)
    seen: list[int] = []
    async with kafka_broker.subscription(echo_app(topic, out, seen)):
        await wait_until(lambda: len(set(seen)) == 300, timeout_s=60, what="300 tasks")
    values = await read_committed(kafka_broker.bootstrap_servers, out, at_least=300)
    counts = Counter(values)
    assert len(counts) == 300
    assert max(counts.values()) == 1


async def test_a_rebalance_in_the_middle_of_a_transaction(
    kafka_broker: BrokerHandle, topic_factory: Any, task_producer: Any
) -> None:
    """A second member joins while the first holds an open transaction (a long commit
    interval): the first commits it on revoke, the second fences and continues; each
    output is committed exactly once."""
    needs_transactions(kafka_broker)
    topic = await topic_factory(partitions=4)
    out = await topic_factory(partitions=1)
    await produce_inputs(task_producer, topic, 200)
    group = f"eos-{uuid.uuid4().hex[:8]}"
    seen_a: list[int] = []
    seen_b: list[int] = []
    first = kafka_broker.subscription(echo_app(topic, out, seen_a, interval_ms=60_000), group)
    await first.start()
    try:
        await wait_until(lambda: len(set(seen_a)) == 200, timeout_s=60, what="first member")
        txn = first._committer.txn
        assert txn is not None
        await wait_until(
            lambda: all(p.pending == 0 for p in first.partitions.values()),
            what="outputs in the transaction",
        )
        assert txn.open  # outputs wait in the open transaction
        second = kafka_broker.subscription(echo_app(topic, out, seen_b), group)
        async with second:
            await wait_until(
                lambda: 0 < len(first.partitions) < 4 and len(second.partitions) > 0,
                timeout_s=60,
                what="the partitions shared by both members",
            )
            await produce_inputs(task_producer, topic, 200, first=200)
            await wait_until(
                lambda: len(set(seen_a) | set(seen_b)) == 400,
                timeout_s=90,
                what="400 tasks over both members",
            )
            assert {t for t in seen_b if t >= 200}  # the second member took its share
    finally:
        await first.stop()
    values = await read_committed(kafka_broker.bootstrap_servers, out, at_least=400)
    counts = Counter(values)
    assert len(counts) == 400
    assert max(counts.values()) == 1


async def test_a_restart_redoes_only_what_was_in_flight(
    kafka_broker: BrokerHandle, topic_factory: Any, task_producer: Any
) -> None:
    """A task stuck at the head holds the committed offset while 99 tasks above it finish
    and commit their outputs; after a restart only the stuck one runs again, and every
    output is committed once."""
    needs_transactions(kafka_broker)
    topic = await topic_factory(partitions=1)
    out = await topic_factory(partitions=1)
    await produce_inputs(task_producer, topic, 100, keys=100)
    group = f"eos-{uuid.uuid4().hex[:8]}"
    stuck = asyncio.Event()
    first_run: list[int] = []

    async def process(ctx: ProcessingContext, task: bytes) -> None:
        if ctx.offset == 3:
            await stuck.wait()
        first_run.append(ctx.offset)
        await ctx.produce(out, b"out-" + task)

    app = Application(
        process,
        topics=(topic,),
        exactly_once=True,
        properties={
            "decaton.commit.interval.ms": 100,
            "decaton.processing.shutdown.timeout.ms": 200,
        },
    )
    sub = kafka_broker.subscription(app, group)
    async with sub:
        await wait_until(lambda: len(first_run) == 99, what="99 tasks")
        processor = next(iter(sub.partitions.values()))
        await wait_until(
            lambda: processor.last_committed == 3 and not sub._committer.txn.open,  # type: ignore[union-attr]
            what="a commit covering them",
        )
    stuck.set()
    second_run: list[int] = []
    sub = kafka_broker.subscription(echo_app(topic, out, second_run), group)
    async with sub:
        await wait_until(lambda: len(second_run) >= 1, what="the stuck task")
        processor = next(iter(sub.partitions.values()))
        await wait_until(lambda: processor.last_committed == 100, what="the commit at the end")
    assert second_run == [3]
    values = await read_committed(kafka_broker.bootstrap_servers, out, at_least=100)
    assert sorted(Counter(values).values()) == [1] * 100


async def test_retry_and_dead_letter_records_join_the_transaction(
    kafka_broker: BrokerHandle,
    topic_factory: Any,
    task_producer: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under exactly-once, a task sent to the retry topic or the dead letter topic leaves
    exactly one such record for read_committed readers, also when the transactions that
    held them abort and the tasks run again: commits are made to fail until every task ran
    once, and once more."""
    needs_transactions(kafka_broker)
    topic = await topic_factory(partitions=2)
    await produce_inputs(task_producer, topic, 30, keys=30)
    seen: Counter[int] = Counter()
    aborted = 0
    real_commit = AIOKafkaProducer.commit_transaction

    async def failing_commit(self: AIOKafkaProducer) -> None:
        nonlocal aborted
        if len(seen) < 30 or aborted < 3:
            aborted += 1
            raise KafkaError("a commit forced to fail")
        await real_commit(self)

    monkeypatch.setattr(AIOKafkaProducer, "commit_transaction", failing_commit)

    async def process(ctx: ProcessingContext, task: bytes) -> None:
        n = int(task)
        seen[n] += 1
        if ctx.metadata.retry_count == 0 and n % 3 == 1:
            ctx.retry(300.0)  # waits in the retry topic for the rest of the test
        elif n % 3 == 2:
            raise ValueError(f"task {n} cannot be done")

    app = Application(
        process,
        topics=(topic,),
        exactly_once=True,
        retry=RetryConfig(RetryPolicy(max_attempts=3, no_retry_on=(ValueError,)), mode="queue"),
        properties={"decaton.commit.interval.ms": 200},
    )
    group = f"eos-side-{uuid.uuid4().hex[:8]}"
    async with kafka_broker.subscription(app, group):
        await wait_until(
            lambda: len(seen) == 30 and aborted >= 3, timeout_s=60, what="aborted commits"
        )
        positions = await wait_for_commits(kafka_broker, group, topic)
    assert sum(p.lag for p in positions) == 0
    assert max(seen.values()) >= 2  # aborted transactions made tasks run again
    retried = await read_all(kafka_broker.bootstrap_servers, f"{topic}-retry", at_least=10)
    dead = await read_all(kafka_broker.bootstrap_servers, f"{topic}-dlq", at_least=10)
    assert sorted(int(r.value) for r in retried) == list(range(1, 30, 3))
    assert sorted(int(r.value) for r in dead) == list(range(2, 30, 3))


async def wait_for_commits(broker: BrokerHandle, group: str, topic: str) -> list[Any]:
    """The group's positions once its commits reached the end of every partition."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while True:
        found = await group_positions(
            broker.bootstrap_servers, group, topic, isolation_level="read_committed"
        )
        if sum(p.lag for p in found) == 0 or loop.time() > deadline:
            return found
        await asyncio.sleep(0.2)


async def test_each_commit_carries_the_offsets_of_every_partition(
    kafka_broker: BrokerHandle,
    topic_factory: Any,
    task_producer: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One transaction for the instance, and each of its offset commits names every
    partition the instance holds, the ones without new work too (as last committed), so
    the group's generation check covers every partition whose records it holds."""
    needs_transactions(kafka_broker)
    topic = await topic_factory(partitions=3)
    out = await topic_factory(partitions=1)
    await produce_inputs(task_producer, topic, 60, keys=60)  # every partition gets some
    sent: list[dict[int, int]] = []
    real = TxnOffsetCommitRequest.__init__

    def record(self: Any, *args: Any) -> None:
        real(self, *args)
        sent.append({tp.partition: o.offset for tp, o in args[-1].items()})

    monkeypatch.setattr(TxnOffsetCommitRequest, "__init__", record)
    seen: list[int] = []
    sub = kafka_broker.subscription(echo_app(topic, out, seen))
    async with sub:
        await wait_until(lambda: len(seen) == 60, what="60 tasks")
        positions = await wait_for_commits(kafka_broker, sub.consumer_config.group_id, topic)
        assert sum(p.lag for p in positions) == 0
        before = {p.partition: p.committed for p in positions}
        sent.clear()
        await produce_inputs(task_producer, topic, 20, keys=1, first=60)  # one partition
        await wait_until(lambda: len(seen) == 80, what="20 more tasks")
        positions = await wait_for_commits(kafka_broker, sub.consumer_config.group_id, topic)
    assert sum(p.lag for p in positions) == 0
    assert sent, "no offsets were committed in a transaction"
    assert all(set(offsets) == {0, 1, 2} for offsets in sent), sent
    moved = {p for offsets in sent for p, o in offsets.items() if o != before[p]}
    assert len(moved) == 1  # only the partition with new tasks moved


async def test_a_reloaded_commit_interval_past_the_transaction_timeout_is_capped(
    kafka_broker: BrokerHandle, topic_factory: Any, task_producer: Any
) -> None:
    """The transaction timeout is set at start (10 s for a 200 ms interval); a commit
    interval reloaded to 60 s would leave every transaction open past it, to be aborted
    by the broker, round after round. It is capped at a third of the timeout, with a
    warning, and the outputs of tasks fed after the reload are committed."""
    needs_transactions(kafka_broker)
    topic = await topic_factory(partitions=2)
    out = await topic_factory(partitions=1)
    seen: list[int] = []
    with capture_logs() as logs:
        async with kafka_broker.subscription(echo_app(topic, out, seen)) as sub:
            sub.properties.update({"decaton.commit.interval.ms": 60_000})
            await produce_inputs(task_producer, topic, 50)
            await wait_until(lambda: len(set(seen)) == 50, timeout_s=60, what="50 tasks")
            values = await read_committed(kafka_broker.bootstrap_servers, out, at_least=50)
    assert sorted(values) == sorted(b"out-%d" % i for i in range(50))
    (capped,) = [e for e in logs if e["event"].startswith("decaton.commit.interval.ms is above")]
    assert (capped["wanted_ms"], capped["commit_interval_ms"]) == (60_000, 3_333)


async def test_an_output_the_broker_refuses_aborts_the_transaction(
    kafka_broker: BrokerHandle, topic_factory: Any, task_producer: Any
) -> None:
    """An output larger than its topic takes (the client sends it, the broker refuses
    it) aborts the transaction: the task's offset is not committed and it runs again.
    The client commits a transaction whatever became of its records, so the offset was
    committed and the output lost."""
    needs_transactions(kafka_broker)
    topic = await topic_factory(partitions=1)
    out = await topic_factory(partitions=1, configs={"max.message.bytes": "1000"})
    runs: list[int] = []

    async def process(ctx: ProcessingContext, task: bytes) -> None:
        runs.append(ctx.offset)
        await ctx.produce(out, b"x" * 5000, key=ctx.key)

    app = Application(
        process,
        topics=(topic,),
        exactly_once=True,
        properties={"decaton.commit.interval.ms": 200},
    )
    await produce_inputs(task_producer, topic, 1)
    group = f"refused-{uuid.uuid4().hex[:8]}"
    with capture_logs() as logs:
        async with kafka_broker.subscription(app, group_id=group):
            await wait_until(lambda: len(runs) >= 3, timeout_s=60, what="the task run 3 times")
    assert set(runs) == {0}
    assert any(e["event"].startswith("the broker refused a record") for e in logs)
    committed = await committed_offsets(kafka_broker.bootstrap_servers, group, topic, [0])
    assert committed[0] in (None, 0)
    assert await read_committed(kafka_broker.bootstrap_servers, out, at_least=0) == []


async def test_a_dead_letter_too_large_to_send_becomes_a_reference_in_the_transaction(
    kafka_broker: BrokerHandle, topic_factory: Any, task_producer: Any
) -> None:
    """Exactly-once: a task whose dead letter record (its value plus the error headers)
    is larger than the client sends gets a reference to it in the dead letter topic, in
    the transaction, and its offset is committed, as without a transaction (the client
    refused the record at every try and the partition never committed again)."""
    needs_transactions(kafka_broker)
    topic = await topic_factory(partitions=1)
    ran: list[int] = []

    async def process(ctx: ProcessingContext, task: bytes) -> None:
        ran.append(ctx.offset)
        raise ValueError("refused: " + "x" * 900)

    app = Application(
        process,
        topics=(topic,),
        exactly_once=True,
        retry=RetryConfig(RetryPolicy(no_retry_on=(ValueError,))),
        properties={"decaton.commit.interval.ms": 200},
    )
    producer = await task_producer(topic)
    await (await producer.submit(b"k", b"v" * 1_047_800))  # just under what is sent
    group = f"reference-{uuid.uuid4().hex[:8]}"
    async with kafka_broker.subscription(app, group_id=group):
        dead = await read_all(kafka_broker.bootstrap_servers, f"{topic}-dlq", at_least=1)
    assert ran == [0]
    ((reference),) = dead
    headers = dict(reference.headers)
    assert reference.value == b""
    assert headers["dt_dlq_error_type"] == b"RecordRejected"
    assert headers["dt_dlq_origin_offset"] == b"0"
    committed = await committed_offsets(kafka_broker.bootstrap_servers, group, topic, [0])
    assert committed[0] == 1
