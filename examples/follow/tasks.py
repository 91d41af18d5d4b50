"""The tasks of the follow service: follow/unfollow events and repair requests.

This module owns the task types (msgspec structs, JSON on the wire) and the topic names
of the example:

- :class:`FollowEvent` on ``follow-events``, keyed by the *followee's* user id, so every
  event about one influencer lands in one partition and one key lane, where a burst of
  them can be compacted;
- :class:`RepairTask` on ``follow-repairs``, keyed by the user id whose counts look wrong;
  the batch repair job (``spark_jobs.batch_repair``) writes these.
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec

__all__ = ["FOLLOW_TOPIC", "REPAIR_TOPIC", "FollowEvent", "RepairTask"]

FOLLOW_TOPIC: Final = "follow-events"
"""Where follow and unfollow events go."""
REPAIR_TOPIC: Final = "follow-repairs"
"""Where repair tasks go (one per user whose counts disagree with the edges)."""


class FollowEvent(msgspec.Struct, frozen=True):
    """One user followed or unfollowed another.

    Attributes:
        event_id: unique id of the action; a redelivered event carries the same id.
        action: ``"follow"`` or ``"unfollow"``.
        follower: the user who acted.
        followee: the user followed or unfollowed (the record key).
        version: when the user acted (epoch ms, or any number that grows with each action
            of one pair). The edge of a pair keeps the state of its highest version, so a
            retried old event can never overwrite a newer one (versions are
            timestamps); ties are broken by ``event_id``.
    """

    event_id: str
    action: Literal["follow", "unfollow"]
    follower: int
    followee: int
    version: int

    @property
    def key(self) -> str:
        """The record key: the followee's user id."""
        return str(self.followee)

    @property
    def pair(self) -> tuple[int, int]:
        """``(follower, followee)``: the edge this event sets."""
        return (self.follower, self.followee)

    @property
    def order(self) -> tuple[int, str]:
        """What decides which of two events of one pair is newer."""
        return (self.version, self.event_id)


class RepairTask(msgspec.Struct, frozen=True):
    """Recount one user's follower and following counts from the edge table.

    The batch repair job fills in what it saw; the repair processor ignores those numbers
    (they may be stale by the time the task runs) and recounts from the edges.

    Attributes:
        user_id: the user to recount (also the record key).
        expected_followers: followers the job counted in the edges.
        expected_following: followings the job counted in the edges.
        stored_followers: the stored count the job saw (``None``: no counts row).
        stored_following: the stored count the job saw (``None``: no counts row).
        detected_at_ms: when the job ran, epoch ms.
    """

    user_id: int
    expected_followers: int | None = None
    expected_following: int | None = None
    stored_followers: int | None = None
    stored_following: int | None = None
    detected_at_ms: int = 0
