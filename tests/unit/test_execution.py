"""Task outcomes without a broker: retries, dead letters, deferral, scheduling, pacing."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import msgspec
import pytest
from structlog.testing import capture_logs

from decaton_aio import Application, ConsumerConfig, Subscription
from decaton_aio.backoff import RetryPolicy, RetryTask, SkipTask
from decaton_aio.batching import BatchingProcessor, BatchItem
from decaton_aio.compaction import CompactedTask, CompactingProcessor, CompactionChoice
from decaton_aio.consumer._execution import META_RENEW_RECORDS
from decaton_aio.consumer._hotkeys import HotKeyDetector
from decaton_aio.context import ProcessingContext
from decaton_aio.errors import ConfigError, DecodeError
from decaton_aio.metadata import METADATA_HEADER, TaskMetadata, decode_metadata, encode_metadata
from decaton_aio.retry import RetryConfig
from decaton_aio.serializers import JsonSerializer
from tests.unit.test_partition import FakeRecord, FakeSender, make, records, settle

FAST = RetryPolicy(max_attempts=3, backoff_base_ms=10, backoff_max_ms=20, jitter=0)


def meta_header(**fields: Any) -> list[tuple[str, bytes]]:
    fields.setdefault("timestamp_ms", 1)
    return [(METADATA_HEADER, encode_metadata(TaskMetadata(**fields)))]


async def until(predicate: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


# ----------------------------------------------------------------- queue retries


async def test_retry_goes_to_retry_topic_and_completes_after_send() -> None:
    """ctx.retry() sends the task to <topic>-retry with retry count + 1 and a scheduled
    time; the offset completes only once the send succeeded."""
    sender = FakeSender()

    async def process(ctx: ProcessingContext, task: Any) -> None:
        ctx.retry()

    proc = make(process, sender=sender, retry=RetryConfig(FAST))
    before_ms = time.time() * 1000
    proc.feed([FakeRecord(0, b"k", headers=meta_header(retry_count=0))])
    assert proc.committable() == 0
    await settle()
    assert proc.committable() == 1
    ((topic, key, value, headers),) = sender.sent
    assert (topic, key, value) == ("tasks-retry", b"k", b"v")
    meta = decode_metadata(dict(headers)[METADATA_HEADER])
    assert meta.retry_count == 1
    # Scheduled one backoff (10 ms for the first retry) after the failure.
    assert int(before_ms) + 10 <= meta.scheduled_time_ms <= time.time() * 1000 + 10
    assert dict(headers)["dt_origin_offset"] == b"0"
    assert proc.stats.retries == 1


@pytest.mark.parametrize("how", ["ctx", "completion", "raise"])
async def test_a_retry_delay_that_cannot_be_waited_fails_the_task_not_the_partition(
    how: str,
) -> None:
    """An infinite or huge retry delay (ctx.retry, Completion.retry, RetryTask) is refused
    with ConfigError where it is asked: the task fails with it and follows the policy,
    the partition goes on (the delay reached the retry record's dt_meta, whose encoding
    raised inside the feed and stopped the subscription, restart after restart)."""
    sender = FakeSender()
    refused: list[BaseException] = []

    async def process(ctx: ProcessingContext, task: Any) -> None:
        delay = math.inf if ctx.offset == 0 else 1e16
        if how == "ctx":
            ctx.retry(delay)
        elif how == "raise":
            raise RetryTask("later", delay_s=delay)
        else:
            try:
                ctx.deferred().retry(delay)
            except ConfigError as exc:
                refused.append(exc)
                raise

    proc = make(process, sender=sender, retry=RetryConfig(FAST))
    proc.feed(records([b"a", b"b"]))
    await until(lambda: proc.committable() == 2)
    # A setting error: the policy does not retry it, so the tasks go to the dead letters.
    assert [s[0] for s in sender.sent] == ["tasks-dlq", "tasks-dlq"]
    assert all(b"ConfigError" in dict(s[3])["dt_dlq_error_type"] for s in sender.sent)
    if how == "completion":
        assert len(refused) == 2


async def test_retriable_exception_follows_policy_then_dead_letter() -> None:
    """An exception is retried while attempts remain; at the last attempt the task goes
    to the dead letter topic with its error."""
    sender = FakeSender()

    async def process(ctx: ProcessingContext, task: Any) -> None:
        raise TimeoutError("db timeout")

    proc = make(process, sender=sender, retry=RetryConfig(FAST))
    proc.feed([FakeRecord(0, b"k", headers=meta_header(retry_count=1))])  # 2nd attempt
    proc.feed([FakeRecord(1, b"j", headers=meta_header(retry_count=2))])  # 3rd = last
    await settle()
    topics = [s[0] for s in sender.sent]
    assert topics == ["tasks-retry", "tasks-dlq"]
    dlq = dict(sender.sent[1][3])
    assert dlq["dt_dlq_error_type"] == b"TimeoutError"
    assert dlq["dt_dlq_error_message"] == b"db timeout"
    assert dlq["dt_dlq_attempts"] == b"3"
    assert b"TimeoutError" in dlq["dt_dlq_traceback"]
    assert proc.committable() == 2


async def test_non_retriable_exception_goes_straight_to_dead_letter() -> None:
    """An exception the policy does not retry is dead-lettered at once."""
    sender = FakeSender()

    async def process(ctx: ProcessingContext, task: Any) -> None:
        raise ValueError("bad task")

    policy = RetryPolicy(max_attempts=5, no_retry_on=(ValueError,))
    proc = make(process, sender=sender, retry=RetryConfig(policy))
    proc.feed(records([b"k"]))
    await settle()
    assert [s[0] for s in sender.sent] == ["tasks-dlq"]


@pytest.mark.parametrize(
    ("value", "headers", "error_type", "reason"),
    [
        (b"bad", None, b"DecodeError:body", b"not json"),
        (None, None, b"DecodeError:body", b"tombstone"),
        (b"v", [(METADATA_HEADER, b"\x34")], b"DecodeError:header", b"ends no group"),
    ],
    ids=["body", "tombstone", "header"],
)
async def test_poison_pill_is_dead_lettered_with_the_reason(
    value: bytes | None, headers: Any, error_type: bytes, reason: bytes
) -> None:
    """A record that cannot be decoded (body, missing value, dt_meta header) goes to the
    dead letter topic with the reason, is counted as discarded, and completes once the
    dead letter is durable; the records around it run."""

    def decode(data: bytes) -> bytes:
        if data == b"bad":
            raise DecodeError("body", "not json")
        return data

    ran: list[int] = []

    async def process(ctx: ProcessingContext, task: Any) -> None:
        ran.append(ctx.offset)

    sender = FakeSender()
    proc = make(process, decode=decode, sender=sender)
    batch = records([b"a", b"a", b"a"])
    batch[1].value = value
    if headers is not None:
        batch[1].headers = headers
    proc.feed(batch)
    assert ran == [0, 2]
    assert proc.stats.discarded == 1
    assert proc.committable() == 1  # the dead letter is not durable yet
    await settle()
    assert proc.committable() == 3
    ((topic, key, sent_value, sent_headers),) = sender.sent
    assert (topic, key, sent_value) == ("tasks-dlq", b"a", value)
    assert dict(sent_headers)["dt_dlq_error_type"] == error_type
    assert reason in dict(sent_headers)["dt_dlq_error_message"]


class Item(msgspec.Struct):
    qty: int


@pytest.mark.parametrize(
    ("body", "reason"),
    [(b"{", b"truncated"), (b'{"qty": "x"}', b"Expected `int`, got `str` - at `$.qty`")],
    ids=["malformed", "wrong type"],
)
async def test_a_json_body_that_does_not_decode_is_dead_lettered_with_msgspec_reason(
    body: bytes, reason: bytes
) -> None:
    """The executor decodes msgspec bodies with the decoder itself; a body it rejects still
    goes to the dead letter topic with the serializer's reason, and good bodies decode."""
    tasks: list[Any] = []

    async def process(ctx: ProcessingContext, task: Any) -> None:
        tasks.append(task)

    sender = FakeSender()
    proc = make(process, decode=JsonSerializer(Item).decode, sender=sender)
    batch = records([b"a", b"b"])
    batch[0].value = body
    batch[1].value = b'{"qty": 2}'
    proc.feed(batch)
    await settle()
    assert tasks == [Item(2)]
    ((topic, _, _, sent_headers),) = sender.sent
    assert topic == "tasks-dlq"
    assert dict(sent_headers)["dt_dlq_error_type"] == b"DecodeError:body"
    assert reason in dict(sent_headers)["dt_dlq_error_message"]
    assert proc.committable() == 2


