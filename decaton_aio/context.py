"""The processing context: what a processor knows about the task it is running.

One [`ProcessingContext`][decaton_aio.ProcessingContext] is made per task and handed to
``process(ctx, task)``. It carries the record's coordinates, the task metadata and a
structlog logger bound with topic, partition, offset, key and subscription id (Decaton's
MDC), built only when used.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, NamedTuple, Protocol

import structlog
from aiokafka import TopicPartition

from decaton_aio._context import TaskFields
from decaton_aio.backoff import checked_retry_delay
from decaton_aio.completion import Completion
from decaton_aio.errors import ConfigError
from decaton_aio.metadata import TaskMetadata, metadata_from_headers
from decaton_aio.metrics import PartitionStats
from decaton_aio.state import KeyState, LocalCopy

__all__ = ["OutputRecord", "ProcessingContext", "TaskFunction", "TaskSource"]

#: A processor: ``async def process(ctx, task)``.
TaskFunction = Callable[["ProcessingContext", Any], Coroutine[Any, Any, Any]]


class TaskSource(Protocol):
    """What a context reads of the partition its task came from (the runtime's partition
    processor, or a wrapper of it, which forwards all of this)."""

    tp: TopicPartition
    stats: PartitionStats

    @property
    def store(self) -> LocalCopy | None:
        """The local copy of the partition's state (``ctx.state``); ``None``: the
        application has no state store."""
        ...

    @property
    def store_type(self) -> Any:
        """The type ``ctx.state.get`` decodes values as (``None``: plain values)."""
        ...

    @property
    def closed(self) -> bool:
        """Whether the assignment ended (completions are ignored from then on)."""
        ...


def _noop() -> None:
    return None


class OutputRecord(NamedTuple):
    """A record a processor produced with
    [`ProcessingContext.produce()`][decaton_aio.ProcessingContext.produce] (or a retry, dead
    letter or shaping record joining a transaction: ``value`` ``None`` for a tombstone)."""

    topic: str
    value: bytes | None
    key: bytes | None
    headers: list[tuple[str, bytes]]


class ProcessingContext(TaskFields):
    """The record behind a task, and the tools a processor uses while running it.

    Args:
        subscription_id: the subscription processing the task.
        partition: the assignment of the partition the record was fetched from.
        record: the fetched record.
        attempt: which run of the task this is (in-place retries run it again).

    Attributes:
        subscription_id: the subscription processing the task.
        record: the Kafka record the task came from (offset, timestamp, key, value,
            headers; see [`Record`][decaton_aio.typing.Record]).
        attempt: 1 for the first run; in-place retries count up.
        completion: the deferred completion, once the processor asked for one with
            [`deferred()`][decaton_aio.ProcessingContext.deferred] (``None`` before).
        key_state: the key's state once [`state`][decaton_aio.ProcessingContext.state] was
            read, changed or not (``None`` before;
            [`state_change`][decaton_aio.ProcessingContext.state_change] says whether it
            changed).
        outputs: the records [`produce()`][decaton_aio.ProcessingContext.produce] collected,
            ``None`` while there are none.
        retry_delay_s: the retry [`retry()`][decaton_aio.ProcessingContext.retry] asked for
            (``-1.0``: the policy's backoff), ``None`` when none was.
        started_at: when the task started (``time.perf_counter()``), set by the runtime.
    """

    # The fields and the constructor are TaskFields' (compiled with the hot path).
    __slots__ = ()
    _partition: TaskSource
    #: The records `produce()` collected, ``None`` while there are none.
    outputs: list[OutputRecord] | None

    @property
    def state(self) -> KeyState:
        """The state of the task's key (``get``, ``set``, ``delete``), kept in the
        application's state store.

        Raises:
            ConfigError: the application names no state store, or the record has no key.
        """
        state = self.key_state
        if state is None:
            partition = self._partition
            store = partition.store
            if store is None:
                raise ConfigError(
                    "ctx.state needs a state store: pass Application(state=StateStoreConfig(...))"
                )
            key = self.record.key
            if key is None:
                raise ConfigError("ctx.state: the record has no key, so it has no state")
            state = self.key_state = KeyState(store, key, partition.store_type)
        return state

    @property
    def state_change(self) -> KeyState | None:
        """The key state if the task changed it (the runtime writes it), else ``None``."""
        state = self.key_state
        return state if state is not None and state.changed else None

    @property
    def stats(self) -> PartitionStats:
        """The counters of the task's partition (processor wrappers add to them)."""
        return self._partition.stats

    @property
    def assignment_ended(self) -> bool:
        """Whether the assignment of the partition this task came from has ended: the
        partition was revoked, or its processing started over (after a failed
        exactly-once transaction, or a fetch position that went back). The task's
        completion, outputs and retries are then ignored, and its record is delivered
        again to the partition's next assignment; a long task may stop early."""
        return self._partition.closed

    def retry(self, delay_s: float | None = None) -> None:
        """Ask for this task to be retried once the processor returns.

        With queue retries the task goes to ``<topic>-retry`` and this offset completes
        once the broker has the retry; with in-place retries it runs again in its key
        lane. After the policy's last attempt it goes to the dead letter topic. Raising
        [`RetryTask`][decaton_aio.RetryTask] does the same.

        Args:
            delay_s: wait this long before the retry (at most a year); the policy's
                backoff when omitted.

        Raises:
            ConfigError: ``delay_s`` is not finite or over a year.
        """
        delay_s = checked_retry_delay(delay_s, "ctx.retry")
        self.retry_delay_s = -1.0 if delay_s is None else delay_s

    def deferred(self) -> Completion:
        """Complete this task later: returns the same [`Completion`][decaton_aio.Completion]
        on every call.

        The processor may return at once; the offset completes when
        ``completion.complete()`` is called (from any coroutine, callback or thread).
        """
        if self.completion is None:
            self.completion = Completion(_noop, asyncio.get_running_loop())
        return self.completion

    async def produce(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] | None = None,
    ) -> None:
        """Produce an output record of this task.

        Outputs are held until the task succeeds (the processor returns, or its deferred
        completion completes) and are dropped if it fails, is retried or is skipped, so a
        failed attempt never leaves outputs behind. Then they are sent in order and the
        task's offset completes only once they are in Kafka: at-least-once, or with
        ``Application(exactly_once=True)`` in the same transaction as the offset, so a
        read_committed consumer sees each output exactly once.

        Raises:
            ConfigError: the topic is empty, or the value, key or headers are not bytes.
        """
        if not isinstance(topic, str) or not topic:
            raise ConfigError(f"ctx.produce needs a topic name, got {topic!r}")
        if not isinstance(value, bytes):
            raise ConfigError(
                f"ctx.produce takes bytes values, got {type(value).__name__}: encode it first"
            )
        if key is not None and not isinstance(key, bytes):
            raise ConfigError(f"ctx.produce takes a bytes key, got {type(key).__name__}")
        pairs = list(headers or ())
        for pair in pairs:
            if (
                not isinstance(pair, tuple)
                or len(pair) != 2
                or not isinstance(pair[0], str)
                or not isinstance(pair[1], bytes)
            ):
                raise ConfigError(f"ctx.produce headers are (str, bytes) pairs, got {pair!r}")
        if self.outputs is None:
            self.outputs = []
        self.outputs.append(OutputRecord(topic, value, key, pairs))

    def take_outputs(self) -> list[OutputRecord]:
        """Hand the collected outputs over (to the runtime, which delivers them): returns
        them and leaves none collected."""
        outputs, self.outputs = self.outputs or [], None
        return outputs

    @property
    def key(self) -> bytes | None:
        """The record key (``None`` for a record without one)."""
        return self.record.key

    @property
    def topic(self) -> str:
        """The topic the task came from."""
        topic: str = self._partition.tp.topic
        return topic

    @property
    def partition(self) -> int:
        """The partition the task came from."""
        partition: int = self._partition.tp.partition
        return partition

    @property
    def offset(self) -> int:
        """The record's offset in its partition."""
        return self.record.offset

    @property
    def timestamp(self) -> int:
        """The record timestamp (epoch milliseconds)."""
        return self.record.timestamp

    @property
    def headers(self) -> Sequence[tuple[str, bytes]]:
        """The record headers, ``dt_meta`` included."""
        return self.record.headers

    @property
    def metadata(self) -> TaskMetadata:
        """The task metadata from ``dt_meta``, or from the record timestamp without it.

        Raises:
            DecodeError: when the ``dt_meta`` header is malformed.
        """
        if self._metadata is None:
            self._metadata = metadata_from_headers(self.record.headers, self.record.timestamp)
        return self._metadata

    @property
    def logger(self) -> structlog.typing.FilteringBoundLogger:
        """A structlog logger bound with topic, partition, offset, key and subscription."""
        if self._logger is None:
            key = self.record.key
            self._logger = structlog.get_logger("decaton_aio.task").bind(
                subscription=self.subscription_id,
                topic=self.topic,
                partition=self.partition,
                offset=self.record.offset,
                key=key.decode(errors="replace") if key is not None else None,
            )
        return self._logger

    def __repr__(self) -> str:
        return (
            f"ProcessingContext({self.subscription_id!r}, {self.topic}-"
            f"{self.partition}@{self.record.offset}, key={self.record.key!r})"
        )
