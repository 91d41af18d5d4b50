"""Assigned partitions whose topic is gone.

A group's assignment can name partitions that no longer exist: the group's leader assigns
from its own copy of the cluster's metadata, which the client refreshes only every
``metadata_max_age_ms`` (5 minutes by default), so a topic deleted while the group
rebalances can be assigned after its deletion. Such a partition is never fetched; while
the client keeps asking for its position no other partition led by the same broker is
fetched either, and a commit naming it is retried until it is given up, for every
partition it carries.

`TopicCheck` makes the subscription look at the cluster itself:

- before each rejoin (the revoke listener, `TopicCheck.refresh()`): the revoked
  partitions found gone take no final commit, and the member assigns from this view if
  it leads the group;
- after each assignment, and every `CHECK_INTERVAL_S` while a fetched partition was
  never answered or its topic is no longer listed (`TopicCheck.suspect()`);

a partition found gone is held until the rebalance that takes it away, which the check
asks for at once (`TopicCheck.rejoin()`). So a stale assignment ends with the next
rebalance, at the latest `CHECK_INTERVAL_S` (and one metadata request) after the
deletion reached the cluster. A quiet subscription asks for nothing more than its
client already does.

The client's own metadata is refreshed (the copy the group's leader assigns from, and whose
change makes a leader rejoin): aiokafka offers no public call for it, nor for a rejoin.

Caller: the subscription's event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Final

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import IllegalStateError

from decaton_aio._aiokafka import client_of, request_rejoin

__all__ = ["CHECK_INTERVAL_S", "REFRESH_TIMEOUT_S", "TopicCheck"]

#: How often a subscription looks for assigned partitions that might be gone.
CHECK_INTERVAL_S: Final = 5.0

#: How long one metadata refresh may take; past it the check waits for the next time.
REFRESH_TIMEOUT_S: Final = 2.0


class TopicCheck:
    """Finds the assigned partitions the cluster no longer has, for one consumer."""

    def __init__(self, consumer: AIOKafkaConsumer) -> None:
        self._consumer = consumer
        self._unanswered: set[TopicPartition] = set()  # at the previous suspect()

    async def refresh(self) -> bool:
        """Ask the cluster for the subscription's metadata now.

        Returns:
            Whether an answer came within `REFRESH_TIMEOUT_S`: only then does
            `missing()` speak for the cluster.
        """
        try:
            async with asyncio.timeout(REFRESH_TIMEOUT_S):
                return bool(await client_of(self._consumer).force_metadata_update())
        except TimeoutError:
            return False

    def missing(self, tps: Iterable[TopicPartition]) -> list[TopicPartition]:
        """Those of ``tps`` that the consumer's metadata does not list: a deleted topic,
        or one created again with fewer partitions."""
        found = []
        for tp in tps:
            partitions = self._consumer.partitions_for_topic(tp.topic)
            if partitions is None or tp.partition not in partitions:
                found.append(tp)
        return found

    def suspect(self, fetched: Iterable[TopicPartition]) -> bool:
        """Whether one of ``fetched`` (live, not held) may be gone: its topic is no
        longer listed (a fetch was refused), or no fetch has answered for it since the
        previous call (a partition the cluster does not have never gets an answer)."""
        fetched = list(fetched)
        unanswered = {tp for tp in fetched if not self._answered(tp)}
        before, self._unanswered = self._unanswered, unanswered
        return bool(unanswered & before) or bool(self.missing(fetched))

    def _answered(self, tp: TopicPartition) -> bool:
        try:
            return self._consumer.highwater(tp) is not None
        except (AssertionError, IllegalStateError):
            return True  # no longer assigned to the client: a rebalance decides

    def rejoin(self) -> None:
        """Ask the group to rebalance (each member of this runtime refreshes its metadata
        before it joins again, see `refresh()`)."""
        request_rejoin(self._consumer)
