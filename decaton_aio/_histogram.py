"""Fixed-bucket histograms whose observation is one C-level append (the runtime's hot path).

`FastHistogram` queues observations in a list and sorts them into buckets in
bulk with numpy when read; `decaton_aio.metrics` exports them to Prometheus.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable
from itertools import accumulate, pairwise

import numpy as np
from prometheus_client.utils import floatToGoString

from decaton_aio.errors import ConfigError

__all__ = ["DEFAULT_BUCKETS_S", "LOOP_BUCKETS_S", "FastHistogram"]

DEFAULT_BUCKETS_S: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
"""Histogram upper bounds in seconds: sub-millisecond processors up to minute-long retries."""

LOOP_BUCKETS_S: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
)  # fmt: skip
"""Upper bounds for how long the event loop is held (loop lag, GC pauses, the runtime's own
steps): fine below 10 ms, where a healthy loop lives."""


class FastHistogram:
    """A fixed-bucket histogram whose `observe()` is one list append.

    Observations are queued in a list and sorted into buckets in bulk (numpy) by
    `fold()`, which every reader calls first and the runtime calls once per commit
    interval, so the queue stays short (32 bytes per queued observation: a list append
    takes the float as it is, where an ``array("d")`` append would parse it again). Folding may run
    in a scrape thread while the event loop observes: it takes only the observations
    queued when it started and leaves later ones queued.

    Args:
        bounds: the bucket upper bounds in seconds, strictly increasing. A value equal to a
            bound lands in that bound's bucket (Prometheus' ``le``: less than or equal).

    Raises:
        ConfigError: the bounds are empty, not finite or not strictly increasing.

    Attributes:
        bounds: the bucket upper bounds.
        observe: record one value (a finite duration in seconds; a negative one, from
            clock skew, lands in the first bucket). Hot path: no validation.
    """

    __slots__ = ("_counts", "_edges", "_lock", "_queued", "_sum", "bounds", "observe")

    def __init__(self, bounds: tuple[float, ...] = DEFAULT_BUCKETS_S) -> None:
        # The default is known good; skipping its check keeps scrape-time copies cheap.
        if (
            bounds is not DEFAULT_BUCKETS_S
            and bounds is not LOOP_BUCKETS_S
            and not (
                bounds
                and all(map(math.isfinite, bounds))
                and all(a < b for a, b in pairwise(bounds))
            )
        ):
            raise ConfigError(f"histogram bounds must be finite and strictly increasing: {bounds}")
        self.bounds = bounds
        self._edges = np.asarray(bounds, dtype=np.float64)
        self._counts = np.zeros(len(bounds) + 1, dtype=np.int64)
        self._sum = 0.0
        self._queued: list[float] = []
        self.observe: Callable[[float], None] = self._queued.append
        self._lock = threading.Lock()

    def fold(self) -> None:
        """Sort the queued observations into their buckets."""
        with self._lock:
            queued = self._queued
            n = len(queued)
            if not n:
                return
            values = np.array(queued[:n], dtype=np.float64)  # appends go on meanwhile
            del queued[:n]
            self._counts += np.bincount(
                np.searchsorted(self._edges, values, side="left"), minlength=len(self._counts)
            )
            self._sum += float(values.sum())

    @property
    def counts(self) -> list[int]:
        """Observations per bucket (not cumulative); the last one is the overflow bucket
        (``+Inf``) for values above every bound."""
        self.fold()
        return [int(n) for n in self._counts]

    @property
    def sum(self) -> float:
        """The sum of every observed value."""
        self.fold()
        return self._sum

    @property
    def count(self) -> int:
        """The number of observations."""
        self.fold()
        return int(self._counts.sum())

    def merge(self, other: FastHistogram) -> None:
        """Add another histogram's observations to this one.

        Args:
            other: a histogram with the same bounds.

        Raises:
            ValueError: the bounds differ.
        """
        if other.bounds != self.bounds:
            raise ValueError("cannot merge histograms with different bucket bounds")
        other.fold()
        with other._lock:
            counts, total = other._counts.copy(), other._sum
        with self._lock:
            self._counts += counts
            self._sum += total

    def cumulative(self) -> list[tuple[str, float]]:
        """Return the Prometheus buckets: ``(le, observations <= le)`` ending with ``+Inf``."""
        counts = self.counts  # one copy, so buckets are consistent with each other
        return list(zip(_le_labels(self.bounds), map(float, accumulate(counts)), strict=True))


@functools.cache
def _le_labels(bounds: tuple[float, ...]) -> tuple[str, ...]:
    # Formatted once per bound set, in the exact form prometheus_client uses for ``le``.
    return (*map(floatToGoString, bounds), "+Inf")
