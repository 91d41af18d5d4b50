"""Checks of the benchmark harness itself (``make bench-test``), apart from the unit suite:
they time code, which a unit test must not."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.measure import Harness
from bench.run import report_from_log
from bench.taskfacts import Facts, FactsWriter, load_facts, pacer_ack_ms, produce_to_done_ms
from bench.tracker import TRACKERS, measure_tracker
from bench.workload import make_tasks, pace_with_librdkafka, produce_tasks
from decaton_aio.admin import TopicAdmin
from decaton_aio.testing import BrokerHandle


def test_s4_times_the_hot_path_of_every_tracker() -> None:
    """The tracker benchmark completes through mark() for ours and checks every cycle."""
    for name in TRACKERS:
        result = measure_tracker(name, 2000, 0.0)
        assert result["cycles"] >= 3
        assert result["completions_per_s"] > 0


def test_task_facts_round_trip_and_a_cut_record_is_ignored(tmp_path: Path) -> None:
    """What a contender writes is read back whole; a record cut by a kill is dropped."""
    writer = FactsWriter(tmp_path)
    writer.add(7, 1, 10, 100, 200)
    writer.add(8, 2, 11, 150, 260)
    writer.close()
    with open(next(tmp_path.glob("*.facts")), "ab") as f:
        f.write(b"\x01" * 17)  # half a record
    facts = load_facts(tmp_path)
    assert facts.key.tolist() == [7, 8]
    assert facts.offset.tolist() == [10, 11]
    assert facts.last_offsets() == {1: 10, 2: 11}
    assert len(facts.ended_in(0, 250)) == 1


def _facts(rows: list[tuple[int, int, int, int, int]]) -> Facts:
    table = np.array(rows, dtype=np.int64)
    return Facts(*(table[:, i].copy() for i in range(5)))


def test_order_checks_count_overlaps_order_violations_and_duplicates() -> None:
    """A key's task starting before its previous one ended is an overlap; a lower offset
    after a higher one is an order violation; the same offset twice is a duplicate."""
    facts = _facts(
        [
            (1, 0, 0, 0, 10),
            (1, 0, 3, 5, 20),  # overlaps the first
            (1, 0, 2, 30, 40),  # offset 2 after 3
            (2, 0, 1, 0, 10),
            (2, 0, 4, 10, 20),  # ok: starts when the previous ended
            (2, 0, 4, 50, 60),  # offset 4 again: order violation and a duplicate
        ]
    )
    checks = facts.order_checks()
    assert checks["key_overlaps"] == 1
    assert checks["order_violations"] == 2
    assert facts.duplicates() == 1


def test_produce_to_done_joins_on_partition_and_offset_and_bounds_the_unfinished() -> None:
    """Latency is first end minus send time; tasks never done push a percentile that
    falls among them to a lower bound."""
    facts = _facts([(1, 0, 0, 1_002_000_000, 1_005_000_000), (1, 0, 0, 0, 1_009_000_000)])
    sent = {
        "partition": np.array([0, 0], dtype=np.int64),
        "offset": np.array([0, 1], dtype=np.int64),
        "sent_ns": np.array([1_000_000_000, 1_000_000_001], dtype=np.int64),
    }
    out = produce_to_done_ms(facts, sent, 0, 2_000_000_000)
    assert out["sent"] == 2
    assert out["not_done"] == 1
    assert out["p50_ms"] == 5.0
    assert out["p99_ms"] is None
    assert out["p99_ms_lower_bound"] is not None
    # The first end's own start splits its 5 ms: 2 ms before it started, 3 ms running.
    assert (out["wait_p99_ms"], out["run_p99_ms"]) == (2.0, 3.0)


def test_the_own_wait_leaves_out_the_wait_behind_the_keys_previous_task() -> None:
    """A task sent while its key's previous task still ran waits for it whatever the
    runtime: its own wait starts at that task's end; one that starts before it ended (an
    overlap) has none. With every task on a key of its own, all of a wait is its own."""
    ms = 1_000_000
    rows = [
        (1, 0, 0, 0, 10 * ms),  # key 1, runs 0-10 ms
        (1, 0, 1, 11 * ms, 20 * ms),  # key 1, sent at 2 ms: 9 ms wait, 1 ms its own
        (2, 0, 2, 8 * ms, 18 * ms),  # key 2, sent at 3 ms: 5 ms wait, all its own
        (2, 0, 3, 12 * ms, 22 * ms),  # key 2, sent at 4 ms, started inside offset 2
    ]
    sent = {
        "partition": np.zeros(4, dtype=np.int64),
        "offset": np.arange(4, dtype=np.int64),
        "sent_ns": np.array([0, 2, 3, 4], dtype=np.int64) * ms,
    }
    out = produce_to_done_ms(_facts(rows), sent, 0, 100 * ms)
    # Waits 0, 9, 5, 8 ms; own waits 0, 1, 5, 0 ms (p99 interpolates toward the largest).
    assert out["wait_p99_ms"] == pytest.approx(9.0, abs=0.05)
    assert out["wait_own_p99_ms"] == pytest.approx(5.0, abs=0.2)
    assert out["behind_key_share"] == 0.5
    distinct = [(key, *rest) for key, (_, *rest) in enumerate(rows)]
    alone = produce_to_done_ms(_facts(distinct), sent, 0, 100 * ms)
    assert alone["wait_own_p99_ms"] == alone["wait_p99_ms"]
    assert alone["behind_key_share"] == 0.0


def test_pacer_ack_is_the_acknowledgement_delay_of_the_records_sent_in_the_window() -> None:
    """Send to acknowledgement, only for records sent inside the window; nothing without
    the acknowledgement column (a pacer that does not record it)."""
    sent = {
        "partition": np.zeros(3, dtype=np.int64),
        "offset": np.arange(3, dtype=np.int64),
        "sent_ns": np.array([10, 1_000, 2_000], dtype=np.int64) * 1_000_000,
        "acked_ns": np.array([990, 1_004, 2_004], dtype=np.int64) * 1_000_000,
    }
    out = pacer_ack_ms(sent, 500_000_000, 3_000_000_000)
    assert out == {"pacer_ack_p50_ms": 4.0, "pacer_ack_p99_ms": 4.0}
    assert pacer_ack_ms({k: v for k, v in sent.items() if k != "acked_ns"}, 0, 1) == {}


def _machine_line(commit: str = "abc1234") -> dict[str, Any]:
    # A run's first line: its mode, sizes and machine facts.
    return {
        "event": "machine",
        "mode": "full",
        "sizes": {"window_s": 20.0, "repeats": 5},
        "cores": 2,
        "cpu": "test",
        "python": "3.11",
        "platform": "linux",
        "loadavg_at_start": [0.1, 0.1, 0.1],
        "git": {"commit": commit, "dirty_files": 0},
        "versions": {"decaton-aio": "0.1.0"},
    }


def _result_line(**fields: Any) -> dict[str, Any]:
    # A contender's S1 result, as a run prints it.
    return {
        "event": "result",
        "scenario": "S1",
        "contender": "ours",
        "label": "decaton-aio",
        "ordered_by_design": True,
        "batch_based": False,
        "kind": "cli",
        "broker": "apache",
        "setting": {},
        "processes": 1,
        "tasks_per_s": 41234.0,
        "tasks_per_s_min": 40000.0,
        "tasks_per_s_max": 42000.0,
        "repeats": 5,
        "cpu_s_per_1000": 0.024,
        "cpu_util": 1.0,
        "broker_cpu_s_per_1000": 0.003,
        "latency_p50_ms": 12.0,
        "latency_p99_ms": 40.0,
        "order_violations": 0,
        "key_overlaps": 0,
        "duplicates": 0,
        "commit_covered": True,
        "commit_after_s_max": 1.2,
        "window_s": 20.0,
        "measured_tasks": 824680,
        "gc_policy": [50000, 20, 100],
        **fields,
    }


def test_a_stopped_run_still_gets_its_report_from_its_log(tmp_path: Path) -> None:
    """The lines a run printed before it was stopped (the last one cut short) give a
    report of what was measured, marked unfinished; a log that is no run is refused."""
    machine = _machine_line()
    result = _result_line()
    log = tmp_path / "run.log"
    lines = [json.dumps(machine), "# S1: sweep", json.dumps(result), '{"event": "res']
    log.write_text("\n".join(lines))

    report_from_log([log], tmp_path)

    text = (tmp_path / "full.md").read_text()
    assert "Unfinished run" in text
    assert "41,234" in text
    document = json.loads((tmp_path / "full.json").read_text())
    assert [r["contender"] for r in document["results"]] == ["ours"]

    (tmp_path / "other.log").write_text(json.dumps(result))
    with pytest.raises(ValueError, match="no 'machine' line"):
        report_from_log([tmp_path / "other.log"], tmp_path)


def test_runs_of_parts_make_one_report_a_later_part_replacing_an_earlier_one(
    tmp_path: Path,
) -> None:
    """Logs of several runs give one report: a later run that finished a contender's
    scenario replaces the earlier run's rows of it, a part it left unfinished does not,
    the rest stay; a ladder that failed (written without its phase by older runs) is
    replaced by the later ladder and never shows in the S1 table; the report is unfinished
    while a stopped run is not followed by one that ended; runs of another mode are
    refused."""
    first = tmp_path / "first.log"
    ladder_error = _result_line(contender="fast", event="error", error="BufferError: full")
    first.write_text(
        "\n".join(
            json.dumps(row)
            for row in (
                _machine_line("aaaaaaa"),
                _result_line(),
                _result_line(contender="fast", tasks_per_s=90000.0, tasks_per_s_max=90000.0),
                ladder_error,
                {"event": "target", "target": "t"},
            )
        )
    )
    rung = {"share_of_capacity": 0.5, "p50_ms": 11.0, "p99_ms": 20.0, "rate": 45000.0}
    latency = _result_line(
        contender="fast",
        event="latency",
        phase="ladder",
        capacity=90000.0,
        rungs=[rung],
        best_rate_p99_under_bound=45000.0,
    )
    second = tmp_path / "second.log"
    second.write_text(
        "\n".join(
            json.dumps(row)
            for row in (
                _machine_line("bbbbbbb"),
                latency,
                _result_line(scenario="S2", tasks_per_s=100000.0, tasks_per_s_max=100000.0),
                _result_line(tasks_per_s=50505.0, tasks_per_s_max=50505.0),
                # stopped in a sweep: the earlier run's S1 of "fast" stays, S3 is new
                _result_line(contender="fast", event="run", phase="sweep", tasks_per_s=7.0),
                _result_line(scenario="S3", event="run", phase="sweep", tasks_per_s=7.0),
            )
        )
    )

    report_from_log([first, second], tmp_path)

    document = json.loads((tmp_path / "full.json").read_text())
    kept = [(r["scenario"], r["contender"], r["event"]) for r in document["results"]]
    assert kept == [
        ("S1", "fast", "result"),
        ("S1", "fast", "latency"),
        ("S2", "ours", "result"),
        ("S1", "ours", "result"),
        ("S3", "ours", "run"),
    ]
    assert document["unfinished"] == "stopped; report written from second.log"
    text = (tmp_path / "full.md").read_text()
    assert "50,505" in text  # the later S1 of ours
    assert "41,234" not in text
    assert "BufferError" not in text  # the failed ladder, replaced
    assert "45,000" in text
    assert "first.log (tree aaaaaaa): S1; second.log (tree bbbbbbb): L, S2, S1, S3" in text

    # A stopped run followed by one that ended (went on from it, or completed it): done.
    report_from_log([second, first], tmp_path)
    assert not json.loads((tmp_path / "full.json").read_text()).get("unfinished")
    assert "Unfinished run" not in (tmp_path / "full.md").read_text()

    (tmp_path / "quick.log").write_text(json.dumps({**_machine_line(), "mode": "quick"}))
    with pytest.raises(ValueError, match="quick run"):
        report_from_log([first, tmp_path / "quick.log"], tmp_path)


@pytest.mark.timeout(300)
async def test_secured_harness_runs_ours_and_paces_over_sasl_ssl(
    secured_kafka_broker: BrokerHandle, tmp_path: Path
) -> None:
    """With the secured broker's client.properties the harness produces the tasks, runs
    our contender (``run --client-properties``), counts its fetch cycles, awaits its
    commits and paces records through librdkafka, all over SASL_SSL."""
    embedded = secured_kafka_broker.embedded
    assert embedded is not None
    listener = embedded.listeners["SASL_SSL"]
    harness = Harness(
        listener.bootstrap_servers,
        embedded.pids,
        tmp_path,
        sys.executable,
        session_timeout_ms=6000,
        client_properties=str(listener.client_properties),
    )
    assert harness.security.security_protocol == "SASL_SSL"
    admin = TopicAdmin(listener.bootstrap_servers, security=harness.security)
    try:
        topic = await admin.create(3)
        # At most 3 x 10 tasks of 10 ms in flight: 10,000 tasks outlast the window.
        tasks = make_tasks(10_000, keys=1000, partitions=3, sleep_ms=10)
        await produce_tasks(listener.bootstrap_servers, topic, tasks, security=harness.security)
        out = await harness.throughput(
            "ours",
            {"concurrency": 10},
            topic=topic,
            partitions=3,
            end_offsets={},
            warmup_s=0.5,
            window_s=1.0,
            tag="secured-ours",
        )
        assert out["measured_tasks"] > 0
        assert out["fetch_cycles_per_s"] > 0  # read from its metrics page
        assert out["cpu_ms_per_fetch_cycle"] > 0
        assert out["commit"]["covered"], out["commit"]
        assert out["order_violations"] == 0
        paced_topic = await admin.create(3)
        sent = pace_with_librdkafka(
            listener.bootstrap_servers,
            paced_topic,
            rate=200,
            duration_s=0.5,
            keys=100,
            partitions=3,
            sleep_ms=0,
            seq=[0] * 100,
            seed=1,
            security=harness.security,
        )
        assert sent["failed"] == 0
        assert len(sent["offset"]) == sent["produced"] > 0
    finally:
        await admin.close()


def test_capacity_gives_the_ladder_its_pace_and_a_bad_one_exits_with_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--capacity`` names a contender's S1 rate for a ladder run without S1; an
    unknown contender or a rate that is no positive number ends the command."""
    from bench.cli import _parse

    args = _parse(["--only", "L", "--capacity", "ours=60000", "--capacity", "gather=1e4"])
    assert args.capacities == {"ours": 60000.0, "gather": 10000.0}
    for bad in ("nobody=5", "ours=fast", "ours=0"):
        with pytest.raises(SystemExit) as ended:
            _parse(["--capacity", bad])
        assert ended.value.code == 2
        assert "--capacity" in capsys.readouterr().err


