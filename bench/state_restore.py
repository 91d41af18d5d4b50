"""Restore figures of per-key state: ``python -m bench.state_restore [--records N]``.

On an embedded Apache Kafka broker, two instances of a counting application (one state
store, SQLite copies in their own directories) share a two-partition task topic. N tasks
(100,000 by default) go to partition 0 over 20,000 keys, so its changelog partition holds N
records. Then the instance owning partition 0 stops and the other one takes it over; the
figures of that restore are printed for ``num_standby_replicas`` 1 and 0, with a cold
restore (an in-memory copy, the whole changelog) and the cost of the local copy's get and
acknowledged set.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import uuid
from pathlib import Path

from decaton_aio import Application, ProcessingContext, StateStoreConfig, Subscription
from decaton_aio.admin import TopicAdmin
from decaton_aio.app import ConsumerConfig
from decaton_aio.consumer.state import LocalStore
from decaton_aio.embedded import EmbeddedBroker
from decaton_aio.producer import DurableSender, ProducerConfig

KEYS = 20_000


def counting(topic: str, store: StateStoreConfig, done: list[int]) -> Application:
    async def process(ctx: ProcessingContext, task: bytes) -> None:
        ctx.state.set(ctx.state.get(0) + 1)
        done[0] += 1

    return Application(
        process, topics=(topic,), state=store, properties={"decaton.partition.concurrency": 256}
    )


async def wait_for(predicate: object, timeout_s: float = 900.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise TimeoutError("the benchmark did not finish in time")
        await asyncio.sleep(0.1)


def subscription(bootstrap: str, group: str, app: Application) -> Subscription:
    consumer = ConsumerConfig(bootstrap, group, session_timeout_ms=6000, heartbeat_interval_ms=500)
    return Subscription(app, consumer, producer=ProducerConfig(bootstrap, idempotence=False))


async def failover(bootstrap: str, records: int, standbys: int, directory: Path) -> None:
    admin = TopicAdmin(bootstrap)
    topic = await admin.create(2, prefix="state-bench")
    group = f"state-bench-{uuid.uuid4().hex[:8]}"
    done = [0]
    subs = [
        subscription(
            bootstrap,
            group,
            counting(
                topic,
                StateStoreConfig(
                    "counts", directory=directory / f"{standbys}-{i}", num_standby_replicas=standbys
                ),
                done,
            ),
        )
        for i in range(2)
    ]
    for sub in subs:
        await sub.start()
    await wait_for(lambda: all(len(s.partitions) == 1 for s in subs))
    started = time.monotonic()
    async with DurableSender(ProducerConfig(bootstrap, idempotence=False, linger_ms=20)) as sender:
        futures = [
            await sender.submit(topic, b"1", key=f"k{i % KEYS}".encode(), partition=0)
            for i in range(records)
        ]
        await asyncio.gather(*futures)
    await wait_for(lambda: done[0] >= records)
    took = time.monotonic() - started
    owner = next(s for s in subs if any(tp.partition == 0 for tp in s.partitions))
    survivor = next(s for s in subs if s is not owner)
    store = survivor.state_store
    assert store is not None
    lag = -1
    if standbys:
        copy = store.store(0)
        lag = records - copy.position if copy is not None else records
    before = len(store.reader.history)
    stopped = time.monotonic()
    await owner.stop()
    await wait_for(lambda: any(h.partition == 0 for h in store.reader.history[before:]))
    (restore,) = [h for h in store.reader.history[before:] if h.partition == 0]
    print(
        f"standbys={standbys}: {records} tasks processed in {took:.1f} s; failover of "
        f"partition 0 (changelog end {restore.end_offset}): replayed {restore.replayed} "
        f"records in {restore.seconds:.2f} s; stop to restored "
        f"{time.monotonic() - stopped:.2f} s"
        + (f"; the standby was {lag} records behind when the owner stopped" if standbys else "")
    )
    await survivor.stop()

    # A cold restore: an in-memory copy reads the whole changelog partition.
    cold_done = [0]
    cold = subscription(bootstrap, group, counting(topic, StateStoreConfig("counts"), cold_done))
    await cold.start()
    cold_store = cold.state_store
    assert cold_store is not None
    await wait_for(lambda: any(h.partition == 0 for h in cold_store.reader.history))
    (full,) = [h for h in cold_store.reader.history if h.partition == 0]
    print(f"  cold restore: replayed {full.replayed} records in {full.seconds:.2f} s")
    await cold.stop()
    await admin.close()


def local_costs(directory: Path) -> None:
    store = LocalStore(directory / "cost.sqlite")
    n = 50_000
    started = time.perf_counter()
    for i in range(n):
        write = store.begin()
        store.acked(write, f"k{i % KEYS}".encode(), b"\x01", i)
    set_us = (time.perf_counter() - started) / n * 1e6
    store.flush()
    started = time.perf_counter()
    for i in range(n):
        store.get(f"k{i % KEYS}".encode())
    get_us = (time.perf_counter() - started) / n * 1e6
    started = time.perf_counter()
    for i in range(200):
        store.replay(b"k", b"\x02", n + i)
        store.flush()
    flush_us = (time.perf_counter() - started) / 200 * 1e6
    store.close()
    print(
        f"local copy: get {get_us:.1f} us, acknowledged set {set_us:.1f} us, "
        f"flush (commit with checkpoint) {flush_us:.0f} us"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        local_costs(Path(tmp))
        async with EmbeddedBroker() as broker:
            for standbys in (1, 0):
                await failover(broker.bootstrap_servers, args.records, standbys, Path(tmp))


if __name__ == "__main__":
    asyncio.run(main())
