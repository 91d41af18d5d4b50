"""Running one task and carrying out what its outcome means.

The `TaskExecutor` is shared by the partitions of a subscription. For a record
whose slot the partition granted, it decodes the metadata and body, waits for the task's
scheduled time (without holding the slot), runs ``process(ctx, task)`` eagerly, and then
carries out the outcome that ``consumer/_outcome.py`` decides (a task that returned with
nothing more to do finishes inline, without asking):

- returned: finish, or with ``ctx.deferred()`` free the slot and complete later;
- ``ctx.retry()`` / [`RetryTask`][decaton_aio.RetryTask] / a retriable exception
  with retries on: queue mode sends the task to the retry topic and completes the offset
  only once the retry is durable; in-place mode runs it again in its lane after the
  backoff; after the policy's last attempt, the dead letter topic;
- any other exception: with retries off, logged, counted and completed (Decaton's
  default); with retries on, non-retriable errors go to the dead letter topic;
- a body or header that cannot be decoded (a poison pill): the dead letter topic with the
  reason, counted as discarded.

A record without ``dt_meta`` is read as a pre-Decaton-9 ``DecatonTaskRequest`` while
``decaton.legacy.parse.fallback.enabled`` is on (``consumer/_legacy.py``).

A record is never finished before what replaces it (retry, dead letter, shaping record)
is durable: ``consumer/_side_records.py`` sends it, and finishes the record then.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from time import perf_counter, time
from types import FunctionType
from typing import Any, Final

import structlog
from mypy_extensions import mypyc_attr

from decaton_aio._context import TaskFields
from decaton_aio.backoff import RetryConfig, SkipTask
from decaton_aio.completion import DeferredTimeoutPolicy
from decaton_aio.consumer._contract import StateWriter, TaskHost
from decaton_aio.consumer._eager import CoroutineStarter
from decaton_aio.consumer._legacy import has_metadata_header, legacy_hint, unwrap
from decaton_aio.consumer._outcome import Action, Outcome, decide
from decaton_aio.consumer._records import scheduled_time_in, task_record
from decaton_aio.consumer._side_records import SideRecords
from decaton_aio.consumer.commit import DurableOutputs, deliver_outputs
from decaton_aio.context import ProcessingContext, TaskFunction
from decaton_aio.errors import DecodeError
from decaton_aio.logs import register_task_source
from decaton_aio.metadata import METADATA_HEADER, new_native_message, scheduled_time_of
from decaton_aio.properties import (
    DEFERRED_COMPLETE_TIMEOUT_MS,
    LEGACY_PARSE_FALLBACK_ENABLED,
    Properties,
)
from decaton_aio.retry import SideTopics, dead_letter_headers, retry_headers
from decaton_aio.serializers import unchecked_decode
from decaton_aio.state import KeyState
from decaton_aio.typing import Record, RecordSender

__all__ = ["META_RENEW_RECORDS", "TaskExecutor"]


log = structlog.get_logger("decaton_aio.consumer")

# What the per-record path calls, as module constants: compiled, a name imported from a
# Python module is looked up in this module's namespace at every use, a constant is not.
_CONTEXT: Final = ProcessingContext
_CLOCK: Final = time
_TIMER: Final = perf_counter
# Compiled, the runtime reads a dt_meta header of the plain shape itself, at a fraction of
# a protobuf parse; interpreted, that loop over bytes costs more than the parse.
_SCAN: Final = not isinstance(scheduled_time_in, FunctionType)

#: Records read into one reusable ``dt_meta`` message before a new one replaces it. The
#: protobuf runtime's C implementation keeps a parsed message's strings (the source
#: application and instance ids) in the message's arena, which only grows until the
#: message is dropped: about 30 bytes per record otherwise, without end.
META_RENEW_RECORDS: Final = 4096


@mypyc_attr(allow_interpreted_subclasses=True)  # the traced executor is one
class TaskExecutor:
    """Runs tasks for the partitions of one subscription.

    Args:
        subscription_id: bound into each task's logger.
        process: the user's processor.
        decode: turns a record value into a task; raises ``DecodeError``.
        sender: delivers retry, dead letter and shaping records; ``None`` only when the
            application needs none (then a record that would need one is logged and
            completed).
        properties: live properties (deferred completion timeout, legacy parse fallback).
        retry: the retry configuration, ``None`` for Decaton's default (log and go on).
        side_topics: names of the retry, dead letter and shaping topics.
        deferred_timeout_policy: what a timed-out deferred completion does.
        state_writer: writes tasks' ``ctx.state`` changes to the store's changelog
            before they complete (in the partition's transaction with exactly-once);
            ``None`` when the application has no state store.
    """

    def __init__(
        self,
        *,
        subscription_id: str,
        process: TaskFunction,
        decode: Callable[[bytes], Any],
        sender: RecordSender | None,
        properties: Properties,
        retry: RetryConfig | None = None,
        side_topics: SideTopics | None = None,
        deferred_timeout_policy: DeferredTimeoutPolicy = "give_up",
        state_writer: StateWriter | None = None,
    ) -> None:
        self._state_writer = state_writer
        self._subscription_id = subscription_id
        self._process = process
        self._decode = decode
        self._fast_decode = unchecked_decode(decode)
        self._deferred_timeout = properties[DEFERRED_COMPLETE_TIMEOUT_MS]
        self._legacy = properties[LEGACY_PARSE_FALLBACK_ENABLED]
        self._retry = retry
        self._topics = side_topics or SideTopics()
        self._deferred_policy = deferred_timeout_policy
        self._starter = CoroutineStarter()
        self._on_ended = self._ended  # bound once, not per task
        self._meta = new_native_message()  # the hot path's reusable dt_meta message
        self._meta_left = META_RENEW_RECORDS  # reads until it is renewed
        self._tasks = self._starter.tasks  # workers running processors, and sends
        self._outputs = DurableOutputs(sender) if sender is not None else None
        self._side = SideRecords(sender, self._topics)

    @property
    def parked_workers(self) -> int:
        """Idle workers parked now, waiting for a coroutine to run (asyncio tasks)."""
        return self._starter.parked

    # ---------------------------------------------------------------------- start

    def start(self, partition: TaskHost, record: Record, attempt: int) -> None:
        """Run run number ``attempt`` of a record whose slot ``partition`` granted; its
        outcome goes back to the partition through the contract's calls (now, or when the
        task ends). Never raises.
        """
        # The per-record hot path: keep attribute lookups and calls to a minimum.
        task_rec = task_record(record)  # the partition's own record: fields read natively
        ctx = _CONTEXT(self._subscription_id, partition, task_rec, attempt)
        # While it starts, log lines find the task here (decaton_aio.logs); a task that
        # started this one synchronously gets its own back after.
        starting = _STARTING
        outer = starting.ctx
        starting.ctx = ctx
        try:
            # The common case inline: dt_meta is the only header (the record keeps its
            # value alone), in the plain shape read without a parser, else read by the C
            # parser into a message reused for every record. Anything else (no parser,
            # other headers last, a malformed header) takes the general path, which raises
            # DecodeError with the reason.
            packed = task_rec.packed_headers
            raw: bytes | None = packed if type(packed) is bytes else None
            if raw is None:
                headers: Sequence[Any] = task_rec.headers  # Kafka allows a null header value
                raw = headers[-1][1] if headers and headers[-1][0] == METADATA_HEADER else None
            meta = self._meta
            try:
                plain = scheduled_time_in(raw) if _SCAN and raw is not None else None
                if plain is not None:
                    scheduled = plain
                elif raw is not None and meta is not None:
                    try:
                        meta.ParseFromString(raw)
                        scheduled = meta.scheduled_time_millis
                    except Exception:
                        scheduled = scheduled_time_of(task_rec.headers)
                    self._meta_left -= 1
                    if self._meta_left == 0:  # its arena only grows: start a new one
                        self._meta = new_native_message()
                        self._meta_left = META_RENEW_RECORDS
                else:
                    headers = task_rec.headers
                    if self._legacy.value and not has_metadata_header(headers):
                        task_rec = unwrap(task_rec)  # a pre-Decaton-9 record
                        ctx.record = task_rec
                        headers = task_rec.headers
                    scheduled = scheduled_time_of(headers)
                    raw = None
                    if headers and any(name == METADATA_HEADER for name, _ in headers):
                        raw = b""  # has one (in another shape): counted as a task with it
            except DecodeError as exc:
                self._poison_pill(partition, ctx, exc)
                return
            now = _CLOCK()
            if scheduled and scheduled > now * 1000:
                delay = scheduled / 1000 - now
                partition.stats.scheduling_delay.observe(delay)
                partition.run_again(task_rec, attempt, delay)
                return
            if attempt == 1:  # the format of each record, once, when it first runs
                stats = partition.stats
                if raw is None:
                    stats.without_metadata += 1
                else:
                    stats.with_metadata += 1
            try:
                value = task_rec.value
                if value is None:
                    raise DecodeError("body", "the record has no value (a tombstone)")
                try:
                    task = self._fast_decode(value)
                except Exception:
                    if self._fast_decode is self._decode:
                        raise
                    task = self._decode(value)  # raises the serializer's own DecodeError
            except DecodeError as exc:
                hint = legacy_hint(task_rec)
                if hint is not None:
                    exc = DecodeError("body", f"{exc.reason}; {hint}")
                self._poison_pill(partition, ctx, exc)
                return
            except Exception as exc:  # a serializer that raises something else: still a body
                reason = f"the serializer raised {type(exc).__name__}: {exc}"
                self._poison_pill(partition, ctx, DecodeError("body", reason))
                return
            stats = partition.stats
            stats.delivery_latency.observe(now - task_rec.timestamp * 0.001)
            fields: TaskFields = ctx
            fields.started_at = _TIMER()
            try:
                coro = self._process(ctx, task)
            except Exception as exc:  # a processor that is not a coroutine function
                self._ended(partition, ctx, exc)
                return
            if self._starter.start(coro, self._on_ended, partition, ctx):
                self._ended(partition, ctx, None)  # it returned at once
        finally:
            starting.ctx = outer

    def shape(self, partition: TaskHost, record: Record) -> None:
        """Send a hot key's record to the shaping topic; it completes once durable."""
        partition.hand_off(record)
        self._send_then_finish(
            partition,
            record,
            self._topics.shaping_topic(partition.tp.topic),
            list(record.headers),
            "shaping",
            timestamp_ms=record.timestamp,  # the same record, delayed: its time stays
        )

    # ------------------------------------------------------------------- outcomes

    def _ended(
        self,
        partition: TaskHost,
        ctx: ProcessingContext,
        exc: BaseException | None,
    ) -> None:
        # Every task whose processor ended (returned or raised, at once or after waiting)
        # comes here: count it, then finish, defer, retry or dead-letter it.
        fields: TaskFields = ctx  # its compiled base: fields read without a lookup
        stats = partition.stats
        took = _TIMER() - fields.started_at
        stats.processed += 1
        state = fields.key_state  # ctx.state_change without the property call
        if (
            exc is None
            and state is None
            and fields.completion is None
            and fields.retry_delay_s is None
            and fields.outputs is None
        ):
            stats.done_at_once.observe(took)  # its process and completion duration
            partition.finish(fields.record)  # the common case: done
            return
        if state is not None and state.changed:
            if exc is None:
                self._write_state(partition, ctx, state, took)
                return
            ctx.logger.info("the task raised: its state change is discarded")
        self._route(partition, ctx, exc, took)

    def _route(
        self,
        partition: TaskHost,
        ctx: ProcessingContext,
        exc: BaseException | None,
        took: float,
    ) -> None:
        # The outcome of a processor that ended (its state change, if any, is durable).
        stats = partition.stats
        record = ctx.record
        completion = ctx.completion
        retry_delay_s = ctx.retry_delay_s
        if exc is None and completion is None and retry_delay_s is None:
            if ctx.outputs is None:
                stats.done_at_once.observe(took)  # its process and completion duration
                partition.finish(record)  # the common case: done
            else:
                stats.process_duration.observe(took)
                partition.release(record)
                self._emit(partition, ctx)
            return
        stats.process_duration.observe(took)
        pending = False
        if completion is not None:
            if completion.retry_delay_s is not None:
                retry_delay_s = completion.retry_delay_s
            if exc is None and completion.failure is not None:
                exc = completion.failure
            pending = not completion.done
        outcome = self._decide(ctx, exc, retry_delay_s, pending, True)
        action = outcome.action
        if (action is Action.FINISH and outcome.why == "done") or action is Action.DEFER:
            if ctx.outputs is not None:
                partition.release(record)
                if action is Action.FINISH:
                    self._emit(partition, ctx)
                else:
                    self._defer(partition, ctx, released=True)
            elif action is Action.FINISH:
                self._finish(partition, ctx)
            else:
                self._defer(partition, ctx)
            return
        self._carry_out(partition, ctx, outcome, exc, released=False)

    def _retry_released(
        self,
        partition: TaskHost,
        ctx: ProcessingContext,
        delay_s: float | None,
        exc: BaseException | None,
    ) -> None:
        # A deferred task failed or asked for a retry after its processor returned: its
        # lane is gone, so it cannot run again in place.
        outcome = self._decide(ctx, exc, -1.0 if delay_s is None else delay_s, False, False)
        self._carry_out(partition, ctx, outcome, exc, released=True)

    def _decide(
        self,
        ctx: ProcessingContext,
        exc: BaseException | None,
        retry_delay_s: float | None,
        pending: bool,
        lane_held: bool,
    ) -> Outcome:
        retry = self._retry
        return decide(
            exc,
            retry_delay_s=retry_delay_s,
            pending=pending,
            retry=retry,
            # valid: the start checked the header
            retry_count=ctx.metadata.retry_count if retry is not None else 0,
            attempt=ctx.attempt,
            lane_held=lane_held,
        )

    def _carry_out(
        self,
        partition: TaskHost,
        ctx: ProcessingContext,
        outcome: Outcome,
        exc: BaseException | None,
        *,
        released: bool,
    ) -> None:
        # Every outcome but a plain finish or deferral: count it, log it, then finish,
        # retry or dead-letter the task (released: its slot and lane are free already).
        stats = partition.stats
        record = ctx.record
        if outcome.failed:
            stats.errors += 1
            what = "deferred task failed" if released else "processor failed"
            ctx.logger.error(what, error=_describe(exc), exc_info=exc)
            self._outcome(partition, "error", exc)
        action = outcome.action
        if action is Action.FINISH:
            if outcome.why == "skipped":
                stats.discarded += 1
                reason = exc.reason if isinstance(exc, SkipTask) else ""
                ctx.logger.info("task skipped", reason=reason)
                self._outcome(partition, "skipped")
            elif outcome.why == "cancelled":
                self._outcome(partition, "cancelled")
            if released:
                partition.finish_released(record)  # Decaton's default: log and go on
            else:
                self._finish(partition, ctx)
            return
        if action is Action.DEAD_LETTER:
            if outcome.error_type == "RetryNotConfigured":
                ctx.logger.warning("retry requested but the application has no retry config")
            if not released:
                partition.release(record)
            self._send_dead_letter(partition, ctx, outcome.error_type, outcome.message, exc)
            return
        stats.retries += 1
        self._outcome(partition, "retry")
        if action is Action.RETRY_IN_PLACE:
            partition.run_again(record, outcome.attempt + 1, outcome.delay_s)
            return
        if not released:
            partition.release(record)
        headers = retry_headers(
            record.headers,
            ctx.metadata,
            topic=partition.tp.topic,
            partition=partition.tp.partition,
            offset=record.offset,
            delay_s=outcome.delay_s,
        )
        self._send_then_finish(
            partition,
            record,
            self._topics.retry_topic(partition.tp.topic),
            headers,
            "retry",
            started_at=ctx.started_at,
        )

    def _finish(self, partition: TaskHost, ctx: ProcessingContext) -> None:
        # A task done after its processor returned, off the common path: finish it and
        # count its completion duration.
        partition.stats.completion_duration.observe(_TIMER() - ctx.started_at)
        partition.finish(ctx.record)

    def _defer(
        self, partition: TaskHost, ctx: ProcessingContext, *, released: bool = False
    ) -> None:
        completion = ctx.completion
        assert completion is not None
        record = ctx.record
        if not released:
            partition.release(record)
        timer: asyncio.TimerHandle | None = None

        def completed() -> None:
            if timer is not None:
                timer.cancel()
            partition.stats.completion_duration.observe(_TIMER() - ctx.started_at)
            if ctx.outputs is not None:  # produced after returning: they go out now
                self._emit(partition, ctx)
            else:
                partition.finish_released(record)

        def retry_later(delay_s: float | None, exc: BaseException | None) -> None:
            if timer is not None:
                timer.cancel()
            self._retry_released(partition, ctx, delay_s, exc)

        completion.attach(completed, retry_later)
        timeout_ms = self._deferred_timeout.value
        if timeout_ms < 0:
            return

        def timed_out() -> None:
            nonlocal timer
            if completion.done or partition.closed:
                return
            partition.stats.timeouts += 1
            self._outcome(partition, "timeout")
            ctx.logger.warning(
                "deferred completion timed out", timeout_ms=timeout_ms, policy=self._deferred_policy
            )
            if self._deferred_policy == "extend":
                timer = asyncio.get_running_loop().call_later(timeout_ms / 1000, timed_out)
                return
            if self._deferred_policy == "retry":
                completion.retry()
                return
            completion.attach(lambda: None)
            completion.complete()  # later calls by the processor are no-ops
            partition.stats.discarded += 1
            partition.finish_released(record)

        timer = asyncio.get_running_loop().call_later(timeout_ms / 1000, timed_out)

    def _emit(self, partition: TaskHost, ctx: ProcessingContext) -> None:
        # A released task's outputs: its offset completes once they are delivered.
        outputs = ctx.take_outputs()
        sink = partition.outputs or self._outputs
        if sink is None:
            log.error("no producer for the task's outputs: dropping them", count=len(outputs))
            partition.finish_released(ctx.record)
            return
        task = asyncio.get_running_loop().create_task(
            deliver_outputs(sink, partition, ctx.record, outputs)
        )
        self._starter.track(task)  # a delivery

    def _poison_pill(self, partition: TaskHost, ctx: ProcessingContext, exc: DecodeError) -> None:
        partition.stats.discarded += 1
        ctx.logger.warning(
            "task cannot be decoded: dead-lettering it", part=exc.part, reason=exc.reason
        )
        self._outcome(partition, "dead_letter", exc)
        partition.release(ctx.record)
        self._send_dead_letter(partition, ctx, f"DecodeError:{exc.part}", exc.reason, None)

    def _send_dead_letter(
        self,
        partition: TaskHost,
        ctx: ProcessingContext,
        error_type: str,
        message: str,
        exc: BaseException | None,
    ) -> None:
        # The record is already released: its offset completes once the dead letter is
        # durable.
        self._outcome(partition, "dead_letter")
        record = ctx.record
        try:
            attempts = ctx.metadata.retry_count + ctx.attempt
        except DecodeError:
            attempts = ctx.attempt
        headers = dead_letter_headers(
            record.headers,
            error_type=error_type,
            message=message,
            exc=exc,
            topic=partition.tp.topic,
            partition=partition.tp.partition,
            offset=record.offset,
            attempts=attempts,
            timestamp_ms=record.timestamp,
        )
        self._send_then_finish(
            partition,
            record,
            self._topics.dead_letter_topic(partition.tp.topic),
            headers,
            "dead letter",
            started_at=ctx.started_at or None,  # 0: a poison pill, never started
        )

    def _write_state(
        self, partition: TaskHost, ctx: ProcessingContext, state: KeyState, took: float
    ) -> None:
        # The task keeps its slot and lane until the changelog has its change (or the
        # partition's transaction, with its completion): the key's next task reads it,
        # and the offset cannot be committed without it.
        writer = self._state_writer
        if writer is None:
            ctx.logger.error("a state change without a state store is dropped")
            self._route(partition, ctx, None, took)
            return

        def route() -> None:
            self._route(partition, ctx, None, took)

        task = asyncio.get_running_loop().create_task(
            writer.write_task(partition, ctx, state, route)
        )
        self._starter.track(task)  # a changelog write

    def _outcome(self, partition: TaskHost, outcome: str, exc: BaseException | None = None) -> None:
        """How a task ended, when not simply done: ``error`` (with the exception),
        ``retry``, ``dead_letter``, ``skipped``, ``cancelled``, ``timeout``.

        Called off the common path only; nothing here. The traced executor records it on
        the task's span.
        """

    # ---------------------------------------------------------------------- sends

    def _send_then_finish(
        self,
        partition: TaskHost,
        record: Record,
        topic: str,
        headers: Sequence[tuple[str, bytes]],
        what: str,
        *,
        timestamp_ms: int | None = None,
        started_at: float | None = None,
    ) -> None:
        # The record was released (or handed off) by the caller; it finishes when the
        # replacement is durable (consumer/_side_records.py). The traced executor adds
        # the task span's context to the headers here.
        task = asyncio.get_running_loop().create_task(
            self._side.send(partition, record, topic, headers, what, timestamp_ms, started_at)
        )
        self._starter.track(task)  # a send

    async def close(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for sends and running continuations, then cancel them."""
        self._starter.release()
        if not self._tasks:
            return
        _, pending = await asyncio.wait(set(self._tasks), timeout=timeout_s)
        for task in pending:
            task.cancel()


class _Starting:
    """The context of the task an executor is starting now, ``None`` between starts."""

    def __init__(self) -> None:
        self.ctx: ProcessingContext | None = None


_STARTING: Final = _Starting()
register_task_source(lambda: _STARTING.ctx)


def _describe(exc: BaseException | None) -> str:
    return f"{type(exc).__name__}: {exc}" if exc is not None else ""
