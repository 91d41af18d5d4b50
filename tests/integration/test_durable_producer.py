"""The durable producer against a real broker: spool when the broker is away, replay later.

Tests that stop and restart a broker run their own embedded broker (memory storage: what
the first broker acknowledged is gone after the restart, so those tests check what was
spooled or sent after the restart). They are skipped against an external cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from structlog.testing import capture_logs

from decaton_aio import (
    METADATA_HEADER,
    BytesSerializer,
    MissingTopicError,
    ProducerError,
    RecordRejectedError,
    decode_metadata,
)
from decaton_aio.embedded import EmbeddedBroker, find_free_port
from decaton_aio.offsets import topic_partitions
from decaton_aio.producer import (
    DurableSender,
    ProducerConfig,
    RecordLocation,
    SenderMode,
    TaskProducer,
)
from decaton_aio.testing import (
    BOOTSTRAP_ENV_VAR,
    BrokerHandle,
    TopicAdmin,
    read_records,
    recent_timestamp_ms,
)

# A fixed record time inside the broker's time retention.
RECORD_MS = recent_timestamp_ms()

pytestmark = pytest.mark.integration

own_broker = pytest.mark.skipif(
    bool(os.environ.get(BOOTSTRAP_ENV_VAR, "").strip()),
    reason="stops and restarts its own embedded broker; an external cluster cannot be stopped",
)

REPO_ROOT = Path(__file__).resolve().parents[2]


def durable_config(servers: str, spool_dir: Path, **overrides: Any) -> ProducerConfig:
    """Short client timeouts, so a dead broker is noticed in about a second."""
    settings: dict[str, Any] = {
        "idempotence": False,
        "request_timeout_ms": 1000,
        "linger_ms": 2,
        "replay_backoff_ms": 50,
        "replay_backoff_max_ms": 500,
        "spool_dir": spool_dir,
    }
    return ProducerConfig(servers, **(settings | overrides))


async def create_topic(servers: str, name: str | None = None, partitions: int = 2) -> str:
    admin = TopicAdmin(servers)
    try:
        return await admin.create(partitions, name=name)
    finally:
        await admin.close(delete=False)


def crash(broker: EmbeddedBroker) -> None:
    """Kill the broker at once (SIGKILL by its own PID), as a crash would."""
    if broker.pid is not None:
        os.kill(broker.pid, signal.SIGKILL)
    broker.stop()


def segment_files(spool_dir: Path) -> list[Path]:
    return sorted(spool_dir.glob("spool-*.jsonl"))


async def read_all(
    servers: str, topic: str, at_least: int, idle_s: float = 1.0
) -> list[ConsumerRecord[bytes, bytes]]:
    """Every record of the topic: read until ``at_least`` came and then nothing for a while.

    All partitions the broker reports are read: the embedded broker auto-creates a topic
    (with its own partition count) when a client asks for it before it is created again.
    """
    consumer = AIOKafkaConsumer(bootstrap_servers=servers, enable_auto_commit=False)
    await consumer.start()
    records: list[ConsumerRecord[bytes, bytes]] = []
    try:
        tps = [TopicPartition(topic, p) for p in await topic_partitions(consumer, topic)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        quiet_since = loop.time()
        while loop.time() < deadline:
            batch = await consumer.getmany(timeout_ms=200, max_records=10_000)
            got = [record for part in batch.values() for record in part]
            records += got
            if got:
                quiet_since = loop.time()
            elif len(records) >= at_least and loop.time() - quiet_since >= idle_s:
                break
    finally:
        await consumer.stop()
    return records


@pytest.fixture
async def own_embedded_broker() -> AsyncIterator[list[EmbeddedBroker]]:
    """A list holding the test's broker; a test replacing it appends the new one."""
    brokers: list[EmbeddedBroker] = [EmbeddedBroker().start()]
    try:
        yield brokers
    finally:
        for broker in brokers:
            broker.stop()


