"""Stopping a subscription closes every part of it, even when closing one part fails:
a stop that ended at the first failure left the connections of the later ones open."""

from __future__ import annotations

import asyncio

import pytest

from decaton_aio import Application, ConsumerConfig, ProcessingContext
from decaton_aio.consumer import Subscription, SubscriptionState
from decaton_aio.consumer._subscription import _cancel


async def _noop(ctx: ProcessingContext, task: bytes) -> None:
    return None


async def test_a_part_that_fails_to_close_does_not_keep_the_later_ones_open() -> None:
    """The committer's clients fail to close: the sender is stopped all the same, the
    subscription terminates, and the stop raises the committer's failure."""
    sub = Subscription(Application(_noop, topics=("tasks",)), ConsumerConfig("localhost:9", "g"))
    closed: list[str] = []

    async def committer_close() -> None:
        closed.append("committer")
        raise RuntimeError("the checkpoint store did not close")

    async def sender_stop() -> None:
        closed.append("sender")

    sub._committer.close = committer_close  # type: ignore[method-assign]
    sub._sender.stop = sender_stop  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="the checkpoint store did not close"):
        await sub.stop()
    assert closed == ["committer", "sender"]
    assert sub.state is SubscriptionState.TERMINATED


async def test_cancelling_a_routine_passes_a_cancellation_of_the_caller_on() -> None:
    """A stop cancelled while it waits for a routine to end is cancelled itself (the
    routine's own cancellation is swallowed, the caller's is not)."""
    cancelled, release = asyncio.Event(), asyncio.Event()

    async def slow_to_cancel() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            await release.wait()
            raise

    routine = asyncio.create_task(slow_to_cancel())
    await _cancel(asyncio.create_task(asyncio.Event().wait()))  # type: ignore[arg-type]
    caller = asyncio.create_task(_cancel(routine))
    await cancelled.wait()
    caller.cancel()
    release.set()
    await asyncio.wait({caller})
    assert caller.cancelled()
    assert routine.cancelled()
