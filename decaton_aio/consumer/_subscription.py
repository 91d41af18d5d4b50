"""A subscription: one consumer, one event loop, many partitions processed concurrently.

The [`Subscription`][decaton_aio.Subscription] owns a group membership (which partitions
this member owns, and its commits; see ``decaton_aio.consumer.group``), a fetcher that
fetches what the membership assigns (``_assigned``: the runtime's own fetch loop, or an
aiokafka consumer without a group, as ``ConsumerConfig.fetch_loop`` says), and
its ``Assignment`` (``_assignment``): a ``PartitionProcessor`` per assigned partition,
their lifecycle, and the one place that pauses and resumes fetching. Three routines run
on the loop, besides the membership's own:

- the fetch routine takes record batches and feeds them to their partitions, holding a
  partition whose pending records reach ``decaton.max.pending.records``; it lets the loop
  run other work (timers, I/O, completions) whenever a step has fed for ``STEP_BUDGET_S``,
  so no step of the runtime's own holds the event loop for long
  (``decaton_runtime_step_duration_seconds``);
- the commit routine commits every partition's watermark (with its checkpoint, or in a
  transaction with exactly-once; see ``commit``) each ``decaton.commit.interval.ms``,
  its preparation in steps of the same budget; a failed commit is logged and tried again
  next time;
- the topic routine holds the partitions whose topic is gone (deleted, or assigned from
  metadata read before its deletion) and asks the group for the assignment again (see
  ``_topics``), after each assignment and whenever a fetched partition seems gone.

Rebalances: the subscription is the membership's
[`GroupListener`][decaton_aio.consumer.group.GroupListener]; the membership's routine
calls it, one change at a time (a batch still being fed stops at its next step when its
partition was revoked or replaced). On revoke: stop starting the partitions' tasks, drop
their queued records, wait up to ``decaton.group.rebalance.timeout.ms`` for running ones,
commit (not the partitions of a deleted topic), close them and stop fetching them. On
loss (the member was fenced or its session expired): close them without a commit. On
assign: the group's committed offsets, a fresh processor per partition, fetched from
those offsets, paused until its checkpoint is imported (and, with exactly-once, its
transactional producer started). Each change is logged in one line and counted
(``decaton_group_*``). Shutdown stops fetching, drains up to
``decaton.processing.shutdown.timeout.ms``, commits and leaves the group.

Unexpected errors in a routine (the membership's too: a group that refuses the member)
stop the subscription and are re-raised by
[`Subscription.wait_stopped()`][decaton_aio.Subscription.wait_stopped]: one supervisor, no
silent death.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from decaton_aio._aiokafka import AIOKafkaClient
from decaton_aio._connect import connect_error, stop_member, watch_metadata
from decaton_aio.admin import ensure_side_topics
from decaton_aio.app import Application, ConsumerConfig
from decaton_aio.batching import BatchingProcessor
from decaton_aio.compaction import CompactingProcessor
from decaton_aio.consumer._assigned import AssignedFetcher, LoopFetcher, PartitionFetcher
from decaton_aio.consumer._assignment import Assignment, key_set
from decaton_aio.consumer._execution import TaskExecutor
from decaton_aio.consumer._fetch_pace import FetchPacer
from decaton_aio.consumer._hotkeys import HotKeyDetector
from decaton_aio.consumer._loopwatch import GcWatch, LoopWatch, StepTimer
from decaton_aio.consumer._partition import PartitionProcessor, PendingBytes
from decaton_aio.consumer._records import RAW_RECORDS, install_raw_records
from decaton_aio.consumer._topic_wait import TopicWait
from decaton_aio.consumer._topics import CHECK_INTERVAL_S, TopicCheck
from decaton_aio.consumer.commit import (
    CheckpointStore,
    Committer,
    GroupMetadata,
    Transaction,
    commit_interval_within,
    transaction_timeout_ms,
)
from decaton_aio.consumer.fetch import FetchConfig, Fetcher
from decaton_aio.consumer.group import (
    Membership,
    choose_protocol,
    new_membership,
    offers_consumer_protocol,
)
from decaton_aio.consumer.state import StateCollector, StateStore
from decaton_aio.errors import ConfigError
from decaton_aio.metrics import Metrics, SubscriptionStats
from decaton_aio.producer import DurableSender, ProducerConfig
from decaton_aio.properties import (
    COMMIT_INTERVAL_MS,
    GROUP_REBALANCE_TIMEOUT_MS,
    IGNORE_KEYS,
    MAX_PENDING_BYTES,
    MAX_PENDING_BYTES_TOTAL,
    MAX_PENDING_RECORDS,
    PARTITION_CONCURRENCY,
    PER_KEY_QUOTA_PROCESSING_RATE,
    PROCESSING_RATE_PER_PARTITION,
    PROCESSING_SHUTDOWN_TIMEOUT_MS,
    SHAPING_RATE_PER_PARTITION,
    Properties,
)
from decaton_aio.tracing import require_opentelemetry

__all__ = ["Subscription", "SubscriptionState"]

log = structlog.get_logger("decaton_aio.consumer")

_FETCH_TIMEOUT_MS = 100
#: How long the membership's stop may take to leave the group before it is given up (the
#: group then notices at the session timeout), and the fetching consumer's stop.
LEAVE_TIMEOUT_S = 30.0
#: Attempts at reading the group's committed offsets of newly assigned partitions.
_COMMITTED_ATTEMPTS = 3
_COMMITTED_BACKOFF_S = 0.5
#: Records handed to a partition at a time; the fetch routine yields to the loop between
#: two of these once its step took ``STEP_BUDGET_S``.
_STEP_RECORDS = 32
_QUOTA_WINDOW_S = 1.0
_NOT_IN_GROUP = GroupMetadata(-1, "")


class SubscriptionState(enum.Enum):
    """Lifecycle of a subscription; transitions only go forward, except RUNNING <->
    REBALANCING."""

    INITIALIZING = "initializing"
    RUNNING = "running"
    REBALANCING = "rebalancing"
    SHUTTING_DOWN = "shutting_down"
    TERMINATED = "terminated"


class Subscription:
    """Consumes an application's topics and runs its processor.

    ```python
    async with Subscription(app, ConsumerConfig("localhost:9092", "orders")) as sub:
        await sub.wait_stopped()
    ```

    Args:
        app: the processor, topics and decoder.
        consumer: Kafka consumer settings.
        producer: settings of the producer for retry, dead letter and shaping records
            (same cluster, idempotent, no spool when omitted; the embedded broker needs
            ``idempotence=False``).
        sender: a started-elsewhere [`DurableSender`][decaton_aio.DurableSender] to use
            instead (e.g. the one of the application's own ``TaskProducer``, so both
            share one spool directory); the subscription then does not start or stop it.
        properties: live runtime properties; built from ``app.properties`` when omitted.
        metrics: where partition statistics are registered; a private one when omitted.
    """

    def __init__(
        self,
        app: Application,
        consumer: ConsumerConfig,
        *,
        producer: ProducerConfig | None = None,
        sender: DurableSender | None = None,
        properties: Properties | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        if not app.topics:
            raise ConfigError("the application has no topics: pass topics=('my-topic',)")
        self.app = app
        self.consumer_config = consumer
        self.producer_config = producer or ProducerConfig(
            consumer.bootstrap_servers,
            application_id=app.subscription_id,
            security=consumer.security,
        )
        self.properties = properties if properties is not None else Properties(app.properties)
        self._pending_bytes = PendingBytes(self.properties[MAX_PENDING_BYTES_TOTAL].value)
        self.metrics = metrics if metrics is not None else Metrics()
        if self.properties[PER_KEY_QUOTA_PROCESSING_RATE].value >= 0 and not app.shaping:
            raise ConfigError(
                "decaton.per.key.quota.processing.rate is set but the application does not "
                "consume its shaping topics: pass Application(shaping=True)"
            )
        self.state_store = (
            StateStore(app, consumer, self.producer_config) if app.state is not None else None
        )
        retry = app.retry
        if retry is not None and retry.mode == "in_place" and _completes_later(app.processor):
            log.warning(
                "in-place retries need the task's key lane, which a task completed later "
                "(batched, compacted) gave up: its failures go to the dead letter topic at "
                "once; use queue retries (RetryConfig(mode='queue'))",
                processor=type(app.processor).__name__,
            )
        if self.state_store is not None:
            self.metrics.registry.register(StateCollector(app.subscription_id, self.state_store))
            if len(app.subscribed_topics) > 1:
                log.warning(
                    "the state is shared by the topics read here, and a key's tasks from "
                    "different topics (a queued retry, a shaped task, another task topic) "
                    "can run at the same time, so one's update of the key can be lost; "
                    "where that matters, use in-place retries (RetryConfig(mode='in_place')) "
                    "and one task topic without shaping",
                    topics=list(app.subscribed_topics),
                )
        self._owns_sender = sender is None
        self._sender = sender if sender is not None else DurableSender(self.producer_config)
        self._executor = _executor(
            app,
            consumer,
            subscription_id=app.subscription_id,
            process=app.processor,
            decode=app.serializer.decode,
            sender=self._sender,
            properties=self.properties,
            retry=app.retry,
            side_topics=app.side_topics,
            deferred_timeout_policy=app.deferred_timeout_policy,
            state_writer=self.state_store.writer if self.state_store is not None else None,
        )
        store = None
        if app.checkpoints:
            store = CheckpointStore(
                consumer.bootstrap_servers,
                consumer.group_id,
                app.checkpoint_topic_for(consumer.group_id),
                metadata_max_bytes=consumer.commit_metadata_max_bytes,
                security=consumer.security,
            )
        transaction = None
        if app.exactly_once:
            assert store is not None  # the application requires checkpoints
            interval_ms = self.properties[COMMIT_INTERVAL_MS].value
            transaction = Transaction(
                consumer.group_id,
                self.producer_config,
                self._identity,
                timeout_ms=transaction_timeout_ms(interval_ms),
            )
            # A previous owner's open transaction ends at its timeout at the latest (ours,
            # unless it runs with other settings: then loading fails and says so).
            store.stable_timeout_s = transaction.timeout_ms / 1000 + 30.0
        self._transaction_timeout_ms = None if transaction is None else transaction.timeout_ms
        self._committer: Committer[PartitionProcessor] = Committer(
            consumer.group_id, store=store, transaction=transaction
        )
        state_store = self.state_store
        self._assignment = Assignment(
            make=self._new_partition,
            committer=self._committer,
            restoring=state_store.restoring if state_store is not None else lambda _: False,
            retire=lambda tp: self.metrics.retire_partition(
                app.subscription_id, tp.topic, tp.partition
            ),
        )
        self._committer.bind(self._assignment)  # it rewinds and stops what transactions fail
        self.state = SubscriptionState.INITIALIZING
        self._stats = self.metrics.register_subscription(
            app.subscription_id, tuple(s.value for s in SubscriptionState)
        )
        self._loop_watch = LoopWatch(self._stats.loop_lag)
        self._gc_watch = GcWatch(self._stats.gc_pause)
        #: ``time.monotonic()`` when the last fetch call returned (``None`` before the first).
        self.last_fetch_at: float | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._loop_fetcher: LoopFetcher | None = None  # the own fetch loop's, when used
        self._assigned_fetcher: PartitionFetcher | None = None
        self._membership: Membership | None = None
        self._partitions = self._assignment.partitions  # the live ones (read here)
        self._fetch_task: asyncio.Task[None] | None = None
        self._commit_task: asyncio.Task[None] | None = None
        self._topic_task: asyncio.Task[None] | None = None
        self._metadata_task: asyncio.Task[None] | None = None
        self._topics: TopicCheck | None = None
        self._assigned = asyncio.Event()  # the topic check runs at once after assignments
        self._stop_task: asyncio.Task[None] | None = None
        self._stopped = asyncio.Event()
        # A stop() asked for (it ends a topic wait), and the end of a start in progress
        # (a stop() waits for it: the parts a start makes are then all there to close).
        self._stop_requested = asyncio.Event()
        self._start_done: asyncio.Event | None = None
        self._topic_wait = TopicWait(
            consumer.bootstrap_servers, app.topics, security=consumer.security
        )
        self._failure: BaseException | None = None
        self._unsubscribe: list[Callable[[], None]] = []
        self._listeners: list[Callable[[SubscriptionState], None]] = []

    # ------------------------------------------------------------------ inspection

    @property
    def partitions(self) -> dict[TopicPartition, PartitionProcessor]:
        """The partitions assigned now, with their processors (read only)."""
        return dict(self._partitions)

    @property
    def fetch_unanswered_since(self) -> float | None:
        """Since when (``time.monotonic()``) a broker asked for records has not answered,
        with the runtime's own fetch loop (``ConsumerConfig.fetch_loop``); None when every
        broker asked answered its last request, or with aiokafka's consumer (which does
        not say)."""
        loop_fetcher = self._loop_fetcher
        return loop_fetcher.fetcher.unanswered_since() if loop_fetcher is not None else None

    @property
    def waiting_for_topics(self) -> tuple[str, ...]:
        """The task topics the start waits for, because the cluster does not have them
        yet (empty otherwise)."""
        return self._topic_wait.missing

    @property
    def stats(self) -> SubscriptionStats:
        """What the subscription counts (not per partition): its state, fetch latency,
        event loop lag, GC pauses and the runtime's own steps (read only)."""
        return self._stats

    def on_state_change(self, listener: Callable[[SubscriptionState], None]) -> None:
        """Call ``listener(new_state)`` on every state transition."""
        self._listeners.append(listener)

    def _set_state(self, state: SubscriptionState) -> None:
        if state is self.state:
            return
        log.info("subscription state", subscription=self.app.subscription_id, state=state.value)
        self.state = state
        self._stats.state = state.value
        for listener in self._listeners:
            try:
                listener(state)
            except Exception:
                log.exception("state listener failed")

    # ------------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Connect, join the group and start fetching.

        A task topic that does not exist yet is waited for (see ``_topic_wait``); a
        [`stop()`][decaton_aio.Subscription.stop] meanwhile ends the start without consuming.

        Raises:
            ConfigError: when started twice, or when a side topic is missing and cannot be
                created (the message names it).
            SecurityError: when TLS or SASL fails (the message says what to fix).
            BrokerError: when the cluster cannot be reached or the side topics cannot be
                checked.
        """
        if (
            self.state is not SubscriptionState.INITIALIZING
            or self._assigned_fetcher is not None
            or self._start_done is not None
        ):
            raise ConfigError("a Subscription can be started once; make a new one")
        done = self._start_done = asyncio.Event()
        try:
            await self._start()
        finally:
            done.set()

    async def _start(self) -> None:
        cfg = self.consumer_config
        # Deploys often start a service before its topics exist: wait for them, not ready
        # meanwhile, as Kafka's consumers do. A stop() while waiting ends the start here.
        if not await self._topic_wait.wait(self._stop_requested):
            return
        if cfg.fetch_loop == "aiokafka":
            install_raw_records()
        if self._owns_sender:
            await self._sender.start()
        try:
            # Before joining the group: a side topic that cannot exist stops the start
            # here, not a partition at its first retry.
            await ensure_side_topics(cfg.bootstrap_servers, self.app, security=cfg.security)
            assignors: tuple[Any, ...] | None = None
            if self.state_store is not None:
                await self.state_store.start()
                assignors = (self.state_store.assignor,)
            choice = await choose_protocol(
                cfg,
                state_store=self.state_store is not None,
                offers_consumer=lambda: offers_consumer_protocol(
                    cfg.bootstrap_servers, cfg.security
                ),
            )
            membership = new_membership(
                choice.protocol, cfg, list(self.app.subscribed_topics), assignors=assignors
            )
            if cfg.fetch_loop == "own":
                loop_fetcher = await self._open_fetch_loop()
            else:
                consumer = await self._open_consumer()
        except BaseException:
            if self.state_store is not None:
                await self.state_store.stop()
            if self._owns_sender:
                await self._sender.stop()
            raise
        fetcher: PartitionFetcher
        if cfg.fetch_loop == "own":
            self._loop_fetcher = fetcher = loop_fetcher
            metadata_client = loop_fetcher.client
            self._metadata_task = asyncio.create_task(
                watch_metadata(loop_fetcher.client), name="decaton-metadata-watch"
            )
            self._topics = TopicCheck(loop_fetcher, membership.rejoin, client=metadata_client)
        else:
            self._consumer = consumer
            fetcher = AssignedFetcher(consumer)
            # Until the consumer is closed (also through the final commit and the stop).
            self._metadata_task = asyncio.create_task(
                watch_metadata(consumer), name="decaton-metadata-watch"
            )
            self._topics = TopicCheck(consumer, membership.rejoin)
        self._assigned_fetcher = fetcher
        self._unsubscribe.append(self._topics.follow())
        self._assignment.attach(fetcher)
        self._committer.bind_group(membership)
        self._membership = membership
        self._stats.unassigned_since = time.monotonic()
        self._unsubscribe += self._assignment.follow(
            self.properties,
            pending_bytes=self._pending_bytes,
            side_topics=self.app.side_topics,
            shaping=self.app.shaping,
        )
        try:
            await membership.start(self)
        except BaseException:
            self._membership = None
            await self._close()
            self._finish_stop()
            raise
        self._set_state(SubscriptionState.RUNNING)
        self._loop_watch.start(asyncio.get_running_loop())
        self._gc_watch.start()
        self._fetch_task = asyncio.create_task(self._fetch_routine(), name="decaton-fetch")
        self._commit_task = asyncio.create_task(self._commit_routine(), name="decaton-commit")
        self._topic_task = asyncio.create_task(self._topic_routine(), name="decaton-topics")
        for task in (self._fetch_task, self._commit_task, self._topic_task, membership.routine):
            task.add_done_callback(self._routine_ended)
        if self.state_store is not None:
            self.state_store.reader.on_failure(self._routine_ended)

    def _fetch_limits(self) -> tuple[int, int]:
        # Fetches follow the pending-bytes limits (as they are at start): per partition,
        # per response.
        cfg = self.consumer_config
        return (
            min(cfg.max_partition_fetch_bytes, self.properties[MAX_PENDING_BYTES].value),
            min(cfg.fetch_max_bytes, self.properties[MAX_PENDING_BYTES_TOTAL].value),
        )

    def _isolation_level(self) -> str:
        # Exactly-once reads only committed input (outputs of other transactions).
        return "read_committed" if self.app.exactly_once else self.consumer_config.isolation_level

    async def _open_fetch_loop(self) -> LoopFetcher:
        # The runtime's own fetch loop, on a client of its own (its connections carry the
        # security settings).
        cfg = self.consumer_config
        client = AIOKafkaClient(
            bootstrap_servers=cfg.bootstrap_servers,
            client_id=cfg.client_id,
            metadata_max_age_ms=cfg.metadata_max_age_ms,
            **cfg.security.client_kwargs(),
        )
        try:
            await client.bootstrap()
        except KafkaError as exc:
            await client.close()
            raise await connect_error(exc, cfg.bootstrap_servers, cfg.security) from exc
        except BaseException:
            await client.close()
            raise
        partition_bytes, max_bytes = self._fetch_limits()
        fetcher = Fetcher(
            client,
            FetchConfig(
                min_bytes=max(1, cfg.fetch_min_bytes),
                max_wait_ms=cfg.fetch_max_wait_ms,
                max_bytes=max_bytes,
                max_partition_bytes=partition_bytes,
                isolation_level=(
                    "read_committed"
                    if self._isolation_level() == "read_committed"
                    else "read_uncommitted"
                ),
                auto_offset_reset="earliest" if cfg.auto_offset_reset == "earliest" else "latest",
                rack_id=cfg.client_rack or "",
            ),
        )
        await fetcher.start()
        return LoopFetcher(client, fetcher)

    async def _open_consumer(self) -> AIOKafkaConsumer:
        # No group: the membership says which partitions to fetch (manual assignment).
        cfg = self.consumer_config
        partition_bytes, max_bytes = self._fetch_limits()
        consumer = AIOKafkaConsumer(
            bootstrap_servers=cfg.bootstrap_servers,
            group_id=None,
            client_id=cfg.client_id,
            client_rack=cfg.client_rack,
            enable_auto_commit=False,
            auto_offset_reset=cfg.auto_offset_reset,
            max_partition_fetch_bytes=partition_bytes,
            fetch_min_bytes=cfg.fetch_min_bytes,
            fetch_max_bytes=max_bytes,
            fetch_max_wait_ms=cfg.fetch_max_wait_ms,
            isolation_level=self._isolation_level(),
            metadata_max_age_ms=cfg.metadata_max_age_ms,
            key_deserializer=RAW_RECORDS,  # aiokafka's own records, no ConsumerRecord
            **cfg.security.client_kwargs(),
        )
        try:
            await consumer.start()
        except KafkaError as exc:
            await consumer.stop()
            raise await connect_error(exc, cfg.bootstrap_servers, cfg.security) from exc
        except BaseException:
            await consumer.stop()
            raise
        return consumer

    async def stop(self) -> None:
        """Stop fetching, drain up to the shutdown timeout, commit and leave the group.

        Safe to call more than once, and during [`start()`][decaton_aio.Subscription.start]:
        the stop then waits for the start to end (a topic wait ends at once), and stops
        what it started.
        """
        self._stop_requested.set()
        starting = self._start_done
        if starting is not None and not starting.is_set():
            await starting.wait()
        if self.state in (SubscriptionState.SHUTTING_DOWN, SubscriptionState.TERMINATED):
            await self._stopped.wait()
            return
        self._set_state(SubscriptionState.SHUTTING_DOWN)
        try:
            await _cancel(self._fetch_task)
            await _cancel(self._commit_task)
            await _cancel(self._topic_task)
            timeout_s = self.properties[PROCESSING_SHUTDOWN_TIMEOUT_MS].value / 1000
            drained = await self._drain(list(self._partitions.values()), timeout_s)
            if not drained:
                log.warning("shutdown timeout: tasks still running are left unfinished")
            await self._commit(final=True)
        finally:
            try:
                await self._close()
            finally:
                self._finish_stop()

    async def _close(self) -> None:
        # Every part is closed, even when an earlier one failed (its connections would
        # stay open); the first failure is raised after.
        # Also the partitions a rebalance listener still loads: the membership's stop
        # below lets it finish, and what it loads must not go live after this.
        self._assignment.close_all()
        consumer, state_store, membership = self._consumer, self.state_store, self._membership
        await _close_each(
            lambda: self._executor.close(timeout_s=1.0),
            (lambda: self._leave(membership)) if membership is not None else None,
            # After the membership: its stop lets a change of partitions in progress
            # finish, and our listener then still loads checkpoints and starts
            # transactional producers through the committer and assigns partitions to the
            # consumer. Closed first, the committer opened its clients again and nobody
            # closed those connections.
            (lambda: stop_member(consumer, timeout_s=LEAVE_TIMEOUT_S))
            if consumer is not None
            else None,
            self._close_fetch_loop,
            self._committer.close,
            state_store.stop if state_store is not None else None,
            self._sender.stop if self._owns_sender else None,
            lambda: _cancel(self._metadata_task),
        )

    async def _close_fetch_loop(self) -> None:
        loop_fetcher = self._loop_fetcher
        if loop_fetcher is None:
            return
        try:
            await loop_fetcher.fetcher.stop()
        finally:
            await loop_fetcher.client.close()

    async def _leave(self, membership: Membership) -> None:
        # Leaves the group (a static member only stops heartbeating); a coordinator that
        # does not answer is given up after LEAVE_TIMEOUT_S: the group notices the member
        # is gone at its session timeout, and nothing is lost (what was not committed is
        # fetched again by the partitions' next owner).
        stopping = asyncio.ensure_future(membership.stop())
        try:
            async with asyncio.timeout(LEAVE_TIMEOUT_S):
                await asyncio.shield(stopping)
            return
        except TimeoutError:
            pass
        log.warning(
            "the member did not leave its group in time: closed without leaving (the "
            "group reassigns its partitions after the session timeout)",
            timeout_s=LEAVE_TIMEOUT_S,
        )
        stopping.cancel()
        # Its routine owns its connections: cancelled, it closes them.
        with contextlib.suppress(RuntimeError):
            await _cancel(membership.routine)
        with contextlib.suppress(asyncio.CancelledError):
            await stopping

    def _finish_stop(self) -> None:
        self._loop_watch.stop()
        self._gc_watch.stop()
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        self._set_state(SubscriptionState.TERMINATED)
        self._stopped.set()

    async def wait_stopped(self) -> None:
        """Wait until the subscription terminated; re-raise what made a routine fail."""
        await self._stopped.wait()
        if self._failure is not None:
            raise self._failure

    async def __aenter__(self) -> Subscription:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def _routine_ended(self, task: asyncio.Task[None]) -> None:
        # The supervisor: a routine that dies unexpectedly stops the whole subscription.
        if task.cancelled() or task.exception() is None:
            return
        self._failure = task.exception()
        log.error("a subscription routine failed; stopping", exc_info=self._failure)
        self._stop_task = asyncio.get_running_loop().create_task(self.stop())

    # -------------------------------------------------------------------- routines

    async def _fetch_routine(self) -> None:
        fetcher = self._assigned_fetcher
        assert fetcher is not None
        consumer = fetcher.consumer
        max_records = self.consumer_config.max_fetch_records
        partitions = self._partitions
        # The end a reader of this isolation level reaches, for the lag.
        if self.consumer_config.isolation_level == "read_committed":
            end_of = consumer.last_stable_offset
        else:
            end_of = consumer.highwater
        assignment = self._assignment
        update = assignment.update
        clock, wall = time.monotonic, time.time
        stats = self._stats
        fetch_latency, fetch_wait = stats.fetch_latency.observe, stats.fetch_wait.observe
        steps, feed_wait = StepTimer(stats.step), stats.feed_wait.observe
        cfg = self.consumer_config
        pacer = FetchPacer.of(
            consumer if self._loop_fetcher is None else self._loop_fetcher.fetcher,
            idle=(cfg.fetch_min_bytes, cfg.fetch_max_wait_ms),
            busy=(cfg.busy_fetch_min_bytes, cfg.busy_fetch_max_wait_ms),
        )
        while True:
            asked = clock()
            batches = await consumer.getmany(timeout_ms=_FETCH_TIMEOUT_MS, max_records=max_records)
            self.last_fetch_at = fetched = steps.start()
            fetch_latency(fetched - asked)
            fetched_ms = wall() * 1000
            if pacer is not None:
                pacer.after(bool(batches))
            # A batch belongs to the partition's processor of the moment it is handed out,
            # which notes it before any yield (a commit between two steps must know it).
            # A rebalance during the steps may assign the partition again, to a fresh
            # processor whose position went back to the commit: the batch must not reach
            # that one, which would commit past the records before it. No processor: a
            # loading partition (paused, so none is handed out) or one revoked after its
            # final commit (its next owner fetches the batch again from that commit).
            handed = []
            for tp, records in batches.items():
                processor = partitions.get(tp)
                if processor is not None and records:
                    processor.receive(records[-1].offset + 1)
                    handed.append((tp, processor, records))
            for tp, processor, records in handed:
                # Fed _STEP_RECORDS at a time; once a step took its budget, the loop runs
                # what waits (timers, I/O, completions) before the next: none waits for a
                # whole batch.
                for first in range(0, len(records), _STEP_RECORDS):
                    await steps.yield_if_due()
                    if partitions.get(tp) is not processor:
                        break  # revoked, assigned again or rewound meanwhile: fetched again
                    chunk = records[first : first + _STEP_RECORDS]
                    fetch_wait((fetched_ms - chunk[0].timestamp) * 0.001)
                    feed_wait(steps.began - fetched)
                    if not processor.feed(chunk):
                        processor = assignment.restart(processor, chunk[0].offset)
                        processor.receive(records[-1].offset + 1)
                        processor.feed(chunk)
                    if processor.needs_pause and not processor.paused:
                        update(processor)
                if partitions.get(tp) is not processor:
                    continue  # revoked meanwhile: no longer the fetcher's
                high = end_of(tp)
                if high is not None:
                    processor.stats.high_watermark = high
            steps.end()

    async def _commit_routine(self) -> None:
        capped_at = None  # the reloaded interval last warned about
        while True:
            interval_ms = wanted_ms = self.properties[COMMIT_INTERVAL_MS].value
            if self._transaction_timeout_ms is not None:
                interval_ms = commit_interval_within(self._transaction_timeout_ms, wanted_ms)
                if interval_ms < wanted_ms and capped_at != wanted_ms:
                    log.warning(
                        "decaton.commit.interval.ms is above a third of the transaction "
                        "timeout set at start: transactions commit at that third until a "
                        "restart sets the timeout for the new interval",
                        wanted_ms=wanted_ms,
                        commit_interval_ms=interval_ms,
                        transaction_timeout_ms=self._transaction_timeout_ms,
                    )
                capped_at = wanted_ms
            await asyncio.sleep(interval_ms / 1000)
            if self.state_store is not None:
                self.state_store.flush()
            self._stats.fold()  # keeps the observation queues short
            self._stats.tasks = len(asyncio.all_tasks())
            self._stats.parked = self._executor.parked_workers
            await self._commit()

    async def _topic_routine(self) -> None:
        # Partitions the cluster no longer has (see _topics): looked for after each
        # assignment, and each CHECK_INTERVAL_S when a fetched one seems gone.
        topics = self._topics
        assert topics is not None
        assignment = self._assignment
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CHECK_INTERVAL_S):
                    await self._assigned.wait()
            vanished = topics.vanished()  # deleted, maybe created again since
            if self._assigned.is_set():
                self._assigned.clear()
            elif vanished:
                pass
            elif self.state is not SubscriptionState.RUNNING:
                continue  # a rebalance going on sorts the assignment out
            else:
                live = self._partitions.values()
                if not topics.suspect(p.tp for p in live if assignment.hold(p) is None):
                    continue
            if await topics.refresh():
                vanished.update(topics.missing(list(self._partitions)))
            gone = [self._partitions[tp] for tp in vanished if tp in self._partitions]
            gone = [p for p in gone if not p.closed]
            if not gone:
                continue
            for processor in gone:
                assignment.gone(processor)
            log.warning(
                "assigned partitions no longer exist (topic deleted); held until the group "
                "rebalances, asked for now",
                partitions=sorted(f"{p.tp.topic}-{p.tp.partition}" for p in gone),
            )
            topics.rejoin()

    async def _commit(
        self, processors: list[PartitionProcessor] | None = None, *, final: bool = False
    ) -> None:
        """Commit the watermarks (and checkpoints) that moved; log and keep going on
        failure."""
        fetcher = self._assigned_fetcher
        if fetcher is None:
            return
        if processors is None:
            processors = list(self._partitions.values())  # the loop below may await
        steps = StepTimer(self._stats.step)
        await self._committer.commit(fetcher, processors, final=final, steps=steps)

    # ------------------------------------------------------------------- rebalance
    # The membership's routine calls these (GroupListener), one at a time.

    def _identity(self) -> GroupMetadata:
        membership = self._membership
        return membership.identity if membership is not None else _NOT_IN_GROUP

    async def partitions_revoked(self, partitions: frozenset[TopicPartition]) -> None:
        """Stop feeding ``partitions``, drain them up to the rebalance timeout, commit,
        close them and stop fetching them (see the module docstring)."""
        self._stats.partitions_revoked += len(partitions)
        processors = [self._partitions[tp] for tp in partitions if tp in self._partitions]
        if self.state is SubscriptionState.RUNNING:
            self._set_state(SubscriptionState.REBALANCING)
        started = time.monotonic()
        drained = True
        for processor in processors:
            processor.revoke()
        if processors:
            timeout_s = self.properties[GROUP_REBALANCE_TIMEOUT_MS].value / 1000
            drained = await self._drain(processors, timeout_s)
            # A deleted topic (often why the group rebalances) takes no commit: it would
            # be retried until given up, holding the rebalance back.
            topics = self._topics
            gone: set[TopicPartition] = set()
            if topics is not None:
                gone = {tp for tp in partitions if topics.has_vanished(tp)}
                if await topics.refresh():
                    gone.update(topics.missing(partitions))
            await self._commit([p for p in processors if p.tp not in gone], final=True)
        self._give_up(processors, partitions)
        await self._committer.release([p.tp for p in processors])
        self._reconciled(
            "partitions revoked",
            partitions,
            drained=drained,
            waited_s=round(time.monotonic() - started, 3),
        )

    async def partitions_lost(self, partitions: frozenset[TopicPartition]) -> None:
        """Close ``partitions`` without a commit: another member may own them already."""
        self._stats.partitions_lost += len(partitions)
        processors = [self._partitions[tp] for tp in partitions if tp in self._partitions]
        if self.state is SubscriptionState.RUNNING:
            self._set_state(SubscriptionState.REBALANCING)
        for processor in processors:
            processor.revoke()
        self._give_up(processors, partitions)
        await self._committer.release([p.tp for p in processors])
        # Work of the lost generation still in the open transaction must never commit
        # under the member's next one (a zombie woken from a freeze rejoins at once).
        await self._committer.abort_transaction("the member lost its partitions")
        self._reconciled(
            "partitions lost (the member was fenced or its session expired): closed "
            "without a commit; their work since the last commit runs again elsewhere",
            partitions,
            warn=True,
        )

    async def partitions_assigned(self, partitions: frozenset[TopicPartition]) -> None:
        """Start ``partitions``: from the group's committed offsets, each with a fresh
        processor, held until its checkpoint is imported (see the module docstring)."""
        self._stats.partitions_assigned += len(partitions)
        started = time.monotonic()
        loaded: asyncio.Future[None] | None = None
        if self.state_store is not None:
            if self.app.exactly_once:  # restores read to the end once the offsets are stable
                loaded = asyncio.get_running_loop().create_future()
            self.state_store.assigned(
                {tp.partition for tp in self._owned() | partitions},
                self._assignment.restored,
                loaded,
            )
        new = [tp for tp in partitions if tp not in self._partitions]
        try:
            positions = await self._committed(new)
            fresh = [self._assignment.new(tp) for tp in new]
            await self._assignment.load(fresh, positions)
        except Exception as exc:
            # Without its producer, or offsets no transaction holds any more, a partition
            # cannot be processed exactly once; without its committed offset, it would
            # start at the reset policy.
            self._failure = exc
            log.error("cannot take over the assigned partitions; stopping", exc_info=exc)
            self._stop_task = asyncio.get_running_loop().create_task(self.stop())
            return
        finally:
            if loaded is not None:
                loaded.set_result(None)
        self._reconciled(
            "partitions assigned", partitions, waited_s=round(time.monotonic() - started, 3)
        )
        self._assigned.set()  # the assignment may come from a stale view of the topics
        if self.state is SubscriptionState.REBALANCING:
            self._set_state(SubscriptionState.RUNNING)

    def _owned(self) -> frozenset[TopicPartition]:
        fetcher = self._assigned_fetcher
        return fetcher.assigned if fetcher is not None else frozenset()

    async def _committed(self, tps: list[TopicPartition]) -> dict[TopicPartition, int | None]:
        # The group's committed offsets of newly assigned partitions (None: the reset
        # policy); a failed read is tried again before the assignment is given up.
        membership = self._membership
        if not tps or membership is None:
            return {}
        for attempt in range(1, _COMMITTED_ATTEMPTS + 1):
            try:
                committed = await membership.committed(tps)
                break
            except KafkaError as exc:
                if attempt == _COMMITTED_ATTEMPTS:
                    raise
                log.warning("cannot read the committed offsets; trying again", error=repr(exc))
                await asyncio.sleep(_COMMITTED_BACKOFF_S * attempt)
        return {tp: (None if (c := committed.get(tp)) is None else c.offset) for tp in tps}

    def _give_up(
        self, processors: list[PartitionProcessor], partitions: frozenset[TopicPartition]
    ) -> None:
        # The partitions leave: closed, their state deactivated, no longer fetched.
        for processor in processors:
            self._assignment.close(processor)
            if self.state_store is not None:
                self.state_store.deactivate(processor.tp.partition)
        if self._assigned_fetcher is not None:
            self._assigned_fetcher.unassign(partitions)
        if not self._owned() and self.state is SubscriptionState.REBALANCING:
            return  # all gone (the classic protocol): rebalancing until assigned again
        if self.state is SubscriptionState.REBALANCING:
            self._set_state(SubscriptionState.RUNNING)  # the others never stopped

    def _reconciled(
        self, what: str, partitions: frozenset[TopicPartition], *, warn: bool = False, **extra: Any
    ) -> None:
        # One line and the group metrics per change of the member's partitions.
        stats = self._stats
        stats.rebalances += 1
        if self._topics is not None:
            self._topics.watch(self._partitions)
        owned = self._owned()
        stats.assigned_partitions = len(owned)
        if owned:
            stats.unassigned_since = -1.0
        elif stats.unassigned_since < 0:
            stats.unassigned_since = time.monotonic()
        identity = self._identity()
        stats.member_epoch = identity.generation_id
        (log.warning if warn else log.info)(
            what,
            partitions=sorted(f"{tp.topic}-{tp.partition}" for tp in partitions),
            owned=len(owned),
            epoch=identity.generation_id,
            **extra,
        )

    def _new_partition(self, tp: TopicPartition) -> PartitionProcessor:
        props = self.properties
        app = self.app
        shaping = app.side_topics.is_shaping(tp.topic)
        hot_keys = None
        if app.shaping and not shaping:
            quota = props[PER_KEY_QUOTA_PROCESSING_RATE].value
            hot_keys = HotKeyDetector(quota, _QUOTA_WINDOW_S)
        rate = props[SHAPING_RATE_PER_PARTITION if shaping else PROCESSING_RATE_PER_PARTITION]
        processor = PartitionProcessor(
            tp,
            executor=self._executor,
            limit=props[PARTITION_CONCURRENCY].value,
            max_pending=props[MAX_PENDING_RECORDS].value,
            max_pending_bytes=props[MAX_PENDING_BYTES].value,
            pending_bytes=self._pending_bytes,
            stats=self.metrics.register_partition(app.subscription_id, tp.topic, tp.partition),
            on_below_max_pending=self._assignment.update,
            rate=rate.value,
            ignore_keys=key_set(props[IGNORE_KEYS].value),
            hot_keys=hot_keys,
        )
        if self.state_store is not None:
            processor.store = self.state_store.store(tp.partition)
            processor.store_type = self.state_store.config.value_type
        return processor

    @staticmethod
    async def _drain(processors: list[PartitionProcessor], timeout_s: float) -> bool:
        if not processors:
            return True
        results = await asyncio.gather(*(p.wait_idle(timeout_s) for p in processors))
        return all(results)


def _completes_later(processor: object) -> bool:
    """Whether ``processor`` completes its tasks after it returned (a wrapper that holds
    them: batching, compaction)."""
    return isinstance(processor, BatchingProcessor | CompactingProcessor)


def _executor(app: Application, consumer: ConsumerConfig, **settings: Any) -> TaskExecutor:
    # The traced executor only when the application asks for tracing: without it, no
    # tracing code is on the hot path (and OpenTelemetry need not be installed).
    if app.tracing is None:
        return TaskExecutor(**settings)
    require_opentelemetry()
    from decaton_aio.consumer._tracing import TracedTaskExecutor

    return TracedTaskExecutor(tracing=app.tracing, group_id=consumer.group_id, **settings)


async def _close_each(*closers: Callable[[], Awaitable[object]] | None) -> None:
    # Each one runs, whatever the ones before raised; the first failure is raised after.
    failure: Exception | None = None
    for close in closers:
        if close is None:
            continue
        try:
            await close()
        except Exception as exc:
            log.error("closing a part of the subscription failed", exc_info=exc)
            failure = failure or exc
    if failure is not None:
        raise failure


async def _cancel(task: asyncio.Task[None] | None) -> None:
    # Cancel ``task`` and wait for its end; a cancellation of the caller meanwhile is
    # passed on, not taken for the task's.
    if task is None or task.done():
        return
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