@own_broker
async def test_broker_down_mid_stream_spools_then_replays_everything(
    own_embedded_broker: list[EmbeddedBroker], tmp_path: Path
) -> None:
    """Given 8 keys put continuously, when the broker crashes, puts keep returning
    (spooled, fsynced); when a broker is back on the same port, the replayer delivers the
    spool, the producer sends directly again, the spool directory empties, every spooled
    task and every task put after the restart is in the log, and per key the last copy
    of each task is in put order."""
    broker = own_embedded_broker[0]
    port = broker.port
    topic = await create_topic(broker.bootstrap_servers)
    spool_dir = tmp_path / "spool"
    producer: TaskProducer[bytes] = TaskProducer(
        durable_config(broker.bootstrap_servers, spool_dir), topic, BytesSerializer()
    )
    await producer.start()
    sender = producer.sender
    assert sender is not None

    results: dict[bytes, RecordLocation] = {}
    after_restart: set[bytes] = set()  # put (called) once the new broker had the topic
    phase = {"restarted": False}
    stop = asyncio.Event()
    progress = asyncio.Event()  # set after every answered put

    async def stream(key: str) -> None:
        n = 0
        while not stop.is_set():
            value = f"{key}:{n:05d}".encode()
            called_after_restart = phase["restarted"]
            results[value] = await producer.put(key, value)
            if called_after_restart:
                after_restart.add(value)
            progress.set()
            n += 1
            await asyncio.sleep(0.005)

    async def until(predicate: Any, what: str, timeout_s: float = 20) -> None:
        try:
            async with asyncio.timeout(timeout_s):
                while not predicate():
                    progress.clear()
                    await progress.wait()
        except TimeoutError:
            raise AssertionError(f"timed out waiting for {what}") from None

    streams = [asyncio.create_task(stream(f"key-{k}")) for k in range(8)]
    try:
        await until(lambda: len(results) >= 80, "puts before the crash")
        crash(broker)
        await until(
            lambda: sum(w.spooled for w in results.values()) >= 40, "spooled puts", timeout_s=15
        )
        assert sender.mode is SenderMode.SPOOLING

        broker = EmbeddedBroker(port=port).start()
        own_embedded_broker.append(broker)
        # Memory storage lost the topic with the old broker: create it again.
        await create_topic(broker.bootstrap_servers, name=topic)
        phase["restarted"] = True
        await sender.wait_drained(timeout_s=30)
        direct_before = sum(not w.spooled for w in results.values())
        await until(
            lambda: sum(not w.spooled for w in results.values()) >= direct_before + 40,
            "direct puts after the replay",
        )
    finally:
        stop.set()
        await asyncio.gather(*streams, return_exceptions=True)
        await producer.stop()

    spooled = {value for value, where in results.items() if where.spooled}
    assert all(results[v].offset == -1 and results[v].spool_id for v in spooled)
    assert segment_files(spool_dir) == []
    must_arrive = spooled | after_restart
    records = await read_all(broker.bootstrap_servers, topic, at_least=len(must_arrive))
    values = [r.value for r in records]
    assert must_arrive <= set(values), f"lost: {sorted(must_arrive - set(values))[:10]}"

    last_copy_order: dict[bytes, dict[bytes, int]] = defaultdict(dict)
    for position, record in enumerate(sorted(records, key=lambda r: (r.partition, r.offset))):
        assert record.key is not None
        last_copy_order[record.key][record.value] = position
    for key, positions in last_copy_order.items():
        in_log = sorted(positions, key=positions.__getitem__)
        assert in_log == sorted(in_log), f"key {key!r} out of order"