async def test_a_custom_decode_that_fails_is_called_once() -> None:
    """A serializer's decode other than msgspec's runs once per record, also when it
    raises (its failure is not retried)."""
    calls: list[bytes] = []

    def decode(data: bytes) -> bytes:
        calls.append(data)
        raise DecodeError("body", "never")

    async def process(ctx: ProcessingContext, task: Any) -> None:
        raise AssertionError("not run")

    proc = make(process, decode=decode, sender=FakeSender())
    proc.feed(records([b"a"]))
    await settle()
    assert calls == [b"v"]


async def test_failed_send_keeps_task_pending_until_it_succeeds() -> None:
    """A retry that cannot be sent is not completed; it is sent again until it works."""
    sender = FakeSender(failures=2)

    async def process(ctx: ProcessingContext, task: Any) -> None:
        raise RetryTask("later")

    proc = make(process, sender=sender, retry=RetryConfig(FAST))
    proc.feed(records([b"k"]))
    await settle()
    assert proc.committable() == 0
    await until(lambda: proc.committable() == 1, timeout_s=10)
    assert len(sender.sent) == 1


async def test_retry_without_retry_config_is_dead_lettered() -> None:
    """Asking for a retry when none is configured loses nothing: dead letter."""
    sender = FakeSender()

    async def process(ctx: ProcessingContext, task: Any) -> None:
        ctx.retry()

    proc = make(process, sender=sender)
    proc.feed(records([b"k"]))
    await settle()
    assert [s[0] for s in sender.sent] == ["tasks-dlq"]
    assert dict(sender.sent[0][3])["dt_dlq_error_type"] == b"RetryNotConfigured"


