"""The consumer's own fetch loop on the embedded Apache Kafka: records in order from an
offset or the reset policy, every codec, read_committed, pause and resume as session
membership, incremental sessions, offsets out of range, a broker's quota, a secured
broker."""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete
from structlog.testing import capture_logs

from decaton_aio._aiokafka import AIOKafkaClient
from decaton_aio.admin import TopicAdmin
from decaton_aio.consumer._records import TaskRecord
from decaton_aio.consumer.fetch import FetchConfig, Fetcher
from decaton_aio.embedded import resolve_kafka_classpath
from decaton_aio.embedded._apache_kafka import java_executable
from decaton_aio.producer import COMPRESSION_TYPES
from decaton_aio.testing import BROKER_ENV_VAR, BrokerHandle, wait_until
from tests.integration.test_isolation import write_transactions

pytestmark = pytest.mark.integration

FetcherFactory = Callable[..., Any]


async def _open(handle: BrokerHandle, config: FetchConfig) -> tuple[AIOKafkaClient, Fetcher]:
    client = AIOKafkaClient(
        bootstrap_servers=handle.bootstrap_servers, **handle.security.client_kwargs()
    )
    await client.bootstrap()
    fetcher = Fetcher(client, config)
    await fetcher.start()
    return client, fetcher


@pytest.fixture
async def fetcher_factory(kafka_broker: BrokerHandle) -> AsyncIterator[FetcherFactory]:
    """``await fetcher_factory(**fetch_config)``: a started fetcher on its own client."""
    opened: list[tuple[AIOKafkaClient, Fetcher]] = []

    async def make(handle: BrokerHandle | None = None, **settings: Any) -> Fetcher:
        settings.setdefault("max_wait_ms", 100)
        client, fetcher = await _open(handle or kafka_broker, FetchConfig(**settings))
        opened.append((client, fetcher))
        return fetcher

    try:
        yield make
    finally:
        for client, fetcher in opened:
            await fetcher.stop()
            await client.close()


async def _produce(
    handle: BrokerHandle,
    topic: str,
    values: dict[int, list[bytes]],
    **settings: Any,
) -> None:
    producer = AIOKafkaProducer(
        bootstrap_servers=handle.bootstrap_servers,
        **handle.security.client_kwargs(),
        **settings,
    )
    await producer.start()
    try:
        futures = [
            await producer.send(topic, value, key=b"k", partition=partition)
            for partition, batch in values.items()
            for value in batch
        ]
        for future in futures:
            await future
    finally:
        await producer.stop()


async def _read(
    fetcher: Fetcher, want: dict[TopicPartition, int], timeout_s: float = 20
) -> dict[TopicPartition, list[TaskRecord]]:
    """Records until each partition of ``want`` has that many (more is kept too)."""
    got: dict[TopicPartition, list[TaskRecord]] = {tp: [] for tp in want}

    async def enough() -> bool:
        for tp, records in (await fetcher.getmany(timeout_ms=200)).items():
            got.setdefault(tp, []).extend(records)
        return all(len(got[tp]) >= n for tp, n in want.items())

    await _until(enough, timeout_s)
    return got


async def _until(predicate: Callable[[], Any], timeout_s: float) -> None:
    """Await ``predicate()`` (a coroutine function) until it is true."""
    async with asyncio.timeout(timeout_s):
        while not await predicate():
            pass


def _values(records: list[TaskRecord]) -> list[bytes | None]:
    return [r.value for r in records]