@own_broker
async def test_no_broker_at_start_spools_until_one_comes_up(tmp_path: Path) -> None:
    """Given no broker on the port, start succeeds in spooling mode and a put is spooled;
    when a broker comes up there, the task is delivered with its dt_meta header, and later
    puts go directly."""
    port = find_free_port()
    servers = f"127.0.0.1:{port}"
    spool_dir = tmp_path / "spool"
    producer: TaskProducer[bytes] = TaskProducer(
        durable_config(servers, spool_dir), "no-broker-yet", BytesSerializer()
    )
    broker = EmbeddedBroker(port=port)
    try:
        await producer.start()
        assert producer.sender is not None
        assert producer.sender.mode is SenderMode.SPOOLING

        first = await producer.put("user-1", b"first", timestamp_ms=RECORD_MS + 1)
        assert first.spooled
        assert first.offset == -1
        assert first.spool_id
        assert producer.sender.spool_size == 1

        broker.start()
        await create_topic(servers, name="no-broker-yet", partitions=1)
        await producer.sender.wait_drained(timeout_s=30)
        assert producer.sender.mode is SenderMode.DIRECT
        second = await producer.put("user-1", b"second")
        assert not second.spooled
        assert second.offset >= 1
        await producer.stop()

        records = await read_records(servers, "no-broker-yet", 2)
        assert [r.value for r in records] == [b"first", b"second"]
        assert records[0].key == b"user-1"
        assert records[0].timestamp == RECORD_MS + 1
        meta = decode_metadata(dict(records[0].headers)[METADATA_HEADER])
        assert meta.timestamp_ms == RECORD_MS + 1
        assert segment_files(spool_dir) == []
    finally:
        await producer.stop()
        broker.stop()


@own_broker
async def test_without_a_spool_a_dead_broker_fails_the_put(
    own_embedded_broker: list[EmbeddedBroker],
) -> None:
    """No spool_dir: the old behaviour; a put the broker cannot take raises ProducerError."""
    broker = own_embedded_broker[0]
    topic = await create_topic(broker.bootstrap_servers, partitions=1)
    config = ProducerConfig(broker.bootstrap_servers, idempotence=False, request_timeout_ms=1000)
    async with TaskProducer(config, topic, BytesSerializer()) as producer:
        assert (await producer.put("k", b"before")).offset == 0
        crash(broker)
        with pytest.raises(ProducerError, match="did not take"):
            await producer.put("k", b"after")


_CRASHING_PRODUCER = """
import asyncio, sys
import structlog
structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
from decaton_aio.producer import ProducerConfig, TaskProducer
from decaton_aio.serializers import BytesSerializer

async def main(servers, spool_dir, topic):
    config = ProducerConfig(servers, idempotence=False, request_timeout_ms=1000,
                            spool_dir=spool_dir)
    producer = TaskProducer(config, topic, BytesSerializer())
    await producer.start()
    n = 0
    while True:  # until SIGKILL; never stopped cleanly
        value = f"task-{n:05d}"
        where = await producer.put(f"key-{n % 5}", value.encode())
        print("PUT", where.spooled, where.spool_id, value, flush=True)
        n += 1

asyncio.run(main(*sys.argv[1:4]))
"""


