"""Our contender: the application ``python -m decaton_aio run`` runs in the benchmark.

The harness starts ``python -m decaton_aio run bench.contenders.ours_app:app`` with the
topic, group and ``--property``/``--workers`` of the setting; the processor is the shared
body (:mod:`bench.body`), writing facts to ``$BENCH_FACTS_DIR``. Variants measure what a
feature costs: ``exactly_once_app`` (``--set ours.exactly_once=true``: each task produces
one output to ``<topic>-out``, committed with its offset in a transaction; the broker
creates that topic), ``outputs_app`` (``--set ours.outputs=true``: the same output
at-least-once, the comparison for exactly-once) and ``no_checkpoints_app``
(``--set ours.checkpoints=false``).
"""

from __future__ import annotations

from typing import Any

from bench.body import Body
from bench.workload import Task
from decaton_aio import Application, JsonSerializer

__all__ = ["app", "exactly_once_app", "no_checkpoints_app", "outputs_app"]

_body = Body.from_env()


async def process(ctx: Any, task: Task) -> None:
    await _body.run(ctx.partition, ctx.offset, task)


app = Application(process, serializer=JsonSerializer(Task))


async def process_with_output(ctx: Any, task: Task) -> None:
    await _body.run(ctx.partition, ctx.offset, task)
    await ctx.produce(f"{ctx.topic}-out", b"done", key=ctx.key)


exactly_once_app = Application(
    process_with_output, serializer=JsonSerializer(Task), exactly_once=True
)
outputs_app = Application(process_with_output, serializer=JsonSerializer(Task))
no_checkpoints_app = Application(process, serializer=JsonSerializer(Task), checkpoints=False)
