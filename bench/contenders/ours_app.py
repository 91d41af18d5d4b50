"""Our contender: the application ``python -m decaton_aio run`` runs in the benchmark.

The harness starts ``python -m decaton_aio run bench.contenders.ours_app:app`` with the
topic, group and ``--property``/``--workers`` of the setting; the processor is the shared
body (:mod:`bench.body`), writing facts to ``$BENCH_FACTS_DIR``.
"""

from __future__ import annotations

from typing import Any

from bench.body import Body
from bench.workload import Task
from decaton_aio import Application, JsonSerializer

__all__ = ["app"]

_body = Body.from_env()


async def process(ctx: Any, task: Task) -> None:
    await _body.run(ctx.partition, ctx.offset, task)


app = Application(process, serializer=JsonSerializer(Task))
