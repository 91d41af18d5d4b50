"""The background routine of a property source: spawned, watched, cancelled.

[`FilePropertySource`][decaton_aio.properties.FilePropertySource] and
[`KafkaPropertySource`][decaton_aio.properties.KafkaPropertySource] follow the routine
vocabulary: ``start()`` spawns ``_x_routine()`` with `spawn()`, ``stop()`` cancels and
awaits it with `cancel_and_wait()`. A routine that ends with an unexpected error is
logged at once and its error re-raised by ``stop()`` to whoever supervises the source.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import structlog

__all__ = ["cancel_and_wait", "spawn"]

_log = structlog.get_logger("decaton_aio")


def spawn(routine: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
    """Run ``routine`` as a task named ``name``; an unexpected failure is logged at once."""
    task: asyncio.Task[None] = asyncio.get_running_loop().create_task(routine, name=name)
    task.add_done_callback(_log_failure)
    return task


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        # Unexpected: expected failures are handled inside the routines. stop() re-raises
        # it to the supervisor; log now so it is seen even before stop() is called.
        _log.error("property source routine failed", routine=task.get_name(), exc_info=exc)


async def cancel_and_wait(task: asyncio.Task[None]) -> None:
    """Cancel ``task`` and wait for it; re-raise the error it failed with, if any."""
    task.cancel()
    # asyncio.wait does not raise when the task was cancelled, and still lets a
    # cancellation of stop() itself propagate.
    await asyncio.wait([task])
    if not task.cancelled() and (exc := task.exception()) is not None:
        raise exc
