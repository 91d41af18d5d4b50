"""The changes of open transactions over a local state copy (exactly-once).

With exactly-once a task's state change is sent into its partition's open transaction.
Until that transaction commits the change is not in the changelog for anyone else, so it
must not be in the local copy either (an abort would leave the copy ahead of the
changelog, and the task that made it runs again). An `Overlay` keeps those changes
per transaction (its *owner*):

- `Overlay.stage()`: a change was sent in the owner's transaction; reads see it at
  once (the key's next task reads its own key's latest value);
- `Overlay.take()`: the owner's transaction committed: its changes leave the overlay,
  in sending order, for the caller to apply to the copy with their changelog offsets
  (an older open change of the same key in another transaction is superseded: still open
  for the checkpoint, never applied);
- `Overlay.discard()`: the owner's transaction was aborted (or its partition went back
  to its last commit): its changes vanish, reads see the copy again.

Several owners may share one copy (the same partition number of several topics); a read
sees the latest change staged by any of them. `Overlay.floor()` tells how far the
copy's checkpoint may go without passing a change that is still open.

A pure state machine: no I/O, no clock. Caller: the event loop that owns the copy.
"""

from __future__ import annotations

from collections.abc import Hashable

__all__ = ["MISSING", "Overlay", "Staged"]

#: What `Overlay.lookup()` returns for a key no open transaction changed.
MISSING = object()


class Staged:
    """One change sent in an open transaction; ``offset`` is its changelog offset once the
    broker assigned it (-1 before); ``superseded`` once another transaction committed a
    newer change of its key (its commit must not bring the older value back)."""

    __slots__ = ("key", "offset", "superseded", "value")

    def __init__(self, key: bytes, value: bytes | None) -> None:
        self.key = key
        self.value = value
        self.offset = -1
        self.superseded = False


class _Open:
    """The changes of one owner's open transaction."""

    __slots__ = ("latest", "staged")

    def __init__(self) -> None:
        self.latest: dict[bytes, tuple[int, bytes | None]] = {}  # key -> (sequence, value)
        self.staged: list[Staged] = []


class Overlay:
    """The open transactions' changes of one local copy."""

    def __init__(self) -> None:
        self._open: dict[Hashable, _Open] = {}
        self._sequence = 0

    def __len__(self) -> int:
        """How many changes are open (staged and neither taken nor discarded)."""
        return sum(len(o.staged) for o in self._open.values())

    def stage(self, owner: Hashable, key: bytes, value: bytes | None) -> Staged:
        """``owner``'s open transaction holds the change ``key`` -> ``value`` (``None``:
        deleted); set the returned handle's ``offset`` once the broker gave one."""
        changes = self._open.get(owner)
        if changes is None:
            changes = self._open[owner] = _Open()
        self._sequence += 1
        changes.latest[key] = (self._sequence, value)
        staged = Staged(key, value)
        changes.staged.append(staged)
        return staged

    def lookup(self, key: bytes) -> object:
        """The latest open change of ``key`` (``None``: deleted), or `MISSING`."""
        best = -1
        found: object = MISSING
        for changes in self._open.values():
            entry = changes.latest.get(key)
            if entry is not None and entry[0] > best:
                best, found = entry
        return found

    def take(self, owner: Hashable) -> list[Staged]:
        """``owner``'s transaction committed: its changes in sending order (they leave the
        overlay)."""
        changes = self._open.pop(owner, None)
        if changes is None:
            return []
        for other in self._open.values():
            # An older open change of the same key is superseded: the copy gets the newer.
            older = [
                key
                for key, (sequence, _) in changes.latest.items()
                if key in other.latest and other.latest[key][0] < sequence
            ]
            for key in older:
                del other.latest[key]
            if older:
                gone = set(older)
                for staged in other.staged:
                    if staged.key in gone:
                        staged.superseded = True
        return changes.staged

    def discard(self, owner: Hashable) -> int:
        """``owner``'s transaction was aborted: forget its changes; how many there were."""
        changes = self._open.pop(owner, None)
        return 0 if changes is None else len(changes.staged)

    def floor(self) -> int | None:
        """The lowest changelog offset a committed copy's checkpoint may reach while the
        open changes stay open: their lowest offset, -1 when one has no offset yet (the
        checkpoint must not move), ``None`` when nothing is open."""
        lowest: int | None = None
        for changes in self._open.values():
            for staged in changes.staged:
                if staged.offset < 0:
                    return -1
                if lowest is None or staged.offset < lowest:
                    lowest = staged.offset
        return lowest
