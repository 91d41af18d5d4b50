"""The runtime's per-task hot path without a broker, for instruction counts.

``python -m bench.hotpath --passes K`` builds a pool of real aiokafka record objects once
(the same C record type the runtime reads from a fetch: batches of 500 JSON tasks with a
``dt_meta`` header, 10,000 keys), then feeds the whole pool K times, each time into a fresh
partition processor (a new assignment), with a no-op processor, the executor and the
watermark as the runtime runs them, folding and reading the watermark every batch as the
commit routine would. Nothing waits, so the loop never sleeps.

``--sleep-ms D`` gives S1's shape instead: each task awaits ``asyncio.sleep(D / 1000)``,
384 run at once and the feed stops at 10,000 pending records until the partition asks to
resume, as the consumer's back-pressure does; workers, timers and the ready queue then
count too.

``--feed N`` hands the records to the partition N at a time (the fetch routine's step is
32) rather than a whole batch of 500 at once, and ``--paced`` (with ``--sleep-ms``) lets
each lot's tasks end before the next lot comes, as at a paced load, where a fetch brings a
few records and finds the workers of the last ones idle.

Wall-clock time on a shared machine is noise; instruction counts are not. Run it under
callgrind twice and subtract, so the pool's construction and the interpreter's start
cancel out::

    valgrind --tool=callgrind --callgrind-out-file=/dev/null python -m bench.hotpath --passes 1
    valgrind --tool=callgrind --callgrind-out-file=/dev/null python -m bench.hotpath --passes 3

(instructions of 3 passes - instructions of 1 pass) / (2 * tasks per pass) is the cost of
one task in instructions (``Collected`` in valgrind's summary line). ``--measure`` does
exactly that and prints the figure (``make bench-hotpath``; needs valgrind).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import re
import shutil
import subprocess
import sys
from typing import Any

import msgspec
from aiokafka import TopicPartition

from decaton_aio._aiokafka import DefaultRecordBatchBuilder, MemoryRecords, PartitionRecords
from decaton_aio.consumer._execution import TaskExecutor
from decaton_aio.consumer._partition import PartitionProcessor
from decaton_aio.consumer._records import RAW_RECORDS, install_raw_records
from decaton_aio.consumer._runner import install_event_loop_policy
from decaton_aio.context import ProcessingContext
from decaton_aio.metadata import METADATA_HEADER, TaskMetadata, encode_metadata
from decaton_aio.metrics import PartitionStats
from decaton_aio.properties import Properties
from decaton_aio.serializers import JsonSerializer

__all__ = ["main"]

TP = TopicPartition("hotpath", 0)
BATCH = 500
KEYS = 10_000


class Task(msgspec.Struct):
    k: int
    s: int
    d: int


async def _noop(ctx: ProcessingContext, task: Task) -> None:
    return None


def _sleeping(sleep_s: float) -> Any:
    async def process(ctx: ProcessingContext, task: Task) -> None:
        await asyncio.sleep(sleep_s)

    return process


def _pool(tasks: int) -> list[list[Any]]:
    install_raw_records()
    meta = encode_metadata(TaskMetadata(timestamp_ms=1_700_000_000_000))
    encode = msgspec.json.encode
    batches = []
    for first in range(0, tasks, BATCH):
        builder = DefaultRecordBatchBuilder(
            magic=2, compression_type=0, is_transactional=False,
            producer_id=-1, producer_epoch=-1, base_sequence=-1, batch_size=1 << 22,
        )  # fmt: skip
        for i in range(min(BATCH, tasks - first)):
            offset = first + i
            key = offset % KEYS
            builder.append(
                offset,
                timestamp=1_700_000_000_000,
                key=b"%d" % key,
                value=encode(Task(key, offset // KEYS, 0)),
                headers=[(METADATA_HEADER, meta)],
            )
        fetched = PartitionRecords(
            TP, MemoryRecords(bytes(builder.build())), [], first, RAW_RECORDS, None,
            check_crcs=False, isolation_level=0,
        )  # fmt: skip
        batch = list(fetched)
        assert [r.offset for r in batch] == list(range(first, first + len(batch)))
        batches.append(batch)
    return batches


async def _run(
    pool: list[list[Any]], passes: int, sleep_ms: float, feed: int = 0, paced: bool = False
) -> int:
    limit, max_pending = (384, 10_000) if sleep_ms else (100, 1 << 30)
    executor = TaskExecutor(
        subscription_id="hotpath",
        process=_sleeping(sleep_ms / 1000) if sleep_ms else _noop,
        decode=JsonSerializer(Task).decode,
        sender=None,
        properties=Properties({"decaton.partition.concurrency": limit}),
    )
    resumed = asyncio.Event()

    def resume(partition: PartitionProcessor) -> None:
        partition.set_paused(False)
        resumed.set()

    done = 0
    for _ in range(passes):
        stats = PartitionStats()
        partition = PartitionProcessor(
            TP,
            executor=executor,
            limit=limit,
            max_pending=max_pending,
            stats=stats,
            on_below_max_pending=resume,
        )
        for whole in pool:
            for batch in _chunks(whole, feed):
                partition.feed(batch)
                if paced:  # a paced load: the lot's tasks end before the next arrives
                    await _until_idle(partition, sleep_ms)
            for histogram in partition.fold_stats():  # as the committer folds them
                histogram.fold()
            partition.committable()
            if partition.needs_pause:
                partition.set_paused(True)
                resumed.clear()
                await resumed.wait()
        await _until_idle(partition, sleep_ms)  # the last tasks still sleep
        done += stats.processed
    return done


def _chunks(batch: list[Any], size: int) -> list[list[Any]]:
    if not size:
        return [batch]
    return [batch[i : i + size] for i in range(0, len(batch), size)]


async def _until_idle(partition: PartitionProcessor, sleep_ms: float) -> None:
    idle = asyncio.Event()
    while partition.pending:
        idle.clear()
        asyncio.get_running_loop().call_later(sleep_ms / 1000, idle.set)
        await idle.wait()


def _instructions(passes: int, tasks: int, sleep_ms: float, feed: int, paced: bool) -> int:
    argv = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable]
    argv += ["-m", "bench.hotpath", "--passes", str(passes), "--tasks", str(tasks)]
    argv += ["--sleep-ms", str(sleep_ms), "--feed", str(feed)] + (["--paced"] if paced else [])
    # The same dict layouts in every run; and no BLAS thread pool: numpy (the histograms'
    # bucketing) starts one that the runtime never uses, whose idle threads spin for a
    # while under valgrind and add a few hundred instructions per task, differently each run.
    env = {**os.environ, "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1"}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=True)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise SystemExit(f"no instruction count in valgrind's output:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def measure(tasks: int, sleep_ms: float = 0, feed: int = 0, paced: bool = False) -> int:
    """Instructions per task: two runs under callgrind, one pass and three passes."""
    if shutil.which("valgrind") is None:
        raise SystemExit("--measure needs valgrind (apt-get install valgrind)")
    one = _instructions(1, tasks, sleep_ms, feed, paced)
    three = _instructions(3, tasks, sleep_ms, feed, paced)
    per_task = (three - one) // (2 * tasks)
    print(f"1 pass: {one} instructions, 3 passes: {three}; per task: {per_task}")
    return per_task


def main(argv: list[str] | None = None) -> int:
    """Run the passes and print how many tasks were processed (or ``--measure``)."""
    parser = argparse.ArgumentParser(prog="python -m bench.hotpath")
    parser.add_argument("--passes", type=int, default=1)
    parser.add_argument("--tasks", type=int, default=100_000, help="tasks per pass")
    parser.add_argument(
        "--sleep-ms", type=float, default=0, help="each task sleeps this long (S1's shape)"
    )
    parser.add_argument(
        "--feed", type=int, default=0, metavar="N", help="feed N records at a time (default 500)"
    )
    parser.add_argument(
        "--paced", action="store_true", help="each lot's tasks end before the next is fed"
    )
    parser.add_argument(
        "--measure", action="store_true", help="print instructions per task (callgrind)"
    )
    args = parser.parse_args(argv)
    if args.measure:
        measure(args.tasks, args.sleep_ms, args.feed, args.paced)
        return 0
    gc.set_threshold(50_000, 20, 100)  # as the runtime's tune_gc
    pool = _pool(args.tasks)
    install_event_loop_policy()  # as the runtime's event loop
    if args.paced and not args.sleep_ms:
        parser.error("--paced needs --sleep-ms (a no-op task ends before the next lot anyway)")
    done = asyncio.run(_run(pool, args.passes, args.sleep_ms, args.feed, args.paced))
    expected = args.passes * args.tasks
    if done != expected:
        raise SystemExit(f"processed {done} tasks, expected {expected}")
    print(f"processed {done} tasks in {args.passes} passes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