async def test_skip_task_completes_and_counts_discarded() -> None:
    """SkipTask completes the task without retry or failure."""

    async def process(ctx: ProcessingContext, task: Any) -> None:
        raise SkipTask("stale")

    proc = make(process, retry=RetryConfig(FAST))
    proc.feed(records([b"k"]))
    assert (proc.committable(), proc.stats.discarded, proc.stats.errors) == (1, 1, 0)


# -------------------------------------------------------------- in-place retries


async def test_in_place_retry_keeps_key_order_and_only_that_key_waits() -> None:
    """In-place retries rerun the task in its lane after the backoff: later tasks of its
    key wait, other keys go on at once; after the attempts, the dead letter topic."""
    sender = FakeSender()
    seen: list[tuple[int, int]] = []

    async def process(ctx: ProcessingContext, task: Any) -> None:
        seen.append((ctx.offset, ctx.attempt))
        if ctx.offset == 0:
            raise TimeoutError("flaky")

    policy = RetryPolicy(max_attempts=3, backoff_base_ms=50, backoff_max_ms=50, jitter=0)
    proc = make(process, sender=sender, retry=RetryConfig(policy, mode="in_place"))
    proc.feed(records([b"a", b"b", b"a"]))
    await settle()
    assert seen == [(0, 1), (1, 1)]  # offset 2 (key a) waits behind the retried offset 0
    await until(lambda: len(seen) >= 4)
    assert seen[2:4] == [(0, 2), (0, 3)]
    await until(lambda: (2, 1) in seen and bool(sender.sent))
    assert [s[0] for s in sender.sent] == ["tasks-dlq"]
    await until(lambda: proc.committable() == 3)


