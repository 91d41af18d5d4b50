"""The committer: a commit the client keeps retrying is given up, never awaited forever."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from decaton_aio.consumer.commit import (
    Committer,
    _committer,
    commit_interval_within,
    transaction_timeout_ms,
)
from tests.unit.test_partition import make, records, settle


def _bound(committer: Committer[Any], fake: Any) -> Any:
    """``fake`` as both the fetcher (its ``consumer`` is itself: highwater, position) and
    the group membership the committer commits through."""
    fake.consumer = fake
    committer.bind_group(fake)
    return fake


class _StuckConsumer:
    """A consumer whose commits never end, like the client's retry loop on a topic that
    was deleted (UnknownTopicOrPartition is retriable)."""

    def __init__(self) -> None:
        self.attempts = 0

    def highwater(self, tp: Any) -> int | None:
        return None  # nothing beyond what was fetched

    async def commit(self, offsets: Any) -> None:
        self.attempts += 1
        await asyncio.Event().wait()


async def _two_done() -> Any:
    """A partition whose first two records are done."""

    async def process(ctx: Any, task: Any) -> None:
        return None

    processor = make(process)
    processor.feed(records([b"a", b"b"]))
    await settle()
    assert processor.committable() == 2
    return processor


async def test_a_commit_that_never_ends_is_given_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit stuck in the client is abandoned after the commit timeout: ``commit``
    returns (a revoke goes on), the offset is not taken as committed, and the next
    commit tries it again."""
    monkeypatch.setattr(_committer, "COMMIT_TIMEOUT_S", 0.01)
    processor = await _two_done()
    committer: Committer[Any] = Committer("group", store=None, transaction=None)
    consumer = _StuckConsumer()
    await committer.commit(_bound(committer, consumer), [processor], final=True)  # type: ignore[arg-type]
    await committer.commit(_bound(committer, consumer), [processor], final=False)  # type: ignore[arg-type]
    assert consumer.attempts == 2  # not marked committed: tried again


class _AnsweringConsumer:
    """A consumer whose commit ends when the test says so."""

    def __init__(self) -> None:
        self.answer: asyncio.Future[None] | None = None
        self.called = asyncio.Event()

    def highwater(self, tp: Any) -> int | None:
        return None  # nothing beyond what was fetched

    async def commit(self, offsets: Any) -> None:
        self.answer = asyncio.get_running_loop().create_future()
        self.called.set()
        await self.answer


async def test_a_cancellation_that_arrives_as_the_commit_ends_is_not_lost() -> None:
    """A shutdown cancels the commit routine: when the cancellation arrives in the same
    turn of the loop as the broker's answer, the commit still ends cancelled (a lost
    cancellation left the routine running and the shutdown waiting for it forever)."""

    async def process(ctx: Any, task: Any) -> None:
        return None

    processor = make(process)
    processor.feed(records([b"a"]))
    await settle()
    committer: Committer[Any] = Committer("group", store=None, transaction=None)
    consumer = _AnsweringConsumer()
    task = asyncio.create_task(
        committer.commit(_bound(committer, consumer), [processor], final=False)
    )  # type: ignore[arg-type]
    await consumer.called.wait()
    assert consumer.answer is not None
    consumer.answer.set_result(None)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


class _SkippingConsumer:
    """A consumer whose fetch position passed offsets it never handed out (transaction
    markers, aborted records), and that records what was committed."""

    def __init__(self, high: int, position: int) -> None:
        self.high, self._position = high, position
        self.commits: list[dict[Any, int]] = []

    def highwater(self, tp: Any) -> int | None:
        return self.high

    async def position(self, tp: Any) -> int:
        return self._position

    async def commit(self, offsets: Any) -> None:
        self.commits.append({tp: o.offset for tp, o in offsets.items()})


