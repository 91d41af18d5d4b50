"""Helpers for testing code built on decaton-aio against a real broker.

The pytest plugin ([`decaton_aio.pytest_plugin`][decaton_aio.pytest_plugin]) is a thin layer
of fixtures over these. They work the same against the embedded broker and against a real
Apache Kafka cluster named by ``$DECATON_AIO_BOOTSTRAP_SERVERS``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import secrets
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

from decaton_aio import environment
from decaton_aio._connect import start_client
from decaton_aio.admin import TopicAdmin
from decaton_aio.app import Application, ConsumerConfig
from decaton_aio.client_properties import cluster_settings
from decaton_aio.consumer import Subscription
from decaton_aio.context import ProcessingContext
from decaton_aio.embedded import FLAVOR_ENV_VAR, BrokerSecurity, EmbeddedBroker, Toxiproxy
from decaton_aio.errors import ConfigError, ProcessingError
from decaton_aio.offsets import committed_offsets, topic_partitions
from decaton_aio.producer import ProducerConfig, RecordLocation
from decaton_aio.security import PLAINTEXT, SecuritySettings

__all__ = [
    "BOOTSTRAP_ENV_VAR",
    "BROKER_ENV_VAR",
    "NODES_ENV_VAR",
    "REPLICATION_ENV_VAR",
    "TEST_CONSUMER_SETTINGS",
    "BrokerHandle",
    "DrainResult",
    "ProcessedTask",
    "TopicAdmin",
    "committed_offsets",
    "drain",
    "read_records",
    "recent_timestamp_ms",
    "start_proxied_broker",
    "start_secured_broker",
    "wait_until",
]

#: Set it to run the same tests against an existing cluster instead of the embedded broker.
BOOTSTRAP_ENV_VAR = environment.BOOTSTRAP_SERVERS.name

#: The embedded broker's flavor, ``apache`` (default) or ``tansu``.
BROKER_ENV_VAR = FLAVOR_ENV_VAR

#: Nodes of the embedded Apache Kafka: 1 (default) or 3.
NODES_ENV_VAR = environment.BROKER_NODES.name

#: Replication factor of the topics tests create (default: 3 on a three-node embedded
#: cluster, else 1). Set it for a cluster of your own with ``min.insync.replicas`` > 1.
REPLICATION_ENV_VAR = environment.REPLICATION_FACTOR.name

#: Consumer group settings for tests: a member that dies is noticed within seconds, and
#: Tansu completes a new group's join only after half the session timeout, so a short one
#: keeps each consumer start quick there too.
TEST_CONSUMER_SETTINGS: dict[str, Any] = {
    "session_timeout_ms": 6000,
    "heartbeat_interval_ms": 500,
}


@dataclass
class BrokerHandle:
    """The broker a test talks to: an embedded one, or an external cluster.

    Attributes:
        bootstrap_servers: where clients connect.
        embedded: the embedded broker when the project started one, else ``None``.
        replication_factor: the replication factor of topics the tests create.
        security: the TLS and SASL settings clients connect with.
    """

    bootstrap_servers: str
    embedded: EmbeddedBroker | None = None
    replication_factor: int = 1
    security: SecuritySettings = PLAINTEXT

    @property
    def flavor(self) -> str:
        """``"apache"`` or ``"tansu"`` for the embedded broker, ``"external"`` otherwise."""
        return self.embedded.flavor if self.embedded is not None else "external"

    @property
    def is_embedded(self) -> bool:
        """True when the project started the broker."""
        return self.embedded is not None

    @property
    def supports_idempotence(self) -> bool:
        """Whether aiokafka's idempotent producer works here (not on Tansu)."""
        return self.flavor != "tansu"

    @property
    def hides_aborted_transactions(self) -> bool:
        """Whether ``read_committed`` consumers are kept from aborted records (not Tansu)."""
        return self.flavor != "tansu"

    @property
    def keeps_commit_metadata(self) -> bool:
        """Whether committed offsets keep their metadata string (Tansu drops it)."""
        return self.flavor != "tansu"

    @property
    def compacts_topics(self) -> bool:
        """Whether ``cleanup.policy=compact`` and retention are applied (not on Tansu)."""
        return self.flavor != "tansu"

    def producer_config(self, **settings: Any) -> ProducerConfig:
        """Producer settings for this broker (idempotence ``"auto"`` unless given)."""
        settings.setdefault("security", self.security)
        return ProducerConfig(self.bootstrap_servers, **settings)

    def consumer_config(self, group_id: str, **settings: Any) -> ConsumerConfig:
        """Consumer settings for this broker with the test settings (short session
        timeout) unless given."""
        return ConsumerConfig(
            self.bootstrap_servers,
            group_id,
            **{**TEST_CONSUMER_SETTINGS, "security": self.security, **settings},
        )

    def topic_admin(self) -> TopicAdmin:
        """A topic administrator for this broker (close it when done)."""
        return TopicAdmin(self.bootstrap_servers, security=self.security)

    def subscription(
        self, app: Application, group_id: str | None = None, **consumer: Any
    ) -> Subscription:
        """A subscription on this broker with test consumer settings (short session
        timeout) and a fresh group unless one is named."""
        group = group_id or f"{app.group_id or app.subscription_id}-{uuid.uuid4().hex[:8]}"
        config = self.consumer_config(group, **consumer)
        return Subscription(app, config, producer=self.producer_config())

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> BrokerHandle:
        """The external cluster named by the environment, or a started embedded broker.

        ``$DECATON_AIO_BOOTSTRAP_SERVERS`` (or ``bootstrap.servers`` in the file named by
        ``$DECATON_AIO_CLIENT_PROPERTIES``) names an external cluster, reached with the
        security settings of that file and the ``DECATON_AIO_SASL_*``/``_SSL_*``
        variables; otherwise the embedded broker of ``$DECATON_AIO_BROKER`` (``apache`` by
        default) is started, with ``$DECATON_AIO_BROKER_NODES`` nodes.

        Raises:
            ConfigError: when a variable holds a value that cannot be used.
        """
        env = os.environ if environ is None else environ
        cluster = cluster_settings(environ=env)
        if cluster.bootstrap_servers:
            return cls(
                cluster.bootstrap_servers,
                replication_factor=_env_int(env, REPLICATION_ENV_VAR, 1),
                security=cluster.security,
            )
        nodes = _env_int(env, NODES_ENV_VAR, 1)
        flavor = env.get(BROKER_ENV_VAR, "").strip() or "apache"
        broker = EmbeddedBroker(flavor=flavor, nodes=nodes).start()
        replication = _env_int(env, REPLICATION_ENV_VAR, min(3, nodes))
        return cls(broker.bootstrap_servers, broker, replication)

    def close(self) -> None:
        """Stop the embedded broker, if this handle started one."""
        if self.embedded is not None:
            self.embedded.stop()


