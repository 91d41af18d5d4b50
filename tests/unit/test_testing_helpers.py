"""The assertion helpers users run over a drain: they pass on good runs and fail on bad
ones, naming what broke."""

from __future__ import annotations

import pytest

from decaton_aio.producer import RecordLocation
from decaton_aio.testing import DrainResult, ProcessedTask


def done(offset: int, key: bytes | None, partition: int = 0) -> ProcessedTask:
    return ProcessedTask("t", partition, offset, key, None)


def test_per_key_order_passes_when_each_key_completes_in_offset_order() -> None:
    result = DrainResult([done(0, b"a"), done(1, b"b"), done(2, b"a"), done(0, b"a", 1)])
    result.assert_per_key_order()  # other keys and partitions interleave freely


def test_per_key_order_fails_on_a_key_out_of_order() -> None:
    result = DrainResult([done(0, b"a"), done(2, b"a"), done(1, b"a")])
    with pytest.raises(AssertionError, match=r"key b'a' in t-0: offset 1 completed after offset 2"):
        result.assert_per_key_order()


def test_per_key_order_ignores_tasks_without_a_key() -> None:
    DrainResult([done(2, None), done(1, None)]).assert_per_key_order()


def test_at_least_once_passes_with_every_task_and_duplicates() -> None:
    result = DrainResult([done(0, b"a"), done(1, b"a"), done(0, b"a")])
    result.assert_at_least_once([RecordLocation("t", 0, 0), RecordLocation("t", 0, 1)])
    assert result.duplicates() == 1


def test_at_least_once_fails_naming_the_missing_task() -> None:
    result = DrainResult([done(0, b"a")])
    with pytest.raises(AssertionError, match=r"1 tasks never processed.*offset=1"):
        result.assert_at_least_once([RecordLocation("t", 0, 0), RecordLocation("t", 0, 1)])


def test_per_key_order_fails_when_two_tasks_of_a_key_overlapped() -> None:
    """Completion order alone can look right while two tasks of a key ran at once."""
    first, second = done(0, b"a"), done(1, b"a")
    result = DrainResult([first, second], overlaps=[(first, second)])
    with pytest.raises(AssertionError, match="offset 1 started while offset 0 was running"):
        result.assert_per_key_order()
