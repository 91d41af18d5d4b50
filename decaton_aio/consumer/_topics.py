"""Assigned partitions whose topic is gone.

A group's assignment can name partitions that no longer exist: the group's leader assigns
from its own copy of the cluster's metadata, which the client refreshes only every
``metadata_max_age_ms`` (5 minutes by default), so a topic deleted while the group
rebalances can be assigned after its deletion. Such a partition is never fetched; while
the client keeps asking for its position no other partition led by the same broker is
fetched either, and a commit naming it is retried until it is given up, for every
partition it carries.

`TopicCheck` makes the subscription look at the cluster itself:

- when partitions are revoked (`TopicCheck.refresh()`): the revoked partitions found
  gone take no final commit;
- after each assignment, and every `CHECK_INTERVAL_S` while a fetched partition was
  never answered or its topic is no longer listed (`TopicCheck.suspect()`);

- at every metadata update of the fetching consumer (`TopicCheck.follow()`): a topic of
  the given partitions that the update does not list, or lists with fewer partitions, is
  remembered (`TopicCheck.vanished()`), even if a later update lists it again (a broker
  that creates topics on demand creates it again, empty, for the consumer's own metadata
  requests);

a partition found gone is held until the rebalance that takes it away, which the check
asks the group membership for at once (`TopicCheck.rejoin()`). So a stale assignment
ends with the next rebalance, at the latest `CHECK_INTERVAL_S` (and one metadata request)
after the deletion reached the cluster. A quiet subscription asks for nothing more than
its client already does.

The fetching consumer's own metadata is refreshed: aiokafka offers no public call for it.

Caller: the subscription's event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any, Final

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import IllegalStateError

from decaton_aio._aiokafka import AIOKafkaClient, ClusterMetadata, client_of, follow_cluster

__all__ = ["CHECK_INTERVAL_S", "REFRESH_TIMEOUT_S", "TopicCheck"]

#: How often a subscription looks for assigned partitions that might be gone.
CHECK_INTERVAL_S: Final = 5.0

#: How long one metadata refresh may take; past it the check waits for the next time.
REFRESH_TIMEOUT_S: Final = 2.0


class TopicCheck:
    """Finds the assigned partitions the cluster no longer has, for one consumer.

    Args:
        consumer: the consumer that fetches the partitions (or what answers as one:
            ``partitions_for_topic()``, ``highwater()``).
        rejoin: ``rejoin(reason)`` asks the group for the assignment again.
        client: the client whose metadata is followed and refreshed; by default the
            consumer's.
    """

    def __init__(
        self,
        consumer: AIOKafkaConsumer | Any,
        rejoin: Callable[[str], None],
        client: AIOKafkaClient | None = None,
    ) -> None:
        self._consumer = consumer
        self._client = client
        self._rejoin = rejoin
        self._unanswered: set[TopicPartition] = set()  # at the previous suspect()
        self._watched: set[TopicPartition] = set()
        self._vanished: set[TopicPartition] = set()

    def follow(self) -> Callable[[], None]:
        """Look at each metadata update of the consumer from now on (see the module
        docstring); returns the call that stops it."""
        return follow_cluster(self._metadata_client().cluster, self._updated)

    def _metadata_client(self) -> AIOKafkaClient:
        return self._client if self._client is not None else client_of(self._consumer)

    def watch(self, tps: Iterable[TopicPartition]) -> None:
        """The partitions whose disappearance `vanished()` reports (the live ones)."""
        self._watched = set(tps)
        self._vanished &= self._watched

    def vanished(self) -> set[TopicPartition]:
        """The watched partitions that a metadata update did not list since the last
        call (their topic was deleted, whether or not it exists again)."""
        found, self._vanished = self._vanished & self._watched, set()
        return found

    def has_vanished(self, tp: TopicPartition) -> bool:
        """Whether a metadata update did not list ``tp`` since the last `vanished()`."""
        return tp in self._vanished

    def _updated(self, cluster: ClusterMetadata) -> None:
        for tp in self._watched:
            partitions = cluster.partitions_for_topic(tp.topic)
            if partitions is None or tp.partition not in partitions:
                self._vanished.add(tp)

    async def refresh(self) -> bool:
        """Ask the cluster for the subscription's metadata now.

        Returns:
            Whether an answer came within `REFRESH_TIMEOUT_S`: only then does
            `missing()` speak for the cluster.
        """
        try:
            async with asyncio.timeout(REFRESH_TIMEOUT_S):
                return bool(await self._metadata_client().force_metadata_update())
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
        """Ask the group for the assignment again."""
        self._rejoin("assigned partitions no longer exist (topic deleted)")