async def test_an_idle_partition_is_committed_past_offsets_it_was_never_handed() -> None:
    """The commit walk moves an idle partition's watermark to the consumer's position
    when the broker holds more than the watermark; a partition with a task still pending
    stays at its watermark, whatever the position says."""

    async def process(ctx: Any, task: Any) -> None:
        return None

    idle = make(process)
    idle.feed(records([b"a", b"b"]))
    await settle()
    committer: Committer[Any] = Committer("group", store=None, transaction=None)
    consumer = _SkippingConsumer(high=6, position=5)
    await committer.commit(_bound(committer, consumer), [idle], final=False)  # type: ignore[arg-type]
    assert consumer.commits == [{idle.tp: 5}]

    held = asyncio.Event()

    async def waiting(ctx: Any, task: Any) -> None:
        await held.wait()

    busy = make(waiting)
    busy.feed(records([b"a"]))
    await settle()
    consumer = _SkippingConsumer(high=6, position=5)
    await committer.commit(_bound(committer, consumer), [busy], final=False)  # type: ignore[arg-type]
    assert consumer.commits == [{busy.tp: 0}]
    held.set()
    await settle()


async def test_records_dropped_by_a_draining_partition_are_never_committed_past() -> None:
    """A revoke races a fetch: the batch the consumer handed out reaches the partition
    after its revoke, which drops it (the next owner gets it from the last commit). The
    consumer's position is past those records, so the final commit must stay at the
    watermark: committing the position would lose them."""

    async def process(ctx: Any, task: Any) -> None:
        return None

    processor = make(process)
    processor.feed(records([b"a", b"b"]))
    await settle()
    processor.revoke()
    processor.receive(5)  # the fetch routine notes the batch, then feeds it
    processor.feed(records([b"c", b"d", b"e"], first=2))  # dropped: draining
    committer: Committer[Any] = Committer("group", store=None, transaction=None)
    consumer = _SkippingConsumer(high=5, position=5)
    await committer.commit(_bound(committer, consumer), [processor], final=True)  # type: ignore[arg-type]
    assert consumer.commits == [{processor.tp: 2}]


async def test_a_batch_handed_out_but_not_fed_yet_is_never_committed_past() -> None:
    """The fetch routine notes every batch the consumer handed out before it feeds the
    first one: a commit that runs between two of its steps (a revoke's final commit, the
    commit routine) must not move the watermark to the position over records still
    waiting to be fed; once they are fed and done, it may."""

    async def process(ctx: Any, task: Any) -> None:
        return None

    processor = make(process)
    processor.feed(records([b"a", b"b"]))
    await settle()
    processor.receive(5)  # offsets 2-4 handed out, not fed yet
    committer: Committer[Any] = Committer("group", store=None, transaction=None)
    consumer = _SkippingConsumer(high=7, position=6)
    await committer.commit(_bound(committer, consumer), [processor], final=False)  # type: ignore[arg-type]
    assert consumer.commits == [{processor.tp: 2}]
    processor.feed(records([b"c", b"d", b"e"], first=2))
    await settle()
    await committer.commit(_bound(committer, consumer), [processor], final=False)  # type: ignore[arg-type]
    assert consumer.commits[-1] == {processor.tp: 6}  # offset 5 held no data record


