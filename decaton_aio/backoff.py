"""Retry policy: which failures are retried, how often, and how long to wait in between.

This module owns the pure part of retrying: the backoff formula, the
[`RetryPolicy`][decaton_aio.RetryPolicy] value object and the
[`RetryConfig`][decaton_aio.RetryConfig] that carries it with the retry mode, and the two
control-flow signals a processor raises to steer its task
([`RetryTask`][decaton_aio.RetryTask], [`SkipTask`][decaton_aio.SkipTask]). It performs no
I/O and knows nothing about Kafka or asyncio; the runtime (``consumer/_outcome.py`` decides,
the executor acts) asks it questions and acts on the answers.

Counting attempts. Attempts are numbered from 1: attempt 1 is the first delivery of a task,
attempt ``n`` is its ``(n - 1)``-th retry. A task read from the retry topic with retry count
``c`` in its ``dt_meta`` header is running attempt ``c + 1``. Every method that takes an
``attempt`` wants the number of the attempt that just *failed*; the same number is the
number of the retry about to be scheduled, so the runtime's flow is:

```python
attempt = metadata.retry_count + 1       # the attempt that just failed
if not policy.is_retriable(exc) or policy.exhausted(attempt):
    ...                                  # the dead letter topic
delay = policy.delay_s(attempt)          # or the RetryTask's own delay
...                                      # retry count + 1, after `delay`
```

Backoff formula (`compute_backoff()`), for the ``n``-th retry:

```text
capped = min(max_s, base_s * factor ** (n - 1))
delay  = capped * (1 - jitter * u)         u uniform in [0, 1)
```

``jitter`` is the fraction of the delay that is randomised: 0 gives the exact exponential
sequence, 0.5 "equal jitter" (between half and all of ``capped``), 1 "full jitter"
(between 0 and ``capped``). Jitter only ever shortens a delay, so the cap is a hard bound
and a retry storm of many tasks failing together spreads out instead of retrying in
lockstep.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Final, Literal

from decaton_aio.errors import ConfigError

__all__ = [
    "DEFAULT_BACKOFF_BASE_MS",
    "DEFAULT_BACKOFF_FACTOR",
    "DEFAULT_BACKOFF_MAX_MS",
    "DEFAULT_JITTER",
    "DEFAULT_MAX_ATTEMPTS",
    "RetryConfig",
    "RetryPolicy",
    "RetryTask",
    "SkipTask",
    "TaskControl",
    "compute_backoff",
    "send_retry_delay",
]

DEFAULT_MAX_ATTEMPTS: Final = 3
"""Total attempts of one task, the first delivery included (so two retries)."""
DEFAULT_BACKOFF_BASE_MS: Final = 1000
"""Delay before the first retry, before jitter."""
DEFAULT_BACKOFF_FACTOR: Final = 2.0
"""Each further retry waits this many times longer than the previous one, up to the cap."""
DEFAULT_BACKOFF_MAX_MS: Final = 60_000
"""No retry waits longer than this."""
DEFAULT_JITTER: Final = 0.5
"""Equal jitter: each delay lies between half and all of its exponential value."""


# ------------------------------------------------------------------ control flow


class TaskControl(Exception):
    """Base of the signals a processor raises to steer its task; never logged as a failure.

    These derive from `Exception`, not `BaseException`, on purpose: asyncio
    (``Task``, ``TaskGroup``, ``gather``) gives non-``Exception`` exceptions special
    treatment meant for cancellation and interpreter exit, and a signal must travel like
    an ordinary exception out of the processor coroutine. The runtime catches
    ``TaskControl`` before its generic failure handling. A processor that wraps its body
    in a broad ``except Exception`` must re-raise it.
    """


MAX_RETRY_DELAY_S: Final = 365 * 86_400.0
"""The longest wait a retry may ask for (a year): a longer one is a schedule, and an
unbounded one cannot be written in the task's ``dt_meta``."""


def checked_retry_delay(delay_s: float | None, where: str) -> float | None:
    """``delay_s`` as asked of ``where`` (``ctx.retry``...), negative taken as no wait.

    Raises:
        ConfigError: ``delay_s`` is not finite, or longer than `MAX_RETRY_DELAY_S`
            (the caller's task fails with it, as with any exception).
    """
    if delay_s is None:
        return None
    if not (math.isfinite(delay_s) and delay_s <= MAX_RETRY_DELAY_S):
        raise ConfigError(
            f"{where}: delay_s must be a finite number of seconds up to "
            f"{MAX_RETRY_DELAY_S:.0f} (a year), got {delay_s!r}"
        )
    return max(0.0, delay_s)


