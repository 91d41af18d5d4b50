"""The pytest plugin (entry point ``pytest11``): fixtures for tests against a real broker.

Fixtures:

- ``kafka_broker``: a session-wide [`BrokerHandle`][decaton_aio.testing.BrokerHandle]; the embedded
  broker (Apache Kafka, or Tansu with ``DECATON_AIO_BROKER=tansu``; three nodes with
  ``DECATON_AIO_BROKER_NODES=3``), or the cluster named by
  ``$DECATON_AIO_BOOTSTRAP_SERVERS``.
- ``topic_factory``: ``await topic_factory(partitions=3)`` creates a fresh topic for this
  test (replication factor from ``$DECATON_AIO_REPLICATION_FACTOR``, see
  [`BrokerHandle`][decaton_aio.testing.BrokerHandle]) and deletes it afterwards.
- ``task_producer``: ``await task_producer(topic, serializer)`` gives a started
  [`TaskProducer`][decaton_aio.TaskProducer], stopped after the test; idempotence is on
  unless the broker is Tansu.
- ``secured_kafka_broker`` and ``mtls_kafka_broker``: session-wide handles on one embedded
  Apache Kafka started (only when a test asks for them) with a ``SASL_SSL`` listener and a
  mutual TLS listener, a CA and certificates made for the session
  (`start_secured_broker()`); ``handle.security`` is what a
  client connects with, ``handle.embedded.listeners`` the ``client.properties`` files.
  Skipped on Tansu and on an external cluster.
- ``toxiproxy``: a session-wide `Toxiproxy` server on a free
  loopback port (built by ``go install`` on first use), for network fault tests; with
  `start_proxied_broker()` it stands between clients and an
  embedded broker. Skipped, saying why, when the binary cannot be had.

Every client the fixtures make connects with ``kafka_broker.security`` (from
``$DECATON_AIO_CLIENT_PROPERTIES`` and the ``DECATON_AIO_SASL_*``/``_SSL_*`` variables for
an external cluster).

A failed test that used the embedded broker shows the tail of the broker log.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest

from decaton_aio.client_properties import cluster_settings
from decaton_aio.embedded import EmbeddedBroker, Toxiproxy, default_flavor
from decaton_aio.errors import BrokerError
from decaton_aio.producer import TaskProducer
from decaton_aio.serializers import BytesSerializer
from decaton_aio.testing import BrokerHandle, start_secured_broker
from decaton_aio.typing import Serializer

TopicFactory = Callable[..., Awaitable[str]]
ProducerFactory = Callable[..., Awaitable[TaskProducer[Any]]]

_handle_key = pytest.StashKey[BrokerHandle]()
_secured_key = pytest.StashKey[EmbeddedBroker]()


@pytest.fixture(scope="session")
def kafka_broker(request: pytest.FixtureRequest) -> Iterator[BrokerHandle]:
    """The broker of this test session (embedded unless $DECATON_AIO_BOOTSTRAP_SERVERS)."""
    handle = BrokerHandle.from_env()
    request.config.stash[_handle_key] = handle
    try:
        yield handle
    finally:
        handle.close()


@pytest.fixture(scope="session")
def _secured_embedded_broker(request: pytest.FixtureRequest) -> Iterator[EmbeddedBroker]:
    if cluster_settings().bootstrap_servers or default_flavor() == "tansu":
        pytest.skip("the secured broker is an embedded Apache Kafka (not Tansu or external)")
    broker = start_secured_broker()
    request.config.stash[_secured_key] = broker
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def secured_kafka_broker(_secured_embedded_broker: EmbeddedBroker) -> BrokerHandle:
    """The ``SASL_SSL`` listener of the session's secured embedded Apache Kafka."""
    return _listener_handle(_secured_embedded_broker, "SASL_SSL")


@pytest.fixture(scope="session")
def mtls_kafka_broker(_secured_embedded_broker: EmbeddedBroker) -> BrokerHandle:
    """The mutual TLS listener of the session's secured embedded Apache Kafka."""
    return _listener_handle(_secured_embedded_broker, "MTLS")


def _listener_handle(broker: EmbeddedBroker, name: str) -> BrokerHandle:
    listener = broker.listeners[name]
    return BrokerHandle(listener.bootstrap_servers, broker, 1, listener.security)


@pytest.fixture(scope="session")
def toxiproxy() -> Iterator[Toxiproxy]:
    """A Toxiproxy server for this test session, stopped at its end (skipped when the
    binary cannot be built or found)."""
    try:
        server = Toxiproxy().start()
    except BrokerError as exc:
        pytest.skip(f"Toxiproxy is not available: {exc}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def topic_factory(kafka_broker: BrokerHandle) -> AsyncIterator[TopicFactory]:
    """Create fresh topics for one test: ``await topic_factory(partitions=3)``."""
    admin = kafka_broker.topic_admin()

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
            kafka_broker.producer_config(**config),
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
    if not report.failed:  # type: ignore[attr-defined]
        return report
    names = getattr(item, "fixturenames", ())
    handle = item.config.stash.get(_handle_key, None)
    brokers = []
    if handle is not None and handle.embedded is not None and "kafka_broker" in names:
        brokers.append(handle.embedded)
    secured = item.config.stash.get(_secured_key, None)
    if secured is not None and {"secured_kafka_broker", "mtls_kafka_broker"} & set(names):
        brokers.append(secured)
    for broker in brokers:
        report.sections.append(  # type: ignore[attr-defined]
            ("embedded broker log", f"{broker.log_path}\n{broker.log_tail(40)}")
        )
    return report
