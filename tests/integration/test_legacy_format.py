"""Pre-Decaton-9 records (the DecatonTaskRequest wrapper, no dt_meta header) on a real
broker, built here with protobuf (tests/interop checks the same with Decaton's client)."""

from __future__ import annotations

import time
from typing import Any

import msgspec
import pytest
from aiokafka import AIOKafkaProducer

from decaton_aio import Application, JsonSerializer, ProcessingContext, ProtobufSerializer
from decaton_aio.metadata import TaskMetadata
from decaton_aio.testing import BrokerHandle, drain, read_records
from tests.unit.protobuf_helpers import decaton_task_request_class, hello_task_class

pytestmark = pytest.mark.integration

HelloTask = hello_task_class()


def _wrapped(task: Any, **metadata: Any) -> bytes:
    request = decaton_task_request_class()()
    for name, value in metadata.items():
        setattr(request.metadata, name, value)
    request.serialized_task = task.SerializeToString()
    return bytes(request.SerializeToString())


async def _send(broker: BrokerHandle, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap_servers)
    await producer.start()
    try:
        for key, value in records:
            await producer.send_and_wait(topic, value, key=key)
    finally:
        await producer.stop()


async def test_legacy_option_reads_the_wrapper_next_to_current_records(
    kafka_broker: BrokerHandle, topic_factory: Any, task_producer: Any
) -> None:
    """With decaton.legacy.parse.fallback.enabled, wrapped records are processed with the
    metadata inside them (a scheduled one waits), and records in the current format on the
    same topic still are: a topic in the middle of a migration."""
    topic = await topic_factory(partitions=1)
    due = time.time_ns() // 1_000_000 + 1500
    await _send(
        kafka_broker,
        topic,
        [
            (b"a", _wrapped(HelloTask(name="old"), timestamp_millis=5, source_application_id="j")),
            (b"b", _wrapped(HelloTask(name="due"), timestamp_millis=6, scheduled_time_millis=due)),
        ],
    )
    producer = await task_producer(topic, ProtobufSerializer(HelloTask), application_id="py")
    await producer.put("c", HelloTask(name="new"), timestamp_ms=7)
    seen: dict[str, tuple[TaskMetadata, int]] = {}

    async def process(ctx: ProcessingContext, task: Any) -> None:
        seen[task.name] = (ctx.metadata, time.time_ns() // 1_000_000)

    app = Application(
        process,
        topics=(topic,),
        serializer=ProtobufSerializer(HelloTask),
        properties={"decaton.legacy.parse.fallback.enabled": True},
    )
    await drain(app, kafka_broker.bootstrap_servers, expected=3, raise_failures=True)
    assert seen["old"][0] == TaskMetadata(5, "j")
    assert seen["due"][0] == TaskMetadata(6, scheduled_time_ms=due)
    assert seen["due"][1] >= due
    assert seen["new"][0].timestamp_ms == 7
    assert seen["new"][0].source_application_id == "py"


class _Job(msgspec.Struct):
    n: int


async def test_without_the_option_a_wrapper_is_dead_lettered_saying_what_it_is(
    kafka_broker: BrokerHandle, topic_factory: Any
) -> None:
    """Without the option the wrapper is the body; when the serializer cannot decode it, the
    dead letter reason names the pre-Decaton-9 format and the property to turn on, and the
    option, when on, sends a value that is no wrapper to the dead letter topic too."""
    topic = await topic_factory(partitions=1)
    wrapped = _wrapped(HelloTask(name="old"), timestamp_millis=1_500_000_000_000)
    await _send(kafka_broker, topic, [(b"a", wrapped), (b"b", b'{"n": 2}')])

    async def process(ctx: ProcessingContext, job: _Job) -> None:
        assert job.n == 2

    app = Application(process, topics=(topic,), serializer=JsonSerializer(_Job))
    await drain(app, kafka_broker.bootstrap_servers, expected=1, raise_failures=True)
    (dead,) = await read_records(kafka_broker.bootstrap_servers, f"{topic}-dlq", 1)
    headers = dict(dead.headers)
    assert dead.value == wrapped
    assert headers["dt_dlq_error_type"] == b"DecodeError:body"
    assert b"pre-Decaton-9 DecatonTaskRequest" in headers["dt_dlq_error_message"]
    assert b"decaton.legacy.parse.fallback.enabled=true" in headers["dt_dlq_error_message"]

    on = Application(
        process,
        topics=(topic,),
        serializer=JsonSerializer(_Job),
        properties={"decaton.legacy.parse.fallback.enabled": True},
    )
    subscription = kafka_broker.subscription(on)
    await subscription.start()
    try:
        records = await read_records(kafka_broker.bootstrap_servers, f"{topic}-dlq", 3)
    finally:
        await subscription.stop()
    reasons = [dict(r.headers)["dt_dlq_error_message"] for r in records[1:]]
    assert any(b"not a pre-Decaton-9 DecatonTaskRequest" in r for r in reasons)
