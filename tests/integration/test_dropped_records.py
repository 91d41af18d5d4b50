"""Fault injection on the paths where fetched records are dropped or skipped.

Records the consumer hands out are dropped on purpose in a few places: a batch whose
partition is not live (being loaded, or revoked), the rest of a batch whose partition was
rewound or revoked in the middle of it. Each test here delays one of those paths with an
injected hook while records are produced and fetched, then checks the two things a loss
would break: no commit passes a record that was not processed (checked at the moment of
each commit), and every record is processed at least once. Each also checks what keeps
its path from losing records (the partition is not fetched while it loads or restores; a
checkpoint load and a rewind seek the partition back).
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from decaton_aio import Application, ProcessingContext, StateStoreConfig, Subscription
from decaton_aio.consumer._assigned import LoopFetcher
from decaton_aio.consumer._loopwatch import StepTimer
from decaton_aio.consumer.commit import CheckpointStore, Committer
from decaton_aio.consumer.fetch import Fetcher
from decaton_aio.consumer.group import ClassicMembership, ConsumerProtocolMembership
from decaton_aio.consumer.state import StateStore
from decaton_aio.testing import BrokerHandle, wait_until
from tests.integration.test_exactly_once import needs_transactions, read_committed

pytestmark = pytest.mark.integration

#: Every test runs on each fetch loop (``ConsumerConfig.fetch_loop``): both drop and skip
#: records on the same paths.
FETCH_LOOPS = ("own", "aiokafka")

#: Fetch calls a held load or restore lets pass before it goes on: time enough for the
#: consumer to fetch the records produced meanwhile, were the partition fetched.
FETCHES_WHILE_HELD = 10


def _in_fetch_routine() -> bool:
    task = asyncio.current_task()
    return task is not None and task.get_name() == "decaton-fetch"


class Ledger:
    """The records the processor finished, and each commit of the input topic checked,
    when it is made, against them: a commit must not pass a record not finished."""

    def __init__(self, topic: str, monkeypatch: pytest.MonkeyPatch) -> None:
        self.topic = topic
        self.done: Counter[tuple[int, int]] = Counter()
        self.passed: list[str] = []  # commits that passed an unfinished record
        self.committed: dict[int, int] = {}  # the last commit of each partition
        for membership in (ClassicMembership, ConsumerProtocolMembership):
            monkeypatch.setattr(membership, "commit", self._checked(membership.commit))

    def _checked(self, real: Any) -> Any:
        # The group membership's commit (every offset commit goes through it), checked.
        topic = self.topic

        async def commit(membership: Any, offsets: Any) -> None:
            mine = {tp: m.offset for tp, m in (offsets or {}).items() if tp.topic == topic}
            for tp, offset in mine.items():
                unfinished = [o for o in range(offset) if (tp.partition, o) not in self.done]
                if unfinished:
                    self.passed.append(f"{tp.partition}@{offset} passes {unfinished[:5]}")
            await real(membership, offsets)
            for tp, offset in mine.items():
                self.committed[tp.partition] = offset

        return commit

    def finish(self, ctx: ProcessingContext) -> None:
        self.done[(ctx.partition, ctx.offset)] += 1

    def check(self, ends: dict[int, int]) -> None:
        """No commit passed an unfinished record; every record up to ``ends`` is done."""
        assert self.passed == []
        missing = [(p, o) for p, end in ends.items() for o in range(end) if (p, o) not in self.done]
        assert missing == [], f"{len(missing)} records never processed"


class FetchHook:
    """Fault injection in the subscription's fetch routine: every batch the consumer
    hands out is noted; one batch can be held at a step of its feeding, or handed out
    together from several fetch calls; a fetch call can wait for something first."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.batches: list[dict[TopicPartition, list[Any]]] = []
        self.merge: set[TopicPartition] = set()  # hand these out in one batch, in order
        self.before_fetch: Awaitable[Any] | None = None  # the next fetch awaits it first
        self.held = asyncio.Event()
        self.release = asyncio.Event()
        self._hold: tuple[int, Callable[[dict[TopicPartition, list[Any]]], bool]] | None = None
        self._hold_step: int | None = None
        self._step = 0
        yield_if_due = StepTimer.yield_if_due
        for owner in (AIOKafkaConsumer, LoopFetcher):  # whichever fetch loop runs
            monkeypatch.setattr(owner, "getmany", self._hooked(owner.getmany))

        async def step(steps: StepTimer) -> None:
            if _in_fetch_routine() and self._hold_step is not None:
                if self._step == self._hold_step:
                    self._hold_step = None
                    self.held.set()
                    await self.release.wait()
                self._step += 1
            await yield_if_due(steps)

        monkeypatch.setattr(StepTimer, "yield_if_due", step)

    def _hooked(self, getmany: Any) -> Any:
        async def fetch(consumer: Any, *tps: Any, **kw: Any) -> Any:
            if not _in_fetch_routine():
                return await getmany(consumer, *tps, **kw)
            if self.before_fetch is not None:
                wait, self.before_fetch = self.before_fetch, None
                await wait
            batch = await getmany(consumer, *tps, **kw)
            while self.merge and not self.merge <= {tp for tp, rs in batch.items() if rs}:
                for tp, records in (await getmany(consumer, *tps, **kw)).items():
                    batch.setdefault(tp, []).extend(records)
            if self.merge:
                self.merge = set()
                batch = dict(sorted(batch.items(), key=lambda item: item[0].partition))
            self.batches.append(batch)
            self._step = 0
            if self._hold is not None and self._hold[1](batch):
                self._hold_step, self._hold = self._hold[0], None
            return batch

        return fetch

    def hold(self, step: int, when: Callable[[dict[TopicPartition, list[Any]]], bool]) -> None:
        """Hold the fetch routine before step ``step`` (0: the first) of the next batch
        ``when`` accepts, until :attr:`release` is set."""
        self._hold = (step, when)

    def handed(self, since: int, tp: TopicPartition) -> list[int]:
        """The offsets of ``tp`` handed out by the fetch calls from number ``since`` on."""
        return [r.offset for batch in self.batches[since:] for r in batch.get(tp, [])]

    async def fetched(self, calls: int) -> None:
        """Wait until the fetch routine made ``calls`` more fetch calls."""
        target = len(self.batches) + calls
        await wait_until(lambda: len(self.batches) >= target, what=f"{calls} fetch calls")


