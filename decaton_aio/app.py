"""The application object: what to consume, how to decode it, and the processor.

An :class:`Application` is plain configuration, no global state: ``python -m decaton_aio
run module:app`` imports one (or a bare ``async def process(ctx, task)`` function) and
command-line flags override its fields. :class:`ConsumerConfig` holds the Kafka consumer
settings, kept apart so the same application runs against any cluster.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from decaton_aio.completion import DeferredTimeoutPolicy
from decaton_aio.context import TaskFunction
from decaton_aio.errors import ConfigError
from decaton_aio.offsets import ISOLATION_LEVELS
from decaton_aio.retry import RetryConfig, SideTopics
from decaton_aio.security import PLAINTEXT, SecuritySettings
from decaton_aio.serializers import BytesSerializer
from decaton_aio.state import StateStoreConfig
from decaton_aio.typing import Serializer

__all__ = ["DEFAULT_MAX_FETCH_RECORDS", "Application", "ConsumerConfig"]

#: Records taken from the client per fetch call: bounds the work of one loop turn, since
#: some brokers ignore the per-partition byte limit and return huge batches.
DEFAULT_MAX_FETCH_RECORDS = 2000
_OFFSET_RESETS = ("earliest", "latest")


@dataclass(frozen=True)
class ConsumerConfig:
    """Kafka consumer settings of a subscription.

    Attributes:
        bootstrap_servers: ``host:port[,host:port]`` of the cluster.
        group_id: the consumer group; every instance of the application shares it.
        client_id: the client id the broker sees.
        session_timeout_ms: a member silent this long is evicted from the group.
        heartbeat_interval_ms: how often the member heartbeats.
        auto_offset_reset: where a new group starts: ``earliest`` (the default, so tasks
            produced before the first start are not skipped) or ``latest``.
        max_fetch_records: records taken per fetch call.
        max_partition_fetch_bytes: bytes the broker may return per partition per fetch.
        fetch_max_wait_ms: how long the broker may hold a fetch with no new records. Short
            by default: a broker that does not answer early when records arrive adds up to
            this much to every task's delivery latency.
        isolation_level: ``read_uncommitted`` (the default) hands over every record;
            ``read_committed`` only records of committed transactions (records of aborted
            ones are never processed; transaction markers do not hold the commit back).
        metadata_max_age_ms: how often the consumer refreshes the cluster's metadata: a
            task topic deleted and created again (or given more partitions) is noticed
            within this time (Kafka's default, 5 minutes).
        security: TLS and SASL settings of every client the subscription makes (its
            consumer, topic administration, and its producer unless one is given).
    """

    bootstrap_servers: str
    group_id: str
    client_id: str = "decaton-aio"
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 3_000
    auto_offset_reset: str = "earliest"
    max_fetch_records: int = DEFAULT_MAX_FETCH_RECORDS
    max_partition_fetch_bytes: int = 1024 * 1024
    fetch_max_wait_ms: int = 100
    isolation_level: str = "read_uncommitted"
    metadata_max_age_ms: int = 300_000
    security: SecuritySettings = PLAINTEXT

    def __post_init__(self) -> None:
        if not self.bootstrap_servers.strip():
            raise ConfigError("bootstrap_servers is empty: give host:port of the cluster")
        if not self.group_id:
            raise ConfigError("group_id is empty: name the consumer group")
        if self.auto_offset_reset not in _OFFSET_RESETS:
            raise ConfigError(
                f"auto_offset_reset must be one of {_OFFSET_RESETS}, got {self.auto_offset_reset!r}"
            )
        if self.isolation_level not in ISOLATION_LEVELS:
            raise ConfigError(
                f"isolation_level must be one of {ISOLATION_LEVELS}, got {self.isolation_level!r}"
            )
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ConfigError(
                "heartbeat_interval_ms must be below session_timeout_ms "
                f"({self.heartbeat_interval_ms} >= {self.session_timeout_ms})"
            )
        if self.fetch_max_wait_ms < 0:
            raise ConfigError(f"fetch_max_wait_ms must be >= 0, got {self.fetch_max_wait_ms}")
        if self.metadata_max_age_ms < 100:
            raise ConfigError(f"metadata_max_age_ms must be >= 100, got {self.metadata_max_age_ms}")
        if self.max_fetch_records < 1:
            raise ConfigError(f"max_fetch_records must be >= 1, got {self.max_fetch_records}")


@dataclass(frozen=True)
class Application:
    """A processor and what it consumes.

    ::

        async def process(ctx, task: PageView) -> None:
            await store.add(task.user_id, task.page)

        app = Application(process, topics=("page-views",), serializer=JsonSerializer(PageView))

    Attributes:
        processor: ``async def process(ctx, task)``.
        topics: the task topics.
        group_id: the consumer group; the subscription id when omitted.
        serializer: decodes record values into tasks (raw bytes by default).
        properties: initial runtime properties, by name (see ``decaton_aio.properties``).
        subscription_id: names this subscription in logs and metrics.
        retry: how failed tasks are retried; ``None`` logs and completes them (Decaton's
            default), still dead-lettering tasks that ask for a retry.
        side_topics: suffixes of the retry, dead letter and shaping topics.
        shaping: consume the ``<topic>-shaping`` topics, where tasks of keys over
            ``decaton.per.key.quota.processing.rate`` go; required to turn the quota on.
        deferred_timeout_policy: what happens when a deferred completion is still open
            after ``decaton.deferred.complete.timeout.ms``: ``give_up`` completes it and
            counts it as discarded, ``extend`` waits another timeout (and logs), ``retry``
            sends it to the retry topic.
        state: the state store behind ``ctx.state`` (see :mod:`decaton_aio.state`);
            ``None``: no state.
    """

    processor: TaskFunction
    topics: tuple[str, ...] = ()
    group_id: str | None = None
    serializer: Serializer[Any] = field(default_factory=BytesSerializer)
    properties: Mapping[str, object] = field(default_factory=dict)
    subscription_id: str = "decaton-aio"
    retry: RetryConfig | None = None
    side_topics: SideTopics = field(default_factory=SideTopics)
    shaping: bool = False
    deferred_timeout_policy: DeferredTimeoutPolicy = "give_up"
    state: StateStoreConfig | None = None

    def __post_init__(self) -> None:
        call = self.processor
        if not inspect.iscoroutinefunction(call) and not inspect.iscoroutinefunction(
            getattr(call, "__call__", None)  # noqa: B004 - an object with async __call__
        ):
            raise ConfigError(
                f"processor {self.processor!r} is not an async function: "
                "define it as 'async def process(ctx, task)'"
            )
        if isinstance(self.topics, str):
            object.__setattr__(self, "topics", (self.topics,))
        else:
            object.__setattr__(self, "topics", tuple(self.topics))

        if self.deferred_timeout_policy not in ("give_up", "extend", "retry"):
            raise ConfigError(
                "deferred_timeout_policy must be 'give_up', 'extend' or 'retry', "
                f"got {self.deferred_timeout_policy!r}"
            )

    @property
    def group(self) -> str:
        """The consumer group: ``group_id`` or the subscription id."""
        return self.group_id or self.subscription_id

    @property
    def subscribed_topics(self) -> tuple[str, ...]:
        """The task topics plus the retry topics (queue retries) and shaping topics."""
        topics = list(self.topics)
        if self.retry is not None and self.retry.mode == "queue":
            topics += [self.side_topics.retry_topic(t) for t in self.topics]
        if self.shaping:
            topics += [self.side_topics.shaping_topic(t) for t in self.topics]
        return tuple(dict.fromkeys(topics))
