"""The aiokafka producer behind the durable sender: starting it, stopping it, reading its errors.

[`DurableSender`][decaton_aio.DurableSender] and its `Replayer`
share one ``acks=all`` client. This module starts it (`start_client()`, telling an
unreachable cluster apart from a refused producer and an authorization failure, and
turning idempotence off, logged once, where the cluster refuses it and the settings leave
it to the cluster), stops it without hanging on a broker
that is gone (`stop_client()`), and sorts the client's errors: the cluster's fault, so
the record can be spooled and sent later (`is_spoolable()`); the record's own fault, so
sending it again can never work (`RECORD_ERRORS`); a topic the cluster does not have
(`missing_topic()`); or an error the caller gets (`producer_error()`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Final

import structlog
from aiokafka import AIOKafkaProducer
from aiokafka.errors import (
    AuthenticationFailedError,
    ClusterAuthorizationFailedError,
    CorruptRecordException,
    GroupAuthorizationFailedError,
    InvalidTimestampError,
    InvalidTopicError,
    KafkaError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    RecordListTooLargeError,
    RecordTooLargeError,
    SaslAuthenticationFailed,
    TopicAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
    UnknownError,
    UnknownTopicOrPartitionError,
)

from decaton_aio._aiokafka import (
    DefaultRecordBatchBuilder,
    check_version,
    fail_unsent,
    is_idempotent,
)
from decaton_aio._connect import diagnose
from decaton_aio.errors import (
    AccessDeniedError,
    MissingTopicError,
    ProducerError,
    RecordRejectedError,
)

if TYPE_CHECKING:
    from decaton_aio.producer._config import ProducerConfig

__all__ = [
    "ACCESS_ERRORS",
    "IDEMPOTENCE_HINT",
    "MAX_REQUEST_SIZE",
    "RECORD_ERRORS",
    "UnreachableError",
    "is_idempotent",
    "is_spoolable",
    "missing_topic",
    "oversized",
    "producer_error",
    "start_client",
    "stop_client",
]

log = structlog.get_logger("decaton_aio.producer")

IDEMPOTENCE_HINT: Final = (
    "the cluster refused an idempotent producer (InitProducerId failed: Tansu does not "
    "support aiokafka's, and a secured cluster may not grant IdempotentWrite): leave "
    "ProducerConfig(idempotence='auto') to fall back to a plain producer, or set "
    "idempotence=False (--idempotence off)"
)

ACCESS_ERRORS: Final = (
    AuthenticationFailedError,
    SaslAuthenticationFailed,
    ClusterAuthorizationFailedError,
    TopicAuthorizationFailedError,
    GroupAuthorizationFailedError,
    TransactionalIdAuthorizationFailed,
)
"""The cluster answered and said no: wrong credentials or a missing ACL. Never spooled
(sending again cannot help until someone changes the cluster) and never reported as an
unreachable cluster."""

MAX_REQUEST_SIZE: Final = 1_048_576
"""The client's ``max_request_size`` (aiokafka's default, set explicitly): a record
larger than this is never sent."""

# Clusters already warned about falling back to a plain producer: one warning per
# process, not one per reconnect.
_WARNED_NO_IDEMPOTENCE: set[str] = set()


class _InitProducerIdRefused(logging.Filter):
    """Drops aiokafka's error line for an InitProducerId the broker answered with
    UnknownError (Tansu): `start_client()` reports that refusal itself, once, at the
    level it deserves, or raises it with what to do."""

    def filter(self, record: logging.LogRecord) -> bool:
        refused = str(record.msg).startswith("Unexpected error during InitProducerIdRequest")
        return not (refused and isinstance(record.args, tuple) and UnknownError in record.args)


logging.getLogger("aiokafka.producer.sender").addFilter(_InitProducerIdRefused())

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


def access_denied(exc: BaseException, what: str) -> AccessDeniedError:
    """The error for an authentication or authorization failure while doing ``what``."""
    if isinstance(exc, AuthenticationFailedError | SaslAuthenticationFailed):
        reason = "authentication failed: check the SASL mechanism, user name and password"
    else:
        reason = (
            f"not authorized ({type(exc).__name__}): grant this principal the ACL it needs "
            "(WRITE on the topic, IdempotentWrite on the cluster for an idempotent producer)"
        )
    return AccessDeniedError(f"{what}: {reason}")


def is_spoolable(exc: BaseException) -> bool:
    """Whether the client gave up on a record for the cluster's sake, not the record's."""
    # The client's own retries are over and the cause is the cluster, not the record.
    if isinstance(exc, KafkaTimeoutError):
        return True
    if isinstance(exc, ACCESS_ERRORS):
        return False
    return isinstance(exc, KafkaError) and bool(exc.retriable)


def oversized(
    topic: str, key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]]
) -> RecordRejectedError | None:
    """The error for a record larger than the client ever sends (what the client checks
    when it takes a record), so a record is not spooled only to be refused at replay."""
    size = DefaultRecordBatchBuilder.estimate_size_in_bytes(key, value, headers)
    if size <= MAX_REQUEST_SIZE:
        return None
    return RecordRejectedError(
        f"the broker can never take this record for {topic}: {size} bytes with its "
        f"headers, over the producer's limit of {MAX_REQUEST_SIZE} bytes; store the "
        "payload elsewhere and send a reference to it"
    )


async def missing_topic(client: Any, topic: str, exc: BaseException) -> MissingTopicError | None:
    """The error for a record the client did not take because ``topic`` does not exist.

    aiokafka gives up waiting for a topic's metadata with the same error whether the
    cluster is away or answers without the topic. A cluster that does not create topics on
    first use answers without it for good: the record is then neither spooled nor does it
    hold up a spool's replay. One metadata request tells the two apart; ``None`` when
    ``exc`` is another error, or the cluster does not answer or has the topic now.
    """
    if not isinstance(exc, UnknownTopicOrPartitionError):
        return None
    try:
        metadata = await client.client.fetch_all_metadata()
    except (TimeoutError, KafkaError, OSError):
        return None
    if topic in metadata.topics(exclude_internal_topics=False):
        return None
    return MissingTopicError(
        f"the cluster has no topic {topic!r} (or this principal may not describe it) and "
        "does not create topics on first use: create the topic or correct its name"
    )


def producer_error(exc: BaseException, topic: str, *, idempotence: bool) -> ProducerError:
    """The error to give a caller whose record for ``topic`` the client did not take."""
    if isinstance(exc, UnknownError) and idempotence:
        return ProducerError(IDEMPOTENCE_HINT)
    if isinstance(exc, ProducerError):
        return exc
    if isinstance(exc, RECORD_ERRORS):
        return RecordRejectedError(f"the broker can never take this record for {topic}: {exc!r}")
    if isinstance(exc, ACCESS_ERRORS):
        return access_denied(exc, f"the cluster did not take a record for {topic}")
    return ProducerError(f"the broker did not take a record for {topic}: {exc!r}")


async def start_client(config: ProducerConfig, client_id: str) -> Any:
    """Start an ``acks=all`` client for ``config``.

    With ``idempotence="auto"`` the client is idempotent where the cluster grants it; where
    the cluster refuses (Tansu, or no IdempotentWrite permission) a plain client is
    started instead, logged once per cluster and process: at debug level where the broker
    does not support it (Tansu), as a warning where a permission is missing.

    Returns:
        The started ``AIOKafkaProducer`` (typed ``Any``: aiokafka ships no types).

    Raises:
        UnreachableError: no broker answered.
        SecurityError: TLS or SASL failed (an untrusted certificate, a wrong password).
        AccessDeniedError: the cluster refused the credentials or permissions.
        ProducerError: the cluster refused the producer (``idempotence=True`` where it is
            not supported).
    """
    if config.idempotence != "auto":
        return await _start(config, client_id, idempotent=bool(config.idempotence))
    try:
        return await _start(config, client_id, idempotent=True)
    except _IdempotenceRefused as refused:
        if config.bootstrap_servers not in _WARNED_NO_IDEMPOTENCE:
            _WARNED_NO_IDEMPOTENCE.add(config.bootstrap_servers)
            # A broker without aiokafka's InitProducerId (Tansu) answers UnknownError:
            # what "auto" is for, and nothing the user can change, so not a warning. A
            # missing IdempotentWrite permission is: an operator can grant it.
            unsupported = isinstance(refused.__cause__, UnknownError)
            (log.debug if unsupported else log.warning)(
                "the cluster refused an idempotent producer; producing without idempotence "
                "(a client retry can write a record twice); set idempotence=True to require it",
                cluster=config.bootstrap_servers,
                reason=repr(refused.__cause__),
            )
        return await _start(config, client_id, idempotent=False)


class _IdempotenceRefused(ProducerError):
    """InitProducerId failed: the cluster will not run an idempotent producer for us."""


async def _start(config: ProducerConfig, client_id: str, *, idempotent: bool) -> Any:
    check_version()
    client = AIOKafkaProducer(
        bootstrap_servers=config.bootstrap_servers,
        acks="all",
        enable_idempotence=idempotent,
        compression_type=config.compression_type,
        linger_ms=config.linger_ms,
        max_batch_size=config.max_batch_bytes,
        max_request_size=MAX_REQUEST_SIZE,
        request_timeout_ms=config.request_timeout_ms,
        client_id=client_id,
        **config.security.client_kwargs(),
    )
    try:
        await client.start()
    except asyncio.CancelledError:
        # stop() while connecting in the background: close what was opened.
        await client.stop()
        raise
    except (UnknownError, ClusterAuthorizationFailedError) as exc:
        await client.stop()
        if idempotent:
            raise _IdempotenceRefused(IDEMPOTENCE_HINT) from exc
        if isinstance(exc, ClusterAuthorizationFailedError):
            raise access_denied(exc, "the producer could not start") from exc
        raise ProducerError(f"the producer could not start: {exc!r}") from exc
    except ACCESS_ERRORS as exc:
        await client.stop()
        raise access_denied(exc, "the producer could not start") from exc
    except KafkaError as exc:
        await client.stop()
        # Not "unreachable" when TLS or SASL is the cause: a spooling sender would retry
        # a wrong password forever.
        problem = await diagnose(config.bootstrap_servers, config.security)
        if problem is not None:
            raise problem from exc
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
        async with asyncio.timeout(grace_s):
            await client.flush()
    except TimeoutError:
        fail_unsent(client, KafkaTimeoutError("the producer is stopping"))
    await client.stop()
