"""Per-partition processing rate limit: a token bucket that delays tasks, never drops them.

This module owns the rate limit's arithmetic: how many tasks one partition may start per
second (``decaton.processing.rate.per.partition``), and how long the next one has to wait.
It is synchronous and pure apart from reading a clock; the runtime does the waiting:

```python
while (wait := bucket.try_acquire()) > 0:
    if wait == math.inf:           # rate 0: paused; the consumer pauses the partition
        await rate_changed.wait()  # woken by the property listener calling set_rate
    else:
        await asyncio.sleep(wait)
```

Rates: ``-1`` is unlimited (`TokenBucket.try_acquire()` returns at once), ``0`` pauses
(no token is granted until the rate changes; the balance is kept for the resume), ``n > 0``
grants ``n`` tokens per second with bursts of up to ``burst`` tokens after an idle period.
A new bucket starts full.

Why the bucket does not drift: instead of adding ``elapsed * rate`` to a float on every
call (where rounding errors pile up over billions of calls), it keeps a reference point
``(t0, tokens at t0)`` and an integer count of tokens spent since then, and computes the
balance as ``tokens0 + (now - t0) * rate - spent``: one rounding per call, none
accumulated. The reference point moves only when the bucket overflows (idle) or the rate
changes.

Throttled time (a metric) is accounted here: an interval starts at the first refused
`TokenBucket.try_acquire()` and ends at the next granted one, so time counts once
however many coroutines are waiting, and a pause (rate 0) counts as throttled too.

Caller: the event loop that owns the partition; not thread-safe.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Protocol

from decaton_aio.errors import ConfigError

__all__ = ["UNLIMITED", "RateLimiter", "TokenBucket"]

UNLIMITED = -1
"""The rate that disables limiting."""

_EARLY_S = 1e-6
"""How early a grant may come: a caller that slept exactly the returned wait is let
through even when float rounding of clock readings (about 2 ns at a reading of 1e7 s)
leaves the balance a hair short. Granting early does not raise the rate: the spent count is
exact, so the next grant is due at the same time as without the slack."""


class RateLimiter(Protocol):
    """What the runtime needs from a rate limiter (one instance per partition)."""

    def try_acquire(self, n: int = 1, now: float | None = None) -> float:
        """Take ``n`` tokens if available; return 0.0, else the seconds to wait first."""
        ...

    def set_rate(
        self, rate_per_s: int, *, burst: int | None = None, now: float | None = None
    ) -> None:
        """Change the rate while running."""
        ...

    @property
    def throttled_s(self) -> float:
        """Total seconds acquirers were held back so far."""
        ...


class TokenBucket:
    """A token bucket of one partition: ``rate_per_s`` tokens per second, up to ``burst``.

    Args:
        rate_per_s: tokens per second; ``-1`` unlimited, ``0`` paused.
        burst: bucket capacity, the most tokens granted at once after an idle period.
            ``None`` means one second's worth (``max(rate_per_s, 1)``) and then follows the
            rate when `set_rate()` changes it.
        clock: monotonic seconds; injectable for tests.

    Raises:
        ConfigError: ``rate_per_s`` is below -1 or ``burst`` below 1.
    """

    __slots__ = (
        "_burst",
        "_burst_fixed",
        "_clock",
        "_rate",
        "_spent",
        "_t0",
        "_throttled_s",
        "_throttled_since",
        "_tokens0",
    )

    def __init__(
        self,
        rate_per_s: int,
        *,
        burst: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        _check_rate(rate_per_s)
        if burst is not None:
            _check_burst(burst)
        self._clock = clock
        self._rate = rate_per_s
        self._burst_fixed = burst is not None
        self._burst = burst if burst is not None else max(rate_per_s, 1)
        # Balance = _tokens0 + (now - _t0) * _rate - _spent, capped at _burst.
        self._t0 = clock()
        self._tokens0: float = float(self._burst)
        self._spent = 0
        self._throttled_s = 0.0
        self._throttled_since: float | None = None

    # ----------------------------------------------------------------- properties

    @property
    def rate_per_s(self) -> int:
        """Tokens per second; -1 unlimited, 0 paused."""
        return self._rate

    @property
    def burst(self) -> int:
        """Bucket capacity in tokens."""
        return self._burst

    @property
    def paused(self) -> bool:
        """Whether the rate is 0: no token is granted until `set_rate()` changes it."""
        return self._rate == 0

    @property
    def throttled_s(self) -> float:
        """Total seconds during which an acquirer was refused and not yet granted.

        Includes the interval still open now, if any, so a scrape during a long pause sees
        it growing.
        """
        if self._throttled_since is None:
            return self._throttled_s
        return self._throttled_s + max(0.0, self._clock() - self._throttled_since)

    def available(self, now: float | None = None) -> float:
        """Return the tokens in the bucket at ``now`` (negative after an oversized grant).

        Args:
            now: the clock reading to evaluate at; ``None`` reads the clock.

        Returns:
            The balance; ``math.inf`` when unlimited.
        """
        if self._rate < 0:
            return math.inf
        if now is None:
            now = self._clock()
        return min(float(self._burst), self._tokens0 + (now - self._t0) * self._rate - self._spent)

    # ------------------------------------------------------------------ acquiring

    def try_acquire(self, n: int = 1, now: float | None = None) -> float:
        """Take ``n`` tokens if the bucket has them.

        Never drops: a refusal says how long to wait, and the caller asks again after it.
        A request larger than ``burst`` is granted when the bucket is full and leaves it
        in debt, which later requests wait out, so the long-run rate still holds.

        Args:
            n: tokens wanted (tasks to start), >= 1. Not validated here: the hot path.
            now: the clock reading to use, from the bucket's clock; ``None`` reads it.

        Returns:
            0.0 when granted (the tokens are taken); otherwise the seconds until the
            tokens will be there (nothing is taken), or ``math.inf`` while paused.
        """
        rate = self._rate
        if rate < 0:
            # Unlimited. set_rate() closed any open throttle interval, so nothing to do.
            return 0.0
        if now is None:
            now = self._clock()
        if rate == 0:
            # Paused: nothing is granted, not even the balance, which waits for a resume.
            if self._throttled_since is None:
                self._throttled_since = now
            return math.inf
        tokens = self._tokens0 + (now - self._t0) * rate - self._spent
        burst = self._burst
        if tokens > burst:
            # Idle long enough to overflow: move the reference point (tokens are capped).
            self._t0 = now
            self._tokens0 = tokens = float(burst)
            self._spent = 0
        need = n if n <= burst else burst
        if tokens + rate * _EARLY_S >= need:
            self._spent += n
            if self._throttled_since is not None:
                self._throttled_s += max(0.0, now - self._throttled_since)
                self._throttled_since = None
            return 0.0
        if self._throttled_since is None:
            self._throttled_since = now
        return (need - tokens) / rate

    # ------------------------------------------------------------------- changing

    def set_rate(
        self, rate_per_s: int, *, burst: int | None = None, now: float | None = None
    ) -> None:
        """Change the rate (and optionally the burst) while running.

        The balance carries over, capped at the new burst: a rate change neither grants a
        fresh burst nor forgets debt. Leaving "unlimited" starts with a full bucket (there
        was no balance to keep); a paused bucket keeps, without granting it, the balance it
        had when paused, and resuming continues from it.
        Changing to unlimited ends an open throttle interval now.

        Args:
            rate_per_s: tokens per second; -1 unlimited, 0 paused.
            burst: new capacity; ``None`` keeps an explicit burst given earlier, or follows
                the new rate (``max(rate_per_s, 1)``) when none was given.
            now: the clock reading of the change; ``None`` reads the clock.

        Raises:
            ConfigError: ``rate_per_s`` is below -1 or ``burst`` below 1; the bucket is
                unchanged.
        """
        _check_rate(rate_per_s)
        if burst is not None:
            _check_burst(burst)
        if now is None:
            now = self._clock()
        old_rate = self._rate
        if burst is not None:
            self._burst_fixed = True
            new_burst = burst
        elif self._burst_fixed:
            new_burst = self._burst
        else:
            new_burst = max(rate_per_s, 1)
        if old_rate < 0:
            balance = float(new_burst)
        else:
            balance = min(
                float(self._burst), self._tokens0 + (now - self._t0) * old_rate - self._spent
            )
        self._rate = rate_per_s
        self._burst = new_burst
        self._t0 = now
        self._tokens0 = min(balance, float(new_burst))
        self._spent = 0
        if rate_per_s < 0 and self._throttled_since is not None:
            self._throttled_s += max(0.0, now - self._throttled_since)
            self._throttled_since = None

    def __repr__(self) -> str:
        return f"TokenBucket(rate_per_s={self._rate}, burst={self._burst})"


def _check_rate(rate_per_s: int) -> None:
    if isinstance(rate_per_s, bool) or not isinstance(rate_per_s, int) or rate_per_s < -1:
        raise ConfigError(
            f"rate_per_s must be an int >= -1 (-1 unlimited, 0 pause, n tasks per second), "
            f"got {rate_per_s!r}"
        )


def _check_burst(burst: int) -> None:
    if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
        raise ConfigError(
            f"burst must be an int >= 1 (tokens granted at once after idling), got {burst!r}; "
            f"omit it for one second's worth of the rate"
        )
