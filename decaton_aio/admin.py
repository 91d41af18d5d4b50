"""Topic administration: creating topics for tests and demos, and the side topics
(retry, dead letter, shaping) a subscription needs."""

from __future__ import annotations

import uuid
from typing import Any

import structlog
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError

from decaton_aio.app import Application
from decaton_aio.errors import BrokerError

__all__ = ["TopicAdmin", "ensure_side_topics"]

log = structlog.get_logger("decaton_aio.admin")


class TopicAdmin:
    """Creates uniquely named topics and deletes them again."""

    def __init__(self, bootstrap_servers: str) -> None:
        self._bootstrap_servers = bootstrap_servers
        self._client: AIOKafkaAdminClient | None = None
        self.created: list[str] = []

    async def create(
        self, partitions: int = 1, *, name: str | None = None, prefix: str = "test"
    ) -> str:
        """Create a topic and wait until its metadata is visible.

        Args:
            partitions: how many partitions.
            name: the exact name; ``<prefix>-<random>`` when omitted.
            prefix: the start of a generated name.

        Returns:
            The topic name.
        """
        if self._client is None:
            self._client = AIOKafkaAdminClient(bootstrap_servers=self._bootstrap_servers)
            await self._client.start()
        topic = name or f"{prefix}-{uuid.uuid4().hex[:12]}"
        response = await self._client.create_topics([NewTopic(topic, partitions, 1)])
        for item in getattr(response, "topic_errors", []):
            code = item[1]
            if code not in (0, 36):  # 36: TOPIC_ALREADY_EXISTS
                raise BrokerError(f"creating topic {topic!r} failed with error code {code}")
        self.created.append(topic)
        return topic

    async def close(self, *, delete: bool = True) -> None:
        """Delete the topics created here (best effort) and disconnect."""
        client, self._client = self._client, None
        if client is None:
            return
        try:
            if delete and self.created:
                await client.delete_topics(self.created)
        except Exception:
            pass
        finally:
            await client.close()


async def ensure_side_topics(bootstrap_servers: str, app: Application) -> None:
    """Create the retry, dead letter and shaping topics that do not exist yet, with as
    many partitions as their task topic. Best effort: without the permission to create
    topics, a warning says which to create."""
    wanted: dict[str, str] = {}
    for topic in app.topics:
        wanted[app.side_topics.dead_letter_topic(topic)] = topic
        if app.retry is not None and app.retry.mode == "queue":
            wanted[app.side_topics.retry_topic(topic)] = topic
        if app.shaping:
            wanted[app.side_topics.shaping_topic(topic)] = topic
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers)
    try:
        await admin.start()
        existing = set(await admin.list_topics())
        missing = {t: o for t, o in wanted.items() if t not in existing}
        if not missing:
            return
        described = await admin.describe_topics(list(set(missing.values())))
        shape = {d["topic"]: _shape_of(d) for d in described}
        await admin.create_topics([NewTopic(t, *shape.get(o, (1, 1))) for t, o in missing.items()])
        log.info("created side topics", topics=sorted(missing))
    except KafkaError as exc:
        log.warning(
            "cannot create side topics; create them yourself",
            topics=sorted(wanted),
            error=repr(exc),
        )
    finally:
        await admin.close()


def _shape_of(description: dict[str, Any]) -> tuple[int, int]:
    # Side topics copy their task topic: same partitions, same replication factor.
    partitions = description.get("partitions") or []
    replicas = len(partitions[0].get("replicas") or [1]) if partitions else 1
    return max(1, len(partitions)), max(1, replicas)
