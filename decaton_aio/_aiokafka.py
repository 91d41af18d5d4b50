"""The one seam to aiokafka's internals: every name of aiokafka outside its documented API.

aiokafka documents its clients (``AIOKafkaConsumer``, ``AIOKafkaProducer``, the admin
client), ``TopicPartition`` and the other structs, the errors, the rebalance listener and
``create_ssl_context``; the rest of the project imports only those from aiokafka. What the
runtime needs beyond them lives here and nowhere else: the connection factory, the wire
protocol's base classes and types (to speak request versions aiokafka does not), the record
batch reader and builder (the C implementation when aiokafka was built with it), the group
assignors, and a named function for each private attribute of an aiokafka object the
runtime reads or sets, with what it reads and why.

Each of those may change in any aiokafka release. They were checked against the versions in
`CHECKED_VERSIONS`; `check_version()` logs a warning, once, when a client starts
on another one. A test lists every aiokafka name the project uses and fails on a private
one outside this module.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any, Final

import aiokafka
import structlog
from aiokafka.client import AIOKafkaClient, ConnectionGroup, CoordinationType
from aiokafka.cluster import ClusterMetadata
from aiokafka.conn import create_conn
from aiokafka.consumer.fetcher import PartitionRecords
from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from aiokafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)
from aiokafka.producer.sender import TxnOffsetCommitHandler
from aiokafka.producer.transaction_manager import TransactionManager, TransactionState
from aiokafka.protocol import (
    admin as protocol_admin,
)
from aiokafka.protocol import (
    commit as protocol_commit,
)
from aiokafka.protocol import (
    coordination as protocol_coordination,
)
from aiokafka.protocol import (
    fetch as protocol_fetch,
)
from aiokafka.protocol import (
    group as protocol_group,
)
from aiokafka.protocol import (
    metadata as protocol_metadata,
)
from aiokafka.protocol import (
    offset as protocol_offset,
)
from aiokafka.protocol import (
    produce as protocol_produce,
)
from aiokafka.protocol import (
    transaction as protocol_transaction,
)
from aiokafka.protocol.abstract import AbstractType
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.metadata import MetadataRequest
from aiokafka.protocol.types import (
    Array,
    Boolean,
    Bytes,
    CompactArray,
    CompactBytes,
    CompactString,
    Int8,
    Int16,
    Int32,
    Int64,
    Schema,
    String,
    TaggedFields,
    UnsignedVarInt32,
    VarInt32,
    VarInt64,
)
from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from aiokafka.record.legacy_records import LegacyRecordBatch
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import TopicPartition
from aiokafka.util import NO_EXTENSIONS

__all__ = [
    "CHECKED_VERSIONS",
    "C_RECORDS",
    "AIOKafkaClient",
    "AbstractPartitionAssignor",
    "AbstractType",
    "Array",
    "Boolean",
    "Bytes",
    "ClusterMetadata",
    "CompactArray",
    "CompactBytes",
    "CompactString",
    "ConnectionGroup",
    "ConsumerProtocolMemberAssignment",
    "ConsumerProtocolMemberMetadata",
    "CoordinationType",
    "DefaultRecordBatch",
    "DefaultRecordBatchBuilder",
    "Int8",
    "Int16",
    "Int32",
    "Int64",
    "LegacyRecordBatch",
    "MemoryRecords",
    "MetadataRequest",
    "MetadataSync",
    "OffsetCommitHandler",
    "PartitionRecords",
    "RangePartitionAssignor",
    "Request",
    "RequestStruct",
    "Response",
    "RoundRobinPartitionAssignor",
    "Schema",
    "StickyPartitionAssignor",
    "String",
    "TaggedFields",
    "TransactionManager",
    "TransactionState",
    "UnsignedVarInt32",
    "VarInt32",
    "VarInt64",
    "check_version",
    "client_of",
    "close_consumer_parts",
    "connections_of",
    "coordinator_of",
    "coordinator_tasks",
    "create_conn",
    "fail_unsent",
    "fetch_pacing",
    "fetch_positions",
    "find_coordinator",
    "follow_cluster",
    "group_member",
    "install_record_hook",
    "is_idempotent",
    "mark_coordinator_dead",
    "protocol_admin",
    "protocol_commit",
    "protocol_coordination",
    "protocol_fetch",
    "protocol_group",
    "protocol_metadata",
    "protocol_offset",
    "protocol_produce",
    "protocol_transaction",
    "replace_txn_offset_commit",
    "sender_of",
    "sender_running",
    "set_fetch_pacing",
    "transaction_waiter",
    "txn_manager",
]

log = structlog.get_logger("decaton_aio.aiokafka")

#: The aiokafka releases this module was read against (pyproject pins ``>=0.14,<0.15``).
CHECKED_VERSIONS: Final = ("0.14.0",)

#: Whether aiokafka's C record batch reader and builder are in use (not its pure Python).
C_RECORDS: Final = not NO_EXTENSIONS


@functools.cache
def check_version() -> bool:
    """Whether the installed aiokafka is one of `CHECKED_VERSIONS`; a warning is
    logged (once per process) when it is not."""
    installed = str(aiokafka.__version__)
    if installed in CHECKED_VERSIONS:
        return True
    log.warning(
        "this aiokafka version was not checked against the internals decaton-aio uses; "
        "install one of the checked versions if clients misbehave",
        installed=installed,
        checked=list(CHECKED_VERSIONS),
    )
    return False


# ------------------------------------------------------------------------ clients


def client_of(owner: Any) -> AIOKafkaClient:
    """The `AIOKafkaClient` under a consumer or admin client (its ``_client``): the
    runtime asks it for metadata (all topics, or now) and sends requests of its own."""
    client: AIOKafkaClient = owner._client
    return client


def connections_of(client: AIOKafkaClient) -> list[Any]:
    """The client's connections (``_conns``), to see that a close closed them all."""
    return list(client._conns.values())


