"""The fetch pacer: busy settings while fetch calls return records, idle ones after one
that returned nothing."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs

from decaton_aio._aiokafka import fetch_pacing
from decaton_aio.consumer._fetch_pace import FetchPacer
from decaton_aio.consumer.fetch import FetchConfig, Fetcher

IDLE = (1, 100)
BUSY = (16384, 5)


def _fetcher() -> SimpleNamespace:
    """A stand-in for aiokafka's fetcher, with the two settings its requests are built from."""
    return SimpleNamespace(_fetch_min_bytes=IDLE[0], _fetch_max_wait_ms=IDLE[1])


@given(st.lists(st.booleans(), max_size=30))
def test_the_next_request_follows_the_last_fetch_call(outcomes: list[bool]) -> None:
    consumer = SimpleNamespace(_fetcher=_fetcher())
    pacer = FetchPacer.of(consumer, idle=IDLE, busy=BUSY)
    assert pacer is not None
    for got in outcomes:
        pacer.after(got)
        assert pacer.busy is got
        assert fetch_pacing(consumer) == (BUSY if got else IDLE)
    if not outcomes:
        assert fetch_pacing(consumer) == IDLE


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


def test_the_consumers_own_fetch_loop_is_paced_through_its_setting() -> None:
    fetcher = Fetcher(object(), FetchConfig(min_bytes=IDLE[0], max_wait_ms=IDLE[1]))
    pacer = FetchPacer.of(fetcher, idle=IDLE, busy=BUSY)
    assert pacer is not None
    pacer.after(True)
    assert fetcher.pacing == BUSY
    pacer.after(False)
    assert fetcher.pacing == IDLE
