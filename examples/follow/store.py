"""The follow service's state in SQLite: follow edges (the truth) and follow counts (derived).

This module owns the database file of the example: its schema, the one transaction that
applies a follow event, the recount that repairs a user, and the checks the demo, the tests
and the batch repair job rely on. Tables::

    follow_edges(follower, followee, active, version, event_id)   one row per pair ever seen
    follow_counts(user_id, followers, following)                  derived from the edges
    applied_events(event_id, applied_at_ms)                        events already applied

Why each event is applied once, whatever the delivery: the event id goes into
``applied_events`` in the same transaction as the edge and the counts, so a redelivered
event (a crash before the commit of its offset) finds its id and changes nothing. Why a
retried *old* event cannot undo a newer one (the "unfollow again" race): an edge
row keeps the version of the event that set it, and an event older than that is recorded
but ignored (last writer wins, by version then event id). Unfollowed pairs keep their row
with ``active = 0`` for that reason. A count moves only when an edge flips, so the counts
stay equal to the active edges.

Threading: SQLite calls block, so :class:`FollowStore` runs them on one dedicated thread
that owns the connection (WAL mode: readers in other processes never block it). A busy or
locked database raises :class:`TransientStoreError`, which the processors turn into a retry.
``applied_events`` grows with every event; a real service would drop ids older than the
longest possible redelivery delay.
"""

from __future__ import annotations

import asyncio
import enum
import random
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TypeVar

from examples.follow.tasks import FollowEvent

__all__ = [
    "ApplyOutcome",
    "FollowStore",
    "Mismatch",
    "Recount",
    "TransientStoreError",
    "active_edges",
    "corrupt_counts",
    "find_inconsistencies",
    "open_database",
]

T = TypeVar("T")

SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS follow_edges (
    follower INTEGER NOT NULL,
    followee INTEGER NOT NULL,
    active   INTEGER NOT NULL,          -- 1: follows; 0: unfollowed (row kept for its version)
    version  INTEGER NOT NULL,          -- version of the event that set the row
    event_id TEXT    NOT NULL,
    PRIMARY KEY (follower, followee)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS follow_edges_by_followee ON follow_edges (followee, active);
CREATE TABLE IF NOT EXISTS follow_counts (
    user_id   INTEGER PRIMARY KEY,
    followers INTEGER NOT NULL DEFAULT 0,
    following INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS applied_events (
    event_id      TEXT PRIMARY KEY,
    applied_at_ms INTEGER NOT NULL
) WITHOUT ROWID;
"""

_UPSERT_FOLLOWERS: Final = (
    "INSERT INTO follow_counts (user_id, followers) VALUES (?, ?) "
    "ON CONFLICT (user_id) DO UPDATE SET followers = followers + excluded.followers"
)
_UPSERT_FOLLOWING: Final = (
    "INSERT INTO follow_counts (user_id, following) VALUES (?, ?) "
    "ON CONFLICT (user_id) DO UPDATE SET following = following + excluded.following"
)

_INCONSISTENT_USERS: Final = """
WITH expected AS (
    SELECT user_id, SUM(followers) AS followers, SUM(following) AS following FROM (
        SELECT followee AS user_id, COUNT(*) AS followers, 0 AS following
          FROM follow_edges WHERE active = 1 GROUP BY followee
        UNION ALL
        SELECT follower, 0, COUNT(*) FROM follow_edges WHERE active = 1 GROUP BY follower
    ) GROUP BY user_id
),
users AS (SELECT user_id FROM expected UNION SELECT user_id FROM follow_counts)
SELECT u.user_id, COALESCE(e.followers, 0), COALESCE(e.following, 0),
       c.followers, c.following
  FROM users u
  LEFT JOIN expected e ON e.user_id = u.user_id
  LEFT JOIN follow_counts c ON c.user_id = u.user_id
 WHERE COALESCE(e.followers, 0) != COALESCE(c.followers, 0)
    OR COALESCE(e.following, 0) != COALESCE(c.following, 0)
 ORDER BY u.user_id
"""


class TransientStoreError(Exception):
    """Raised when the database is busy or locked: the same write may succeed later."""

    retriable = True


class ApplyOutcome(enum.Enum):
    """What applying one follow event did."""

    APPLIED = "applied"  # the edge flipped; both users' counts moved
    UNCHANGED = "unchanged"  # the edge already had this state (a repeated tap)
    STALE = "stale"  # a newer event of the pair was applied before: ignored
    DUPLICATE = "duplicate"  # this event was applied before (a redelivery): ignored


@dataclass(frozen=True)
class Mismatch:
    """A user whose stored counts disagree with the edges.

    Attributes:
        user_id: the user.
        expected_followers: active edges pointing at the user.
        expected_following: active edges from the user.
        stored_followers: the stored count, ``None`` when the user has no counts row.
        stored_following: the stored count, ``None`` when the user has no counts row.
    """

    user_id: int
    expected_followers: int
    expected_following: int
    stored_followers: int | None
    stored_following: int | None


@dataclass(frozen=True)
class Recount:
    """What a recount found and wrote for one user.

    Attributes:
        user_id: the user.
        before: ``(followers, following)`` stored before, ``None`` without a counts row.
        after: ``(followers, following)`` counted from the edges and stored.
    """

    user_id: int
    before: tuple[int, int] | None
    after: tuple[int, int]

    @property
    def changed(self) -> bool:
        """Whether the stored counts were wrong."""
        return self.before != self.after


def open_database(path: str | Path, *, busy_timeout_s: float = 5.0) -> sqlite3.Connection:
    """Open (and create) the database: WAL journal, the schema, autocommit mode.

    Transactions are explicit (``BEGIN IMMEDIATE`` ... ``COMMIT``): the connection is in
    autocommit mode, so nothing is held open between calls.

    Args:
        path: the database file.
        busy_timeout_s: how long a write waits for another writer before "database is
            locked".
    """
    conn = sqlite3.connect(path, timeout=busy_timeout_s, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    # In WAL mode NORMAL keeps every commit across a process crash (kill -9); only an
    # OS crash may lose the last commits.
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.executescript(SCHEMA)
    return conn


def _is_transient(exc: sqlite3.OperationalError) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def _in_transaction(conn: sqlite3.Connection, work: Callable[[sqlite3.Connection], T]) -> T:
    """Run ``work`` in one write transaction; busy/locked becomes TransientStoreError."""
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = work(conn)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return result
    except sqlite3.OperationalError as exc:
        if _is_transient(exc):
            raise TransientStoreError(f"sqlite: {exc}") from exc
        raise


def _apply(conn: sqlite3.Connection, event: FollowEvent) -> ApplyOutcome:
    now_ms = time.time_ns() // 1_000_000
    inserted = conn.execute(
        "INSERT OR IGNORE INTO applied_events (event_id, applied_at_ms) VALUES (?, ?)",
        (event.event_id, now_ms),
    )
    if inserted.rowcount == 0:
        return ApplyOutcome.DUPLICATE
    row = conn.execute(
        "SELECT active, version, event_id FROM follow_edges WHERE follower = ? AND followee = ?",
        event.pair,
    ).fetchone()
    if row is not None and (row[1], row[2]) >= event.order:
        return ApplyOutcome.STALE
    active = 1 if event.action == "follow" else 0
    conn.execute(
        "INSERT INTO follow_edges (follower, followee, active, version, event_id) "
        "VALUES (?, ?, ?, ?, ?) ON CONFLICT (follower, followee) DO UPDATE SET "
        "active = excluded.active, version = excluded.version, event_id = excluded.event_id",
        (event.follower, event.followee, active, event.version, event.event_id),
    )
    delta = active - (row[0] if row is not None else 0)
    if delta == 0:
        return ApplyOutcome.UNCHANGED
    conn.execute(_UPSERT_FOLLOWERS, (event.followee, delta))
    conn.execute(_UPSERT_FOLLOWING, (event.follower, delta))
    return ApplyOutcome.APPLIED


def _recount(conn: sqlite3.Connection, user_id: int) -> Recount:
    before = conn.execute(
        "SELECT followers, following FROM follow_counts WHERE user_id = ?", (user_id,)
    ).fetchone()
    (followers,) = conn.execute(
        "SELECT COUNT(*) FROM follow_edges WHERE followee = ? AND active = 1", (user_id,)
    ).fetchone()
    (following,) = conn.execute(
        "SELECT COUNT(*) FROM follow_edges WHERE follower = ? AND active = 1", (user_id,)
    ).fetchone()
    conn.execute(
        "INSERT INTO follow_counts (user_id, followers, following) VALUES (?, ?, ?) "
        "ON CONFLICT (user_id) DO UPDATE SET "
        "followers = excluded.followers, following = excluded.following",
        (user_id, followers, following),
    )
    return Recount(
        user_id, None if before is None else (before[0], before[1]), (followers, following)
    )


class FollowStore:
    """The database as the processors use it: async calls served by one owner thread.

    Args:
        path: the SQLite database file (created with the schema when missing).
        busy_timeout_s: how long a write waits for another writer before it fails with
            :class:`TransientStoreError`.
    """

    def __init__(self, path: str | Path, *, busy_timeout_s: float = 1.0) -> None:
        self.path = Path(path)
        self.busy_timeout_s = busy_timeout_s
        # One thread owns the connection: SQLite writes are serial anyway, and a single
        # owner needs no locking around the connection object.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="follow-store")
        self._conn: sqlite3.Connection | None = None

    def _connection(self) -> sqlite3.Connection:
        # Runs on the owner thread only.
        if self._conn is None:
            self._conn = open_database(self.path, busy_timeout_s=self.busy_timeout_s)
        return self._conn

    async def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: fn(self._connection()))

    async def apply(self, event: FollowEvent) -> ApplyOutcome:
        """Apply one follow event in one transaction (edge, counts and its event id).

        Raises:
            TransientStoreError: the database was busy or locked; nothing was written.
        """
        return await self._call(lambda conn: _in_transaction(conn, lambda c: _apply(c, event)))

    async def recount(self, user_id: int) -> Recount:
        """Count a user's active edges and store them as the user's counts.

        Raises:
            TransientStoreError: the database was busy or locked; nothing was written.
        """
        return await self._call(lambda conn: _in_transaction(conn, lambda c: _recount(c, user_id)))

    async def open(self) -> None:
        """Open the database now (creating the schema), so a bad path fails at startup
        instead of at the first event."""
        await self._call(lambda conn: None)

    async def close(self) -> None:
        """Close the connection and stop the owner thread (closing the last connection
        checkpoints the write-ahead log into the database file)."""

        def close() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, close)
        self._executor.shutdown(wait=True)


# --------------------------------------------------------------------------- checks


def find_inconsistencies(conn: sqlite3.Connection) -> list[Mismatch]:
    """Every user whose stored counts differ from the active edges (a missing row is 0/0).

    Reads one consistent snapshot (a single statement).
    """
    rows = conn.execute(_INCONSISTENT_USERS).fetchall()
    return [Mismatch(*row) for row in rows]


def active_edges(conn: sqlite3.Connection) -> set[tuple[int, int]]:
    """The ``(follower, followee)`` pairs that follow now."""
    rows = conn.execute("SELECT follower, followee FROM follow_edges WHERE active = 1")
    return {(a, b) for a, b in rows}


def corrupt_counts(conn: sqlite3.Connection, count: int, *, seed: int = 1) -> list[int]:
    """Break the counts of ``count`` users, the kinds of damage the repair job finds.

    For the demo and the tests: users with edges get a follower count off by a few, a
    following count off by a few, or their counts row deleted; one in four broken users
    is a phantom (a counts row for a user without edges). Each change is a real
    inconsistency.

    Returns:
        The ids of the users now inconsistent, sorted.

    Raises:
        ValueError: when fewer users than asked have counts rows to damage.
    """
    rng = random.Random(seed)
    users = [u for (u,) in conn.execute("SELECT user_id FROM follow_counts ORDER BY user_id")]
    phantoms = count // 4
    if len(users) < count - phantoms:
        raise ValueError(f"only {len(users)} users have counts; cannot break {count}")
    (top,) = conn.execute(
        "SELECT MAX(m) FROM (SELECT MAX(follower) AS m FROM follow_edges "
        "UNION ALL SELECT MAX(followee) FROM follow_edges UNION ALL "
        "SELECT MAX(user_id) FROM follow_counts)"
    ).fetchone()
    broken: list[int] = []
    conn.execute("BEGIN IMMEDIATE")
    try:
        for i, user in enumerate(rng.sample(users, count - phantoms)):
            (expected,) = conn.execute(
                "SELECT COUNT(*) FROM follow_edges WHERE (followee = ? OR follower = ?) "
                "AND active = 1",
                (user, user),
            ).fetchone()
            kind = i % 3
            if kind == 2 and expected > 0:
                conn.execute("DELETE FROM follow_counts WHERE user_id = ?", (user,))
            else:
                column = "followers" if kind == 0 else "following"
                delta = rng.choice([-3, -2, -1, 1, 2, 5])
                conn.execute(
                    f"UPDATE follow_counts SET {column} = {column} + ? WHERE user_id = ?",
                    (delta, user),
                )
            broken.append(user)
        for i in range(phantoms):
            phantom = (top or 0) + 1 + i
            conn.execute(
                "INSERT INTO follow_counts (user_id, followers, following) VALUES (?, 3, 1)",
                (phantom,),
            )
            broken.append(phantom)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return sorted(broken)
