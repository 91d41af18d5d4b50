"""The local copy of one partition of a state store: an SQLite database per partition.

A `LocalStore` holds the values of the keys of one partition number (raw bytes, as
they are in the changelog) and the *checkpoint*: the changelog offset up to which every
change is in the database. Changes come from two places, both after the changelog has
them:

- a task's change, once the changelog acknowledged it (`LocalStore.begin()` when it is
  sent, `LocalStore.acked()` with its offset);
- a restore or a standby, reading the changelog (`LocalStore.replay()`);
- with exactly-once, a task's change sent in its partition's transaction waits in the
  copy's `LocalStore.overlay` (reads see it) and is applied when that transaction
  commits (`LocalStore.apply_committed()`); an abort discards it.

Writes go into an open SQLite transaction; `LocalStore.flush()` commits it together
with the checkpoint, so a database that survives a crash is consistent with its
checkpoint. Values may be ahead of the checkpoint (a change acknowledged out of order):
replaying from the checkpoint to the end of the changelog writes every later value again,
last write wins, so that is harmless.

The checkpoint only covers changes acknowledged in the order they were sent: a change
sent earlier but acknowledged later holds it back (`LocalStore.acked()`).

Caller: the event loop that owns the partition; nothing here is thread-safe.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections import deque
from pathlib import Path

from decaton_aio.consumer.state._overlay import MISSING, Overlay, Staged

__all__ = ["LocalStore"]

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS kv (k BLOB PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS checkpoint (id INTEGER PRIMARY KEY CHECK (id = 0), "
    "next_offset INTEGER NOT NULL)",
)


class _Write:
    """A task's change sent to the changelog and not acknowledged yet."""

    __slots__ = ("offset",)

    def __init__(self) -> None:
        self.offset = -1


class LocalStore:
    """The local values of one partition of a store, with their changelog checkpoint.

    Args:
        path: the database file; ``None`` for an in-memory database (nothing survives
            the process, so a restore reads the whole changelog partition).
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(":memory:" if path is None else str(path))
        # The changelog is the source of truth: a database that loses its last commits
        # in a power failure only replays more. WAL keeps commits cheap.
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        for statement in _SCHEMA:
            self._db.execute(statement)
        row = self._db.execute("SELECT next_offset FROM checkpoint WHERE id = 0").fetchone()
        self._db.commit()
        #: The changelog offset every change below is in the database (committed or not).
        self.position = int(row[0]) if row else 0
        self._committed = self.position
        self._unacked: deque[_Write] = deque()
        self._dirty = False
        self.closed = False
        #: Changes of open transactions (exactly-once only; ``None`` otherwise).
        self.overlay: Overlay | None = None
        self._committed_end = 0  # past the last change committed by a transaction

    @property
    def checkpoint(self) -> int:
        """The checkpoint in the database file: where a restore of this file starts."""
        return self._committed

    def get(self, key: bytes) -> bytes | None:
        """The value of ``key``, ``None`` when it has none (an open transaction's change
        first)."""
        overlay = self.overlay
        if overlay is not None:
            found = overlay.lookup(key)
            if found is not MISSING:
                return found  # type: ignore[return-value]
        row = self._db.execute("SELECT v FROM kv WHERE k = ?", (key,)).fetchone()
        return None if row is None else bytes(row[0])

    def __len__(self) -> int:
        return int(self._db.execute("SELECT count(*) FROM kv").fetchone()[0])

    def _put(self, key: bytes, value: bytes | None) -> None:
        if value is None:
            self._db.execute("DELETE FROM kv WHERE k = ?", (key,))
        else:
            self._db.execute("INSERT OR REPLACE INTO kv (k, v) VALUES (?, ?)", (key, value))
        self._dirty = True

    def replay(self, key: bytes | None, value: bytes | None, offset: int) -> None:
        """Apply a changelog record read at ``offset`` (restore, standby)."""
        if key is not None:
            self._put(key, value)
        if offset >= self.position:
            self.position = offset + 1
            self._dirty = True

    def skip_to(self, offset: int) -> None:
        """The changelog has nothing more to read below ``offset`` (its end, past
        compacted records or transaction markers)."""
        if offset > self.position:
            self.position = offset
            self._dirty = True

    def reset(self) -> None:
        """Forget every value and start again from the changelog's first offset: the
        changelog no longer holds what this copy was restored from (it was recreated).
        Caller: a restore, before the partition's tasks run."""
        self._db.execute("DELETE FROM kv")
        self.position = 0
        self._dirty = True
        self.flush()

    def begin(self) -> _Write:
        """A task's change is being sent to the changelog; pass the handle to
        `acked()` with the offset the changelog gave it."""
        write = _Write()
        self._unacked.append(write)
        return write

    def acked(self, write: _Write, key: bytes, value: bytes | None, offset: int) -> None:
        """The changelog has the change at ``offset``: apply it; the checkpoint passes
        every change acknowledged in sending order."""
        write.offset = offset
        self._put(key, value)
        unacked = self._unacked
        while unacked and unacked[0].offset >= 0:
            done = unacked.popleft()
            if done.offset >= self.position:
                self.position = done.offset + 1

    def apply_committed(self, changes: list[Staged]) -> None:
        """The transaction holding ``changes`` (taken from the overlay, in sending order)
        committed: apply them; the position passes them, but not a change still open."""
        end = self._committed_end
        for change in changes:
            if not change.superseded:
                self._put(change.key, change.value)
            end = max(end, change.offset + 1)
        self._committed_end = position = end
        floor = self.overlay.floor() if self.overlay is not None else None
        if floor is not None:
            position = min(position, floor if floor >= 0 else self.position)
        if position > self.position:
            self.position = position
            self._dirty = True

    def abandon(self, write: _Write) -> None:
        """A change that was never acknowledged (its partition closed): forget it."""
        with contextlib.suppress(ValueError):
            self._unacked.remove(write)

    def flush(self) -> None:
        """Commit the values and the checkpoint (cheap when nothing changed)."""
        if not self._dirty or self.closed:
            return
        self._db.execute(
            "INSERT OR REPLACE INTO checkpoint (id, next_offset) VALUES (0, ?)", (self.position,)
        )
        self._db.commit()
        self._committed = self.position
        self._dirty = False

    def close(self) -> None:
        """Flush and close the database."""
        if self.closed:
            return
        self.flush()
        self.closed = True
        self._db.close()
