"""Exactly-once: one transactional producer per assigned partition.

With ``Application(exactly_once=True)`` each assigned partition gets a
:class:`PartitionTransaction`: an aiokafka producer whose transactional id is
``<group>.<topic>.<partition>``. Each commit interval, the outputs of the partition's
tasks (``ctx.produce``), its offset and its checkpoint are committed in one transaction.

Why one id per partition, not one per instance with the group's metadata (KIP-447):
aiokafka 0.14 sends ``TxnOffsetCommit`` version 0, without the member id and generation,
so the group coordinator cannot fence a zombie by its generation. Instead a partition's id
is the same wherever it runs: a new owner starting its producer (``InitProducerId``) bumps
the epoch, which aborts the old owner's open transaction, waits for one being committed,
and makes every later request of the old owner fail (``ProducerFenced``). The new owner
reads the committed offset and checkpoint only after that, so it never reads a state a
transaction is still changing. The price is a producer (and its connections) per assigned
partition.

Whoever puts more than outputs into a transaction (the state store's changes) registers
a :class:`TransactionListener`: told when the open transaction commits, and when it is
dropped (aborted, fenced, stopped).

Ordering inside a partition: an output delivery (:meth:`PartitionTransaction.deliver`)
sends the task's records into the open transaction *and* completes the task's offset
inside :meth:`PartitionTransaction.delivery`; a commit (:meth:`PartitionTransaction.commit`)
reads the watermark and checkpoint and commits while no delivery is inside. So a
transaction holds a task's outputs exactly when its checkpoint (or offset) covers the
task. Deliveries of different tasks run together (a key's next task starts only after the
previous one completed); a commit waits only for those already inside, and new ones wait
for the commit, so a steady load of outputs does not keep commits out.
Tasks without outputs complete without entering.

Caller: the subscription's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Protocol

import structlog
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import (
    InvalidProducerEpoch,
    KafkaError,
    ProducerFenced,
    TransactionalIdAuthorizationFailed,
)
from aiokafka.structs import OffsetAndMetadata

from decaton_aio.consumer._contract import TaskHost
from decaton_aio.context import OutputRecord
from decaton_aio.errors import DecatonError
from decaton_aio.producer import ProducerConfig
from decaton_aio.typing import Record

__all__ = [
    "FencedError",
    "PartitionTransaction",
    "TransactionFailedError",
    "TransactionListener",
    "transactional_id",
]

log = structlog.get_logger("decaton_aio.consumer")

_FENCED = (ProducerFenced, InvalidProducerEpoch, TransactionalIdAuthorizationFailed)

#: What a commit writes: ``(offset, metadata)``, or ``None`` when nothing changed.
CommitPlan = tuple[int, str] | None


class FencedError(DecatonError):
    """Raised when another instance took the partition's transactional id over."""


class TransactionFailedError(DecatonError):
    """Raised when a transaction could not commit: it was aborted, and the partition must
    go back to its last committed state."""

    retriable = True


class TransactionListener(Protocol):
    """Told how the open transaction of a partition ended."""

    def committed(self) -> None:
        """It committed (called inside the commit, before another record can enter)."""
        ...

    def dropped(self) -> None:
        """It was aborted or will be (a failed commit, a fence, a stop)."""
        ...


def transactional_id(group_id: str, tp: TopicPartition) -> str:
    """The transactional id of a partition for a group: the same on every instance."""
    return f"{group_id}.{tp.topic}.{tp.partition}"