def test_ladder_rounds_are_asked_for_and_a_bad_count_exits_with_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--ladder-rounds`` sets how many ladders the judged contenders climb; fewer than one
    ends the command."""
    from bench.cli import _parse

    assert _parse(["--ladder-rounds", "5"]).ladder_rounds == 5
    with pytest.raises(SystemExit) as ended:
        _parse(["--ladder-rounds", "0"])
    assert ended.value.code == 2
    assert "--ladder-rounds wants 1 or more, got 0" in capsys.readouterr().err


def _rung(rate: float, p99: float | None, bound_ms: float = 50.0) -> dict[str, Any]:
    return {
        "rate": rate,
        "p99_ms": p99,
        "p99_under_bound": p99 is not None and p99 < bound_ms,
        "p50_ms": 10.0,
    }


def test_a_ladder_of_several_rounds_takes_the_median_round_at_each_rung() -> None:
    """Each rung is the round with the median p99, whole; a round that ended before a rung
    counts as over the bound there, and the ladder ends where the median round has none."""
    from bench.fair import median_rungs

    rounds = [
        [_rung(10, 30.4), _rung(20, 45.0), _rung(30, 200.0)],
        [_rung(10, 125.1), _rung(20, 90.0)],  # ended at its first rung over the bound
        [{**_rung(10, 43.4), "p50_ms": 12.5}, _rung(20, 48.0), _rung(30, 49.0)],
    ]
    merged = median_rungs(rounds)
    assert [g["p99_ms"] for g in merged] == [43.4, 48.0, 200.0]
    assert merged[0]["p50_ms"] == 12.5  # the median round's figures, not a mix
    assert merged[0]["p99_ms_rounds"] == [30.4, 125.1, 43.4]
    assert [g["rounds_under_bound"] for g in merged] == [2, 2, 1]
    assert [g["p99_under_bound"] for g in merged] == [True, True, False]
    # Two rounds of three without the rung: the ladder ends before it.
    assert (
        len(
            median_rungs([[_rung(10, 30.0), _rung(20, 40.0)], [_rung(10, 99.0)], [_rung(10, 60.0)]])
        )
        == 1
    )
    # A rung whose p99 was not measurable ranks above every measured one.
    assert median_rungs([[_rung(10, None)], [_rung(10, 49.0)]])[0]["p99_ms"] is None
    # One round: its rungs as they are.
    assert [g["p99_ms"] for g in median_rungs([rounds[0]])] == [30.4, 45.0, 200.0]


def test_a_rung_of_several_rounds_shows_their_range_and_passes() -> None:
    from bench.fair import median_rungs
    from bench.report import _p99

    merged = median_rungs([[_rung(10, 30.4)], [_rung(10, 125.1)], [_rung(10, 43.4)]])
    assert _p99(merged[0]) == "43.4 (30.4-125.1, 2/3)"
    ended = median_rungs(
        [[_rung(10, 30.4), _rung(20, 60.0)], [_rung(10, 31.0)], [_rung(10, 32.0), _rung(20, 70.0)]]
    )
    assert _p99(ended[1]) == "70.0 (60.0-70.0, 0/3)"
    assert _p99(_rung(10, 30.4)) == "30.4"
    # No round with a measurable p99: the lower bound, and none passed.
    unmeasured = {**_rung(10, None), "p99_ms_lower_bound": 5000.0}
    assert _p99(median_rungs([[unmeasured], [unmeasured], [unmeasured]])[0]) == "> 5,000 (0/3)"


# ------------------------------------------------------------------ targets (issue 32)


def _runtime_figures(lag_ms: float) -> dict[str, Any]:
    # What bench.loopstats.window_figures gives for a rung of ours.
    return {
        "loop_lag_count": 2000,
        "loop_lag_p50_ms": 0.25,
        "loop_lag_p99_ms": lag_ms,
        "loop_lag_max_ms": 10.0,
        "step_max_ms": 2.5,
        "gc_pause_count": 3,
        "gc_pause_max_ms": 5.0,
        "wait_fetch_p99_ms": 2.0,
        "wait_feed_p99_ms": 0.5,
        "wait_lane_p99_ms": 1.0,
        "wait_slot_p99_ms": 0.1,
        "pending_at_end": 1234,
    }


def _ladder_line(contender: str, capacity: float, best: float | None, **half: Any) -> dict:
    rungs = [
        {"share_of_capacity": 0.25, "rate": capacity / 4, "p50_ms": 11.0, "p99_ms": 20.0},
        {
            "share_of_capacity": 0.5,
            "rate": capacity / 2,
            "p50_ms": 11.0,
            "p99_ms": 30.0,
            "wait_p99_ms": 1.0,
            "cpu_s_per_1000": 0.01,
            "machine": {
                "busy": 1.9,
                "contender": 0.8,
                "broker": 0.4,
                "harness": 0.3,
                "other": 0.4,
                "steal": 0.05,
                "contender_waiting": 0.7,
            },
            **half,
        },
    ]
    return _result_line(
        contender=contender,
        event="latency",
        phase="ladder",
        capacity=capacity,
        rungs=rungs,
        best_rate_p99_under_bound=best,
        processes=0 if contender == "ours-auto" else 1,
    )


def _issue_32_results(good: bool) -> list[dict[str, Any]]:
    """A run's rows where every target of issue 32 passes (``good``) or fails."""
    ours_auto = 160_000.0 if good else 100_000.0
    ours = 80_000.0 if good else 60_000.0
    lag = 1.0 if good else 5.0
    wait = 2.0 if good else 40.0
    rows = [
        _result_line(
            contender="ours-auto",
            processes=3,
            tasks_per_s=ours_auto,
            cpu_s_per_1000=0.011 if good else 0.02,
        ),
        _result_line(tasks_per_s=ours),
        _result_line(
            contender="decaton-virtual", kind="java", tasks_per_s=150_000.0, cpu_s_per_1000=0.0126
        ),
        _result_line(contender="confluent-keyed", kind="python", tasks_per_s=65_000.0),
        _result_line(
            contender="confluent-gather",
            kind="python",
            ordered_by_design=False,
            tasks_per_s=117_000.0,
        ),
        _ladder_line(
            "ours-auto",
            ours_auto,
            80_000.0 if good else 40_000.0,
            wait_p99_ms=wait + 6.0,
            wait_own_p99_ms=wait,
            behind_key_share=0.035,
            pacer_ack_p99_ms=1.5,
            runtime=_runtime_figures(lag),
        ),
        _ladder_line(
            "ours",
            ours,
            40_000.0 if good else 17_641.0,
            wait_p99_ms=wait + 6.0,
            wait_own_p99_ms=wait,
            runtime=_runtime_figures(lag),
        ),
        _ladder_line("decaton-virtual", 150_000.0, 74_429.0),
        _result_line(scenario="S3", contender="ours-auto", tasks_per_s=0.8 * ours_auto),
        _result_line(scenario="S3", tasks_per_s=0.8 * ours),
    ]
    for name, shape in (("S1-P96", (96, 10_000)), ("S1-K1M", (3, 1_000_000))):
        share = 0.95 if good else 0.5
        where = {"partitions": shape[0], "keys": shape[1]}
        rows += [
            _result_line(
                scenario=name, contender="ours-auto", tasks_per_s=share * ours_auto, **where
            ),
            _result_line(scenario=name, tasks_per_s=share * ours, **where),
            {
                **_ladder_line("ours-auto", ours_auto, None, runtime=_runtime_figures(lag)),
                "scenario": name,
            },
            {**_ladder_line("ours", ours, None, runtime=_runtime_figures(lag)), "scenario": name},
        ]
    return rows


