"""Hot-key detection: which keys use more than their per-key quota.

This module owns the question "is this key flooding?" for one partition, answered in
constant memory whatever the number of distinct keys: a count-min sketch estimates each
key's count, never under it, and a `HotKeyDetector` compares the estimate over a
sliding window with ``decaton.per.key.quota.processing.rate``. The runtime moves the tasks
of keys reported hot to ``<topic>-shaping``; that part, and the order it relaxes for shaped
keys, is the runtime's business.

Sketch. ``depth`` rows of ``width`` counters (a power of two) in one ``int64`` buffer,
viewed by numpy. A key is hashed once to 64 bits (Python's ``hash``: SipHash, randomised
per process but stable within it, which is all a per-process sketch needs), mixed with the
seed by multiply-shift, and split into two halves ``h1``, ``h2``; row ``r`` uses counter
``(h1 + r * h2) mod width`` (Kirsch-Mitzenmacher double hashing: ``depth`` indices for the
price of one hash). Updates are *conservative*: only the counters at the current minimum
are raised, which keeps the never-undercount guarantee and overestimates less than
raising all ``depth`` counters. With ``N`` counts in the sketch, an estimate exceeds the
true count by more than ``e * N / width`` with probability at most ``exp(-depth)``.

Why a memoryview: numpy indexing with a Python int costs ~100 ns per element, a
``memoryview`` over the same buffer ~30 ns; the hot path touches ``2 * depth`` counters per
key, while resets and other whole-table work stay vectorised in numpy.

Window model: two tumbling sketches make a sliding window. The *current* sketch counts the
window in progress; the *previous* one holds the last complete window. A key's count over
the last ``window_s`` seconds is estimated as ``current + previous * (1 - elapsed /
window_s)``, the previous window weighted by how much of it still overlaps (assuming its
tasks were spread evenly). Compared with a single tumbling window, a flooding key stays
detected across window boundaries instead of getting a fresh quota each window.

Caller: the event loop that owns the partition; not thread-safe.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Final

import numpy as np
import numpy.typing as npt

from decaton_aio.errors import ConfigError

__all__ = [
    "DEFAULT_SKETCH_DEPTH",
    "DEFAULT_SKETCH_WIDTH",
    "CountMinSketch",
    "HotKeyDetector",
]

DEFAULT_SKETCH_WIDTH: Final = 2048
"""Counters per row: an error of at most ``e * N / 2048`` (~0.13 % of the window's tasks)."""
DEFAULT_SKETCH_DEPTH: Final = 4
"""Rows: that error bound fails with probability at most ``exp(-4)`` (~1.8 %) per key."""

_MAX_WIDTH: Final = 1 << 24  # double hashing uses 32-bit halves; far beyond any sane sketch
_MAX_DEPTH: Final = 32
_MASK64: Final = (1 << 64) - 1
_MASK32: Final = (1 << 32) - 1
_GOLDEN64: Final = 0x9E3779B97F4A7C15  # odd; spreads the seed over all 64 bits
_BIG: Final = 1 << 62  # larger than any counter


class CountMinSketch:
    """Approximate per-key counts in fixed memory; estimates never undercount.

    Args:
        width: counters per row, rounded up to a power of two; more width, less error.
        depth: rows; more depth, less chance of a large error.
        seed: selects the hash functions, so sketches with different seeds collide on
            different keys.
        hash_fn: 64-bit hash of a key; defaults to the built-in ``hash``. Pass a
            deterministic one (e.g. from ``hashlib.blake2b``) for reproducible results
            across processes.

    Raises:
        ConfigError: ``width`` or ``depth`` is out of range.
    """

    __slots__ = ("_cells", "_depth", "_hash", "_mask", "_mul", "_offsets", "_table", "_total")

    def __init__(
        self,
        width: int = DEFAULT_SKETCH_WIDTH,
        depth: int = DEFAULT_SKETCH_DEPTH,
        seed: int = 0,
        *,
        hash_fn: Callable[[bytes], int] = hash,
    ) -> None:
        if isinstance(width, bool) or not isinstance(width, int) or not 1 <= width <= _MAX_WIDTH:
            raise ConfigError(
                f"sketch width must be an int in [1, {_MAX_WIDTH}] (e.g. 2048), got {width!r}"
            )
        if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= _MAX_DEPTH:
            raise ConfigError(
                f"sketch depth must be an int in [1, {_MAX_DEPTH}] (e.g. 4), got {depth!r}"
            )
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ConfigError(f"sketch seed must be an int, got {seed!r}")
        width = 1 << (width - 1).bit_length()
        self._depth = depth
        self._mask = width - 1
        self._offsets = tuple(row * width for row in range(depth))
        # Multiply-shift mixing: an odd multiplier derived from the seed. The high half of
        # the product depends on every bit of the hash, so h1 differs per seed.
        self._mul = ((seed * _GOLDEN64 + _GOLDEN64) & _MASK64) | 1
        self._hash = hash_fn
        # One buffer, two views: numpy for whole-table work, a memoryview for the hot path.
        buffer = bytearray(8 * depth * width)
        self._table = np.frombuffer(buffer, dtype=np.int64)
        self._cells = memoryview(buffer).cast("q")
        self._total = 0

    @property
    def width(self) -> int:
        """Counters per row (a power of two)."""
        return self._mask + 1

    @property
    def depth(self) -> int:
        """Rows."""
        return self._depth

    @property
    def total(self) -> int:
        """Sum of all counts added since the last reset (``N`` in the error bound)."""
        return self._total

    @property
    def table(self) -> npt.NDArray[np.int64]:
        """A read-only ``(depth, width)`` view of the counters, for inspection."""
        view = self._table.reshape(self._depth, self._mask + 1).view()
        view.flags.writeable = False
        return view

    def add(self, key: bytes, count: int = 1) -> int:
        """Count ``count`` more occurrences of ``key``.

        Args:
            key: the key (record key bytes).
            count: occurrences to add, >= 0 (a negative count would break the
                never-undercount guarantee; not validated here: the hot path).

        Returns:
            The estimated count of ``key`` after adding, >= its true count.
        """
        x = (self._hash(key) * self._mul) & _MASK64
        h1 = x >> 32
        h2 = (x & _MASK32) | 1
        mask = self._mask
        cells = self._cells
        # Pass 1: find the current estimate (the minimum over the key's counters).
        indices = []
        low = _BIG
        for offset in self._offsets:
            i = offset + (h1 & mask)
            indices.append(i)
            value = cells[i]
            if value < low:
                low = value
            h1 += h2
        # Pass 2 (conservative update): raise only counters below the new estimate.
        new = low + count
        for i in indices:
            if cells[i] < new:
                cells[i] = new
        self._total += count
        return new

    def _add_beside(self, key: bytes, other: CountMinSketch) -> tuple[int, int]:
        # add() and other.estimate() in one go, hashing once; other must have been built
        # with the same width, depth, seed and hash_fn (HotKeyDetector's two windows).
        x = (self._hash(key) * self._mul) & _MASK64
        h1 = x >> 32
        h2 = (x & _MASK32) | 1
        mask = self._mask
        cells = self._cells
        other_cells = other._cells
        indices = []
        low = other_low = _BIG
        for offset in self._offsets:
            i = offset + (h1 & mask)
            indices.append(i)
            value = cells[i]
            if value < low:
                low = value
            value = other_cells[i]
            if value < other_low:
                other_low = value
            h1 += h2
        new = low + 1
        for i in indices:
            if cells[i] < new:
                cells[i] = new
        self._total += 1
        return new, other_low

    def estimate(self, key: bytes) -> int:
        """Return the estimated count of ``key``: never below its true count.

        Args:
            key: the key.

        Returns:
            The minimum of the key's counters.
        """
        x = (self._hash(key) * self._mul) & _MASK64
        h1 = x >> 32
        h2 = (x & _MASK32) | 1
        mask = self._mask
        cells = self._cells
        low = _BIG
        for offset in self._offsets:
            value = cells[offset + (h1 & mask)]
            if value < low:
                low = value
            h1 += h2
        return low

    def reset(self) -> None:
        """Forget every count."""
        self._table.fill(0)
        self._total = 0


class HotKeyDetector:
    """Tells whether a key exceeds its per-key quota over a sliding window.

    A key is *hot* when its estimated count over the last ``window_s`` seconds, including
    the task being observed, exceeds ``rate_per_s * window_s``. Every observed task counts,
    hot or not, so a key that keeps flooding stays hot; it cools down once its rate falls
    back under the quota for long enough. Since estimates never undercount, a key over its
    quota is always reported; a key under it is reported only when sketch collisions add
    up to the difference (rare with the default sizes, see `CountMinSketch`).

    Args:
        rate_per_s: per-key quota in tasks per second; ``-1`` disables detection (no key
            is ever hot), ``0`` makes every key hot.
        window_s: window length in seconds; longer windows tolerate longer short bursts.
        width: sketch counters per row.
        depth: sketch rows.
        seed: sketch hash seed.
        clock: monotonic seconds; injectable for tests.
        hash_fn: 64-bit key hash, see `CountMinSketch`.

    Raises:
        ConfigError: an argument is out of range.
    """

    __slots__ = (
        "_clock",
        "_current",
        "_inv_window",
        "_previous",
        "_quota",
        "_rate",
        "_window_end",
        "_window_s",
    )

    def __init__(
        self,
        rate_per_s: int,
        window_s: float,
        *,
        width: int = DEFAULT_SKETCH_WIDTH,
        depth: int = DEFAULT_SKETCH_DEPTH,
        seed: int = 0,
        clock: Callable[[], float] = time.monotonic,
        hash_fn: Callable[[bytes], int] = hash,
    ) -> None:
        _check_rate(rate_per_s)
        if (
            isinstance(window_s, bool)
            or not isinstance(window_s, int | float)
            or not (math.isfinite(window_s) and window_s > 0)
        ):
            raise ConfigError(f"window_s must be a finite number of seconds > 0, got {window_s!r}")
        self._clock = clock
        self._window_s = float(window_s)
        self._inv_window = 1.0 / self._window_s
        # The same hash functions for both windows, so observe() hashes a key once and
        # reads the previous window's counters at the indices it already computed.
        self._current = CountMinSketch(width, depth, seed, hash_fn=hash_fn)
        self._previous = CountMinSketch(width, depth, seed, hash_fn=hash_fn)
        self._rate = rate_per_s
        self._quota = -1.0
        self._window_end = 0.0
        self.set_rate(rate_per_s)

    @property
    def rate_per_s(self) -> int:
        """The per-key quota in tasks per second; -1 when detection is off."""
        return self._rate

    @property
    def window_s(self) -> float:
        """The window length in seconds."""
        return self._window_s

    def set_rate(self, rate_per_s: int, *, now: float | None = None) -> None:
        """Change the per-key quota while running.

        Counts are kept across a change between two quotas: they do not depend on it.
        Turning detection on (from -1) starts from empty windows, as nothing was counted
        while it was off.

        Args:
            rate_per_s: the new quota in tasks per second; -1 off, 0 every key hot.
            now: the clock reading of the change; ``None`` reads the clock.

        Raises:
            ConfigError: ``rate_per_s`` is not an int >= -1; nothing changes.
        """
        _check_rate(rate_per_s)
        was_off = self._quota < 0
        self._rate = rate_per_s
        # Compared with estimated counts; -1.0 marks "off" for the fast path of observe().
        self._quota = -1.0 if rate_per_s < 0 else rate_per_s * self._window_s
        if was_off and rate_per_s >= 0:
            self._current.reset()
            self._previous.reset()
            self._window_end = (self._clock() if now is None else now) + self._window_s

    def observe(self, key: bytes, now: float | None = None) -> bool:
        """Count one task of ``key`` and tell whether the key is over its quota.

        Args:
            key: the record key.
            now: the clock reading to use, from the detector's clock; ``None`` reads it.

        Returns:
            ``True`` when the key's estimated count over the last window, this task
            included, exceeds ``rate_per_s * window_s``; always ``False`` when off.
        """
        quota = self._quota
        if quota < 0:
            return False
        if now is None:
            now = self._clock()
        if now >= self._window_end:
            self._roll(now)
        if self._previous._total == 0:
            # First window, or the previous one saw nothing: no need to read it.
            return self._current.add(key) > quota
        count, previous = self._current._add_beside(key, self._previous)
        # The part of the previous window still inside the sliding window.
        weight = (self._window_end - now) * self._inv_window
        return count + weight * previous > quota

    def estimate(self, key: bytes, now: float | None = None) -> float:
        """Return the estimated count of ``key`` over the last window, without counting.

        Args:
            key: the record key.
            now: the clock reading to use; ``None`` reads the clock.

        Returns:
            The weighted estimate (0.0 when detection is off); divide by ``window_s`` for
            a rate.
        """
        if self._quota < 0:
            return 0.0
        if now is None:
            now = self._clock()
        if now >= self._window_end:
            self._roll(now)
        weight = (self._window_end - now) * self._inv_window
        return self._current.estimate(key) + weight * self._previous.estimate(key)

    def _roll(self, now: float) -> None:
        # Windows stay aligned to the first window's start, so a late call does not stretch
        # the window it closes.
        if now < self._window_end + self._window_s:
            # The window in progress just ended: it becomes the previous one.
            self._current, self._previous = self._previous, self._current
            self._current.reset()
            self._window_end += self._window_s
        else:
            # Idle for a whole window or more: nothing recent enough to keep.
            self._current.reset()
            self._previous.reset()
            skipped = math.floor((now - self._window_end) * self._inv_window) + 1
            self._window_end += skipped * self._window_s
            if now >= self._window_end:  # float rounding on huge gaps
                self._window_end = now + self._window_s


def _check_rate(rate_per_s: int) -> None:
    if isinstance(rate_per_s, bool) or not isinstance(rate_per_s, int) or rate_per_s < -1:
        raise ConfigError(
            f"per-key quota rate must be an int >= -1 (-1 off, n tasks per second per key), "
            f"got {rate_per_s!r}"
        )
