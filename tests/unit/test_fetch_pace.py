"""The fetch pacer: busy settings while fetch calls return records, idle ones after one
that returned nothing."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs

from decaton_aio.consumer._fetch_pace import FetchPacer

IDLE = (1, 100)
BUSY = (16384, 5)


def _fetcher() -> SimpleNamespace:
    return SimpleNamespace(_fetch_min_bytes=IDLE[0], _fetch_max_wait_ms=IDLE[1])


def _settings(fetcher: SimpleNamespace) -> tuple[int, int]:
    return (fetcher._fetch_min_bytes, fetcher._fetch_max_wait_ms)


@given(st.lists(st.booleans(), max_size=30))
def test_the_next_request_follows_the_last_fetch_call(outcomes: list[bool]) -> None:
    fetcher = _fetcher()
    pacer = FetchPacer.of(SimpleNamespace(_fetcher=fetcher), idle=IDLE, busy=BUSY)
    assert pacer is not None
    for got in outcomes:
        pacer.after(got)
        assert pacer.busy is got
        assert _settings(fetcher) == (BUSY if got else IDLE)
    if not outcomes:
        assert _settings(fetcher) == IDLE


def test_busy_asking_no_more_than_idle_turns_pacing_off() -> None:
    consumer = SimpleNamespace(_fetcher=_fetcher())
    assert FetchPacer.of(consumer, idle=IDLE, busy=(0, 5)) is None
    assert FetchPacer.of(consumer, idle=(4096, 100), busy=(4096, 5)) is None


def test_a_fetcher_without_the_settings_leaves_pacing_off_and_says_so() -> None:
    with capture_logs() as logs:
        assert FetchPacer.of(SimpleNamespace(_fetcher=object()), idle=IDLE, busy=BUSY) is None
        assert FetchPacer.of(SimpleNamespace(), idle=IDLE, busy=BUSY) is None
    assert [e["log_level"] for e in logs] == ["warning", "warning"]
    assert all(e["event"].startswith("fetch pacing is off") for e in logs)
