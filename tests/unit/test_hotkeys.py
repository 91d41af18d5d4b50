"""Unit and property tests of the count-min sketch and the hot-key detector (fake clock)."""

from __future__ import annotations

import hashlib
import math
import random
from collections import Counter

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from decaton_aio.consumer._hotkeys import CountMinSketch, HotKeyDetector
from decaton_aio.errors import ConfigError


def stable_hash(key: bytes) -> int:
    """A hash that is the same in every process, so these tests do not vary between runs."""
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")


class FakeClock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


keys = st.binary(min_size=0, max_size=6)


# ------------------------------------------------------------------- the sketch


def test_width_is_rounded_up_to_a_power_of_two() -> None:
    sketch = CountMinSketch(1000, 3)
    assert (sketch.width, sketch.depth) == (1024, 3)
    assert sketch.table.shape == (3, 1024)


def test_an_empty_sketch_estimates_zero() -> None:
    assert CountMinSketch().estimate(b"anything") == 0


def test_counts_are_exact_without_collisions() -> None:
    sketch = CountMinSketch(1 << 16, 4, hash_fn=stable_hash)
    for i in range(1, 11):
        assert sketch.add(b"k%d" % i, i) == i
    assert [sketch.estimate(b"k%d" % i) for i in range(1, 11)] == list(range(1, 11))
    assert sketch.total == 55


def test_add_returns_the_estimate_after_adding() -> None:
    sketch = CountMinSketch(16, 2)
    for i in range(200):
        key = b"%d" % (i % 37)
        assert sketch.add(key) == sketch.estimate(key)


@given(st.lists(st.tuples(keys, st.integers(min_value=0, max_value=50)), max_size=200))
def test_estimates_never_undercount(adds: list[tuple[bytes, int]]) -> None:
    """A tiny sketch (8 x 2) collides all the time, and still never reports less than the
    true count; no row holds more than everything added (conservative update)."""
    sketch = CountMinSketch(8, 2, seed=3)
    truth: Counter[bytes] = Counter()
    for key, count in adds:
        truth[key] += count
        assert sketch.add(key, count) >= truth[key]
    for key, count in truth.items():
        assert count <= sketch.estimate(key) <= sketch.total
    assert all(row_sum <= sketch.total for row_sum in sketch.table.sum(axis=1))


def test_the_error_bound_holds() -> None:
    """With N counts, an estimate is off by more than e * N / width for at most a fraction
    exp(-depth) of keys (the count-min guarantee; conservative update only helps)."""
    sketch = CountMinSketch(256, 3, hash_fn=stable_hash)
    rng = random.Random(5)
    truth: Counter[bytes] = Counter()
    for _ in range(50_000):
        key = b"user-%d" % int(rng.paretovariate(1.1))  # skewed, like real keys
        truth[key] += 1
        sketch.add(key)
    bound = math.e * sketch.total / sketch.width
    off = sum(sketch.estimate(key) - count > bound for key, count in truth.items())
    assert off / len(truth) <= math.exp(-3)


def test_reset_forgets_everything() -> None:
    sketch = CountMinSketch(64, 4)
    sketch.add(b"a", 10)
    sketch.reset()
    assert (sketch.estimate(b"a"), sketch.total, int(sketch.table.sum())) == (0, 0, 0)


def test_the_table_view_is_read_only() -> None:
    sketch = CountMinSketch(64, 2)
    with pytest.raises(ValueError, match="read-only"):
        sketch.table[0, 0] = 5