class Gate:
    """Holds an awaited step of the runtime (a checkpoint load, a restore) until opened."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.open = asyncio.Event()

    async def pass_through(self) -> None:
        self.entered.set()
        await self.open.wait()


def hold_loads(monkeypatch: pytest.MonkeyPatch) -> Gate:
    """Checkpoint loads wait at the returned gate."""
    gate = Gate()
    load = CheckpointStore.load

    async def held_load(store: CheckpointStore, tps: Any) -> Any:
        await gate.pass_through()
        return await load(store, tps)

    monkeypatch.setattr(CheckpointStore, "load", held_load)
    return gate


async def while_held(
    gate: Gate,
    hook: FetchHook,
    ledger: Ledger,
    tp: TopicPartition,
    meanwhile: Callable[[], Awaitable[int]],
    after: Callable[[], Awaitable[int]],
) -> tuple[int, list[int]]:
    """Once ``gate`` holds the assignment, produce (``meanwhile``) and let the consumer
    fetch; then open it, produce again (``after``: a partition that skipped records
    commits past them) and wait for the commit at the end. Returns the end and the
    offsets of ``tp`` handed out while held."""
    await gate.entered.wait()
    since = len(hook.batches)
    await meanwhile()
    await hook.fetched(FETCHES_WHILE_HELD)
    during = hook.handed(since, tp)
    gate.open.set()
    end = await after()
    await wait_until(
        lambda: ledger.committed.get(tp.partition) == end, what="the commit at the end"
    )
    return end, during


async def produce(producer: Any, partition: int, count: int, key: str | None = None) -> int:
    """Send ``count`` tasks to ``partition`` (each its own key unless ``key`` is given);
    return one past the last offset."""
    end = 0
    for n in range(count):
        where = await producer.put(key or f"k{n}", b"task", partition=partition)
        end = where.offset + 1
    return end


def lots(producer: Any, partition: int, *counts: int) -> list[Callable[[], Awaitable[int]]]:
    """One call per count, each producing that many tasks to ``partition``."""
    return [functools.partial(produce, producer, partition, n) for n in counts]


def app(topic: str, ledger: Ledger, **kw: Any) -> Application:
    async def process(ctx: ProcessingContext, task: bytes) -> None:
        ledger.finish(ctx)

    props = {"decaton.commit.interval.ms": 100, **kw.pop("properties", {})}
    return Application(process, topics=(topic,), properties=props, **kw)


@pytest.fixture(params=FETCH_LOOPS)
def fetch_loop(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def hook(monkeypatch: pytest.MonkeyPatch) -> Iterator[FetchHook]:
    fetch_hook = FetchHook(monkeypatch)
    yield fetch_hook
    fetch_hook.release.set()


async def test_records_fetched_while_a_partition_loads_are_not_lost(
    kafka_broker: BrokerHandle,
    topic_factory: Any,
    task_producer: Any,
    hook: FetchHook,
    fetch_loop: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A partition whose checkpoint is being loaded is not live yet: a batch the consumer
    handed out for it would be dropped. The load of a new group (no commit, so no seek
    after it) is held while records are produced; none is lost, because the partition is
    not fetched while it loads: the consumer hands out none of its records."""
    topic = await topic_factory(partitions=1)
    tp = TopicPartition(topic, 0)
    ledger = Ledger(topic, monkeypatch)
    gate = hold_loads(monkeypatch)
    producer = await task_producer(topic)
    await produce(producer, 0, 20)
    async with kafka_broker.subscription(app(topic, ledger), fetch_loop=fetch_loop) as sub:
        end, during = await while_held(gate, hook, ledger, tp, *lots(producer, 0, 20, 5))
        first_offset = sub.partitions[tp].first_offset
    ledger.check({0: end})
    assert first_offset == 0
    assert during == []  # why nothing is lost: nothing of a loading partition is fetched


