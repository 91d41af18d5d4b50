"""The soak's checks (tests/soak/checks.py) pass on good data and fail on bad data."""

from __future__ import annotations

import math

import pytest

from decaton_aio.metrics import Metrics
from tests.soak.checks import (
    Disturbance,
    Incarnation,
    Reading,
    TaskLog,
    growth_failures,
    parse_metrics,
    plan,
    recovery_failures,
    steady_window,
)
from tests.soak.soak_app import fate


@pytest.mark.parametrize("minutes", [3, 30])
def test_every_disturbance_happens_within_the_run(minutes: int) -> None:
    """A rolling restart every 5 minutes (30) or every minute (3), the broker restart
    right before a roll other than the first, and room for six reads after the warm-up
    of an incarnation that lives from one roll to the next."""
    p = plan(minutes)
    assert p.duration_s == minutes * 60
    assert p.rolls == ((300.0, 600.0, 900.0, 1200.0, 1500.0) if minutes == 30 else (60.0, 120.0))
    assert p.broker_at_s in p.rolls[1:]
    assert p.sample_s == (10 if minutes == 30 else 3)
    assert p.warmup_s + 6 * p.sample_s < p.rolls[1] - p.rolls[0]


def test_the_steady_window_lies_between_episodes() -> None:
    """From the warm-up, or the end of the episode an incarnation was born in, to the
    next episode."""
    episodes = [(60.0, 80.0), (120.0, 130.0), (130.0, 160.0)]
    assert steady_window(-20.0, 30, episodes) == (30.0, 60.0)  # born before the paced phase
    assert steady_window(61.0, 30, episodes) == (91.0, 120.0)
    assert steady_window(62.0, 10, episodes) == (80.0, 120.0)  # the roll it was born in
    assert steady_window(75.0, 50, episodes) == (160.0, math.inf)  # warm in the broker's
    assert steady_window(135.0, 30, episodes) == (165.0, math.inf)


def _reading(rss: float = 100.0, fds: float = 30, tasks: float = 20, parked: float = 0) -> Reading:
    return Reading(
        rss_mb=rss, fds=fds, tasks=tasks, parked=parked, pending=0, commit_age_s=0.5, lag=0
    )


def _incarnation(readings: list[Reading]) -> Incarnation:
    return Incarnation("i0#1", 0.0, [(float(t), r) for t, r in enumerate(readings)])


def test_steady_or_bursty_readings_do_not_count_as_growth() -> None:
    """RSS within 5%, descriptors and tasks that rise and fall back pass, and so do
    descriptors closed for a while early (a broker restart) and open again late, and
    parked workers that step up with a new peak of concurrency."""
    readings = [_reading(100 + t % 3, 30 + 5 * (t % 2), 20 + 40 * (t == 10)) for t in range(12)]
    figures, failures = growth_failures(_incarnation(readings), warm_from=0)
    assert failures == []
    assert figures["readings"] == 12
    assert figures["rss_growth_pct"] < 5
    dip = [_reading(fds=21)] * 3 + [_reading(fds=17)] * 3 + [_reading(fds=21)] * 6
    assert growth_failures(_incarnation(dip), warm_from=3)[1] == []
    parked = [_reading(tasks=200, parked=180)] * 6 + [_reading(tasks=260, parked=240)] * 6
    parked[-2] = _reading(tasks=262, parked=91)  # a burst woke the parked workers
    assert growth_failures(_incarnation(parked), warm_from=0)[1] == []


def test_growth_of_rss_descriptors_or_tasks_fails() -> None:
    """RSS up 10%, a descriptor and two tasks leaked per reading."""
    leaking = [_reading(100 + t, 30 + t, 20 + 2 * t) for t in range(12)]
    _, failures = growth_failures(_incarnation(leaking), warm_from=0)
    assert len(failures) == 3
    assert "RSS grew" in failures[0]
    assert "fds grew" in failures[1]
    assert "tasks grew" in failures[2]


def test_readings_before_warm_up_or_too_few_are_not_judged() -> None:
    """Warm-up growth is not judged; nor is an incarnation with fewer than six reads
    after it, or reads before the runtime counted its tasks."""
    warming = [_reading(50 + 10 * t) for t in range(5)] + [_reading() for _ in range(6)]
    assert growth_failures(_incarnation(warming), warm_from=5) == (
        {"readings": 6, "rss_mb": [100.0, 100.0], "rss_growth_pct": 0.0, "fds": [30, 30]}
        | {"tasks": [20, 20]},
        [],
    )
    assert growth_failures(_incarnation([_reading()] * 5), warm_from=0) == ({}, [])
    late_burst = [_reading()] * 8 + [_reading(130, 40, 90)] * 4
    assert growth_failures(_incarnation(late_burst), warm_from=0, until=8) == (
        {"readings": 8, "rss_mb": [100.0, 100.0], "rss_growth_pct": 0.0, "fds": [30, 30]}
        | {"tasks": [20, 20]},
        [],
    )
    uncounted = [_reading(tasks=-1)] * 3 + [_reading()] * 5
    assert growth_failures(_incarnation(uncounted), warm_from=0) == ({}, [])


