"""Exactly-once: one transactional producer per consumer (per subscription instance).

With ``Application(exactly_once=True)`` a subscription has one `Transaction`: an
aiokafka producer whose transactional id is its own (``<group>.<random>``). Each commit
interval, the outputs of every assigned partition's tasks (``ctx.produce``, retry and
dead-letter records), their offsets and their checkpoints are committed in one
transaction.

Zombie fencing follows Kafka's ``exactly_once_v2`` (KIP-447), not the transactional id:
the offsets go with the consumer's group metadata (``TxnOffsetCommit`` version 3, see
``_group_txn``), so the group coordinator refuses the commit of a member whose generation
is over and its transaction aborts; and a new owner reads the committed offsets with
``require_stable``, waiting for a transaction that holds offsets of its partitions. Every
commit carries the offsets of every live partition (the unchanged ones as they were), so
a transaction never commits without that check, nor holds a partition's records that a
new owner would not wait for.

A producer error (the broker aborted a transaction that ran past its timeout, a commit
that failed) fails the transaction: the producer is restarted (which aborts what it had
open) and every partition goes back to its last commit.

Whoever puts more than outputs into a transaction (the state store's changes) registers
a `TransactionListener`: told when the open transaction commits, and when it is
dropped (aborted, stopped).

Ordering: an output delivery (`Transaction.deliver()`) sends the task's records into
the open transaction *and* completes the task's offset inside
`Transaction.delivery()`; a commit (`Transaction.commit()`) reads the watermarks
and checkpoints and commits while no delivery is inside. So a transaction holds a task's
outputs exactly when its partition's checkpoint (or offset) covers the task. Deliveries
run together; a commit waits only for those already inside, and new ones wait for the
commit, so a steady load of outputs does not keep commits out. Tasks without outputs
complete without entering.

Caller: the subscription's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Protocol

import structlog
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError
from aiokafka.structs import OffsetAndMetadata

from decaton_aio._aiokafka import TransactionState, sender_running, transaction_waiter, txn_manager
from decaton_aio.consumer._contract import TaskHost
from decaton_aio.consumer.commit._group_txn import GroupMetadata, send_group_metadata
from decaton_aio.context import OutputRecord
from decaton_aio.errors import DecatonError
from decaton_aio.producer import MAX_REQUEST_SIZE, ProducerConfig
from decaton_aio.typing import Record

__all__ = [
    "CommitPlan",
    "Transaction",
    "TransactionFailedError",
    "TransactionListener",
    "commit_interval_within",
    "transaction_timeout_ms",
]

log = structlog.get_logger("decaton_aio.consumer")

#: What a commit writes: the offset and metadata of each partition that changed.
CommitPlan = dict[TopicPartition, tuple[int, str]]

#: The shortest transaction timeout: the broker aborts a transaction open longer (an
#: instance killed with one open holds read_committed readers back until then).
MIN_TRANSACTION_TIMEOUT_MS = 10_000


def transaction_timeout_ms(commit_interval_ms: int) -> int:
    """The transaction timeout for a commit interval: a transaction lives one interval
    and its commit, so three intervals, and never under ten seconds."""
    return max(MIN_TRANSACTION_TIMEOUT_MS, 3 * commit_interval_ms)


def commit_interval_within(timeout_ms: int, wanted_ms: int) -> int:
    """The commit interval a transaction timeout fixed at start allows: the one wanted
    now (a reloaded ``decaton.commit.interval.ms``), at most a third of the timeout, so a
    transaction still commits before the broker aborts it."""
    return min(wanted_ms, timeout_ms // 3)


class TransactionFailedError(DecatonError):
    """Raised when a transaction could not commit: it was aborted, and the partitions must
    go back to their last committed state."""

    retriable = True


class TransactionListener(Protocol):
    """Told how the open transaction ended."""

    def committed(self) -> None:
        """It committed (called inside the commit, before another record can enter)."""
        ...

    def dropped(self) -> None:
        """It was aborted or will be (a failed commit, a stop)."""
        ...


class Transaction:
    """The transactional producer of one consumer, shared by its partitions.

    Args:
        group_id: the consumer group the offsets are committed for.
        config: connection and batching settings (idempotence is always on).
        member: the consumer's group metadata, read at each commit.
        timeout_ms: the transaction timeout (see `transaction_timeout_ms()`).
    """

    def __init__(
        self,
        group_id: str,
        config: ProducerConfig,
        member: Callable[[], GroupMetadata],
        *,
        timeout_ms: int = MIN_TRANSACTION_TIMEOUT_MS,
    ) -> None:
        self.group_id = group_id
        self.transactional_id = f"{group_id}.{uuid.uuid4().hex[:16]}"
        self._config = config
        self._member = member
        self.timeout_ms = timeout_ms
        self._producer: Any = None
        self._open = False
        self._broken = False  # a restart after a failure did not work: try at next commit
        self._starting: asyncio.Task[None] | None = None
        # Deliveries inside now, and whether they may enter (no commit waiting or running).
        self._inside = 0
        self._empty = asyncio.Event()
        self._empty.set()
        self._open_to_deliveries = asyncio.Event()
        self._open_to_deliveries.set()
        self._committing = asyncio.Lock()  # one commit at a time
        # The one begin_transaction concurrent deliveries wait for (a future, not a lock:
        # thousands of waiters wake together instead of one loop iteration each).
        self._beginning: asyncio.Future[None] | None = None
        self.listeners: list[TransactionListener] = []
        #: Transactions committed since the start.
        self.commits = 0
        # The delivery futures of the open transaction's records: the client commits a
        # transaction even when the broker refused one of its records (too large), so the
        # commit checks them first.
        self._sent: list[asyncio.Future[Any]] = []

    @property
    def open(self) -> bool:
        """Whether a transaction is open (something was sent since the last commit)."""
        return self._open

    async def start(self) -> None:
        """Start the producer (once; concurrent callers wait for the same start).

        Raises:
            KafkaError: the cluster cannot be reached or refuses transactions.
        """
        if self._producer is not None:
            return
        if self._starting is None or self._starting.done():
            self._starting = asyncio.ensure_future(self._start())
        await asyncio.shield(self._starting)

    async def _start(self) -> None:
        config = self._config
        producer = AIOKafkaProducer(
            bootstrap_servers=config.bootstrap_servers,
            transactional_id=self.transactional_id,
            transaction_timeout_ms=self.timeout_ms,
            enable_idempotence=True,
            acks="all",
            compression_type=config.compression_type,
            linger_ms=config.linger_ms,
            max_batch_size=config.max_batch_bytes,
            max_request_size=MAX_REQUEST_SIZE,  # what oversized() checks side records against
            request_timeout_ms=config.request_timeout_ms,
            client_id=f"decaton-aio-txn-{self.transactional_id}",
            **config.security.client_kwargs(),
        )
        send_group_metadata(producer, self._member)
        try:
            await producer.start()
        except BaseException:
            await producer.stop()
            raise
        self._producer = producer
        self._open = False
        self._broken = False
        log.info("transactional producer started", transactional_id=self.transactional_id)

    async def restart(self) -> None:
        """Throw the producer away and start a new one with the same transactional id
        (which aborts what the old one had open)."""
        await self.stop(abort=False)
        await self.start()

    async def stop(self, *, abort: bool = True) -> None:
        """Stop the producer, aborting its open transaction (``abort=False``: leave that to
        the broker, at once when a producer with the same id starts, else at its
        timeout)."""
        starting, self._starting = self._starting, None
        if starting is not None and not starting.done():
            starting.cancel()
            await asyncio.wait([starting])
        producer, self._producer = self._producer, None
        self._open = False
        self._forget_sent()
        self._dropped_all()
        if producer is not None:
            # The failure that ended the transaction was handled: not left unretrieved.
            waiter = transaction_waiter(producer)
            if waiter is not None and waiter.done() and not waiter.cancelled():
                waiter.exception()
            try:
                async with asyncio.timeout(10.0):
                    if abort and _abortable(producer):
                        await producer.abort_transaction()
                    await producer.stop()
            except (KafkaError, TimeoutError) as exc:
                log.warning("transactional producer did not stop cleanly", error=repr(exc))

    def _dropped_all(self) -> None:
        for listener in self.listeners:
            listener.dropped()

    async def _begin(self) -> Any:
        producer = self._producer
        if producer is None:
            raise TransactionFailedError(f"{self.transactional_id} is not started")
        if not self._open:
            if self._beginning is None or self._beginning.done():
                self._beginning = asyncio.ensure_future(self._begin_with(producer))
            await asyncio.shield(self._beginning)
        return producer

    async def _begin_with(self, producer: Any) -> None:
        await producer.begin_transaction()
        if producer is self._producer:
            self._open = True

    @contextlib.asynccontextmanager
    async def delivery(self) -> AsyncIterator[None]:
        """Inside it, records enter the open transaction and tasks complete; a commit
        never runs meanwhile. Many deliveries may be inside at once."""
        while not self._open_to_deliveries.is_set():
            await self._open_to_deliveries.wait()
        self._inside += 1
        self._empty.clear()
        try:
            yield
        finally:
            self._inside -= 1
            if not self._inside:
                self._empty.set()

    @contextlib.asynccontextmanager
    async def _alone(self) -> AsyncIterator[None]:
        # A commit: new deliveries wait from now, the ones inside finish first.
        async with self._committing:
            self._open_to_deliveries.clear()
            try:
                await self._empty.wait()
                yield
            finally:
                self._open_to_deliveries.set()

    # ------------------------------------------------------------------- sending

    async def deliver(
        self, partition: TaskHost, record: Record, outputs: Sequence[OutputRecord]
    ) -> None:
        """Put a finished task's outputs into the open transaction and complete its offset
        (both inside `delivery()`). A closed partition drops them: its record is
        redelivered.

        Raises:
            KafkaError: the client refused a record (the task stays pending).
            TransactionFailedError: the producer is not running.
        """
        async with self.delivery():
            if partition.closed:
                return
            for out in outputs:
                await self.send(out.topic, out.value, key=out.key, headers=out.headers)
            partition.finish_released(record)

    async def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] | None = None,
        partition: int | None = None,
    ) -> asyncio.Future[Any]:
        """Put a record into the open transaction (beginning one); call it inside
        `delivery()` or a commit's plan. Returns its delivery future (the record's
        metadata, with its offset).

        Raises:
            KafkaError: the client refused the record.
            TransactionFailedError: the producer is not running.
        """
        producer = await self._begin()
        sent: asyncio.Future[Any] = await producer.send(
            topic, value, key=key, headers=headers, partition=partition
        )
        self._sent.append(sent)
        return sent

    async def _check_sent(self) -> None:
        """Wait for the open transaction's records; raise what the broker refused one of
        them with (the commit then aborts: committed, the record would be lost)."""
        sent, self._sent = self._sent, []
        if not sent:
            return
        await asyncio.wait(sent)
        refused = [exc for f in sent if not f.cancelled() and (exc := f.exception()) is not None]
        if refused:
            log.error(
                "the broker refused a record of the transaction; it is aborted",
                refused=len(refused),
                error=repr(refused[0]),
            )
            raise KafkaError(f"a record of the transaction was refused: {refused[0]!r}")

    def _forget_sent(self) -> None:
        for future in self._sent:  # their failures were handled: not left unretrieved
            if future.done() and not future.cancelled():
                future.exception()
        self._sent = []

    async def send_checkpoint(self, topic: str, partition: int, key: bytes, value: bytes) -> int:
        """Write a checkpoint record in the open transaction; its offset. Call it only
        from the ``plan`` of `commit()` (no delivery is inside)."""
        producer = await self._begin()
        sent = await producer.send_and_wait(topic, value, key=key, partition=partition)
        return int(sent.offset)

    # ------------------------------------------------------------------ committing

    async def commit(
        self,
        plan: Callable[[], Awaitable[CommitPlan]],
        unchanged: Callable[[], CommitPlan],
    ) -> CommitPlan | None:
        """Commit the open transaction with the offsets and metadata ``plan`` returns
        (the partitions that changed) and ``unchanged()`` (every other live partition, as
        last committed: the group's check covers each commit).

        ``plan`` runs while no delivery is inside, so no output enters the transaction
        between the snapshot of the watermarks and the commit.

        Returns:
            What ``plan`` returned, or ``None`` when there was nothing to commit.

        Raises:
            TransactionFailedError: the transaction was aborted (or its outcome is
                unknown); the caller rewinds the partitions to their last commit.
        """
        async with self._alone():
            if self._producer is None:
                if not self._broken:
                    return None  # not started yet (or stopped)
                try:
                    await self.start()
                except (KafkaError, OSError) as exc:
                    raise TransactionFailedError(f"cannot restart: {exc!r}") from exc
            try:
                planned = await plan()
                if not planned and not self._open:
                    return None
                producer = await self._begin()
                await self._check_sent()
                offsets = {
                    tp: OffsetAndMetadata(offset, metadata)
                    for tp, (offset, metadata) in (unchanged() | planned).items()
                }
                if offsets:
                    await producer.send_offsets_to_transaction(offsets, self.group_id)
                await producer.commit_transaction()
                self._open = False
                self.commits += 1
                for listener in self.listeners:
                    listener.committed()
                return planned
            except (KafkaError, OSError) as exc:
                await self._abandon(exc)
                raise TransactionFailedError(
                    f"the transaction of {self.transactional_id} did not commit: {exc!r}"
                ) from exc

    async def abort(self, reason: str) -> None:
        """Abort the open transaction, if any: its records are never committed, its
        listeners go back to their last commit (`TransactionListener.dropped()`), and a
        fresh producer with the same id takes over. For a member that lost its
        partitions: what it did in the generation it lost must not commit in its next.

        Waits for the deliveries inside and a commit under way, as a commit does.
        """
        async with self._alone():
            if self._open:
                await self._abandon(reason, "aborting the open transaction")

    async def _abandon(
        self, cause: BaseException | str, what: str = "transaction failed; aborting it"
    ) -> None:
        # A failed commit leaves the client in a state only a fresh producer gets out of;
        # starting one with the same id aborts the transaction on the broker.
        log.warning(
            f"{what} and going back to the last commit",
            transactional_id=self.transactional_id,
            error=cause if isinstance(cause, str) else repr(cause),
        )
        try:
            await self.restart()
        except (KafkaError, OSError) as exc:
            self._broken = True
            log.error("cannot restart the transactional producer", error=repr(exc))


def _abortable(producer: Any) -> bool:
    # A transaction is open (or failed short of fatally) and the client still runs.
    state = txn_manager(producer).state
    return state in _ABORTABLE and sender_running(producer)


_ABORTABLE = (TransactionState.IN_TRANSACTION, TransactionState.ABORTABLE_ERROR)