async def test_three_partitions_are_read_in_order_from_the_offsets_given(
    kafka_broker: BrokerHandle, topic_factory: Any, fetcher_factory: FetcherFactory
) -> None:
    topic = await topic_factory(partitions=3)
    values = {p: [f"{p}-{i}".encode() for i in range(30)] for p in range(3)}
    await _produce(kafka_broker, topic, values)
    fetcher = await fetcher_factory()
    starts = {0: 0, 1: 7, 2: 29}
    tps = {p: TopicPartition(topic, p) for p in range(3)}
    for p, offset in starts.items():
        fetcher.assign(tps[p], offset)
    got = await _read(fetcher, {tps[p]: 30 - starts[p] for p in range(3)})
    for p, start in starts.items():
        records = got[tps[p]]
        assert [r.offset for r in records] == list(range(start, 30))
        assert _values(records) == values[p][start:]
        assert records[0].key == b"k"
        assert fetcher.position(tps[p]) == 30
        assert fetcher.highwater(tps[p]) == 30
    assert await fetcher.getmany(timeout_ms=300) == {}  # nothing twice


async def test_max_records_splits_what_was_fetched_without_loss_or_reorder(
    kafka_broker: BrokerHandle, topic_factory: Any, fetcher_factory: FetcherFactory
) -> None:
    topic = await topic_factory(partitions=2)
    t0, t1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    await _produce(kafka_broker, topic, {0: [b"a"] * 10, 1: [b"b"] * 10})
    fetcher = await fetcher_factory()
    assert fetcher.highwater(t0) is None
    fetcher.assign(t0, 0)
    fetcher.assign(t1, 0)
    seen: dict[TopicPartition, list[int]] = {t0: [], t1: []}
    async with asyncio.timeout(20):
        while len(seen[t0]) + len(seen[t1]) < 20:
            got = await fetcher.getmany(timeout_ms=200, max_records=3)
            assert sum(len(records) for records in got.values()) <= 3
            for tp, records in got.items():
                seen[tp] += [r.offset for r in records]
                assert fetcher.position(tp) == records[-1].offset + 1
    assert seen == {t0: list(range(10)), t1: list(range(10))}
    assert fetcher.counters.records == 20


@pytest.mark.parametrize("policy", ["earliest", "latest"])
async def test_a_partition_without_an_offset_starts_where_the_reset_policy_says(
    kafka_broker: BrokerHandle, topic_factory: Any, fetcher_factory: FetcherFactory, policy: str
) -> None:
    if policy == "latest" and kafka_broker.flavor == "tansu":
        pytest.skip("Tansu answers ListOffsets(latest) short of the end (1 for 2 records)")
    topic = await topic_factory(partitions=1)
    tp = TopicPartition(topic, 0)
    await _produce(kafka_broker, topic, {0: [b"before-0", b"before-1"]})
    fetcher = await fetcher_factory(auto_offset_reset=policy)
    fetcher.assign(tp)
    assert fetcher.position(tp) is None
    await wait_until(lambda: fetcher.position(tp) is not None, timeout_s=20)
    assert fetcher.position(tp) == (0 if policy == "earliest" else 2)
    await _produce(kafka_broker, topic, {0: [b"after"]})
    expected = [b"before-0", b"before-1", b"after"] if policy == "earliest" else [b"after"]
    got = await _read(fetcher, {tp: len(expected)})
    assert _values(got[tp]) == expected
    assert fetcher.counters.offset_resets == 1


@pytest.mark.parametrize("codec", [c for c in COMPRESSION_TYPES if c != "none"])
async def test_records_of_every_codec_are_read(
    kafka_broker: BrokerHandle, topic_factory: Any, fetcher_factory: FetcherFactory, codec: str
) -> None:
    topic = await topic_factory(partitions=1, configs={"compression.type": codec})
    tp = TopicPartition(topic, 0)
    values = [f"{codec}-{i}-".encode() * 20 for i in range(200)]
    await _produce(kafka_broker, topic, {0: values}, compression_type=codec, linger_ms=50)
    fetcher = await fetcher_factory()
    fetcher.assign(tp, 3)
    got = await _read(fetcher, {tp: 197})
    assert _values(got[tp]) == values[3:]
    assert [r.offset for r in got[tp]] == list(range(3, 200))