async def test_spool_of_a_killed_process_is_replayed_on_start(
    kafka_broker: BrokerHandle, topic_factory: Any, tmp_path: Path
) -> None:
    """Given a producer process with no reachable broker, SIGKILLed in the middle of its
    puts, a new producer on the same spool directory delivers every put the dead process
    had answered (a corrupt line added by hand is moved aside), and empties the spool."""
    topic = await topic_factory(partitions=3)
    spool_dir = tmp_path / "spool"
    dead = f"127.0.0.1:{find_free_port()}"
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _CRASHING_PRODUCER,
        dead,
        str(spool_dir),
        topic,
        cwd=REPO_ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    answered: list[bytes] = []
    try:
        assert child.stdout is not None
        async with asyncio.timeout(30):
            while len(answered) < 200:
                line = (await child.stdout.readline()).decode()
                assert line, "the producer process ended early"
                if line.startswith("PUT "):
                    _, spooled, _, value = line.split()
                    assert spooled == "True"
                    answered.append(value.encode())
    finally:
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signal.SIGKILL)
        await child.wait()

    newest = segment_files(spool_dir)[-1]
    with newest.open("ab") as handle:
        handle.write(b"\nthis line is not json\n")
    kept = [
        json.loads(line)
        for path in segment_files(spool_dir)
        for line in path.read_bytes().splitlines()
        if line.startswith(b'{"v":1') and line.endswith(b"}")
    ]
    assert len(kept) >= len(answered)

    config = durable_config(
        kafka_broker.bootstrap_servers,
        spool_dir,
        idempotence=kafka_broker.supports_idempotence,
    )
    async with DurableSender(config) as sender:
        assert sender.mode is SenderMode.SPOOLING
        await sender.wait_drained(timeout_s=30)
    assert segment_files(spool_dir) == []
    assert (newest.with_suffix(".corrupt")).read_bytes().strip() == b"this line is not json"

    records = await read_records(kafka_broker.bootstrap_servers, topic, len(kept))
    values = {r.value for r in records}
    assert set(answered) <= values
    for record in records:
        assert METADATA_HEADER in dict(record.headers)


async def test_shared_sender_for_raw_records_and_tasks(
    kafka_broker: BrokerHandle, topic_factory: Any, tmp_path: Path
) -> None:
    """One sender serves raw sends (the runtime's retry path) and a task producer; a
    delivered record reports where it landed, and headers arrive as sent."""
    topic = await topic_factory(partitions=2)
    config = durable_config(
        kafka_broker.bootstrap_servers,
        tmp_path / "spool",
        idempotence=kafka_broker.supports_idempotence,
    )
    async with DurableSender(config) as sender:
        assert sender.mode is SenderMode.DIRECT
        raw = await sender.send(
            topic,
            b"raw",
            key=b"k",
            headers=[("h", b"1"), ("h", b"2")],
            partition=1,
            timestamp_ms=RECORD_MS,
        )
        assert (raw.topic, raw.partition, raw.offset, raw.spooled) == (topic, 1, 0, False)
        tasks: TaskProducer[bytes] = TaskProducer(config, topic, BytesSerializer(), sender=sender)
        await tasks.start()
        where = await tasks.put("k", b"task", partition=1)
        await tasks.stop()  # a shared sender stays up
        assert (where.partition, where.offset, where.spooled) == (1, 1, False)
        assert (await sender.send(topic, b"still", key=None, partition=0)).offset == 0

    records = await read_records(kafka_broker.bootstrap_servers, topic, 3)
    first = next(r for r in records if r.value == b"raw")
    assert list(first.headers) == [("h", b"1"), ("h", b"2")]
    assert first.timestamp == RECORD_MS


@own_broker
async def test_delivery_timeout_spools_before_the_client_gives_up(
    own_embedded_broker: list[EmbeddedBroker], tmp_path: Path
) -> None:
    """A record not acknowledged within delivery_timeout_ms is spooled then, even while
    the client would keep retrying (as an idempotent client does, forever)."""
    broker = own_embedded_broker[0]
    topic = await create_topic(broker.bootstrap_servers, partitions=1)
    config = durable_config(
        broker.bootstrap_servers,
        tmp_path / "spool",
        request_timeout_ms=2000,
        delivery_timeout_ms=300,
    )
    async with DurableSender(config) as sender:
        assert not (await sender.send(topic, b"before", key=b"k")).spooled
        crash(broker)
        loop = asyncio.get_running_loop()
        started = loop.time()
        where = await sender.send(topic, b"after", key=b"k")
        assert where.spooled
        assert where.spool_path is not None
        assert Path(where.spool_path).parent == tmp_path / "spool"
        assert loop.time() - started < 1.5
    assert len(segment_files(tmp_path / "spool")) == 1