def coordinator_of(consumer: Any) -> Any:
    """The consumer's group coordinator (``_coordinator``), None without a group."""
    return getattr(consumer, "_coordinator", None)


def coordinator_tasks(consumer: Any) -> list[asyncio.Task[Any]]:
    """The routines of the consumer's group coordinator that are started
    (``_coordination_task``, ``_heartbeat_task``, ``_commit_refresh_task``)."""
    coordinator = coordinator_of(consumer)
    if coordinator is None:
        return []
    tasks = (
        coordinator._coordination_task,
        coordinator._heartbeat_task,
        coordinator._commit_refresh_task,
    )
    return [task for task in tasks if task is not None]


async def close_consumer_parts(consumer: Any) -> None:
    """Close a consumer's parts without its ``stop()``: cancel its group coordinator's
    routines (`coordinator_tasks()`), close its ``_fetcher`` and its client. For a stop
    that hung in group coordination: its own stop would never reach them."""
    for task in coordinator_tasks(consumer):
        task.cancel()
    if consumer._fetcher is not None:
        await consumer._fetcher.close()
    await consumer._client.close()


# ------------------------------------------------------------------- group member


def group_member(consumer: Any) -> tuple[int, str, str | None] | None:
    """The consumer's ``(generation, member id, group instance id)`` as its group
    coordinator (``_coordinator``, its ``_group_instance_id``) holds them now; None for a
    consumer without one. A transaction's offsets carry them so a zombie cannot commit."""
    coordinator = coordinator_of(consumer)
    if coordinator is None:
        return None
    return (
        int(coordinator.generation),
        str(coordinator.member_id or ""),
        getattr(coordinator, "_group_instance_id", None),
    )


# ------------------------------------------------------------------------- fetcher


def follow_cluster(
    cluster: ClusterMetadata, listener: Callable[[ClusterMetadata], None]
) -> Callable[[], None]:
    """Call ``listener(cluster)`` after each metadata update of a client's ``cluster``
    (its listeners: ``client.cluster`` is documented, its listeners are not); returns
    the call that stops it (it discards from ``_listeners``: ``remove_listener`` raises
    for a listener already gone)."""
    cluster.add_listener(listener)
    return lambda: cluster._listeners.discard(listener)