_ISSUE_32 = (
    "ours (--workers auto) >= 1.0 x Decaton VIRTUAL_THREAD's",
    "ours one process >= 2 x 17,641/s",
    "not counting the wait behind the key's previous task <= 5 ms",
    "at 50% of our capacity: event loop lag p99 <= 2 ms, ours (--workers auto)",
    "S1 ours (--workers auto) >= 1.0 x Decaton VIRTUAL_THREAD",
    "S1 ours one process >= 1.2 x best key-ordered Python loop",
    "S1 CPU s per 1000 tasks: ours (--workers auto) <= Decaton VIRTUAL_THREAD's",
    "S1-P96 ours (--workers auto) tasks/s >= 0.9 x its S1",
    "S1-P96 at 50% of S1 capacity: event loop lag p99 <= 2 ms",
    "S1-K1M ours (--workers auto) tasks/s >= 0.9 x its S1",
    "S1-K1M at 50% of S1 capacity: event loop lag p99 <= 2 ms",
)


def _verdicts(results: list[dict[str, Any]]) -> dict[str, bool | None]:
    from bench.report import evaluate_targets

    targets = evaluate_targets(results)
    out = {}
    for wanted in _ISSUE_32:
        found = [t for t in targets if wanted in t["target"]]
        assert len(found) == 1, (wanted, [t["target"] for t in targets])
        out[wanted] = found[0]["pass"]
    return out


