"""Unit and property tests of the per-partition token bucket, driven by a fake clock."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from decaton_aio.consumer._ratelimit import UNLIMITED, RateLimiter, TokenBucket
from decaton_aio.errors import ConfigError


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def drain(bucket: TokenBucket) -> int:
    """Take every token available right now; return how many."""
    taken = 0
    while bucket.try_acquire() == 0.0:
        taken += 1
    return taken


def run_greedy(bucket: TokenBucket, clock: FakeClock, seconds: float) -> int:
    """A caller that always wants a token and sleeps exactly as told; return tokens granted
    within ``seconds`` of the start."""
    end = clock.now + seconds
    granted = 0
    while True:
        wait = bucket.try_acquire()
        if wait == 0.0:
            granted += 1
            continue
        if clock.now + wait > end:
            return granted
        clock.advance(wait)


# ---------------------------------------------------------------------- basics


def test_unlimited_always_grants_at_once() -> None:
    bucket = TokenBucket(UNLIMITED, clock=FakeClock())
    assert all(bucket.try_acquire() == 0.0 for _ in range(100_000))
    assert bucket.try_acquire(10**9) == 0.0
    assert bucket.available() == math.inf
    assert bucket.throttled_s == 0.0


def test_a_new_bucket_starts_full_then_waits_one_token_interval() -> None:
    """Given 10 tokens/s and the default burst (one second's worth), 10 tasks start at
    once and the 11th is told to wait 0.1 s."""
    clock = FakeClock()
    bucket = TokenBucket(10, clock=clock)
    assert bucket.burst == 10
    assert drain(bucket) == 10
    assert bucket.try_acquire() == pytest.approx(0.1)
    clock.advance(0.1)
    assert bucket.try_acquire() == 0.0


def test_a_refusal_takes_nothing() -> None:
    clock = FakeClock()
    bucket = TokenBucket(4, burst=1, clock=clock)
    assert bucket.try_acquire() == 0.0
    for _ in range(100):  # asking again and again does not push the grant further out
        assert bucket.try_acquire() == pytest.approx(0.25)
    clock.advance(0.25)
    assert bucket.try_acquire() == 0.0


def test_the_rate_is_exact_over_a_window() -> None:
    """A greedy caller gets the burst plus rate * seconds tokens, not one more or less."""
    clock = FakeClock()
    bucket = TokenBucket(100, burst=5, clock=clock)
    assert run_greedy(bucket, clock, 10.0) == 5 + 100 * 10


def test_a_caller_polling_on_a_coarse_tick_still_gets_the_rate() -> None:
    """Polling every 7 ms instead of sleeping the exact wait loses nothing: tokens accrue
    between polls (up to the burst)."""
    clock = FakeClock()
    bucket = TokenBucket(1000, burst=50, clock=clock)
    granted = drain(bucket)
    for _ in range(1000):
        clock.advance(0.007)
        granted += drain(bucket)
    assert granted == pytest.approx(50 + 1000 * 7.0, abs=1)


def test_idle_time_accrues_at_most_a_burst() -> None:
    clock = FakeClock()
    bucket = TokenBucket(100, burst=20, clock=clock)
    drain(bucket)
    clock.advance(3600.0)
    assert drain(bucket) == 20


def test_a_request_larger_than_the_burst_is_granted_when_full_and_paid_back() -> None:
    clock = FakeClock()
    bucket = TokenBucket(10, burst=5, clock=clock)
    assert bucket.try_acquire(8) == 0.0  # bucket full (5): granted, 3 tokens of debt
    assert bucket.available() == pytest.approx(-3.0)
    assert bucket.try_acquire() == pytest.approx(0.4)  # 3 of debt + 1 at 10/s
    clock.advance(0.4)
    assert bucket.try_acquire() == 0.0


def test_a_batch_waits_until_all_its_tokens_are_there() -> None:
    clock = FakeClock()
    bucket = TokenBucket(10, burst=10, clock=clock)
    drain(bucket)
    assert bucket.try_acquire(4) == pytest.approx(0.4)
    clock.advance(0.4)
    assert bucket.try_acquire(4) == 0.0


# ----------------------------------------------------------------------- pause


def test_rate_zero_pauses_forever() -> None:
    clock = FakeClock()
    bucket = TokenBucket(0, clock=clock)
    assert bucket.paused
    for _ in range(3):
        assert bucket.try_acquire() == math.inf
        clock.advance(1e6)


def test_pausing_keeps_the_balance_for_the_resume() -> None:
    clock = FakeClock()
    bucket = TokenBucket(10, clock=clock)
    for _ in range(7):
        bucket.try_acquire()
    bucket.set_rate(0, burst=10)
    clock.advance(60.0)
    assert bucket.try_acquire() == math.inf  # the 3 tokens left are kept, not granted
    bucket.set_rate(10)
    assert drain(bucket) == 3  # ... and no more: nothing accrued during the pause
    assert bucket.try_acquire() == pytest.approx(0.1)


# ----------------------------------------------------------------- live changes


def test_raising_the_rate_shortens_the_wait_without_a_fresh_burst() -> None:
    clock = FakeClock()
    bucket = TokenBucket(10, clock=clock)
    drain(bucket)
    bucket.set_rate(100)
    assert bucket.burst == 100  # the default burst follows the rate
    assert bucket.try_acquire() == pytest.approx(0.01)  # empty stays empty
    assert run_greedy(bucket, clock, 1.0) == 100


def test_lowering_the_rate_caps_the_balance_at_the_new_burst() -> None:
    clock = FakeClock()
    bucket = TokenBucket(100, clock=clock)
    bucket.set_rate(5)
    assert bucket.available() == 5.0
    assert drain(bucket) == 5
    assert bucket.try_acquire() == pytest.approx(0.2)


def test_an_explicit_burst_survives_rate_changes() -> None:
    bucket = TokenBucket(10, burst=3, clock=FakeClock())
    bucket.set_rate(1000)
    assert bucket.burst == 3
    bucket.set_rate(1000, burst=7)
    bucket.set_rate(50)
    assert bucket.burst == 7


def test_leaving_unlimited_starts_with_a_full_bucket() -> None:
    clock = FakeClock()
    bucket = TokenBucket(UNLIMITED, clock=clock)
    bucket.set_rate(20)
    assert drain(bucket) == 20
    assert bucket.try_acquire() == pytest.approx(0.05)


def test_a_rate_change_mid_run_gives_each_rate_for_its_period() -> None:
    clock = FakeClock()
    bucket = TokenBucket(50, burst=1, clock=clock)
    first = run_greedy(bucket, clock, 2.0)
    bucket.set_rate(200, burst=1)
    second = run_greedy(bucket, clock, 2.0)
    assert (first, second) == (pytest.approx(101, abs=1), pytest.approx(400, abs=1))


def test_a_bad_rate_change_is_rejected_and_the_old_rate_kept() -> None:
    bucket = TokenBucket(10, clock=FakeClock())
    with pytest.raises(ConfigError, match="-1 unlimited, 0 pause"):
        bucket.set_rate(-2)
    with pytest.raises(ConfigError, match="burst must be an int >= 1"):
        bucket.set_rate(20, burst=0)
    assert (bucket.rate_per_s, bucket.burst) == (10, 10)


@pytest.mark.parametrize("rate", [-2, 1.5, True, "10"])
def test_bad_rates_are_rejected(rate: object) -> None:
    with pytest.raises(ConfigError, match="rate_per_s must be an int >= -1"):
        TokenBucket(rate)  # type: ignore[arg-type]


# ---------------------------------------------------------------- throttled time


def test_throttled_time_runs_from_the_first_refusal_to_the_grant() -> None:
    clock = FakeClock()
    bucket = TokenBucket(2, burst=1, clock=clock)
    bucket.try_acquire()
    assert bucket.try_acquire() == pytest.approx(0.5)
    clock.advance(0.2)
    bucket.try_acquire()  # a second refusal within the same interval counts once
    assert bucket.throttled_s == pytest.approx(0.2)  # the open interval, as of now
    clock.advance(0.3)
    assert bucket.try_acquire() == 0.0
    clock.advance(5.0)  # not throttled while nobody is refused
    assert bucket.throttled_s == pytest.approx(0.5)


def test_a_pause_counts_as_throttled_and_unlimited_ends_it() -> None:
    clock = FakeClock()
    bucket = TokenBucket(0, clock=clock)
    assert bucket.try_acquire() == math.inf
    clock.advance(4.0)
    bucket.set_rate(UNLIMITED)
    clock.advance(10.0)
    assert bucket.try_acquire() == 0.0
    assert bucket.throttled_s == pytest.approx(4.0)


def test_a_token_bucket_is_a_rate_limiter() -> None:
    limiter: RateLimiter = TokenBucket(5, clock=FakeClock())
    assert limiter.try_acquire() == 0.0
    limiter.set_rate(UNLIMITED)
    assert limiter.throttled_s == 0.0


# ------------------------------------------------------------------------ drift


@pytest.mark.parametrize("burst", [1, 10])
def test_no_drift_over_a_long_run(burst: int) -> None:
    """300 s at 1000/s, on a clock reading 1e7 s where float spacing is coarse: the count
    is exactly burst + rate * seconds, and a caller that sleeps exactly the returned wait
    is never refused twice in a row (rounding never leaves it a hair short)."""
    clock = FakeClock(now=1e7)
    bucket = TokenBucket(1000, burst=burst, clock=clock)
    end = clock.now + 300.0 + 0.5 / 1000  # half a token interval: no tie at the end
    granted = 0
    refusals_in_a_row = 0
    while True:
        wait = bucket.try_acquire()
        if wait == 0.0:
            granted += 1
            refusals_in_a_row = 0
            continue
        refusals_in_a_row += 1
        assert refusals_in_a_row == 1
        if clock.now + wait > end:
            break
        clock.advance(wait)
    assert granted == burst + 300_000


@given(
    rate=st.integers(min_value=1, max_value=10_000),
    burst=st.integers(min_value=1, max_value=100),
    steps=st.lists(
        st.tuples(st.floats(min_value=0.0, max_value=0.05), st.integers(1, 5)), max_size=300
    ),
)
def test_grants_never_exceed_burst_plus_rate_times_elapsed(
    rate: int, burst: int, steps: list[tuple[float, int]]
) -> None:
    clock = FakeClock(now=12345.678)
    start = clock.now
    bucket = TokenBucket(rate, burst=burst, clock=clock)
    granted = 0
    for dt, n in steps:
        clock.advance(dt)
        wait = bucket.try_acquire(n)
        if wait == 0.0:
            granted += n
        else:
            assert 0.0 < wait < math.inf
            # The wait is exact: after it, the same request is granted.
            clock.advance(wait)
            assert bucket.try_acquire(n) == 0.0
            granted += n
        # An oversized request may go into debt, by at most n - burst tokens; a grant may
        # come up to 1 us early (float rounding slack).
        limit = burst + rate * (clock.now - start + 1e-6) + max(0, n - burst)
        assert granted <= limit + 1e-9