def fetch_positions(consumer: Any) -> dict[TopicPartition, int]:
    """The position (the next offset ``getmany`` hands out) of each partition assigned to
    the consumer that has one (its ``_subscription``'s partition states): what a new
    ``assign()``, which starts every partition afresh, must seek back to."""
    subscription = consumer._subscription.subscription
    assignment = None if subscription is None else subscription.assignment
    if assignment is None:
        return {}
    positions = {}
    for tp in assignment.tps:
        state = assignment.state_value(tp)
        if state is not None and state.has_valid_position:
            positions[tp] = int(state.position)
    return positions


# The fetcher's attributes each fetch request is built from.
_FETCH_SETTINGS: Final = ("_fetch_min_bytes", "_fetch_max_wait_ms")


def fetch_pacing(consumer: Any) -> tuple[int, int] | None:
    """The ``(min_bytes, max_wait_ms)`` the consumer's next fetch request asks with (its
    ``_fetcher``'s ``_fetch_min_bytes`` and ``_fetch_max_wait_ms``); None when its
    fetcher has not these settings."""
    fetcher = getattr(consumer, "_fetcher", None)
    if fetcher is None or not all(hasattr(fetcher, name) for name in _FETCH_SETTINGS):
        return None
    return (fetcher._fetch_min_bytes, fetcher._fetch_max_wait_ms)


def set_fetch_pacing(consumer: Any, min_bytes: int, max_wait_ms: int) -> None:
    """Set what the consumer's next fetch requests ask with (see `fetch_pacing()`):
    aiokafka reads them from its fetcher at each request and has no setter."""
    fetcher = consumer._fetcher
    fetcher._fetch_min_bytes = min_bytes
    fetcher._fetch_max_wait_ms = max_wait_ms


def install_record_hook(raw: object) -> bool:
    """Make the fetcher hand out the record batch reader's records as they are, without a
    ``ConsumerRecord``, to consumers whose key deserializer is ``raw``; idempotent.

    It wraps ``PartitionRecords._consumer_record`` (reading the ``_key_deserializer`` it
    was given): the runtime builds its own record from the reader's, and one object per
    record fewer matters on the hot path.

    Returns:
        Whether the hook is in place (``False``: this aiokafka builds records another way).
    """
    build = getattr(PartitionRecords, "_consumer_record", None)
    if build is None:  # pragma: no cover - aiokafka changed its record building
        log.warning("aiokafka's fetcher has changed; consuming ConsumerRecord objects")
        return False
    if getattr(build, "__wrapped__", None) is not None:
        return True  # installed already

    def consumer_record(self: Any, tp: Any, record: Any) -> Any:
        if self._key_deserializer is raw:
            return record
        return build(self, tp, record)

    consumer_record.__wrapped__ = build  # type: ignore[attr-defined]
    PartitionRecords._consumer_record = consumer_record
    return True


# ------------------------------------------------------------------------ producer


def txn_manager(producer: Any) -> Any:
    """The transaction manager of a producer or of its sender (``_txn_manager``); None for
    a producer that is not idempotent."""
    return getattr(producer, "_txn_manager", None)


def is_idempotent(producer: Any) -> bool:
    """Whether a started producer produces idempotently: aiokafka keeps no public flag,
    and its transaction manager exists only then."""
    return txn_manager(producer) is not None


def sender_of(producer: Any) -> Any:
    """The producer's sender (``_sender``), which commits a transaction's offsets."""
    return producer._sender


def sender_running(producer: Any) -> bool:
    """Whether the producer's sender routine (``_sender.sender_task``) still runs."""
    return not producer._sender.sender_task.done()


def transaction_waiter(producer: Any) -> asyncio.Future[Any] | None:
    """The future of the producer's current transaction (``_txn_manager``'s
    ``_transaction_waiter``): it holds the error that ended a transaction."""
    waiter: asyncio.Future[Any] | None = producer._txn_manager._transaction_waiter
    return waiter


def fail_unsent(producer: Any, error: BaseException) -> bool:
    """Fail every record the producer still holds (its ``_message_accumulator``) with
    ``error``; whether it could. An idempotent producer never expires a batch, so a stop
    with the cluster gone would otherwise wait forever."""
    accumulator = getattr(producer, "_message_accumulator", None)
    if accumulator is None:
        return False
    accumulator.fail_all(error)
    return True


