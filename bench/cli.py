"""The command line of the benchmark: ``python -m bench [--quick] [--only S1,L] ...``."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from bench import reaper
from bench.run import RESULTS, SECURED, Run, emit_line, fair_scenarios, report_from_log, say
from bench.scenarios import SWEEPS, plan
from decaton_aio import environment
from decaton_aio.embedded import FLAVORS

__all__ = ["main"]

_DESCRIPTION = "Run the benchmark scenarios against the embedded broker; see bench/README.md."


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=_DESCRIPTION)
    parser.add_argument("--quick", action="store_true", help="short windows (bench-quick)")
    parser.add_argument("--only", default="", help="scenarios to run, e.g. S1,L,S5,S1-P96")
    parser.add_argument("--contenders", default="", help="contenders to run, e.g. ours,gather")
    parser.add_argument(
        "--broker",
        default=environment.BROKER.get() or "apache",
        help="embedded broker flavors to run on, in order, e.g. apache,tansu (default "
        "apache; env DECATON_AIO_BROKER); targets are judged on the first",
    )
    parser.add_argument(
        "--secured",
        action="store_true",
        help="Apache Kafka over SASL_SSL (SCRAM-SHA-512, a password made for the run): the "
        "cost of TLS and SASL; contenders that cannot connect so are reported unavailable",
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="results directory")
    parser.add_argument(
        "--from-log",
        type=Path,
        nargs="+",
        metavar="LOG",
        help="run nothing: write the report from the standard output of a run (one that "
        "was stopped too) into --out; of several runs, a contender's scenario a later "
        "run finished replaces an earlier run's rows of it",
    )
    parser.add_argument(
        "--resume",
        type=Path,
        metavar="LOG",
        help="go on with a run stopped after S1 and the ladder: S1's best settings and "
        "capacities come from LOG (its standard output), and the scenarios after the ladder "
        "run (or --only's); the report of both is --from-log LOG THIS_LOG",
    )
    parser.add_argument(
        "--kill-leftovers",
        action="store_true",
        help="kill contender processes left by an earlier run (no running harness owns "
        "them) before measuring; without it such processes stop the run before it starts",
    )
    parser.add_argument("--python", default=sys.executable, help="interpreter for contenders")
    parser.add_argument("--seed", type=int, help="the random order of runs (default: the time)")
    parser.add_argument("--window-s", type=float, help="the measured window of a repeat")
    parser.add_argument("--warmup-s", type=float, help="warm-up after the first task")
    parser.add_argument("--sweep-window-s", type=float, help="the window of a sweep run")
    parser.add_argument("--repeats", type=int, help="runs at the best setting")
    parser.add_argument("--ladder-window-s", type=float, help="a paced rung's window")
    parser.add_argument(
        "--ladder-rounds",
        type=int,
        help="ladders of each contender the targets judge, in turns (default 3, quick 1)",
    )
    parser.add_argument(
        "--partitions",
        type=int,
        help="the task topic's partitions in S1, S2, S3 and the ladder (default 3), e.g. "
        "to measure exactly-once on 48: --only S1 --partitions 48",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="CONTENDER.OPTION=VALUE",
        help="run CONTENDER with this setting only instead of its sweep, e.g. "
        "ours.concurrency=500 (repeatable)",
    )
    parser.add_argument(
        "--capacity",
        action="append",
        default=[],
        metavar="CONTENDER=TASKS_PER_S",
        help="the S1 capacity the ladder paces CONTENDER at when S1 is not in the run, "
        "e.g. --only L --capacity ours=60000 (repeatable)",
    )
    args = parser.parse_args(argv)
    for item in args.set:
        name, _, raw = item.partition("=")
        if "." not in name or not raw:
            parser.error(f"--set wants CONTENDER.OPTION=VALUE, got {item!r}")
        who, _, option = name.partition(".")
        if who not in SWEEPS:
            parser.error(f"--set: unknown contender {who!r}")
        value = json.loads(raw) if raw[0] in "-0123456789[{tfn" else raw
        fixed = args.__dict__.setdefault("fixed", {}).setdefault(who, {})
        fixed[option] = value
    args.capacities = {}
    for item in args.capacity:
        who, _, raw = item.partition("=")
        if who not in SWEEPS:
            parser.error(f"--capacity: unknown contender {who!r}")
        try:
            args.capacities[who] = float(raw)
        except ValueError:
            parser.error(f"--capacity wants CONTENDER=TASKS_PER_S, got {item!r}")
        if args.capacities[who] <= 0:
            parser.error(f"--capacity wants a positive rate, got {item!r}")
    if args.ladder_rounds is not None and args.ladder_rounds < 1:
        parser.error(f"--ladder-rounds wants 1 or more, got {args.ladder_rounds}")
    args.broker = [b.strip() for b in args.broker.split(",") if b.strip()]
    unknown = [b for b in args.broker if b not in FLAVORS]
    if unknown or not args.broker:
        parser.error(f"--broker takes flavors from {', '.join(FLAVORS)}, got {unknown}")
    if args.secured and args.broker != ["apache"]:
        parser.error("--secured runs on Apache Kafka only: drop --broker (or give apache)")
    args.only = [s.strip().upper() for s in args.only.split(",") if s.strip()]
    if args.resume is not None:
        if not args.resume.is_file():
            parser.error(f"--resume: no such log {args.resume}")
        args.only = args.only or [s.name for s in plan(False)[1] if s.name not in ("S1", "L")]
    args.contenders = [c.strip() for c in args.contenders.split(",") if c.strip()]
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    if args.from_log is not None:
        try:
            args.out.mkdir(parents=True, exist_ok=True)
            report_from_log(args.from_log, args.out)
        except (OSError, ValueError) as exc:
            print(f"python -m bench: {exc}", file=sys.stderr)
            return 2
        return 0
    reaper.install()  # whatever ends the run, the processes it started end with it
    if not reaper.check_leftovers(args.kill_leftovers, say):
        print(
            "python -m bench: contender processes of an earlier run are still running "
            "(above) and would skew the figures: stop them, or pass --kill-leftovers",
            file=sys.stderr,
        )
        return 2
    sizes, scenarios = plan(args.quick)
    overrides = {
        "window_s": args.window_s,
        "warmup_s": args.warmup_s,
        "sweep_window_s": args.sweep_window_s,
        "repeats": args.repeats,
        "ladder_window_s": args.ladder_window_s,
        "ladder_rounds": args.ladder_rounds,
    }
    sizes = replace(sizes, **{k: v for k, v in overrides.items() if v is not None})
    for who, setting in getattr(args, "fixed", {}).items():
        SWEEPS[who] = [setting]
    run = Run(args, sizes)
    run.out.mkdir(parents=True, exist_ok=True)
    run.logs.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    secured = {"secured": SECURED} if args.secured else {}
    emit_line(
        {"event": "machine", "mode": run.mode, **secured, "sizes": sizes.__dict__, **run.facts}
    )
    scenarios = [s for s in scenarios if not args.only or s.name in args.only]
    if args.partitions is not None:
        scenarios = [
            replace(s, partitions=args.partitions, title=f"{s.title}; {args.partitions} partitions")
            if s.name in ("S1", "S2", "S3", "L")
            else s
            for s in scenarios
        ]
    fair, legacy = fair_scenarios(scenarios)
    for flavor in args.broker:
        if fair:
            asyncio.run(run.fair(fair, flavor))
        for scn in legacy:
            if scn.name == "S4" and flavor != args.broker[0]:
                continue  # no broker involved: once is enough
            asyncio.run(run.legacy(scn, flavor))
    run.write()
    say(f"done in {time.monotonic() - started:.0f}s")
    return 0
