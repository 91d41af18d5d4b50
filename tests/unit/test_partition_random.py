"""Randomized runs of a partition with processors that do everything at once.

Each run feeds 300 records of a few keys in random batches to a processor that, per task,
returns at once, waits, defers and completes later or at once, completes *another* task's
deferred completion during its own first step, raises, or asks for an in-place retry.
Whatever the mix, per-key order holds, the processor's pending count agrees with the
tracker's, and every offset completes exactly once: the watermark reaches the end with
nothing running, waiting or left in a lane.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from decaton_aio.backoff import RetryPolicy
from decaton_aio.completion import Completion
from decaton_aio.context import ProcessingContext
from decaton_aio.retry import RetryConfig
from tests.unit.test_partition import make, records

ACTIONS = (
    "sync", "sync", "sync", "sleep", "defer_later", "defer_self", "hold", "release_held",
    "raise", "retry",
)  # fmt: skip


@pytest.mark.parametrize("seed", range(60))
@pytest.mark.parametrize("retries", [False, True])
async def test_random_mix_keeps_order_and_completes_every_offset_once(
    seed: int, retries: bool
) -> None:
    rnd = random.Random(seed)
    loop = asyncio.get_running_loop()
    held: list[Completion] = []  # deferred completions another task completes
    busy: dict[bytes, bool] = {}
    started: list[tuple[int, bytes | None, int]] = []
    overlaps: list[int] = []
    chosen: dict[tuple[int, int], str] = {}

    async def process(ctx: ProcessingContext, task: Any) -> None:
        key = ctx.key
        if key is not None:
            if busy.get(key):
                overlaps.append(ctx.offset)
            busy[key] = True
        started.append((ctx.offset, key, ctx.attempt))
        action = chosen.setdefault((ctx.offset, ctx.attempt), rnd.choice(ACTIONS))
        try:
            if action == "sleep":
                await asyncio.sleep(0)
            elif action == "defer_later":
                loop.call_later(rnd.random() * 0.002, ctx.deferred().complete)
            elif action == "defer_self":
                ctx.deferred().complete()
            elif action == "hold":
                held.append(ctx.deferred())
                if len(held) > 1 and rnd.random() < 0.8:
                    held.pop(0).complete()
            elif action == "release_held" and held:
                held.pop(rnd.randrange(len(held))).complete()  # re-enters the partition
            elif action == "raise":
                raise ValueError("boom")
            elif action == "retry" and ctx.attempt < 3:
                ctx.retry(0.0)
        finally:
            if key is not None:
                busy[key] = False

    retry = None
    if retries:
        policy = RetryPolicy(max_attempts=5, backoff_base_ms=0, jitter=0.0)
        retry = RetryConfig(policy, mode="in_place")
    proc = make(process, limit=rnd.choice([1, 2, 3, 8, 100]), retry=retry, max_pending=10**6)
    keys = [rnd.choice([b"a", b"b", b"c", b"d", None]) for _ in range(300)]
    first = 0
    while first < len(keys):
        n = rnd.randrange(1, 40)
        proc.feed(records(keys[first : first + n], first=first))
        first += n
        for _ in range(rnd.randrange(0, 3)):
            await asyncio.sleep(0)
            assert proc.pending == proc.tracker.pending
    for _ in range(200):
        await asyncio.sleep(0.001)
        while held:
            held.pop().complete()
        if proc.committable() == len(keys):
            break

    assert overlaps == []
    assert proc.committable() == len(keys)
    assert proc.pending == proc.tracker.pending == 0
    assert (proc.in_flight, proc.active_keys) == (0, 0)
    for key in {k for k in keys if k is not None}:
        firsts = [offset for offset, k, attempt in started if k == key and attempt == 1]
        assert firsts == sorted(firsts)