# ------------------------------------------------------------------- scheduling


async def test_scheduled_task_waits_without_blocking_other_keys() -> None:
    """A task scheduled in the future does not start at once; other keys run meanwhile
    (the waiting task holds no concurrency slot), and its own key's next task waits for
    it."""
    started: list[int] = []

    async def process(ctx: ProcessingContext, task: Any) -> None:
        started.append(ctx.offset)

    due_ms = int(time.time() * 1000) + 100
    proc = make(process, limit=1)
    proc.feed(
        [
            FakeRecord(0, b"a", headers=meta_header(scheduled_time_ms=due_ms)),
            FakeRecord(1, b"b"),
            FakeRecord(2, b"a"),
        ]
    )
    assert started == [1]
    await until(lambda: len(started) == 3)
    assert started == [1, 0, 2]
    assert proc.committable() == 3
    assert proc.committable() == 3


# ------------------------------------------------------------------ deferral


async def test_deferred_completion_holds_offset_not_slot() -> None:
    """A deferred task frees its slot and lane at return; its offset completes when the
    completion is completed, from another task or thread; deferred() is idempotent."""
    completions: dict[int, Any] = {}

    async def process(ctx: ProcessingContext, task: Any) -> None:
        completion = ctx.deferred()
        assert ctx.deferred() is completion
        completions[ctx.offset] = completion

    proc = make(process, limit=1)
    proc.feed(records([b"a", b"a", b"b"]))
    assert len(completions) == 3  # all ran: slots and lanes were freed at return
    assert proc.committable() == 0
    completions[1].complete()
    assert proc.committable() == 0
    await asyncio.to_thread(completions[0].complete)  # from another thread
    await until(lambda: proc.committable() == 2)
    completions[2].complete()
    completions[2].complete()  # twice is harmless
    assert proc.committable() == 3


@pytest.mark.parametrize("policy", ["give_up", "retry"])
async def test_leaked_completion_times_out(policy: str) -> None:
    """A completion nobody completes does not stall the partition: after the timeout it
    is given up (counted) or sent to retry."""
    sender = FakeSender()

    async def process(ctx: ProcessingContext, task: Any) -> None:
        ctx.deferred()

    proc = make(
        process,
        sender=sender,
        retry=RetryConfig(FAST),
        properties={"decaton.deferred.complete.timeout.ms": 50},
        deferred_policy=policy,
    )
    proc.feed(records([b"a"]))
    await until(lambda: proc.committable() == 1)
    if policy == "give_up":
        assert proc.stats.discarded == 1
        assert sender.sent == []
    else:
        assert [s[0] for s in sender.sent] == ["tasks-retry"]


# --------------------------------------------------------------------- pacing


async def test_rate_limit_delays_never_drops_and_changes_live() -> None:
    """With a rate, a burst starts at once and the rest waits for tokens; raising it to
    unlimited lets the rest through at once; nothing is dropped."""
    started: list[int] = []

    async def process(ctx: ProcessingContext, task: Any) -> None:
        started.append(ctx.offset)

    proc = make(process, rate=20)  # burst 20, then 20/s
    proc.feed(records([f"k{i}".encode() for i in range(30)]))
    assert len(started) == 20  # the burst; the bucket's pace has its own clocked tests
    assert proc.stats.throttled_s > 0
    await until(lambda: len(started) == 21)  # the next token came
    assert len(started) < 30
    proc.set_rate(-1)
    assert len(started) == 30
    assert proc.committable() == 30


