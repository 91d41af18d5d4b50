"""The committer: a commit the client keeps retrying is given up, never awaited forever."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from decaton_aio.consumer.commit import Committer, _committer
from tests.unit.test_partition import make, records, settle


class _StuckConsumer:
    """A consumer whose commits never end, like the client's retry loop on a topic that
    was deleted (UnknownTopicOrPartition is retriable)."""

    def __init__(self) -> None:
        self.attempts = 0

    async def commit(self, offsets: Any) -> None:
        self.attempts += 1
        await asyncio.Event().wait()


async def test_a_commit_that_never_ends_is_given_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit stuck in the client is abandoned after the commit timeout: ``commit``
    returns (a revoke goes on), the offset is not taken as committed, and the next
    commit tries it again."""
    monkeypatch.setattr(_committer, "COMMIT_TIMEOUT_S", 0.01)

    async def process(ctx: Any, task: Any) -> None:
        return None

    processor = make(process)
    processor.feed(records([b"a", b"b"]))
    await settle()
    assert processor.committable() == 2
    committer = Committer(
        "group", store=None, transactions=None, on_rewind=lambda *a: None, on_fenced=lambda p: None
    )
    consumer = _StuckConsumer()
    await committer.commit(consumer, [processor], final=True)  # type: ignore[arg-type]
    await committer.commit(consumer, [processor], final=False)  # type: ignore[arg-type]
    assert consumer.attempts == 2  # not marked committed: tried again


class _AnsweringConsumer:
    """A consumer whose commit ends when the test says so."""

    def __init__(self) -> None:
        self.answer: asyncio.Future[None] | None = None
        self.called = asyncio.Event()

    async def commit(self, offsets: Any) -> None:
        self.answer = asyncio.get_running_loop().create_future()
        self.called.set()
        await self.answer


async def test_a_cancellation_that_arrives_as_the_commit_ends_is_not_lost() -> None:
    """A shutdown cancels the commit routine: when the cancellation arrives in the same
    turn of the loop as the broker's answer, the commit still ends cancelled (a lost
    cancellation left the routine running and the shutdown waiting for it forever)."""

    async def process(ctx: Any, task: Any) -> None:
        return None

    processor = make(process)
    processor.feed(records([b"a"]))
    await settle()
    committer = Committer(
        "group", store=None, transactions=None, on_rewind=lambda *a: None, on_fenced=lambda p: None
    )
    consumer = _AnsweringConsumer()
    task = asyncio.create_task(committer.commit(consumer, [processor], final=False))  # type: ignore[arg-type]
    await consumer.called.wait()
    assert consumer.answer is not None
    consumer.answer.set_result(None)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
