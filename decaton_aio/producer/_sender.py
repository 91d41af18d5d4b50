"""The durable sender: a record is answered only once it is durable.

[`DurableSender`][decaton_aio.DurableSender] owns the one aiokafka producer (``acks=all``)
behind the task producer and the runtime's retry, dead letter and shaping sends. A send is
answered when the record is durable:

- *delivered*: the broker acknowledged it; or
- *spooled*: the client gave up on it (its own retries ran out: a request or delivery
  timeout, a lost connection, no leader), and it was appended to the local spool
  (`decaton_aio.producer._spool`) and fsynced.

A record that cannot be spooled either (no ``spool_dir``, a disk error) or that the broker
refuses for good (too large, an idempotence failure) raises
[`ProducerError`][decaton_aio.errors.ProducerError].

Modes (`SenderMode`). ``DIRECT``: records go to the client. The first record the
client gives up on switches the sender to ``SPOOLING``: from then on every new record goes
straight to the spool, behind the ones already there. ``start()`` with no broker
reachable (and a spool) does not fail: it starts in ``SPOOLING`` and the replayer keeps
trying to connect. The replayer (`Replayer`) delivers spooled
records oldest first, in rounds, with exponential backoff and jitter between failed
rounds; when the spool is empty the sender switches back to ``DIRECT``. Starting, stopping
and reading the errors of the Kafka client live in `decaton_aio.producer._client`.

Order guarantees, per (topic, key):

- records sent one after another (each awaited, or submitted in order) while the sender is
  ``SPOOLING`` are spooled and replayed in that order;
- a record sent after the spool has a backlog never overtakes the backlog: it is spooled
  too, and the sender goes back to ``DIRECT`` only once the spool is empty and every
  replayed record was acknowledged;
- in a replay round, if a record of a key fails, later records of that key are kept in
  the spool even when they were acknowledged, and sent again after it: the last copy of
  each record arrives in spool order;
- not guaranteed: records already handed to the client when the first failure switched
  the sender to spooling. One of them may be acknowledged after an earlier one of the same
  key was spooled, so the spooled one arrives later. Records without a key have no order.

Delivery is at-least-once: a record the client delivers after the sender gave up on it
(``delivery_timeout_ms``) is in the spool too, and a crash between delivery and removal
from the spool replays the rest of a spool segment.

Caller: one event loop; nothing here is thread-safe.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import structlog
from aiokafka.errors import KafkaError

from decaton_aio.errors import ProducerError
from decaton_aio.producer._client import (
    UnreachableError,
    is_idempotent,
    is_spoolable,
    missing_topic,
    oversized,
    producer_error,
    start_client,
    stop_client,
)
from decaton_aio.producer._inflight import (
    InFlightRecords,
    PendingRecord,
    RecordLocation,
    Settlement,
)
from decaton_aio.producer._replay import Replayer
from decaton_aio.producer._spool import Spool

if TYPE_CHECKING:
    from decaton_aio.producer._config import ProducerConfig

__all__ = ["DurableSender", "RecordLocation", "SenderMode"]

log = structlog.get_logger("decaton_aio.producer")


class SenderMode(enum.Enum):
    """Where new records go."""

    DIRECT = "direct"
    """To the Kafka client; the spool is empty."""
    SPOOLING = "spooling"
    """To the spool, behind a backlog the replayer is delivering."""


class DurableSender:
    """Sends raw records and answers once each one is delivered or spooled.

    ```python
    sender = DurableSender(ProducerConfig("kafka:9092", spool_dir="/var/spool/app"))
    async with sender:
        result = await sender.send("orders", b"...", key=b"user-1", headers=[])
        if result.spooled:
            ...  # durable on local disk; the replayer delivers it later
    ```

    Without ``config.spool_dir`` it is a plain ``acks=all`` sender: a record the client
    gives up on raises [`ProducerError`][decaton_aio.errors.ProducerError], and
    [`start()`][decaton_aio.DurableSender.start] fails when no broker answers.

    Args:
        config: connection, batching, timeout and spool settings.
        client_id: the Kafka client id; ``decaton-aio-producer-<application_id>`` if omitted.
    """

    def __init__(self, config: ProducerConfig, *, client_id: str | None = None) -> None:
        self.config = config
        self._client_id = client_id or f"decaton-aio-producer-{config.application_id}"
        self._spool = Spool(config.spool_dir) if config.spool_dir is not None else None
        self._settlement = Settlement()
        self._replayer = (
            Replayer(
                self._spool,
                config,
                self._settlement,
                delivery_timeout_s=config.effective_delivery_timeout_ms / 1000,
                ensure_client=self._ensure_client,
                on_drained=self._leave_spooling,
            )
            if self._spool is not None
            else None
        )
        self._client: Any = None  # AIOKafkaProducer; aiokafka ships no types
        self._started = False
        self._mode = SenderMode.DIRECT
        self._direct = asyncio.Event()  # set while DIRECT, for wait_drained()
        self._direct.set()
        self._inflight = InFlightRecords(
            config.effective_delivery_timeout_ms,
            on_delivered=self._settlement.resolve,
            on_give_up=self._give_up,
        )

    # -------------------------------------------------------------------- properties

    @property
    def mode(self) -> SenderMode:
        """Where new records go right now."""
        return self._mode

    @property
    def spool_dir(self) -> Path | None:
        """The spool directory, or ``None`` when the sender has no spool."""
        return self._spool.directory if self._spool is not None else None

    @property
    def idempotent(self) -> bool:
        """Whether the connected client is an idempotent producer (``False`` while none is
        connected): with ``idempotence="auto"`` it tells what the cluster granted."""
        return self._client is not None and is_idempotent(self._client)

    @property
    def spool_size(self) -> int:
        """How many records wait in the spool (0 without one); for metrics."""
        return self._spool.size if self._spool is not None else 0

    # --------------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Open the spool and connect; start the replayer.

        With a spool, an unreachable cluster is not an error: the sender starts in
        spooling mode and connects in the background. A spool left by an earlier run is
        replayed before new records are sent directly.

        Raises:
            ProducerError: without a spool, when the cluster cannot be reached; always,
                when the cluster refuses the producer (e.g. idempotence unsupported) or
                the spool directory cannot be opened.
            ConfigError: another producer uses the spool directory.
        """
        if self._started:
            return
        spool = self._spool
        if spool is not None:
            await spool.open()
        try:
            self._client = await start_client(self.config, self._client_id)
        except UnreachableError as exc:
            if spool is None:
                raise
            log.warning(
                "no broker reachable at start; spooling records until one answers",
                bootstrap_servers=self.config.bootstrap_servers,
                spool_dir=str(spool.directory),
                error=str(exc),
            )
            self._enter_spooling()
        except BaseException:
            if spool is not None:
                await spool.close()
            raise
        if spool is not None and not spool.is_empty():
            self._enter_spooling()
        self._started = True
        self._inflight.start_expiry()
        if self._replayer is not None:
            self._replayer.start()

    async def stop(self) -> None:
        """Settle every record handed over, then disconnect and close the spool.

        Each record submitted before ``stop`` is delivered, spooled (when the cluster does
        not take it within ``delivery_timeout_ms``) or failed before this returns. The
        spool keeps its backlog for the next start.
        """
        if not self._started:
            return
        self._started = False
        if self._replayer is not None:
            await self._replayer.stop()
        await self._settlement.wait()
        await self._inflight.stop_expiry()
        client, self._client = self._client, None
        if client is not None:
            await stop_client(client, grace_s=self.config.request_timeout_ms / 1000)
        if self._spool is not None:
            await self._spool.close()

    async def __aenter__(self) -> DurableSender:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # ------------------------------------------------------------------------- sends

    async def submit(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> asyncio.Future[RecordLocation]:
        """Hand a record over and return a future of how it became durable.

        Awaiting this call waits only for room in the client's buffer (or nothing, while
        spooling); awaiting the future waits for durability. Records submitted one after
        another keep their order per key (see the module docstring). The record is made
        durable even if the future is cancelled or dropped.

        Args:
            topic: the destination topic.
            value: the record value; ``None`` for a tombstone (then ``key`` is required).
            key: the record key; it picks the partition when ``partition`` is ``None``.
            headers: ``(name, value)`` pairs.
            partition: an explicit partition.
            timestamp_ms: the record timestamp; now when omitted (kept on replay).

        Returns:
            A future resolving to a [`RecordLocation`][decaton_aio.RecordLocation]; it fails with
            [`ProducerError`][decaton_aio.errors.ProducerError] when the record is neither
            delivered nor spooled.

        Raises:
            ProducerError: the sender is not started, the record has neither key nor
                value, or (without a spool) the client refused it at once.
        """
        if not self._started:
            raise ProducerError("the producer is not started: use 'async with' or start()")
        item = PendingRecord.new(
            topic, value, key=key, headers=headers, partition=partition, timestamp_ms=timestamp_ms
        )
        self._settlement.add()
        client = self._client
        if self._mode is SenderMode.SPOOLING or client is None:
            # What the client would refuse at once is refused now, not at replay.
            too_large = oversized(topic, key, value, item.headers)
            if too_large is not None:
                self._settlement.settle_one()
                raise too_large
            self._spool_item(item)
            return item.result
        try:
            sent = await client.send(
                topic,
                value,
                key=key,
                partition=partition,
                timestamp_ms=item.timestamp_ms,
                headers=item.headers,
            )
        except KafkaError as exc:
            # No metadata or no buffer space within request_timeout_ms: the client gave
            # up before it even took the record.
            try:
                missing = await missing_topic(client, topic, exc)
            except BaseException:  # cancelled while asking: the record was never taken
                self._settlement.settle_one()
                raise
            if missing is not None:
                self._settlement.settle_one()
                raise missing from exc
            if self._spool is not None and is_spoolable(exc):
                self._enter_spooling(exc)
                self._spool_item(item)
                return item.result
            self._settlement.settle_one()
            raise producer_error(exc, topic, idempotence=self.config.idempotence is True) from exc
        except BaseException:
            # Cancelled while waiting for buffer space: the record was never taken.
            self._settlement.settle_one()
            raise
        self._inflight.add(item, sent)
        return item.result

    async def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> RecordLocation:
        """Send a record and wait until it is durable (acknowledged or spooled).

        Arguments as [`submit()`][decaton_aio.DurableSender.submit].

        Returns:
            Where it landed, or where it was spooled (`RecordLocation.spooled`).

        Raises:
            ProducerError: when the record could be neither delivered nor spooled.
        """
        sent = await self.submit(
            topic,
            value,
            key=key,
            headers=headers,
            partition=partition,
            timestamp_ms=timestamp_ms,
        )
        return await sent

    async def flush(self) -> None:
        """Wait until every record submitted so far is delivered, spooled or failed.

        It does not wait for the spool's backlog; see
        [`wait_drained()`][decaton_aio.DurableSender.wait_drained].
        """
        await self._settlement.wait()

    async def wait_drained(self, timeout_s: float | None = None) -> None:
        """Wait until everything submitted so far is delivered, the spool included.

        Args:
            timeout_s: give up after this long; ``None`` waits as long as it takes.

        Raises:
            TimeoutError: the backlog was not delivered in time.
        """
        async with asyncio.timeout(timeout_s):
            while True:
                await self._settlement.wait()
                await self._direct.wait()
                if self._settlement.settled:
                    return

    # ------------------------------------------------------------ settling (callbacks)

    def _give_up(self, item: PendingRecord, error: BaseException) -> None:
        """The client will not deliver ``item``: spool it, or fail its caller."""
        # The spool stays open until stop() has seen every record settled, so this is
        # safe while stopping too.
        if self._spool is not None and is_spoolable(error):
            self._enter_spooling(error)
            self._spool_item(item)
        else:
            failure = producer_error(error, item.topic, idempotence=self.config.idempotence is True)
            self._settlement.fail(item, failure, error)

    def _spool_item(self, item: PendingRecord) -> None:
        if self._replayer is None:
            self._settlement.fail(
                item,
                ProducerError(f"cannot deliver to {item.topic}: no broker and no spool"),
                None,
            )
            return
        self._replayer.spool_record(item)

    def _enter_spooling(self, reason: BaseException | None = None) -> None:
        if self._spool is None:
            return
        if self._mode is SenderMode.DIRECT:
            self._mode = SenderMode.SPOOLING
            self._direct.clear()
            if reason is not None:
                log.warning(
                    "the cluster does not take records; spooling them until it is back",
                    spool_dir=str(self._spool.directory),
                    error=repr(reason),
                )
        if self._replayer is not None:
            self._replayer.wake()

    # ------------------------------------------------------------------------ replay

    async def _ensure_client(self) -> Any:
        """The connected client; connects first when there is none (for the replayer)."""
        if self._client is None:
            self._client = await start_client(self.config, self._client_id)
            log.info("connected; replaying the spool", spool_size=self.spool_size)
        return self._client

    def _leave_spooling(self) -> None:
        """The replayer found the spool empty: new records go to the client again."""
        self._mode = SenderMode.DIRECT
        self._direct.set()
        log.info("the spool is delivered; sending directly again")