async def test_rate_zero_pauses_until_changed() -> None:
    """Rate 0 starts nothing and asks for a pause; a new rate resumes."""
    ran: list[int] = []
    resumed: list[Any] = []

    async def process(ctx: ProcessingContext, task: Any) -> None:
        ran.append(ctx.offset)

    def resume(p: Any) -> None:  # what the subscription does: resume the consumer
        resumed.append(p)
        p.set_paused(False)

    proc = make(process, rate=0, on_below=resume)
    assert proc.needs_pause
    proc.set_paused(True)
    proc.feed(records([b"a", b"b"]))
    await settle()  # rate 0 sets no timer: nothing would ever start
    assert ran == []
    proc.set_rate(-1)
    assert ran == [0, 1]
    assert resumed == [proc]


async def test_ignored_keys_complete_without_running() -> None:
    """Records whose key is in decaton.ignore.keys are completed and never run; the set
    can change live."""
    ran: list[int] = []

    async def process(ctx: ProcessingContext, task: Any) -> None:
        ran.append(ctx.offset)

    proc = make(process, ignore_keys=[b"spam"])
    proc.feed(records([b"spam", b"a", b"spam"]))
    assert ran == [1]
    proc.set_ignore_keys([])
    proc.feed(records([b"spam"], first=3))
    assert ran == [1, 3]
    assert proc.committable() == 4
    assert proc.stats.discarded == 2


async def test_hot_key_is_shaped_to_its_own_topic() -> None:
    """Tasks of a key over its quota go to <topic>-shaping and complete once sent;
    other keys run here."""
    sender = FakeSender()
    ran: list[bytes] = []

    async def process(ctx: ProcessingContext, task: Any) -> None:
        ran.append(ctx.key)

    proc = make(process, sender=sender, hot_keys=HotKeyDetector(5, 1.0))
    proc.feed(records([b"hot"] * 50 + [b"cold"] * 3))
    await settle()
    shaped = [s for s in sender.sent if s[0] == "tasks-shaping"]
    assert len(shaped) >= 40
    assert ran.count(b"cold") == 3
    assert len(shaped) + ran.count(b"hot") == 50
    await until(lambda: proc.committable() == 53)
    assert await proc.wait_idle(1.0)  # nothing left awaiting completion


# ------------------------------------------------------- compaction and batching


async def test_compaction_keeps_one_task_per_key_and_window() -> None:
    """Within the window, the compactor picks one task per key; the others complete as
    compactions; the kept task runs at the window's end; the offsets all complete."""
    ran: list[tuple[bytes | None, int]] = []

    async def process(ctx: ProcessingContext, task: Any) -> None:
        ran.append((ctx.key, ctx.offset))

    def latest(left: CompactedTask[Any], right: CompactedTask[Any]) -> CompactionChoice:
        return CompactionChoice.PICK_RIGHT

    compacting = CompactingProcessor(process, latest, window_s=0.05)
    proc = make(compacting)
    proc.feed(records([b"a", b"b", b"a", b"a", b"b"]))
    assert ran == []
    assert proc.committable() == 3  # 0, 1, 2 were compacted away; 3 and 4 are held
    await until(lambda: len(ran) == 2)
    assert sorted(ran) == [(b"a", 3), (b"b", 4)]
    await until(lambda: proc.committable() == 5)
    assert proc.stats.compactions == 3