async def find_coordinator(sender: Any, kind: CoordinationType, key: str) -> int:
    """The node id of the coordinator of ``key`` (``_find_coordinator`` of the sender)."""
    node_id: int = await sender._find_coordinator(kind, key)
    return node_id


def mark_coordinator_dead(sender: Any, kind: CoordinationType) -> None:
    """Have the sender look its ``kind`` coordinator up again (``_coordinator_dead``)."""
    sender._coordinator_dead(kind)


def replace_txn_offset_commit(producer: Any, commit: Callable[[Any, str], Any]) -> None:
    """Make the producer's sender commit a transaction's offsets with ``commit(offsets,
    group_id)`` (a coroutine function) instead of its own ``_do_txn_offset_commit``."""
    producer._sender._do_txn_offset_commit = commit


class OffsetCommitHandler(TxnOffsetCommitHandler):  # type: ignore[misc]
    """aiokafka's handler of a transaction's offset commit, its state named: subclasses
    change the request and the reading of its response."""

    @property
    def sender(self) -> Any:
        """The producer's sender (``_sender``)."""
        return self._sender

    @property
    def group_id(self) -> str:
        """The group whose offsets are committed (``_group_id``)."""
        return str(self._group_id)

    @property
    def offsets(self) -> dict[Any, Any]:
        """The offsets committed (``_offsets``)."""
        offsets: dict[Any, Any] = self._offsets
        return offsets

    @property
    def default_backoff(self) -> float:
        """How long to wait before asking again (``_default_backoff``, in seconds)."""
        return float(self._default_backoff)


# ------------------------------------------------------------ metadata synchronizer


class MetadataSync:
    """The metadata synchronizer of an `AIOKafkaClient`: its ``_md_synchronizer``
    routine (``_sync_task``), the update callers wait for (``_md_update_fut``) and the
    waiter that wakes the routine (``_md_update_waiter``).

    Group coordination waits for ``force_metadata_update()``, which only this routine
    resolves; `decaton_aio._connect.watch_metadata()` keeps it answering through it.

    Args:
        client: the client.
    """

    def __init__(self, client: AIOKafkaClient) -> None:
        self.client: Any = client

    @property
    def known(self) -> bool:
        """Whether this client has the synchronizer this class knows."""
        return hasattr(self.client, "_md_update_waiter")

    @property
    def request_timeout_ms(self) -> int:
        """The client's request timeout (``_request_timeout_ms``)."""
        return int(self.client._request_timeout_ms)

    @property
    def task(self) -> asyncio.Task[Any] | None:
        """The synchronizer's routine, None before the client starts it."""
        task: asyncio.Task[Any] | None = self.client._sync_task
        return task

    @property
    def update(self) -> asyncio.Future[Any] | None:
        """The metadata update callers wait for, None when none is asked for."""
        fut: asyncio.Future[Any] | None = self.client._md_update_fut
        return fut

    def wake(self) -> None:
        """Wake the routine (harmless while an update runs: it replaces the waiter)."""
        if not self.client._md_update_waiter.done():
            self.client._md_update_waiter.set_result(None)

    def park(self) -> None:
        """Give the routine a fresh waiter, as it does after an update on its own timer."""
        self.client._md_update_waiter = asyncio.get_running_loop().create_future()

    def start(self) -> asyncio.Task[Any]:
        """Start the routine again, forgetting the update it left (its waiters are
        resolved by the caller)."""
        self.client._md_update_fut = None
        task: asyncio.Task[Any] = asyncio.get_running_loop().create_task(
            self.client._md_synchronizer()
        )
        self.client._sync_task = task
        return task

    def set_topics_quietly(self, topics: set[str]) -> None:
        """Set the client's topics (``_topics``) without asking for an update: for tests."""
        self.client._topics = set(topics)

    def replace_update(self, update: Callable[[Any, Any], Any]) -> None:
        """Make the routine update with ``update(cluster, topics)`` (a coroutine function)
        instead of the client's ``_metadata_update``: a stand-in for tests."""
        self.client._metadata_update = update
