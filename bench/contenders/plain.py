"""Hand-written aiokafka consumers, the way Python services do it.

- ``sequential``: each task awaited in turn, with aiokafka's default auto-commit (what
  most Python code does; it may commit a record before it is processed).
- ``gather``: ``asyncio.gather`` over each polled batch, then a commit: fast when
  latencies are uniform, but unordered and head-of-line blocked (the slowest task of a
  batch holds up the next batch).
- ``keyed``: the batch grouped by key; a key's tasks run one after another, keys run
  concurrently; then a commit. Ordered, still head-of-line blocked per batch.
- ``reader``: each record started as an asyncio task as soon as it is fetched, then the
  next fetch at once; auto-commit, no order, nothing bounded. Not a way to run tasks but
  the transport's floor for the latency ladder: its wait before start is the pacer, the
  broker and aiokafka's fetcher alone. The ladder paces it at ours' rates (alone:
  ``--only L --contenders reader --capacity reader=N``, the rates of a capacity N).

Options: ``batch_records`` (``getmany(max_records=...)``, default 500, up to 10,000) and
``max_in_flight`` (gather, keyed: at most this many tasks running at once, by a
semaphore; default none). ``gather`` and ``keyed`` commit after the whole batch completed
(at-least-once).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from aiokafka import AIOKafkaConsumer

from bench.body import Body
from bench.workload import RunSpec

__all__ = ["BATCH_RECORDS", "main"]

BATCH_RECORDS = 500


def capped(
    run: Callable[[int, int, bytes], Awaitable[None]], max_in_flight: int | None
) -> Callable[[int, int, bytes], Awaitable[None]]:
    """``run`` limited to ``max_in_flight`` concurrent calls (unchanged for None)."""
    if not max_in_flight:
        return run
    gate = asyncio.Semaphore(max_in_flight)

    async def limited(partition: int, offset: int, value: bytes) -> None:
        async with gate:
            await run(partition, offset, value)

    return limited


async def run_batch(
    mode: str, records: list[Any], run: Callable[[int, int, bytes], Awaitable[None]]
) -> None:
    """One polled batch of records (``.partition``, ``.offset``, ``.key``, ``.value``
    attributes, or confluent-kafka's methods of those names) the ``mode`` way."""

    async def in_turn(group: list[Any]) -> None:
        for r in group:
            await run(r.partition, r.offset, r.value)

    if mode == "sequential":
        await in_turn(records)
    elif mode == "gather":
        await asyncio.gather(*(run(r.partition, r.offset, r.value) for r in records))
    elif mode == "keyed":
        groups: dict[bytes, list[Any]] = {}
        for r in records:
            group = groups.get(r.key)
            if group is None:
                groups[r.key] = [r]
            else:
                group.append(r)
        await asyncio.gather(*(in_turn(g) for g in groups.values()))
    else:
        raise ValueError(f"unknown mode {mode!r}")


async def main(spec: RunSpec, body: Body) -> None:
    mode = spec.contender
    opts = spec.options
    consumer = AIOKafkaConsumer(
        spec.topic,
        bootstrap_servers=spec.bootstrap,
        group_id=spec.group,
        enable_auto_commit=mode in ("sequential", "reader"),
        auto_offset_reset="earliest",
        session_timeout_ms=spec.session_timeout_ms,
        heartbeat_interval_ms=max(100, spec.session_timeout_ms // 10),
        **spec.security.client_kwargs(),
    )
    await consumer.start()
    run = capped(body.run_raw, opts.get("max_in_flight"))
    batch_records = int(opts.get("batch_records", BATCH_RECORDS))
    running: set[asyncio.Task[None]] = set()
    try:
        while True:
            batches = await consumer.getmany(timeout_ms=100, max_records=batch_records)
            if not batches:
                continue
            if mode == "reader":
                for rs in batches.values():
                    for r in rs:
                        task = asyncio.create_task(run(r.partition, r.offset, r.value))
                        running.add(task)
                        task.add_done_callback(running.discard)
                continue
            records = [r for rs in batches.values() for r in rs]
            await run_batch(mode, records, run)
            if mode != "sequential":
                await consumer.commit()
    finally:
        with contextlib.suppress(Exception):
            await consumer.stop()