async def test_read_committed_skips_an_aborted_transaction_and_the_markers(
    kafka_broker: BrokerHandle, topic_factory: Any, fetcher_factory: FetcherFactory
) -> None:
    if not kafka_broker.hides_aborted_transactions:
        pytest.skip("this broker does not hide aborted transactions from read_committed")
    topic = await topic_factory(partitions=1)
    tp = TopicPartition(topic, 0)
    await write_transactions(kafka_broker.bootstrap_servers, topic)
    committed = await fetcher_factory(isolation_level="read_committed")
    uncommitted = await fetcher_factory()
    committed.assign(tp, 0)
    uncommitted.assign(tp, 0)
    got = await _read(committed, {tp: 4})
    assert _values(got[tp]) == [b"c-0", b"c-1", b"c-2", b"c-3"]
    # offsets 0-2, marker 3, aborted 4-5, marker 6, 7, marker 8: past every marker
    await wait_until(lambda: committed.position(tp) == 9, timeout_s=10)
    assert committed.last_stable_offset(tp) == 9
    got = await _read(uncommitted, {tp: 6})
    assert _values(got[tp]) == [b"c-0", b"c-1", b"c-2", b"a-0", b"a-1", b"c-3"]


async def test_a_paused_partition_is_left_out_and_resumes_without_loss_or_duplicate(
    kafka_broker: BrokerHandle, topic_factory: Any, fetcher_factory: FetcherFactory
) -> None:
    topic = await topic_factory(partitions=2)
    t0, t1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    fetcher = await fetcher_factory()
    fetcher.assign(t0, 0)
    fetcher.assign(t1, 0)
    await _produce(kafka_broker, topic, {0: [b"a-0"], 1: [b"b-0"]})
    await _read(fetcher, {t0: 1, t1: 1})
    fetcher.pause(t1)
    assert fetcher.paused() == {t1}
    await _produce(kafka_broker, topic, {0: [b"a-1", b"a-2"], 1: [b"b-1", b"b-2"]})
    got = await _read(fetcher, {t0: 2})
    assert t1 not in got or got[t1] == []
    [session] = fetcher.sessions.values()
    # forgotten by the broker's session once a request sent after the pause is answered
    await wait_until(lambda: t1 not in session.held, timeout_s=5)
    for _ in range(3):  # a few more cycles: nothing of the paused partition
        assert t1 not in await fetcher.getmany(timeout_ms=150)
    assert fetcher.position(t1) == 1
    fetcher.resume(t1)
    got = await _read(fetcher, {t1: 2})
    assert _values(got[t1]) == [b"b-1", b"b-2"]
    assert [r.offset for r in got[t1]] == [1, 2]
    assert await fetcher.getmany(timeout_ms=300) == {}


async def test_requests_after_the_first_are_incremental(
    kafka_broker: BrokerHandle, topic_factory: Any, fetcher_factory: FetcherFactory
) -> None:
    if kafka_broker.flavor == "tansu":
        pytest.skip("Tansu opens no fetch sessions: every request is full")
    topic = await topic_factory(partitions=3)
    fetcher = await fetcher_factory(max_wait_ms=50)
    for p in range(3):
        fetcher.assign(TopicPartition(topic, p), 0)
    await _produce(kafka_broker, topic, {p: [b"first"] for p in range(3)})
    await _read(fetcher, {TopicPartition(topic, p): 1 for p in range(3)})
    full, incremental = fetcher.counters.full_requests, fetcher.counters.incremental_requests
    for round_ in range(3):
        await _produce(kafka_broker, topic, {p: [f"{round_}".encode()] for p in range(3)})
        got = await _read(fetcher, {TopicPartition(topic, p): 1 for p in range(3)})
        assert all(len(records) == 1 for records in got.values())
    counters = fetcher.counters
    assert counters.full_requests == full, counters  # the session held
    assert counters.incremental_requests >= incremental + 3
    assert counters.requests == counters.full_requests + counters.incremental_requests
    assert counters.bytes > 0
    [session] = fetcher.sessions.values()
    assert session.open
    await fetcher.stop()  # closes its session on the broker
    assert not session.open
    assert fetcher.counters.sessions_closed == 1


