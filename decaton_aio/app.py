"""The application object: what to consume, how to decode it, and the processor.

An [`Application`][decaton_aio.Application] is plain configuration, no global state:
``python -m decaton_aio run module:app`` imports one (or a bare
``async def process(ctx, task)`` function) and command-line flags override its fields.
[`ConsumerConfig`][decaton_aio.ConsumerConfig] holds the Kafka consumer settings, kept apart
so the same application runs against any cluster; each field is named after the Kafka
consumer setting it maps to (``group.instance.id`` is ``group_instance_id``).

The consumer group is never guessed: an application names it (``group_id``, or a
``subscription_id`` of its own), because a default shared by every application that forgot
one would make unrelated applications split each other's partitions.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from decaton_aio.completion import DeferredTimeoutPolicy
from decaton_aio.context import TaskFunction
from decaton_aio.errors import ConfigError
from decaton_aio.offsets import ISOLATION_LEVELS
from decaton_aio.retry import RetryConfig, SideTopics
from decaton_aio.security import PLAINTEXT, SecuritySettings
from decaton_aio.serializers import BytesSerializer
from decaton_aio.state import StateStoreConfig
from decaton_aio.tracing import Tracing
from decaton_aio.typing import Serializer

__all__ = [
    "DEFAULT_MAX_FETCH_RECORDS",
    "DEFAULT_SUBSCRIPTION_ID",
    "Application",
    "ConsumerConfig",
    "LifespanHook",
]

#: Records taken from the client per fetch call: bounds the work of one loop turn, since
#: some brokers ignore the per-partition byte limit and return huge batches.
DEFAULT_MAX_FETCH_RECORDS = 2000
#: The subscription id of an application that names none (logs and metrics only: it is
#: never used as a consumer group).
DEFAULT_SUBSCRIPTION_ID = "decaton-aio"
_OFFSET_RESETS = ("earliest", "latest")
#: The values of ``group.protocol`` (`ConsumerConfig.group_protocol`).
GROUP_PROTOCOLS: tuple[str, ...] = ("consumer", "classic")
#: The values of `ConsumerConfig.fetch_loop`.
FETCH_LOOPS: tuple[str, ...] = ("own", "aiokafka")
#: The assignors a member can offer, by their protocol names; Java's class names map to
#: them, so a ``partition.assignment.strategy`` line of a Java client works as written.
ASSIGNORS = ("roundrobin", "range", "sticky")
_JAVA_ASSIGNORS = {
    "org.apache.kafka.clients.consumer.RoundRobinAssignor": "roundrobin",
    "org.apache.kafka.clients.consumer.RangeAssignor": "range",
    "org.apache.kafka.clients.consumer.StickyAssignor": "sticky",
}


def assignor_names(names: Sequence[str]) -> tuple[str, ...]:
    """``names`` as protocol names, in order, without repeats.

    Raises:
        ConfigError: empty, or a name no assignor here has (cooperative-sticky among them:
            it needs cooperative rebalancing, which the consumer does not do).
    """
    result: list[str] = []
    for raw in names:
        name = _JAVA_ASSIGNORS.get(raw.strip(), raw.strip())
        if name not in ASSIGNORS:
            raise ConfigError(
                f"partition_assignment_strategy: unknown assignor {raw.strip()!r}; use "
                f"{', '.join(ASSIGNORS)} (a group with Decaton instances shares range)"
            )
        if name not in result:
            result.append(name)
    if not result:
        raise ConfigError("partition_assignment_strategy is empty: name at least one assignor")
    return tuple(result)


#: An ``on_startup`` / ``on_shutdown`` hook: ``async def hook() -> None``.
LifespanHook: TypeAlias = Callable[[], Awaitable[None]]


@dataclass(frozen=True)
class ConsumerConfig:
    """Kafka consumer settings of a subscription.

    Each field is the Kafka consumer setting in parentheses (``client.properties`` keys).

    Attributes:
        bootstrap_servers: ``host:port[,host:port]`` of the cluster (``bootstrap.servers``).
        group_id: the consumer group; every instance of the application shares it
            (``group.id``).
        group_instance_id: static membership (``group.instance.id``): a stable, unique id
            per instance (e.g. the pod name of a StatefulSet). A restarted instance that
            comes back within ``session_timeout_ms`` gets its partitions back without a
            rebalance of the group. ``None`` (the default): a dynamic member.
        client_id: the client id the broker sees in its logs and quotas (``client.id``).
        client_rack: the rack (availability zone) of this instance (``client.rack``): with
            a rack-aware replica selector on the brokers, fetches go to a replica in the
            same zone. ``None``: no preference.
        session_timeout_ms: a member silent this long is evicted from the group
            (``session.timeout.ms``), and a member that hears nothing from its group
            coordinator this long gives up its partitions without a commit (someone else
            may process them by then) and joins again. On the consumer protocol the
            group's own session timeout (a broker or group setting) is what evicts: set
            this one to it.
        heartbeat_interval_ms: how often the member heartbeats
            (``heartbeat.interval.ms``); below ``session_timeout_ms``.
        max_poll_interval_ms: the longest the consumer may go between fetch calls before it
            is considered failed and leaves the group (``max.poll.interval.ms``). The fetch
            routine calls it continuously, whatever the tasks are doing, so only a blocked
            event loop reaches it.
        auto_offset_reset: where a new group starts: ``earliest`` (the default, so tasks
            produced before the first start are not skipped) or ``latest``
            (``auto.offset.reset``).
        max_fetch_records: records taken per fetch call (``max.poll.records``).
        max_partition_fetch_bytes: bytes the broker may return per partition per fetch
            (``max.partition.fetch.bytes``).
        fetch_min_bytes: the broker holds a fetch until this much data is there, or
            ``fetch_max_wait_ms`` passed (``fetch.min.bytes``).
        fetch_max_bytes: bytes the broker may return per fetch, all partitions together
            (``fetch.max.bytes``).
        fetch_max_wait_ms: how long the broker may hold a fetch with no new records
            (``fetch.max.wait.ms``). Short by default: a broker that does not answer early
            when records arrive adds up to this much to every task's delivery latency.
        busy_fetch_min_bytes: while records flow (the last fetch call returned some), the
            broker holds each fetch until this much data is there, or
            ``busy_fetch_max_wait_ms`` passed: fewer, larger fetches under load, a few
            milliseconds more per record for much less CPU per task (see
            ``docs/operations.md``). A fetch call that returns nothing goes back to
            ``fetch_min_bytes`` and ``fetch_max_wait_ms``. At most ``fetch_min_bytes``:
            off.
        busy_fetch_max_wait_ms: how long the broker may hold a fetch while records flow.
        isolation_level: ``read_uncommitted`` (the default) hands over every record;
            ``read_committed`` only records of committed transactions (records of aborted
            ones are never processed; transaction markers do not hold the commit back)
            (``isolation.level``).
        metadata_max_age_ms: how often the consumer refreshes the cluster's metadata: a
            task topic deleted and created again (or given more partitions) is noticed
            within this time (Kafka's default, 5 minutes) (``metadata.max.age.ms``).
        security: TLS and SASL settings of every client the subscription makes (its
            consumer, topic administration, and its producer unless one is given).
        commit_metadata_max_bytes: the cluster's ``offset.metadata.max.bytes``: a
            checkpoint larger than this goes to the checkpoint topic instead of the
            commit metadata (0: always the topic).
        partition_assignment_strategy: the assignors this member offers its group, most
            preferred first (``partition.assignment.strategy``): ``roundrobin`` (the
            default), ``range``, ``sticky`` (Java class names are accepted too). The group
            uses one that every member offers: to share a classic group with Decaton's
            instances (Java's default list starts with range) on a broker older than
            Kafka 4.0, during a migration, set ``range``.
            Offer one assignor: aiokafka 0.14 can leave a group's first join hanging when
            its members offer two. A state store brings its own assignor and cannot share
            a group with Decaton. Used by the classic group protocol only.
        group_protocol: how the member takes part in its group (``group.protocol``):
            ``classic`` (join and sync rounds; the elected member assigns with
            ``partition_assignment_strategy``; every member gives up all its partitions at
            each rebalance) or ``consumer`` (the coordinator assigns, each member gives up
            only what moves; Kafka 4.0 and later). ``None`` (the default): the runtime
            chooses and logs which and why: ``classic`` for a state store, else
            ``DECATON_AIO_GROUP_PROTOCOL`` when set, else ``consumer`` where the broker
            offers it and ``classic`` where it does not (see ``docs/configuration.md``).
        fetch_loop: what fetches the assigned partitions: ``own`` (the runtime's fetch
            loop: fetch sessions, so a request names only what changed, one request in
            flight per broker, records read straight into the runtime's; a held
            partition is left out of the requests; the default) or ``aiokafka``
            (aiokafka's consumer without a group; every request names every partition).
    """

    bootstrap_servers: str
    group_id: str
    group_instance_id: str | None = None
    client_id: str = "decaton-aio"
    client_rack: str | None = None
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 3_000
    max_poll_interval_ms: int = 300_000
    auto_offset_reset: str = "earliest"
    max_fetch_records: int = DEFAULT_MAX_FETCH_RECORDS
    max_partition_fetch_bytes: int = 1024 * 1024
    fetch_min_bytes: int = 1
    fetch_max_bytes: int = 50 * 1024 * 1024
    fetch_max_wait_ms: int = 100
    busy_fetch_min_bytes: int = 16 * 1024
    busy_fetch_max_wait_ms: int = 5
    isolation_level: str = "read_uncommitted"
    metadata_max_age_ms: int = 300_000
    security: SecuritySettings = PLAINTEXT
    commit_metadata_max_bytes: int = 4096
    partition_assignment_strategy: tuple[str, ...] = ("roundrobin",)
    group_protocol: Literal["consumer", "classic"] | None = None
    fetch_loop: Literal["own", "aiokafka"] = "own"

    def __post_init__(self) -> None:
        if not self.bootstrap_servers.strip():
            raise ConfigError("bootstrap_servers is empty: give host:port of the cluster")
        if not self.group_id:
            raise ConfigError("group_id is empty: name the consumer group")
        for name in ("group_instance_id", "client_rack"):
            value = getattr(self, name)
            if value is not None and not value.strip():
                raise ConfigError(f"{name} is empty: give a value or leave it None")
        if not self.client_id.strip():
            raise ConfigError("client_id is empty: give the id the broker should see")
        for name, low in (
            ("session_timeout_ms", 1),
            ("heartbeat_interval_ms", 1),
            ("max_poll_interval_ms", 1),
            ("max_partition_fetch_bytes", 1),
            ("fetch_min_bytes", 0),
            ("busy_fetch_min_bytes", 0),
            ("busy_fetch_max_wait_ms", 0),
            ("fetch_max_bytes", 1),
        ):
            if getattr(self, name) < low:
                raise ConfigError(f"{name} must be >= {low}, got {getattr(self, name)}")
        if self.auto_offset_reset not in _OFFSET_RESETS:
            raise ConfigError(
                f"auto_offset_reset must be one of {_OFFSET_RESETS}, got {self.auto_offset_reset!r}"
            )
        if self.group_protocol is not None and self.group_protocol not in GROUP_PROTOCOLS:
            raise ConfigError(
                f"group_protocol must be one of {GROUP_PROTOCOLS} or None (the runtime "
                f"chooses), got {self.group_protocol!r}"
            )
        if self.fetch_loop not in FETCH_LOOPS:
            raise ConfigError(f"fetch_loop must be one of {FETCH_LOOPS}, got {self.fetch_loop!r}")
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
        if self.commit_metadata_max_bytes < 0:
            raise ConfigError(
                f"commit_metadata_max_bytes must be >= 0, got {self.commit_metadata_max_bytes}"
            )
        if self.max_fetch_records < 1:
            raise ConfigError(f"max_fetch_records must be >= 1, got {self.max_fetch_records}")
        object.__setattr__(
            self,
            "partition_assignment_strategy",
            assignor_names(self.partition_assignment_strategy),
        )


@dataclass(frozen=True)
class Application:
    """A processor and what it consumes.

    ```python
    async def process(ctx, task: PageView) -> None:
        await store.add(task.user_id, task.page)

    app = Application(process, topics=("page-views",), serializer=JsonSerializer(PageView))
    ```

    Attributes:
        processor: ``async def process(ctx, task)``.
        topics: the task topics.
        group_id: the consumer group. Required, unless ``subscription_id`` is given: then
            the group is the subscription id (see [`group`][decaton_aio.Application.group]).
        serializer: decodes record values into tasks (raw bytes by default).
        properties: initial runtime properties, by name (see ``decaton_aio.properties``).
        subscription_id: names this subscription in logs and metrics; the group id when
            left at its default.
        retry: how failed tasks are retried; ``None`` logs and completes them (Decaton's
            default), still dead-lettering tasks that ask for a retry.
        side_topics: suffixes of the retry, dead letter and shaping topics.
        shaping: consume the ``<topic>-shaping`` topics, where tasks of keys over
            ``decaton.per.key.quota.processing.rate`` go; required to turn the quota on.
        deferred_timeout_policy: what happens when a deferred completion is still open
            after ``decaton.deferred.complete.timeout.ms``: ``give_up`` completes it and
            counts it as discarded, ``extend`` waits another timeout (and logs), ``retry``
            sends it to the retry topic.
        state: the state store behind ``ctx.state`` (see `decaton_aio.state`);
            ``None``: no state.
        checkpoints: at every commit, save which records above the committed offset are
            already done (in the commit metadata, or the checkpoint topic when too large),
            so a restart or rebalance skips them instead of processing them again.
        checkpoint_topic: the compacted topic for checkpoints too large for the commit
            metadata (and for brokers that drop it); ``<group>-checkpoints`` when
            omitted, created on first use.
        exactly_once: commit each interval's outputs (``ctx.produce``), offsets and
            checkpoints in one Kafka transaction per partition; input is read
            ``read_committed``. Needs checkpoints and a broker with transactions.
        on_startup: ``async def hook()`` (or a sequence of them, run in order) that
            ``run`` (``python -m decaton_aio run``) awaits once per process before it
            starts consuming: open a database pool, warm a cache. A hook that raises stops
            the process before any task runs (the shutdown hooks do not run).
        on_shutdown: hooks ``run`` awaits once per process after the subscription drained
            its tasks and committed: close the pool. Run in order, each even if an earlier
            one raised.
        tracing: OpenTelemetry spans per task (see `decaton_aio.tracing`; needs the
            ``tracing`` extra); ``None`` (the default): no tracing code runs.
    """

    processor: TaskFunction
    topics: tuple[str, ...] = ()
    group_id: str | None = None
    serializer: Serializer[Any] = field(default_factory=BytesSerializer)
    properties: Mapping[str, object] = field(default_factory=dict)
    subscription_id: str = DEFAULT_SUBSCRIPTION_ID
    retry: RetryConfig | None = None
    side_topics: SideTopics = field(default_factory=SideTopics)
    shaping: bool = False
    deferred_timeout_policy: DeferredTimeoutPolicy = "give_up"
    state: StateStoreConfig | None = None
    checkpoints: bool = True
    checkpoint_topic: str | None = None
    exactly_once: bool = False
    on_startup: LifespanHook | Sequence[LifespanHook] = ()
    on_shutdown: LifespanHook | Sequence[LifespanHook] = ()
    tracing: Tracing | None = None

    def __post_init__(self) -> None:
        if not _is_async(self.processor):
            raise ConfigError(
                f"processor {self.processor!r} is not an async function: "
                "define it as 'async def process(ctx, task)'"
            )
        for name in ("on_startup", "on_shutdown"):
            hooks = _hooks(getattr(self, name))
            for hook in hooks:
                if not _is_async(hook):
                    raise ConfigError(
                        f"{name} hook {hook!r} is not an async function: define it as "
                        "'async def hook() -> None'"
                    )
            object.__setattr__(self, name, hooks)
        if not self.subscription_id:
            raise ConfigError("subscription_id is empty: name the subscription")
        if isinstance(self.topics, str):
            object.__setattr__(self, "topics", (self.topics,))
        else:
            object.__setattr__(self, "topics", tuple(self.topics))

        if self.deferred_timeout_policy not in ("give_up", "extend", "retry"):
            raise ConfigError(
                "deferred_timeout_policy must be 'give_up', 'extend' or 'retry', "
                f"got {self.deferred_timeout_policy!r}"
            )

        if self.exactly_once and not self.checkpoints:
            raise ConfigError(
                "exactly_once needs checkpoints (they say which outputs were committed): "
                "drop checkpoints=False"
            )

    @property
    def group(self) -> str:
        """The consumer group: ``group_id``, else a subscription id of the application's own.

        Raises:
            ConfigError: the application names neither (the default subscription id is
                never used as a group: every application that forgot one would share it).
        """
        if self.group_id:
            return self.group_id
        if self.subscription_id != DEFAULT_SUBSCRIPTION_ID:
            return self.subscription_id
        raise ConfigError(
            "the application names no consumer group: pass Application(group_id=...) "
            "(or --group / DECATON_AIO_GROUP on the command line)"
        )

    @property
    def startup_hooks(self) -> tuple[LifespanHook, ...]:
        """The ``on_startup`` hooks, in order."""
        return _hooks(self.on_startup)

    @property
    def shutdown_hooks(self) -> tuple[LifespanHook, ...]:
        """The ``on_shutdown`` hooks, in order."""
        return _hooks(self.on_shutdown)

    def checkpoint_topic_for(self, group_id: str) -> str:
        """The checkpoint topic of this application in consumer group ``group_id``."""
        return self.checkpoint_topic or f"{group_id}-checkpoints"

    @property
    def subscribed_topics(self) -> tuple[str, ...]:
        """The task topics plus the retry topics (queue retries) and shaping topics."""
        topics = list(self.topics)
        if self.retry is not None and self.retry.mode == "queue":
            topics += [self.side_topics.retry_topic(t) for t in self.topics]
        if self.shaping:
            topics += [self.side_topics.shaping_topic(t) for t in self.topics]
        return tuple(dict.fromkeys(topics))


def _is_async(call: object) -> bool:
    return inspect.iscoroutinefunction(call) or inspect.iscoroutinefunction(
        getattr(call, "__call__", None)  # noqa: B004 - an object with async __call__
    )


def _hooks(value: LifespanHook | Sequence[LifespanHook] | None) -> tuple[LifespanHook, ...]:
    if value is None:
        return ()
    if callable(value):
        return (value,)
    return tuple(value)
