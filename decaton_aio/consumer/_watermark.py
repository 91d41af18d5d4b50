"""Per-partition watermark tracking: which offset is safe to commit.

This module owns the answer to one question: given records of one partition that were
fetched in offset order and complete in any order, what is the Kafka commit offset? The
answer is the *watermark*: the first offset that is not complete yet (the next offset a
restarted consumer must read). Committing it never skips an unfinished record, so
at-least-once holds however tasks finish (Decaton's ``OutOfOrderCommitControl`` idea).

Invariant: every registered offset below ``committable()`` is complete, and the offset
``committable()`` returns is registered and pending, or, when nothing is pending, one past
the last registered offset (the start offset if none was registered since).

Offsets are not dense. Transaction markers and log compaction leave offsets a consumer
never sees; such a gap must not hold the watermark back. Small gaps take one slot each,
marked ``_GAP`` (counts as done). A gap longer than `MAX_GAP_SLOTS` would waste
memory (a compacted topic can jump by millions), so it starts a new *segment* instead:
the ring is indexed by a dense *virtual position* and a short table maps each segment's
first virtual position to its first offset, so a jump costs no slots at all.

Storage is one byte per slot in a power-of-two ring (a ``bytearray`` viewed as a numpy
array): completing is a single byte store, advancing is a numpy scan, and no Python object
per record stays alive. Registering a fetch step's few records, which continue the last
ones, is a loop and a slice store; numpy's fixed cost per call is paid for longer batches.

Completions have two forms. `WatermarkTracker.complete()` is a method: it validates
the offset at once, raises on misuse and says whether the record was pending. The hot path
the runtime uses is `WatermarkTracker.mark`, the bound ``append`` of an
``array.array('Q')``: a C-level call that only queues the offset (8 bytes). Queued marks
are *folded* into the ring, vectorized with numpy, before anything reads or changes the
ring (`committable()`, `pending`,
`complete()`, registration, checkpoints), so a mark has the effect
``complete`` would have had when it was made, except that a mark of an offset that was
never registered is dropped instead of raising: at fold time nobody could catch the error.

Caller: the event loop that owns the partition. The tracker is not thread-safe and never
blocks; it knows nothing about asyncio or Kafka.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt

__all__ = ["MAX_GAP_SLOTS", "WatermarkTracker"]

MAX_GAP_SLOTS = 128
"""Gaps up to this many offsets take one ring slot per offset; longer ones start a segment."""

_PENDING = 0  # registered, not complete: the only state that holds the watermark back
# (zero: bytes(n) is n pending slots)
_DONE = 1  # registered and complete
_GAP = 2  # never registered (transaction marker, compacted away): counts as done

_SCAN_CHUNK = 1 << 16  # advance scans this many slots per numpy call, so it can stop early
# Folds of up to this many marks go through complete() one by one: below it, the fixed cost
# of the numpy calls is higher than a Python call per mark.
_SMALL_FOLD = 16
# A list of at most this many offsets that continues the registered ones takes the loop
# of register_batch's fast path; numpy's fixed cost per call is paid only above it.
_SMALL_BATCH = 64
_EMPTY = np.empty(0, dtype=np.int64)
_EMPTY.flags.writeable = False


class WatermarkTracker:
    """Tracks out-of-order completions of one partition and yields the commit offset.

    Register offsets in increasing order as records are fetched, complete them in any
    order, and ask `committable()` for the offset to commit (typically once per commit
    interval). Offsets never registered (gaps) count as done.

    Args:
        start_offset: the partition's fetch position, if known. Offsets between it and the
            first registered offset count as gaps. When ``None`` the first registered
            offset starts the window.
        initial_capacity: ring slots allocated up front (rounded up to a power of two);
            the ring doubles when more records are in flight.

    Attributes:
        mark: ``mark(offset)`` queues the completion of ``offset``: the hot-path form of
            `complete()`, about 20 ns (the bound ``append`` of an ``array.array('Q')``,
            no Python frame). The call itself only checks that ``offset`` is an ``int`` in
            ``[0, 2**64)`` (``TypeError`` or ``OverflowError`` otherwise); the queue is
            folded into the tracker before the next read. For registered offsets the effect
            is exactly `complete()`'s: pending ones become complete, complete ones and
            offsets below the watermark are no-ops, and duplicates count once. Offsets never
            registered (beyond the last registered one, or a gap at or above the watermark),
            which `complete()` would raise for, are dropped. The attribute is bound
            once, so callers may cache ``tracker.mark``: it stays valid across folds. Queued
            marks take 8 bytes each until the next fold: call `committable()` (or read
            `pending`) regularly.

    Raises:
        ValueError: ``start_offset`` is negative or ``initial_capacity`` is below 1.
    """

    mark: Callable[[int], None]

    def __init__(self, start_offset: int | None = None, *, initial_capacity: int = 1024) -> None:
        if initial_capacity < 1:
            raise ValueError(f"initial_capacity must be >= 1, got {initial_capacity}")
        # Queued marks. The array object lives as long as the tracker and is only ever
        # cleared in place, so a cached ``tracker.mark`` keeps feeding this tracker.
        self._marks: array[int] = array("Q")
        self.mark = self._marks.append
        self._small_fold = _SMALL_FOLD  # tests lower it to force the vectorized fold
        self._alloc(1 << (initial_capacity - 1).bit_length())
        # _pending is exact when _pending_exact, else an upper bound (a vectorized fold
        # does not count, see _fold): either way _pending == 0 means nothing is pending.
        self._pending = 0
        self._pending_exact = True
        self._gap_hi_v = 0  # no gap slot at or above this virtual position
        self._wm_v = 0  # virtual position of the first slot that may still be pending
        self._end_v = 0  # virtual position one past the last registered slot
        self._end = 0  # offset one past the last registered offset (or the start offset)
        # Segment table: segment k starts at virtual position _seg_v[k], holding offset
        # _seg_off[k]; offsets are dense (up to small gaps) within a segment.
        self._seg_v: list[int] = []
        self._seg_off: list[int] = []
        self._last_off = 0  # first offset of the newest segment (fast path of complete)
        self._last_shift = 0  # offset - virtual position in the newest segment
        self._preset: npt.NDArray[np.uint8] | None = None  # imported checkpoint bits
        self._preset_base = 0
        self._started = False
        if start_offset is not None:
            self._begin(start_offset)

    # ----------------------------------------------------------------- properties

    @property
    def pending(self) -> int:
        """Records registered and not yet complete (queued marks are folded first).

        Usually O(1). After a vectorized fold (one of more than a few marks) the count is
        recomputed on the first read, one pass over the live window (``numpy``
        ``count_nonzero``, a few microseconds per 100,000 slots); later reads are O(1)
        again.
        """
        if self._marks:
            self._fold()
        if not self._pending_exact:
            self._recount()
        return self._pending

    @property
    def next_offset(self) -> int | None:
        """One past the last registered offset (the start offset before any), ``None``
        before the tracker started: a batch must begin at or above it."""
        return self._end if self._started else None

    # ------------------------------------------------------------------ lifecycle

    def _alloc(self, capacity: int) -> None:
        # A bytearray gives the fastest single-byte stores from Python; the numpy view over
        # the same memory does the range fills and scans.
        self._buf = bytearray(capacity)
        self._ring: npt.NDArray[np.uint8] = np.frombuffer(self._buf, dtype=np.uint8)
        self._mask = capacity - 1

    def _begin(self, offset: int) -> None:
        if offset < 0:
            raise ValueError(f"offsets are non-negative, got {offset}")
        self._started = True
        self._end = offset
        self._seg_v = [0]
        self._seg_off = [offset]
        self._last_off = self._last_shift = offset

    # --------------------------------------------------------------- registration

    def register_batch(
        self, offsets: Sequence[int] | npt.NDArray[np.integer]
    ) -> npt.NDArray[np.int64]:
        """Register a fetch batch of offsets as pending, vectorized.

        Args:
            offsets: strictly increasing offsets, all above the last registered one.

        Returns:
            The offsets an imported checkpoint marks as already completed; they are
            registered as done and must not be processed again. Usually empty.

        Raises:
            ValueError: the offsets are not one-dimensional, negative, not strictly
                increasing, or not above the last registered offset. Nothing is
                registered then.
        """
        if self._marks:
            self._fold()
        if (
            type(offsets) is list
            and len(offsets) <= _SMALL_BATCH
            and self._preset is None
            and self._started
            and self._register_next(offsets)
        ):
            return _EMPTY
        arr = np.asarray(offsets, dtype=np.int64)
        if arr.ndim != 1:
            raise ValueError(f"offsets must be one-dimensional, got shape {arr.shape}")
        if arr.size == 0:
            return _EMPTY
        first = int(arr[0])
        if first < 0:
            raise ValueError(f"offsets are non-negative, got {first}")
        if self._started and first < self._end:
            raise ValueError(f"offset {first} registered out of order (next is >= {self._end})")
        steps = np.diff(arr)
        if arr.size > 1 and int(steps.min()) <= 0:
            raise ValueError("offsets in a batch must be strictly increasing")
        if not self._started:
            self._begin(first)
        # Split at long gaps so each run only holds short gaps and fits one segment.
        cuts = np.flatnonzero(steps > MAX_GAP_SLOTS + 1) + 1
        if cuts.size == 0:
            return self._register_run(arr)
        hits = [self._register_run(run) for run in np.split(arr, cuts)]
        return np.concatenate(hits)

    def _register_next(self, offsets: list[int]) -> bool:
        # The fast path of register_batch: a short list of offsets that continues the
        # registered ones with no gap (a fetch step's records, the common case) is
        # registered by a loop and a slice store, and True returned. Anything else (a gap,
        # an empty list) returns False having registered nothing: the general path
        # registers it or raises.
        n = len(offsets)
        if not n:
            return False
        first = self._end
        for i in range(n):
            if offsets[i] != first + i:
                return False
        if self._end_v + n - self._wm_v > len(self._buf):
            self._make_room(n)
        buf = self._buf
        lo = self._end_v & self._mask
        hi = lo + n
        if hi <= len(buf):
            buf[lo:hi] = bytes(n)  # _PENDING
        else:
            buf[lo:] = bytes(len(buf) - lo)
            buf[: hi - len(buf)] = bytes(hi - len(buf))
        self._pending += n
        self._end_v += n
        self._end = first + n
        return True

    def _register_run(self, run: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        first, last = int(run[0]), int(run[-1])
        if first - self._end > MAX_GAP_SLOTS:
            self._jump(first)
        span = last + 1 - self._end  # slots taken: the run plus its short gaps
        if self._end_v + span - self._wm_v > len(self._buf):
            self._make_room(span)
        base_v = self._end_v
        if span == run.size:  # dense run, the common case: one fill
            self._fill(base_v, span, _PENDING)
        else:
            self._fill(base_v, span, _GAP)
            self._ring[(run - self._end + base_v) & self._mask] = _PENDING
            self._gap_hi_v = base_v + span
        hits = _EMPTY
        if self._preset is not None:
            hits = self._preset_hits(run)
            if hits.size:
                self._ring[(hits - self._end + base_v) & self._mask] = _DONE
        self._pending += run.size - hits.size
        self._end_v += span
        self._end = last + 1
        return hits

    def _jump(self, offset: int) -> None:
        # Start a new segment at ``offset`` so the long gap before it takes no slots.
        if self._seg_v[-1] == self._end_v:  # newest segment is empty: just move it
            self._seg_off[-1] = offset
        else:
            self._seg_v.append(self._end_v)
            self._seg_off.append(offset)
        self._last_off = offset
        self._last_shift = offset - self._end_v
        self._end = offset

    def skip_to(self, offset: int) -> bool:
        """Move the window to ``offset`` when nothing is pending.

        A consumer's fetch position can pass offsets it never hands out: transaction
        markers, records of aborted transactions under ``read_committed``. With nothing
        pending they need no processing, and without this the watermark would wait below
        them until the next record arrives (a lag that never reaches zero).

        Caller: the partition's owner, with the consumer's fetch position, only when no
        record it was handed is unfinished. Affects: `committable()` returns
        ``offset``; later registrations must be at or above it.

        Args:
            offset: the fetch position: every offset below it was handed out or skipped.

        Returns:
            Whether the window moved (``False`` when something is pending or ``offset`` is
            not beyond the window's end).

        Raises:
            ValueError: ``offset`` is negative.
        """
        if offset < 0:
            raise ValueError(f"offsets are non-negative, got {offset}")
        if not self._started:
            self._begin(offset)
            return True
        if offset <= self._end or self.pending:
            return False
        self._jump(offset)
        return True

    # ------------------------------------------------------------------ completion

    def complete(self, offset: int) -> bool:
        """Mark a registered offset complete, checked at once. O(1): one byte store.

        The exact form, for callers that need the answer or the error; the runtime's hot
        path is `mark`, which queues the offset instead. Queued marks are folded
        before the call, so both forms can be mixed.

        Completing is idempotent, and completing an offset the tracker has already let go
        of (below the last `committable()`, or below the start offset) is a no-op,
        because such calls happen legitimately: a deferred completion that timed out.

        Args:
            offset: the record's offset.

        Returns:
            ``True`` if the offset went from pending to complete, ``False`` for a no-op.

        Raises:
            ValueError: the offset is at or above the watermark but was never
                registered (beyond the last registered offset, or a gap). Nothing changes.
        """
        if self._marks:
            self._fold()
        if offset >= self._last_off:  # newest segment: no table lookup
            if offset >= self._end:
                raise ValueError(f"offset {offset} was never registered (next is {self._end})")
            v = offset - self._last_shift
        else:
            v = self._locate(offset)
        if v < self._wm_v:
            return False
        i = v & self._mask
        state = self._buf[i]
        if state != _PENDING:
            if state == _GAP:
                raise ValueError(f"offset {offset} is a gap, it was never registered")
            return False
        self._buf[i] = _DONE
        self._pending -= 1
        return True

    def _locate(self, offset: int) -> int:
        # Virtual position of an offset in an older segment; -1 if below every segment.
        k = bisect_right(self._seg_off, offset) - 1
        if k < 0:
            return -1
        v = offset - self._seg_off[k] + self._seg_v[k]
        if v >= self._seg_v[k + 1]:  # inside the long gap before segment k + 1
            if self._seg_v[k + 1] <= self._wm_v:
                return -1
            raise ValueError(f"offset {offset} is a gap, it was never registered")
        return v

    # --------------------------------------------------------------------- marks

    def _fold(self) -> None:
        # Apply the queued marks. Callers check ``if self._marks`` first.
        marks = self._marks
        if len(marks) <= self._small_fold:
            queued = marks.tolist()
            del marks[:]
            complete = self.complete  # the queue is empty now: complete() will not fold
            for offset in queued:
                try:
                    complete(offset)
                except ValueError:
                    continue  # never registered: dropped (see ``mark``)
            return
        # The queue's bits as int64 (offsets of 2**63 and up read as negative), through a
        # temporary view that dies with the expression: an array whose buffer is exported
        # cannot be cleared.
        wm_v = self._wm_v
        shift = self._last_shift + wm_v
        rel = np.frombuffer(marks, dtype=np.int64) - shift
        del marks[:]
        live = self._end_v - wm_v
        if len(self._seg_v) == 1 and int(rel.view(np.uint64).max()) < live:
            # One segment and every mark in [watermark, end): rel is the position relative
            # to the watermark already. The common case.
            lo = wm_v & self._mask
            if self._gap_hi_v <= wm_v and lo + live <= len(self._buf):
                # No gap slot and no wrap in the live window: one scatter.
                self._ring[lo : lo + live][rel] = _DONE
                self._pending_exact = False
                return
            self._settle(rel)
            return
        rel += shift  # back to the offsets (wrapping arithmetic restores the bits)
        self._settle(self._relative(rel))

    def _relative(self, offsets: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        # Positions relative to the watermark of the marked offsets that lie in the live
        # window; stale ones and ones never registered are dropped. Mirrors complete() and
        # _locate() for any number of segments.
        if not self._started:  # nothing registered: every offset is beyond the end
            return _EMPTY
        offsets = offsets[offsets >= 0]  # 2**63 and up read as negative: beyond the end
        seg_v = np.array(self._seg_v, dtype=np.int64)
        seg_off = np.array(self._seg_off, dtype=np.int64)
        upper = np.append(seg_v[1:], self._end_v)  # one past each segment's last slot
        k = np.searchsorted(seg_off, offsets, side="right") - 1
        # An offset below every segment lands before segment 0's first slot, which is at or
        # below the watermark: stale, as complete() says.
        np.maximum(k, 0, out=k)
        v = offsets - seg_off[k] + seg_v[k]
        beyond = v >= upper[k]  # past the newest segment's end, or in a long gap
        rel = v[~beyond & (v >= self._wm_v)]
        rel -= self._wm_v
        return rel

    def _settle(self, rel: npt.NDArray[np.int64]) -> None:
        # Complete the slots at these positions relative to the watermark, all in the live
        # window (the array may be overwritten). Duplicates are harmless: a slot is set
        # twice. The pending count is not updated, since telling duplicates apart would
        # cost more than the rest of the fold: it becomes an upper bound (still 0 only when
        # nothing is pending, which _advance relies on) and is recounted when read.
        if rel.size == 0:
            return
        lo = self._wm_v & self._mask
        live = self._end_v - self._wm_v
        window = self._ring
        if lo + live <= len(window):  # the live window does not wrap: index a view of it
            window = window[lo : lo + live]
        else:
            rel += lo
            rel &= self._mask
        if self._gap_hi_v > self._wm_v:  # the live window may hold gap slots: skip them
            gaps = window[rel] == _GAP
            if gaps.any():
                rel = rel[~gaps]
        window[rel] = _DONE  # pending -> done; done stays done
        self._pending_exact = False

    def _recount(self) -> None:
        n = self._end_v - self._wm_v
        done = sum(
            int(np.count_nonzero(self._ring[lo:hi])) for lo, hi in self._spans(self._wm_v, n)
        )
        self._pending = n - done  # pending slots are the zero bytes of the live window
        self._pending_exact = True

    # ------------------------------------------------------------------ watermark

    def committable(self) -> int | None:
        """Advance the watermark and return the offset to commit.

        Returns:
            The first offset that is not complete (registered and pending), or one past
            the last registered offset when all are complete; the start offset when
            nothing was registered since; ``None`` if there is no position at all yet.
        """
        if self._marks:
            self._fold()
        if not self._started:
            return None
        self._advance()
        if self._wm_v == self._end_v:
            return self._end
        return self._wm_v + self._seg_off[0] - self._seg_v[0]  # _advance pruned the table

    def _advance(self) -> None:
        v, end = self._wm_v, self._end_v
        if self._pending == 0:
            v = end  # everything registered is complete: no scan needed
        elif self._buf[v & self._mask] != _PENDING:
            ring, mask = self._ring, self._mask
            while v < end:  # one numpy scan per chunk, never one Python step per offset
                lo = v & mask
                hi = min(lo + (end - v), len(ring), lo + _SCAN_CHUNK)
                chunk = ring[lo:hi]
                i = int(chunk.argmin())
                if chunk[i] == _PENDING:
                    v += i
                    break
                v += hi - lo
        if v == end:  # everything registered is complete: the count is known again
            self._pending = 0
            self._pending_exact = True
        self._wm_v = v
        # Drop segments that lie wholly below the watermark; keep the one holding it.
        k = bisect_right(self._seg_v, v) - 1
        if k > 0:
            del self._seg_v[:k]
            del self._seg_off[:k]

    # ------------------------------------------------------------------- the ring

    def _make_room(self, extra: int) -> None:
        # Reclaim completed slots first; grow only if the live window still does not fit.
        self._advance()
        need = self._end_v + extra - self._wm_v
        if need <= len(self._buf):
            return
        capacity = len(self._buf)
        while capacity < need:
            capacity *= 2  # doubling keeps growth amortized O(1) per registered offset
        window = self._read(self._wm_v, self._end_v - self._wm_v)
        self._alloc(capacity)
        self._write(self._wm_v, window)

    def _spans(self, v: int, n: int) -> list[tuple[int, int]]:
        # Slot ranges [lo, hi) covering virtual positions [v, v + n), split at the wrap.
        lo = v & self._mask
        if lo + n <= len(self._buf):
            return [(lo, lo + n)]
        return [(lo, len(self._buf)), (0, lo + n - len(self._buf))]

    def _fill(self, v: int, n: int, value: int) -> None:
        for lo, hi in self._spans(v, n):
            self._ring[lo:hi] = value

    def _read(self, v: int, n: int) -> npt.NDArray[np.uint8]:
        parts = [self._ring[lo:hi] for lo, hi in self._spans(v, n)]
        return parts[0].copy() if len(parts) == 1 else np.concatenate(parts)

    def _write(self, v: int, values: npt.NDArray[np.uint8]) -> None:
        done = 0
        for lo, hi in self._spans(v, len(values)):
            self._ring[lo:hi] = values[done : done + hi - lo]
            done += hi - lo

    # ---------------------------------------------------------------- checkpoints

    def export_completed(self) -> tuple[int, bytes] | None:
        """Export what is already done above the watermark, to skip it after a restart.

        Bit ``i`` (most significant bit first, as `numpy.packbits()`) is set when
        offset ``base + i`` needs no processing: it completed, or it is a gap. Trailing
        zero bits are cut, so the bitmap is empty when nothing above the watermark is done.
        Offsets of an imported checkpoint not yet registered again are included, so a
        quick second restart loses nothing. Long gaps are runs of ``0xff`` bytes, which
        compress well if the caller persists the bitmap.

        Returns:
            ``(base, bitmap)`` where ``base`` is `committable()`, or ``None`` if the
            tracker has no position yet.
        """
        base = self.committable()
        if base is None:
            return None
        parts: list[npt.NDArray[np.bool_]] = []
        for k, (seg_v, seg_off) in enumerate(zip(self._seg_v, self._seg_off, strict=True)):
            start_v = max(seg_v, self._wm_v)
            stop_v = self._seg_v[k + 1] if k + 1 < len(self._seg_v) else self._end_v
            if stop_v > start_v:
                parts.append(self._read(start_v, stop_v - start_v) != _PENDING)
            if k + 1 < len(self._seg_v):  # the long gap up to the next segment is done
                parts.append(np.ones(self._seg_off[k + 1] - (stop_v - seg_v + seg_off), bool))
        if self._preset is not None:
            tail = self._preset[max(0, self._end - self._preset_base) :].astype(bool)
            parts.append(np.zeros(max(0, self._preset_base - self._end), bool))
            parts.append(tail)
        bits = np.concatenate(parts) if parts else np.zeros(0, bool)
        marked = np.flatnonzero(bits)
        if marked.size == 0:
            return base, b""
        return base, np.packbits(bits[: int(marked[-1]) + 1]).tobytes()

    def import_completed(self, base: int, bitmap: bytes) -> None:
        """Load a checkpoint from `export_completed()` so finished records are skipped.

        Call it before registering the offsets it covers. Marked offsets that are
        registered later are registered as done and reported by `register_batch()`.
        Bits for offsets already registered are ignored (they are processed again, which
        at-least-once allows). A second import replaces the first.

        Args:
            base: the offset of the first bit.
            bitmap: the packed bits.

        Raises:
            ValueError: ``base`` is negative.
        """
        if base < 0:
            raise ValueError(f"offsets are non-negative, got {base}")
        bits = np.unpackbits(np.frombuffer(bitmap, dtype=np.uint8))
        if self._started and base < self._end:
            bits = bits[self._end - base :]
            base = self._end
        marked = np.flatnonzero(bits)
        if marked.size == 0:
            self._preset = None
            return
        self._preset = bits[: int(marked[-1]) + 1]
        self._preset_base = base

    def _preset_hits(self, run: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        assert self._preset is not None
        idx = run - self._preset_base
        inside = (idx >= 0) & (idx < len(self._preset))
        hits: npt.NDArray[np.int64] = run[inside][self._preset[idx[inside]].astype(bool)]
        if int(idx[-1]) + 1 >= len(self._preset):
            self._preset = None
        return hits
