"""The pytest plugin (entry point ``pytest11``): fixtures for tests against a real broker.

Fixtures:

- ``kafka_broker``: a session-wide :class:`~decaton_aio.testing.BrokerHandle`; the embedded
  broker (Apache Kafka, or Tansu with ``DECATON_AIO_BROKER=tansu``; three nodes with
  ``DECATON_AIO_BROKER_NODES=3``), or the cluster named by
  ``$DECATON_AIO_BOOTSTRAP_SERVERS``.
- ``topic_factory``: ``await topic_factory(partitions=3)`` creates a fresh topic for this
  test (replication factor from ``$DECATON_AIO_REPLICATION_FACTOR``, see
  :class:`~decaton_aio.testing.BrokerHandle`) and deletes it afterwards.
- ``task_producer``: ``await task_producer(topic, serializer)`` gives a started
  :class:`~decaton_aio.producer.TaskProducer`, stopped after the test; idempotence is on
  unless the broker is Tansu.

A failed test that used the embedded broker shows the tail of the broker log.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest

from decaton_aio.producer import ProducerConfig, TaskProducer
from decaton_aio.serializers import BytesSerializer
from decaton_aio.testing import BrokerHandle, TopicAdmin
from decaton_aio.typing import Serializer

TopicFactory = Callable[..., Awaitable[str]]
ProducerFactory = Callable[..., Awaitable[TaskProducer[Any]]]

_handle_key = pytest.StashKey[BrokerHandle]()


@pytest.fixture(scope="session")
def kafka_broker(request: pytest.FixtureRequest) -> Iterator[BrokerHandle]:
    """The broker of this test session (embedded unless $DECATON_AIO_BOOTSTRAP_SERVERS)."""
    handle = BrokerHandle.from_env()
    request.config.stash[_handle_key] = handle
    try:
        yield handle
    finally:
        handle.close()


@pytest.fixture
async def topic_factory(kafka_broker: BrokerHandle) -> AsyncIterator[TopicFactory]:
    """Create fresh topics for one test: ``await topic_factory(partitions=3)``."""
    admin = TopicAdmin(kafka_broker.bootstrap_servers)

    async def create(partitions: int = 1, **options: Any) -> str:
        options.setdefault("replication_factor", kafka_broker.replication_factor)
        return await admin.create(partitions, **options)

    try:
        yield create
    finally:
        await admin.close()


@pytest.fixture
async def task_producer(kafka_broker: BrokerHandle) -> AsyncIterator[ProducerFactory]:
    """Started task producers for one test: ``await task_producer(topic, serializer)``."""
    producers: list[TaskProducer[Any]] = []

    async def make(
        topic: str, serializer: Serializer[Any] | None = None, **config: Any
    ) -> TaskProducer[Any]:
        config.setdefault("idempotence", kafka_broker.supports_idempotence)
        producer: TaskProducer[Any] = TaskProducer(
            ProducerConfig(kafka_broker.bootstrap_servers, **config),
            topic,
            serializer or BytesSerializer(),
        )
        await producer.start()
        producers.append(producer)
        return producer

    try:
        yield make
    finally:
        for producer in producers:
            await producer.stop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report = yield
    handle = item.config.stash.get(_handle_key, None)
    if (
        report.failed  # type: ignore[attr-defined]
        and handle is not None
        and handle.embedded is not None
        and "kafka_broker" in getattr(item, "fixturenames", ())
    ):
        tail = handle.embedded.log_tail(40)
        report.sections.append(  # type: ignore[attr-defined]
            ("embedded broker log", f"{handle.embedded.log_path}\n{tail}")
        )
    return report
