"""The watch over an aiokafka client's metadata synchronizer (no broker: the update is
replaced by a stand-in). Group coordination waits for ``force_metadata_update()``, which
only the synchronizer resolves; each way it is left pending is recovered."""

from __future__ import annotations

import asyncio
import types
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from decaton_aio._aiokafka import AIOKafkaClient, MetadataSync
from decaton_aio._connect import watch_metadata


class Updates:
    """A stand-in for the client's metadata update; ``first`` decides how the first one
    goes (``None``: like every other one, at once)."""

    def __init__(self, first: Callable[[AIOKafkaClient], Any] | None = None) -> None:
        self.first = first
        self.calls = 0

    async def __call__(self, client: AIOKafkaClient) -> bool:
        self.calls += 1
        if self.calls == 1 and self.first is not None:
            await self.first(client)
        return True


@pytest.fixture
async def client() -> AsyncIterator[AIOKafkaClient]:
    made = AIOKafkaClient(bootstrap_servers="127.0.0.1:1", metadata_max_age_ms=600_000)
    MetadataSync(made).set_topics_quietly({"a", "b"})
    yield made
    await made.close()


def start(client: AIOKafkaClient, updates: Updates) -> asyncio.Task[None]:
    """Start the client's synchronizer on ``updates`` and the watch over it."""
    sync = MetadataSync(client)
    sync.replace_update(lambda cluster, topics: updates(client))
    sync.start()
    consumer: Any = types.SimpleNamespace(_client=client)
    return asyncio.create_task(watch_metadata(consumer, every_s=0.01, stuck_s=0.2))


async def test_a_synchronizer_that_died_is_started_again(client: AIOKafkaClient) -> None:
    async def fail(client: AIOKafkaClient) -> None:
        raise RuntimeError("a listener failed")

    updates = Updates(fail)
    sync = MetadataSync(client)
    sync.replace_update(lambda cluster, topics: updates(client))
    task = sync.start()
    waiting = client.force_metadata_update()
    await asyncio.wait([task])
    assert not waiting.done()  # nothing else would ever resolve it
    watch = asyncio.create_task(
        watch_metadata(types.SimpleNamespace(_client=client), every_s=0.01)  # type: ignore[arg-type]
    )
    async with asyncio.timeout(10):
        assert await waiting is False  # "not updated": its waiter retries
        assert await client.force_metadata_update() is True
    assert sync.task is not None
    assert not sync.task.done()
    watch.cancel()


async def test_a_synchronizer_waiting_on_a_waiter_nobody_sets_is_woken(
    client: AIOKafkaClient,
) -> None:
    """An update that began on the synchronizer's own timer, and during which the topic
    set changed, is followed by a wait on a waiter nobody sets (for the metadata max age,
    ten minutes here) while the future callers wait for stays pending."""
    parked = asyncio.Event()

    async def narrow(client: AIOKafkaClient) -> None:
        MetadataSync(client).park()  # as after an update on its own timer
        client.set_topics(["a"])  # a subset: no update of its own
        parked.set()

    updates = Updates(narrow)
    watch = start(client, updates)
    async with asyncio.timeout(10):
        first = client.force_metadata_update()
        await parked.wait()
        assert await first is True
    assert updates.calls == 2
    watch.cancel()


async def test_a_hung_update_is_cancelled_and_the_synchronizer_started_again(
    client: AIOKafkaClient,
) -> None:
    async def hang(client: AIOKafkaClient) -> None:
        await asyncio.Event().wait()

    updates = Updates(hang)
    watch = start(client, updates)
    async with asyncio.timeout(10):
        assert await client.force_metadata_update() is False
        assert await client.force_metadata_update() is True
    assert updates.calls == 2
    watch.cancel()
