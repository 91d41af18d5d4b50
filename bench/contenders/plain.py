"""Peers (a), (b), (c): hand-written aiokafka consumers, the way Python services do it.

- ``sequential``: each task awaited in turn, with aiokafka's default auto-commit (what
  most Python code does; it may commit a record before it is processed).
- ``gather``: ``asyncio.gather`` over each polled batch (up to 500 records), then a
  commit: fast when latencies are uniform, but unordered and head-of-line blocked (the
  slowest task of a batch holds up the next batch).
- ``keyed``: the batch grouped by key; a key's tasks run one after another, keys run
  concurrently; then a commit. Ordered, still head-of-line blocked per batch.

``gather`` and ``keyed`` commit only after the whole batch completed (at-least-once).
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from aiokafka import AIOKafkaConsumer

from bench.recorder import Recorder
from bench.workload import Spec, Task

__all__ = ["main"]

BATCH_RECORDS = 500


async def main(spec: Spec, recorder: Recorder) -> None:
    mode = spec.contender
    batch_records = int(spec.options.get("batch_records", BATCH_RECORDS))
    consumer = AIOKafkaConsumer(
        spec.topic,
        bootstrap_servers=spec.bootstrap,
        group_id=spec.group_id,
        enable_auto_commit=mode == "sequential",
        auto_offset_reset="earliest",
        session_timeout_ms=spec.session_timeout_ms,
        heartbeat_interval_ms=max(100, spec.session_timeout_ms // 10),
        **spec.security.client_kwargs(),
    )
    await consumer.start()
    process = recorder.processor()
    decode = msgspec.json.Decoder(Task).decode

    async def run_sequentially(records: list[Any]) -> None:
        for record in records:
            await process(None, decode(record.value))

    ticker = asyncio.create_task(recorder.ticker())
    try:
        while not recorder.closed:
            batches = await consumer.getmany(timeout_ms=100, max_records=batch_records)
            if not batches:
                continue
            if mode == "sequential":
                for records in batches.values():
                    await run_sequentially(records)
            elif mode == "gather":
                await asyncio.gather(
                    *(
                        process(None, decode(r.value))
                        for records in batches.values()
                        for r in records
                    )
                )
            elif mode == "keyed":
                groups: dict[bytes, list[Any]] = {}
                for records in batches.values():
                    for r in records:
                        group = groups.get(r.key)
                        if group is None:
                            groups[r.key] = [r]
                        else:
                            group.append(r)
                await asyncio.gather(*(run_sequentially(g) for g in groups.values()))
            else:
                raise ValueError(f"unknown plain contender {mode!r}")
            if mode != "sequential":
                await consumer.commit()
    finally:
        ticker.cancel()
