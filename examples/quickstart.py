"""The quickstart demo run by ``make run``.

Starts the embedded broker, produces demo tasks with the task producer, reads them back,
checks each one's ``dt_meta`` metadata and key order, prints a summary, and stops
everything. Exit code 0 means every task came back intact.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import defaultdict

import msgspec

from decaton_aio import (
    EmbeddedBroker,
    JsonSerializer,
    ProducerConfig,
    TaskProducer,
    metadata_from_headers,
)
from decaton_aio.testing import TopicAdmin, read_records

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
    config = ProducerConfig(bootstrap_servers, idempotence=False, application_id="quickstart")
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

    print("reading them back")
    started = time.perf_counter()
    records = await read_records(bootstrap_servers, topic, TASKS, timeout_s=60)
    _progress("read", len(records), TASKS, started)
    read_s = time.perf_counter() - started
    await admin.close(delete=False)

    last_seq: dict[bytes, int] = defaultdict(lambda: -1)
    out_of_order = missing_meta = 0
    for record in records:
        meta = metadata_from_headers(record.headers, record.timestamp)
        if meta.source_application_id != "quickstart":
            missing_meta += 1
        task = serializer.decode(record.value)
        assert record.key is not None
        if task.seq <= last_seq[record.key]:
            out_of_order += 1
        last_seq[record.key] = task.seq
    print("summary")
    print(f"  tasks produced : {TASKS} in {produce_s:.2f}s ({TASKS / produce_s:,.0f}/s)")
    print(f"  tasks read     : {len(records)} in {read_s:.2f}s ({len(records) / read_s:,.0f}/s)")
    print(f"  keys           : {len(last_seq)}")
    print(f"  out of order   : {out_of_order}")
    print(f"  bad metadata   : {missing_meta}")
    ok = len(records) == TASKS and out_of_order == 0 and missing_meta == 0
    print("  result         : " + ("OK" if ok else "FAILED"))
    return 0 if ok else 1


def main() -> int:
    with EmbeddedBroker() as broker:
        print(f"embedded broker on {broker.bootstrap_servers} (pid {broker.pid})")
        return asyncio.run(demo(broker.bootstrap_servers))


if __name__ == "__main__":
    sys.exit(main())
