"""What our runtime's fetch cycles cost: the figures of a window, their table in the
report, and ``python -m bench.cycles``, which measures just them for ours, without the
peers, in a few minutes.

A fetch cycle is one fetch call of the runtime's fetch routine, counted by its fetch
latency histogram (``decaton_consumer_fetch_latency_seconds``; a supervisor's endpoint
sums its workers') between two scrapes of the metrics page, at the window's open and
close. Over the window:

- ``fetch_cycles_per_s``: cycles per second, every worker together;
- ``cpu_ms_per_fetch_cycle``: the CPU time (user + system, ``/proc/<pid>/stat``) of the
  contender's whole process tree over the window per cycle. The tasks' own CPU is in it:
  at a low paced rate it is mostly the cycles', at full speed mostly the tasks'.

Beside them the report gives the tree's and the broker's (its JVM's) CPU s per 1,000
tasks. ``python -m bench.cycles`` starts an embedded Apache Kafka and paces each
contender (ours as deployed, ``--workers auto``, by default) on a fresh topic of each
partition count (3 and 96) at shares (10, 25 and 50%) of a fixed capacity: by default
each contender's S1 capacity and best setting in the full run of tree 1868ff9
(``bench/results/run-1868ff9.md``), so two trees are paced at the same rates; 3 s of
warm-up and a 20 s window per rung, 10 s at the first rung's pace before it. Its rows are
the ladder's JSON lines (stdout); the table goes to stderr and, with ``--out``, to a
Markdown file.

``--fetch-loops`` measures the fetch loops alone instead, without the runtime: aiokafka's
fetcher as the runtime uses it beside the consumer's own (`decaton_aio.consumer.fetch`),
with and without fetch sessions, each in a process of its own on the same paced topic of
each partition count, at ``--rates`` records per second (`bench.fetchloop`): their calls
per second, CPU per call and per 1,000 records, and the broker's CPU per 1,000 records.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench import reaper
from bench.contenders import CONTENDERS
from bench.fetchloop import IMPLS, fetch_loop_table, measure_fetch_loops
from bench.loopstats import Buckets, window_figures

__all__ = ["BASELINE", "cycle_figures", "cycle_table", "fetch_cycles", "main"]

#: contender -> (S1 capacity in tasks/s, best setting) in the full run of tree 1868ff9.
BASELINE: dict[str, tuple[float, dict[str, Any]]] = {
    "ours-auto": (129_608, {"concurrency": 1000}),
    "ours": (81_522, {"concurrency": 1000, "max_pending": 30000}),
}
_SHARES = (0.1, 0.25, 0.5)


def fetch_cycles(opened: Buckets | None, closed: Buckets | None) -> int | None:
    """The fetch calls between two scrapes of our metrics page; ``None`` without both."""
    if opened is None or closed is None:
        return None
    count: int = window_figures(opened, closed)["fetch_count"]
    return count


def cycle_figures(cpu_s: float, window_s: float, cycles: int | None) -> dict[str, Any]:
    """Fetch cycles per second and the tree's CPU ms per cycle over a window of
    ``window_s`` with ``cpu_s`` of CPU; empty when the cycles were not counted."""
    if cycles is None or window_s <= 0:
        return {}
    return {
        "fetch_cycles": cycles,
        "fetch_cycles_per_s": round(cycles / window_s, 1),
        "cpu_ms_per_fetch_cycle": round(cpu_s * 1000 / cycles, 3) if cycles else None,
    }


def _fmt(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def _p99(rung: dict[str, Any]) -> str:
    # A paced rung's produce-to-done p99, its lower bound when too few tasks ended (the
    # contender fell behind: its figures are a backlog's, not the pace's); "-" elsewhere.
    if rung.get("p99_ms") is not None:
        return _fmt(rung["p99_ms"], 1)
    bound = rung.get("p99_ms_lower_bound")
    return f"> {_fmt(bound)}" if bound is not None else "-"


def _workers(row: dict[str, Any]) -> int:
    # A supervisor's tree is the supervisor and its workers; one process is itself.
    tree = int(row.get("tree_processes") or 1)
    return tree - 1 if tree > 1 else 1


def cycle_table(results: list[dict[str, Any]]) -> list[str]:
    """Markdown lines: the fetch cycles of each run and rung of ours that counted them."""
    rows = []
    for r in results:
        if CONTENDERS.get(r.get("contender", ""), None) is None:
            continue
        if CONTENDERS[r["contender"]].kind != "cli":
            continue
        if r.get("event") == "result" and r.get("fetch_cycles_per_s") is not None:
            rows.append((r, "full speed", {**r, "rate": r.get("tasks_per_s")}))
        elif r.get("event") == "latency":
            for rung in r["rungs"]:
                if rung.get("fetch_cycles_per_s") is not None:
                    share = _fmt((rung.get("share_of_capacity") or 0) * 100) + "%"
                    rows.append((r, share, rung))
    if not rows:
        return []
    lines = [
        "## Fetch cycles",
        "",
        "Our runtime's fetch calls over each window (from its metrics page, every worker "
        "together and per worker), the CPU of its process tree per call (the tasks' CPU "
        "included: at a low rate mostly the calls'), its CPU and the broker's per 1000 "
        "tasks, and the cores busy on the whole machine, of which by processes other than "
        "the contender, the broker and the harness (`bench/cycles.py`). A paced rung "
        "whose p99 is only a lower bound fell behind its pace: its figures are a "
        "backlog's.",
        "",
        "| scenario | partitions | contender | pace | rate /s | p99 ms | workers | cycles /s | "
        "per worker | CPU ms / cycle | CPU s / 1000 | broker CPU s / 1000 | "
        "cores busy (others) |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r, load, g in rows:
        workers = _workers(g if "tree_processes" in g else r)
        machine = g.get("machine") or {}
        busy = _fmt(machine.get("busy"), 2)
        if machine.get("other") is not None:
            busy += f" ({_fmt(machine['other'], 2)})"
        lines.append(
            f"| {r['scenario']} | {r.get('partitions', '-')} | {r['contender']} | {load} | "
            f"{_fmt(g.get('rate'))} | {_p99(g)} | {workers} | {_fmt(g['fetch_cycles_per_s'])} | "
            f"{_fmt(g['fetch_cycles_per_s'] / workers)} | "
            f"{_fmt(g.get('cpu_ms_per_fetch_cycle'), 3)} | {_fmt(g.get('cpu_s_per_1000'), 4)} | "
            f"{_fmt(g.get('broker_cpu_s_per_1000'), 4)} | {busy} |"
        )
    lines.append("")
    return lines


# ------------------------------------------------------------ python -m bench.cycles


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.cycles",
        description="Fetch cycles per second, CPU per cycle, CPU per task and the "
        "broker's CPU of ours at paced rungs, on 3 and 96 partitions; see bench/README.md.",
    )
    parser.add_argument("--contenders", default="ours-auto", help="of ours, e.g. ours-auto,ours")
    parser.add_argument("--partitions", type=int, nargs="+", default=[3, 96])
    parser.add_argument("--shares", type=float, nargs="+", default=list(_SHARES))
    parser.add_argument(
        "--capacity",
        action="append",
        default=[],
        metavar="CONTENDER=TASKS_PER_S",
        help="the rate the shares are of (default: the contender's S1 capacity in "
        "bench/results/run-1868ff9.md)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="CONTENDER.OPTION=VALUE",
        help="a setting instead of the contender's S1 best in that run (repeatable)",
    )
    parser.add_argument("--window-s", type=float, default=20.0)
    parser.add_argument("--warmup-s", type=float, default=3.0)
    parser.add_argument("--first-warmup-s", type=float, default=10.0)
    parser.add_argument("--out", type=Path, help="write the table and the facts here (.md)")
    parser.add_argument("--kill-leftovers", action="store_true", help="as python -m bench")
    parser.add_argument(
        "--from-log",
        type=Path,
        metavar="LOG",
        help="measure nothing: print the table of an earlier run's standard output",
    )
    parser.add_argument(
        "--fetch-loops",
        action="store_true",
        help="measure the fetch loops alone (aiokafka's and ours), not the runtime",
    )
    parser.add_argument(
        "--rates",
        type=float,
        nargs="+",
        default=[1000.0, 10000.0],
        help="records/s produced while the fetch loops are measured",
    )
    parser.add_argument("--impls", default=",".join(IMPLS), help="fetch loops to measure")
    args = parser.parse_args(argv)
    args.impls = [i.strip() for i in args.impls.split(",") if i.strip()]
    for impl in args.impls:
        if impl not in IMPLS:
            parser.error(f"--impls takes {', '.join(IMPLS)}, got {impl}")
    args.contenders = [c.strip() for c in args.contenders.split(",") if c.strip()]
    for contender in args.contenders:
        if contender not in CONTENDERS or CONTENDERS[contender].kind != "cli":
            parser.error(f"--contenders takes ours only ({', '.join(BASELINE)}), got {contender}")
    args.capacities = {c: BASELINE[c][0] for c in args.contenders if c in BASELINE}
    args.settings = {c: dict(BASELINE[c][1]) for c in args.contenders if c in BASELINE}
    for item in args.capacity:
        who, _, raw = item.partition("=")
        try:
            args.capacities[who] = float(raw)
        except ValueError:
            parser.error(f"--capacity wants CONTENDER=TASKS_PER_S, got {item!r}")
    for item in args.set:
        name, _, raw = item.partition("=")
        who, _, option = name.partition(".")
        if not option or not raw:
            parser.error(f"--set wants CONTENDER.OPTION=VALUE, got {item!r}")
        args.settings.setdefault(who, {})[option] = json.loads(raw) if raw[0].isdigit() else raw
    missing = [c for c in args.contenders if c not in args.capacities]
    if missing:
        parser.error(f"no capacity known for {', '.join(missing)}: give --capacity")
    return args


async def _measure(args: argparse.Namespace, workdir: Path) -> list[dict[str, Any]]:
    from bench.fair import FairRun
    from bench.measure import Harness
    from bench.run import SESSION_TIMEOUT_MS, say
    from bench.scenarios import plan
    from decaton_aio.embedded import EmbeddedBroker
    from decaton_aio.testing import TopicAdmin

    sizes, scenarios = plan(quick=False)
    sizes = replace(
        sizes,
        ladder_window_s=args.window_s,
        ladder_warmup_s=args.warmup_s,
        ladder_first_warmup_s=args.first_warmup_s,
        ladder_rounds=1,
    )
    s1 = next(s for s in scenarios if s.name == "S1")
    results: list[dict[str, Any]] = []

    def record(row: dict[str, Any]) -> None:
        results.append(row)
        print(json.dumps(row), flush=True)

    broker = EmbeddedBroker(flavor="apache", log_path=workdir / "broker.log")
    reaper.adopt_broker(broker)  # a signal while it starts stops it too
    broker.start()
    admin = TopicAdmin(broker.bootstrap_servers)
    try:
        harness = Harness(
            broker.bootstrap_servers,
            broker.pids,
            workdir,
            sys.executable,
            session_timeout_ms=SESSION_TIMEOUT_MS,
        )
        fair = FairRun(harness, admin, sizes, record, say, seed=0)
        fair.capacity.update(args.capacities)
        fair.best["S1"] = args.settings
        for partitions in args.partitions:
            name = "S1" if partitions == s1.partitions else f"S1-P{partitions}"
            scn = replace(s1, name=name, partitions=partitions)
            say(f"{name}: {partitions} partitions")
            await fair.ladder(scn, args.contenders, shares=tuple(args.shares))
    finally:
        await admin.close(delete=False)
        broker.stop()
        reaper.release_broker(broker)
    return results


async def _measure_loops(args: argparse.Namespace, workdir: Path) -> list[dict[str, Any]]:
    from bench.run import say

    results: list[dict[str, Any]] = []

    def record(row: dict[str, Any]) -> None:
        results.append(row)
        print(json.dumps(row), flush=True)

    args.workdir = workdir
    await measure_fetch_loops(args, record, say)
    return results


def _document(
    args: argparse.Namespace, results: list[dict[str, Any]], facts: dict[str, Any], started: str
) -> str:
    load = " / ".join(f"{x:.2f}" for x in facts["loadavg_at_start"])
    git = facts["git"]
    settings = "; ".join(
        f"{c}: {args.capacities[c]:,.0f}/s, {args.settings.get(c) or 'defaults'}"
        for c in args.contenders
    )
    if args.fetch_loops:
        settings = f"fetch loops {', '.join(args.impls)} at {args.rates} records/s"
    head = [
        "# Fetch cycles of ours",
        "",
        f"`python -m bench.cycles {' '.join(sys.argv[1:])}`, started {started}: tree "
        f"{git.get('commit')}{' (with uncommitted changes)' if git.get('dirty_files') else ''}, "
        f"{facts['cores']} cores ({facts['cpu']}), Python {facts['python']}, load average "
        f"(1, 5, 15 min) {load} at the start, {_load()} at the end. Capacities and "
        f"settings: {settings}. Windows of {args.window_s:g} s after {args.warmup_s:g} s of "
        "warm-up.",
        "",
    ]
    return "\n".join(head + cycle_table(results) + fetch_loop_table(results))


def _load() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    from bench.run import say

    args = _parse(sys.argv[1:] if argv is None else argv)
    if args.from_log is not None:
        lines = args.from_log.read_text(errors="replace").splitlines()
        rows = [json.loads(x) for x in lines if x.startswith("{")]
        print("\n".join(cycle_table(rows) + fetch_loop_table(rows)))
        return 0
    reaper.install()
    if not reaper.check_leftovers(args.kill_leftovers, say):
        print(
            "python -m bench.cycles: contender processes of an earlier run are still "
            "running (above): stop them, or pass --kill-leftovers",
            file=sys.stderr,
        )
        return 2
    from bench.facts import machine_facts

    facts = machine_facts(Path(__file__).absolute().parent.parent)  # the tree measured
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    workdir = Path(tempfile.mkdtemp(prefix="bench-cycles-"))
    if args.fetch_loops:
        results = asyncio.run(_measure_loops(args, workdir))
    else:
        results = asyncio.run(_measure(args, workdir))
    errors = [r for r in results if r.get("event") == "error"]
    if errors:
        say(f"logs kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    text = _document(args, results, facts, started)
    print(text, file=sys.stderr)
    if args.out is not None:
        args.out.write_text(text)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