def test_issue_32_targets_pass_on_good_figures_and_fail_on_bad_ones() -> None:
    """Every target of issue 32 is judged from a run's rows: PASS when ours (deployed or
    one process, as the target says) meets it, FAIL when it does not; the kept targets
    (S3, order, commit) are judged for both of ours."""
    from bench.report import evaluate_targets

    assert set(_verdicts(_issue_32_results(good=True)).values()) == {True}
    bad = _verdicts(_issue_32_results(good=False))
    assert {k for k, v in bad.items() if v is not True} == set(_ISSUE_32), bad
    names = [t["target"] for t in evaluate_targets(_issue_32_results(good=True))]
    for who in ("ours (--workers auto)", "ours one process"):
        assert f"S3 {who} >= 0.7 x its S1" in names
        assert f"S1 {who} per-key order violations and overlaps == 0" in names
    # Today's targets that are replaced are gone.
    assert not [n for n in names if "1.5 x every peer" in n or "batch-based" in n]


def test_the_latency_comparison_when_decaton_has_no_rung_under_the_bound() -> None:
    """Neither side under 50 ms on any rung is no comparison (not a PASS of 0 >= 0); ours
    under it at or above Decaton's lowest rung (37,500/s here) beats Decaton, whose
    highest lies below that rung; ours under it only below that rung is no comparison;
    ours without a rung under it against a Decaton with one is a FAIL."""
    rows = _issue_32_results(good=False)
    for row in rows:
        if row.get("event") == "latency":
            row["best_rate_p99_under_bound"] = None
    wanted = "ours (--workers auto) >= 1.0 x Decaton VIRTUAL_THREAD's"
    assert _verdicts(rows)[wanted] is None
    ours_auto = next(
        r for r in rows if r.get("event") == "latency" and r["contender"] == "ours-auto"
    )
    for best, verdict in ((40_000.0, True), (37_500.0, True), (30_000.0, None)):
        ours_auto["best_rate_p99_under_bound"] = best
        assert _verdicts(rows)[wanted] is verdict, best
    ours_auto["best_rate_p99_under_bound"] = None
    for row in rows:
        if row.get("event") == "latency" and row["contender"] == "decaton-virtual":
            row["best_rate_p99_under_bound"] = 74_429.0
    assert _verdicts(rows)[wanted] is False


