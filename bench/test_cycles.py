"""The fetch cycle figures (``make bench-test``): counted from two scrapes of our metrics
page, set beside the CPU of the window, tabled in the report for ours only, and the
command line of ``python -m bench.cycles``."""

from __future__ import annotations

from typing import Any

import pytest

from bench.cycles import BASELINE, _parse, cycle_figures, cycle_table, fetch_cycles
from bench.fetchloop import IMPLS, fetch_loop_table, loop_figures
from bench.loopstats import parse

_PAGE = """# TYPE decaton_consumer_fetch_latency_seconds histogram
decaton_consumer_fetch_latency_seconds_bucket{le="0.1",worker="1"} %d
decaton_consumer_fetch_latency_seconds_bucket{le="+Inf",worker="1"} %d
decaton_consumer_fetch_latency_seconds_bucket{le="0.1",worker="2"} %d
decaton_consumer_fetch_latency_seconds_bucket{le="+Inf",worker="2"} %d
"""


def test_fetch_cycles_are_every_workers_fetch_calls_between_two_scrapes() -> None:
    """The fetch latency histogram's count grows by one per fetch call: the difference of
    two scrapes, summed over the workers; no count without both scrapes."""
    opened = parse(_PAGE % (10, 12, 5, 5))
    closed = parse(_PAGE % (300, 312, 205, 225))
    assert fetch_cycles(opened, closed) == 300 + 220
    assert fetch_cycles(opened, None) is None
    assert fetch_cycles(None, closed) is None


def test_cycle_figures_divide_the_windows_cpu_by_its_cycles() -> None:
    """1,000 cycles and 2 CPU seconds over 10 s: 100 cycles/s at 2 ms each; a window
    without counted cycles has no figures, and none without a cycle has no CPU per
    cycle."""
    assert cycle_figures(2.0, 10.0, 1000) == {
        "fetch_cycles": 1000,
        "fetch_cycles_per_s": 100.0,
        "cpu_ms_per_fetch_cycle": 2.0,
    }
    assert cycle_figures(2.0, 10.0, None) == {}
    assert cycle_figures(2.0, 10.0, 0)["cpu_ms_per_fetch_cycle"] is None


def _rung(share: float, **fields: Any) -> dict[str, Any]:
    return {"share_of_capacity": share, "rate": 13_000, "cpu_s_per_1000": 0.04, **fields}


def test_the_report_tables_the_cycles_of_each_run_and_rung_of_ours() -> None:
    """A rung of ours as deployed (a supervisor and 3 workers) gives its cycles per
    worker and its p99, a lower bound for a rung that fell behind; the full-speed result
    of one process gives its own; a peer's rows and a rung that counted no cycles are
    left out."""
    counted = {"fetch_cycles_per_s": 360.0, "cpu_ms_per_fetch_cycle": 1.5}
    rows = [
        {
            "event": "latency",
            "scenario": "S1-P96",
            "partitions": 96,
            "contender": "ours-auto",
            "rungs": [
                _rung(
                    0.1,
                    tree_processes=4,
                    broker_cpu_s_per_1000=0.02,
                    p99_ms=22.5,
                    machine={"busy": 1.5, "other": 0.25},
                    **counted,
                ),
                _rung(0.25, tree_processes=4, p99_ms_lower_bound=8014.0, **counted),
                _rung(0.5, tree_processes=4),
            ],
        },
        {
            "event": "result",
            "scenario": "S1",
            "partitions": 3,
            "contender": "ours",
            "tasks_per_s": 80_000.0,
            "tree_processes": 1,
            "cpu_s_per_1000": 0.0121,
            **counted,
        },
        {"event": "latency", "scenario": "S1", "contender": "gather", "rungs": [_rung(0.1)]},
    ]
    text = "\n".join(cycle_table(rows))
    row = "| 10% | 13,000 | 22.5 | 3 | 360 | 120 | 1.500 | 0.0400 | 0.0200 | 1.50 (0.25) |"
    assert f"| S1-P96 | 96 | ours-auto {row}" in text
    assert "| S1-P96 | 96 | ours-auto | 25% | 13,000 | > 8,014 | 3 | 360 |" in text  # behind
    full = "| S1 | 3 | ours | full speed | 80,000 | - | 1 | 360 | 360 | 1.500 | 0.0121 | - |"
    assert full in text
    assert "50%" not in text
    assert "gather" not in text
    assert cycle_table(rows[2:]) == []


def test_the_command_paces_ours_at_the_recorded_capacities_unless_told_otherwise() -> None:
    """By default each of ours is paced at its recorded capacity with its recorded
    setting; ``--capacity`` and ``--set`` replace them; a peer is refused."""
    args = _parse([])
    assert args.contenders == ["ours-auto"]
    assert args.partitions == [3, 96]
    assert args.capacities == {"ours-auto": BASELINE["ours-auto"][0]}
    args = _parse(
        ["--contenders", "ours", "--capacity", "ours=50000", "--set", "ours.concurrency=384"]
    )
    assert args.capacities == {"ours": 50_000.0}
    assert args.settings["ours"]["concurrency"] == 384
    with pytest.raises(SystemExit):
        _parse(["--contenders", "gather"])


def test_a_fetch_loops_figures_divide_its_cpu_by_its_cycles_and_records() -> None:
    """300 calls and 0.6 s of CPU over 15 s for 15,000 records, the broker 3 s: 20 calls
    a second at 2 ms each, 0.04 s per 1,000 records, the broker 0.2."""
    row = {"cycles": 300, "cpu_s": 0.6, "window_s": 15.0, "records": 15_000, "broker_cpu_s": 3.0}
    assert loop_figures(row) == {
        "cycles_per_s": 20.0,
        "cpu_ms_per_cycle": 2.0,
        "cpu_cores": 0.04,
        "records_per_s": 1000,
        "cpu_s_per_1000": 0.04,
        "broker_cpu_s_per_1000": 0.2,
    }
    idle = loop_figures({**row, "records": 0})
    assert idle["cpu_s_per_1000"] is None
    assert idle["cpu_ms_per_cycle"] == 2.0


def test_the_fetch_loops_table_has_a_row_per_loop_and_the_requests_of_ours() -> None:
    base = {"event": "fetch_loop", "partitions": 96, "rate": 1000.0, "cycles": 10}
    base.update(cpu_s=0.1, window_s=1.0, records=100, broker_cpu_s=0.5)
    rows = [
        {**base, "impl": "aiokafka", **loop_figures(base)},
        {**base, "impl": "ours", "requests": 12, "incremental_requests": 11, **loop_figures(base)},
        {"event": "fetch_loop", "impl": "ours", "partitions": 3},  # failed: no figures
        {"event": "result", "contender": "ours"},
    ]
    lines = fetch_loop_table(rows)
    body = [line for line in lines if line.startswith("| 96 |")]
    assert len(body) == 2
    assert "| aiokafka |" in body[0]
    assert "| - |" in body[0]
    assert "| 12 (11) |" in body[1]
    assert "| 10.000 |" in body[1]  # CPU ms per cycle
    assert fetch_loop_table([]) == []


def test_the_command_measures_the_fetch_loops_when_asked() -> None:
    args = _parse(["--fetch-loops", "--rates", "500", "--impls", "aiokafka,ours"])
    assert args.fetch_loops
    assert args.rates == [500.0]
    assert args.impls == ["aiokafka", "ours"]
    assert _parse([]).impls == list(IMPLS)
    with pytest.raises(SystemExit):
        _parse(["--fetch-loops", "--impls", "confluent"])