class PartitionTransaction:
    """The transactional producer of one assigned partition.

    Args:
        tp: the partition.
        group_id: the consumer group the offsets are committed for.
        config: connection and batching settings (idempotence is always on).
    """

    def __init__(self, tp: TopicPartition, group_id: str, config: ProducerConfig) -> None:
        self.tp = tp
        self.group_id = group_id
        self.transactional_id = transactional_id(group_id, tp)
        self._config = config
        self._producer: Any = None
        self._open = False
        self.fenced = False
        self._broken = False  # a restart after a failure did not work: try at next commit
        self._starting = False
        self._dropped = False  # stopped while starting: the start closes what it opened
        # Deliveries inside now, and whether they may enter (no commit waiting or running).
        self._inside = 0
        self._empty = asyncio.Event()
        self._empty.set()
        self._open_to_deliveries = asyncio.Event()
        self._open_to_deliveries.set()
        self._committing = asyncio.Lock()  # one commit at a time
        self._beginning = asyncio.Lock()  # one begin_transaction for concurrent deliveries
        self.listeners: list[TransactionListener] = []

    @property
    def open(self) -> bool:
        """Whether a transaction is open (something was sent since the last commit)."""
        return self._open

    async def start(self) -> None:
        """Start the producer: fences the partition's previous owner and waits until its
        transaction, if any, is finished.

        Raises:
            FencedError: another instance started the same id meanwhile.
            KafkaError: the cluster cannot be reached or refuses transactions.
        """
        config = self._config
        producer = AIOKafkaProducer(
            bootstrap_servers=config.bootstrap_servers,
            transactional_id=self.transactional_id,
            enable_idempotence=True,
            acks="all",
            compression_type=config.compression_type,
            linger_ms=config.linger_ms,
            max_batch_size=config.max_batch_bytes,
            request_timeout_ms=config.request_timeout_ms,
            client_id=f"decaton-aio-txn-{self.transactional_id}",
            **config.security.client_kwargs(),
        )
        self._starting, self._dropped = True, False
        try:
            await producer.start()
        except _FENCED as exc:
            await producer.stop()
            self.fenced = True
            raise FencedError(f"{self.transactional_id} is used by another instance") from exc
        except BaseException:
            await producer.stop()
            raise
        finally:
            self._starting = False
        if self._dropped:  # stop() was called meanwhile (a revoke, a shutdown)
            await producer.stop()
            return
        self._producer = producer
        self._open = False
        self._broken = False

    async def restart(self) -> None:
        """Throw the producer away and start a new one (aborting what it had open)."""
        await self.stop()
        await self.start()

    async def stop(self) -> None:
        """Stop the producer; an open transaction is aborted by the broker (or by the next
        owner's start)."""
        producer, self._producer = self._producer, None
        self._open = False
        self._dropped_all()
        self._dropped = self._starting
        if producer is not None:
            try:
                async with asyncio.timeout(10.0):
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
            async with self._beginning:
                if not self._open:
                    await producer.begin_transaction()
                    self._open = True
        return producer

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
        (both inside :meth:`delivery`). A closed partition drops them: its record is
        redelivered.

        Raises:
            FencedError: another instance owns the partition now.
            KafkaError: the client refused a record (the task stays pending).
        """
        async with self.delivery():
            if partition.closed or self.fenced:
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
        :meth:`delivery` or a commit's plan. Returns its delivery future (the record's
        metadata, with its offset).

        Raises:
            FencedError: another instance owns the partition now.
            KafkaError: the client refused the record.
        """
        try:
            producer = await self._begin()
            sent: asyncio.Future[Any] = await producer.send(
                topic, value, key=key, headers=headers, partition=partition
            )
        except _FENCED as exc:
            self._fence()
            raise FencedError(f"{self.transactional_id} was fenced") from exc
        return sent

    def _fence(self) -> None:
        self.fenced = True
        self._dropped_all()

    async def send_checkpoint(self, topic: str, partition: int, key: bytes, value: bytes) -> int:
        """Write a checkpoint record in the open transaction; its offset. Call it only
        from the ``plan`` of :meth:`commit` (no delivery is inside)."""
        producer = await self._begin()
        sent = await producer.send_and_wait(topic, value, key=key, partition=partition)
        return int(sent.offset)

    # ------------------------------------------------------------------ committing

    async def commit(self, plan: Callable[[], Awaitable[CommitPlan]]) -> int | None:
        """Commit the open transaction with the offset and metadata ``plan`` returns.

        ``plan`` runs while no delivery is inside, so no output enters the transaction
        between the snapshot of the watermark and the commit.

        Returns:
            The offset committed, or ``None`` when there was nothing to commit.

        Raises:
            FencedError: another instance owns the partition now.
            TransactionFailedError: the transaction was aborted (or its outcome is
                unknown); the caller rewinds the partition to its last commit.
        """
        async with self._alone():
            if self.fenced:
                return None
            if self._producer is None:
                if not self._broken:
                    return None  # not started yet (or stopped)
                try:
                    await self.start()
                except (KafkaError, OSError) as exc:
                    raise TransactionFailedError(f"cannot restart: {exc!r}") from exc
            try:
                planned = await plan()
                if planned is None and not self._open:
                    return None
                producer = await self._begin()
                if planned is not None:
                    offset, metadata = planned
                    offsets = {self.tp: OffsetAndMetadata(offset, metadata)}
                    await producer.send_offsets_to_transaction(offsets, self.group_id)
                await producer.commit_transaction()
                self._open = False
                for listener in self.listeners:
                    listener.committed()
                return planned[0] if planned is not None else None
            except _FENCED as exc:
                self._fence()
                raise FencedError(f"{self.transactional_id} was fenced") from exc
            except (KafkaError, OSError) as exc:
                await self._abandon(exc)
                raise TransactionFailedError(
                    f"the transaction of {self.transactional_id} did not commit: {exc!r}"
                ) from exc

    async def _abandon(self, cause: BaseException) -> None:
        # A failed commit leaves the client in a state only a fresh producer gets out of;
        # starting one aborts the transaction on the broker.
        log.warning(
            "transaction failed; aborting it and going back to the last commit",
            transactional_id=self.transactional_id,
            error=repr(cause),
        )
        try:
            await self.restart()
        except FencedError:
            raise
        except (KafkaError, OSError) as exc:
            self._broken = True
            log.error("cannot restart the transactional producer", error=repr(exc))
