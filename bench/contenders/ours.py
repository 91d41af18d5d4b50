"""Our runtime: one :class:`~decaton_aio.consumer.Subscription` consuming the topic.

Options (``spec.options``): ``concurrency`` (``decaton.partition.concurrency``),
``max_pending`` (``decaton.max.pending.records``), ``max_fetch_records``, for S6
``per_key_quota`` (``decaton.per.key.quota.processing.rate``), ``checkpoints`` (false:
commit without checkpoints) and ``exactly_once`` (true: each task produces one output to
``<topic>-out`` and commits in transactions), e.g. ``--set ours.exactly_once=true``.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from bench.recorder import Recorder, emit
from bench.workload import Spec, Task
from decaton_aio.admin import TopicAdmin
from decaton_aio.app import DEFAULT_MAX_FETCH_RECORDS, Application, ConsumerConfig
from decaton_aio.consumer import Subscription
from decaton_aio.consumer._runner import tune_gc
from decaton_aio.producer import ProducerConfig
from decaton_aio.properties import PARTITION_CONCURRENCY
from decaton_aio.serializers import JsonSerializer

__all__ = ["build_subscription", "main"]


def build_subscription(spec: Spec, process: Any) -> Subscription:
    """The subscription a contender run uses, from the spec's options."""
    opts = spec.options
    properties: dict[str, object] = {
        "decaton.partition.concurrency": int(
            opts.get("concurrency", PARTITION_CONCURRENCY.default)
        ),
        "decaton.max.pending.records": int(opts.get("max_pending", 10_000)),
    }
    extra: dict[str, Any] = {}
    if opts.get("per_key_quota") is not None:
        # Keys over the quota are shaped to <topic>-shaping, consumed by this subscription.
        properties["decaton.per.key.quota.processing.rate"] = int(opts["per_key_quota"])
        extra["shaping"] = True
    app = Application(
        process,
        topics=(spec.topic,),
        serializer=JsonSerializer(Task),
        properties=properties,
        subscription_id=f"bench-{spec.scenario.lower()}",
        checkpoints=bool(opts.get("checkpoints", True)),
        exactly_once=bool(opts.get("exactly_once", False)),
        **extra,
    )
    consumer = ConsumerConfig(
        spec.bootstrap,
        spec.group_id,
        session_timeout_ms=spec.session_timeout_ms,
        heartbeat_interval_ms=max(100, spec.session_timeout_ms // 10),
        max_fetch_records=int(opts.get("max_fetch_records", DEFAULT_MAX_FETCH_RECORDS)),
        security=spec.security,
    )
    # The subscription's producer only sends shaping records here.
    return Subscription(
        app, consumer, producer=ProducerConfig(spec.bootstrap, security=spec.security)
    )


async def main(spec: Spec, recorder: Recorder) -> None:
    tune_gc()  # as `python -m decaton_aio run` does
    process = recorder.processor()
    if spec.options.get("exactly_once"):
        process = await _with_output(spec, process)
    subscription = build_subscription(spec, process)
    await subscription.start()
    ticker = asyncio.create_task(recorder.ticker())
    if spec.paced:
        await _paced(spec, recorder, subscription)
    await recorder.wait()
    ticker.cancel()
    recorder.extra["runtime"] = {
        "paused_partitions_at_end": sum(p.paused for p in subscription.partitions.values()),
        "pending_at_end": sum(p.pending for p in subscription.partitions.values()),
    }


async def _with_output(spec: Spec, process: Any) -> Any:
    # Exactly-once runs emit one output per task, committed with the task's offset.
    admin = TopicAdmin(spec.bootstrap)
    out = await admin.create(spec.partitions, name=f"{spec.topic}-out")
    await admin.close(delete=False)

    async def emitting(ctx: Any, task: Task) -> None:
        await process(ctx, task)
        await ctx.produce(out, b"done", key=ctx.key)

    return emitting


async def _paced(spec: Spec, recorder: Recorder, subscription: Subscription) -> None:
    # Tell the orchestrator when every partition is assigned, then wait for its "done"
    # line (the number of ordinary-key tasks it produced) and drain up to spec.drain_s.
    loop = asyncio.get_running_loop()
    while True:
        assigned = [tp for tp in subscription.partitions if tp.topic == spec.topic]
        if len(assigned) >= spec.partitions:
            break
        await asyncio.sleep(0.05)
    emit({"event": "ready"})
    line = await loop.run_in_executor(None, sys.stdin.readline)
    expected = int(line.split()[1])
    recorder.others_done(expected)
    try:
        await asyncio.wait_for(recorder.wait(), spec.drain_s)
    except TimeoutError:
        recorder.force_close(f"drain timeout {spec.drain_s}s")
