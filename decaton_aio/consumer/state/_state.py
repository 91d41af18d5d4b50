"""The state store of a subscription: local copies, changelog, restores and standbys.

A `StateStore` is made by the subscription when the application names a store. It
owns

- the local copies (``_store``'s `LocalStore`), one per partition
  number this instance owns or keeps as a standby, in ``<directory>/<group>/<store>/``
  (a lock file keeps a second process off the same directory);
- the changelog writer (its own ``acks=all`` sender without a spool: a change is durable
  only when the changelog has it; with exactly-once the partitions' transactions instead,
  see ``_state_txn``) and the reader of restores and standbys (``read_committed`` with
  exactly-once: a copy never takes a change of an aborted transaction);
- the assignor that tells the group what this member holds.

On assignment the subscription calls `StateStore.assigned()` and keeps the partitions'
topics paused until their restores resolve (with exactly-once a restore starts only once
the partitions' committed offsets are stable: a previous owner's transaction still
committing would land past the end it reads to); standbys come from the
assignment (`StateStore.set_standbys()`). Copies neither owned nor standby are closed
(their files stay for a later assignment).

Caller: the subscription's event loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fcntl
import os
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import IO

import structlog
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from decaton_aio.admin import ensure_changelog_topic
from decaton_aio.app import Application, ConsumerConfig
from decaton_aio.consumer._contract import StateWriter
from decaton_aio.consumer.state._assignor import MemberState, StateAwareAssignor
from decaton_aio.consumer.state._changelog import ChangelogReader, ChangelogWriter, RestoreStats
from decaton_aio.consumer.state._state_txn import TransactionalChangelog
from decaton_aio.consumer.state._store import LocalStore
from decaton_aio.errors import ConfigError
from decaton_aio.producer import DurableSender, ProducerConfig
from decaton_aio.state import StateStoreConfig

__all__ = ["StateStore"]

log = structlog.get_logger("decaton_aio.state")


class StateStore:
    """The state store of one subscription.

    Args:
        app: the application (its ``state`` must be set).
        consumer: the subscription's consumer settings.
        producer: the subscription's producer settings (the changelog sender copies them
            without the spool).
    """

    def __init__(
        self, app: Application, consumer: ConsumerConfig, producer: ProducerConfig
    ) -> None:
        config = app.state
        assert config is not None
        self.config: StateStoreConfig = config
        self.topic = config.changelog_topic(consumer.group_id)
        self._app = app
        self._bootstrap = consumer.bootstrap_servers
        self._security = consumer.security
        self._dir: Path | None = None
        if isinstance(config.directory, Path):
            self._dir = config.directory / consumer.group_id / config.name
        self._sender: DurableSender | None = None
        self.writer: StateWriter
        if app.exactly_once:
            self.writer = TransactionalChangelog(self.topic)
        else:
            self._sender = DurableSender(
                dataclasses.replace(producer, spool_dir=None),
                client_id=f"decaton-aio-changelog-{app.subscription_id}",
            )
            self.writer = ChangelogWriter(self._sender, self.topic)
        self.reader = ChangelogReader(
            consumer.bootstrap_servers,
            self.topic,
            client_id=f"{consumer.client_id}-changelog",
            # Committed changes only, whatever this run's guarantee: an exactly-once run
            # before this one may have left aborted ones in the log.
            isolation_level="read_committed",
            client_kwargs=consumer.security.client_kwargs(),
        )
        self.assignor = StateAwareAssignor(self.member_state, config.num_standby_replicas)
        self._stores: dict[int, LocalStore] = {}
        self._active: set[int] = set()
        self._on_disk: dict[int, int] = {}  # checkpoints of closed copies in the directory
        self._lock: IO[str] | None = None
        self._restoring: dict[int, asyncio.Task[None]] = {}

    # ----------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Lock the directory, make sure the changelog exists, start sender and reader.

        Raises:
            ConfigError: the directory is locked by another process, or the changelog
                cannot exist (see `ensure_changelog_topic()`).
        """
        if self._dir is not None:
            self._lock = _lock(self._dir)
            self._on_disk = _checkpoints_in(self._dir)
        await ensure_changelog_topic(
            self._bootstrap, self._app, self.topic, security=self._security
        )
        if self._sender is not None:
            await self._sender.start()
        try:
            await self.reader.start()
        except BaseException:
            if self._sender is not None:
                await self._sender.stop()
            raise

    async def stop(self) -> None:
        """Stop reading and writing; flush and close every local copy; unlock."""
        for task in self._restoring.values():
            task.cancel()
        await self.reader.stop()
        if self._sender is not None:
            await self._sender.stop()
        for p in list(self._stores):
            self._close(p)
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    # ----------------------------------------------------------------- copies

    def store(self, partition: int) -> LocalStore | None:
        """The open copy of ``partition`` (``None`` when there is none)."""
        return self._stores.get(partition)

    def _open(self, partition: int) -> LocalStore:
        store = self._stores.get(partition)
        if store is None:
            path = None if self._dir is None else self._dir / f"{partition}.sqlite"
            store = self._stores[partition] = LocalStore(path)
            self._on_disk.pop(partition, None)
        return store

    def _close(self, partition: int) -> None:
        store = self._stores.pop(partition, None)
        if store is not None:
            store.close()
            if store.path is not None:
                self._on_disk[partition] = store.checkpoint

    def member_state(self) -> MemberState:
        """What this member tells the group leader when it joins."""
        positions = dict(self._on_disk)
        positions.update({p: s.position for p, s in self._stores.items()})
        return MemberState(frozenset(self._active), positions)

    # -------------------------------------------------------------- assignment

    def assigned(
        self,
        partitions: set[int],
        restored: Callable[[int], None],
        after: Awaitable[None] | None = None,
    ) -> None:
        """This member owns ``partitions`` now: restore each one not restored yet (once
        ``after`` is done, when given), and call ``restored(partition)`` when its copy is
        there; follow the standbys of the assignment."""
        for p in sorted(partitions - set(self._restoring)):
            if after is None:
                done: Awaitable[RestoreStats] = self.activate(p)
            else:
                self._active.add(p)
                self._open(p)  # the partition's processor reads this copy
                done = self._activate_after(p, after)
            self._restoring[p] = asyncio.create_task(
                self._restore(p, done, restored), name="decaton-restore"
            )
        self.set_standbys(self.assignor.standbys)

    async def _activate_after(self, partition: int, after: Awaitable[None]) -> RestoreStats:
        await asyncio.shield(after)  # shared by the assignment's partitions
        return await self.activate(partition)

    async def _restore(
        self, partition: int, done: Awaitable[RestoreStats], restored: Callable[[int], None]
    ) -> None:
        try:
            await done
        finally:
            if self._restoring.get(partition) is asyncio.current_task():
                del self._restoring[partition]
        restored(partition)

    def restoring(self, partition: int) -> bool:
        """Whether ``partition`` waits for its restore (its topics stay paused)."""
        return partition in self._restoring

    def activate(self, partition: int) -> asyncio.Future[RestoreStats]:
        """This member owns ``partition`` now: restore its copy up to the changelog's end.

        Returns:
            A future resolving when the copy is restored.
        """
        self._active.add(partition)
        return self.reader.restore(partition, self._open(partition))

    def deactivate(self, partition: int) -> None:
        """This member no longer owns ``partition``: commit its copy (kept open until the
        next assignment says whether it stays as a standby)."""
        self._active.discard(partition)
        task = self._restoring.pop(partition, None)
        if task is not None:
            task.cancel()
        self.reader.forget(partition)
        store = self._stores.get(partition)
        if store is not None:
            store.flush()

    def set_standbys(self, standbys: frozenset[int]) -> None:
        """Follow the changelogs of ``standbys``; close copies neither owned nor standby."""
        for p in sorted(standbys - self._active):
            self.reader.follow(p, self._open(p))
        for p in sorted(set(self._stores) - self._active - standbys):
            self.reader.forget(p)
            self._close(p)
        if standbys:
            log.info("standby replicas", topic=self.topic, partitions=sorted(standbys))

    def flush(self) -> None:
        """Commit every owned copy with its checkpoint (the commit routine calls it)."""
        for p in self._active:
            store = self._stores.get(p)
            if store is not None:
                store.flush()


