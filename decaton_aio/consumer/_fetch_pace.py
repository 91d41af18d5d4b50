"""Fetch pacing: what the broker is asked to gather per fetch, by whether records flow.

A fetch that asks for one byte is answered as soon as a record arrives. Under a steady
load that answer holds a few records, and each fetch costs its request, its response's
parsing and a pass of the fetch routine: paced at a quarter of its capacity, one process
spent twice the CPU per task of a run at full speed. While records flow, the pacer asks
the broker to gather ``busy_fetch_min_bytes`` or wait ``busy_fetch_max_wait_ms``,
whichever comes first: a few milliseconds more per record, and at that pace half the CPU
per task (``docs/operations.md`` has the figures).
Once a fetch call returns nothing, it goes back to the idle settings (``fetch_min_bytes``
and ``fetch_max_wait_ms``): the first record after a quiet spell is answered at once, and
an idle consumer does not ask the broker every few milliseconds.

aiokafka builds each fetch request from its fetcher's settings of the moment; the pacer
sets those two (`set_fetch_pacing()`, checked when the pacer is
made). The consumer's own fetch loop (`decaton_aio.consumer.fetch.Fetcher`) takes them
through its `set_pacing()`.

Caller: the subscription's fetch routine only, after each fetch call (`after()`).
"""

from __future__ import annotations

from typing import Any

import structlog

from decaton_aio._aiokafka import fetch_pacing, set_fetch_pacing
from decaton_aio.consumer.fetch import Fetcher

__all__ = ["FetchPacer"]

log = structlog.get_logger("decaton_aio.consumer")


class FetchPacer:
    """Switches a fetcher between its idle and busy settings.

    Args:
        consumer: the aiokafka consumer (or the consumer's own `Fetcher`) whose fetch
            requests are paced.
        idle: ``(min_bytes, max_wait_ms)`` after a fetch call that returned nothing.
        busy: ``(min_bytes, max_wait_ms)`` after one that returned records.
    """

    def __init__(self, consumer: Any, idle: tuple[int, int], busy: tuple[int, int]) -> None:
        self._consumer = consumer
        self._settings = {False: idle, True: busy}
        self.busy = False

    @classmethod
    def of(cls, consumer: Any, idle: tuple[int, int], busy: tuple[int, int]) -> FetchPacer | None:
        """The pacer of ``consumer``'s fetcher; None when busy asks for no more than idle
        (pacing off) or the fetcher has not the settings it sets (logged)."""
        if busy[0] <= idle[0]:
            return None
        if isinstance(consumer, Fetcher):
            return cls(consumer, idle, busy)
        if fetch_pacing(consumer) is None:
            log.warning(
                "fetch pacing is off: this aiokafka's fetcher has not the settings it sets; "
                "fetches use fetch_min_bytes and fetch_max_wait_ms throughout"
            )
            return None
        return cls(consumer, idle, busy)

    def after(self, got_records: bool) -> None:
        """Note a fetch call's outcome; the next fetch request asks with the settings it
        calls for."""
        if got_records is self.busy:
            return
        self.busy = got_records
        min_bytes, max_wait_ms = self._settings[got_records]
        if isinstance(self._consumer, Fetcher):
            self._consumer.set_pacing(min_bytes, max_wait_ms)
        else:
            set_fetch_pacing(self._consumer, min_bytes, max_wait_ms)
