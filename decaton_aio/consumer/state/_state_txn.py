"""State changes under exactly-once: in the subscription's transaction, with the task's
completion.

With ``Application(exactly_once=True)`` the store's writer is a
`TransactionalChangelog`. A task's change is sent to the changelog (key, value or
tombstone, partition = the task's partition number) by the subscription's transactional
producer, and in the same step inside the transaction's delivery the task's outputs are sent
and its offset completes. So a transaction holds a task's change exactly when it covers
the task: a commit makes both visible, an abort (after which the partition goes back to
their last commit and the task runs again) drops both.

Until the transaction commits the change waits in the local copy's overlay (see
``_overlay``): the key's next task reads it; the commit applies it to the copy with its
changelog offset, so the copy's checkpoint only ever covers committed changes; an abort
or a stop discards it.

A task whose completion is deferred, or that asks for a retry, completes later than its
change is sent: its change commits with the transaction it was sent in (as without
exactly-once, where the change is durable before the completion).

Caller: the subscription's event loop (the executor, per task with a change).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import structlog

from decaton_aio.backoff import send_retry_delay
from decaton_aio.consumer._contract import TaskHost
from decaton_aio.consumer.commit import Transaction
from decaton_aio.consumer.state._overlay import Overlay, Staged
from decaton_aio.consumer.state._store import LocalStore
from decaton_aio.context import ProcessingContext
from decaton_aio.state import KeyState

__all__ = ["TransactionalChangelog"]

log = structlog.get_logger("decaton_aio.state")


class _Pending:
    """The changes the transaction holds for one local copy: their owner in the copy's
    overlay, and the transaction's listener."""

    def __init__(self, store: LocalStore) -> None:
        self.store = store
        if store.overlay is None:
            store.overlay = Overlay()
        self.overlay: Overlay = store.overlay

    def stage(self, key: bytes, value: bytes | None, sent: asyncio.Future[Any]) -> None:
        staged = self.overlay.stage(self, key, value)
        if sent.done():
            _offset_of(staged, sent)
        else:
            sent.add_done_callback(lambda future: _offset_of(staged, future))

    def committed(self) -> None:
        changes = self.overlay.take(self)
        if not self.store.closed:
            self.store.apply_committed(changes)

    def dropped(self) -> None:
        dropped = self.overlay.discard(self)
        if dropped:
            log.info("state changes of an aborted transaction discarded", changes=dropped)


def _offset_of(staged: Staged, future: asyncio.Future[Any]) -> None:
    if not future.cancelled() and future.exception() is None:
        staged.offset = int(future.result().offset)


class TransactionalChangelog:
    """Writes tasks' state changes into the subscription's transaction.

    Args:
        topic: the store's changelog topic.
    """

    def __init__(self, topic: str) -> None:
        self.topic = topic

    async def write_task(
        self, partition: TaskHost, ctx: ProcessingContext, state: KeyState, then: Callable[[], None]
    ) -> None:
        """Send the task's change (and its outputs, when it completes now) in the open
        transaction, then call ``then()`` (which completes the task) inside the same delivery.
        Tried again with backoff while the partition is open; a closed partition gives up
        (its next owner, or its rewound self, processes the record again)."""
        txn = partition.outputs
        assert isinstance(txn, Transaction), "exactly-once gives the partitions one"
        outputs = None
        if ctx.completion is None and ctx.retry_delay_s is None:
            outputs, ctx.outputs = ctx.outputs, None  # they go out with the change
        store, key, value = state.store, state.key, state.encoded_change()
        assert isinstance(store, LocalStore), "a task's state reads the runtime's copy"
        attempt = 0
        while not partition.closed:
            async with txn.delivery():
                if partition.closed or store.closed:
                    return
                try:
                    number = partition.tp.partition
                    sent = await txn.send(self.topic, value, key=key, partition=number)
                    _pending(txn, store).stage(key, value, sent)
                    for out in outputs or ():
                        await txn.send(out.topic, out.value, key=out.key, headers=out.headers)
                except Exception as exc:
                    failure: Exception | None = exc
                else:
                    then()  # completes the task while no commit can come between
                    return
            attempt += 1
            delay = send_retry_delay(attempt)
            log.error(
                "cannot put the state change into the transaction; the task stays pending",
                topic=self.topic,
                partition=partition.tp.partition,
                error=repr(failure),
                retry_in_s=round(delay, 3),
            )
            await asyncio.sleep(delay)


def _pending(txn: Transaction, store: LocalStore) -> _Pending:
    # The transaction's listener for this copy (a copy closed since is forgotten).
    found = None
    for listener in list(txn.listeners):
        if isinstance(listener, _Pending):
            if listener.store is store:
                found = listener
            elif listener.store.closed:
                txn.listeners.remove(listener)
    if found is None:
        found = _Pending(store)
        txn.listeners.append(found)
    return found
