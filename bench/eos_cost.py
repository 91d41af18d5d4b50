"""What exactly-once costs beside the same outputs at-least-once, with what it holds open.

S1's shape in one process: no-op tasks, each producing one output, read from a topic of
``--partitions`` partitions that holds ``--tasks`` tasks before the subscription starts.
For each partition count and guarantee it prints one JSON line: tasks/s over the middle
80% of the tasks, the producers the instance runs and its TCP connections to the broker
(counted in the middle of the run), and the transactions committed per second.

    python -m bench.eos_cost --partitions 3 48 --tasks 200000

The broker is the one ``BrokerHandle.from_env`` gives (the embedded Apache Kafka unless
``DECATON_AIO_BOOTSTRAP_SERVERS`` names a cluster). ``python -m bench --only S1`` measures
the same shape against the other contenders, with a process per instance.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from pathlib import Path

from decaton_aio import Application, BytesSerializer, ProcessingContext, TaskProducer
from decaton_aio.testing import BrokerHandle

__all__ = ["broker_connections", "main", "measure"]


def broker_connections(port: int) -> int:
    """This process's established TCP connections to ``port``."""
    inodes = set()
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = 0
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            if fields[3] == "01" and remote_port == port and fields[9] in inodes:
                found += 1
    return found


async def measure(broker: BrokerHandle, partitions: int, tasks: int, exactly_once: bool) -> dict:
    """One run; its figures."""
    admin = broker.topic_admin()
    topic = f"eos-cost-{uuid.uuid4().hex[:8]}"
    out = f"{topic}-out"
    try:
        await admin.create(partitions, name=topic)
        await admin.create(partitions, name=out)
    finally:
        await admin.close(delete=False)  # the runs read and write them
    producer: TaskProducer[bytes] = TaskProducer(broker.producer_config(), topic, BytesSerializer())
    async with producer:
        for n in range(tasks):
            await producer.submit(f"k{n % 1000}".encode(), b"x")
        await producer.flush()
    done = 0
    marks: dict[int, float] = {}
    low, high = tasks // 10, tasks - tasks // 10
    halfway = asyncio.Event()
    finished = asyncio.Event()

    async def process(ctx: ProcessingContext, task: bytes) -> None:
        nonlocal done
        await ctx.produce(out, b"done", key=ctx.key)
        done += 1
        if done in (low, high):
            marks[done] = time.monotonic()
        if done == tasks // 2:
            halfway.set()
        if done == high:
            finished.set()

    app = Application(
        process,
        topics=(topic,),
        serializer=BytesSerializer(),
        exactly_once=exactly_once,
        properties={"decaton.partition.concurrency": 1000},
    )
    sub = broker.subscription(app)
    port = int(broker.bootstrap_servers.split(",")[0].rsplit(":", 1)[1])
    async with sub:
        await halfway.wait()
        connections = broker_connections(port)
        middle = time.monotonic()
        txn = sub._committer.txn
        commits_at_low = txn.commits if txn is not None else 0
        await finished.wait()
        commits = (txn.commits if txn is not None else 0) - commits_at_low
    window = marks[high] - marks[low]
    to_end = marks[high] - middle
    return {
        "partitions": partitions,
        "guarantee": "exactly-once" if exactly_once else "at-least-once",
        "tasks_per_s": round((high - low) / window),
        "producers": 2 if exactly_once else 1,  # the durable sender, and the transaction
        "broker_connections": connections,
        # from the middle of the run (when the connections were counted) to the high mark
        "transactions_per_s": round(commits / to_end, 2) if to_end > 0 else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.eos_cost", description=__doc__)
    parser.add_argument("--partitions", type=int, nargs="+", default=[3, 48])
    parser.add_argument("--tasks", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    broker = BrokerHandle.from_env()
    try:
        for _ in range(args.repeats):
            for partitions in args.partitions:
                for exactly_once in (False, True):
                    found = asyncio.run(measure(broker, partitions, args.tasks, exactly_once))
                    print(json.dumps(found), flush=True)
    finally:
        broker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
