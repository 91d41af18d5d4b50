"""Unit and property tests of the per-partition watermark tracker (no broker, no asyncio)."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from bench.baselines import DequeFlagsTracker, HeapqTracker
from decaton_aio.consumer._watermark import MAX_GAP_SLOTS, WatermarkTracker
from tests.unit.tracker_helpers import capacity, completed_offsets, register

# ---------------------------------------------------------------- reference model


class Model:
    """The watermark spelled out with plain sets: what the tracker must agree with."""

    def __init__(self, start: int | None = None) -> None:
        self.end = start  # one past the last registered offset, or the start offset
        self.registered: list[int] = []
        self.pending: set[int] = set()
        self.done: set[int] = set()
        # An imported checkpoint: offsets preset_base + i with preset[i] set are done.
        self.preset_base = 0
        self.preset: npt.NDArray[np.bool_] = np.zeros(0, bool)

    def register(self, offset: int) -> bool:
        i = offset - self.preset_base
        hit = 0 <= i < len(self.preset) and bool(self.preset[i])
        self.registered.append(offset)
        (self.done if hit else self.pending).add(offset)
        self.end = offset + 1
        return hit

    def complete(self, offset: int) -> bool:
        if offset in self.pending:
            self.pending.remove(offset)
            self.done.add(offset)
            return True
        return False

    def committable(self) -> int | None:
        return min(self.pending) if self.pending else self.end

    def skip_to(self, offset: int) -> bool:
        if self.pending or (self.end is not None and offset <= self.end):
            return False
        self.end = offset
        return True

    def gaps(self) -> list[int]:
        """A few offsets between the first and last registered ones that were skipped."""
        out: list[int] = []
        for a, b in zip(self.registered, self.registered[1:], strict=False):
            if b > a + 1:
                out += [a + 1, b - 1, (a + b) // 2]
        return out

    def export(self) -> tuple[int, bytes] | None:
        """The bitmap export_completed must produce, built densely with numpy."""
        base = self.committable()
        if base is None or self.end is None:
            return None
        preset_end = self.preset_base + len(self.preset)
        bits = np.zeros(max(self.end, preset_end) - base, bool)
        bits[: self.end - base] = True  # completed or gap ...
        bits[np.array(sorted(self.pending), dtype=np.int64) - base] = False  # ... not pending
        lo = max(self.end, self.preset_base)
        if preset_end > lo:
            bits[lo - base : preset_end - base] = self.preset[lo - self.preset_base :]
        marked = np.flatnonzero(bits)
        if marked.size == 0:
            return base, b""
        return base, np.packbits(bits[: marked[-1] + 1]).tobytes()


class AnyTracker(Protocol):
    """The API the benchmark uses, shared by the real tracker and the baselines."""

    @property
    def pending(self) -> int: ...
    def register_batch(self, offsets: Any) -> object: ...
    def complete(self, offset: int) -> object: ...
    def committable(self) -> int | None: ...


def drive(tracker: AnyTracker, model_seed: int, n: int = 300) -> None:
    """Feed random batches with gaps and random completions to ``tracker`` and a model."""
    rnd = random.Random(model_seed)
    model = Model(start=100)
    offset = 100
    for _ in range(n // 10):
        batch = []
        for _ in range(rnd.randint(1, 20)):
            offset += rnd.choice([0, 0, 0, 1, 3, 200])
            batch.append(offset)
            offset += 1
        tracker.register_batch(batch)
        for o in batch:
            model.register(o)
        for o in rnd.sample(sorted(model.pending), k=len(model.pending) // 2):
            tracker.complete(o)
            model.complete(o)
        assert tracker.committable() == model.committable()
        assert tracker.pending == len(model.pending)


# ------------------------------------------------------------------ basic order


def test_nothing_to_commit_before_any_position() -> None:
    """A tracker with no start offset and no registration has nothing to commit."""
    tracker = WatermarkTracker()
    assert tracker.committable() is None
    assert tracker.pending == 0
    assert tracker.export_completed() is None


def test_start_offset_is_committable_before_any_record() -> None:
    """With a known fetch position and nothing fetched, that position is the commit offset."""
    assert WatermarkTracker(42).committable() == 42


def test_in_order_completion_commits_next_offset() -> None:
    """Completing records in order moves the watermark one past the last completed."""
    tracker = WatermarkTracker()
    tracker.register_batch(range(10, 15))
    for offset in range(10, 15):
        assert tracker.complete(offset) is True
        assert tracker.committable() == offset + 1
    assert tracker.pending == 0


def test_reverse_order_holds_until_head_completes() -> None:
    """The watermark stays at the oldest record until it completes, then jumps past all."""
    tracker = WatermarkTracker()
    for offset in range(5):
        register(tracker, offset)
    for offset in range(4, 0, -1):
        tracker.complete(offset)
        assert tracker.committable() == 0
    tracker.complete(0)
    assert tracker.committable() == 5


def test_head_pending_holds_back_later_completions() -> None:
    """A slow record blocks the commit (never past an incomplete record) but not the others."""
    tracker = WatermarkTracker()
    tracker.register_batch([0, 1, 2, 3])
    for offset in (1, 2, 3):
        tracker.complete(offset)
    assert tracker.committable() == 0
    assert tracker.pending == 1


# ------------------------------------------------------------------------- gaps


def test_gaps_do_not_hold_the_watermark() -> None:
    """Offsets never registered (markers, compaction) count as done."""
    tracker = WatermarkTracker()
    tracker.register_batch([10, 13, 14, 20])
    tracker.complete(10)
    assert tracker.committable() == 13
    tracker.complete(13)
    tracker.complete(14)
    assert tracker.committable() == 20
    tracker.complete(20)
    assert tracker.committable() == 21


def test_gap_at_head_after_start_offset() -> None:
    """Offsets between the start position and the first fetched record are a gap."""
    tracker = WatermarkTracker(100)
    register(tracker, 105)
    assert tracker.committable() == 105
    tracker.complete(105)
    assert tracker.committable() == 106


def test_long_gaps_take_no_ring_slots() -> None:
    """Gaps longer than MAX_GAP_SLOTS start a segment instead of filling the ring."""
    tracker = WatermarkTracker(0, initial_capacity=8)
    offsets = [i * 10**9 for i in range(1, 7)]
    tracker.register_batch(offsets[:3])
    for offset in offsets[3:]:
        register(tracker, offset)
    assert capacity(tracker) == 8
    assert tracker.committable() == offsets[0]
    for offset in reversed(offsets[1:]):
        tracker.complete(offset)
    assert tracker.committable() == offsets[0]
    tracker.complete(offsets[0])
    assert tracker.committable() == offsets[-1] + 1


def test_gap_length_threshold_boundary() -> None:
    """Gaps just below, at and above the slot threshold all behave the same."""
    for gap in (MAX_GAP_SLOTS - 1, MAX_GAP_SLOTS, MAX_GAP_SLOTS + 1, MAX_GAP_SLOTS + 2):
        tracker = WatermarkTracker(initial_capacity=2)
        tracker.register_batch([0, gap + 1, 2 * gap + 2])
        register(tracker, 3 * gap + 3)
        tracker.complete(gap + 1)
        tracker.complete(0)
        assert tracker.committable() == 2 * gap + 2, gap
        with pytest.raises(ValueError, match="gap"):
            tracker.complete(2 * gap + 3)
        assert tracker.complete(gap) is False  # a gap below the watermark: let go


# ------------------------------------------------------------------------- ring


def test_ring_wraps_around_without_growing() -> None:
    """A window that slides past the end of the ring reuses slots from the start."""
    tracker = WatermarkTracker(initial_capacity=8)
    for start in range(0, 80, 5):
        tracker.register_batch(range(start, start + 5))
        for offset in (start + 4, start + 2, start, start + 3, start + 1):
            tracker.complete(offset)
        assert tracker.committable() == start + 5
    assert capacity(tracker) == 8


def test_ring_grows_by_doubling_and_keeps_state() -> None:
    """More pending records than slots double the ring; states survive the copy."""
    tracker = WatermarkTracker(initial_capacity=4)
    tracker.register_batch([0, 1, 2])
    tracker.complete(1)
    tracker.committable()  # head at 0: window starts mid-ring after the next wrap
    tracker.register_batch(range(3, 40))
    assert capacity(tracker) == 64
    assert tracker.pending == 39
    tracker.complete(0)
    assert tracker.committable() == 2
    for offset in range(2, 40):
        tracker.complete(offset)
    assert tracker.committable() == 40


def test_growth_reclaims_completed_slots_first() -> None:
    """Completed slots are reclaimed before doubling, even if committable() was not called."""
    tracker = WatermarkTracker(initial_capacity=4)
    for offset in range(100):
        register(tracker, offset)
        tracker.complete(offset)
    assert capacity(tracker) == 4
    assert tracker.committable() == 100


# ----------------------------------------------------------------------- misuse


def test_completing_twice_is_a_no_op() -> None:
    """Completion is idempotent: the second call returns False and changes nothing."""
    tracker = WatermarkTracker()
    tracker.register_batch([0, 1])
    assert tracker.complete(1) is True
    assert tracker.complete(1) is False
    assert tracker.pending == 1


def test_completing_below_the_watermark_is_a_no_op() -> None:
    """An offset the tracker already let go of is ignored."""
    tracker = WatermarkTracker()
    tracker.register_batch([5, 6])
    tracker.complete(5)
    assert tracker.committable() == 6
    assert tracker.complete(5) is False
    assert tracker.complete(0) is False
    assert tracker.pending == 1


def test_completion_below_the_start_offset_is_ignored() -> None:
    """A tracker started at a later position (a seek forward) lets go of lower offsets."""
    tracker = WatermarkTracker(1000)
    register(tracker, 1000)
    assert tracker.complete(3) is False
    assert tracker.committable() == 1000


def test_completing_an_unregistered_offset_raises() -> None:
    """Offsets beyond the last registered one, or never registered at all, are bugs."""
    tracker = WatermarkTracker()
    with pytest.raises(ValueError, match="never registered"):
        tracker.complete(0)
    tracker.register_batch([0, 2])
    with pytest.raises(ValueError, match="never registered"):
        tracker.complete(3)
    with pytest.raises(ValueError, match="gap"):
        tracker.complete(1)
    assert tracker.pending == 2


def test_registering_out_of_order_raises_and_changes_nothing() -> None:
    """Offsets must increase; a bad batch is rejected as a whole."""
    tracker = WatermarkTracker()
    tracker.register_batch([5, 6])
    with pytest.raises(ValueError, match="out of order"):
        register(tracker, 6)
    with pytest.raises(ValueError, match="out of order"):
        tracker.register_batch([3, 10])
    with pytest.raises(ValueError, match="strictly increasing"):
        tracker.register_batch([10, 12, 12])
    with pytest.raises(ValueError, match="one-dimensional"):
        tracker.register_batch(np.zeros((2, 2), dtype=np.int64))
    with pytest.raises(ValueError, match="non-negative"):
        WatermarkTracker().register_batch([-1, 0])
    with pytest.raises(ValueError, match="non-negative"):
        register(WatermarkTracker(), -1)
    assert tracker.register_batch([]).size == 0
    assert (tracker.committable(), tracker.pending) == (5, 2)


def test_invalid_initial_capacity_raises() -> None:
    """The ring needs at least one slot."""
    with pytest.raises(ValueError, match="initial_capacity"):
        WatermarkTracker(initial_capacity=0)


# ------------------------------------------------------------------ checkpoints


def test_export_marks_completed_records_above_the_watermark() -> None:
    """The bitmap starts at the watermark and marks completions and gaps, not pending."""
    tracker = WatermarkTracker()
    tracker.register_batch([10, 11, 13, 14, 15])
    tracker.complete(11)
    tracker.complete(14)
    base, bitmap = tracker.export_completed() or (0, b"")
    assert base == 10
    assert completed_offsets(base, bitmap).tolist() == [11, 12, 14]


def test_export_is_empty_when_nothing_above_the_watermark_is_done() -> None:
    """Only pending records above the watermark: an empty bitmap."""
    tracker = WatermarkTracker()
    tracker.register_batch([3, 4])
    assert tracker.export_completed() == (3, b"")
    tracker.complete(3)
    tracker.complete(4)
    assert tracker.export_completed() == (5, b"")


def test_import_skips_finished_records_after_restart() -> None:
    """Round trip: a restarted tracker reports checkpointed records as already done."""
    before = WatermarkTracker()
    before.register_batch(range(0, 3000, 3))
    done = list(range(300, 3000, 7 * 3))
    for offset in done:
        before.complete(offset)
    base, bitmap = before.export_completed() or (0, b"")

    after = WatermarkTracker(base)
    after.import_completed(base, bitmap)
    skipped = after.register_batch(range(0, 1500, 3)).tolist()
    skipped += [o for o in range(1500, 3000, 3) if register(after, o)]
    assert skipped == done
    assert after.pending == before.pending
    assert after.export_completed() == (base, bitmap)


def test_import_carries_unregistered_tail_into_the_next_export() -> None:
    """Checkpointed offsets not fetched again yet survive a second export."""
    tracker = WatermarkTracker(0)
    tracker.import_completed(0, np.packbits([0, 1, 0, 0, 1]).tobytes())
    tracker.register_batch([0, 1])
    assert completed_offsets(*(tracker.export_completed() or (0, b""))).tolist() == [1, 4]

    ahead = WatermarkTracker(0)  # a checkpoint starting above the fetch position
    ahead.import_completed(3, np.packbits([1, 0, 1]).tobytes())
    assert completed_offsets(*(ahead.export_completed() or (0, b""))).tolist() == [3, 5]


def test_import_ignores_offsets_already_registered() -> None:
    """Bits below the last registered offset are dropped: those records run again."""
    tracker = WatermarkTracker()
    tracker.register_batch([0, 1, 2])
    tracker.import_completed(0, np.packbits([1, 1, 1, 1]).tobytes())
    assert tracker.pending == 3
    assert register(tracker, 3) is True
    assert register(tracker, 4) is False
    tracker.import_completed(0, np.packbits([1, 1]).tobytes())  # nothing left above 5
    assert register(tracker, 5) is False
    with pytest.raises(ValueError, match="non-negative"):
        tracker.import_completed(-1, b"")


# ------------------------------------------------------------------------- mark


@pytest.fixture(params=["one_by_one", "vectorized"])
def make(request: pytest.FixtureRequest) -> Callable[..., WatermarkTracker]:
    """Build trackers whose queued marks fold one by one, or always vectorized."""

    def factory(*args: Any, **kwargs: Any) -> WatermarkTracker:
        tracker = WatermarkTracker(*args, **kwargs)
        # Private knob: the queue length up to which a fold goes through complete().
        tracker._small_fold = 10**9 if request.param == "one_by_one" else 0
        return tracker

    return factory


def test_marks_are_folded_by_committable(make: Callable[..., WatermarkTracker]) -> None:
    """Marks take effect at the next read, with the effect complete() would have had."""
    tracker = make()
    tracker.register_batch(range(10, 20))
    for offset in (12, 11, 10, 15):
        tracker.mark(offset)
    assert tracker.committable() == 13
    assert tracker.pending == 6
    for offset in (13, 14, 16, 17, 18, 19):
        tracker.mark(offset)
    assert tracker.committable() == 20
    assert tracker.pending == 0


def test_every_read_folds_queued_marks(make: Callable[..., WatermarkTracker]) -> None:
    """pending, complete, registration and export all see the marks queued before them."""
    tracker = make()
    tracker.register_batch(range(5))
    tracker.mark(0)
    assert tracker.pending == 4
    tracker.mark(1)
    assert tracker.complete(1) is False  # the mark got there first
    tracker.mark(3)
    assert tracker.export_completed() == (2, np.packbits([0, 1]).tobytes())
    tracker.mark(2)
    register(tracker, 5)
    assert (tracker.committable(), tracker.pending) == (4, 2)


def test_a_big_queue_folds_in_one_go() -> None:
    """Thousands of shuffled marks, duplicates included, fold into the right watermark."""
    tracker = WatermarkTracker(initial_capacity=64)
    tracker.register_batch(range(1000, 11000))
    order = list(range(1000, 11000))
    random.Random(5).shuffle(order)
    for offset in order[:6000] + order[:100]:
        tracker.mark(offset)
    done = set(order[:6000])
    expected = min(o for o in range(1000, 11000) if o not in done)
    assert tracker.committable() == expected
    assert tracker.pending == 4000
    for offset in order[6000:]:
        tracker.mark(offset)
    assert (tracker.committable(), tracker.pending) == (11000, 0)


def test_cached_mark_stays_valid_across_folds(make: Callable[..., WatermarkTracker]) -> None:
    """``tracker.mark`` is bound once: a fold clears the queue, not the binding."""
    tracker = make()
    mark = tracker.mark
    tracker.register_batch(range(60))
    for offset in range(50):
        mark(offset)
    assert tracker.committable() == 50
    for offset in range(50, 60):
        mark(offset)
    assert tracker.committable() == 60
    assert tracker.mark is mark
    tracker.register_batch(range(60, 70))
    assert (tracker.committable(), tracker.pending) == (60, 10)
    for offset in range(60, 70):
        mark(offset)
    assert (tracker.committable(), tracker.pending) == (70, 0)


def test_duplicate_marks_count_once(make: Callable[..., WatermarkTracker]) -> None:
    """An offset marked many times in one fold leaves pending one lower, not more."""
    tracker = make()
    tracker.register_batch(range(10))
    for _ in range(40):
        tracker.mark(3)
    tracker.mark(0)
    tracker.mark(0)
    assert tracker.pending == 8
    assert tracker.committable() == 1
    tracker.mark(3)  # already complete: a no-op
    assert tracker.pending == 8


def test_invalid_marks_are_dropped(make: Callable[..., WatermarkTracker]) -> None:
    """Offsets complete() would raise for are dropped, not applied, as stale ones are."""
    tracker = make()
    tracker.mark(10)  # nothing registered yet: not applied to the offset registered next
    tracker.register_batch([10, 11, 13, 14])
    assert tracker.pending == 4
    tracker.mark(10)
    assert tracker.committable() == 11
    for offset in (15, 10**9, 2**63, 2**64 - 1):  # beyond the last registered offset
        tracker.mark(offset)
    tracker.mark(12)  # a gap above the watermark
    tracker.mark(10)  # below the watermark: let go, like complete()
    tracker.mark(3)  # below the first offset: let go too
    assert (tracker.committable(), tracker.pending) == (11, 3)
    with pytest.raises(ValueError, match="gap"):
        tracker.complete(12)  # still a gap: the mark did not complete it
    tracker.mark(11)
    assert (tracker.committable(), tracker.pending) == (13, 2)
    tracker.mark(12)  # the gap is below the watermark now: stale
    tracker.mark(15)  # an offset marked before its registration is not applied to it
    register(tracker, 15)
    assert (tracker.committable(), tracker.pending) == (13, 3)


def test_mark_rejects_what_is_not_an_offset() -> None:
    """The call itself refuses negative numbers and non-integers; nothing is queued."""
    tracker = WatermarkTracker(0)
    with pytest.raises(OverflowError):
        tracker.mark(-1)
    with pytest.raises(TypeError):
        tracker.mark(1.0)  # type: ignore[arg-type]
    register(tracker, 0)
    assert (tracker.committable(), tracker.pending) == (0, 1)


def test_marks_across_segments(make: Callable[..., WatermarkTracker]) -> None:
    """Marks reach offsets in every segment; marks in a long gap or past the end are dropped."""
    tracker = make(0, initial_capacity=8)
    starts = [0, 10**6, 10**9, 10**12]
    for start in starts:
        tracker.register_batch(range(start, start + 4))
    for start in starts[1:]:
        for offset in range(start, start + 4):
            tracker.mark(offset)
    tracker.mark(500)  # in the long gap after the first segment, above the watermark
    tracker.mark(10**9 + 10)  # in a later long gap
    tracker.mark(10**12 + 4)  # beyond the end of the newest segment
    assert tracker.committable() == 0
    assert tracker.pending == 4
    for gap in (500, 10**9 + 10):
        with pytest.raises(ValueError, match="gap"):
            tracker.complete(gap)
    tracker.mark(1)
    tracker.mark(2)
    tracker.mark(0)
    tracker.mark(3)
    assert (tracker.committable(), tracker.pending) == (10**12 + 4, 0)
    tracker.mark(500)  # the watermark passed that gap now: stale
    tracker.mark(10**6 + 2)  # an older segment, complete already
    register(tracker, 10**12 + 4)  # the mark of it, queued before, was dropped
    assert (tracker.committable(), tracker.pending) == (10**12 + 4, 1)


def test_mark_in_a_long_gap_that_starts_at_the_watermark(
    make: Callable[..., WatermarkTracker],
) -> None:
    """A jump registered when all is complete leaves its long gap below the watermark."""
    tracker = make(0)
    register(tracker, 0)
    tracker.mark(0)
    assert tracker.committable() == 1
    register(tracker, 10**6)  # the new segment starts at the watermark's slot
    tracker.mark(500)  # folded by the pending read below, before the watermark moves
    assert tracker.pending == 1
    assert tracker.complete(500) is False  # stale, for complete() too


def test_marks_in_a_wrapped_window_with_gaps(make: Callable[..., WatermarkTracker]) -> None:
    """The live window wraps around the ring's end and holds short gaps."""
    tracker = make(0, initial_capacity=16)
    tracker.register_batch(range(10))
    for offset in range(10):
        tracker.mark(offset)
    assert tracker.committable() == 10
    offsets = [10, 12, 13, 17, 18, 20]  # slots 10..20 wrap past slot 15
    tracker.register_batch(offsets)
    for offset in (20, 19, 18, 11, 12, 16, 13, 10):  # 11, 16, 19: gaps above the watermark
        tracker.mark(offset)
    assert tracker.committable() == 17
    assert tracker.pending == 1
    with pytest.raises(ValueError, match="gap"):
        tracker.complete(19)  # still a gap: the mark did not complete it


