"""Baseline watermark trackers, to benchmark ours (`WatermarkTracker` of the consumer).

Both follow the designs Decaton went through, written from the idea only:

* :class:`HeapqTracker`: Decaton's first design. Fetched offsets are queued in order,
  completed offsets go into a priority queue, and the watermark advances while the smallest
  completed offset equals the oldest fetched one ("zip" the two).
* :class:`DequeFlagsTracker`: Decaton's later design. Each fetched offset gets a small
  state object with a completion flag, kept in fetch order; a completion flips its own
  flag and the watermark pointer walks over completed states from the head.

Both offer what the benchmark calls, as the real tracker does (``register_batch``,
``complete``, ``committable``, ``pending``). They assume valid use: offsets registered in
increasing order and each completed at most once. Gaps are handled the same way: only
registered offsets can hold the watermark back.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable


class HeapqTracker:
    """Watermark from a heap of completed offsets zipped with the fetched offsets.

    Args:
        start_offset: the fetch position, or ``None`` to start at the first registered
            offset.
    """

    def __init__(self, start_offset: int | None = None) -> None:
        self.reset(start_offset)

    def reset(self, start_offset: int | None = None) -> None:
        """Forget everything and start again at ``start_offset``."""
        self._fetched: deque[int] = deque()
        self._completed: list[int] = []
        self._end = start_offset

    @property
    def pending(self) -> int:
        """Registered offsets not yet complete."""
        return len(self._fetched) - len(self._completed)

    def register(self, offset: int) -> bool:
        """Register one fetched offset as pending.

        Returns:
            Always ``False``: no checkpoint support.
        """
        self._fetched.append(offset)
        self._end = offset + 1
        return False

    def register_batch(self, offsets: Iterable[int]) -> None:
        """Register fetched offsets in increasing order."""
        for offset in offsets:
            self.register(int(offset))

    def complete(self, offset: int) -> None:
        """Mark an offset complete: push it on the heap."""
        heapq.heappush(self._completed, offset)

    def committable(self) -> int | None:
        """Pop contiguous completions and return the first offset not complete.

        Returns:
            The commit offset, or ``None`` before any position is known.
        """
        fetched, completed = self._fetched, self._completed
        while completed and fetched and completed[0] == fetched[0]:
            heapq.heappop(completed)
            fetched.popleft()
        return fetched[0] if fetched else self._end


class _OffsetState:
    """Completion flag of one fetched offset."""

    __slots__ = ("done", "offset")

    def __init__(self, offset: int) -> None:
        self.offset = offset
        self.done = False


class DequeFlagsTracker:
    """Watermark from a deque of per-offset flag objects with a moving head.

    Args:
        start_offset: the fetch position, or ``None`` to start at the first registered
            offset.
    """

    def __init__(self, start_offset: int | None = None) -> None:
        self.reset(start_offset)

    def reset(self, start_offset: int | None = None) -> None:
        """Forget everything and start again at ``start_offset``."""
        self._states: deque[_OffsetState] = deque()
        # A completion reaches its own state object directly (in Java the task holds a
        # reference to it); here the offset is the handle, so map offset -> state.
        self._by_offset: dict[int, _OffsetState] = {}
        self._end = start_offset

    @property
    def pending(self) -> int:
        """Registered offsets not yet complete."""
        return len(self._by_offset)

    def register(self, offset: int) -> bool:
        """Register one fetched offset as pending.

        Returns:
            Always ``False``: no checkpoint support.
        """
        state = _OffsetState(offset)
        self._states.append(state)
        self._by_offset[offset] = state
        self._end = offset + 1
        return False

    def register_batch(self, offsets: Iterable[int]) -> None:
        """Register fetched offsets in increasing order."""
        for offset in offsets:
            self.register(int(offset))

    def complete(self, offset: int) -> None:
        """Mark an offset complete: flip its own flag."""
        self._by_offset.pop(offset).done = True

    def committable(self) -> int | None:
        """Walk the head over completed states and return the first offset not complete.

        Returns:
            The commit offset, or ``None`` before any position is known.
        """
        states = self._states
        while states and states[0].done:
            states.popleft()
        return states[0].offset if states else self._end
