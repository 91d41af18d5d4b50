"""Follow traffic for the demo and the tests: generated events and their expected outcome.

This module owns the synthetic workload: :func:`generate_events` makes follow/unfollow
events the way a platform server would emit them (a few hot influencers get a large share,
and some of their followers tap follow/unfollow in quick bursts, which compaction folds);
:func:`expected_edges` says which pairs must follow once every event is applied, whatever
the delivery order; :func:`produce_events` puts events on the topic, keyed by followee.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterable, Sequence
from typing import Final

from decaton_aio import RecordLocation, TaskProducer
from examples.follow.tasks import FollowEvent

__all__ = ["HOT_USERS", "expected_edges", "generate_events", "produce_events"]

HOT_USERS: Final = (1, 2, 3)
"""The influencers of the generated traffic."""

_BASE_VERSION: Final = 1_700_000_000_000


def generate_events(
    count: int,
    *,
    users: int = 2000,
    hot_users: Sequence[int] = HOT_USERS,
    hot_share: float = 0.4,
    burst_share: float = 0.15,
    seed: int = 7,
) -> list[FollowEvent]:
    """Make ``count`` follow/unfollow events over users ``1..users``.

    Each event flips its pair (follow when not following, else unfollow), except a few
    repeated taps that restate the current state. ``hot_share`` of the events target a hot
    user; a ``burst_share`` of those are bursts of 2-5 flips of one pair in a row.
    Versions grow by one per event.

    Args:
        count: how many events.
        users: user ids are ``1..users``.
        hot_users: the influencers.
        hot_share: the fraction of events aimed at an influencer.
        burst_share: the fraction of influencer picks that start a burst.
        seed: the random seed (the same seed gives the same events).
    """
    rng = random.Random(seed)
    following: dict[tuple[int, int], bool] = {}
    events: list[FollowEvent] = []
    while len(events) < count:
        hot = rng.random() < hot_share
        followee = rng.choice(hot_users) if hot else rng.randint(1, users)
        follower = rng.randint(1, users)
        if follower == followee:
            continue
        burst = rng.randint(2, 5) if hot and rng.random() < burst_share else 1
        for _ in range(min(burst, count - len(events))):
            now = following.get((follower, followee), False)
            follows = not now if rng.random() > 0.03 else now  # 3%: a repeated tap
            following[(follower, followee)] = follows
            events.append(
                FollowEvent(
                    event_id=f"{seed:x}-{len(events):08d}",
                    action="follow" if follows else "unfollow",
                    follower=follower,
                    followee=followee,
                    version=_BASE_VERSION + len(events),
                )
            )
    return events


def expected_edges(events: Iterable[FollowEvent]) -> set[tuple[int, int]]:
    """The pairs that follow once every event is applied: the newest event of each pair."""
    newest: dict[tuple[int, int], FollowEvent] = {}
    for event in events:
        seen = newest.get(event.pair)
        if seen is None or event.order > seen.order:
            newest[event.pair] = event
    return {pair for pair, event in newest.items() if event.action == "follow"}


async def produce_events(
    producer: TaskProducer[FollowEvent], events: Iterable[FollowEvent], *, window: int = 2000
) -> list[RecordLocation]:
    """Put events keyed by followee, ``window`` in flight at a time; return where they landed."""
    locations: list[RecordLocation] = []
    pending = []
    for event in events:
        pending.append(await producer.submit(event.key, event, timestamp_ms=None))
        if len(pending) >= window:
            locations += await asyncio.gather(*pending)
            pending.clear()
    locations += await asyncio.gather(*pending)
    return locations