class StateCollector:
    """Prometheus metrics of a state store, read at scrape time: restore progress and
    standbys."""

    def __init__(self, subscription: str, store: StateStore) -> None:
        self._subscription = subscription
        self._store = store

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        labels = ["subscription", "store", "partition"]
        remaining = GaugeMetricFamily(
            "decaton_state_restore_remaining_records",
            "Changelog records a restoring partition has left to replay before it processes.",
            labels=labels,
        )
        standby = GaugeMetricFamily(
            "decaton_state_standby", "1 for each partition this instance keeps warm.", labels=labels
        )
        replayed = CounterMetricFamily(
            "decaton_state_restored_records",
            "Changelog records replayed by restores (before partitions processed).",
            labels=labels[:2],
        )
        name = self._store.config.name
        reader = self._store.reader
        for stats, left in reader.progress():
            values = [self._subscription, name, str(stats.partition)]
            if stats.restoring:
                remaining.add_metric(values, left)
            else:
                standby.add_metric(values, 1)
        total = sum(h.replayed for h in list(reader.history))
        total += sum(s.replayed for s, _ in reader.progress())
        replayed.add_metric([self._subscription, name], total)
        yield from (remaining, standby, replayed)


def _lock(directory: Path) -> IO[str]:
    # One process per directory: two would write one SQLite file from different views.
    directory.mkdir(parents=True, exist_ok=True)
    lock = open(directory / "LOCK", "w")  # noqa: SIM115 - held until stop
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        lock.close()
        raise ConfigError(
            f"state directory {directory} is in use by another process: give each "
            "instance its own StateStoreConfig(directory=...)"
        ) from None
    return lock


def _checkpoints_in(directory: Path) -> dict[int, int]:
    # The copies a previous run left: their checkpoints tell the group how warm they are.
    found = {}
    for entry in os.scandir(directory):
        name = entry.name
        if name.endswith(".sqlite") and name[: -len(".sqlite")].isdigit():
            store = LocalStore(Path(entry.path))
            found[int(name[: -len(".sqlite")])] = store.checkpoint
            store.close()
    return found