async def test_the_commit_age_restarts_when_the_commit_is_up_to_date(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A commit that succeeds, or a round with nothing new to commit, makes the
    partition's commit up to date (its age starts again); a commit that fails does not."""
    monkeypatch.setattr(_committer, "COMMIT_TIMEOUT_S", 0.01)
    processor = await _two_done()
    committer: Committer[Any] = Committer("group", store=None, transaction=None)
    processor.stats.commit_current_at -= 1000
    await committer.commit(_bound(committer, _StuckConsumer()), [processor], final=False)  # type: ignore[arg-type]
    assert processor.stats.commit_age() >= 1000  # failed: still behind
    consumer = _SkippingConsumer(high=2, position=2)
    await committer.commit(_bound(committer, consumer), [processor], final=False)  # type: ignore[arg-type]
    assert consumer.commits == [{processor.tp: 2}]
    assert processor.stats.commit_age() < 1000
    processor.stats.commit_current_at -= 1000
    await committer.commit(_bound(committer, consumer), [processor], final=False)  # type: ignore[arg-type]
    assert len(consumer.commits) == 1  # nothing new: no commit, yet up to date
    assert processor.stats.commit_age() < 1000


class _RetryingConsumer:
    """A consumer that retries its first commit until cancelled, writing its offsets
    again at each try, as the client does while a partition in the commit belongs to a
    deleted topic; later commits are written once."""

    def __init__(self) -> None:
        self.written: list[dict[Any, int]] = []  # what the broker was told, in order
        self.retry = asyncio.Event()
        self.retrying = False

    def highwater(self, tp: Any) -> int | None:
        return None  # nothing beyond what was fetched

    async def commit(self, offsets: Any) -> None:
        sent = {tp: o.offset for tp, o in offsets.items()}
        self.written.append(sent)
        if self.retrying:
            return
        self.retrying = True
        while True:
            await self.retry.wait()
            self.retry.clear()
            self.written.append(sent)


async def test_a_final_commit_ends_a_periodic_commit_the_client_still_retries() -> None:
    """A revoke's final commit comes while a periodic commit is still retried by the
    client: the periodic commit ends before the final one is written, so no retry
    writes its older offset after the final one (the partition may be another
    member's by then, which would redo the records in between)."""

    async def process(ctx: Any, task: Any) -> None:
        return None

    processor = make(process)
    processor.feed(records([b"a", b"b"]))
    await settle()
    committer: Committer[Any] = Committer("group", store=None, transaction=None)
    consumer = _RetryingConsumer()
    periodic = asyncio.create_task(
        committer.commit(_bound(committer, consumer), [processor], final=False)
    )  # type: ignore[arg-type]
    await settle()
    assert consumer.written == [{processor.tp: 2}]  # retried from here on
    processor.feed(records([b"c", b"d"], first=2))
    await settle()
    await committer.commit(_bound(committer, consumer), [processor], final=True)  # type: ignore[arg-type]
    assert periodic.done()
    await periodic  # ended, not failed
    consumer.retry.set()
    await settle()
    assert consumer.written == [{processor.tp: 2}, {processor.tp: 4}]


async def test_a_commit_round_folds_a_partition_histograms_in_steps() -> None:
    """A busy partition's histograms queue hundreds of thousands of observations a
    second; the commit round folds them one histogram at a time and lets the loop run
    between two once a step took its budget, rather than holding it for the whole fold."""
    from decaton_aio.consumer._loopwatch import STEP_BUDGET_S, StepTimer

    processor = await _two_done()
    histograms = processor.stats.histograms
    for histogram in histograms:
        histogram.observe(0.001)
    wall = [0.0]

    def clock() -> float:  # every step is over its budget by the next reading
        wall[0] += 2 * STEP_BUDGET_S
        return wall[0]

    steps = StepTimer(lambda cpu_s: None, clock=clock, cpu_clock=lambda: 0.0)
    loop = asyncio.get_running_loop()
    unfolded: list[int] = []

    def note() -> None:  # the loop ran: how many histograms still held observations
        unfolded.append(sum(1 for h in histograms if h._queued))
        if unfolded[-1]:
            loop.call_soon(note)

    loop.call_soon(note)
    committer: Committer[Any] = Committer("group", store=None, transaction=None)
    consumer = _SkippingConsumer(high=2, position=2)
    await committer.commit(_bound(committer, consumer), [processor], final=False, steps=steps)  # type: ignore[arg-type]
    # The loop ran while some of the histograms were folded and others not yet.
    assert any(0 < n < len(histograms) for n in unfolded), unfolded
    assert not any(h._queued for h in histograms)  # every one folded


class _DroppingStore:
    """A checkpoint store on a broker that drops commit metadata: its first read-back
    waits until the test lets it go; metadata is inline until the drop is known, then a
    reference to the checkpoint topic."""

    def __init__(self) -> None:
        self.metadata_kept: bool | None = None
        self.reading = asyncio.Event()
        self.answer = asyncio.Event()
        self.written: list[Any] = []  # checkpoints written to the topic

    async def metadata(self, checkpoints: dict[Any, Any]) -> dict[Any, str]:
        if self.metadata_kept is False:
            self.written += checkpoints.values()
            return {tp: "dc1ref:0:0:0" for tp in checkpoints}
        return {tp: "dc1:inline" for tp in checkpoints}

    async def check_kept(self, tp: Any, text: str) -> None:
        self.reading.set()
        await self.answer.wait()
        self.metadata_kept = False


class _CommittingConsumer(_SkippingConsumer):
    def __init__(self) -> None:
        super().__init__(high=0, position=0)
        self.metadata: list[str] = []

    async def commit(self, offsets: Any) -> None:
        await super().commit(offsets)
        self.metadata += [o.metadata for o in offsets.values()]


async def test_a_final_commit_writes_again_a_checkpoint_the_broker_dropped() -> None:
    """The periodic commit that carried a checkpoint inline is ended by a shutdown's final
    commit while it reads the metadata back. The final commit reads it back itself and,
    the broker having dropped it, writes the checkpoint again to the topic: the next
    owner of the partition finds it (before, nothing changed since the periodic commit,
    so the final one committed nothing, and the checkpoint was lost)."""
    release = asyncio.Event()

    async def process(ctx: Any, task: Any) -> None:
        if ctx.offset == 0:
            await release.wait()  # unfinished: later offsets done make a checkpoint

    processor = make(process)
    processor.feed(records([b"a", b"b", b"c"]))
    await settle()
    store = _DroppingStore()
    committer: Committer[Any] = Committer("group", store=store, transaction=None)  # type: ignore[arg-type]
    consumer = _CommittingConsumer()
    periodic = asyncio.create_task(
        committer.commit(_bound(committer, consumer), [processor], final=False)
    )  # type: ignore[arg-type]
    await store.reading.wait()
    assert consumer.metadata == ["dc1:inline"]
    final = asyncio.create_task(
        committer.commit(_bound(committer, consumer), [processor], final=True)
    )  # type: ignore[arg-type]
    await asyncio.wait([periodic])
    assert store.metadata_kept is None  # the read-back was cut short
    store.answer.set()
    await final
    assert store.metadata_kept is False
    assert consumer.metadata == ["dc1:inline", "dc1ref:0:0:0"]
    assert len(store.written) == 1
    release.set()
    await settle()


@given(start_ms=st.integers(1, 600_000), reloaded_ms=st.integers(1, 3_600_000))
def test_a_reloaded_commit_interval_keeps_transactions_within_their_timeout(
    start_ms: int, reloaded_ms: int
) -> None:
    """Exactly-once fixes the transaction timeout at start (three intervals, at least
    10 s); a commit interval reloaded later is used as long as three of it fit in that
    timeout, and capped there above (a transaction open longer is aborted by the broker)."""
    timeout_ms = transaction_timeout_ms(start_ms)
    interval_ms = commit_interval_within(timeout_ms, reloaded_ms)
    assert 3 * interval_ms <= timeout_ms
    assert interval_ms == reloaded_ms or 3 * (interval_ms + 1) > timeout_ms
    assert commit_interval_within(timeout_ms, start_ms) == start_ms


class _FakeTransaction:
    """Commits every plan it is given (what the broker would take), recording each."""

    def __init__(self) -> None:
        self.plans: list[dict[Any, int]] = []

    async def start(self) -> None:
        return None

    async def commit(self, plan: Any, unchanged: Any) -> None:
        offsets = {tp: offset for tp, (offset, _) in (await plan()).items()}
        offsets |= {tp: offset for tp, (offset, _) in unchanged().items()}
        self.plans.append(offsets)


async def test_a_partition_restarted_at_another_position_is_committed_in_the_transactions() -> None:
    """Exactly-once: after the fetch position went back (a recreated topic, a reset), the
    partition's new processor is the one the transactions commit (before, the new
    one's offsets were never committed), and the old one's last commit is not carried
    over to it."""

    async def process(ctx: Any, task: Any) -> None:
        return None

    txn = _FakeTransaction()
    committer: Committer[Any] = Committer("group", store=None, transaction=txn)  # type: ignore[arg-type]
    consumer = _SkippingConsumer(high=0, position=0)
    old = make(process)
    await committer.assign(consumer, [old])  # type: ignore[arg-type]
    old.feed(records([b"a", b"b", b"c"], first=10))
    await settle()
    await committer.commit(_bound(committer, consumer), [old], final=False)  # type: ignore[arg-type]
    assert txn.plans[-1] == {old.tp: 13}

    new = make(process)
    committer.adopt(old, new, at_last_commit=False)
    old.close()
    # Nothing fetched yet at the new position: offset 13 of what the topic was is not
    # carried over to it (a next owner would skip the new records below 13).
    await committer.commit(_bound(committer, consumer), [new], final=False)  # type: ignore[arg-type]
    assert new.tp not in txn.plans[-1]
    new.feed(records([b"a", b"b"]))
    await settle()
    await committer.commit(_bound(committer, consumer), [new], final=False)  # type: ignore[arg-type]
    assert txn.plans[-1] == {new.tp: 2}