def test_ours_paced_at_decatons_highest_rate_settles_the_latency_comparison() -> None:
    """The ladders' rungs fall at different rates: ours as deployed, paced at Decaton's
    highest rate under the bound, passes the comparison when the median round held p99
    under it there, and not when it did not; a row paced at another rate is not read."""
    from bench.fair import median_rungs
    from bench.report import evaluate_targets, render_markdown

    wanted = "ours (--workers auto) >= 1.0 x Decaton VIRTUAL_THREAD's"
    rows = _issue_32_results(good=False)  # ours-auto 40,000/s, Decaton 74,429/s
    assert _verdicts(rows)[wanted] is False

    def at_rival(rate: float, p99s: list[float]) -> dict[str, Any]:
        rung = median_rungs([[_rung(rate, p)] for p in p99s])[0]
        return _result_line(
            contender="ours-auto",
            event="head_to_head",
            phase="ladder",
            against="decaton-virtual",
            rate=rate,
            rung=rung,
        )

    held = at_rival(74_429.0, [44.0, 61.0, 48.0])
    (target,) = [t for t in evaluate_targets([*rows, held]) if t["target"].endswith(wanted)]
    assert target["pass"] is True
    assert target["value"] == 74_429.0
    assert "ours at that rate: p99 48.0 (44.0-61.0, 2/3) ms" in target["detail"]
    assert _verdicts([*rows, at_rival(74_429.0, [44.0, 61.0, 52.0])])[wanted] is False
    assert _verdicts([*rows, at_rival(60_000.0, [20.0, 20.0, 20.0])])[wanted] is False
    document = {
        "mode": "full",
        "finished_at": "now",
        "machine": _machine_line(),
        "sizes": {},
        "results": [*rows, held],
        "targets": evaluate_targets([*rows, held]),
    }
    assert (
        "ours-auto paced at decaton-virtual's highest rate under 50 ms (74,429/s), the "
        "ladders' rungs falling at different rates: p99 48.0 (44.0-61.0, 2/3) ms."
        in render_markdown(document)
    )


