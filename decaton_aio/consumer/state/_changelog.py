"""The changelog of a state store: writing tasks' changes and reading them back.

`ChangelogWriter` sends a task's change to partition ``p`` of the changelog (the
task's partition number) through an ``acks=all`` sender without a spool, and applies it
to the local store once acknowledged; a failed send is tried again with backoff until it
works or the task's partition is closed. The task completes only after that, so a
committed task offset never has a change the changelog lacks. (With exactly-once the
changes go into the partitions' transactions instead, see ``_state_txn``.)

`ChangelogReader` owns one group-less consumer that reads changelog partitions
into local stores: a *restore* reads from the store's position to the end offset taken
when it starts and then resolves its future (the partition may process); a *standby*
follows the partition for as long as it is one. Promoting a standby to active turns it
into a restore from where it is, so only what it had not read yet is replayed.

Caller: the subscription's event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from decaton_aio._connect import start_or_close
from decaton_aio.backoff import send_retry_delay
from decaton_aio.consumer._records import RAW_RECORDS
from decaton_aio.consumer.state._store import LocalStore

if TYPE_CHECKING:
    from decaton_aio.consumer._contract import TaskHost
    from decaton_aio.context import ProcessingContext
    from decaton_aio.producer import DurableSender
    from decaton_aio.state import KeyState

__all__ = ["ChangelogReader", "ChangelogWriter", "RestoreStats"]

log = structlog.get_logger("decaton_aio.state")

_READ_TIMEOUT_MS = 100
_READ_MAX_RECORDS = 10_000
_RETRY_S = 0.5  # the wait before reading again after the cluster failed a request


class ChangelogWriter:
    """Writes tasks' changes to one store's changelog topic."""

    def __init__(self, sender: DurableSender, topic: str) -> None:
        self._sender = sender
        self.topic = topic

    async def write_task(
        self, partition: TaskHost, ctx: ProcessingContext, state: KeyState, then: Callable[[], None]
    ) -> None:
        """Write the task's change (`write()`), then call ``then()``."""
        store = state.store
        assert isinstance(store, LocalStore), "a task's state reads the runtime's copy"
        if await self.write(partition, store, state.key, state.encoded_change()):
            then()

    async def write(
        self, partition: TaskHost, store: LocalStore, key: bytes, value: bytes | None
    ) -> bool:
        """Send the change, wait for the acknowledgement, apply it to ``store``.

        Returns:
            False when the partition closed before the changelog took the change (the
            task is redelivered to the partition's next owner).
        """
        write = store.begin()
        attempt = 0
        while not partition.closed:
            try:
                location = await self._sender.send(
                    self.topic, value, key=key, partition=partition.tp.partition
                )
            except Exception as exc:
                attempt += 1
                delay = send_retry_delay(attempt)
                log.error(
                    "cannot write the state change to the changelog; the task stays pending",
                    topic=self.topic,
                    partition=partition.tp.partition,
                    error=repr(exc),
                    retry_in_s=round(delay, 3),
                )
                await asyncio.sleep(delay)
                continue
            if not store.closed:
                store.acked(write, key, value, location.offset)
            return True
        store.abandon(write)
        return False


@dataclass
class RestoreStats:
    """What the reader did for one changelog partition (logs, metrics, tests)."""

    partition: int
    start_offset: int = 0
    end_offset: int = -1
    replayed: int = 0
    standby_applied: int = 0
    restoring: bool = False
    seconds: float = 0.0
    started_at: float = field(default=0.0, repr=False)


@dataclass
class _Follow:
    store: LocalStore
    stats: RestoreStats
    target: int | None = None  # the end offset a restore reads to; None: a standby
    done: asyncio.Future[RestoreStats] | None = None
    waited: bool = False  # for an open transaction (logged once)


