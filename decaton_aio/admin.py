"""Topic administration: creating topics for tests and demos, and the side topics
(retry, dead letter, shaping) a subscription needs.

A subscription calls `ensure_side_topics()` before it joins its group: a side topic
that is missing and cannot be created stops the start with an error naming the topic and
the command that creates it, instead of stalling a partition at its first retry.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from dataclasses import dataclass
from typing import Any

import structlog
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError, TopicAlreadyExistsError, for_code

from decaton_aio._aiokafka import MetadataRequest, client_of
from decaton_aio._connect import start_admin
from decaton_aio.app import Application
from decaton_aio.errors import BrokerError, ConfigError
from decaton_aio.security import PLAINTEXT, SecuritySettings

__all__ = [
    "COPIED_TOPIC_CONFIGS",
    "DEFAULT_SIDE_TOPIC_REPLICATION",
    "TopicAdmin",
    "ensure_changelog_topic",
    "ensure_side_topics",
    "side_topics_of",
]

log = structlog.get_logger("decaton_aio.admin")


#: How long a created topic may take until every partition has a leader.
READY_TIMEOUT_S = 30.0


def _all_led(topics: list[Any], partitions: dict[str, int]) -> set[str]:
    """The topics of a metadata answer (``topics`` of its object form) known with at least
    as many partitions as ``partitions`` names (one at least), every one of them led."""
    ready = set()
    for described in topics:
        known = described.get("partitions") or []
        name = described["topic"]
        if (
            described.get("error_code", 0) == 0
            and len(known) >= max(1, partitions.get(name, 0))
            and all(p.get("leader", -1) >= 0 for p in known)
        ):
            ready.add(name)
    return ready


async def _wait_for_leaders(
    admin: AIOKafkaAdminClient, partitions: dict[str, int], timeout_s: float
) -> None:
    """Return once every topic in ``partitions`` has that many partitions with a leader,
    in the metadata of every node of the cluster.

    CreateTopics answers before every broker's metadata has the topic: under load, a
    client started at once can still be told by one node that the topic does not exist
    (each node learns it from the controller on its own), so each node is asked.

    Raises:
        BrokerError: not within ``timeout_s``.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    waiting = dict(partitions)
    while waiting:
        for name in _all_led(await admin.describe_topics(sorted(waiting)), waiting):
            del waiting[name]
        if waiting and loop.time() > deadline:
            raise BrokerError(
                f"topics {sorted(waiting)} were created but have partitions without a leader "
                f"after {timeout_s:g} s: check the brokers' health"
            )
        if waiting:
            await asyncio.sleep(0.05)
    client = client_of(admin)
    request = MetadataRequest(sorted(partitions), allow_auto_topic_creation=False)
    nodes = {broker.nodeId for broker in client.cluster.brokers()}
    while nodes:
        for node in sorted(nodes):
            try:
                answer = (await client.send(node, request)).to_object()
            except KafkaError:
                continue  # a node that cannot answer now is asked again
            if _all_led(answer["topics"], partitions) >= set(partitions):
                nodes.discard(node)
        if nodes and loop.time() > deadline:
            raise BrokerError(
                f"topics {sorted(partitions)} have leaders, but nodes {sorted(nodes)} do not "
                f"know them after {timeout_s:g} s: check the brokers' health"
            )
        if nodes:
            await asyncio.sleep(0.05)


class TopicAdmin:
    """Creates uniquely named topics and deletes them again.

    Args:
        bootstrap_servers: ``host:port[,host:port]`` of the cluster.
        security: TLS and SASL settings of the admin client.
    """

    #: How long `create()` waits for the new topic's partitions to have leaders.
    ready_timeout_s: float = READY_TIMEOUT_S

    def __init__(self, bootstrap_servers: str, *, security: SecuritySettings = PLAINTEXT) -> None:
        self._bootstrap_servers = bootstrap_servers
        self._security = security
        self._client: AIOKafkaAdminClient | None = None
        self.created: list[str] = []

    async def create(
        self,
        partitions: int = 1,
        *,
        name: str | None = None,
        prefix: str = "test",
        replication_factor: int = 1,
        configs: dict[str, str] | None = None,
    ) -> str:
        """Create a topic (an existing one of that name is taken as it is).

        Args:
            partitions: how many partitions.
            name: the exact name; ``<prefix>-<random>`` when omitted.
            prefix: the start of a generated name.
            replication_factor: replicas of each partition.
            configs: topic settings (``cleanup.policy``, ``retention.ms``, ...).

        Returns:
            The topic name, once every partition has a leader: a client that starts right
            after sees the whole topic.

        Raises:
            SecurityError: TLS or SASL failed.
            BrokerError: the cluster cannot be reached, refused the topic, or its
                partitions got no leader within ``ready_timeout_s``.
        """
        if self._client is None:
            self._client = await start_admin(self._bootstrap_servers, self._security)
        topic = name or f"{prefix}-{uuid.uuid4().hex[:12]}"
        response = await self._client.create_topics(
            [NewTopic(topic, partitions, replication_factor, topic_configs=configs or {})]
        )
        wanted = partitions
        for item in getattr(response, "topic_errors", []):
            code = item[1]
            if code == TopicAlreadyExistsError.errno:
                # Taken as it is: it may have another partition count (a broker that
                # auto-creates topics made it with its own), so any count is ready.
                wanted = 1
            elif code != 0:
                raise BrokerError(f"creating topic {topic!r} failed: {for_code(code).__name__}")
        self.created.append(topic)
        await _wait_for_leaders(self._client, {topic: wanted}, self.ready_timeout_s)
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


