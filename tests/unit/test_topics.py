"""The topic check: which assigned partitions the cluster no longer has, and when a
subscription should ask the cluster (a stale assignment after a topic deletion)."""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import IllegalStateError

from decaton_aio._aiokafka import client_of
from decaton_aio.consumer import _topics
from decaton_aio.consumer._topics import TopicCheck

A0, A1, B0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)


class FakeConsumer:
    """What the check reads of a consumer: its metadata and fetch answers (and counts the
    rejoins the check asks the group for)."""

    def __init__(self) -> None:
        self.topics: dict[str, set[int]] = {"a": {0, 1}, "b": {0}}
        self.answered: dict[TopicPartition, int] = {}
        self.assigned = {A0, A1, B0}
        self.rejoins = 0
        self.refreshed = 0
        outer = self

        class Client:
            def force_metadata_update(self) -> asyncio.Future[bool]:
                outer.refreshed += 1
                done = asyncio.get_running_loop().create_future()
                done.set_result(True)
                return done

        self._client = Client()
        self.reasons: list[str] = []

    def rejoin(self, reason: str) -> None:
        self.rejoins += 1
        self.reasons.append(reason)

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return self.topics.get(topic)

    def highwater(self, tp: TopicPartition) -> int | None:
        if tp not in self.assigned:
            raise IllegalStateError(f"{tp} not assigned")
        return self.answered.get(tp)


def check() -> tuple[TopicCheck, FakeConsumer]:
    consumer = FakeConsumer()
    return TopicCheck(consumer, consumer.rejoin), consumer  # type: ignore[arg-type]


def test_a_deleted_topic_and_a_partition_beyond_a_smaller_topic_are_missing() -> None:
    """A topic the metadata does not list is gone; so is a partition number a topic
    created again with fewer partitions does not have."""
    topics, consumer = check()
    assert topics.missing([A0, A1, B0]) == []
    del consumer.topics["b"]
    consumer.topics["a"] = {0}
    assert topics.missing([A0, A1, B0]) == [A1, B0]


def test_a_partition_never_answered_across_two_looks_is_suspect() -> None:
    """A fetched partition without any fetch answer is suspect only when it still has
    none at the next look (a new one gets its first answer quickly); answered ones and
    ones no longer assigned to the client are not."""
    topics, consumer = check()
    consumer.answered = {A0: 5, A1: 3}
    assert not topics.suspect([A0, A1, B0])  # B0: first look
    consumer.answered[B0] = 0
    assert not topics.suspect([A0, A1, B0])  # answered meanwhile
    consumer.answered.pop(B0)
    consumer.assigned.discard(B0)
    assert not topics.suspect([A0, A1, B0])
    consumer.assigned.add(B0)
    assert not topics.suspect([A0, A1, B0])
    assert topics.suspect([A0, A1, B0])


def test_a_partition_whose_topic_is_no_longer_listed_is_suspect_at_once() -> None:
    """A fetch refused for an unknown topic makes the client read its metadata again:
    the topic missing from it is suspect at the first look."""
    topics, consumer = check()
    consumer.answered = {A0: 5, A1: 3, B0: 1}
    assert not topics.suspect([A0, A1, B0])
    del consumer.topics["b"]
    assert topics.suspect([A0, A1, B0])


async def test_refresh_asks_the_cluster_and_rejoin_asks_the_group() -> None:
    """refresh() has the client read the metadata now (True once answered); rejoin()
    asks the group to rebalance."""
    topics, consumer = check()
    assert await topics.refresh()
    assert consumer.refreshed == 1
    topics.rejoin()
    assert consumer.rejoins == 1
    assert "topic deleted" in consumer.reasons[0]


async def test_a_refresh_without_answer_says_so(monkeypatch: Any) -> None:
    """A metadata request the cluster does not answer in time leaves the check to the
    next time, rather than judging from old metadata."""
    monkeypatch.setattr(_topics, "REFRESH_TIMEOUT_S", 0.01)
    topics, consumer = check()
    client_of(consumer).force_metadata_update = lambda: asyncio.get_running_loop().create_future()
    assert not await topics.refresh()