def test_issue_32_targets_read_the_rung_nearest_half_and_note_one_process() -> None:
    """The 50% targets read the rung nearest 50% of capacity, also when the shares are
    missing (rate over capacity); the one-process figure is in the note; a target whose
    contender did not run is n/a, not PASS."""
    from bench.report import evaluate_targets

    rows = _issue_32_results(good=True)
    for row in rows:
        for rung in row.get("rungs", []):
            rung.pop("share_of_capacity")
    by_name = {t["target"]: t for t in evaluate_targets(rows)}
    lag = next(t for n, t in by_name.items() if n.startswith("at 50% of our capacity: event"))
    assert lag["pass"] is True
    assert lag["value"] == 1.0
    assert "one process 1.0 ms" in lag["detail"]
    only_ours = [r for r in rows if r["contender"] != "ours-auto"]
    by_name = {t["target"]: t for t in evaluate_targets(only_ours)}
    deployed = [t for n, t in by_name.items() if "ours (--workers auto)" in n]
    assert deployed
    assert all(t["pass"] is None for t in deployed)


def test_report_shows_our_runtime_per_rung_and_the_cost_as_the_work_grows() -> None:
    """The latency section has, for each of our rungs, the loop lag, the longest step,
    GC pauses and the wait split; a section compares the S1 variants with S1."""
    from bench.report import evaluate_targets, render_markdown

    results = _issue_32_results(good=True)
    document = {
        "mode": "full",
        "finished_at": "now",
        "machine": {
            **_machine_line(),
            "page_cache_reclaim": {"action": "pageout", "state": "on", "min_idle_s": 60.0},
        },
        "sizes": {},
        "results": results,
        "targets": evaluate_targets(results),
    }
    text = render_markdown(document)
    assert "loop lag p99 / max ms | longest step ms | GC pauses: n, max ms" in text
    assert "fetch / feed / lane / slot" in text
    assert (
        "| ours-auto | 50% | 80,000 | 11.0 / 30.0 | 8.0 / 2.0 | 1.5 | 0.0100 | 1,234 | 1.0 / 10 |"
        in text
    )
    # Who used the cores during each rung: a rung without the figures shows dashes.
    assert "| busy | contender | broker | harness | other | steal | waiting |" in text
    assert (
        "| ours-auto | 50% | 80,000 | 30.0 | 1.90 | 0.80 | 0.40 | 0.30 | 0.40 | 0.05 | 0.70 |"
        in text
    )
    assert "| ours-auto | 25% | 40,000 | 20.0 | - | - | - | - | - | - | - |" in text
    assert "## Cost as the work grows (ours)" in text
    assert "| S1-P96: 96 partitions, 10,000 keys | ours-auto | **152,000**" in text
    assert "| S1-K1M: 3 partitions, 1,000,000 keys | ours | **76,000**" in text
    assert "idle for 60.0 s (DAMON pageout" in text


