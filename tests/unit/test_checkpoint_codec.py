"""The checkpoint encoding round-trips, rejects damage, and a checkpoint read back is
never trusted past the offset the group committed (no broker)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from decaton_aio.consumer._watermark import WatermarkTracker
from decaton_aio.consumer.commit._checkpoint_codec import (
    Checkpoint,
    CorruptCheckpointError,
    decode,
    encode,
    from_text,
    to_text,
    untrusted_reason,
    usable,
)


def checkpoint_of(base: int, bits: list[bool]) -> Checkpoint:
    arr = np.array(bits, dtype=bool)
    marked = np.flatnonzero(arr)
    if marked.size == 0:
        return Checkpoint(base, b"")
    return Checkpoint(base, np.packbits(arr[: int(marked[-1]) + 1]).tobytes())


bitmaps = st.one_of(
    st.lists(st.booleans(), max_size=600),
    # long runs with few holes: the run-length payload's case
    st.lists(st.tuples(st.booleans(), st.integers(1, 5000)), max_size=12).map(
        lambda runs: [bit for bit, n in runs for _ in range(n)]
    ),
)


@settings(max_examples=300, deadline=None)
@given(base=st.integers(0, 2**62), bits=bitmaps)
def test_encoding_round_trips(base: int, bits: list[bool]) -> None:
    """Any checkpoint decodes to itself, from bytes and from commit-metadata text."""
    checkpoint = checkpoint_of(base, bits)
    data = encode(checkpoint)
    assert decode(data) == checkpoint
    text = to_text(data)
    assert text.isascii()
    assert from_text(text) == checkpoint


@settings(max_examples=300, deadline=None)
@given(bits=bitmaps, data=st.data())
def test_damage_is_detected(bits: list[bool], data: st.DataObject) -> None:
    """A flipped byte or a cut is rejected as corrupt, never decoded to another
    checkpoint (the checksum covers everything)."""
    raw = bytearray(encode(checkpoint_of(1000, bits)))
    if data.draw(st.booleans()):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] ^= data.draw(st.integers(1, 255))
    else:
        raw = raw[: data.draw(st.integers(0, len(raw) - 1))]
    with pytest.raises(CorruptCheckpointError):
        decode(bytes(raw))


@settings(max_examples=200, deadline=None)
@given(junk=st.binary(max_size=64))
def test_junk_is_rejected_cleanly(junk: bytes) -> None:
    """Arbitrary bytes or text raise CorruptCheckpointError, nothing else."""
    with pytest.raises(CorruptCheckpointError):
        decode(junk)
    with pytest.raises(CorruptCheckpointError):
        from_text("dc1:" + junk.decode("latin-1"))


def test_random_holes_are_about_a_bit_per_offset_and_sparse_holes_far_less() -> None:
    """10,000 pending offsets with half of them done cost about one bit each; a window
    of 100,000 with 1% holes fits the 4,096-byte commit metadata."""
    rng = np.random.default_rng(7)
    half = rng.random(10_000) < 0.5
    half[0] = False
    assert len(encode(checkpoint_of(5, list(half)))) < 10_000 // 8 + 64
    sparse = rng.random(100_000) < 0.99
    sparse[0] = False
    assert len(to_text(encode(checkpoint_of(5, list(sparse))))) < 4096


@settings(max_examples=300, deadline=None)
@given(
    base=st.integers(0, 10_000),
    committed=st.one_of(st.none(), st.integers(0, 10_000)),
    bits=st.lists(st.booleans(), max_size=200),
)
def test_never_trusted_past_the_committed_offset(
    base: int, committed: int | None, bits: list[bool]
) -> None:
    """A checkpoint is used only with the committed offset it was saved with, and never
    to skip that offset itself: whatever it says, a tracker importing what ``usable``
    returns skips only offsets above the committed one that the checkpoint marked."""
    checkpoint = checkpoint_of(base, bits)
    trusted = usable(checkpoint, committed)
    if committed is None or base != committed or (bits and bits[0]):
        assert trusted is None
        assert untrusted_reason(checkpoint, committed) is not None
        return
    assert trusted == checkpoint
    tracker = WatermarkTracker()
    tracker.import_completed(trusted.base, trusted.bitmap)
    offsets = list(range(committed, committed + len(bits) + 5))
    skipped = set(tracker.register_batch(offsets).tolist())
    assert all(o > committed for o in skipped)
    assert skipped == {committed + i for i, bit in enumerate(bits) if bit}


@settings(max_examples=200, deadline=None)
@given(
    start=st.integers(0, 1000),
    n=st.integers(1, 300),
    done=st.sets(st.integers(0, 299)),
    gaps=st.sets(st.integers(1, 299), max_size=20),
)
def test_a_restart_skips_exactly_what_was_done(
    start: int, n: int, done: set[int], gaps: set[int]
) -> None:
    """Export a tracker's checkpoint, encode and decode it, import it into the next
    owner's tracker at the committed offset: the records skipped are exactly the ones
    finished above it, and everything else runs."""
    offsets = [start + i for i in range(n) if i not in gaps]
    tracker = WatermarkTracker()
    tracker.register_batch(offsets)
    finished = {o for o in offsets if o - start in done}
    for o in finished:
        tracker.complete(o)
    exported = tracker.export_completed()
    assert exported is not None
    committed = exported[0]
    checkpoint = usable(decode(encode(Checkpoint(*exported))), committed)
    assert checkpoint is not None
    nxt = WatermarkTracker()
    nxt.import_completed(checkpoint.base, checkpoint.bitmap)
    again = [o for o in offsets if o >= committed]
    skipped = set(nxt.register_batch(again).tolist()) if again else set()
    assert skipped == {o for o in finished if o >= committed}