#: Settings of a task topic its side topics copy, so their retention and record size
#: limits match: a retry or dead letter record is never refused for being too large.
COPIED_TOPIC_CONFIGS = ("retention.ms", "max.message.bytes")

#: Replication factor of created side topics when not set: this, or fewer brokers.
DEFAULT_SIDE_TOPIC_REPLICATION = 3


@dataclass(frozen=True)
class _SideTopicPlan:
    """A side topic to create, shaped after its task topic."""

    name: str
    origin: str
    partitions: int
    replication_factor: int
    configs: dict[str, str]

    def command(self) -> str:
        """The command an operator runs to create it by hand."""
        configs = "".join(f" --config {k}={v}" for k, v in sorted(self.configs.items()))
        return (
            f"kafka-topics.sh --create --topic {self.name} --partitions {self.partitions} "
            f"--replication-factor {self.replication_factor}{configs}"
        )


def side_topics_of(app: Application) -> dict[str, str]:
    """The side topics ``app`` writes to or reads, each mapped to its task topic."""
    wanted: dict[str, str] = {}
    for topic in app.topics:
        wanted[app.side_topics.dead_letter_topic(topic)] = topic
        if app.retry is not None and app.retry.mode == "queue":
            wanted[app.side_topics.retry_topic(topic)] = topic
        if app.shaping:
            wanted[app.side_topics.shaping_topic(topic)] = topic
    return wanted


async def ensure_side_topics(
    bootstrap_servers: str, app: Application, *, security: SecuritySettings = PLAINTEXT
) -> list[str]:
    """Make sure the retry, dead letter and shaping topics of ``app`` exist.

    A missing side topic is created with as many partitions as its task topic, the task
    topic's ``retention.ms`` and ``max.message.bytes``, and the replication factor of
    ``app.side_topics.replication_factor`` (default: 3, or the number of brokers when the
    cluster has fewer). Every topic's creation result is checked.

    Returns:
        The side topics created now (empty when all existed).

    Raises:
        ConfigError: a task topic does not exist, or a side topic is missing and cannot be
            created (no permission, a policy, too few brokers); the message names the
            topic and the command to create it by hand. Starting without it would stall
            a partition at its first retry or dead letter.
        BrokerError: the cluster could not be asked.
        SecurityError: TLS or SASL failed.
    """
    wanted = side_topics_of(app)
    admin = await start_admin(bootstrap_servers, security)
    try:
        existing = set(await admin.list_topics())
        missing = {t: o for t, o in wanted.items() if t not in existing}
        if not missing:
            return []
        absent = sorted({o for o in missing.values() if o not in existing})
        if absent:
            raise ConfigError(
                f"task topic {', '.join(absent)} does not exist: create it before starting "
                "the subscription (its side topics copy its partition count)"
            )
        plans = await _plan(admin, missing, app.side_topics.replication_factor)
        response = await admin.create_topics(
            [
                NewTopic(p.name, p.partitions, p.replication_factor, topic_configs=p.configs)
                for p in plans
            ]
        )
        failures = _creation_failures(response, plans)
        if failures:
            raise ConfigError(
                "cannot create side topics, so the subscription would stall at the first "
                "retry or dead letter; create them (or let this client create topics) and "
                "start again: " + "; ".join(failures)
            )
        await _wait_for_leaders(admin, {p.name: p.partitions for p in plans}, READY_TIMEOUT_S)
    except KafkaError as exc:
        raise BrokerError(
            f"cannot check the side topics {sorted(wanted)} at {bootstrap_servers}: {exc!r}"
        ) from exc
    finally:
        await admin.close()
    created = sorted(p.name for p in plans)
    log.info("created side topics", topics=created)
    return created


async def _plan(
    admin: AIOKafkaAdminClient, missing: dict[str, str], replication_factor: int | None
) -> list[_SideTopicPlan]:
    origins = sorted(set(missing.values()))
    described = {d["topic"]: d for d in await admin.describe_topics(origins)}
    configs = await _topic_configs(admin, origins)
    if replication_factor is None:
        brokers = len((await admin.describe_cluster()).get("brokers") or []) or 1
        replication_factor = min(DEFAULT_SIDE_TOPIC_REPLICATION, brokers)
    return [
        _SideTopicPlan(
            name,
            origin,
            max(1, len(described.get(origin, {}).get("partitions") or [])),
            replication_factor,
            configs.get(origin, {}),
        )
        for name, origin in sorted(missing.items())
    ]