class RetryTask(TaskControl):
    """Raised by a processor to ask for its task to be retried; not a failure.

    The retry counts as an attempt: when the policy's attempts are used up the task goes to
    the dead letter topic like a failed one. The exception types a policy retries do not
    matter here: asking explicitly always qualifies.

    Args:
        reason: a short human-readable reason, logged and carried to the dead letter topic.
        delay_s: wait this long before the retry instead of the policy's backoff; ``None``
            uses the backoff. Not capped by the policy.

    Raises:
        ConfigError: ``delay_s`` is negative, not finite or over a year.
    """

    def __init__(self, reason: str = "", *, delay_s: float | None = None) -> None:
        if delay_s is not None and delay_s < 0:
            raise ConfigError(
                f"RetryTask delay_s must be >= 0 (or None for the policy's backoff), "
                f"got {delay_s!r}"
            )
        super().__init__(reason)
        self.reason = reason
        self.delay_s = checked_retry_delay(delay_s, "RetryTask")


class SkipTask(TaskControl):
    """Raised by a processor to drop its task on purpose: completed, not retried, not failed.

    The runtime completes the offset and counts the task as discarded.

    Args:
        reason: a short human-readable reason, logged with the task's coordinates.
    """

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason)
        self.reason = reason


# ---------------------------------------------------------------------- backoff


def compute_backoff(
    attempt: int,
    *,
    base_s: float,
    factor: float,
    max_s: float,
    jitter: float,
    rng: random.Random | None = None,
) -> float:
    """Return how long to wait before the ``attempt``-th retry.

    ``min(max_s, base_s * factor ** (attempt - 1)) * (1 - jitter * u)`` with ``u`` drawn
    uniformly from ``[0, 1)`` (see the module docstring).

    Args:
        attempt: which retry this is, from 1 (the number of the attempt that just failed).
        base_s: delay of the first retry before jitter, in seconds; >= 0.
        factor: growth per retry; >= 1 so delays never shrink.
        max_s: the cap, in seconds; >= ``base_s``.
        jitter: the randomised fraction of the delay, in ``[0, 1]``.
        rng: source of ``u``; ``None`` uses the `random` module's shared generator.
            Pass a seeded ``random.Random`` for reproducible delays.

    Returns:
        The delay in seconds, in ``[(1 - jitter) * capped, capped]`` and never above
        ``max_s``.

    Raises:
        ConfigError: an argument is out of range.
    """
    _check_backoff(base_s=base_s, factor=factor, max_s=max_s, jitter=jitter)
    _check_attempt(attempt)
    return _backoff(attempt, base_s, factor, max_s, jitter, rng)


def send_retry_delay(attempt: int) -> float:
    """How long the runtime waits before sending a record again (a retry, dead letter,
    output or state change whose send failed; the task stays pending meanwhile): 0.2 s
    doubling up to 10 s, half of it jittered."""
    return compute_backoff(attempt, base_s=0.2, factor=2.0, max_s=10.0, jitter=0.5)


def _backoff(
    attempt: int,
    base_s: float,
    factor: float,
    max_s: float,
    jitter: float,
    rng: random.Random | None,
) -> float:
    # Arguments are validated by the caller; this is the formula alone.
    try:
        capped = min(max_s, base_s * factor ** (attempt - 1))
    except OverflowError:
        # factor ** n overflows a float for large n (2.0 ** 1024): long since capped.
        capped = max_s
    if jitter == 0.0:
        return capped
    u = rng.random() if rng is not None else random.random()
    return capped * (1.0 - jitter * u)


def _check_attempt(attempt: int) -> None:
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
        raise ConfigError(
            f"attempt must be an int >= 1 (the number of the attempt that just failed; "
            f"the first delivery is attempt 1), got {attempt!r}"
        )


def _check_backoff(*, base_s: float, factor: float, max_s: float, jitter: float) -> None:
    if not (math.isfinite(base_s) and base_s >= 0):
        raise ConfigError(f"backoff base must be a finite number >= 0, got {base_s!r}")
    if not (math.isfinite(factor) and factor >= 1):
        raise ConfigError(
            f"backoff factor must be a finite number >= 1 (1 keeps the delay constant), "
            f"got {factor!r}"
        )
    if not (math.isfinite(max_s) and max_s >= base_s):
        raise ConfigError(
            f"backoff max must be a finite number >= the backoff base ({base_s!r}), "
            f"got {max_s!r}: raise the max or lower the base"
        )
    if not (0.0 <= jitter <= 1.0):
        raise ConfigError(
            f"jitter must be in [0, 1] (0 none, 0.5 equal jitter, 1 full jitter), got {jitter!r}"
        )