async def test_survivors_of_consecutive_windows_of_a_key_never_overlap() -> None:
    """A kept task that outlasts its window: the next window's survivor of the same key
    waits for it (one task of a key at a time), while other keys run."""
    running: set[bytes | None] = set()
    overlaps: list[int] = []
    ran: list[int] = []
    release = asyncio.Event()

    async def process(ctx: ProcessingContext, task: Any) -> None:
        if ctx.key in running:
            overlaps.append(ctx.offset)
        running.add(ctx.key)
        ran.append(ctx.offset)
        if ctx.offset == 0:
            await release.wait()  # outlasts the next window
        running.discard(ctx.key)

    def keep_new(left: CompactedTask[Any], right: CompactedTask[Any]) -> CompactionChoice:
        return CompactionChoice.PICK_RIGHT

    compacting = CompactingProcessor(process, keep_new, window_s=0.01)
    proc = make(compacting)
    proc.feed(records([b"a"]))
    await until(lambda: ran == [0])  # window 1's survivor runs, and blocks
    proc.feed(records([b"a", b"b"], first=1))
    await until(lambda: 2 in ran and compacting.holding == 0)  # both windows ended
    assert ran == [0, 2]  # key a's next survivor waits; key b ran
    release.set()
    await until(lambda: proc.committable() == 3)
    assert ran == [0, 2, 1]
    assert overlaps == []


async def test_batching_by_size_and_linger_with_individual_retry() -> None:
    """Tasks are handed over in batches of max_size or after linger; each item is
    completed or retried on its own."""
    sender = FakeSender()
    batches: list[list[int]] = []

    async def store(items: list[BatchItem[Any]]) -> None:
        batches.append([i.ctx.offset for i in items])
        for item in items:
            if item.ctx.offset == 1:
                item.retry()

    proc = make(
        BatchingProcessor(store, max_size=3, linger_s=0.05),
        sender=sender,
        retry=RetryConfig(FAST),
    )
    proc.feed(records([b"a", b"b", b"c", b"d"]))
    await until(lambda: len(batches) == 2)
    assert batches == [[0, 1, 2], [3]]
    await until(lambda: proc.committable() == 4)
    assert [s[0] for s in sender.sent] == ["tasks-retry"]
    assert sender.sent[0][1] == b"b"


async def test_failed_deferred_task_follows_the_retry_policy() -> None:
    """completion.fail(exc) after the processor returned is counted, and retried or
    dead-lettered as the policy says; without retry config it is logged and completed."""
    sender = FakeSender()
    completions: dict[int, Any] = {}

    async def process(ctx: ProcessingContext, task: Any) -> None:
        completions[ctx.offset] = ctx.deferred()

    policy = RetryPolicy(max_attempts=3, no_retry_on=(ValueError,))
    proc = make(process, sender=sender, retry=RetryConfig(policy))
    proc.feed(records([b"a", b"b"]))
    completions[0].fail(TimeoutError("slow db"))
    completions[1].fail(ValueError("bad data"))
    await until(lambda: proc.committable() == 2)
    assert sorted(s[0] for s in sender.sent) == ["tasks-dlq", "tasks-retry"]
    assert proc.stats.errors == 2

    plain = make(process)
    plain.feed(records([b"c"], first=2))
    completions[2].fail(RuntimeError("x"))
    assert plain.committable() == 3
    assert plain.stats.errors == 1


async def test_failed_kept_task_of_compaction_is_not_retried_when_policy_says_no() -> None:
    """A kept task that fails with an exception the policy does not retry goes to the
    dead letter topic, not the retry topic."""
    sender = FakeSender()

    async def process(ctx: ProcessingContext, task: Any) -> None:
        raise ValueError("bad")

    def keep(left: CompactedTask[Any], right: CompactedTask[Any]) -> CompactionChoice:
        return CompactionChoice.PICK_LEFT

    policy = RetryPolicy(max_attempts=3, no_retry_on=(ValueError,))
    proc = make(
        CompactingProcessor(process, keep, window_s=0.01),
        sender=sender,
        retry=RetryConfig(policy),
    )
    proc.feed(records([b"a"]))
    await until(lambda: proc.committable() == 1)
    assert [s[0] for s in sender.sent] == ["tasks-dlq"]