def test_the_machines_cpu_is_read_from_proc_stat_and_this_process_counts_apart() -> None:
    """The machine's busy seconds grow while this process spins, by at least what this
    process spent, and never pass the machine's total."""
    from bench.procs import machine_times, own_cpu

    before, mine = machine_times(), own_cpu()
    while own_cpu() - mine < 0.05:
        pass
    after = machine_times()
    spent = own_cpu() - mine
    assert after.busy - before.busy >= spent * 0.5  # clock ticks round each figure
    assert 0 <= after.busy <= after.total
    assert after.steal >= before.steal


def test_loop_figures_give_the_pending_records_at_the_window_end() -> None:
    """The gauge of pending records is summed over partitions and workers at the second
    scrape; the histograms are differences of the two."""
    from bench.loopstats import parse, window_figures

    page = """# TYPE decaton_partition_tasks_pending gauge
decaton_partition_tasks_pending{partition="0",worker="0"} 10.0
decaton_partition_tasks_pending{partition="1",worker="1"} 5.0
# TYPE decaton_event_loop_lag_seconds histogram
decaton_event_loop_lag_seconds_bucket{le="0.001"} %d
decaton_event_loop_lag_seconds_bucket{le="0.002"} %d
decaton_event_loop_lag_seconds_bucket{le="+Inf"} %d
decaton_event_loop_lag_seconds_count %d
decaton_event_loop_lag_seconds_sum 0.1
"""
    before = parse(page % (10, 10, 10, 10))
    after = parse(page % (100, 109, 110, 110))
    figures = window_figures(before, after)
    assert figures["pending_at_end"] == 15
    assert (
        window_figures(before, after, parse(page.replace(" 5.0", " 1.0") % (0, 0, 0, 0)))[
            "pending_at_end"
        ]
        == 11
    )
    assert figures["loop_lag_count"] == 100
    assert figures["loop_lag_p50_ms"] == 1.0
    assert figures["loop_lag_p99_ms"] == 2.0


def test_a_run_starts_from_a_topic_log_read_once_and_knows_what_was_resident(
    tmp_path: Path,
) -> None:
    """The topic's segment files are found by partition directory, read once, and their
    residency told by mincore; without a broker's log directory only sync happens."""
    from bench.pagecache import resident_bytes, settle_topic, topic_log_files, warm

    for partition in (0, 1):
        folder = tmp_path / f"bench-s1-x-{partition}"
        folder.mkdir()
        (folder / "00000000000000000000.log").write_bytes(b"r" * 100_000)
        (folder / "00000000000000000000.index").write_bytes(b"i" * 10)
    (tmp_path / "bench-s1-x-other-0").mkdir()  # another topic whose name starts the same
    files = topic_log_files([tmp_path], "bench-s1-x")
    assert [f.parent.name for f in files] == ["bench-s1-x-0", "bench-s1-x-1"]
    assert warm(files) == 200_000
    assert resident_bytes(files[0]) == 100_000
    assert settle_topic([], "bench-s1-x")["log_bytes"] is None


