"""A client whose start fails is closed again, whatever the failure: the connections it
opened before failing are not left open (a cancelled start, an unexpected error). The
checkpoint store's clients start inside a commit, which a final commit or a shutdown may
cancel."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import KafkaConnectionError

from decaton_aio import _connect, offsets, testing
from decaton_aio.consumer.commit import _checkpoints
from decaton_aio.consumer.state import _changelog
from decaton_aio.errors import BrokerError
from decaton_aio.properties import KafkaPropertySource, _kafka_source
from decaton_aio.security import PLAINTEXT

# Nothing listens there: the error path's probe is refused at once.
SERVERS = "127.0.0.1:1"


class _FailingStart:
    """Makes the start of the clients built from a class fail with ``error``, and keeps
    the clients so a test can ask whether each was closed."""

    def __init__(self, error: BaseException) -> None:
        self.error = error
        self.clients: list[Any] = []

    def of(self, client: type[Any]) -> type[Any]:
        """A kind of ``client`` whose start fails."""
        watch = self

        class Failing(client):  # type: ignore[misc,valid-type]
            async def start(self) -> None:
                watch.clients.append(self)
                raise watch.error

        return Failing

    def closed(self) -> list[bool]:
        return [bool(client._closed) for client in self.clients]


async def _read_records() -> None:
    await testing.read_records(SERVERS, "topic", 1, timeout_s=1)


async def _partition_extents() -> None:
    await offsets.partition_extents(SERVERS, "topic", timeout_s=1)


async def _property_topic() -> None:
    await KafkaPropertySource(SERVERS, "properties").load()


def _store() -> _checkpoints.CheckpointStore:
    store = _checkpoints.CheckpointStore(SERVERS, "group", "checkpoints")
    store._topic_ready = True  # no admin client first
    return store


async def _checkpoint_producer() -> None:
    await _store()._send("checkpoints", 0, b"key", b"value")


async def _checkpoint_admin() -> None:
    await _store()._committed([TopicPartition("topic", 0)])


async def _checkpoint_reader() -> None:
    await _store()._read_at(0, 0, b"key")


async def _changelog_reader() -> None:
    await _changelog.ChangelogReader(SERVERS, "changelog").start()


#: The starts that explain a Kafka error (SecurityError or BrokerError): the module that
#: names the client class, its name, and a call.
STARTS: dict[str, tuple[Any, str, Callable[[], Awaitable[None]]]] = {
    "read_records": (testing, "AIOKafkaConsumer", _read_records),
    "partition_extents": (offsets, "AIOKafkaConsumer", _partition_extents),
    "property topic": (_kafka_source, "AIOKafkaConsumer", _property_topic),
    "admin client": (
        _connect,
        "AIOKafkaAdminClient",
        lambda: _connect.start_admin(SERVERS, PLAINTEXT),
    ),
}


#: The starts that raise what the client raised.
PLAIN_STARTS: dict[str, tuple[Any, str, Callable[[], Awaitable[None]]]] = {
    "checkpoint producer": (_checkpoints, "AIOKafkaProducer", _checkpoint_producer),
    "checkpoint admin client": (_checkpoints, "AIOKafkaAdminClient", _checkpoint_admin),
    "checkpoint reader": (_checkpoints, "AIOKafkaConsumer", _checkpoint_reader),
    "changelog reader": (_changelog, "AIOKafkaConsumer", _changelog_reader),
}


@pytest.mark.parametrize("start", [*STARTS, *PLAIN_STARTS])
@pytest.mark.parametrize(
    "error", [RuntimeError("not a Kafka error"), asyncio.CancelledError()], ids=repr
)
async def test_a_start_failing_with_any_error_closes_the_client(
    start: str, error: BaseException, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given a start that raises something other than a Kafka error (an unexpected error,
    or the caller's cancellation), the error is raised as it was and the client is closed."""
    module, name, call = {**STARTS, **PLAIN_STARTS}[start]
    failing = _FailingStart(error)
    monkeypatch.setattr(module, name, failing.of(getattr(module, name)))
    with pytest.raises(type(error)):
        await call()
    assert failing.closed() == [True]


@pytest.mark.parametrize("start", list(STARTS))
async def test_a_start_failing_with_a_kafka_error_closes_the_client_and_says_why(
    start: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given a start the cluster cannot answer, the client is closed and the error says the
    cluster cannot be reached."""
    module, name, call = STARTS[start]
    failing = _FailingStart(KafkaConnectionError("Unable to bootstrap"))
    monkeypatch.setattr(module, name, failing.of(getattr(module, name)))
    with pytest.raises(BrokerError, match=f"cannot reach the cluster at {SERVERS}"):
        await call()
    assert failing.closed() == [True]