def start_secured_broker(*, user: str = "decaton-test") -> EmbeddedBroker:
    """Start an embedded Apache Kafka that takes secured clients only: a ``SASL_SSL``
    listener (``user`` with a random password; SCRAM-SHA-512, SCRAM-SHA-256, PLAIN and,
    for tests, unsecured OAUTHBEARER) and an ``MTLS`` listener requiring client
    certificates. Its [`listeners`][decaton_aio.EmbeddedBroker.listeners] give each
    listener's settings.

    Raises:
        BrokerError: when the broker cannot start.
    """
    security = BrokerSecurity(
        {user: secrets.token_urlsafe(16)},
        mtls=True,
        sasl_mechanisms=("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN", "OAUTHBEARER"),
    )
    return EmbeddedBroker(flavor="apache", security=security).start()


def start_proxied_broker(
    toxiproxy: Toxiproxy, *, nodes: int = 1, startup_timeout_s: float | None = None
) -> EmbeddedBroker:
    """Start an embedded Apache Kafka of ``nodes`` nodes behind ``toxiproxy``: one proxy per
    node (named as its [`proxy_routes`][decaton_aio.EmbeddedBroker.proxy_routes] say), which
    that node advertises. Clients that bootstrap on its
    [`proxied_bootstrap_servers`][decaton_aio.EmbeddedBroker.proxied_bootstrap_servers] go
    through the proxies for every request;
    [`bootstrap_servers`][decaton_aio.EmbeddedBroker.bootstrap_servers] stays direct (for
    checks that a fault must not touch).

    Raises:
        BrokerError: when the broker cannot start or a proxy cannot be created.
    """
    broker = EmbeddedBroker(
        flavor="apache", nodes=nodes, proxied=True, startup_timeout_s=startup_timeout_s
    )
    for route in broker.proxy_routes:
        toxiproxy.create(route.name, listen_port=route.listen_port, upstream=route.upstream)
    return broker.start()