# -------------------------------------------------------------------- baselines


@pytest.mark.parametrize("factory", [HeapqTracker, DequeFlagsTracker, WatermarkTracker])
@pytest.mark.parametrize("seed", range(5))
def test_baselines_agree_with_the_model(factory: Callable[[int], AnyTracker], seed: int) -> None:
    """Every tracker the benchmark compares computes the same watermark as the model."""
    drive(factory(100), seed)


# ------------------------------------------------------------- property: model


class TrackerMachine(RuleBasedStateMachine):
    """Random fetches with gaps, completions in any order, misuse and restarts."""

    @initialize(
        start=st.none() | st.integers(0, 1000),
        small_fold=st.sampled_from([0, 2, None]),
    )
    def init(self, start: int | None, small_fold: int | None) -> None:
        # How many queued marks fold one by one: 0 always vectorizes, None is the default.
        self.small_fold = small_fold
        self.tracker = self.new_tracker(start)
        self.model = Model(start)

    def new_tracker(self, start: int | None) -> WatermarkTracker:
        tracker = WatermarkTracker(start, initial_capacity=4)
        if self.small_fold is not None:
            tracker._small_fold = self.small_fold
        self.mark = tracker.mark  # cached, as the runtime does
        return tracker

    @rule(
        gaps=st.lists(
            st.sampled_from([0, 0, 0, 0, 1, 2, MAX_GAP_SLOTS, MAX_GAP_SLOTS + 1, 10**5]),
            min_size=1,
            max_size=40,
        ),
        form=st.sampled_from(["array", "list", "single"]),
        first=st.integers(0, 1000),
        premarked=st.integers(0, 3),
    )
    def fetch(self, gaps: list[int], form: str, first: int, premarked: int) -> None:
        # A list of a few offsets with no gap before them takes register_batch's fast
        # path; an array, or a list after a gap, the vectorized one.
        offset = first if self.model.end is None else self.model.end
        offsets = []
        for gap in gaps:
            offset += gap
            offsets.append(offset)
            offset += 1
        for early in offsets[:premarked]:  # marked before registration: invalid, not applied
            self.mark(early)
        if form == "array":
            hits = self.tracker.register_batch(np.array(offsets)).tolist()
        elif form == "list":
            hits = self.tracker.register_batch(offsets).tolist()
        else:
            hits = [o for o in offsets if register(self.tracker, o)]
        assert hits == [o for o in offsets if self.model.register(o)]

    @precondition(lambda self: self.model.pending)
    @rule(rnd=st.randoms(use_true_random=False), share=st.floats(0.0, 1.0))
    def complete_some(self, rnd: random.Random, share: float) -> None:
        pending = sorted(self.model.pending)
        for offset in rnd.sample(pending, k=max(1, int(len(pending) * share))):
            assert self.tracker.complete(offset) is True
            self.model.complete(offset)

    @precondition(lambda self: self.model.done)
    @rule(data=st.data())
    def complete_again(self, data: st.DataObject) -> None:
        offset = data.draw(st.sampled_from(sorted(self.model.done)))
        assert self.tracker.complete(offset) is False

    @precondition(lambda self: self.model.gaps())
    @rule(data=st.data())
    def complete_gap(self, data: st.DataObject) -> None:
        offset = data.draw(st.sampled_from(self.model.gaps()))
        watermark = self.model.committable()
        assert watermark is not None
        if offset < watermark:
            assert self.tracker.complete(offset) is False
        else:
            with pytest.raises(ValueError, match="gap"):
                self.tracker.complete(offset)

    @precondition(lambda self: self.model.end is not None)
    @rule(ahead=st.integers(0, 10**6))
    def complete_beyond_end(self, ahead: int) -> None:
        assert self.model.end is not None
        with pytest.raises(ValueError, match="never registered"):
            self.tracker.complete(self.model.end + ahead)

    @precondition(lambda self: self.model.end is not None)
    @rule(data=st.data())
    def mark_mixed(self, data: st.DataObject) -> None:
        """Queued marks mixed with exact completions and commits, in any order."""
        model = self.model
        watermark = model.committable()  # the tracker's: the invariant just advanced it
        marked: list[int] = []
        marks = ["pending", "pending", "again", "done", "stale", "gap", "beyond"]
        actions = st.sampled_from([*marks, "complete", "committable", "count"])
        for action in data.draw(st.lists(actions, min_size=1, max_size=60)):
            assert model.end is not None
            if action == "complete":
                known = sorted(model.pending | model.done)
                if known:
                    offset = data.draw(st.sampled_from(known))
                    assert self.tracker.complete(offset) is model.complete(offset)
                continue
            if action == "committable":
                watermark = model.committable()
                assert self.tracker.committable() == watermark
                continue
            if action == "count":
                assert self.tracker.pending == len(model.pending)
                continue
            pool = {
                "pending": sorted(model.pending),
                "again": marked,
                "done": sorted(model.done),
                "stale": list(range(max(0, (watermark or 0) - 3), watermark or 0)),
                "gap": model.gaps(),
                "beyond": [model.end, model.end + 1, model.end + 10**6],
            }[action]
            if not pool:
                continue
            offset = data.draw(st.sampled_from(pool))
            self.mark(offset)
            marked.append(offset)
            model.complete(offset)  # a pending one completes; any other changes nothing

    @rule(ahead=st.integers(-3, 2 * MAX_GAP_SLOTS))
    def skip_to_position(self, ahead: int) -> None:
        offset = max(0, (self.model.end or 0) + ahead)
        assert self.tracker.skip_to(offset) is self.model.skip_to(offset)

    @rule(share=st.floats(0.0, 1.0))
    def restart_from_checkpoint(self, share: float) -> None:
        exported = self.tracker.export_completed()
        assert exported == self.model.export()
        if exported is None:
            return
        base, bitmap = exported
        again = [o for o in self.model.registered if o >= base]
        again = again[: int(len(again) * share)]
        tracker, model = self.new_tracker(base), Model(base)
        tracker.import_completed(base, bitmap)
        bits = np.unpackbits(np.frombuffer(bitmap, dtype=np.uint8)).astype(bool)
        model.preset_base, model.preset = base, bits
        hits = tracker.register_batch(again).tolist()
        assert hits == [o for o in again if model.register(o)]
        assert hits == [o for o in again if o in self.model.done]
        self.tracker, self.model = tracker, model

    @invariant()
    def watermark_matches_model(self) -> None:
        assert self.tracker.committable() == self.model.committable()
        assert self.tracker.pending == len(self.model.pending)


TrackerMachine.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_tracker_matches_model = TrackerMachine.TestCase


# ------------------------------------------------------- skipping to the fetch position


def test_skip_to_moves_an_idle_window_past_offsets_never_handed_out() -> None:
    """Given records 0..2 all complete and a fetch position of 5 (a transaction marker and
    aborted records were skipped), the watermark moves to 5 and 5 registers next."""
    tracker = WatermarkTracker()
    tracker.register_batch([0, 1, 2])
    for offset in (0, 1, 2):
        tracker.complete(offset)
    assert tracker.skip_to(5) is True
    assert tracker.committable() == 5
    register(tracker, 5)
    assert tracker.committable() == 5


def test_skip_to_never_passes_a_pending_record() -> None:
    tracker = WatermarkTracker()
    tracker.register_batch([0, 1, 2])
    tracker.complete(0)
    tracker.mark(2)
    assert tracker.skip_to(10) is False
    assert tracker.committable() == 1


def test_skip_to_does_not_move_back() -> None:
    tracker = WatermarkTracker(7)
    assert tracker.skip_to(7) is False
    assert tracker.skip_to(3) is False
    assert tracker.committable() == 7
