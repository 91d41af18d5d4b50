"""Unit and property tests of the retry policy and the backoff formula (no broker, no asyncio)."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from decaton_aio.backoff import (
    DEFAULT_MAX_ATTEMPTS,
    RetryPolicy,
    RetryTask,
    SkipTask,
    TaskControl,
    compute_backoff,
)
from decaton_aio.errors import ConfigError, DecatonError, ProcessingError, ProducerError


class FixedRandom(random.Random):
    """A generator whose every draw is ``u``: pins the jitter to one point of its range."""

    def __init__(self, u: float) -> None:
        super().__init__(0)
        self.u = u

    def random(self) -> float:
        return self.u


bases = st.floats(min_value=0.0, max_value=100.0)
factors = st.floats(min_value=1.0, max_value=10.0)
jitters = st.floats(min_value=0.0, max_value=1.0)
attempts = st.integers(min_value=1, max_value=2000)
units = st.floats(min_value=0.0, max_value=1.0, exclude_max=True)


def capped(attempt: int, base: float, factor: float, max_s: float) -> float:
    try:
        return min(max_s, base * factor ** (attempt - 1))
    except OverflowError:
        return max_s


# ------------------------------------------------------------------ compute_backoff


def test_without_jitter_the_delays_are_the_capped_exponential_sequence() -> None:
    """Given base 0.1 s, factor 2 and a 1 s cap, the retries wait 0.1, 0.2, 0.4, 0.8, 1, 1."""
    delays = [
        compute_backoff(n, base_s=0.1, factor=2.0, max_s=1.0, jitter=0.0) for n in range(1, 7)
    ]
    assert delays == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])


def test_a_huge_attempt_number_is_capped_not_an_overflow() -> None:
    assert compute_backoff(10**6, base_s=1.0, factor=2.0, max_s=30.0, jitter=0.0) == 30.0


def test_full_jitter_spreads_delays_over_the_whole_range() -> None:
    """jitter=1: delays cover (0, capped]; their mean is half of it."""
    rng = random.Random(7)
    delays = [
        compute_backoff(3, base_s=1.0, factor=2.0, max_s=100.0, jitter=1.0, rng=rng)
        for _ in range(5000)
    ]
    assert all(0.0 < d <= 4.0 for d in delays)
    assert min(delays) < 0.05
    assert max(delays) > 3.95
    assert sum(delays) / len(delays) == pytest.approx(2.0, rel=0.05)


def test_equal_jitter_keeps_at_least_half_the_delay() -> None:
    rng = random.Random(7)
    delays = [
        compute_backoff(2, base_s=1.0, factor=3.0, max_s=100.0, jitter=0.5, rng=rng)
        for _ in range(2000)
    ]
    assert all(1.5 < d <= 3.0 for d in delays)


def test_the_module_generator_is_used_without_an_rng() -> None:
    random.seed(3)
    first = compute_backoff(1, base_s=1.0, factor=2.0, max_s=10.0, jitter=1.0)
    random.seed(3)
    assert compute_backoff(1, base_s=1.0, factor=2.0, max_s=10.0, jitter=1.0) == first


@given(attempts, bases, factors, st.floats(min_value=0.0, max_value=1000.0), jitters, units)
def test_delays_lie_in_the_jitter_band_below_the_cap(
    attempt: int, base: float, factor: float, extra: float, jitter: float, u: float
) -> None:
    max_s = base + extra
    delay = compute_backoff(
        attempt, base_s=base, factor=factor, max_s=max_s, jitter=jitter, rng=FixedRandom(u)
    )
    top = capped(attempt, base, factor, max_s)
    assert 0.0 <= delay <= max_s
    assert delay <= top
    assert delay >= (1.0 - jitter) * top - 1e-12 * max(1.0, top)


@given(attempts, bases, factors, st.floats(min_value=0.0, max_value=1000.0), jitters, units)
def test_delays_never_shrink_from_one_retry_to_the_next(
    attempt: int, base: float, factor: float, extra: float, jitter: float, u: float
) -> None:
    """For the same jitter draw the delay is non-decreasing in the attempt, so the expected
    delay (and the delay itself when jitter is 0) never decreases."""
    kwargs = {"base_s": base, "factor": factor, "max_s": base + extra, "jitter": jitter}
    now = compute_backoff(attempt, **kwargs, rng=FixedRandom(u))  # type: ignore[arg-type]
    later = compute_backoff(attempt + 1, **kwargs, rng=FixedRandom(u))  # type: ignore[arg-type]
    assert later >= now


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"base_s": -1.0}, "base"),
        ({"base_s": math.nan}, "base"),
        ({"factor": 0.5}, "factor must be a finite number >= 1"),
        ({"factor": math.inf}, "factor"),
        ({"max_s": 0.5}, "raise the max or lower the base"),
        ({"jitter": 1.5}, r"jitter must be in \[0, 1\]"),
        ({"jitter": -0.1}, "jitter"),
    ],
)
def test_bad_backoff_arguments_are_rejected(kwargs: dict[str, float], match: str) -> None:
    args = {"base_s": 1.0, "factor": 2.0, "max_s": 10.0, "jitter": 0.0} | kwargs
    with pytest.raises(ConfigError, match=match):
        compute_backoff(1, **args)  # type: ignore[arg-type]


@pytest.mark.parametrize("attempt", [0, -1, True, 1.0])
def test_attempts_count_from_one(attempt: int) -> None:
    with pytest.raises(ConfigError, match="the first delivery is attempt 1"):
        compute_backoff(attempt, base_s=1.0, factor=2.0, max_s=10.0, jitter=0.0)


# ---------------------------------------------------------------------- RetryPolicy


def test_max_attempts_counts_the_first_delivery() -> None:
    """Given max_attempts=3: attempts 1 and 2 may be retried, attempt 3 is the last."""
    policy = RetryPolicy(max_attempts=3)
    assert [policy.exhausted(n) for n in (1, 2, 3, 4)] == [False, False, True, True]
    assert policy.max_retries == 2
    assert RetryPolicy().max_attempts == DEFAULT_MAX_ATTEMPTS


def test_one_attempt_never_retries() -> None:
    policy = RetryPolicy(max_attempts=1)
    assert policy.exhausted(1)


def test_policy_delays_follow_the_formula_in_milliseconds() -> None:
    policy = RetryPolicy(backoff_base_ms=100, backoff_factor=3.0, backoff_max_ms=1000, jitter=0.0)
    assert [policy.delay_s(n) for n in (1, 2, 3, 4)] == pytest.approx([0.1, 0.3, 0.9, 1.0])


@given(st.integers(min_value=1, max_value=500), units)
def test_policy_delays_stay_within_zero_and_the_cap(attempt: int, u: float) -> None:
    policy = RetryPolicy(backoff_base_ms=250, backoff_max_ms=4000, jitter=1.0)
    assert 0.0 <= policy.delay_s(attempt, FixedRandom(u)) <= 4.0


def test_a_seeded_rng_makes_policy_delays_reproducible() -> None:
    policy = RetryPolicy(jitter=1.0)
    first = [policy.delay_s(n, random.Random(1)) for n in range(1, 5)]
    assert [policy.delay_s(n, random.Random(1)) for n in range(1, 5)] == first


def test_retry_on_and_no_retry_on_select_exceptions() -> None:
    policy = RetryPolicy(retry_on=(OSError,), no_retry_on=(FileNotFoundError,))
    assert policy.is_retriable(ConnectionError())  # an OSError
    assert not policy.is_retriable(FileNotFoundError())  # no_retry_on wins
    assert not policy.is_retriable(ValueError())  # not in retry_on


def test_by_default_every_exception_is_retried() -> None:
    assert RetryPolicy().is_retriable(ValueError("boom"))


def test_a_retriable_false_class_attribute_is_honoured() -> None:
    class Permanent(Exception):
        retriable = False

    policy = RetryPolicy()
    assert not policy.is_retriable(Permanent())
    assert not policy.is_retriable(ProcessingError("bad"))  # DecatonError default: False
    assert policy.is_retriable(ProducerError("broker down"))  # retriable = True


def test_an_instance_may_override_the_class_flag() -> None:
    exc = ProcessingError("transient this time")
    exc.retriable = True
    assert RetryPolicy().is_retriable(exc)


def test_cancellation_and_interpreter_exit_are_never_retried() -> None:
    policy = RetryPolicy(retry_on=(BaseException,))
    assert not policy.is_retriable(asyncio.CancelledError())
    assert not policy.is_retriable(KeyboardInterrupt())
    assert not policy.is_retriable(SystemExit())


def test_an_explicit_retry_request_is_always_retriable_and_a_skip_never() -> None:
    policy = RetryPolicy(retry_on=(TimeoutError,))
    assert policy.is_retriable(RetryTask("later"))
    assert not RetryPolicy().is_retriable(SkipTask("stale"))


def test_the_runtimes_questions_have_the_policys_answers() -> None:
    policy = RetryPolicy(max_attempts=3, backoff_base_ms=500, jitter=0.0)
    assert [policy.delay_s(n) for n in (1, 2)] == [0.5, 1.0]
    assert policy.exhausted(3)  # attempts used up
    assert not policy.is_retriable(ProcessingError("x"))


def test_the_policy_is_frozen() -> None:
    policy = RetryPolicy()
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.max_attempts = 5  # type: ignore[misc]
    assert dataclasses.replace(policy, max_attempts=5).max_attempts == 5


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_attempts": 0}, "1 disables retries"),
        ({"max_attempts": True}, "max_attempts"),
        ({"backoff_base_ms": -5}, "backoff_base_ms must be an int >= 0"),
        ({"backoff_max_ms": 1.5}, "backoff_max_ms"),
        ({"backoff_base_ms": 2000, "backoff_max_ms": 1000}, "raise the max or lower the base"),
        ({"backoff_factor": 0.9}, "factor"),
        ({"backoff_factor": "2"}, "backoff_factor must be a number"),
        ({"jitter": 2.0}, "jitter"),
        ({"jitter": None}, "jitter must be a number"),
        ({"retry_on": ValueError}, r"tuple of exception classes"),
        ({"no_retry_on": ("ValueError",)}, "no_retry_on"),
    ],
)
def test_bad_policies_are_rejected_with_a_hint(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_methods_reject_an_attempt_of_zero() -> None:
    policy = RetryPolicy()
    with pytest.raises(ConfigError):
        policy.exhausted(0)
    with pytest.raises(ConfigError):
        policy.delay_s(0)


# --------------------------------------------------------------------- control flow


def test_signals_are_exceptions_but_not_errors() -> None:
    """A processor raises them like any exception; nothing classifies them as failures."""
    for signal in (RetryTask(), SkipTask()):
        assert isinstance(signal, TaskControl)
        assert isinstance(signal, Exception)
        assert not isinstance(signal, DecatonError)


def test_retry_task_carries_reason_and_delay() -> None:
    signal = RetryTask("rate limited upstream", delay_s=2.5)
    assert (signal.reason, signal.delay_s, str(signal)) == (
        "rate limited upstream",
        2.5,
        "rate limited upstream",
    )
    assert RetryTask().delay_s is None
    assert SkipTask("stale").reason == "stale"


@pytest.mark.parametrize(
    ("delay", "message"),
    [
        (-1.0, "delay_s must be >= 0"),
        (math.inf, "delay_s must be a finite number of seconds up to"),
        (math.nan, "delay_s must be a finite number of seconds up to"),
        (400 * 86_400.0, "delay_s must be a finite number of seconds up to"),
    ],
)
def test_retry_task_rejects_a_bad_delay(delay: float, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RetryTask(delay_s=delay)
