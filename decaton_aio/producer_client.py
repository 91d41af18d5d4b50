"""The aiokafka producer behind the durable sender: starting it, stopping it, reading its errors.

:class:`~decaton_aio.durable.DurableSender` and its :class:`~decaton_aio.replay.Replayer`
share one ``acks=all`` client. This module starts it (:func:`start_client`, telling an
unreachable cluster apart from a refused producer), stops it without hanging on a broker
that is gone (:func:`stop_client`), and sorts the client's errors: the cluster's fault, so
the record can be spooled and sent later (:func:`is_spoolable`); the record's own fault, so
sending it again can never work (:data:`RECORD_ERRORS`); or an error the caller gets
(:func:`producer_error`).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Final

from aiokafka import AIOKafkaProducer
from aiokafka.errors import (
    CorruptRecordException,
    InvalidTimestampError,
    InvalidTopicError,
    KafkaError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    RecordTooLargeError,
    UnknownError,
)

from decaton_aio.errors import ProducerError

if TYPE_CHECKING:
    from decaton_aio.producer import ProducerConfig

__all__ = [
    "IDEMPOTENCE_HINT",
    "RECORD_ERRORS",
    "UnreachableError",
    "is_spoolable",
    "producer_error",
    "start_client",
    "stop_client",
]

IDEMPOTENCE_HINT: Final = (
    "the broker refused an idempotent producer (InitProducerId failed). The embedded "
    "broker (Tansu) does not support aiokafka's idempotent producer: "
    "set ProducerConfig(idempotence=False), or pass --no-idempotence on the command line"
)

RECORD_ERRORS: Final = (
    CorruptRecordException,
    InvalidTimestampError,
    InvalidTopicError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    RecordTooLargeError,
)
"""Errors about the record itself: sending it again can never work, so a spooled record
failing with one is moved to the ``.rejected`` file instead of blocking the replay."""


class UnreachableError(ProducerError):
    """No broker answered: the sender can start in spooling mode."""


def is_spoolable(exc: BaseException) -> bool:
    """Whether the client gave up on a record for the cluster's sake, not the record's."""
    # The client's own retries are over and the cause is the cluster, not the record.
    if isinstance(exc, KafkaTimeoutError):
        return True
    return isinstance(exc, KafkaError) and bool(exc.retriable)


def producer_error(exc: BaseException, topic: str, *, idempotence: bool) -> ProducerError:
    """The error to give a caller whose record for ``topic`` the client did not take."""
    if isinstance(exc, UnknownError) and idempotence:
        return ProducerError(IDEMPOTENCE_HINT)
    if isinstance(exc, ProducerError):
        return exc
    return ProducerError(f"the broker did not take a record for {topic}: {exc!r}")


async def start_client(config: ProducerConfig, client_id: str) -> Any:
    """Start an ``acks=all`` client for ``config``.

    Returns:
        The started ``AIOKafkaProducer`` (typed ``Any``: aiokafka ships no types).

    Raises:
        UnreachableError: no broker answered.
        ProducerError: the cluster refused the producer (e.g. idempotence unsupported).
    """
    client = AIOKafkaProducer(
        bootstrap_servers=config.bootstrap_servers,
        acks="all",
        enable_idempotence=config.idempotence,
        linger_ms=config.linger_ms,
        max_batch_size=config.max_batch_bytes,
        request_timeout_ms=config.request_timeout_ms,
        client_id=client_id,
    )
    try:
        await client.start()
    except asyncio.CancelledError:
        # stop() while connecting in the background: close what was opened.
        await client.stop()
        raise
    except UnknownError as exc:
        await client.stop()
        if config.idempotence:
            raise ProducerError(IDEMPOTENCE_HINT) from exc
        raise ProducerError(f"the producer could not start: {exc!r}") from exc
    except KafkaError as exc:
        await client.stop()
        raise UnreachableError(
            f"cannot reach the cluster at {config.bootstrap_servers}: {exc}"
        ) from exc
    return client


async def stop_client(client: Any, *, grace_s: float) -> None:
    """Flush and stop a client; after ``grace_s`` its unsent records are failed on purpose.

    Call it once every record the sender was asked to send is settled.
    """
    # Every record we were asked to send is settled by now, so what the client still
    # holds is either a copy already spooled or a replay send that stays in the spool.
    # An idempotent client never expires a batch and would wait forever for a broker
    # that is gone: after a grace period its leftovers are failed on purpose.
    try:
        await asyncio.wait_for(client.flush(), grace_s)
    except TimeoutError:
        accumulator = getattr(client, "_message_accumulator", None)
        if accumulator is not None:
            accumulator.fail_all(KafkaTimeoutError("the producer is stopping"))
    await client.stop()
