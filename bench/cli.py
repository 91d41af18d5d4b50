"""The command line of the benchmark: ``python -m bench [--quick] [--only S1,S2] ...``."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from bench.run import RESULTS, Run, emit_line, say
from bench.scenarios import plan
from decaton_aio.embedded import FLAVORS

__all__ = ["main"]

_DESCRIPTION = "Run the benchmark scenarios against the embedded broker; see bench/README.md."


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=_DESCRIPTION)
    parser.add_argument("--quick", action="store_true", help="the reduced set (bench-quick)")
    parser.add_argument("--only", default="", help="scenarios to run, e.g. S1,S4")
    parser.add_argument("--contenders", default="", help="contenders to run, e.g. ours,gather")
    parser.add_argument(
        "--broker",
        default=os.environ.get("DECATON_AIO_BROKER") or "apache",
        help="embedded broker flavors to run every scenario on, in order, e.g. apache,tansu "
        "(default apache; env DECATON_AIO_BROKER); targets are checked on the first",
    )
    parser.add_argument(
        "--secured",
        action="store_true",
        help="Apache Kafka over SASL_SSL (SCRAM-SHA-512): the cost of TLS and SASL; the "
        "peers are left out",
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="results directory")
    parser.add_argument("--python", default=sys.executable, help="interpreter for contenders")
    parser.add_argument(
        "--peers-python",
        default=os.environ.get("BENCH_PEERS_PYTHON"),
        help="interpreter with faust-streaming and faststream (default: --python; "
        "env BENCH_PEERS_PYTHON)",
    )
    parser.add_argument(
        "--profile",
        default="",
        help="run our contender of these scenarios under py-spy, e.g. S1,S2",
    )
    parser.add_argument(
        "--tasks", type=int, default=0, help="override the measured task count (S1-S3)"
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run each S1-S3 contender this many times and keep the median run",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="CONTENDER.OPTION=VALUE",
        help="override a contender option, e.g. ours.concurrency=500 (repeatable)",
    )
    args = parser.parse_args(argv)
    pairs = []
    for item in args.set:
        name, _, raw = item.partition("=")
        if "." not in name or not raw:
            parser.error(f"--set wants CONTENDER.OPTION=VALUE, got {item!r}")
        pairs.append((name, json.loads(raw) if raw[0] in "-0123456789[{tfn" else raw))
    args.set = pairs
    args.broker = [b.strip() for b in args.broker.split(",") if b.strip()]
    unknown = [b for b in args.broker if b not in FLAVORS]
    if unknown or not args.broker:
        parser.error(f"--broker takes flavors from {', '.join(FLAVORS)}, got {unknown}")
    args.only = [s.strip().upper() for s in args.only.split(",") if s.strip()]
    args.contenders = [c.strip() for c in args.contenders.split(",") if c.strip()]
    args.profile = [s.strip().upper() for s in args.profile.split(",") if s.strip()]
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    run = Run(args)
    run.out.mkdir(parents=True, exist_ok=True)
    run.logs.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    emit_line({"event": "machine", "mode": run.mode, **run.facts})
    scenarios = plan(args.quick)
    if args.tasks:
        scenarios = [
            replace(s, measured=args.tasks) if s.name in ("S1", "S2", "S3") else s
            for s in scenarios
        ]
    for flavor in args.broker:
        for scn in scenarios:
            if args.only and scn.name not in args.only:
                continue
            if scn.name == "S4" and flavor != args.broker[0]:
                continue  # no broker involved: once is enough
            asyncio.run(run.scenario(scn, flavor))
    run.write()
    say(f"done in {time.monotonic() - started:.0f}s")
    return 0
