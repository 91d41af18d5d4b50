"""The quickstart demo run by ``make quickstart``: produce tasks and process them.

Starts the embedded broker, produces demo tasks with the task producer, processes them
with a subscription (per-key order, watermark commits) while showing progress, prints a
summary, and stops everything. Exit code 0 means every task was processed in key order
and committed.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import defaultdict

import msgspec

from decaton_aio import (
    Application,
    ConsumerConfig,
    EmbeddedBroker,
    JsonSerializer,
    ProcessingContext,
    ProducerConfig,
    Subscription,
    TaskProducer,
)
from decaton_aio.admin import TopicAdmin
from decaton_aio.testing import TEST_CONSUMER_SETTINGS, committed_offsets

TASKS = 20_000
KEYS = 500
PARTITIONS = 3


class PageView(msgspec.Struct, frozen=True):
    """A demo task: one user viewed one page."""

    user_id: int
    page: str
    seq: int


def _progress(label: str, done: int, total: int, started: float) -> None:
    rate = done / max(time.perf_counter() - started, 1e-9)
    end = "\n" if done >= total else "\r"
    print(f"  {label}: {done:>6}/{total} ({rate:,.0f}/s)", end=end, flush=True)


async def demo(bootstrap_servers: str) -> int:
    admin = TopicAdmin(bootstrap_servers)
    topic = await admin.create(PARTITIONS, name="quickstart-page-views")
    serializer = JsonSerializer(PageView)
    config = ProducerConfig(bootstrap_servers, application_id="quickstart")
    print(f"producing {TASKS} tasks over {KEYS} keys to {topic} ({PARTITIONS} partitions)")
    started = time.perf_counter()
    async with TaskProducer(config, topic, serializer) as producer:
        pending = []
        for seq in range(TASKS):
            task = PageView(user_id=seq % KEYS, page=f"/item/{seq % 97}", seq=seq)
            pending.append(await producer.submit(f"user-{task.user_id}", task))
            if (seq + 1) % 2000 == 0:
                await asyncio.gather(*pending)
                pending.clear()
                _progress("produced", seq + 1, TASKS, started)
        await asyncio.gather(*pending)
    produce_s = time.perf_counter() - started

    print("processing them with a subscription (2 ms of simulated I/O per task)")
    last_seq: dict[int, int] = defaultdict(lambda: -1)
    out_of_order = 0
    done = 0

    async def process(ctx: ProcessingContext, task: PageView) -> None:
        nonlocal done, out_of_order
        await asyncio.sleep(0.002)
        if task.seq <= last_seq[task.user_id]:
            out_of_order += 1
        last_seq[task.user_id] = task.seq
        done += 1

    app = Application(process, topics=(topic,), serializer=serializer, subscription_id="quickstart")
    consumer = ConsumerConfig(bootstrap_servers, "quickstart", **TEST_CONSUMER_SETTINGS)
    producer_config = ProducerConfig(bootstrap_servers)
    async with Subscription(app, consumer, producer=producer_config) as sub:
        started = time.perf_counter()
        while done < TASKS:
            await asyncio.sleep(0.25)
            if done == 0:
                started = time.perf_counter()  # the group join is not processing time
                continue
            pending = sum(p.pending for p in sub.partitions.values())
            rate = done / (time.perf_counter() - started)
            print(
                f"  processed {done:>6}/{TASKS}  {rate:>8,.0f} tasks/s  pending {pending:>5}",
                end="\r",
                flush=True,
            )
        process_s = time.perf_counter() - started
        print()
    committed = await committed_offsets(bootstrap_servers, "quickstart", topic, range(PARTITIONS))
    await admin.close(delete=False)

    print("summary")
    print(f"  tasks produced : {TASKS} in {produce_s:.2f}s ({TASKS / produce_s:,.0f}/s)")
    print(f"  tasks processed: {done} in {process_s:.2f}s ({done / process_s:,.0f}/s)")
    print(f"  keys           : {len(last_seq)}")
    print(f"  out of order   : {out_of_order}")
    print(f"  committed      : {sum(o or 0 for o in committed.values())} of {TASKS} offsets")
    ok = done == TASKS and out_of_order == 0 and sum(o or 0 for o in committed.values()) == TASKS
    print("  result         : " + ("OK" if ok else "FAILED"))
    return 0 if ok else 1


def main() -> int:
    with EmbeddedBroker() as broker:
        print(f"embedded broker on {broker.bootstrap_servers} (pid {broker.pid})")
        return asyncio.run(demo(broker.bootstrap_servers))


if __name__ == "__main__":
    sys.exit(main())