async def test_a_compaction_window_ends_with_its_partitions_assignment() -> None:
    """A task held when its partition's assignment ends is dropped: the same record,
    delivered again to the next assignment within the window, is held afresh (not
    compared with the stale one and completed unrun), and runs once, in the new
    assignment; the stale one never runs."""
    ran: list[tuple[int, bool]] = []

    async def process(ctx: ProcessingContext, task: Any) -> None:
        ran.append((ctx.offset, ctx.assignment_ended))

    def keep_held(left: CompactedTask[Any], right: CompactedTask[Any]) -> CompactionChoice:
        return CompactionChoice.PICK_LEFT

    compacting = CompactingProcessor(process, keep_held, window_s=0.05)
    old = make(compacting)
    old.feed(records([b"a"]))
    await settle()
    assert compacting.holding == 1
    old.close()  # revoked with the task still held: offset 0 not committed
    new = make(compacting)
    new.feed(records([b"a"]))
    await settle()
    assert new.committable() == 0  # held in the new window, not compacted away
    await until(lambda: new.committable() == 1)
    await until(lambda: compacting.holding == 0)
    assert ran == [(0, False)]


# ------------------------------------------------------------------ metrics


async def test_the_reusable_dt_meta_message_is_renewed() -> None:
    """The message each record's dt_meta is read into is replaced every
    META_RENEW_RECORDS records (the C parser's arena keeps every string read into it), and
    the records read around a renewal keep their own metadata."""
    seen: list[int] = []

    async def process(ctx: ProcessingContext, task: Any) -> None:
        seen.append(ctx.metadata.retry_count)

    proc = make(process, limit=10, max_pending=2 * META_RENEW_RECORDS)
    executor: Any = proc._executor  # type: ignore[attr-defined]
    first = executor._meta
    if first is None:
        pytest.skip("no C implementation of protobuf: nothing is reused")
    # An id beyond ASCII: the header is not of the plain shape the runtime reads itself.
    header = meta_header(source_application_id="app", source_instance_id="hôst", retry_count=2)
    feed = [FakeRecord(n, b"k%d" % (n % 7), headers=header) for n in range(META_RENEW_RECORDS)]
    proc.feed(feed[:-1])
    await until(lambda: len(seen) == META_RENEW_RECORDS - 1)
    assert executor._meta is first
    proc.feed(feed[-1:])
    await until(lambda: len(seen) == META_RENEW_RECORDS)
    assert executor._meta is not first
    assert set(seen) == {2}


async def test_completion_duration_counts_every_task_and_formats_are_told_apart() -> None:
    """Every completed task is in the completion histogram, not only deferred ones; a
    record without dt_meta is counted once even when it runs again; every fetched record
    is counted as consumed."""
    runs: dict[int, int] = {}

    async def process(ctx: ProcessingContext, task: Any) -> None:
        runs[ctx.offset] = runs.get(ctx.offset, 0) + 1
        if ctx.offset == 2 and ctx.attempt == 1:
            raise RetryTask(0.0)

    proc = make(process, retry=RetryConfig(FAST, mode="in_place"))
    proc.feed(
        [
            FakeRecord(0, b"a", headers=meta_header()),
            FakeRecord(1, b"b"),
            FakeRecord(2, b"c"),
        ]
    )
    await until(lambda: proc.committable() == 3)
    assert runs == {0: 1, 1: 1, 2: 2}
    stats = proc.stats
    assert stats.consumed == 3
    assert (stats.with_metadata, stats.without_metadata) == (1, 2)  # the retry counts once
    assert stats.completion_total().count == 3
    assert stats.process_total().count == 4


async def test_side_topic_sends_and_their_failures_are_counted() -> None:
    """Retry and dead letter records are counted once durable, failed sends each time."""
    sender = FakeSender(failures=2)

    async def process(ctx: ProcessingContext, task: Any) -> None:
        if ctx.offset == 0:
            ctx.retry()
        else:
            raise ValueError("not retriable")

    policy = RetryPolicy(max_attempts=3, backoff_base_ms=10, jitter=0, retry_on=(KeyError,))
    proc = make(process, sender=sender, retry=RetryConfig(policy))
    proc.feed([FakeRecord(0, b"a"), FakeRecord(1, b"b")])
    await until(lambda: proc.committable() == 2, timeout_s=10)
    stats = proc.stats
    assert (stats.retry_queued, stats.dead_letter_queued) == (1, 1)
    assert stats.retry_failed + stats.dead_letter_failed == 2
    assert stats.completion_total().count == 2  # completed when the sends were durable


