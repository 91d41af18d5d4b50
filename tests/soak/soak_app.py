"""The soak's application: tasks that sometimes fail, retry or go to the dead letter topic.

The soak copies this file beside the instances and runs it with
``python -m decaton_aio run soak_app:app``; each incarnation logs to ``$CHAOS_LOG`` (the
file the chaos tests' ``Instance`` names for it):

- ``s TOPIC PARTITION OFFSET KEY N`` when a task starts (``TOPIC``: ``m`` for the task
  topic, ``r`` for its retry topic; ``N``: the task's number);
- ``e TOPIC PARTITION OFFSET KEY N OUTCOME`` when it ends (``OUTCOME``: ``ok``,
  ``failed`` or ``retry``);
- ``epoch`` at each rebalance, after which a key may start again at its committed point.

The log is written in blocks and closed by the shutdown hook (the soak stops instances
with SIGTERM, which drains and runs it); an ``epoch`` line is flushed at once, since the
soak waits for the first one to know an incarnation joined its group.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, TextIO

import structlog

from decaton_aio import Application, BytesSerializer, ProcessingContext, RetryConfig, RetryPolicy

#: Seconds of I/O a task waits.
WORK_S = 0.005

#: What happens to task number n, by n % FATE_MODULUS (others succeed at once).
FATE_MODULUS = 97
FATES = {1: "fails once", 2: "retries once", 3: "always fails", 4: "rejected"}

#: Fates that end in the dead letter topic: retries exhausted, or an error never retried.
DEAD = frozenset({"always fails", "rejected"})

_out: TextIO | None = None


def fate(n: int) -> str:
    """What happens to task number ``n``: ``ok``, or one of :data:`FATES`."""
    return FATES.get(n % FATE_MODULUS, "ok")


def _epochs(logger: Any, name: str, event: dict[str, Any]) -> dict[str, Any]:
    if _out is not None and str(event.get("event", "")).startswith("partitions "):
        _out.write("epoch\n")
        _out.flush()
    return event


def _open(path: str) -> TextIO:
    return open(path, "a", buffering=1 << 16)  # closed by the shutdown hook


async def _open_log() -> None:
    global _out
    _out = _open(os.environ["CHAOS_LOG"])
    structlog.configure(processors=[_epochs, *structlog.get_config()["processors"]])


async def _close_log() -> None:
    if _out is not None:
        _out.close()


async def process(ctx: ProcessingContext, task: bytes) -> None:
    assert _out is not None
    assert ctx.key is not None
    n = int(task)
    topic = "r" if ctx.topic.endswith("-retry") else "m"
    lane = f"{topic} {ctx.partition} {ctx.offset} {ctx.key.decode()} {n}"
    _out.write(f"s {lane}\n")
    await asyncio.sleep(WORK_S)
    what, first = fate(n), ctx.metadata.retry_count == 0
    if what == "always fails" or (what == "fails once" and first):
        _out.write(f"e {lane} failed\n")
        raise RuntimeError(f"task {n} fails")
    if what == "rejected":
        _out.write(f"e {lane} failed\n")
        raise ValueError(f"task {n} is rejected")  # never retried: dead-lettered at once
    if what == "retries once" and first:
        _out.write(f"e {lane} retry\n")
        ctx.retry()
        return
    _out.write(f"e {lane} ok\n")


app = Application(
    process,
    topics=("unused",),  # the soak names its topic with --topic
    serializer=BytesSerializer(),
    retry=RetryConfig(
        RetryPolicy(
            max_attempts=3, backoff_base_ms=100, backoff_max_ms=400, no_retry_on=(ValueError,)
        )
    ),
    on_startup=_open_log,
    on_shutdown=_close_log,
)