async def test_a_batch_handed_out_before_a_rebalance_is_not_fed_to_the_next_assignment(
    kafka_broker: BrokerHandle,
    topic_factory: Any,
    task_producer: Any,
    hook: FetchHook,
    fetch_loop: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A batch of two partitions is handed out and held before its first step; a
    rebalance (classic protocol) revokes both partitions (partition 1 holds a task that outlives the
    rebalance timeout, so its final commit stays at that task) and assigns them back.
    The held batch must not reach partition 1's new assignment: its consumer position
    went back to the commit, and a new processor fed the batch's records would commit
    past the unfinished task."""
    topic = await topic_factory(partitions=2)
    other = await topic_factory(partitions=1)
    tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    group = f"stale-{uuid.uuid4().hex[:8]}"
    ledger = Ledger(topic, monkeypatch)
    stuck = asyncio.Event()
    first_tries: set[tuple[int, int]] = set()

    async def process(ctx: ProcessingContext, task: bytes) -> None:
        if (ctx.partition, ctx.offset) == (1, 0) and (1, 0) not in first_tries:
            first_tries.add((1, 0))
            await stuck.wait()  # never finishes in this assignment
        ledger.finish(ctx)

    async def nothing(ctx: ProcessingContext, task: bytes) -> None:
        return None

    props = {"decaton.commit.interval.ms": 100, "decaton.group.rebalance.timeout.ms": 300}
    committed = asyncio.Event()
    commit = Committer.commit

    async def noted_commit(committer: Committer[Any], *args: Any, **kw: Any) -> None:
        await commit(committer, *args, **kw)
        committed.set()

    monkeypatch.setattr(Committer, "commit", noted_commit)

    async def after_a_commit() -> None:
        committed.clear()
        await committed.wait()

    producer = await task_producer(topic)
    await produce(producer, 1, 2)
    # The classic protocol: a member joining makes every member give up its partitions.
    first = kafka_broker.subscription(
        Application(process, topics=(topic,), properties=props),
        group,
        group_protocol="classic",
        fetch_loop=fetch_loop,
    )
    try:
        async with first:
            await wait_until(
                lambda: (1, 1) in ledger.done and (1, 0) in first_tries, what="offset 1 done"
            )
            hook.merge = {tp0, tp1}
            hook.hold(0, lambda batch: True)
            ends = {0: await produce(producer, 0, 3), 1: await produce(producer, 1, 3)}
            await hook.held.wait()
            revoked = first.partitions[tp1]
            # A member of the group on another topic: every member rebalances.
            joining = kafka_broker.subscription(
                Application(nothing, topics=(other,)),
                group,
                group_protocol="classic",
                fetch_loop=fetch_loop,
            )
            async with joining:
                await wait_until(
                    lambda: first.partitions.get(tp1) not in (None, revoked),
                    what="partition 1 assigned again",
                )
                assigned = first.partitions[tp1]
                hook.before_fetch = after_a_commit()  # a commit runs before the next fetch
                hook.release.set()
                await wait_until(lambda: ledger.committed.get(1) == ends[1], what="commit at 5")
                await wait_until(lambda: ledger.committed.get(0) == ends[0], what="commit at 3")
    finally:
        stuck.set()
    ledger.check(ends)
    assert assigned.first_offset == 0  # fed from the commit, not from the held batch


async def test_records_fetched_while_a_state_restores_are_not_lost(
    kafka_broker: BrokerHandle,
    topic_factory: Any,
    task_producer: Any,
    hook: FetchHook,
    fetch_loop: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """A second instance restores a counter from the changelog into a fresh directory;
    the restore is held while records are produced. The partition is live while it
    restores (a record handed out for it would be fed, not dropped) and not fetched:
    no task runs before the restore ends, nothing is lost and the counts are right."""
    topic = await topic_factory(partitions=1)
    tp = TopicPartition(topic, 0)
    group = f"restore-{uuid.uuid4().hex[:8]}"
    ledger = Ledger(topic, monkeypatch)
    counts: dict[str, int] = {}
    early: list[int] = []  # tasks run while their partition restored
    subs: list[Subscription] = []

    async def process(ctx: ProcessingContext, task: bytes) -> None:
        store = subs[-1].state_store
        if store is not None and store.restoring(ctx.partition):
            early.append(ctx.offset)
        count = ctx.state.get(0) + 1
        ctx.state.set(count)
        counts[ctx.key.decode()] = count  # type: ignore[union-attr]
        ledger.finish(ctx)

    def counter(directory: Path) -> Application:
        store = StateStoreConfig("counts", directory=directory)
        props = {"decaton.commit.interval.ms": 100}
        return Application(process, topics=(topic,), state=store, properties=props)

    producer = await task_producer(topic)
    keys = ("a", "b", "c")

    async def each_key(count: int) -> int:
        for key in keys:
            end = await produce(producer, 0, count, key)
        return end

    await each_key(10)
    subs.append(
        kafka_broker.subscription(counter(tmp_path / "first"), group, fetch_loop=fetch_loop)
    )
    async with subs[-1]:
        await wait_until(lambda: counts == dict.fromkeys(keys, 10), what="10 per key")
    gate = Gate()
    activate = StateStore.activate

    def held_restore(store: StateStore, partition: int) -> Any:
        restored = activate(store, partition)

        async def restore() -> Any:
            stats = await restored
            await gate.pass_through()  # the restore ends only once the gate opens
            return stats

        return asyncio.ensure_future(restore())

    monkeypatch.setattr(StateStore, "activate", held_restore)
    subs.append(
        kafka_broker.subscription(counter(tmp_path / "second"), group, fetch_loop=fetch_loop)
    )
    async with subs[-1]:
        end, during = await while_held(
            gate, hook, ledger, tp, lambda: each_key(10), lambda: each_key(1)
        )
    ledger.check({0: end})
    assert early == []
    assert counts == dict.fromkeys(keys, 21)
    assert during == []  # why nothing is lost: a restoring partition is not fetched


async def test_records_fetched_while_a_checkpoint_loads_are_not_lost(
    kafka_broker: BrokerHandle,
    topic_factory: Any,
    task_producer: Any,
    hook: FetchHook,
    fetch_loop: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A first instance stops with offset 5 unfinished and 6..19 done (its checkpoint);
    the second's checkpoint load is held while records are produced. Nothing is lost
    and the checkpoint is kept (6..19 do not run again): the partition is not fetched
    while it loads, and the load seeks the partition to the committed offset."""
    topic = await topic_factory(partitions=1)
    tp = TopicPartition(topic, 0)
    group = f"ckpt-{uuid.uuid4().hex[:8]}"
    ledger = Ledger(topic, monkeypatch)
    stuck = asyncio.Event()
    seeks: list[int] = []  # where the fetch loop was told to start or go, per call

    def noted(real: Any) -> Any:
        def call(loop: Any, partition: TopicPartition, offset: int | None = None) -> None:
            if offset is not None:
                seeks.append(offset)
            real(loop, partition, offset)

        return call

    monkeypatch.setattr(AIOKafkaConsumer, "seek", noted(AIOKafkaConsumer.seek))
    monkeypatch.setattr(Fetcher, "assign", noted(Fetcher.assign))
    monkeypatch.setattr(Fetcher, "seek", noted(Fetcher.seek))

    async def process(ctx: ProcessingContext, task: bytes) -> None:
        if ctx.offset == 5 and not ledger.done[(0, 5)] and not stuck.is_set():
            await stuck.wait()  # unfinished when the first instance stops
            return
        ledger.finish(ctx)

    props = {"decaton.commit.interval.ms": 100, "decaton.processing.shutdown.timeout.ms": 200}
    producer = await task_producer(topic)
    await produce(producer, 0, 20)
    first = kafka_broker.subscription(
        Application(process, topics=(topic,), properties=props), group, fetch_loop=fetch_loop
    )
    async with first:
        await wait_until(lambda: len(ledger.done) == 19, what="19 tasks")
        await wait_until(lambda: ledger.committed.get(0) == 5, what="the commit at 5")
    stuck.set()  # the abandoned first try ends, into a closed partition
    gate = hold_loads(monkeypatch)
    async with kafka_broker.subscription(app(topic, ledger), group, fetch_loop=fetch_loop):
        end, during = await while_held(gate, hook, ledger, tp, *lots(producer, 0, 20, 5))
    ledger.check({0: end})
    assert [o for o in range(6, 20) if ledger.done[(0, o)] != 1] == []  # the checkpoint held
    # Why nothing is lost: nothing of a loading partition is fetched, and the load seeks
    # the partition to its commit (either alone would do).
    assert during == []
    assert seeks == [5, 5]  # the fetch starts at the commit; the load seeks there again


async def test_a_rewind_after_an_aborted_transaction_loses_no_record(
    kafka_broker: BrokerHandle,
    topic_factory: Any,
    task_producer: Any,
    hook: FetchHook,
    fetch_loop: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Exactly-once: the fetch routine is held in the middle of a batch (its first 32
    records fed, the rest waiting) while the partition's transaction is made to abort.
    The partition is rewound to its last commit and the rest of the batch is dropped;
    every input's output is still committed exactly once, because the rewind seeks the
    partition back (the dropped records and the aborted ones are fetched again)."""
    needs_transactions(kafka_broker)
    topic = await topic_factory(partitions=1)
    out = await topic_factory(partitions=1)
    tp = TopicPartition(topic, 0)
    group = f"rewind-{uuid.uuid4().hex[:8]}"
    seen: Counter[int] = Counter()
    aborting = True
    aborted = 0
    commit_transaction = AIOKafkaProducer.commit_transaction

    async def failing_commit(producer: AIOKafkaProducer) -> None:
        nonlocal aborted
        if aborting:
            aborted += 1
            raise KafkaError("a commit forced to fail")
        await commit_transaction(producer)

    monkeypatch.setattr(AIOKafkaProducer, "commit_transaction", failing_commit)

    async def process(ctx: ProcessingContext, task: bytes) -> None:
        seen[ctx.offset] += 1
        await ctx.produce(out, b"%d" % ctx.offset, key=ctx.key)

    eos = Application(
        process,
        topics=(topic,),
        exactly_once=True,
        properties={"decaton.commit.interval.ms": 100},
    )
    producer = await task_producer(topic)
    await produce(producer, 0, 100, key="k")  # one key: the batch's records run in turn
    hook.hold(1, lambda batch: len(batch.get(tp, [])) > 32)  # after the first 32 records
    async with kafka_broker.subscription(eos, group, fetch_loop=fetch_loop) as sub:
        await hook.held.wait()
        held = sub.partitions[tp]
        await wait_until(lambda: sub.partitions.get(tp) not in (None, held), what="the rewind")
        aborting = False
        hook.release.set()
        end = await produce(producer, 0, 20)
        await wait_until(
            lambda: sub.partitions[tp].last_committed == end, what="the commit at the end"
        )
    values = await read_committed(kafka_broker.bootstrap_servers, out, at_least=0)  # all there
    counts = Counter(int(v) for v in values)
    assert sorted(counts) == list(range(end)), f"{end - len(counts)} outputs missing"
    assert max(counts.values()) == 1
    assert aborted >= 1
    assert seen[0] == 2  # run in the aborted transaction, then again