async def _topic_configs(
    admin: AIOKafkaAdminClient, topics: list[str]
) -> dict[str, dict[str, str]]:
    # The effective values, defaults included: a side topic keeps the task topic's limits
    # even if the broker defaults change later.
    resources = [
        ConfigResource(ConfigResourceType.TOPIC, t, dict.fromkeys(COPIED_TOPIC_CONFIGS))
        for t in topics
    ]
    found: dict[str, dict[str, str]] = {}
    try:
        responses = await admin.describe_configs(resources)
    except KafkaError as exc:
        # Copying is a courtesy: without DescribeConfigs the cluster defaults apply.
        log.warning(
            "cannot read the task topics' settings; side topics get the cluster defaults",
            topics=topics,
            error=repr(exc),
        )
        return found
    for response in responses:
        for resource in response.resources:
            error_code, _message, _type, name, entries = resource[:5]
            if error_code:
                continue  # a broker that cannot tell: create with the cluster defaults
            found[name] = {
                entry[0]: entry[1]
                for entry in entries
                if entry[0] in COPIED_TOPIC_CONFIGS and entry[1] is not None
            }
    return found


def _creation_failures(response: Any, plans: list[_SideTopicPlan]) -> list[str]:
    by_name = {p.name: p for p in plans}
    failures = []
    for item in getattr(response, "topic_errors", []):
        name, code = item[0], item[1]
        message = item[2] if len(item) > 2 and item[2] else ""
        if code in (0, TopicAlreadyExistsError.errno):  # another instance was faster
            continue
        error = for_code(code).__name__
        plan = by_name.get(name)
        fix = f"; run: {plan.command()}" if plan is not None else ""
        failures.append(f"{name}: {error}{(' ' + message) if message else ''}{fix}")
    return failures


async def ensure_changelog_topic(
    bootstrap_servers: str,
    app: Application,
    topic: str,
    *,
    security: SecuritySettings = PLAINTEXT,
) -> str | None:
    """Make sure ``topic``, the changelog of ``app``'s state store, exists.

    A missing one is created compacted (``cleanup.policy=compact``), with as many
    partitions as the task topics (which must agree: a key's state lives in the partition
    of its number), the task topic's ``max.message.bytes`` and the replication factor of
    the store's settings (default as for side topics).

    Returns:
        The changelog topic, ``None`` when the application has no state store.

    Raises:
        ConfigError: a task topic is missing, the task topics have different partition
            counts, the changelog has a different count, or it cannot be created (the
            message says how to create it by hand).
        BrokerError: the cluster could not be asked.
    """
    store = app.state
    if store is None:
        return None
    admin = await start_admin(bootstrap_servers, security)
    try:
        existing = set(await admin.list_topics())
        absent = sorted(t for t in app.topics if t not in existing)
        if absent:
            raise ConfigError(
                f"task topic {', '.join(absent)} does not exist: create it before starting "
                "the subscription (its state changelog copies its partition count)"
            )
        wanted = [*app.topics, topic] if topic in existing else list(app.topics)
        counts = {
            d["topic"]: len(d.get("partitions") or []) for d in await admin.describe_topics(wanted)
        }
        if len(set(counts.values())) > 1:
            raise ConfigError(
                f"state store {store.name!r} needs co-partitioned topics, but the partition "
                f"counts differ: {dict(sorted(counts.items()))}; give the task topics and "
                "the changelog the same count"
            )
        if topic in existing:
            return topic
        plan = (await _plan(admin, {topic: app.topics[0]}, store.replication_factor))[0]
        configs = {k: v for k, v in plan.configs.items() if k != "retention.ms"}
        configs["cleanup.policy"] = "compact"
        plan = dataclasses.replace(plan, configs=configs)
        response = await admin.create_topics(
            [NewTopic(topic, plan.partitions, plan.replication_factor, topic_configs=configs)]
        )
        failures = _creation_failures(response, [plan])
        if failures:
            raise ConfigError(
                "cannot create the state changelog topic, so no state change could be made "
                "durable; create it (or let this client create topics) and start again: "
                + "; ".join(failures)
            )
        await _wait_for_leaders(admin, {topic: plan.partitions}, READY_TIMEOUT_S)
    except KafkaError as exc:
        raise BrokerError(
            f"cannot check the changelog topic {topic} at {bootstrap_servers}: {exc!r}"
        ) from exc
    finally:
        await admin.close()
    log.info("created the state changelog topic", topic=topic, partitions=plan.partitions)
    return topic
