"""Deferred completion: a task that finishes after its processor returned.

``ctx.deferred()`` hands the processor a [`Completion`][decaton_aio.Completion]. The
processor returns at once (its concurrency slot and key lane are freed, as in Decaton), and
the task's offset completes only when ``completion.complete()`` is called: from any
coroutine, from a callback of another library, or from another thread. Until then the
watermark stays below the offset, so a crash redelivers the task.

A completion that is never completed must not stall its partition forever: the runtime
applies ``decaton.deferred.complete.timeout.ms`` with the application's timeout policy.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Literal

from decaton_aio.backoff import checked_retry_delay

__all__ = ["Completion", "DeferredTimeoutPolicy"]

#: What happens to a deferred task whose completion stays open past
#: ``decaton.deferred.complete.timeout.ms``: ``"give_up"`` (complete it: the offset moves
#: on), ``"extend"`` (wait another timeout) or ``"retry"`` (a retry, as if it failed).
DeferredTimeoutPolicy = Literal["give_up", "extend", "retry"]


class Completion:
    """Completes one deferred task. Calling [`complete()`][decaton_aio.Completion.complete]
    more than once is harmless.

    Args:
        on_complete: called once, on the event loop, when the task completes.
        loop: the loop that owns the task's partition.
    """

    __slots__ = (
        "_done",
        "_loop",
        "_on_complete",
        "_on_retry",
        "_thread",
        "failure",
        "retry_delay_s",
    )

    def __init__(self, on_complete: Callable[[], None], loop: asyncio.AbstractEventLoop) -> None:
        self._on_complete: Callable[[], None] | None = on_complete
        self._on_retry: Callable[[float | None, BaseException | None], None] | None = None
        self._loop = loop
        self._thread = threading.get_ident()
        self._done = False
        #: Set when `retry()` is called before the processor returned.
        self.retry_delay_s: float | None = None
        #: Set when `fail()` is called before the processor returned.
        self.failure: BaseException | None = None

    @property
    def done(self) -> bool:
        """Whether the task was completed (by the processor or by the timeout policy)."""
        return self._done

    def complete(self) -> None:
        """Mark the task complete; its offset may now be committed.

        Thread-safe: from another thread the completion is handed to the event loop.
        """
        if threading.get_ident() != self._thread:
            self._loop.call_soon_threadsafe(self.complete)
            return
        if self._done:
            return
        self._done = True
        callback, self._on_complete = self._on_complete, None
        if callback is not None:
            callback()

    def retry(self, delay_s: float | None = None) -> None:
        """Complete the task by sending it to its retry topic (queue retries), or to the
        dead letter topic once its attempts are used up. Thread-safe.

        Args:
            delay_s: wait this long before the retry (at most a year); the policy's
                backoff when omitted.

        Raises:
            ConfigError: ``delay_s`` is not finite or over a year.
        """
        self._resolve_elsewhere(checked_retry_delay(delay_s, "Completion.retry"), None)

    def fail(self, exc: BaseException) -> None:
        """Complete the task as failed with ``exc``: like an exception the processor raised,
        it is logged and counted, then retried, dead-lettered or completed as the
        application's retry policy says. Thread-safe.
        """
        self._resolve_elsewhere(None, exc)

    def _resolve_elsewhere(self, delay_s: float | None, exc: BaseException | None) -> None:
        if threading.get_ident() != self._thread:
            self._loop.call_soon_threadsafe(self._resolve_elsewhere, delay_s, exc)
            return
        if self._done:
            return
        self._done = True
        on_retry, self._on_retry, self._on_complete = self._on_retry, None, None
        if on_retry is not None:
            on_retry(delay_s, exc)
        elif exc is not None:  # the processor has not returned yet: the runtime reads these
            self.failure = exc
        else:
            self.retry_delay_s = -1.0 if delay_s is None else delay_s

    def attach(
        self,
        on_complete: Callable[[], None],
        on_retry: Callable[[float | None, BaseException | None], None] | None = None,
    ) -> None:
        """Replace the callbacks: what completing, and asking for a retry or failing, do.

        Caller: the runtime, once the processor returned (a processor never calls this).
        """
        self._on_complete = on_complete
        self._on_retry = on_retry

    def __repr__(self) -> str:
        return f"Completion(done={self._done})"