async def test_config_and_argument_errors_are_clear(tmp_path: Path) -> None:
    """Bad settings and bad record types are refused up front, with what to do."""
    with pytest.raises(ValueError, match="replay_backoff_max_ms"):
        ProducerConfig("h:1", replay_backoff_ms=1000, replay_backoff_max_ms=10)
    with pytest.raises(ValueError, match="delivery_timeout_ms"):
        ProducerConfig("h:1", delivery_timeout_ms=0)
    assert ProducerConfig("h:1", request_timeout_ms=1000).effective_delivery_timeout_ms == 2005

    dead = f"127.0.0.1:{find_free_port()}"
    async with DurableSender(durable_config(dead, tmp_path / "spool")) as sender:
        with pytest.raises(TypeError, match="bytes or None"):
            await sender.send("t", "text", key=None)  # type: ignore[arg-type]
        with pytest.raises(ProducerError, match="key or a value"):
            await sender.send("t", None, key=None)
        with pytest.raises(ValueError, match="in use by another producer"):
            await DurableSender(durable_config(dead, tmp_path / "spool")).start()
    with pytest.raises(ProducerError, match="cannot reach the cluster"):
        await DurableSender(ProducerConfig(dead, idempotence=False)).start()


@own_broker
async def test_a_topic_the_cluster_does_not_have_never_holds_up_the_spool(tmp_path: Path) -> None:
    """On a cluster that does not create topics on first use: records spooled (while it
    was away) for a topic it does not have are moved to the ``.rejected`` file, once,
    and the other topics' records after them are delivered; a send for such a topic then
    fails with MissingTopicError, which says what to do, and is not spooled."""
    port = find_free_port()
    servers = f"127.0.0.1:{port}"
    spool_dir = tmp_path / "spool"
    async with DurableSender(durable_config(servers, spool_dir)) as away:
        for n in range(2):
            assert (await away.send("no-such-topic", b"typo-%d" % n, key=b"k")).spooled
        for n in range(3):
            assert (await away.send("orders", b"order-%d" % n, key=b"k")).spooled

    broker = EmbeddedBroker(
        flavor="apache", port=port, settings={"auto.create.topics.enable": "false"}
    )
    broker.start()
    try:
        await create_topic(servers, name="orders", partitions=1)
        with capture_logs() as logs:
            async with DurableSender(durable_config(servers, spool_dir)) as sender:
                await sender.wait_drained(timeout_s=60)
                assert sender.mode is SenderMode.DIRECT
                with pytest.raises(MissingTopicError, match="create the topic or correct"):
                    await sender.send("no-such-topic", b"typo-2", key=b"k")
                assert sender.mode is SenderMode.DIRECT
                assert sender.spool_size == 0
        records = await read_records(servers, "orders", 3)
        assert [r.value for r in records] == [b"order-0", b"order-1", b"order-2"]
        (rejected,) = spool_dir.glob("*.rejected")
        lines = [json.loads(line) for line in rejected.read_text().splitlines()]
        assert [line["topic"] for line in lines] == ["no-such-topic"] * 2
        assert all("MissingTopicError" in line["error"] for line in lines)
        (set_aside,) = [e for e in logs if "topic the cluster does not have" in e["event"]]
        assert (set_aside["topic"], set_aside["records"]) == ("no-such-topic", 2)
    finally:
        broker.stop()


async def test_a_record_too_large_to_send_is_refused_while_spooling_too(tmp_path: Path) -> None:
    """While the cluster is away (spooling), a record larger than the client ever sends
    is refused at once with RecordRejectedError, as it is while sending directly, instead
    of being called durable, spooled and set aside at replay; smaller ones are spooled."""
    spool_dir = tmp_path / "spool"
    async with DurableSender(durable_config("127.0.0.1:1", spool_dir)) as sender:
        assert sender.mode is SenderMode.SPOOLING
        with pytest.raises(RecordRejectedError, match="over the producer's limit"):
            await sender.send("orders", b"x" * (2 << 20), key=b"k")
        assert (await sender.send("orders", b"x" * 1000, key=b"k")).spooled
        assert sender.spool_size == 1
        await sender.flush()