class ChangelogReader:
    """Reads changelog partitions into local stores: restores and standbys.

    Args:
        bootstrap_servers: the cluster.
        topic: the changelog topic.
        client_id: the reading consumer's client id.
        isolation_level: of the reading consumer.
        client_kwargs: further settings of the reading consumer (TLS, SASL).
    """

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        *,
        client_id: str = "decaton-aio-changelog",
        isolation_level: str = "read_committed",
        client_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self._client_kwargs = client_kwargs or {}
        self._bootstrap_servers = bootstrap_servers
        self.topic = topic
        self._client_id = client_id
        self._isolation_level = isolation_level
        self._consumer: AIOKafkaConsumer | None = None
        self._follows: dict[int, _Follow] = {}
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: Every restore's figures, latest last (logs, metrics and tests read them).
        self.history: list[RestoreStats] = []

    async def start(self) -> None:
        """Connect the reading consumer and start the read routine."""
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self._bootstrap_servers,
            group_id=None,
            client_id=self._client_id,
            enable_auto_commit=False,
            # A checkpoint beyond the log (the changelog was recreated) reads it all; the
            # restore then drops the copy's values (_check_restores).
            auto_offset_reset="earliest",
            fetch_max_wait_ms=100,  # an empty partition's restore waits for one fetch
            isolation_level=self._isolation_level,
            key_deserializer=RAW_RECORDS,
            **self._client_kwargs,
        )
        await start_or_close(consumer)
        self._consumer = consumer
        self._task = asyncio.create_task(self._run(), name="decaton-changelog")

    async def stop(self) -> None:
        """Stop reading; pending restores fail with ``CancelledError``. A read routine that
        failed does not fail the stop (its failure went to `on_failure()`): the
        consumer is closed all the same."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait([task])
        for follow in self._follows.values():
            if follow.done is not None and not follow.done.done():
                follow.done.cancel()
        self._follows.clear()
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None

    def on_failure(self, callback: Callable[[asyncio.Task[None]], None]) -> None:
        """Call ``callback(task)`` when the read routine ends (the subscription's
        supervisor: an unexpected error stops the subscription)."""
        if self._task is not None:
            self._task.add_done_callback(callback)

    def progress(self) -> list[tuple[RestoreStats, int]]:
        """Each partition read now: its figures and how many records its restore has left
        (0 for a standby). Read by metric scrapes from another thread: a snapshot."""
        result = []
        for follow in list(self._follows.values()):
            target = follow.target
            left = max(0, target - follow.store.position) if target is not None else 0
            result.append((follow.stats, left))
        return result

    def following(self) -> dict[int, bool]:
        """The partitions read now: partition -> whether it is being restored."""
        return {p: f.target is not None for p, f in self._follows.items()}

    def restore(self, partition: int, store: LocalStore) -> asyncio.Future[RestoreStats]:
        """Read partition ``partition`` into ``store`` from its position to the current
        end; the future resolves once it is there. A standby of the partition becomes
        this restore (it goes on from where it is)."""
        loop = asyncio.get_running_loop()
        follow = self._follows.get(partition)
        if follow is None or follow.store is not store:
            follow = _Follow(store, RestoreStats(partition))
            self._follows[partition] = follow
        if follow.done is None or follow.done.done():
            follow.done = loop.create_future()
        follow.target = -1  # the end offset is read by the routine
        stats = follow.stats = RestoreStats(partition, start_offset=store.position)
        stats.restoring = True
        stats.started_at = time.monotonic()
        self._changed.set()
        return follow.done

    def follow(self, partition: int, store: LocalStore) -> None:
        """Keep ``store`` up to date with partition ``partition`` (a standby)."""
        current = self._follows.get(partition)
        if current is not None and current.store is store and current.target is None:
            return
        if current is not None and current.done is not None and not current.done.done():
            current.done.cancel()
        self._follows[partition] = _Follow(store, RestoreStats(partition, store.position))
        self._changed.set()

    def forget(self, partition: int) -> None:
        """Stop reading partition ``partition`` (a restore still running is cancelled)."""
        follow = self._follows.pop(partition, None)
        if follow is not None and follow.done is not None and not follow.done.done():
            follow.done.cancel()
        self._changed.set()

    async def _run(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        assigned: dict[int, LocalStore] = {}
        while True:
            if self._changed.is_set() or not self._follows:
                self._changed.clear()
                try:
                    await self._reassign(consumer, assigned)
                except KafkaError as exc:
                    # No end offset within the request timeout: no leader for a changelog
                    # partition now, or one the changelog does not have (the task topic
                    # grew): the restore waits, and the log says which.
                    log.warning(
                        "cannot read where the changelog ends; trying again",
                        topic=self.topic,
                        partitions=sorted(self._follows),
                        error=repr(exc),
                    )
                    self._changed.set()
                    await asyncio.sleep(_RETRY_S)
                    continue
                if not self._follows:
                    await self._changed.wait()
                    continue
            fresh: set[int] = set()
            try:
                batches = await consumer.getmany(
                    timeout_ms=_READ_TIMEOUT_MS, max_records=_READ_MAX_RECORDS
                )
            except KafkaError as exc:
                log.warning("reading the changelog failed; trying again", error=repr(exc))
                await asyncio.sleep(_RETRY_S)
                continue
            for tp, records in batches.items():
                if records:
                    fresh.add(tp.partition)
                follow = self._follows.get(tp.partition)
                if follow is None or assigned.get(tp.partition) is not follow.store:
                    continue
                store = follow.store
                for record in records:
                    store.replay(record.key, record.value, record.offset)
                if follow.target is None:
                    follow.stats.standby_applied += len(records)
                    store.flush()  # a standby commits what each read brought
                else:
                    follow.stats.replayed += len(records)
            await self._check_restores(consumer, fresh)

    async def _reassign(self, consumer: AIOKafkaConsumer, assigned: dict[int, LocalStore]) -> None:
        wanted = {p: f.store for p, f in self._follows.items()}
        if wanted != assigned:
            # A new assignment forgets every position (and drops fetched records): each
            # partition goes on from what its copy applied.
            consumer.assign([TopicPartition(self.topic, p) for p in sorted(wanted)])
            for p, store in wanted.items():
                consumer.seek(TopicPartition(self.topic, p), store.position)
            assigned.clear()
            assigned.update(wanted)
        restoring = [p for p, f in self._follows.items() if f.target == -1]
        if restoring:
            tps = [TopicPartition(self.topic, p) for p in restoring]
            ends = await consumer.end_offsets(tps)
            for tp, end in ends.items():
                follow = self._follows.get(tp.partition)
                if follow is not None and follow.target == -1:
                    follow.target = int(end)
                    follow.stats.end_offset = int(end)
                    log.info(
                        "restoring state",
                        topic=self.topic,
                        partition=tp.partition,
                        start_offset=follow.store.position,
                        end_offset=int(end),
                        records=max(0, int(end) - follow.store.position),
                    )
        await self._check_restores(consumer)

    async def _check_restores(
        self, consumer: AIOKafkaConsumer, fresh: Collection[int] = ()
    ) -> None:
        # A restore ends when its copy reached the end: the end offset listed when it
        # started, or the high watermark of a later fetch if that is further (a broker
        # may list too small an end), and not before a fetch answered. Where the log ends
        # in a gap (compacted records, transaction markers) the consumer's position
        # tells; it is asked only of a partition that returned nothing this round, so
        # every record it fetched is applied.
        #
        # Read committed, a restore also waits until no transaction is open in the
        # partition (its last stable offset at its high watermark): records committed
        # after an open transaction are not handed out before it ends, so a restore that
        # stopped at the open one would miss them. Only a partition's owner writes its
        # changelog, so an open transaction there is the previous owner's: one that
        # commits as it gives the partition up, or one of an instance that died, which
        # the broker aborts after its transaction timeout.
        committed = self._isolation_level == "read_committed"
        for p, follow in list(self._follows.items()):
            target = follow.target
            if target is None or target < 0 or follow.done is None or follow.done.done():
                continue
            tp = TopicPartition(self.topic, p)
            high = consumer.highwater(tp)
            if high is None:
                continue  # no fetch answered yet
            if committed:
                stable = consumer.last_stable_offset(tp)
                if stable is None or stable < high:
                    if not follow.waited:
                        follow.waited = True
                        log.info(
                            "a transaction is open in the changelog: the restore waits "
                            "until it ends (a dead instance's: its transaction timeout)",
                            topic=self.topic,
                            partition=p,
                            last_stable_offset=stable,
                            high_watermark=high,
                        )
                    continue
            if high < follow.store.position:
                # The log ends below what the copy applied: the changelog was recreated.
                # Its values and checkpoint belong to the old log: restored from the new
                # one's start instead (the reader fell back to it already).
                log.warning(
                    "the changelog ends before this copy's checkpoint (it was recreated): "
                    "the copy is dropped and restored from the changelog's start",
                    topic=self.topic,
                    partition=p,
                    checkpoint=follow.store.position,
                    end_offset=high,
                )
                follow.store.reset()
                follow.stats.start_offset = 0
                consumer.seek(tp, 0)
                continue
            if high > target:
                target = follow.target = follow.stats.end_offset = high
            position = follow.store.position
            if position < target:
                if p in fresh:
                    continue  # more to read
                try:
                    position = await consumer.position(tp)
                except KafkaError:
                    continue
                if position < target:
                    continue
                follow.store.skip_to(position)
            follow.store.flush()
            stats = follow.stats
            stats.restoring = False
            stats.seconds = time.monotonic() - stats.started_at
            self.history.append(stats)
            log.info(
                "state restored",
                topic=self.topic,
                partition=p,
                replayed=stats.replayed,
                seconds=round(stats.seconds, 3),
            )
            del self._follows[p]
            self._changed.set()
            follow.done.set_result(stats)
