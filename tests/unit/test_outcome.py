"""The outcome decision on its own: a pure function, checked by its properties and by the
cases each of its answers exists for (no broker, no executor)."""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from decaton_aio.backoff import RetryConfig, RetryPolicy, RetryTask, SkipTask
from decaton_aio.consumer._outcome import Action, Outcome, decide


class Unretried(Exception):
    pass


POLICY = RetryPolicy(max_attempts=3, backoff_base_ms=100, jitter=0.0, no_retry_on=(Unretried,))
QUEUE = RetryConfig(POLICY, "queue")

excs = st.sampled_from(
    [
        None,
        ValueError("boom"),
        Unretried("never again"),
        RetryTask("again"),
        RetryTask("later", delay_s=7.0),
        SkipTask("not this one"),
        asyncio.CancelledError(),
    ]
)
configs = st.sampled_from([None, RetryConfig(POLICY, "queue"), RetryConfig(POLICY, "in_place")])
asked = st.one_of(st.none(), st.just(-1.0), st.floats(min_value=0.0, max_value=60.0))


def ended(
    exc: BaseException | None = None,
    *,
    retry: RetryConfig | None = QUEUE,
    retry_delay_s: float | None = None,
    pending: bool = False,
    retry_count: int = 0,
    attempt: int = 1,
    lane_held: bool = True,
) -> Outcome:
    return decide(
        exc,
        retry_delay_s=retry_delay_s,
        pending=pending,
        retry=retry,
        retry_count=retry_count,
        attempt=attempt,
        lane_held=lane_held,
        rng=random.Random(0),
    )


@given(
    exc=excs,
    retry=configs,
    retry_delay_s=asked,
    pending=st.booleans(),
    retry_count=st.integers(0, 5),
    attempt=st.integers(1, 5),
    lane_held=st.booleans(),
)
def test_every_answer_keeps_the_rules(
    exc: BaseException | None,
    retry: RetryConfig | None,
    retry_delay_s: float | None,
    pending: bool,
    retry_count: int,
    attempt: int,
    lane_held: bool,
) -> None:
    out = ended(
        exc,
        retry=retry,
        retry_delay_s=retry_delay_s,
        pending=pending,
        retry_count=retry_count,
        attempt=attempt,
        lane_held=lane_held,
    )
    # Only a processor failure counts as one (a RetryTask, a skip, a cancellation do not).
    assert out.failed == (isinstance(exc, ValueError | Unretried))
    # A deferral only while a completion is pending and nothing else was asked for.
    assert (out.action is Action.DEFER) == (exc is None and retry_delay_s is None and pending)
    if isinstance(exc, SkipTask | asyncio.CancelledError):
        assert out.action is Action.FINISH
        assert out.why in ("skipped", "cancelled")
    if retry is None:
        assert out.action not in (Action.RETRY_QUEUE, Action.RETRY_IN_PLACE)
    if not lane_held:
        assert out.action is not Action.RETRY_IN_PLACE
    if isinstance(exc, Unretried) and retry is not None:
        assert out.action is Action.DEAD_LETTER
        assert out.error_type == "Unretried"
    if out.action in (Action.RETRY_QUEUE, Action.RETRY_IN_PLACE):
        assert retry is not None
        assert out.action is (
            Action.RETRY_IN_PLACE if retry.mode == "in_place" else Action.RETRY_QUEUE
        )
        failed_attempt = attempt if retry.mode == "in_place" else retry_count + 1
        assert out.attempt == failed_attempt < POLICY.max_attempts
        assert out.delay_s >= 0
    if out.action is Action.DEAD_LETTER:
        assert out.error_type
        assert out.message
    # Retries are not exhausted silently: a retriable ending with attempts left retries.
    retriable = (exc is None and retry_delay_s is not None) or isinstance(
        exc, RetryTask | ValueError
    )
    if retry is not None and retriable and (lane_held or retry.mode == "queue"):
        failed_attempt = attempt if retry.mode == "in_place" else retry_count + 1
        exhausted = failed_attempt >= POLICY.max_attempts
        assert (out.action is Action.DEAD_LETTER) == exhausted


def test_a_returned_task_finishes_or_waits_for_its_completion() -> None:
    assert ended() == Outcome(Action.FINISH)
    assert ended(pending=True) == Outcome(Action.DEFER)


def test_retries_off_log_a_failure_and_dead_letter_an_asked_retry() -> None:
    assert ended(ValueError("x"), retry=None) == Outcome(Action.FINISH, failed=True, why="failed")
    asked_for = ended(retry=None, retry_delay_s=-1.0)
    assert asked_for.action is Action.DEAD_LETTER
    assert asked_for.error_type == "RetryNotConfigured"
    assert ended(RetryTask("x"), retry=None).error_type == "RetryNotConfigured"


def test_queue_mode_counts_the_records_retries_and_in_place_the_runs() -> None:
    queue = RetryConfig(POLICY, "queue")
    assert ended(ValueError(), retry=queue, retry_count=1, attempt=1).action is Action.RETRY_QUEUE
    last = ended(ValueError("x"), retry=queue, retry_count=2, attempt=1)
    assert (last.action, last.error_type, last.message) == (Action.DEAD_LETTER, "ValueError", "x")
    in_place = RetryConfig(POLICY, "in_place")
    again = ended(ValueError(), retry=in_place, retry_count=9, attempt=2)
    assert (again.action, again.attempt) == (Action.RETRY_IN_PLACE, 2)
    assert ended(ValueError(), retry=in_place, attempt=3).action is Action.DEAD_LETTER


def test_the_delay_asked_for_wins_over_the_backoff() -> None:
    assert ended(RetryTask("x", delay_s=7.0)).delay_s == 7.0
    assert ended(retry_delay_s=2.5).delay_s == 2.5
    # -1 (ctx.retry() without a delay) and failures take the policy's backoff: 100 ms.
    assert ended(retry_delay_s=-1.0).delay_s == pytest.approx(0.1)
    assert ended(ValueError()).delay_s == pytest.approx(0.1)
    assert ended(ValueError(), retry_count=1).delay_s == pytest.approx(0.2)


def test_a_released_task_cannot_retry_in_place() -> None:
    in_place = RetryConfig(POLICY, "in_place")
    out = ended(retry=in_place, retry_delay_s=-1.0, lane_held=False)
    assert out.action is Action.DEAD_LETTER
    assert out.message == "a deferred task's retry needs queue mode"
    assert ended(retry_delay_s=-1.0, lane_held=False).action is Action.RETRY_QUEUE


def test_an_exhausted_retry_without_an_exception_says_so() -> None:
    out = ended(retry_delay_s=-1.0, retry_count=2)
    assert (out.action, out.error_type, out.message) == (
        Action.DEAD_LETTER,
        "RetryRequested",
        "retries exhausted",
    )