async def test_timeouts_and_scheduling_delay_are_counted() -> None:
    """A deferred completion past its timeout counts as timed out; a scheduled task's wait
    for its time is observed."""

    async def process(ctx: ProcessingContext, task: Any) -> None:
        if ctx.offset == 0:
            ctx.deferred()  # never completed

    proc = make(process, properties={"decaton.deferred.complete.timeout.ms": 10})
    due_ms = int(time.time() * 1000) + 500
    proc.feed(
        [FakeRecord(0, b"a"), FakeRecord(1, b"b", headers=meta_header(scheduled_time_ms=due_ms))]
    )
    await until(lambda: proc.committable() == 2)
    stats = proc.stats
    assert stats.timeouts == 1
    assert stats.scheduling_delay.count == 1
    assert 0.0 < stats.scheduling_delay.sum <= 0.5


async def test_pre_decaton_9_records_give_back_the_bytes_they_took() -> None:
    """A pre-Decaton-9 record is unwrapped before it runs (its value becomes the inner
    task, shorter than what was fed); when it completes, its partition and the
    subscription's total give back what it counted for at feed, not the shorter value:
    pending bytes return to zero (else they grew with every such record, and a total
    limit paused the subscription for good)."""
    from decaton_aio.consumer._partition import PendingBytes
    from tests.unit.test_legacy import _wrapped

    seen: list[bytes] = []
    go = asyncio.Event()

    async def process(ctx: ProcessingContext, task: Any) -> None:
        seen.append(task)
        await go.wait()

    total = PendingBytes(1 << 40)
    props = {"decaton.legacy.parse.fallback.enabled": True}
    proc = make(process, properties=props, pending_bytes=total)
    value = _wrapped(b"inner task", timestamp_millis=1)
    proc.feed([FakeRecord(n, b"k%d" % n, value=value, headers=[]) for n in range(3)])
    assert (proc.pending_bytes, total.used) == (3 * len(value), 3 * len(value))
    assert seen == [b"inner task"] * 3
    go.set()
    await settle()
    assert (proc.pending_bytes, total.used) == (0, 0)


@pytest.mark.parametrize(
    ("wrapped", "mode", "warned"),
    [
        ("batching", "in_place", True),
        ("compaction", "in_place", True),
        ("batching", "queue", False),
        ("plain", "in_place", False),
    ],
)
def test_in_place_retries_of_tasks_completed_later_warn_at_start(
    wrapped: str, mode: str, warned: bool
) -> None:
    """A batched or compacted task completes after its processor returned, without its
    key lane: an in-place retry cannot run it again there, so its failures go to the
    dead letter topic at once. A subscription given both says so at start."""

    async def process(ctx: ProcessingContext, task: Any) -> None:
        return None

    async def batch(items: list[BatchItem[Any]]) -> None:
        return None

    def keep(left: CompactedTask[Any], right: CompactedTask[Any]) -> CompactionChoice:
        return CompactionChoice.PICK_LEFT

    processor: Any = {
        "batching": lambda: BatchingProcessor(batch, max_size=10, linger_s=0.1),
        "compaction": lambda: CompactingProcessor(process, keep, window_s=0.1),
        "plain": lambda: process,
    }[wrapped]()
    app = Application(processor, topics=("t",), retry=RetryConfig(FAST, mode=mode))
    with capture_logs() as logs:
        Subscription(app, ConsumerConfig("localhost:9", "g"))
    said = [e for e in logs if e["event"].startswith("in-place retries need the task's")]
    assert len(said) == warned
