"""The partition processor without a broker: lanes, the concurrency bound, draining."""

from __future__ import annotations

import asyncio
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiokafka import TopicPartition

from decaton_aio.consumer._execution import TaskExecutor
from decaton_aio.consumer._partition import PartitionProcessor, PartitionState, PendingBytes
from decaton_aio.context import ProcessingContext
from decaton_aio.metrics import PartitionStats
from decaton_aio.properties import Properties
from decaton_aio.retry import RetryConfig

TP = TopicPartition("tasks", 0)


@dataclass
class FakeRecord:
    offset: int
    key: bytes | None
    value: bytes | None = b"v"
    timestamp: int = 0
    headers: list[tuple[str, bytes]] = field(default_factory=list)


def records(keys: list[bytes | None], first: int = 0) -> list[FakeRecord]:
    return [FakeRecord(first + i, key) for i, key in enumerate(keys)]


class Gate:
    """A processor whose tasks block until released, recording what runs when."""

    def __init__(self) -> None:
        self.running: dict[int, asyncio.Event] = {}
        self.started: list[int] = []
        self.finished: list[int] = []
        self.max_running = 0
        self.by_key: dict[bytes | None, list[int]] = defaultdict(list)

    async def __call__(self, ctx: ProcessingContext, task: Any) -> None:
        event = self.running[ctx.offset] = asyncio.Event()
        self.started.append(ctx.offset)
        self.by_key[ctx.key].append(ctx.offset)
        self.max_running = max(self.max_running, len(self.running))
        await event.wait()
        del self.running[ctx.offset]
        self.finished.append(ctx.offset)

    async def release(self, *offsets: int) -> None:
        for offset in offsets:
            self.running[offset].set()
        await settle()


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


class FakeSender:
    """Records what the runtime sends; fails the first ``failures`` sends."""

    def __init__(self, failures: int = 0) -> None:
        self.sent: list[tuple[str, bytes | None, bytes | None, list[tuple[str, bytes]]]] = []
        self.failures = failures

    async def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None,
        headers: Any,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> None:
        await asyncio.sleep(0)
        if self.failures:
            self.failures -= 1
            raise ConnectionError("broker down")
        self.sent.append((topic, key, value, list(headers)))


def make(
    process: Any,
    *,
    limit: int = 100,
    max_pending: int = 1000,
    sender: FakeSender | None = None,
    retry: RetryConfig | None = None,
    properties: dict[str, Any] | None = None,
    **kw: Any,
) -> PartitionProcessor:
    executor = TaskExecutor(
        subscription_id="test",
        process=process,
        decode=kw.pop("decode", lambda value: value),
        sender=sender or FakeSender(),
        properties=Properties(properties or {}),
        retry=retry,
        deferred_timeout_policy=kw.pop("deferred_policy", "give_up"),
    )
    return PartitionProcessor(
        TP,
        executor=executor,
        limit=limit,
        max_pending=max_pending,
        stats=PartitionStats(),
        on_below_max_pending=kw.pop("on_below", lambda p: None),
        **kw,
    )


async def test_same_key_serial_different_keys_concurrent() -> None:
    """Records of one key run one after another in offset order; other keys run at once."""
    gate = Gate()
    proc = make(gate)
    proc.feed(records([b"a", b"b", b"a", b"c", b"a"]))
    await settle()
    assert sorted(gate.running) == [0, 1, 3]  # first of a, b, c
    await gate.release(0)
    assert sorted(gate.running) == [1, 2, 3]
    await gate.release(2)
    assert sorted(gate.running) == [1, 3, 4]
    await gate.release(1, 3, 4)
    assert gate.by_key[b"a"] == [0, 2, 4]
    assert proc.committable() == 5
    assert proc.active_keys == 0


async def test_watermark_waits_for_the_slowest_record() -> None:
    """Completions out of order never move the commit offset past an unfinished record."""
    gate = Gate()
    proc = make(gate)
    proc.feed(records([b"a", b"b", b"c", b"d"], first=10))
    await settle()
    await gate.release(11, 13)
    assert proc.committable() == 10
    await gate.release(10)
    assert proc.committable() == 12
    await gate.release(12)
    assert proc.committable() == 14
    assert proc.pending == 0


async def test_concurrency_bound_and_live_changes() -> None:
    """At most `limit` tasks run; a raise starts waiting ones at once; a cut lets running
    ones finish and starts new ones only under the new bound."""
    gate = Gate()
    proc = make(gate, limit=3)
    proc.feed(records([f"k{i}".encode() for i in range(20)]))
    await settle()
    assert len(gate.running) == 3
    proc.set_limit(8)
    await settle()
    assert len(gate.running) == 8
    proc.set_limit(2)
    await settle()
    assert len(gate.running) == 8  # nothing is cancelled
    await gate.release(*list(gate.running)[:5])
    assert len(gate.running) == 3  # no new start above the new bound
    await gate.release(*list(gate.running)[:2])
    assert len(gate.running) == 2  # one finished slot refilled, under the bound of 2
    while gate.running:
        await gate.release(*list(gate.running))
    assert sorted(gate.finished) == list(range(20))
    assert proc.committable() == 20


