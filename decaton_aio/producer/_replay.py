"""The spool side of the durable sender: records go into the spool and are replayed from it.

`Replayer` owns what a [`DurableSender`][decaton_aio.DurableSender] with a spool does
with it. It appends the records the cluster does not take and answers their callers once
the line is fsynced (`Replayer.spool_record()`). Its background routine, woken when a
record is spooled, gets a connected client from the sender (connecting if the sender has
none yet) and delivers the spool (`decaton_aio.producer._spool`) in rounds of up to
`REPLAY_BATCH` records: it sends them, waits up to the delivery timeout for their
acknowledgements, and removes the acknowledged ones. Failed rounds are followed by
exponential backoff with jitter (``replay_backoff_ms`` up to ``replay_backoff_max_ms``).
Once a round finds the spool empty, it tells the sender, which switches back to sending
directly.

Per-key hold-back: in a round, if a record of a (topic, key) fails, later records of that
key are kept in the spool even when they were acknowledged, and sent again after it: the
last copy of each record arrives in spool order. Records without a key have no order.

A record the broker refuses for good (`RECORD_ERRORS`,
or a partition the topic no longer has) is moved to the segment's ``.rejected`` file
instead of blocking the replay.

Caller: one event loop; nothing here is thread-safe.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

import structlog
from aiokafka.errors import KafkaError, KafkaTimeoutError

from decaton_aio.backoff import compute_backoff
from decaton_aio.errors import MissingTopicError, ProducerError
from decaton_aio.producer._client import RECORD_ERRORS, missing_topic
from decaton_aio.producer._inflight import PendingRecord, RecordLocation, Settlement
from decaton_aio.producer._spool import Spool, SpoolEntry

if TYPE_CHECKING:
    from pathlib import Path

    from decaton_aio.producer._config import ProducerConfig

__all__ = ["REPLAY_BATCH", "Replayer"]

log = structlog.get_logger("decaton_aio.producer")

REPLAY_BATCH: Final = 1000
"""How many spooled records one replay round sends before it waits for their acks."""


def _retrieve(future: asyncio.Future[Any]) -> None:
    # Reads the outcome of a future nobody awaits, so asyncio does not log it as lost.
    if not future.cancelled():
        future.exception()


def _outcome(future: asyncio.Future[Any]) -> BaseException | None:
    """The error of a client send, ``None`` when acknowledged; not done counts as failed."""
    error: BaseException | None
    if not future.done():
        error = KafkaTimeoutError("not acknowledged within the delivery timeout")
    elif future.cancelled():
        error = KafkaTimeoutError("the send was cancelled by the client")
    else:
        error = future.exception()
    return error


class Replayer:
    """Spools records, delivers the spool's backlog in the background, reports it drained.

    Args:
        spool: the sender's spool (opened by the sender).
        config: the sender's settings; the replay backoff is read from it.
        settlement: answers the callers of spooled records.
        delivery_timeout_s: how long a round waits for the acknowledgements of its sends.
        ensure_client: returns the sender's connected client, connecting first when it has
            none; raises when the cluster cannot be reached.
        on_drained: called once a round found the spool empty, with no await between the
            check and the call, so no send can slip in between.
    """

    def __init__(
        self,
        spool: Spool,
        config: ProducerConfig,
        settlement: Settlement,
        *,
        delivery_timeout_s: float,
        ensure_client: Callable[[], Awaitable[Any]],
        on_drained: Callable[[], None],
    ) -> None:
        self._spool = spool
        self._config = config
        self._settlement = settlement
        self._delivery_timeout_s = delivery_timeout_s
        self._ensure_client = ensure_client
        self._on_drained = on_drained
        self._backlog = asyncio.Event()  # set while the replayer has work
        self._task: asyncio.Task[None] | None = None

    def spool_record(self, item: PendingRecord) -> None:
        """Append a record to the spool; its caller is answered once the line is fsynced."""
        entry = SpoolEntry.new(
            item.topic,
            item.value,
            key=item.key,
            headers=item.headers,
            partition=item.partition,
            timestamp_ms=item.timestamp_ms,
        )
        try:
            written = self._spool.append_nowait(entry)
        except ProducerError as exc:
            self._settlement.fail(item, exc, None)
            return
        written.add_done_callback(functools.partial(self._on_spooled, item, entry))
        self._backlog.set()

    def _on_spooled(
        self, item: PendingRecord, entry: SpoolEntry, written: asyncio.Future[Path]
    ) -> None:
        error = None if written.cancelled() else written.exception()
        if written.cancelled() or error is not None:
            message = f"a record for {item.topic} could be neither delivered nor spooled"
            self._settlement.fail(item, ProducerError(f"{message}: {error!r}"), error)
            return
        partition = item.partition if item.partition is not None else -1
        where = str(written.result())
        self._settlement.resolve(
            item,
            RecordLocation(item.topic, partition, -1, True, entry.id, where),
        )

    def wake(self) -> None:
        """Tell the replayer the spool has records to deliver."""
        self._backlog.set()

    def start(self) -> None:
        """Start the replay routine."""
        self._task = asyncio.get_running_loop().create_task(self._replay_routine())

    async def stop(self) -> None:
        """Cancel the replay routine and wait for it to end; the spool keeps its backlog."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _replay_routine(self) -> None:
        """Deliver the spool's backlog, oldest first, then report the spool drained."""
        spool = self._spool
        cfg = self._config
        failures = 0
        while True:
            await self._backlog.wait()
            try:
                client = await self._ensure_client()
                delivered_all = await self._replay_round(spool, client)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # A replayer that died would let the spool grow forever with nobody told:
                # it logs, backs off and tries again; stop() ends it by cancelling.
                log.warning("spool replay failed", error=str(exc), spool_size=spool.size)
                delivered_all = False
            if not delivered_all:
                failures += 1
                await asyncio.sleep(
                    compute_backoff(
                        failures,
                        base_s=cfg.replay_backoff_ms / 1000,
                        factor=2.0,
                        max_s=cfg.replay_backoff_max_ms / 1000,
                        jitter=0.5,
                    )
                )
                continue
            failures = 0
            if spool.is_empty():
                # No await between the check and the switch: no send can slip in between.
                self._backlog.clear()
                self._on_drained()

    async def _replay_round(self, spool: Spool, client: Any) -> bool:
        """Send one batch of spooled records; True when every one was acknowledged."""
        entries = await spool.pending(REPLAY_BATCH)
        if not entries:
            await spool.wait_flushed()
            return True
        sent: list[tuple[SpoolEntry, asyncio.Future[Any]]] = []
        rejected: list[tuple[SpoolEntry, BaseException]] = []
        stopped: BaseException | None = None
        missing: dict[str, MissingTopicError] = {}
        for entry in entries:
            gone = missing.get(entry.topic)
            if gone is not None:
                rejected.append((entry, gone))
                continue
            try:
                future = await client.send(
                    entry.topic,
                    entry.value,
                    key=entry.key,
                    partition=entry.partition,
                    timestamp_ms=entry.timestamp_ms,
                    headers=list(entry.headers),
                )
            except KafkaError as exc:
                if isinstance(exc, RECORD_ERRORS):
                    rejected.append((entry, exc))
                    continue
                # A topic the cluster does not have would hold up every other topic's
                # records, round after round: its records are set aside too.
                gone = await missing_topic(client, entry.topic, exc)
                if gone is not None:
                    missing[entry.topic] = gone
                    rejected.append((entry, gone))
                    continue
                # No metadata within request_timeout_ms: the cluster is still away, and
                # every further send would wait as long.
                stopped = exc
                break
            except AssertionError as exc:
                # aiokafka asserts an explicit partition exists in the metadata it has
                # just fetched: the topic has fewer partitions now; retrying cannot help.
                rejected.append((entry, exc))
                continue
            # Read even when this round is cancelled or gives up on it, so a late failure
            # is not reported by asyncio as an exception nobody retrieved.
            future.add_done_callback(_retrieve)
            sent.append((entry, future))
        if sent:
            await asyncio.wait([f for _, f in sent], timeout=self._delivery_timeout_s)
        delivered: list[SpoolEntry] = []
        blocked: set[tuple[str, bytes]] = set()
        failure = stopped
        for entry, future in sent:
            error = _outcome(future)
            lane = (entry.topic, entry.key) if entry.key is not None else None
            if error is None:
                if lane is None or lane not in blocked:
                    delivered.append(entry)
            elif isinstance(error, RECORD_ERRORS):
                rejected.append((entry, error))
            else:
                failure = failure or error
                # The key's later records stay in the spool even when acknowledged, and
                # are sent again after this one: the last copies arrive in order.
                if lane is not None:
                    blocked.add(lane)
        await spool.remove(delivered)
        for entry, error in rejected:
            if not isinstance(error, MissingTopicError):
                log.error(
                    "the broker refused a spooled record for good; moved to the .rejected file",
                    topic=entry.topic,
                    spool_id=entry.id,
                    error=repr(error),
                )
            await spool.reject([entry], repr(error))
        for topic, error in missing.items():
            log.error(
                "spooled records for a topic the cluster does not have; moved to the "
                ".rejected file (docs/producer.md says how to deliver them once it exists)",
                topic=topic,
                records=sum(1 for entry, _ in rejected if entry.topic == topic),
                error=str(error),
            )
        if failure is not None:
            log.warning(
                "spool replay round incomplete; backing off",
                delivered=len(delivered),
                spool_size=spool.size,
                error=repr(failure),
            )
            return False
        return True
