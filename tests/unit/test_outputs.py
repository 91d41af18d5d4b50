"""ctx.produce without a broker: outputs leave only with a task that succeeded, and the
task's offset completes only once its outputs are delivered."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from decaton_aio.backoff import RetryPolicy
from decaton_aio.context import ProcessingContext
from decaton_aio.errors import ConfigError
from decaton_aio.retry import RetryConfig
from tests.unit.test_partition import TP, FakeSender, make, records, settle


class SlowSender(FakeSender):
    """A sender whose sends wait until allowed."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()

    async def send(self, topic: str, value: bytes | None, **kw: Any) -> None:
        await self.gate.wait()
        await super().send(topic, value, **kw)


async def test_outputs_are_sent_and_the_offset_waits_for_them() -> None:
    """A task's outputs are sent in order after it returns; its offset completes only
    once they are acknowledged."""
    sender = SlowSender()

    async def process(ctx: ProcessingContext, task: Any) -> None:
        await ctx.produce("out", b"first", key=b"k")
        await ctx.produce("out", b"second", headers=[("h", b"1")])

    proc = make(process, sender=sender)
    proc.feed(records([b"a"]))
    await settle()
    assert proc.committable() == 0
    assert proc.in_flight == 0  # the slot is free while the outputs go out
    sender.gate.set()
    await settle()
    assert [(t, k, v) for t, k, v, _ in sender.sent] == [
        ("out", b"k", b"first"),
        ("out", None, b"second"),
    ]
    assert sender.sent[1][3] == [("h", b"1")]
    assert proc.committable() == 1


async def test_a_failed_attempt_leaves_no_outputs() -> None:
    """Outputs of an attempt that raised are dropped; the in-place retry's outputs are
    the only ones sent."""
    sender = FakeSender()
    attempts: list[int] = []
    second = asyncio.Event()

    async def process(ctx: ProcessingContext, task: Any) -> None:
        attempts.append(ctx.attempt)
        if ctx.attempt == 2:
            second.set()
        await ctx.produce("out", f"attempt {ctx.attempt}".encode())
        if ctx.attempt == 1:
            raise RuntimeError("flaky")

    retry = RetryConfig(
        policy=RetryPolicy(max_attempts=3, backoff_base_ms=1, jitter=0.0), mode="in_place"
    )
    proc = make(process, sender=sender, retry=retry)
    proc.feed(records([b"a"]))
    await asyncio.wait_for(second.wait(), 5)
    await settle()
    assert proc.committable() == 1
    assert attempts == [1, 2]
    assert [v for _, _, v, _ in sender.sent] == [b"attempt 2"]


async def test_deferred_outputs_leave_at_completion() -> None:
    """A deferred task's outputs, even ones produced after the processor returned, are
    sent when it completes, and not at all if it fails."""
    sender = FakeSender()
    contexts: dict[int, ProcessingContext] = {}

    async def process(ctx: ProcessingContext, task: Any) -> None:
        ctx.deferred()
        contexts[ctx.offset] = ctx

    proc = make(process, sender=sender)
    proc.feed(records([b"a", b"b"]))
    await settle()
    await contexts[0].produce("out", b"later")
    completion = contexts[0].completion
    assert completion is not None
    completion.complete()
    await contexts[1].produce("out", b"never")
    failed = contexts[1].completion
    assert failed is not None
    failed.fail(RuntimeError("gave up"))
    await settle()
    assert [v for _, _, v, _ in sender.sent] == [b"later"]
    assert proc.committable() == 2


async def test_bad_outputs_are_refused_with_the_fix() -> None:
    """A value that is not bytes, an empty topic or a bad header raise ConfigError."""
    ctx = ProcessingContext("s", make(lambda c, t: None), records([b"a"])[0])
    with pytest.raises(ConfigError, match="encode it first"):
        await ctx.produce("out", "text")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="topic"):
        await ctx.produce("", b"v")
    with pytest.raises(ConfigError, match="headers"):
        await ctx.produce("out", b"v", headers=[("h", "text")])  # type: ignore[list-item]
    assert ctx.outputs is None
    assert TP.topic == "tasks"