def recent_timestamp_ms(hours_ago: int = 1) -> int:
    """A timestamp ``hours_ago`` hours before now, on a whole minute: a fixed record time.

    Give records this (plus small steps) rather than a fixed date when they go to a broker.
    A record of, say, 2023 is past the default time retention (7 days) the moment it is
    written, and the broker's next retention check (every 5 minutes) deletes it: a test
    that reads it back then finds the partition empty, depending on when the check runs.
    """
    return (int(time.time()) // 60 * 60 - hours_ago * 3600) * 1000


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"{name}={raw!r} must be a positive integer")
    return value


async def read_records(
    bootstrap_servers: str,
    topic: str,
    count: int,
    *,
    timeout_s: float = 30.0,
    partitions: Sequence[int] | None = None,
    security: SecuritySettings = PLAINTEXT,
) -> list[ConsumerRecord[bytes, bytes]]:
    """Read ``count`` records of a topic from the beginning, without a consumer group.

    Reads until ``count`` records arrived, not until the end offsets: the embedded broker
    reports wrong end offsets for batches holding several records.

    Raises:
        TimeoutError: when fewer than ``count`` records arrived within ``timeout_s``; the
            message says how many did.
        SecurityError: when TLS or SASL fails.
    """
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap_servers,
        enable_auto_commit=False,
        group_id=None,
        auto_offset_reset="earliest",
        **security.client_kwargs(),
    )
    await start_client(consumer, bootstrap_servers, security)
    records: list[ConsumerRecord[bytes, bytes]] = []
    try:
        if partitions is None:
            partitions = await topic_partitions(consumer, topic, wait_s=timeout_s)
        tps = [TopicPartition(topic, p) for p in partitions]
        consumer.assign(tps)
        for tp in tps:
            # Offset 0, not a ListOffsets lookup (the embedded broker can answer it
            # wrongly); a log whose start moved on resets to its earliest offset.
            consumer.seek(tp, 0)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while len(records) < count:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(f"read {len(records)} of {count} records from {topic}")
            batch = await consumer.getmany(timeout_ms=int(min(remaining, 0.5) * 1000))
            for part in batch.values():
                records.extend(part)
    finally:
        await consumer.stop()
    return records


