"""Wire compatibility with Decaton itself (its client and processor, run in a JVM).

Decaton's DecatonClient produces and decaton-aio processes; decaton-aio's TaskProducer and
``python -m decaton_aio produce`` produce and a Decaton ProcessorSubscription processes;
retries cross from one to the other both ways; records in the pre-Decaton-9 format are
read with ``decaton.legacy.parse.fallback.enabled`` and dead-lettered, with a reason
naming the format, without it. Every metadata field is compared: timestamp, source
application id, source instance id, retry count, scheduled time.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from typing import Any

import msgspec
import pytest

from bench.jvm import JvmBuild
from decaton_aio import (
    Application,
    JsonSerializer,
    ProcessingContext,
    ProtobufSerializer,
    RetryConfig,
    RetryPolicy,
)
from decaton_aio.metadata import METADATA_HEADER, TaskMetadata, decode_metadata, encode_metadata
from decaton_aio.testing import BrokerHandle, drain, read_records, recent_timestamp_ms
from tests.interop.decaton_jvm import DecatonSubscription, decaton_produce, unb64
from tests.unit.protobuf_helpers import hello_task_class

# A fixed record time inside the broker's time retention.
RECORD_MS = recent_timestamp_ms()

pytestmark = pytest.mark.integration

HelloTask = hello_task_class()


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _hello(task: Any) -> dict[str, Any]:
    return {"name": task.name, "age": task.age, "text": task.text}


def _meta(event: dict[str, Any]) -> TaskMetadata:
    m = event["metadata"]
    return TaskMetadata(
        m["timestamp_ms"],
        m["source_application_id"],
        m["source_instance_id"],
        m["retry_count"],
        m["scheduled_time_ms"],
    )


class _Seen(msgspec.Struct):
    key: bytes | None
    partition: int
    offset: int
    task: dict[str, Any]
    meta: TaskMetadata
    headers: list[tuple[str, bytes]]
    at_ms: int


def _recorder(seen: list[_Seen]) -> Any:
    async def process(ctx: ProcessingContext, task: Any) -> None:
        seen.append(
            _Seen(
                ctx.key,
                ctx.partition,
                ctx.offset,
                _hello(task),
                ctx.metadata,
                list(ctx.headers),
                _now_ms(),
            )
        )

    return process


async def test_decaton_client_tasks_arrive_with_every_metadata_field(
    decaton_jvm: JvmBuild, kafka_broker: BrokerHandle, topic_factory: Any
) -> None:
    """Tasks put by DecatonClient (each of its put variants, a chosen partition, a
    scheduled time, a null key) are processed by decaton-aio with the keys, protobuf
    bodies and metadata Decaton wrote; the scheduled one not before its time."""
    topic = await topic_factory(partitions=3)
    scheduled = _now_ms() + 2500
    tasks = [
        {"key": "user-1", "task": {"name": "plain", "age": 1, "text": "put(key, task)"}},
        {"key": "user-2", "task": {"name": "stamped", "age": 2}, "timestamp_ms": 1_600_000_000_123},
        {"key": "k ~!{}", "task": {"name": "placed", "age": 3}, "partition": 2,
         "timestamp_ms": 1_650_000_000_000},
        {"key": "user-4", "task": {"name": "later", "age": 4}, "scheduled_time_ms": scheduled},
        {"key": None, "task": {"name": "keyless", "age": 5, "text": "ü"}},
    ]  # fmt: skip
    before = _now_ms()
    puts = await decaton_produce(decaton_jvm, kafka_broker, topic, tasks)
    after = _now_ms()
    seen: list[_Seen] = []
    app = Application(_recorder(seen), topics=(topic,), serializer=ProtobufSerializer(HelloTask))
    await drain(app, kafka_broker.bootstrap_servers, expected=len(tasks), raise_failures=True)

    by_name = {s.task["name"]: s for s in seen}
    assert len(seen) == len(tasks)
    for task, (partition, offset) in zip(tasks, puts, strict=True):
        got = by_name[task["task"]["name"]]
        assert (got.partition, got.offset) == (partition, offset)
        assert got.key == (task["key"].encode("ascii") if task["key"] else None)
        assert got.task == {"text": "", **task["task"]}
        assert [name for name, _ in got.headers] == [METADATA_HEADER]
        meta = got.meta
        assert (meta.source_application_id, meta.source_instance_id) == (
            "decaton-interop",
            "decaton-interop-1",
        )
        assert meta.retry_count == 0
        assert meta.scheduled_time_ms == task.get("scheduled_time_ms", 0)
        if "timestamp_ms" in task:
            assert meta.timestamp_ms == task["timestamp_ms"]
        else:
            assert before <= meta.timestamp_ms <= after
    assert by_name["placed"].partition == 2
    assert by_name["later"].at_ms >= scheduled


async def test_decaton_reads_tasks_of_the_task_producer(
    decaton_jvm: JvmBuild, kafka_broker: BrokerHandle, topic_factory: Any, task_producer: Any
) -> None:
    """Tasks put by decaton-aio's TaskProducer are processed by a Decaton subscription with
    the bodies, keys (UTF-8 beyond ASCII included) and metadata written; Decaton waits for
    the scheduled one."""
    topic = await topic_factory(partitions=2)
    producer = await task_producer(
        topic,
        ProtobufSerializer(HelloTask),
        application_id="aio-app",
        instance_id="aio-instance-7",
    )
    scheduled = _now_ms() + 2500
    puts = [
        await producer.put("k1", HelloTask(name="a", age=1, text="x"), timestamp_ms=RECORD_MS + 1),
        await producer.put("k2", HelloTask(name="b", age=2), scheduled_time_ms=scheduled),
        await producer.put("ключ", HelloTask(name="c", age=3), partition=1),
        await producer.put(None, HelloTask(name="d", age=4)),
    ]  # fmt: skip
    records = {
        (r.partition, r.offset): r
        for r in await read_records(kafka_broker.bootstrap_servers, topic, len(puts))
    }
    group = f"decaton-{uuid.uuid4().hex[:8]}"
    async with DecatonSubscription(decaton_jvm, kafka_broker, topic, group) as decaton:
        events = await decaton.wait_tasks(len(puts))
    assert len(events) == len(puts)
    for event in events:
        record = records[(event["partition"], event["offset"])]
        assert event["topic"] == topic
        assert unb64(event["key_b64"]) == record.key
        assert event["task"] == _hello(HelloTask.FromString(record.value))
        written = decode_metadata(dict(record.headers)[METADATA_HEADER])
        assert _meta(event) == written
        assert (written.source_application_id, written.source_instance_id) == (
            "aio-app",
            "aio-instance-7",
        )
        assert [(k, unb64(v)) for k, v in event["headers"]] == list(record.headers)
    by_name = {e["task"]["name"]: e for e in events}
    assert by_name["a"]["metadata"]["timestamp_ms"] == RECORD_MS + 1
    assert by_name["b"]["metadata"]["scheduled_time_ms"] == scheduled
    assert by_name["b"]["processed_at_ms"] >= scheduled
    assert by_name["c"]["key"] is None  # not printable ASCII: Decaton has the bytes only
    assert unb64(by_name["c"]["key_b64"]) == "ключ".encode()
    assert by_name["c"]["partition"] == 1
    assert by_name["d"]["key_b64"] is None


async def test_decaton_reads_tasks_of_the_produce_command(
    decaton_jvm: JvmBuild, kafka_broker: BrokerHandle, topic_factory: Any
) -> None:
    """Tasks from ``python -m decaton_aio produce`` (JSON bodies) are processed by a Decaton
    subscription with the command's application id, a production time, the scheduled
    time and the partition asked for."""
    topic = await topic_factory(partitions=2)
    lines = [
        {"key": "cli-1", "task": {"follow": 2}},
        {"key": "cli-2", "task": [1, 2], "scheduled_time_ms": 1_900_000_000_000, "partition": 1},
    ]
    argv = [sys.executable, "-m", "decaton_aio", "produce", "--topic", topic]
    argv += ["--bootstrap-servers", kafka_broker.bootstrap_servers, "--application-id", "cli-app"]
    before = _now_ms()
    done = await asyncio.to_thread(
        subprocess.run,
        argv,
        input="".join(json.dumps(line) + "\n" for line in lines),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    after = _now_ms()
    assert done.returncode == 0, done.stderr
    group = f"decaton-{uuid.uuid4().hex[:8]}"
    async with DecatonSubscription(decaton_jvm, kafka_broker, topic, group, body="bytes") as sub:
        events = await sub.wait_tasks(1)  # the other one is scheduled far ahead: never due
    (event,) = events
    assert event["key"] == "cli-1"
    assert json.loads(unb64(event["body_b64"]) or b"") == {"follow": 2}
    meta = _meta(event)
    assert meta.source_application_id == "cli-app"
    assert meta.source_instance_id  # the host, as DecatonClient's default
    assert before <= meta.timestamp_ms <= after
    assert (meta.retry_count, meta.scheduled_time_ms) == (0, 0)
    (scheduled,) = [
        r for r in await read_records(kafka_broker.bootstrap_servers, topic, 2) if r.partition == 1
    ]
    assert decode_metadata(dict(scheduled.headers)[METADATA_HEADER]).scheduled_time_ms == (
        1_900_000_000_000
    )


async def test_a_decaton_retry_is_processed_by_decaton_aio(
    decaton_jvm: JvmBuild, kafka_broker: BrokerHandle, topic_factory: Any, task_producer: Any
) -> None:
    """A task Decaton's processor retries lands in ``<topic>-retry`` (Decaton's default
    name, the same as decaton-aio's), where decaton-aio reads it with the retry count and
    scheduled time Decaton set and the original timestamp and source ids."""
    topic = await topic_factory(partitions=1)
    retry_topic = await topic_factory(partitions=1, name=f"{topic}-retry")
    producer = await task_producer(
        topic, ProtobufSerializer(HelloTask), application_id="origin", instance_id="origin-1"
    )
    await producer.put("retry-me", HelloTask(name="r", age=7), timestamp_ms=RECORD_MS + 777)
    await producer.put("plain", HelloTask(name="p", age=8))
    group = f"decaton-{uuid.uuid4().hex[:8]}"
    async with DecatonSubscription(
        decaton_jvm, kafka_broker, topic, group, retry_backoff_ms=1000, retry_key_prefix="retry-"
    ) as decaton:
        events = await decaton.wait_tasks(3)  # both, then the retry from the retry topic
    first, again = [e for e in events if e["key"] == "retry-me"]
    assert first["retried"]
    assert first["metadata"]["retry_count"] == 0
    assert again["topic"] == retry_topic
    assert again["metadata"]["retry_count"] == 1

    seen: list[_Seen] = []
    app = Application(
        _recorder(seen), topics=(retry_topic,), serializer=ProtobufSerializer(HelloTask)
    )
    await drain(app, kafka_broker.bootstrap_servers, expected=1, raise_failures=True)
    (got,) = seen
    assert got.key == b"retry-me"
    assert got.task == {"name": "r", "age": 7, "text": ""}
    assert got.meta == _meta(again)
    assert got.meta.retry_count == 1
    assert got.meta.timestamp_ms == RECORD_MS + 777
    assert (got.meta.source_application_id, got.meta.source_instance_id) == ("origin", "origin-1")
    assert got.meta.scheduled_time_ms >= first["processed_at_ms"] + 1000
    assert got.at_ms >= got.meta.scheduled_time_ms


async def test_a_decaton_aio_retry_is_processed_by_decaton(
    decaton_jvm: JvmBuild, kafka_broker: BrokerHandle, topic_factory: Any, task_producer: Any
) -> None:
    """A task decaton-aio retries (queue mode) lands in ``<topic>-retry`` with retry count
    1 and a scheduled time; a Decaton subscription with retries on reads it from there with
    exactly that metadata and does not run it before its time."""
    topic = await topic_factory(partitions=1)
    retry_topic = await topic_factory(partitions=1, name=f"{topic}-retry")
    producer = await task_producer(
        topic, ProtobufSerializer(HelloTask), application_id="origin", instance_id="origin-2"
    )
    await producer.put("retry-me", HelloTask(name="r", age=1), timestamp_ms=RECORD_MS + 888)
    await producer.put("plain", HelloTask(name="p", age=2))

    async def process(ctx: ProcessingContext, task: Any) -> None:
        if ctx.key == b"retry-me" and ctx.metadata.retry_count == 0:
            ctx.retry(1.0)

    app = Application(
        process,
        topics=(topic,),
        serializer=ProtobufSerializer(HelloTask),
        retry=RetryConfig(RetryPolicy(max_attempts=3), mode="queue"),
    )
    await drain(app, kafka_broker.bootstrap_servers, expected=3, raise_failures=True)
    (retry_record,) = await read_records(kafka_broker.bootstrap_servers, retry_topic, 1)
    written = decode_metadata(dict(retry_record.headers)[METADATA_HEADER])
    assert written.retry_count == 1

    group = f"decaton-{uuid.uuid4().hex[:8]}"
    async with DecatonSubscription(
        decaton_jvm, kafka_broker, topic, group, retry_backoff_ms=1000
    ) as decaton:
        events = await decaton.wait_tasks(3)
    (again,) = [e for e in events if e["topic"] == retry_topic]
    assert again["key"] == "retry-me"
    assert again["task"] == {"name": "r", "age": 1, "text": ""}
    assert _meta(again) == written
    assert _meta(again).timestamp_ms == RECORD_MS + 888
    assert (_meta(again).source_application_id, _meta(again).source_instance_id) == (
        "origin",
        "origin-2",
    )
    assert again["processed_at_ms"] >= written.scheduled_time_ms
    headers = {k: unb64(v) for k, v in again["headers"]}
    assert headers["dt_origin_topic"] == topic.encode()  # decaton-aio's extra headers pass


class _Job(msgspec.Struct):
    n: int


async def test_pre_decaton_9_records_are_read_with_the_legacy_option_else_dead_lettered(
    decaton_jvm: JvmBuild, kafka_broker: BrokerHandle, topic_factory: Any
) -> None:
    """Records DecatonClient writes in the pre-9 format (its produceInOldTaskRequest: the
    DecatonTaskRequest wrapper, no header) are processed with their metadata when
    decaton.legacy.parse.fallback.enabled is on; with it off, a body that does not decode
    goes to the dead letter topic with a reason naming the format and the property."""
    topic = await topic_factory(partitions=1)
    scheduled = _now_ms() + 1500
    tasks = [
        {"key": "old-1", "task": {"name": "old", "age": 9}, "timestamp_ms": 1_500_000_000_000},
        {"key": "old-2", "task": {"name": "due"}, "scheduled_time_ms": scheduled},
    ]
    await decaton_produce(decaton_jvm, kafka_broker, topic, tasks, legacy=True)
    records = await read_records(kafka_broker.bootstrap_servers, topic, 2)
    assert all(not r.headers for r in records)

    seen: list[_Seen] = []
    app = Application(
        _recorder(seen),
        topics=(topic,),
        serializer=ProtobufSerializer(HelloTask),
        properties={"decaton.legacy.parse.fallback.enabled": True},
    )
    await drain(app, kafka_broker.bootstrap_servers, expected=2, raise_failures=True)
    old, due = sorted(seen, key=lambda s: s.offset)
    assert old.task == {"name": "old", "age": 9, "text": ""}
    assert old.meta == TaskMetadata(1_500_000_000_000, "decaton-interop", "decaton-interop-1")
    assert due.meta.scheduled_time_ms == scheduled
    assert due.at_ms >= scheduled
    assert due.headers == [(METADATA_HEADER, encode_metadata(due.meta))]

    async def never(ctx: ProcessingContext, job: _Job) -> None:
        raise AssertionError(f"a wrapped record was decoded as {job}")

    off = kafka_broker.subscription(
        Application(never, topics=(topic,), serializer=JsonSerializer(_Job))
    )
    await off.start()
    try:
        dead = await read_records(kafka_broker.bootstrap_servers, f"{topic}-dlq", 2, timeout_s=60)
    finally:
        await off.stop()
    for record in dead:
        headers = dict(record.headers)
        assert headers["dt_dlq_error_type"] == b"DecodeError:body"
        assert b"pre-Decaton-9 DecatonTaskRequest" in headers["dt_dlq_error_message"]
        assert b"decaton.legacy.parse.fallback.enabled=true" in headers["dt_dlq_error_message"]
