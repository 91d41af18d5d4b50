"""The fields of a task's processing context, compiled with the runtime's hot path.

[`ProcessingContext`][decaton_aio.ProcessingContext], what a processor is handed, is
`TaskFields` with its methods. The executor makes one per task and reads these
fields when the task ends: they are its side of the context (what the task asked for:
a state, a deferred completion, a retry, outputs), read without a call. So they live in a
class mypyc compiles (``setup.py``), while the public class keeps its documentation and
checks in Python (a compiled class has no docstrings, and checks its arguments' types
itself).
"""

from __future__ import annotations

from typing import Any

import structlog
from mypy_extensions import mypyc_attr

from decaton_aio.completion import Completion
from decaton_aio.metadata import TaskMetadata
from decaton_aio.state import KeyState
from decaton_aio.typing import Record

__all__ = ["TaskFields"]


@mypyc_attr(allow_interpreted_subclasses=True)  # ProcessingContext is one
class TaskFields:
    """What a processing context holds; see [`ProcessingContext`][decaton_aio.ProcessingContext]."""

    __slots__ = (
        "_logger",
        "_metadata",
        "_partition",
        "attempt",
        "completion",
        "key_state",
        "outputs",
        "record",
        "retry_delay_s",
        "started_at",
        "subscription_id",
    )

    def __init__(
        self,
        subscription_id: str,
        partition: Any,
        record: Record,
        attempt: int = 1,
    ) -> None:
        self.subscription_id = subscription_id
        self._partition = partition  # a TaskSource (decaton_aio.context)
        self.record = record
        self.attempt = attempt
        self.started_at = 0.0
        #: Set by ``ctx.retry()``: the requested delay (``-1.0``: the policy's backoff).
        self.retry_delay_s: float | None = None
        self._metadata: TaskMetadata | None = None
        self._logger: structlog.typing.FilteringBoundLogger | None = None
        #: The deferred completion ``ctx.deferred()`` made, ``None`` before.
        self.completion: Completion | None = None
        #: The records ``ctx.produce()`` collected (OutputRecord), ``None`` while there are none.
        self.outputs: list[Any] | None = None
        #: The key's state once ``ctx.state`` was read (changed or not), ``None`` before.
        self.key_state: KeyState | None = None
