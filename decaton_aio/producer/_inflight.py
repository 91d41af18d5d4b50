"""Records the durable sender holds until they are answered, and how they are answered.

A record handed to [`DurableSender`][decaton_aio.DurableSender] is a `PendingRecord`
until its caller's future is answered: with a [`RecordLocation`][decaton_aio.RecordLocation]
once it is delivered or spooled, or with an error. `Settlement` counts the records not
answered yet (for ``flush()`` and ``stop()``) and answers them. `InFlightRecords` tracks the
records the Kafka client holds, oldest first: an acknowledgement answers one, a failure or
``delivery_timeout_ms`` without an answer hands it back to the sender to spool or fail.

Caller: one event loop; nothing here is thread-safe.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

import structlog
from aiokafka.errors import KafkaTimeoutError

from decaton_aio.errors import ProducerError

__all__ = ["InFlightRecords", "PendingRecord", "RecordLocation", "Settlement"]

log = structlog.get_logger("decaton_aio.producer")

_BYTES_TYPES: Final = (bytes, bytearray, memoryview, type(None))


@dataclass(frozen=True, slots=True)
class RecordLocation:
    """Where a record landed, or that it waits in the spool.

    The result of [`send()`][decaton_aio.DurableSender.send] and of ``TaskProducer.put``.

    Attributes:
        topic: the record's topic.
        partition: the partition; for a spooled record the requested one, or -1 when the
            key picks it at replay.
        offset: the offset; -1 for a spooled record.
        spooled: True when the broker did not take the record and it was appended to the
            local spool (fsynced); the replayer delivers it later.
        spool_id: the spool entry id of a spooled record (the ``id`` of its spool line).
        spool_path: the spool segment file that held it when it was spooled.
    """

    topic: str
    partition: int
    offset: int
    spooled: bool = False
    spool_id: str | None = None
    spool_path: str | None = None


@dataclass(slots=True, eq=False)
class PendingRecord:
    """A record handed to the client, kept until it is acknowledged or spooled."""

    topic: str
    value: bytes | None
    key: bytes | None
    headers: list[tuple[str, bytes]]
    partition: int | None
    timestamp_ms: int
    result: asyncio.Future[RecordLocation]
    deadline: float

    @classmethod
    def new(
        cls,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None,
        headers: Iterable[tuple[str, bytes]],
        partition: int | None,
        timestamp_ms: int | None,
    ) -> PendingRecord:
        """Check a record handed to the sender and make it pending, with a fresh future.

        Arguments as [`DurableSender.submit`][decaton_aio.DurableSender.submit].

        Raises:
            ProducerError: the record has neither key nor value.
            TypeError: the key or the value is neither bytes nor ``None``.
        """
        if value is None and key is None:
            raise ProducerError("a record needs a key or a value")
        # Checked here, not by the client: a spooled record of the wrong type would only
        # fail at replay, long after its caller was told it is durable.
        if not isinstance(value, _BYTES_TYPES) or not isinstance(key, _BYTES_TYPES):
            raise TypeError(
                f"key and value must be bytes or None, not {type(key).__name__} and "
                f"{type(value).__name__}"
            )
        if timestamp_ms is None:
            timestamp_ms = _now_ms()
        result: asyncio.Future[RecordLocation] = asyncio.get_running_loop().create_future()
        return cls(topic, value, key, list(headers), partition, timestamp_ms, result, 0.0)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _retrieve(future: asyncio.Future[Any]) -> None:
    # Reads the outcome of a future nobody awaits, so asyncio does not log it as lost.
    if not future.cancelled():
        future.exception()


class Settlement:
    """Counts the records handed over and not answered yet, and answers them.

    Each record is counted once with `add()` and settled once: answered with
    `resolve()` or `fail()`, or with `settle_one()` when its caller got an
    exception instead of a future.
    """

    def __init__(self) -> None:
        self._unsettled = 0  # submitted and not yet delivered, spooled or failed
        self._settled = asyncio.Event()
        self._settled.set()

    @property
    def settled(self) -> bool:
        """Whether every record counted so far was answered."""
        return self._settled.is_set()

    async def wait(self) -> None:
        """Wait until every record counted so far was answered."""
        await self._settled.wait()

    def add(self) -> None:
        """Count a record handed over."""
        self._unsettled += 1
        self._settled.clear()

    def resolve(self, record: PendingRecord, value: RecordLocation) -> None:
        """Answer a record's caller with where it landed."""
        if not record.result.done():
            record.result.set_result(value)
        self.settle_one()

    def fail(
        self, record: PendingRecord, error: ProducerError, cause: BaseException | None
    ) -> None:
        """Answer a record's caller with ``error``, caused by ``cause``."""
        if cause is not None:
            error.__cause__ = cause
        if not record.result.done():
            record.result.set_exception(error)
            record.result.add_done_callback(_retrieve)
        self.settle_one()

    def settle_one(self) -> None:
        """Count a record as answered."""
        self._unsettled -= 1
        if self._unsettled == 0:
            self._settled.set()


