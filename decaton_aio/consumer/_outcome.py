"""What a finished task's outcome means: one decision, for both ways a task ends.

A task ends when its processor returns or raises (its key lane still held), or later,
when a deferred completion fails or asks for a retry (its lane already released). Both
ask `decide()`, a pure function of the outcome and the retry configuration, and the
executor (``consumer/_execution.py``) carries the answer out:

- `Action.FINISH`: done; the offset completes (after a skip, a cancellation, or a
  failure logged with retries off, too);
- `Action.DEFER`: the processor returned with a deferred completion not done yet;
- `Action.RETRY_QUEUE`: the task goes to the retry topic (retry count + 1);
- `Action.RETRY_IN_PLACE`: the task runs again in its lane (only while it holds it);
- `Action.DEAD_LETTER`: the dead letter topic, with an error type and message.

Attempts count as `decaton_aio.backoff` says: in queue mode the attempt that failed
is the record's retry count + 1, in place it is the run's number.

Caller: the executor, off the common path (a task that returned with nothing to do
finishes without asking).
"""

from __future__ import annotations

import asyncio
import enum
import random
from dataclasses import dataclass

from decaton_aio.backoff import RetryConfig, RetryTask, SkipTask

__all__ = ["Action", "Outcome", "decide"]


class Action(enum.Enum):
    """What the executor does with a task that ended."""

    FINISH = "finish"
    DEFER = "defer"
    RETRY_QUEUE = "retry_queue"
    RETRY_IN_PLACE = "retry_in_place"
    DEAD_LETTER = "dead_letter"


@dataclass(frozen=True, slots=True)
class Outcome:
    """The decision about one task.

    Attributes:
        action: what to do.
        failed: the processor (or its deferred completion) failed: count and log the
            error, whatever the action.
        why: for `Action.FINISH`, ``"done"``, ``"skipped"``, ``"cancelled"`` or
            ``"failed"`` (logged and gone on: retries are off).
        attempt: for a retry, the number of the attempt that failed (the next run in place
            is ``attempt + 1``).
        delay_s: for a retry, how long it waits.
        error_type, message: for `Action.DEAD_LETTER`, what its headers say.
    """

    action: Action
    failed: bool = False
    why: str = "done"
    attempt: int = 0
    delay_s: float = 0.0
    error_type: str = ""
    message: str = ""


_DONE = Outcome(Action.FINISH)
_DEFER = Outcome(Action.DEFER)


def decide(
    exc: BaseException | None,
    *,
    retry_delay_s: float | None,
    pending: bool,
    retry: RetryConfig | None,
    retry_count: int,
    attempt: int,
    lane_held: bool,
    rng: random.Random | None = None,
) -> Outcome:
    """Decide what a task that ended becomes.

    Args:
        exc: what the processor raised, or its deferred completion failed with (``None``:
            it returned, or completed).
        retry_delay_s: a retry the task asked for with ``ctx.retry()`` or its completion
            (``None``: none asked; negative: the policy's backoff).
        pending: a deferred completion that is not done yet.
        retry: the application's retry configuration, ``None`` when it has none.
        retry_count: the retry count in the record's ``dt_meta`` (queue mode).
        attempt: the run's number (in place).
        lane_held: the task still holds its key lane (``False`` once released for a
            deferred completion: it can no longer run again in place).
        rng: the backoff's jitter source (tests pass a seeded one).
    """
    if exc is None and retry_delay_s is None:
        return _DEFER if pending else _DONE
    if isinstance(exc, SkipTask):
        return Outcome(Action.FINISH, why="skipped")
    if isinstance(exc, asyncio.CancelledError):
        return Outcome(Action.FINISH, why="cancelled")
    delay: float | None = None  # a failure waits the policy's backoff
    if isinstance(exc, RetryTask):
        delay = exc.delay_s
    elif exc is None:
        delay = retry_delay_s
    failed = exc is not None and not isinstance(exc, RetryTask)
    error_type = type(exc).__name__ if exc is not None else "RetryRequested"
    message = str(exc) if exc is not None else ""
    if retry is None:
        if not failed:
            return Outcome(
                Action.DEAD_LETTER,
                error_type="RetryNotConfigured",
                message="a retry was asked for but the application has no retry config",
            )
        return Outcome(Action.FINISH, failed=True, why="failed")  # log and go on
    if failed and exc is not None and not retry.policy.is_retriable(exc):
        return Outcome(Action.DEAD_LETTER, failed=True, error_type=error_type, message=message)
    in_place = retry.mode == "in_place"
    if in_place and not lane_held:
        return Outcome(
            Action.DEAD_LETTER,
            failed=failed,
            error_type=error_type,
            message=message or "a deferred task's retry needs queue mode",
        )
    done = attempt if in_place else retry_count + 1  # the attempt that failed
    if retry.policy.exhausted(done):
        return Outcome(
            Action.DEAD_LETTER,
            failed=failed,
            error_type=error_type,
            message=message or "retries exhausted",
        )
    if delay is None or delay < 0:
        delay = retry.policy.delay_s(done, rng)
    action = Action.RETRY_IN_PLACE if in_place else Action.RETRY_QUEUE
    return Outcome(action, failed=failed, attempt=done, delay_s=delay)
