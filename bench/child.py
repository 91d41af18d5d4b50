"""S4-S6 in a fresh process: ``python -m bench.child '<spec json>'``.

Writes JSON lines to stdout (``{"event": "ready"}`` for paced runs, then one
``{"event": "result", ...}`` or ``{"event": "error", ...}``) and exits.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import sys
import traceback

from bench.recorder import Recorder, emit
from bench.workload import Spec

__all__ = ["main"]


def _uvloop() -> bool:
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


async def _consume(spec: Spec, recorder: Recorder, module: object) -> None:
    run = asyncio.create_task(module.main(spec, recorder))  # type: ignore[attr-defined]
    window = asyncio.create_task(recorder.wait())
    done, _ = await asyncio.wait({run, window}, return_when=asyncio.FIRST_COMPLETED)
    if run in done and run.exception() is not None:
        raise run.exception()  # type: ignore[misc]
    await window
    if not run.done():
        # Give the contender a moment to fill in its extras, without waiting for work.
        await asyncio.wait({run}, timeout=0.05)
    # Report before asyncio.run() tears down: cancelling the tasks still running would
    # start their keys' next tasks and count as overlaps that are not the contender's.
    recorder.finish()


def main(argv: list[str]) -> int:
    spec = Spec.from_json(argv[0])
    uvloop = _uvloop()
    if os.environ.get("BENCH_PRELOAD"):  # experiments: a module that patches things
        importlib.import_module(os.environ["BENCH_PRELOAD"])
    if os.environ.get("BENCH_GC_THRESHOLD"):  # experiments: e.g. 50000,20,20
        import gc

        gc.set_threshold(*(int(x) for x in os.environ["BENCH_GC_THRESHOLD"].split(",")))
    from decaton_aio.logs import configure_logging

    configure_logging("info", json=False, stream=sys.stderr)  # stdout carries results
    try:
        if spec.scenario == "S4":
            from bench.tracker import measure_tracker

            sizes = spec.options["pending_sizes"]
            for size in sizes:
                out = measure_tracker(spec.contender, size, spec.measure_max_s)
                emit(
                    {
                        "event": "result",
                        "scenario": "S4",
                        "contender": spec.contender,
                        "pending": size,
                        **out,
                    }
                )
            return 0
        if spec.scenario == "S5":
            from bench.memory import run

            emit(asyncio.run(run(spec)))
            os._exit(0)
        recorder = Recorder(spec)
        recorder.extra["uvloop"] = uvloop
        module = importlib.import_module("bench.contenders.ours")  # S6: variants of ours
        if os.environ.get("BENCH_GC_FREEZE"):  # experiments: startup objects out of GC
            import gc

            gc.collect()
            gc.freeze()
        if hasattr(module, "run_blocking"):
            module.run_blocking(spec, recorder)  # ends the process itself
            return 1
        asyncio.run(_consume(spec, recorder, module))  # ends the process itself
        return 1
    except BaseException as exc:
        emit(
            {
                "event": "error",
                "scenario": spec.scenario,
                "contender": spec.contender,
                "error": f"{type(exc).__name__}: {exc}",
            }
        )
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