class InFlightRecords:
    """The records the client holds, oldest first, until acknowledged or given up on.

    Args:
        delivery_timeout_ms: how long the client may hold a record before it is given up.
        on_delivered: called with a record and where it landed once it is acknowledged.
        on_give_up: called with a record and the error once the client failed it, or it
            was not acknowledged within ``delivery_timeout_ms``.
    """

    def __init__(
        self,
        delivery_timeout_ms: int,
        *,
        on_delivered: Callable[[PendingRecord, RecordLocation], None],
        on_give_up: Callable[[PendingRecord, BaseException], None],
    ) -> None:
        self._delivery_timeout_ms = delivery_timeout_ms
        self._delivery_timeout_s = delivery_timeout_ms / 1000
        self._on_delivered = on_delivered
        self._on_give_up = on_give_up
        # Records handed to the client, oldest first; deadlines grow with insertion, so
        # the expiry routine only ever looks at the first one.
        self._records: dict[int, PendingRecord] = {}
        self._added = asyncio.Event()
        self._next_id = 0
        self._expiry_task: asyncio.Task[None] | None = None

    def add(self, record: PendingRecord, sent: asyncio.Future[Any]) -> None:
        """Track a record the client took; ``sent`` is the client's delivery future."""
        record.deadline = asyncio.get_running_loop().time() + self._delivery_timeout_s
        number, self._next_id = self._next_id, self._next_id + 1
        if not self._records:
            self._added.set()
        self._records[number] = record
        sent.add_done_callback(functools.partial(self._on_client_done, number))

    def _on_client_done(self, number: int, sent: asyncio.Future[Any]) -> None:
        item = self._records.pop(number, None)
        error: BaseException | None
        if sent.cancelled():
            error = KafkaTimeoutError("the send was cancelled by the client")
        else:
            error = sent.exception()
        if item is None:
            # Given up on after delivery_timeout_ms: it is in the spool (or its caller
            # got an error). A late success is a duplicate of the spooled copy.
            if error is None:
                log.debug("a record was delivered after its delivery timeout (duplicate)")
            return
        if error is None:
            meta = sent.result()
            self._on_delivered(item, RecordLocation(meta.topic, meta.partition, meta.offset))
        else:
            self._on_give_up(item, error)

    # ------------------------------------------------------------------------ expiry

    def start_expiry(self) -> None:
        """Start the routine that gives up on records held too long."""
        self._expiry_task = asyncio.get_running_loop().create_task(self._expiry_routine())

    async def stop_expiry(self) -> None:
        """Cancel the expiry routine and wait for it to end."""
        task, self._expiry_task = self._expiry_task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _expiry_routine(self) -> None:
        """Give up on records the client holds longer than ``delivery_timeout_ms``.

        A non-idempotent client expires its batches itself; an idempotent one retries
        forever, and without this a put would hang for as long as the broker is away.
        """
        loop = asyncio.get_running_loop()
        while True:
            if not self._records:
                self._added.clear()
                await self._added.wait()
                continue
            number, item = next(iter(self._records.items()))
            delay = item.deadline - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
                continue
            del self._records[number]
            self._on_give_up(
                item,
                KafkaTimeoutError(
                    f"not acknowledged within delivery_timeout_ms={self._delivery_timeout_ms}"
                ),
            )