def test_a_disturbance_whose_lag_does_not_go_back_to_0_fails() -> None:
    recovered = Disturbance("restart i0", began=10, ended=15, recovered=20)
    assert recovered.recovery_s == 5
    assert recovery_failures([recovered], limit_s=60) == []
    slow = Disturbance("restart i1", began=10, ended=15, recovered=90)
    never = Disturbance("broker restart", began=100, ended=120)
    stuck = Disturbance("restart i2", began=200)
    failures = recovery_failures([recovered, slow, never, stuck], limit_s=60)
    assert failures == [
        "restart i1 at 10 s: the lag did not go back to 0 within 60 s (it took 75 s)",
        "broker restart at 100 s: the lag did not go back to 0 within 60 s",
        "restart i2 at 200 s never ended",
    ]


def test_metrics_pages_are_read_into_readings() -> None:
    """RSS and descriptors from the process metrics, tasks from the subscription, and
    pending records, commit ages and lag over the partitions."""
    metrics = Metrics()
    sub = metrics.register_subscription("sub", ("running",))
    sub.tasks, sub.parked = 17, 9
    for partition, pending in ((0, 5), (1, 7)):
        stats = metrics.register_partition("sub", "t", partition)
        stats.pending, stats.committed_offset, stats.high_watermark = pending, 10, 10 + pending
    reading = parse_metrics(metrics.render().decode())
    assert reading.rss_mb > 1
    assert reading.fds > 2
    assert (reading.tasks, reading.parked, reading.pending, reading.lag) == (17, 9, 12, 12)
    assert 0 <= reading.commit_age_s < 60


def _log(*lines: str) -> list[str]:
    return [f"{line}\n" for line in lines]


def _dead(tasks: int) -> list[int]:
    return [n for n in range(tasks) if fate(n) in ("always fails", "rejected")]


def test_a_log_where_every_task_ran_in_key_order_passes() -> None:
    """Keys in offset order, a rebalance letting a key start again at its committed
    point, a retry run on the retry topic, and the dead-lettered tasks."""
    tasks = 5  # task 1 fails once, 2 retries once, 3 and 4 are dead-lettered
    log = TaskLog(tasks)
    log.read(
        "i0#1",
        _log(
            "s m 0 0 k0 0", "e m 0 0 k0 0 ok",
            "s m 0 1 k0 1", "e m 0 1 k0 1 failed",
            "epoch",
            "s m 0 1 k0 1", "e m 0 1 k0 1 failed",  # again after the rebalance
            "s m 0 2 k0 2", "e m 0 2 k0 2 retry",
            "s r 0 0 k0 1", "e r 0 0 k0 1 ok",
            "s r 0 1 k0 2", "s m 1 0 k1 3", "e r 0 1 k0 2 ok", "e m 1 0 k1 3 failed",
            "s m 0 3 k0",  # cut short
        ),
    )  # fmt: skip
    counts, failures = log.failures(_dead(tasks))
    assert failures == []
    assert counts["processed"] == 3
    assert counts["dead_lettered"] == 2
    assert counts["lines_cut"] == 1
    assert counts["runs"] == 7


def test_a_log_with_a_key_out_of_order_or_overlapping_fails() -> None:
    log = TaskLog(2)
    log.read("i0#1", _log("s m 0 1 k0 1", "e m 0 1 k0 1 ok", "s m 0 0 k0 0", "e m 0 0 k0 0 ok"))
    log.read("i1#1", _log("s m 0 0 k0 0", "s m 0 1 k0 1", "e m 0 0 k0 0 ok", "e m 0 1 k0 1 ok"))
    counts, failures = log.failures([])
    assert failures == [
        "i0#1: key k0 in m-0: 0 started after 1",
        "i1#1: key k0 in m-0: 1 started while 0 ran",
    ]
    assert (counts["out_of_order"], counts["overlaps"]) == (1, 1)


def test_a_task_neither_processed_nor_dead_lettered_fails() -> None:
    """A task lost, a task dead-lettered that should have been processed, a task that
    was never produced."""
    log = TaskLog(5)
    log.read("i0#1", _log("s m 0 0 k0 0", "e m 0 0 k0 0 ok", "s m 0 1 k0 9", "e m 0 1 k0 9 ok"))
    _, failures = log.failures([0, 3])
    assert failures == [
        "i0#1: task 9 was never produced",
        "3 tasks neither processed nor dead-lettered, e.g. [1, 2, 4]",
        "1 tasks dead-lettered that should not be: [0]",
    ]
