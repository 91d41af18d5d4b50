"""The rebalance harness's analysis on made-up task starts and assignments."""

from __future__ import annotations

from bench.rebalance import NS, PARTITIONS, Facts, state_choice, step_figures


def _facts(moved_at: int) -> Facts:
    # Every partition runs a task each 20 ms on m0 from 0 to 10 s; partition 1 moves to
    # m1 at ``moved_at`` after a 1 s pause, partition 2 pauses 300 ms and stays; partition
    # 1's offset 400 runs twice.
    facts = Facts()
    for p in range(PARTITIONS):
        for n in range(500):
            at = n * 20_000_000
            if p == 2 and 5 * NS < at < 5 * NS + 300_000_000:
                continue
            who = "m0#1"
            if p == 1 and at >= moved_at:
                if at < moved_at + NS:
                    continue
                who = "m1#1"
            facts.starts[p].append((at, who, n))
    facts.starts[1].append((moved_at + NS, "m1#1", 400))
    facts.starts[1].sort()
    return facts


def test_a_step_counts_kept_and_moved_partitions_their_pauses_and_runs_twice() -> None:
    figures = step_figures(_facts(4 * NS), 4 * NS, 10 * NS)
    assert figures["kept"] == PARTITIONS - 1
    assert figures["moved_partitions"] == [1]
    assert figures["kept_pause_ms"] == 300  # partition 2: the gap between two starts
    assert figures["moved_pause_ms"] == 1020
    assert figures["twice"] == 1
    assert figures["twice_kept"] == 0


def test_restores_count_moves_to_a_member_without_a_copy() -> None:
    before = {p: f"m{p % 3}" for p in range(PARTITIONS)}
    # m0 leaves; the coordinator hands its partitions round-robin to m1 and m2.
    after = {p: (f"m{1 + (p // 3) % 2}" if p % 3 == 0 else before[p]) for p in range(PARTITIONS)}
    cold = state_choice(before, after, 0)
    assert cold["uniform_moved"] == cold["uniform_restores"] == 4
    assert cold["state_aware_moved"] == cold["state_aware_restores"] == 4
    warm = state_choice(before, after, 1)
    assert warm["state_aware_restores"] == 0  # a standby takes each over
    assert warm["uniform_moved"] == 4