# ----------------------------------------------------------------------- policy


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How a failed task is retried: which exceptions, how many attempts, which backoff.

    A frozen value object; build a new one (``dataclasses.replace``) to change it.

    Attributes:
        max_attempts: total attempts of one task, the first delivery included: 1 never
            retries, 3 allows two retries. See [`max_retries`][decaton_aio.RetryPolicy.max_retries].
        backoff_base_ms: delay before the first retry, before jitter.
        backoff_factor: growth of the delay per retry (>= 1).
        backoff_max_ms: cap on any delay.
        jitter: randomised fraction of each delay, in ``[0, 1]``; see `compute_backoff()`.
        retry_on: exception types that are retried.
        no_retry_on: exception types never retried; wins over ``retry_on``.

    Raises:
        ConfigError: a value is out of range or of the wrong type; the message says which
            and what is accepted.
    """

    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    backoff_base_ms: int = DEFAULT_BACKOFF_BASE_MS
    backoff_factor: float = DEFAULT_BACKOFF_FACTOR
    backoff_max_ms: int = DEFAULT_BACKOFF_MAX_MS
    jitter: float = DEFAULT_JITTER
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    no_retry_on: tuple[type[BaseException], ...] = ()

    def __post_init__(self) -> None:
        if not _is_int(self.max_attempts) or self.max_attempts < 1:
            raise ConfigError(
                f"max_attempts counts every attempt including the first delivery and must "
                f"be an int >= 1 (1 disables retries), got {self.max_attempts!r}"
            )
        for name in ("backoff_base_ms", "backoff_max_ms"):
            value = getattr(self, name)
            if not _is_int(value) or value < 0:
                raise ConfigError(f"{name} must be an int >= 0 (milliseconds), got {value!r}")
        if isinstance(self.backoff_factor, bool) or not isinstance(
            self.backoff_factor, int | float
        ):
            raise ConfigError(f"backoff_factor must be a number, got {self.backoff_factor!r}")
        if isinstance(self.jitter, bool) or not isinstance(self.jitter, int | float):
            raise ConfigError(f"jitter must be a number in [0, 1], got {self.jitter!r}")
        _check_backoff(
            base_s=self.backoff_base_ms / 1000,
            factor=self.backoff_factor,
            max_s=self.backoff_max_ms / 1000,
            jitter=self.jitter,
        )
        for name in ("retry_on", "no_retry_on"):
            value = getattr(self, name)
            if not isinstance(value, tuple) or not all(
                isinstance(t, type) and issubclass(t, BaseException) for t in value
            ):
                raise ConfigError(
                    f"{name} must be a tuple of exception classes, e.g. (TimeoutError,), "
                    f"got {value!r}"
                )

    @property
    def max_retries(self) -> int:
        """Retries after the first delivery: ``max_attempts - 1``."""
        return self.max_attempts - 1

    def is_retriable(self, exc: BaseException) -> bool:
        """Whether a failure with ``exc`` may be retried (attempts aside).

        In order: a [`RetryTask`][decaton_aio.RetryTask] is always retriable and a
        [`SkipTask`][decaton_aio.SkipTask] never; exceptions that are not `Exception`
        (cancellation, interpreter exit) never are, they must propagate; an instance of
        ``no_retry_on`` is not; an exception whose ``retriable`` attribute (class or
        instance, as in [`decaton_aio.errors`][decaton_aio.errors]) is ``False`` is not;
        otherwise it is retriable when it is an instance of ``retry_on``.

        Args:
            exc: what the processor raised.

        Returns:
            ``True`` when the policy allows retrying it.
        """
        if isinstance(exc, TaskControl):
            return isinstance(exc, RetryTask)
        if not isinstance(exc, Exception):
            return False
        if isinstance(exc, self.no_retry_on):
            return False
        if getattr(exc, "retriable", True) is False:
            return False
        return isinstance(exc, self.retry_on)

    def exhausted(self, attempt: int) -> bool:
        """Whether no attempt is left after attempt number ``attempt`` failed.

        Args:
            attempt: the number of the attempt that just failed, from 1 (retry count + 1).

        Returns:
            ``True`` when ``attempt >= max_attempts``: the task goes to the dead letter topic.

        Raises:
            ConfigError: ``attempt`` is not an int >= 1.
        """
        _check_attempt(attempt)
        return attempt >= self.max_attempts

    def delay_s(self, attempt: int, rng: random.Random | None = None) -> float:
        """Return the backoff before the retry that follows failed attempt ``attempt``.

        Args:
            attempt: the number of the attempt that just failed, from 1 (so 1 gives the
                delay of the first retry).
            rng: source of jitter; ``None`` uses the `random` module's generator.

        Returns:
            The delay in seconds, within ``[0, backoff_max_ms / 1000]``.

        Raises:
            ConfigError: ``attempt`` is not an int >= 1.
        """
        _check_attempt(attempt)
        return _backoff(
            attempt,
            self.backoff_base_ms / 1000,
            self.backoff_factor,
            self.backoff_max_ms / 1000,
            self.jitter,
            rng,
        )


def _is_int(value: object) -> bool:
    # bool is an int subclass; True as an attempt count is a bug, not a 1.
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class RetryConfig:
    """How failed tasks are retried.

    Attributes:
        policy: attempts, backoff and which exceptions are retried.
        mode: ``"queue"`` sends a failed task to ``<topic>-retry`` (the same subscription
            consumes it after the backoff; later tasks of the key do not wait for it);
            ``"in_place"`` retries it inside its key lane after the backoff, so the key's
            order holds and only that key waits.
    """

    policy: RetryPolicy = field(default_factory=RetryPolicy)
    mode: Literal["queue", "in_place"] = "queue"

    def __post_init__(self) -> None:
        if self.mode not in ("queue", "in_place"):
            raise ConfigError(f"retry mode must be 'queue' or 'in_place', got {self.mode!r}")