async def test_null_keys_are_not_serialized() -> None:
    """Records without a key have no lane: they run concurrently."""
    gate = Gate()
    proc = make(gate)
    proc.feed(records([None, None, None]))
    await settle()
    assert sorted(gate.running) == [0, 1, 2]
    await gate.release(2, 0, 1)
    assert proc.committable() == 3


async def test_synchronous_tasks_complete_without_a_task_object() -> None:
    """A processor that never suspends completes inside feed, in order."""
    seen: list[int] = []

    async def process(ctx: ProcessingContext, task: Any) -> None:
        seen.append(ctx.offset)

    proc = make(process, limit=1)
    proc.feed(records([b"a", b"b", b"a", None] * 250))
    assert sorted(seen) == list(range(1000))
    assert [o for o in seen if o % 4 in (0, 2)] == [o for o in range(1000) if o % 4 in (0, 2)]
    assert proc.committable() == 1000
    assert proc.stats.processed == 1000
    assert proc.active_keys == 0


async def test_idle_lanes_cost_nothing() -> None:
    """A hundred thousand distinct keys leave no lane behind once done."""

    async def process(ctx: ProcessingContext, task: Any) -> None:
        await asyncio.sleep(0)

    proc = make(process, limit=1000, max_pending=200_000)
    for start in range(0, 100_000, 10_000):
        proc.feed(records([f"key-{i}".encode() for i in range(start, start + 10_000)], first=start))
    assert await proc.wait_idle(10.0)
    assert proc.active_keys == 0
    assert proc.committable() == 100_000


async def test_failed_task_is_counted_and_completed() -> None:
    """A processor exception is counted, the offset completes, the partition carries on."""

    async def process(ctx: ProcessingContext, task: Any) -> None:
        if ctx.offset % 2:
            raise ValueError(f"bad {ctx.offset}")
        await asyncio.sleep(0)

    proc = make(process)
    proc.feed(records([b"a"] * 10))
    assert await proc.wait_idle(5.0)
    assert (proc.stats.processed, proc.stats.errors) == (10, 5)
    assert proc.committable() == 10


async def test_revoke_drops_queued_and_close_ignores_late_completions() -> None:
    """Revoking stops new starts and drops queued records; after close, a task that
    outlived the assignment cannot move the watermark."""
    gate = Gate()
    proc = make(gate, limit=2)
    proc.feed(records([b"a", b"b", b"c", b"a"]))
    await settle()
    assert sorted(gate.running) == [0, 1]
    proc.revoke()
    await gate.release(0)
    assert sorted(gate.running) == [1]  # 2 and 3 were dropped, not started
    assert not await proc.wait_idle(0.05)
    assert proc.committable() == 1
    proc.close()
    await gate.release(1)
    assert proc.state is PartitionState.CLOSED
    assert proc.committable() == 1


async def test_every_waiter_wakes_when_the_partition_goes_idle_or_closes() -> None:
    """A shutdown and a revoke can wait for the same partition: both wake when its tasks
    finish; a waiter of a partition that closes meanwhile wakes at the close."""
    gate = Gate()
    proc = make(gate, limit=2)
    proc.feed(records([b"a", b"b"]))
    await settle()
    shutdown = asyncio.create_task(proc.wait_idle(60.0))
    await settle()
    revoke = asyncio.create_task(proc.wait_idle(60.0))
    await gate.release(0, 1)
    assert (shutdown.done(), revoke.done()) == (True, True)
    assert (shutdown.result(), revoke.result()) == (True, True)

    proc.feed(records([b"c"], first=2))
    await settle()
    waiter = asyncio.create_task(proc.wait_idle(60.0))
    await settle()
    proc.close()
    await settle()
    assert waiter.done()
    await gate.release(2)


async def test_pause_threshold_reports_resume() -> None:
    """needs_pause flips at max pending; a completion below it asks for a resume."""
    gate = Gate()
    resumed: list[PartitionProcessor] = []
    proc = make(gate, max_pending=3, on_below=resumed.append)
    proc.feed(records([b"a", b"b", b"c"]))
    await settle()
    assert proc.needs_pause
    proc.set_paused(True)
    await gate.release(0)
    assert resumed == [proc]
    assert not proc.needs_pause


