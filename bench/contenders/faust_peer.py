"""Peer (d): a faust-streaming agent with ``concurrency=100``.

Faust runs 100 copies of the agent on one stream; a record is handed to whichever copy
is free, so tasks of one key can run concurrently and out of order. Faust owns the event
loop (its worker starts and runs it), so this contender runs blocking; a startup task
of the app waits for the recorder's window and ends the process with the result.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec

from bench.recorder import Recorder
from bench.workload import Spec, Task

__all__ = ["CONCURRENCY", "run_blocking"]

CONCURRENCY = 100


def run_blocking(spec: Spec, recorder: Recorder) -> None:
    import faust
    from faust.worker import Worker

    app = faust.App(
        spec.group_id,
        broker=f"kafka://{spec.bootstrap}",
        key_serializer="raw",
        value_serializer="raw",
        store="memory://",
        web_enabled=False,
        topic_partitions=spec.partitions,
        topic_disable_leader=True,
        consumer_auto_offset_reset="earliest",
        broker_session_timeout=spec.session_timeout_ms / 1000,
        broker_heartbeat_interval=max(0.1, spec.session_timeout_ms / 10_000),
    )
    topic = app.topic(spec.topic, key_type=bytes, value_type=bytes)
    process = recorder.processor()
    decode = msgspec.json.Decoder(Task).decode
    concurrency = int(spec.options.get("concurrency", CONCURRENCY))

    @app.agent(topic, concurrency=concurrency)
    async def tasks(stream: Any) -> None:
        async for value in stream:
            await process(None, decode(value))

    @app.task
    async def measure() -> None:
        import asyncio

        ticker = asyncio.ensure_future(recorder.ticker())
        await recorder.wait()
        ticker.cancel()
        recorder.finish()

    logging.getLogger("faust").setLevel(logging.WARNING)
    Worker(app, loglevel="WARNING", quiet=True, redirect_stdouts=False).execute_from_commandline()