@dataclass(frozen=True, slots=True)
class ProcessedTask:
    """One task a processor finished during [`drain()`][decaton_aio.testing.drain]."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    task: Any


@dataclass
class DrainResult:
    """What a processor did during [`drain()`][decaton_aio.testing.drain], with assertions over it.

    Attributes:
        processed: the tasks that completed without error, in completion order.
        failures: ``(task, exception)`` for each task whose processor raised.
        overlaps: ``(running, started)`` for each task that started while another task
            of its key (same partition) was still running.
    """

    processed: list[ProcessedTask] = field(default_factory=list)
    failures: list[tuple[ProcessedTask, BaseException]] = field(default_factory=list)
    overlaps: list[tuple[ProcessedTask, ProcessedTask]] = field(default_factory=list)

    def assert_per_key_order(self) -> None:
        """Every key's tasks ran one at a time and completed in offset order (per
        partition).

        Raises:
            AssertionError: naming the first two tasks of a key that overlapped, or the
                first key whose order broke.
        """
        if self.overlaps:
            running, started = self.overlaps[0]
            raise AssertionError(
                f"key {started.key!r} in {started.topic}-{started.partition}: offset "
                f"{started.offset} started while offset {running.offset} was running "
                f"({len(self.overlaps)} overlaps)"
            )
        last: dict[tuple[str, int, bytes], int] = {}
        for done in self.processed:
            if done.key is None:
                continue
            lane = (done.topic, done.partition, done.key)
            previous = last.get(lane, -1)
            if done.offset <= previous:
                raise AssertionError(
                    f"key {done.key!r} in {done.topic}-{done.partition}: offset {done.offset} "
                    f"completed after offset {previous}"
                )
            last[lane] = done.offset

    def assert_at_least_once(self, produced: Iterable[RecordLocation]) -> None:
        """Every produced task was processed at least once.

        Raises:
            AssertionError: listing (up to ten of) the tasks never processed.
        """
        seen = {(t.topic, t.partition, t.offset) for t in self.processed}
        missing = [w for w in produced if (w.topic, w.partition, w.offset) not in seen]
        if missing:
            raise AssertionError(f"{len(missing)} tasks never processed, e.g. {missing[:10]}")

    def duplicates(self) -> int:
        """How many completions were redeliveries of a task already processed."""
        counts: dict[tuple[str, int, int], int] = defaultdict(int)
        for t in self.processed:
            counts[(t.topic, t.partition, t.offset)] += 1
        return sum(n - 1 for n in counts.values())


async def drain(
    app: Application,
    bootstrap_servers: str,
    *,
    expected: int,
    timeout_s: float = 60.0,
    group_id: str | None = None,
    raise_failures: bool = False,
    producer: ProducerConfig | None = None,
    security: SecuritySettings = PLAINTEXT,
) -> DrainResult:
    """Run ``app`` until ``expected`` tasks finished, then stop it gracefully.

    The processor is wrapped to record each task; consumer settings suit tests (short
    session timeout). Everything is committed when this returns.

    Args:
        app: the application under test.
        bootstrap_servers: the broker.
        expected: how many task completions (successful or failed) to wait for.
        timeout_s: give up after this long.
        group_id: the consumer group; a fresh one when omitted.
        producer: settings of the retry/dead letter producer (the defaults, with
            ``security``, when omitted).
        security: TLS and SASL settings of the consumer (and the default producer).
        raise_failures: raise [`ProcessingError`][decaton_aio.errors.ProcessingError] if any
            processor call failed.

    Raises:
        TimeoutError: when fewer than ``expected`` tasks finished in time.
    """
    result = DrainResult()
    enough = asyncio.Event()
    inner = app.processor

    running: dict[tuple[str, int, bytes], ProcessedTask] = {}

    async def recording(ctx: ProcessingContext, task: Any) -> None:
        done = ProcessedTask(ctx.topic, ctx.partition, ctx.offset, ctx.key, task)
        lane = (ctx.topic, ctx.partition, ctx.key) if ctx.key is not None else None
        if lane is not None:
            if lane in running:
                result.overlaps.append((running[lane], done))
            running[lane] = done
        try:
            await inner(ctx, task)
        except Exception as exc:
            result.failures.append((done, exc))
            raise
        else:
            result.processed.append(done)
        finally:
            if lane is not None and running.get(lane) is done:
                del running[lane]
            if len(result.processed) + len(result.failures) >= expected:
                enough.set()

    wrapped = dataclasses.replace(app, processor=recording)
    consumer = ConsumerConfig(
        bootstrap_servers,
        group_id or f"{app.group_id or app.subscription_id}-{uuid.uuid4().hex[:8]}",
        **TEST_CONSUMER_SETTINGS,
        security=security,
    )
    subscription = Subscription(
        wrapped,
        consumer,
        producer=producer or ProducerConfig(bootstrap_servers, security=security),
    )
    await subscription.start()
    try:
        async with asyncio.timeout(timeout_s):
            await enough.wait()
    except TimeoutError:
        finished = len(result.processed) + len(result.failures)
        raise TimeoutError(f"{finished} of {expected} tasks finished in {timeout_s}s") from None
    finally:
        await subscription.stop()
    if raise_failures and result.failures:
        task, exc = result.failures[0]
        raise ProcessingError(
            f"{len(result.failures)} tasks failed; first at {task.topic}-{task.partition}"
            f"@{task.offset}: {exc!r}"
        ) from exc
    return result


async def wait_until(
    predicate: Callable[[], bool], *, timeout_s: float = 30.0, what: str = "the condition"
) -> None:
    """Poll ``predicate`` every 20 ms until it holds.

    Raises:
        TimeoutError: naming ``what`` when it does not hold within ``timeout_s``.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        if loop.time() > deadline:
            raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.02)