def sized(sizes: list[int], first: int = 0) -> list[FakeRecord]:
    """Records of distinct keys ``k<offset>`` whose values are ``sizes`` bytes long."""
    return [FakeRecord(first + i, b"k%d" % (first + i), b"x" * n) for i, n in enumerate(sizes)]


async def test_pending_bytes_pause_a_partition_and_its_completions_resume_it() -> None:
    """The values of pending records count against decaton.max.pending.bytes:
    the partition needs a pause at the limit and asks to resume once a completion frees
    room."""
    gate = Gate()
    resumed: list[PartitionProcessor] = []
    proc = make(gate, max_pending_bytes=1000, on_below=resumed.append)
    proc.feed(sized([400, 400]))
    assert (proc.pending_bytes, proc.needs_pause) == (800, False)
    proc.feed(sized([300], first=2))
    assert proc.needs_pause
    proc.set_paused(True)
    await settle()
    await gate.release(1)
    assert proc.pending_bytes == 700
    proc.fold_stats()
    assert (proc.stats.pending, proc.stats.pending_bytes) == (2, 700)
    assert resumed == [proc]
    await gate.release(0, 2)
    assert proc.pending_bytes == 0


async def test_the_subscription_total_pauses_every_partition_until_one_frees_room() -> None:
    """decaton.max.pending.bytes.total is shared: when one partition's records fill it,
    every partition needs a pause, and a completion anywhere that makes room asks the
    paused ones to resume; a closed partition gives its bytes back."""
    total = PendingBytes(1000)
    gates = [Gate(), Gate()]
    resumed: list[PartitionProcessor] = []

    def resume(partition: PartitionProcessor) -> None:  # as the assignment does
        resumed.append(partition)
        partition.set_paused(False)

    one, two = (make(g, pending_bytes=total, on_below=resume) for g in gates)
    one.feed(sized([600]))
    two.feed(sized([200]))
    assert not one.needs_pause
    assert not two.needs_pause
    one.feed(sized([300], first=1))
    assert total.used == 1100
    assert one.needs_pause
    assert two.needs_pause
    one.set_paused(True)
    two.set_paused(True)
    await settle()
    await gates[1].release(0)  # the other partition's completion makes room
    assert sorted(id(p) for p in resumed) == sorted([id(one), id(two)])
    one.close()
    assert total.used == 0
    await gates[0].release(0, 1)  # completions after the close are ignored
    assert total.used == 0


@pytest.mark.parametrize("limit", [1, 4])
async def test_wait_idle_after_all_complete(limit: int) -> None:
    """wait_idle returns True once every started and queued task is done."""

    async def process(ctx: ProcessingContext, task: Any) -> None:
        await asyncio.sleep(0.001)

    proc = make(process, limit=limit)
    proc.feed(records([b"a", b"b", b"a", b"c", None, None]))
    assert await proc.wait_idle(2.0)
    assert proc.pending == 0


async def test_pending_count_matches_the_tracker_through_every_path() -> None:
    """The processor's own pending count (read on every completion while paused) agrees
    with the tracker's exact one after running, queued, ignored and finished records."""
    gate = Gate()
    proc = make(gate, limit=2, ignore_keys=[b"skip"])
    proc.feed(records([b"a", b"b", b"a", b"skip", b"c", b"d"]))
    await settle()
    assert proc.pending == proc.tracker.pending == 5
    await gate.release(0)
    await gate.release(1)
    assert proc.pending == proc.tracker.pending == 3


async def test_long_lane_keeps_order_when_it_turns_into_a_deque() -> None:
    """A key with many waiting records (past the short-lane size) still runs them one at
    a time in offset order; its lane is gone once the key is idle."""
    order: list[int] = []

    async def process(ctx: ProcessingContext, task: Any) -> None:
        order.append(ctx.offset)
        await asyncio.sleep(0)

    proc = make(process)
    keys = [b"hot"] * 100 + [b"other"] * 5 + [b"hot"] * 20
    proc.feed(records(keys))
    assert isinstance(proc._lanes[b"hot"], deque)
    for _ in range(2_000):  # each hot task takes about two loop turns
        await asyncio.sleep(0)
    assert proc.committable() == len(keys)
    hot = [o for o in order if keys[o] == b"hot"]
    assert hot == sorted(hot)
    assert len(hot) == 120
    assert proc.active_keys == 0


async def test_a_batch_that_goes_back_is_refused_whole() -> None:
    """Offsets below those already taken (a reset, a seek back, a recreated topic) are not
    fed: the partition says so and changes nothing, so the caller can start it afresh."""
    gate = Gate()
    proc = make(gate)
    assert proc.feed(records([b"a", b"b", b"c"]))
    assert not proc.feed(records([b"x", b"y"], first=1))
    assert (proc.pending, proc.committable()) == (3, 0)
    assert proc.feed(records([b"d"], first=3))
    assert proc.pending == 4