def test_ours_as_deployed_runs_with_workers_auto_and_topics_fit_the_fastest() -> None:
    """The deployed contender is started with --workers auto; a repeat's topic holds
    records for 1.3 times the fastest sweep run, in steps of 100,000."""
    from bench.measure import command_line
    from bench.scenarios import FULL, plan
    from bench.workload import RunSpec

    spec = RunSpec("ours-auto", "127.0.0.1:9092", "t", "g", 3, "/tmp/facts")
    argv = command_line(spec, sys.executable)
    assert argv[argv.index("--workers") + 1] == "auto"
    one = command_line(RunSpec("ours", "b", "t", "g", 3, "/tmp/facts"), sys.executable)
    assert one[one.index("--workers") + 1] == "1"
    cores = command_line(RunSpec("ours-cores", "b", "t", "g", 3, "/tmp/facts"), sys.executable)
    assert cores[cores.index("--workers") + 1] == str(len(os.sched_getaffinity(0)))
    # A ConsumerConfig field goes to its `run` flag, anything else is a property.
    opts = {"busy_fetch_min_bytes": 0, "max_fetch_records": 50, "concurrency": 8}
    tuned = command_line(
        RunSpec("ours", "b", "t", "g", 3, "/tmp/facts", options=opts), sys.executable
    )
    assert tuned[tuned.index("--busy-fetch-min-bytes") + 1] == "0"
    assert tuned[tuned.index("--max-poll-records") + 1] == "50"
    assert "decaton.partition.concurrency=8" in tuned
    s1 = next(s for s in plan(False)[1] if s.name == "S1")
    assert FULL.records(s1, 20.0) == 3_000_000
    assert FULL.records(s1, 20.0, fastest=169_000.0) == 5_800_000


def test_the_key_shares_run_every_key_once_and_in_the_runs_group_first() -> None:
    from bench.contenders.keyshare import IGNORE, KEYS, share_commands
    from bench.workload import RunSpec

    spec = RunSpec("ours-keyshare", "b:9092", "t", "g", 3, "/facts", {"concurrency": 7})
    commands = share_commands(spec, 3, "py")
    run = set(range(KEYS))
    kept = []
    for argv in commands:
        assert argv[-2] == "--property"
        assert argv[-1].startswith(f"{IGNORE}=")
        kept.append(run - {int(k) for k in argv[-1].removeprefix(f"{IGNORE}=").split(",")})
    assert set().union(*kept) == run  # every key runs somewhere
    assert sum(len(k) for k in kept) == KEYS  # and in one share only
    assert all(KEYS / 3 * 0.9 < len(k) < KEYS / 3 * 1.1 for k in kept)
    groups = [argv[argv.index("--group") + 1] for argv in commands]
    assert groups == ["g", "g-share-1", "g-share-2"]
    assert all("decaton.partition.concurrency=7" in argv for argv in commands)


def test_an_option_measured_on_request_runs_only_when_named() -> None:
    from bench.scenarios import plan

    s1 = next(s for s in plan(False)[1] if s.name == "S1")
    assert not {"ours-keyshare", "ours-cores"} & set(s1.chosen([]))
    assert {"ours", "ours-auto", "decaton-virtual"} <= set(s1.chosen([]))
    assert s1.chosen(["ours-keyshare", "ours"]) == ["ours", "ours-keyshare"]


def test_resume_goes_on_from_the_s1_a_stopped_run_found(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--resume LOG`` takes each contender's S1 best setting and capacity from LOG on the
    run's broker, runs the scenarios after the ladder unless ``--only`` says otherwise, and
    ends the command with one line for a log that is missing or holds no S1 result."""
    from bench.cli import _parse
    from bench.run import resumed

    def line(**fields: object) -> str:
        return json.dumps(fields)

    log = tmp_path / "run.jsonl"
    log.write_text(
        "\n".join(
            [
                "S1: starting",
                line(event="machine", mode="full"),
                line(
                    event="result",
                    scenario="S1",
                    broker="apache",
                    contender="ours",
                    setting={"concurrency": 1000},
                    tasks_per_s=73455.0,
                ),
                line(
                    event="result",
                    scenario="S1",
                    broker="tansu",
                    contender="ours",
                    setting={},
                    tasks_per_s=10.0,
                ),
                line(
                    event="result",
                    scenario="S3",
                    broker="apache",
                    contender="gather",
                    setting={"batch_records": 500},
                    tasks_per_s=999.0,
                ),
                '{"event": "result", "scenario": "S1", "cut short',
            ]
        )
    )
    assert resumed(log, "apache") == ({"ours": {"concurrency": 1000}}, {"ours": 73455.0})
    with pytest.raises(ValueError, match="no S1 result on apache sasl"):
        resumed(log, "apache sasl")
    args = _parse(["--resume", str(log)])
    assert "S1" not in args.only
    assert "L" not in args.only
    assert {"S2", "S3", "S1-P96", "S4"} <= set(args.only)
    assert _parse(["--resume", str(log), "--only", "s2"]).only == ["S2"]
    with pytest.raises(SystemExit) as ended:
        _parse(["--resume", str(tmp_path / "missing.jsonl")])
    assert ended.value.code == 2
    assert "--resume: no such log" in capsys.readouterr().err
