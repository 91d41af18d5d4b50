"""Processing features against a real broker: retry topic, dead letters, poison pills,
per-key quota shaping, compaction windows across a restart."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import defaultdict
from typing import Any

import msgspec
import pytest

from decaton_aio import Application, JsonSerializer, ProcessingContext
from decaton_aio.backoff import RetryPolicy
from decaton_aio.compaction import CompactedTask, CompactingProcessor, CompactionChoice
from decaton_aio.metadata import METADATA_HEADER, decode_metadata
from decaton_aio.retry import RetryConfig
from decaton_aio.testing import BrokerHandle, committed_offsets, drain, read_records, wait_until

pytestmark = pytest.mark.integration

FAST = RetryPolicy(max_attempts=3, backoff_base_ms=100, backoff_max_ms=200, jitter=0)


class Job(msgspec.Struct):
    n: int


async def test_retry_topic_round_trip_and_dead_letter(
    kafka_broker: BrokerHandle, topic_factory: Any, task_producer: Any
) -> None:
    """Failing tasks go through <topic>-retry (consumed by the same subscription) until
    they succeed; a task failing every attempt lands in <topic>-dlq with its error; the
    retry delay of one key does not hold back the others."""
    topic = await topic_factory(partitions=2)
    producer = await task_producer(topic, JsonSerializer(Job))
    for n in range(20):
        await producer.put(f"key-{n}", Job(n))
    attempts: dict[int, int] = defaultdict(int)
    finished_at: dict[int, float] = {}

    async def process(ctx: ProcessingContext, job: Job) -> None:
        attempts[job.n] += 1
        if job.n == 0:
            raise ConnectionError("always down")
        if job.n % 5 == 1 and attempts[job.n] < 2:
            raise TimeoutError("flaky once")
        finished_at[job.n] = time.monotonic()

    app = Application(
        process, topics=(topic,), serializer=JsonSerializer(Job), retry=RetryConfig(FAST)
    )
    async with kafka_broker.subscription(app):
        await wait_until(lambda: len(finished_at) == 19, what="19 finished tasks")
        await wait_until(lambda: attempts[0] == 3, what="3 attempts of the failing task")
        dead = await read_records(kafka_broker.bootstrap_servers, f"{topic}-dlq", 1)
    assert {n: attempts[n] for n in (1, 6, 11, 16)} == {1: 2, 6: 2, 11: 2, 16: 2}
    assert attempts[2] == 1
    (record,) = dead
    headers = dict(record.headers)
    assert record.key == b"key-0"
    assert msgspec.json.decode(record.value, type=Job) == Job(0)
    assert headers["dt_dlq_error_type"] == b"ConnectionError"
    assert headers["dt_dlq_attempts"] == b"3"
    assert headers["dt_dlq_origin_topic"] == topic.encode()
    assert int(headers["dt_dlq_first_failure_ms"]) <= int(headers["dt_dlq_last_failure_ms"])
    assert decode_metadata(headers[METADATA_HEADER]).retry_count == 2
    # Tasks that never failed finished before the retried ones came back.
    assert max(finished_at[n] for n in (2, 3, 4)) < min(finished_at[n] for n in (1, 6, 11))


async def test_poison_pill_goes_to_dead_letter_and_processing_continues(
    kafka_broker: BrokerHandle, topic_factory: Any, task_producer: Any
) -> None:
    """A body that is not valid JSON for the task type is dead-lettered with the
    decoder's reason; the tasks around it are processed."""
    topic = await topic_factory(partitions=1)
    producer = await task_producer(topic)
    await producer.put("a", b'{"n": 1}')
    await producer.put("a", b"{not json")
    await producer.put("a", b'{"n": 3}')
    seen: list[int] = []

    async def process(ctx: ProcessingContext, job: Job) -> None:
        seen.append(job.n)

    app = Application(process, topics=(topic,), serializer=JsonSerializer(Job))
    group = f"pp-{uuid.uuid4().hex[:8]}"
    result = await drain(
        app,
        kafka_broker.bootstrap_servers,
        expected=2,
        group_id=group,
        producer=kafka_broker.producer_config(),
    )
    assert [t.task.n for t in result.processed] == [1, 3]
    (dead,) = await read_records(kafka_broker.bootstrap_servers, f"{topic}-dlq", 1)
    headers = dict(dead.headers)
    assert dead.value == b"{not json"
    assert headers["dt_dlq_error_type"] == b"DecodeError:body"
    assert headers["dt_dlq_error_message"]
    committed = await committed_offsets(kafka_broker.bootstrap_servers, group, topic, [0])
    assert committed == {0: 3}


async def test_hot_key_is_shaped_and_still_processed(
    kafka_broker: BrokerHandle, topic_factory: Any, task_producer: Any
) -> None:
    """A key over decaton.per.key.quota.processing.rate is moved to <topic>-shaping and
    processed from there; other keys are processed from the task topic."""
    topic = await topic_factory(partitions=1)
    producer = await task_producer(topic)
    futures = [await producer.submit("hot", b"h") for _ in range(300)]
    futures += [await producer.submit(f"cold-{i}", b"c") for i in range(30)]
    await asyncio.gather(*futures)
    by_topic: dict[str, int] = defaultdict(int)

    async def process(ctx: ProcessingContext, task: bytes) -> None:
        by_topic[f"{ctx.topic}:{task.decode()}"] += 1

    app = Application(
        process,
        topics=(topic,),
        shaping=True,
        properties={"decaton.per.key.quota.processing.rate": 50},
    )
    async with kafka_broker.subscription(app):
        await wait_until(lambda: sum(by_topic.values()) >= 330, what="330 tasks")
    assert by_topic[f"{topic}:c"] == 30
    assert by_topic[f"{topic}-shaping:h"] > 0
    assert by_topic[f"{topic}:h"] + by_topic[f"{topic}-shaping:h"] == 300


async def test_compaction_window_is_never_committed_past(
    kafka_broker: BrokerHandle, topic_factory: Any, task_producer: Any
) -> None:
    """Tasks held in a compaction window are pending: a stop before the window ends
    commits below them, and a restart redelivers and compacts them again."""
    topic = await topic_factory(partitions=1)
    producer = await task_producer(topic)
    for i in range(5):
        await producer.put("user-1", json.dumps({"i": i}).encode())
    group = f"cw-{uuid.uuid4().hex[:8]}"
    ran: list[bytes] = []

    async def process(ctx: ProcessingContext, task: bytes) -> None:
        ran.append(task)

    def latest(left: CompactedTask[bytes], right: CompactedTask[bytes]) -> CompactionChoice:
        return CompactionChoice.PICK_RIGHT

    long_window = Application(
        CompactingProcessor(process, latest, window_s=30),
        topics=(topic,),
        properties={"decaton.processing.shutdown.timeout.ms": 100},
    )
    async with kafka_broker.subscription(long_window, group) as sub:
        await wait_until(
            lambda: any(p.stats.compactions == 4 for p in sub.partitions.values()),
            what="4 compactions",
        )
    assert ran == []
    assert await committed_offsets(kafka_broker.bootstrap_servers, group, topic, [0]) == {0: 4}

    short_window = Application(CompactingProcessor(process, latest, window_s=0.1), topics=(topic,))
    async with kafka_broker.subscription(short_window, group):
        await wait_until(lambda: bool(ran), what="the kept task")
    assert ran == [b'{"i": 4}']