async def test_a_sessionless_fetcher_sends_full_requests_only(
    kafka_broker: BrokerHandle, topic_factory: Any, fetcher_factory: FetcherFactory
) -> None:
    topic = await topic_factory(partitions=1)
    tp = TopicPartition(topic, 0)
    fetcher = await fetcher_factory(max_wait_ms=20, sessions=False)
    fetcher.assign(tp, 0)
    await _produce(kafka_broker, topic, {0: [b"x", b"y"]})
    got = await _read(fetcher, {tp: 2})
    assert _values(got[tp]) == [b"x", b"y"]
    await wait_until(lambda: fetcher.counters.requests >= 3, timeout_s=10)
    assert fetcher.counters.incremental_requests == 0


async def test_an_offset_out_of_range_is_reset_by_the_policy(
    kafka_broker: BrokerHandle, topic_factory: Any, fetcher_factory: FetcherFactory
) -> None:
    if kafka_broker.flavor == "tansu":
        pytest.skip("Tansu does not delete records (DeleteRecords)")
    topic = await topic_factory(partitions=1)
    tp = TopicPartition(topic, 0)
    await _produce(kafka_broker, topic, {0: [f"v-{i}".encode() for i in range(10)]})
    admin = AIOKafkaAdminClient(
        bootstrap_servers=kafka_broker.bootstrap_servers,
        **kafka_broker.security.client_kwargs(),
    )
    await admin.start()
    try:
        await admin.delete_records({tp: RecordsToDelete(before_offset=6)})
    finally:
        await admin.close()
    fetcher = await fetcher_factory(auto_offset_reset="earliest")
    fetcher.assign(tp, 2)  # deleted
    got = await _read(fetcher, {tp: 4})
    assert [r.offset for r in got[tp]] == [6, 7, 8, 9]
    assert fetcher.counters.offset_resets == 1
    fetcher.seek(tp, 50)  # past the end
    await wait_until(lambda: fetcher.position(tp) == 6, timeout_s=20)
    assert fetcher.counters.offset_resets == 2


async def test_an_offset_out_of_range_without_a_policy_is_raised(
    kafka_broker: BrokerHandle, topic_factory: Any, fetcher_factory: FetcherFactory
) -> None:
    if kafka_broker.flavor == "tansu":
        pytest.skip("Tansu does not answer a fetch past the end with OFFSET_OUT_OF_RANGE")
    from aiokafka.errors import OffsetOutOfRangeError

    topic = await topic_factory(partitions=1)
    tp = TopicPartition(topic, 0)
    await _produce(kafka_broker, topic, {0: [b"only"]})
    fetcher = await fetcher_factory(auto_offset_reset="none")
    fetcher.assign(tp, 5)

    async def raised() -> bool:
        try:
            await fetcher.getmany(timeout_ms=200)
        except OffsetOutOfRangeError:
            return True
        return False

    await _until(raised, 20)
    fetcher.seek(tp, 0)
    got = await _read(fetcher, {tp: 1})
    assert _values(got[tp]) == [b"only"]


@pytest.mark.parametrize("listener", ["secured_kafka_broker", "mtls_kafka_broker"])
async def test_the_fetcher_reads_from_a_secured_broker(
    request: pytest.FixtureRequest, fetcher_factory: FetcherFactory, listener: str
) -> None:
    secured: BrokerHandle = request.getfixturevalue(listener)
    admin = secured.topic_admin()
    try:
        topic = await admin.create(2, prefix="fetcher-secured")
        await _produce(secured, topic, {0: [b"s-0", b"s-1"], 1: [b"s-2"]})
        fetcher = await fetcher_factory(secured)
        t0, t1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
        fetcher.assign(t0)
        fetcher.assign(t1, 0)
        assert fetcher.position(t0) is None
        await wait_until(lambda: fetcher.position(t0) is not None, timeout_s=20)
        fetcher.seek(t0, 0)
        got = await _read(fetcher, {t0: 2, t1: 1})
        assert _values(got[t0]) == [b"s-0", b"s-1"]
        assert _values(got[t1]) == [b"s-2"]
    finally:
        await admin.close()


