"""Checks of the benchmark harness itself (``make bench-test``), apart from the unit suite:
they time code, which a unit test must not."""

from __future__ import annotations

from bench.tracker import TRACKERS, measure_tracker


def test_s4_times_the_hot_path_of_every_tracker() -> None:
    """The tracker benchmark completes through mark() for ours and checks every cycle."""
    for name in TRACKERS:
        result = measure_tracker(name, 2000, 0.0)
        assert result["cycles"] >= 3
        assert result["completions_per_s"] > 0
