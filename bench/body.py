"""The processor body every Python contender runs, and the process a Python peer runs in.

The body decodes the task (msgspec, into :class:`~bench.workload.Task`), does the
simulated I/O (``asyncio.sleep`` of ``d`` ms; a no-op task never suspends) and writes the
task's facts (:mod:`bench.taskfacts`). Our runtime decodes with its serializer and calls
:meth:`Body.run`; the peers hand the record's bytes to :meth:`Body.run_raw`.

``python -m bench.body '<RunSpec json>'`` runs one peer until it is killed: uvloop, the
benchmark's one garbage collector policy for every Python contender (the thresholds
``python -m decaton_aio run`` sets, see :data:`GC_POLICY`), then the contender module's
``main(spec, body)`` (or ``run_blocking`` for a peer that owns its event loop).
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import os
import sys
import time
from typing import Any

import msgspec

from bench.taskfacts import FactsWriter
from bench.workload import RunSpec, Task

__all__ = ["FACTS_ENV_VAR", "GC_POLICY", "Body", "apply_gc_policy", "main"]

#: Where :meth:`Body.from_env` finds the facts directory (our app under the CLI).
FACTS_ENV_VAR = "BENCH_FACTS_DIR"

#: ``gc.set_threshold`` for every Python contender: what our CLI sets for itself
#: (``decaton_aio.consumer.tune_gc``), applied to the peers too.
GC_POLICY = (50_000, 20, 100)


def apply_gc_policy() -> None:
    """The benchmark's one GC policy, applied to every Python peer."""
    gc.set_threshold(*GC_POLICY)


class Body:
    """The shared processor body, writing to one facts directory."""

    def __init__(self, facts_dir: str) -> None:
        self._facts_dir = facts_dir
        self._writer: FactsWriter | None = None  # opened at the first task
        self._decode = msgspec.json.Decoder(Task).decode

    @classmethod
    def from_env(cls) -> Body:
        """The body of a process started with :data:`FACTS_ENV_VAR` set."""
        return cls(os.environ[FACTS_ENV_VAR])

    async def run(self, partition: int, offset: int, task: Task) -> None:
        """Process a decoded task."""
        start = time.time_ns()
        if task.d:
            await asyncio.sleep(task.d / 1000)
        writer = self._writer
        if writer is None:
            writer = self._writer = FactsWriter(self._facts_dir)
        writer.add(task.k, partition, offset, start, time.time_ns())

    async def run_raw(self, partition: int, offset: int, value: bytes) -> None:
        """Decode the record's value, then :meth:`run`."""
        await self.run(partition, offset, self._decode(value))


def main(argv: list[str]) -> int:
    from bench.contenders import CONTENDERS

    spec = RunSpec.from_json(argv[0])
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass
    from decaton_aio.logs import configure_logging

    configure_logging("warning", json=False, stream=sys.stderr)
    module: Any = importlib.import_module(CONTENDERS[spec.contender].module)
    body = Body(spec.facts_dir)
    apply_gc_policy()
    if hasattr(module, "run_blocking"):
        module.run_blocking(spec, body)
    else:
        asyncio.run(module.main(spec, body))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