@pytest.mark.skipif(
    os.environ.get(BROKER_ENV_VAR, "apache") == "tansu",
    reason="a three-node cluster is Apache Kafka's (Tansu runs one node)",
)
async def test_a_consumer_of_a_rack_fetches_from_the_replica_in_it(
    three_node_cluster: BrokerHandle,
) -> None:
    admin = TopicAdmin(three_node_cluster.bootstrap_servers)
    topic = await admin.create(1, prefix="rack", replication_factor=3)
    tp = TopicPartition(topic, 0)
    values = [f"v{i}".encode() for i in range(50)]
    await _produce(three_node_cluster, topic, {0: values}, acks="all")
    described = AIOKafkaAdminClient(bootstrap_servers=three_node_cluster.bootstrap_servers)
    await described.start()
    try:
        ((partition,),) = [t["partitions"] for t in await described.describe_topics([topic])]
    finally:
        await described.close()
    follower = next(n for n in partition["isr"] if n != partition["leader"])
    client = AIOKafkaClient(bootstrap_servers=three_node_cluster.bootstrap_servers)
    await client.bootstrap()
    fetcher = Fetcher(client, FetchConfig(max_wait_ms=100, rack_id=f"rack-{follower}"))
    await fetcher.start()
    try:
        with capture_logs() as logs:
            fetcher.assign(tp, 0)
            got = await _read(fetcher, {tp: len(values)})
        assert _values(got[tp]) == values
        assert {"event": "fetching from a read replica", "node_id": follower} in [
            {k: e.get(k) for k in ("event", "node_id")} for e in logs
        ]
        assert follower in fetcher.sessions
    finally:
        await fetcher.stop()
        await client.close()
        await admin.close(delete=True)


async def test_a_broker_quota_throttles_the_loop_and_loses_nothing(
    kafka_broker: BrokerHandle, topic_factory: Any
) -> None:
    """A consumer byte-rate quota on the loop's client id: the broker answers with a
    throttle time, the loop waits it out before asking that broker again, and every
    record still comes once, in order, with no error (100 KB against 10 KB/s, measured over
    about 10 s: the broker asks for about 11 s of waiting in all)."""
    if kafka_broker.flavor != "apache" or kafka_broker.security.security_protocol != "PLAINTEXT":
        pytest.skip("sets the quota with Apache Kafka's own tool, on a plaintext listener")
    topic = await topic_factory(partitions=1)
    tp = TopicPartition(topic, 0)
    values = [i.to_bytes(4, "big") * 250 for i in range(100)]  # 100 KB
    await _produce(kafka_broker, topic, {0: values}, linger_ms=20)
    client_id = f"quota-{uuid.uuid4().hex[:8]}"
    quota = functools.partial(
        subprocess.run,
        [
            java_executable(),
            "-cp",
            resolve_kafka_classpath(),
            "kafka.admin.ConfigCommand",
            "--bootstrap-server",
            kafka_broker.bootstrap_servers,
            "--alter",
            "--add-config",
            "consumer_byte_rate=10000",
            "--entity-type",
            "clients",
            "--entity-name",
            client_id,
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    await asyncio.to_thread(quota)
    client = AIOKafkaClient(bootstrap_servers=kafka_broker.bootstrap_servers, client_id=client_id)
    await client.bootstrap()
    fetcher = Fetcher(client, FetchConfig(max_wait_ms=100, max_partition_bytes=20_000))
    await fetcher.start()
    try:
        fetcher.assign(tp, 0)
        got = await _read(fetcher, {tp: len(values)}, timeout_s=60)
    finally:
        await fetcher.stop()
        await client.close()
    assert [r.offset for r in got[tp]] == list(range(len(values)))
    assert _values(got[tp]) == values
    assert fetcher.counters.throttled_ms > 0
    assert fetcher.counters.errors == 0
