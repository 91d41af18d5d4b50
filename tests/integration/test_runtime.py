"""The runtime against a real broker: order, watermark commits, back-pressure, rebalance."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections import defaultdict
from typing import Any

import pytest

import decaton_aio.consumer._subscription as subscription_module
from decaton_aio import Application, ProcessingContext, Subscription
from decaton_aio.consumer import SubscriptionState
from decaton_aio.testing import BrokerHandle, committed_offsets, drain, wait_until

pytestmark = pytest.mark.integration


async def produce(task_producer: Any, topic: str, count: int, keys: int) -> list[Any]:
    producer = await task_producer(topic)
    futures = [await producer.submit(f"key-{i % keys}", str(i).encode()) for i in range(count)]
    return list(await asyncio.gather(*futures))


async def test_all_tasks_processed_once_in_key_order(
    kafka_broker: BrokerHandle, topic_factory: Any, task_producer: Any
) -> None:
    """Given 3,000 tasks over 50 keys and a processor with random latency, every task is
    processed exactly once (no crash), per-key order holds, and the watermark is committed
    to the end of every partition."""
    topic = await topic_factory(partitions=3)
    produced = await produce(task_producer, topic, 3000, keys=50)

    async def process(ctx: ProcessingContext, task: bytes) -> None:
        await asyncio.sleep(random.random() * 0.003)

    app = Application(process, topics=(topic,), properties={"decaton.partition.concurrency": 64})
    group = f"order-{uuid.uuid4().hex[:8]}"
    result = await drain(app, kafka_broker.bootstrap_servers, expected=3000, group_id=group)
    result.assert_at_least_once(produced)
    result.assert_per_key_order()
    assert result.duplicates() == 0
    ends: dict[int, int] = defaultdict(int)
    for where in produced:
        ends[where.partition] = max(ends[where.partition], where.offset + 1)
    assert await committed_offsets(kafka_broker.bootstrap_servers, group, topic, ends) == ends


async def test_concurrency_bound_and_live_change(
    kafka_broker: BrokerHandle, topic_factory: Any, task_producer: Any
) -> None:
    """At most decaton.partition.concurrency tasks run per partition; raising it while
    running lets more start without a restart."""
    topic = await topic_factory(partitions=1)
    await produce(task_producer, topic, 400, keys=400)
    running = 0
    peak = 0
    release = asyncio.Event()

    async def process(ctx: ProcessingContext, task: bytes) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        try:
            await release.wait()
        finally:
            running -= 1

    app = Application(process, topics=(topic,), properties={"decaton.partition.concurrency": 5})
    async with kafka_broker.subscription(app) as sub:
        await wait_until(lambda: running == 5, what="5 running tasks")
        await asyncio.sleep(0.2)
        assert peak == 5
        assert sub.properties["decaton.partition.concurrency"].set(40)
        await wait_until(lambda: running == 40, what="40 running tasks")
        assert sub.properties["decaton.partition.concurrency"].set("not a number") is False
        release.set()
        await wait_until(lambda: sum(p.pending for p in sub.partitions.values()) == 0)
    assert peak == 40


async def test_back_pressure_bounds_pending_records(
    kafka_broker: BrokerHandle, topic_factory: Any, task_producer: Any
) -> None:
    """With a slow processor, pending records stay under max pending plus one fetch, and
    the partition is paused, then resumed until everything is processed."""
    topic = await topic_factory(partitions=1)
    await produce(task_producer, topic, 3000, keys=3000)
    done = 0

    async def process(ctx: ProcessingContext, task: bytes) -> None:
        nonlocal done
        await asyncio.sleep(0.002)
        done += 1

    max_pending, fetch = 200, 100
    app = Application(
        process,
        topics=(topic,),
        properties={
            "decaton.max.pending.records": max_pending,
            "decaton.partition.concurrency": 50,
        },
    )
    peak_pending = 0
    paused_seen = False
    async with kafka_broker.subscription(app, max_fetch_records=fetch) as sub:
        while done < 3000:
            for processor in sub.partitions.values():
                peak_pending = max(peak_pending, processor.pending)
                paused_seen |= processor.paused
            await asyncio.sleep(0.005)
    assert paused_seen
    assert max_pending <= peak_pending <= max_pending + fetch


@pytest.mark.parametrize(
    ("checkpoints", "metadata_max"),
    [(True, 4096), (True, 0), (False, 4096)],
    ids=["checkpoints", "checkpoint-topic", "no-checkpoints"],
)
async def test_commit_never_passes_an_unfinished_task(
    checkpoints: bool,
    metadata_max: int,
    kafka_broker: BrokerHandle,
    topic_factory: Any,
    task_producer: Any,
) -> None:
    """A stuck task holds the committed offset at its own offset while later tasks finish;
    a restart of the group redelivers it and nothing before it. With checkpoints (in the
    commit metadata, or in the checkpoint topic when the metadata may hold none) the tasks
    finished above it are not processed again; without, all of them are."""
    topic = await topic_factory(partitions=1)
    await produce(task_producer, topic, 50, keys=50)
    group = f"wm-{uuid.uuid4().hex[:8]}"
    stuck = asyncio.Event()
    finished: list[int] = []

    async def process(ctx: ProcessingContext, task: bytes) -> None:
        if ctx.offset == 7:
            await stuck.wait()
        finished.append(ctx.offset)

    app = Application(
        process,
        topics=(topic,),
        properties={
            "decaton.commit.interval.ms": 100,
            "decaton.processing.shutdown.timeout.ms": 200,
        },
        checkpoints=checkpoints,
    )
    async with kafka_broker.subscription(app, group, commit_metadata_max_bytes=metadata_max):
        await wait_until(lambda: len(finished) == 49, what="49 finished tasks")
        await asyncio.sleep(0.3)  # a few commit intervals
        committed = await committed_offsets(kafka_broker.bootstrap_servers, group, topic, [0])
        assert committed == {0: 7}
    # stopped with offset 7 unfinished: the commit still stops there
    committed = await committed_offsets(kafka_broker.bootstrap_servers, group, topic, [0])
    assert committed == {0: 7}
    stuck.set()

    redelivered: list[int] = []

    async def again(ctx: ProcessingContext, task: bytes) -> None:
        redelivered.append(ctx.offset)

    expected = [7] if checkpoints else list(range(7, 50))
    result = await drain(
        Application(again, topics=(topic,), checkpoints=checkpoints),
        kafka_broker.bootstrap_servers,
        expected=len(expected),
        group_id=group,
    )
    assert min(t.offset for t in result.processed) == 7
    assert sorted(redelivered) == expected


async def test_failing_processor_is_counted_and_does_not_stop(
    kafka_broker: BrokerHandle, topic_factory: Any, task_producer: Any
) -> None:
    """Processor exceptions are logged and counted; the tasks complete and processing
    goes on; the metrics show the counts."""
    topic = await topic_factory(partitions=2)
    await produce(task_producer, topic, 200, keys=10)

    async def process(ctx: ProcessingContext, task: bytes) -> None:
        if int(task) % 4 == 0:
            raise RuntimeError("storage unavailable")

    sub = kafka_broker.subscription(Application(process, topics=(topic,)))
    async with sub:
        await wait_until(
            lambda: sum(p.stats.processed for p in sub.partitions.values()) == 200,
            what="200 processed",
        )
        errors = sum(p.stats.errors for p in sub.partitions.values())
        text = sub.metrics.render().decode()
    assert errors == 50
    assert "decaton_tasks_error_total" in text
    assert sub.state is SubscriptionState.TERMINATED


async def test_state_transitions_are_observable(
    kafka_broker: BrokerHandle, topic_factory: Any
) -> None:
    """The subscription goes INITIALIZING -> RUNNING -> ... -> SHUTTING_DOWN -> TERMINATED
    and tells its listeners."""
    topic = await topic_factory(partitions=1)

    async def process(ctx: ProcessingContext, task: bytes) -> None:
        return None

    sub = kafka_broker.subscription(Application(process, topics=(topic,)))
    states: list[SubscriptionState] = []
    sub.on_state_change(states.append)
    assert sub.state is SubscriptionState.INITIALIZING
    await sub.start()
    await wait_until(lambda: bool(sub.partitions), what="assignment")
    assert sub.state is SubscriptionState.RUNNING
    await sub.stop()
    assert states[0] is SubscriptionState.RUNNING
    assert states[-2:] == [SubscriptionState.SHUTTING_DOWN, SubscriptionState.TERMINATED]
    await sub.stop()  # idempotent


async def test_a_stop_during_an_assignment_leaves_no_client_or_partition_open(
    kafka_broker: BrokerHandle, topic_factory: Any
) -> None:
    """A subscription stopped while its rebalance listener still loads the checkpoints of
    the assigned partitions closes the checkpoint store after that listener ended: the
    store has no client left open (its connections would leak). The partition whose load
    ended during the stop is closed, not left live after the stop (its gauges retired)."""
    topic = await topic_factory(partitions=1)

    async def process(ctx: ProcessingContext, task: bytes) -> None:
        return None

    sub = kafka_broker.subscription(Application(process, topics=(topic,)))
    store = sub._committer.store
    assert store is not None
    loading, resume = asyncio.Event(), asyncio.Event()
    load, close = store.load, store.close

    async def held_load(tps: Any) -> Any:
        loading.set()
        await resume.wait()
        return await load(tps)

    # The held listener goes on as soon as the stop closes either of the two: the store
    # (too early: the listener opens it again) or the membership (which waits for it).
    async def close_store() -> None:
        await close()
        resume.set()

    store.load = held_load  # type: ignore[method-assign]
    store.close = close_store  # type: ignore[method-assign]
    made: list[Any] = []
    new = sub._assignment.new

    def new_partition(tp: Any) -> Any:
        made.append(new(tp))
        return made[-1]

    sub._assignment.new = new_partition  # type: ignore[method-assign]
    await sub.start()
    membership = sub._membership
    assert membership is not None
    stop_membership = membership.stop

    async def leave(*, leave: bool = True) -> None:
        resume.set()
        await stop_membership(leave=leave)

    membership.stop = leave  # type: ignore[method-assign]
    try:
        async with asyncio.timeout(60):
            await loading.wait()  # the first assignment's listener
            await sub.stop()
        assert store._admin is None
        assert store._producer is None
        assert sub.partitions == {}
        assert [p.closed for p in made] == [True]
        page = sub.metrics.render().decode()
        assert 'decaton_partition_tasks_pending{partition="0",' not in page
    finally:
        await close()  # what the listener may have opened after the store closed


async def test_a_stop_during_the_start_stops_what_the_start_made(
    kafka_broker: BrokerHandle, topic_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """stop() called while start() joins the group waits for the start to end and then
    stops everything it made: no routine of the subscription is left running."""
    topic = await topic_factory(partitions=1)

    async def process(ctx: ProcessingContext, task: bytes) -> None:
        return None

    entered, release = asyncio.Event(), asyncio.Event()
    made = subscription_module.new_membership

    def held_membership(*args: Any, **kwargs: Any) -> Any:
        membership = made(*args, **kwargs)
        start = membership.start

        async def held_start(listener: Any) -> None:
            entered.set()
            await release.wait()
            await start(listener)

        membership.start = held_start  # type: ignore[method-assign]
        return membership

    monkeypatch.setattr(subscription_module, "new_membership", held_membership)
    sub = kafka_broker.subscription(Application(process, topics=(topic,)))
    async with asyncio.timeout(60):
        starting = asyncio.create_task(sub.start())
        await entered.wait()
        stopping = asyncio.create_task(sub.stop())
        await wait_until(lambda: sub._stop_requested.is_set(), what="the stop asked for")
        assert not stopping.done()  # it waits for the start
        release.set()
        await starting
        await stopping
    assert sub.state is SubscriptionState.TERMINATED
    left = [t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith("decaton-")]
    assert left == []


async def test_rebalance_hands_over_and_stale_tasks_commit_nothing(
    kafka_broker: BrokerHandle, topic_factory: Any, task_producer: Any
) -> None:
    """When a second member joins (the classic protocol: every member gives up every
    partition), the first revokes its partitions: it waits up to the rebalance timeout,
    commits its watermark, and drops the rest, which is redelivered. A task still running
    past the timeout completes later without committing anything."""
    topic = await topic_factory(partitions=2)
    produced = await produce(task_producer, topic, 100, keys=100)
    group = f"rb-{uuid.uuid4().hex[:8]}"
    stuck = asyncio.Event()
    first_try: set[tuple[int, int]] = set()
    stale_finished: list[tuple[int, int]] = []
    done_by: dict[str, set[tuple[int, int]]] = defaultdict(set)

    def processor(name: str) -> Any:
        async def process(ctx: ProcessingContext, task: bytes) -> None:
            where = (ctx.partition, ctx.offset)
            if ctx.offset == 10 and where not in first_try:
                first_try.add(where)
                await stuck.wait()  # outlives the rebalance timeout
                stale_finished.append(where)
            done_by[name].add(where)

        return process

    props = {"decaton.group.rebalance.timeout.ms": 300, "decaton.commit.interval.ms": 100}
    a = kafka_broker.subscription(
        Application(processor("a"), topics=(topic,), properties=props),
        group,
        group_protocol="classic",
    )
    b = kafka_broker.subscription(
        Application(processor("b"), topics=(topic,), properties=props),
        group,
        group_protocol="classic",
    )
    async with a:
        await wait_until(lambda: len(first_try) == 2, what="both stuck tasks")
        before_rebalance = dict(a.partitions)  # where the stuck tasks run
        async with b:
            everything = {(w.partition, w.offset) for w in produced}
            await wait_until(
                lambda: done_by["a"] | done_by["b"] >= everything,
                timeout_s=40,
                what="every task processed",
            )
            assert len(a.partitions) + len(b.partitions) == 2
            stale = list(before_rebalance.values())
            assert all(p.closed for p in stale)  # every assignment after the join is fresh
            watermarks = [(p.committable(), p.last_committed) for p in stale]
            stuck.set()  # the abandoned first tries finish now, into closed partitions
            await wait_until(lambda: len(stale_finished) == 2, what="the stale tasks' end")
            # They moved no watermark and committed nothing.
            assert [(p.committable(), p.last_committed) for p in stale] == watermarks
            assert all(p.committable() is None or p.committable() <= 10 for p in stale)
            ends = {0: 0, 1: 0}
            for w in produced:
                ends[w.partition] = max(ends[w.partition], w.offset + 1)
            await wait_until(lambda: _committed_all(a, b, ends), what="final commits")


async def test_on_the_consumer_protocol_a_join_moves_only_what_it_must(
    kafka_broker: BrokerHandle, topic_factory: Any, task_producer: Any
) -> None:
    """When a second member joins on the consumer protocol, the first gives up half of its
    partitions (drained and committed) and keeps the others running: their processors are
    the same objects, never paused for the join; every task is processed and committed,
    and the reconciliations are counted."""
    from decaton_aio.offsets import group_positions

    if kafka_broker.flavor == "tansu":
        pytest.skip("Tansu does not serve the consumer group protocol")

    topic = await topic_factory(partitions=4)
    produced = await produce(task_producer, topic, 200, keys=50)
    group = f"inc-{uuid.uuid4().hex[:8]}"
    done: set[tuple[int, int]] = set()

    async def process(ctx: ProcessingContext, task: bytes) -> None:
        done.add((ctx.partition, ctx.offset))

    props = {"decaton.commit.interval.ms": 100}
    a = kafka_broker.subscription(
        Application(process, topics=(topic,), properties=props),
        group,
        group_protocol="consumer",
    )
    b = kafka_broker.subscription(
        Application(process, topics=(topic,), properties=props),
        group,
        group_protocol="consumer",
    )
    async with a:
        await wait_until(lambda: len(a.partitions) == 4, what="the first member's partitions")
        before = dict(a.partitions)
        async with b:
            await wait_until(
                lambda: len(a.partitions) == 2 and len(b.partitions) == 2,
                timeout_s=40,
                what="the partitions shared",
            )
            kept = {tp for tp in a.partitions if tp in before}
            assert len(kept) == 2
            assert all(a.partitions[tp] is before[tp] for tp in kept)  # never restarted
            assert all(before[tp].closed for tp in set(before) - kept)
            everything = {(w.partition, w.offset) for w in produced}
            await wait_until(lambda: done >= everything, timeout_s=40, what="every task")
            ends = [0] * 4
            for w in produced:
                ends[w.partition] = max(ends[w.partition], w.offset + 1)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30
            while [
                p.committed
                for p in await group_positions(kafka_broker.bootstrap_servers, group, topic)
            ] != ends:
                assert loop.time() < deadline, "the group's commits did not reach the ends"
                await asyncio.sleep(0.1)
            assert a.stats.partitions_revoked == 2
            assert a.stats.assigned_partitions == 2
            assert a.stats.member_epoch > 0


def _committed_all(a: Subscription, b: Subscription, ends: dict[int, int]) -> bool:
    owned = {tp.partition: p for sub in (a, b) for tp, p in sub.partitions.items()}
    return all(owned.get(part) and owned[part].last_committed == end for part, end in ends.items())


async def test_a_position_that_goes_back_starts_the_partition_again(
    kafka_broker: BrokerHandle, topic_factory: Any, task_producer: Any
) -> None:
    """When the consumer's position goes back (here a seek, as a reset or a recreated
    topic would do), the partition starts again from there: the tasks are processed
    again, the subscription keeps running, and commits reach the end again."""
    topic = await topic_factory(partitions=1)
    await produce(task_producer, topic, 20, keys=4)
    seen: list[int] = []

    async def process(ctx: ProcessingContext, task: bytes) -> None:
        seen.append(ctx.offset)

    app = Application(process, topics=(topic,), properties={"decaton.commit.interval.ms": 100})
    async with kafka_broker.subscription(app) as sub:
        await wait_until(lambda: len(seen) == 20, what="the first pass")
        ((tp, first),) = sub.partitions.items()
        await wait_until(lambda: first.last_committed == 20, what="the first commit")
        assert sub._assigned_fetcher is not None
        sub._assigned_fetcher.seek(tp, 5)
        await wait_until(lambda: len(seen) == 35, what="the second pass from offset 5")
        assert seen[20:] == list(range(5, 20))
        assert sub.state is SubscriptionState.RUNNING
        assert first.closed
        assert sub.partitions[tp] is not first
        await wait_until(lambda: sub.partitions[tp].last_committed == 20, what="commits again")


async def test_a_deleted_and_recreated_topic_is_processed_from_its_start(
    kafka_broker: BrokerHandle, task_producer: Any
) -> None:
    """The task topic is deleted and created again with new tasks while a subscription
    runs: the new tasks are all processed and the group's commits reach the new end."""
    if kafka_broker.flavor == "tansu":
        pytest.skip("Tansu's topic deletion does not reset the partition's offsets")
    from decaton_aio.admin import TopicAdmin
    from decaton_aio.offsets import group_positions

    admin = TopicAdmin(kafka_broker.bootstrap_servers)
    topic = await admin.create(1, prefix="recreated")
    await produce(task_producer, topic, 30, keys=3)
    seen: list[bytes] = []

    async def process(ctx: ProcessingContext, task: bytes) -> None:
        seen.append(task)

    group = f"recreated-{uuid.uuid4().hex[:8]}"
    app = Application(process, topics=(topic,), properties={"decaton.commit.interval.ms": 100})
    try:
        # A recreated topic is noticed at the next metadata refresh: 1 s here.
        async with kafka_broker.subscription(app, group, metadata_max_age_ms=1000) as sub:

            async def committed_to(end: int, what: str) -> None:
                # Until the group's commit is the topic's end, checked on the broker.
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 30
                while [
                    (p.committed, p.lag)
                    for p in await group_positions(kafka_broker.bootstrap_servers, group, topic)
                ] != [(end, 0)]:
                    assert loop.time() < deadline, what
                    await asyncio.sleep(0.1)

            await wait_until(lambda: len(seen) == 30, what="the first topic's tasks")
            # Deleted once the group committed the first topic's end: the revoke then has
            # nothing to commit on the deleted topic (a commit the client retries there
            # delayed the rejoin, whose assignment could still name the deleted topic).
            await committed_to(30, "the first topic's commit did not come")
            (tp, first), *_ = sub.partitions.items()
            await admin.close()  # deletes the topic
            admin = TopicAdmin(kafka_broker.bootstrap_servers)
            # The partition is revoked; a client's metadata request may create the topic
            # again at once (the embedded broker creates topics on request), so the revoke
            # shows as a new partition processor or none, not always as none.
            await wait_until(
                lambda: sub.partitions.get(tp) is not first, timeout_s=30, what="the revoke"
            )
            await admin.create(1, name=topic)
            producer = await task_producer(topic)
            fresh = [f"new-{i}".encode() for i in range(10)]
            for i, task in enumerate(fresh):
                await producer.put(f"k{i % 3}", task)
            await wait_until(lambda: set(fresh) <= set(seen), timeout_s=60, what="new tasks")
            await committed_to(10, "the commits did not reach the new end")
    finally:
        await admin.close()