def test_seeds_choose_different_hash_functions() -> None:
    a = CountMinSketch(64, 4, seed=1, hash_fn=stable_hash)
    b = CountMinSketch(64, 4, seed=2, hash_fn=stable_hash)
    for i in range(20):
        a.add(b"%d" % i)
        b.add(b"%d" % i)
    assert not np.array_equal(a.table, b.table)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"width": 0}, "width must be an int"),
        ({"width": 1 << 30}, "width"),
        ({"depth": 0}, "depth must be an int"),
        ({"depth": 2.0}, "depth"),
        ({"seed": "x"}, "seed must be an int"),
    ],
)
def test_bad_sketch_sizes_are_rejected(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        CountMinSketch(**kwargs)  # type: ignore[arg-type]


# ------------------------------------------------------------------ the detector


def test_a_flooding_key_is_detected_within_the_window_and_stays_hot() -> None:
    """Given a quota of 100/s and 1000 keys at 5/s each, a key flooding at 1000/s is hot
    from its 101st task on (well inside the first window) and never cools down while it
    floods, across window boundaries; the normal keys are never reported."""
    clock = FakeClock()
    detector = HotKeyDetector(100, 1.0, clock=clock, hash_fn=stable_hash)
    flood_results: list[bool] = []
    false_positives = 0
    start = clock.now
    # 3 seconds in 1 ms ticks: each tick one flood task, and 5 background tasks.
    for tick in range(3000):
        clock.now = start + tick / 1000
        flood_results.append(detector.observe(b"flood"))
        for j in range(5):
            false_positives += detector.observe(b"user-%d" % ((tick * 5 + j) % 1000))
    first_hot = flood_results.index(True)
    assert first_hot == 100  # its 101st task: estimates never undercount, so no later
    assert all(flood_results[first_hot:])
    assert false_positives == 0


def test_false_positives_are_rare_with_many_distinct_keys() -> None:
    """50 000 tasks of 10 000 distinct keys in one window, each key at 5 tasks against a
    quota of 50: with the default 2048 x 4 sketch at most 0.1 % are reported hot."""
    for hash_fn in (stable_hash, hash):  # deterministic, and the default
        clock = FakeClock()
        detector = HotKeyDetector(50, 1.0, clock=clock, hash_fn=hash_fn)
        hot: set[bytes] = set()
        for i in range(50_000):
            clock.now = 100.0 + i / 60_000
            key = b"user-%d" % (i % 10_000)
            if detector.observe(key):
                hot.add(key)
        assert len(hot) <= 10


def test_the_previous_window_fades_out() -> None:
    """Quota 10 per 1 s window. A key that used 11 in window 1 is still hot at the start
    of window 2 (the previous window weighs fully), no longer near its end, and forgotten
    after an idle window."""
    clock = FakeClock(now=0.0)
    detector = HotKeyDetector(10, 1.0, clock=clock)
    results = [detector.observe(b"k", now=i / 100) for i in range(11)]
    assert results == [False] * 10 + [True]  # 10 is the quota, 11 exceeds it
    assert detector.observe(b"k", now=1.0)  # 1 + 1.0 * 11
    assert detector.estimate(b"k", now=1.5) == pytest.approx(1 + 0.5 * 11)
    assert not detector.observe(b"k", now=1.99)  # 2 + 0.01 * 11
    assert not detector.observe(b"k", now=2.5)  # window 3: 1 + 0.5 * 2
    assert detector.estimate(b"k", now=4.0) == 0.0  # idle through window 4: forgotten


def test_windows_stay_aligned_when_calls_come_late() -> None:
    clock = FakeClock(now=0.0)
    detector = HotKeyDetector(5, 1.0, clock=clock)
    for _ in range(5):
        detector.observe(b"k", now=0.5)
    # The window [0, 1) closes late, at 1.75: the new window still ends at 2.0, so at 1.75
    # the previous window weighs 0.25.
    assert detector.estimate(b"k", now=1.75) == pytest.approx(0.25 * 5)
    # A jump over several windows lands on the grid too.
    detector.observe(b"k", now=7.25)
    assert detector.estimate(b"k", now=8.5) == pytest.approx(0.5 * 1)


@given(
    st.lists(
        st.tuples(st.sampled_from([b"a", b"b", b"c", b"d"]), st.integers(0, 40)),
        max_size=300,
    ),
    st.integers(min_value=0, max_value=20),
)
def test_a_key_over_its_quota_in_the_current_window_is_always_hot(
    steps: list[tuple[bytes, int]], rate: int
) -> None:
    """No false negatives: whenever a key's true count in the current window exceeds the
    quota, observe() says so."""
    clock = FakeClock(now=0.0)
    detector = HotKeyDetector(rate, 1.0, clock=clock, width=4, depth=2)
    now = 0.0
    window = 0
    truth: Counter[bytes] = Counter()
    for key, dt in steps:
        now += dt / 64  # exact binary fractions: window boundaries are unambiguous
        if math.floor(now) != window:
            window = math.floor(now)
            truth.clear()
        truth[key] += 1
        hot = detector.observe(key, now=now)
        if truth[key] > rate:
            assert hot


def test_rate_minus_one_disables_detection() -> None:
    detector = HotKeyDetector(-1, 1.0, clock=FakeClock())
    assert not any(detector.observe(b"flood") for _ in range(10_000))
    assert detector.estimate(b"flood") == 0.0


def test_rate_zero_makes_every_key_hot() -> None:
    detector = HotKeyDetector(0, 1.0, clock=FakeClock())
    assert detector.observe(b"first")


def test_turning_detection_on_starts_from_empty_windows() -> None:
    clock = FakeClock(now=10.0)
    detector = HotKeyDetector(-1, 1.0, clock=clock)
    detector.set_rate(2)
    assert detector.rate_per_s == 2
    assert [detector.observe(b"k", now=10.2) for _ in range(3)] == [False, False, True]
    # The new windows start at the change: [10, 11) then [11, 12).
    assert detector.estimate(b"k", now=11.0) == pytest.approx(3.0)


def test_changing_the_quota_keeps_the_counts() -> None:
    clock = FakeClock()
    detector = HotKeyDetector(10, 1.0, clock=clock)
    for _ in range(8):
        assert not detector.observe(b"k")
    detector.set_rate(5)
    assert detector.observe(b"k")


@pytest.mark.parametrize(
    ("rate", "window", "match"),
    [
        (-2, 1.0, "per-key quota rate must be an int >= -1"),
        (1.5, 1.0, "quota rate"),
        (10, 0.0, "window_s must be a finite number"),
        (10, -1.0, "window_s"),
        (10, math.inf, "window_s"),
        (10, math.nan, "window_s"),
    ],
)
def test_bad_detector_settings_are_rejected(rate: object, window: object, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        HotKeyDetector(rate, window)  # type: ignore[arg-type]


def test_a_bad_quota_change_is_rejected_and_the_old_one_kept() -> None:
    detector = HotKeyDetector(10, 1.0, clock=FakeClock())
    with pytest.raises(ConfigError):
        detector.set_rate(-5)
    assert detector.rate_per_s == 10