async def test_a_fetch_batch_is_fed_in_steps_and_the_waits_are_measured(
    kafka_broker: BrokerHandle,
    topic_factory: Any,
    task_producer: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a step budget of zero every 32 records of a fetch batch are a step of their
    own (the loop runs in between), every task is still processed once in key order, and
    the metrics page shows the loop's lag and where tasks waited: behind their key (lane),
    for a slot, and for fetch and feed."""
    from decaton_aio.consumer import _loopwatch

    monkeypatch.setattr(_loopwatch, "STEP_BUDGET_S", 0.0)
    topic = await topic_factory(partitions=1)
    produced = await produce(task_producer, topic, 1000, keys=20)
    seen: list[int] = []

    async def process(ctx: ProcessingContext, task: bytes) -> None:
        seen.append(int(task))
        await asyncio.sleep(0.001)

    app = Application(process, topics=(topic,), properties={"decaton.partition.concurrency": 8})
    async with kafka_broker.subscription(app) as sub:
        await wait_until(lambda: len(seen) >= 1000, what="every task processed")
        stats = sub.stats
        assert stats.step_duration.count >= 1000 // 32  # one step per 32 records at least
        assert stats.fetch_wait.count == stats.feed_wait.count >= 1000 // 32
        assert stats.loop_lag.count > 0
        (partition,) = sub.partitions.values()
        assert partition.stats.lane_wait.count > 0  # 20 keys, 8 slots: keys waited
        assert partition.stats.slot_wait.count > 0
        page = sub.metrics.render().decode()
        for family in ("event_loop_lag", "runtime_step_duration", "task_lane_wait"):
            assert f"decaton_{family}_seconds_count" in page
    assert len(produced) == 1000
    assert sorted(seen) == list(range(1000))  # each once (no rebalance, no crash)
    for key in range(20):  # per-key order: task i has key i % 20
        of_key = [i for i in seen if i % 20 == key]
        assert of_key == sorted(of_key)
