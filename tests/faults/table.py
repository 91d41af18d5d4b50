"""The fault suite's figures as a Markdown table: ``python -m tests.faults.table WHERE...``
reads the ``faults-long-*.json`` a run wrote (WHERE: its base temporary directory, ``.faults``
for ``make faults``) or the lines ``faults <name>: {...}`` it printed (WHERE: its output,
kept in a file), and prints one row per long scenario, in the order of the operations
page's table. Several WHEREs: a scenario run again replaces its earlier figures."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

PATHS = ("runtime", "leaders", "coordinator", "node", "producer")
FAULTS = (
    "latency",
    "bandwidth",
    "reset_peer",
    "timeout",
    "slicer",
    "limit_data",
    "down",
    "commit",
)
HEADER = (
    "| path | fault | mode | group protocol | tasks | not ready after | ready again after the end "
    "| commit 5 s old after | warnings "
    "| longest stall | resumed after the end | lag 0 after the end | pace then "
    "| redone / bound | lost | out of order "
    "| outputs twice | fds | RSS MiB |"
)


def _s(value: float | None) -> str:
    return "never" if value is None else f"{value:g} s"


def _pace(f: dict[str, Any]) -> str:
    if f.get("drain_per_s") is None:
        return ""
    cores = f.get("drain_cores")
    return f"{f['drain_per_s']}/s" + ("" if cores is None else f" on {cores:g} cores")


def row(f: dict[str, Any]) -> str:
    mode = "exactly-once" if f["exactly_once"] else "at-least-once"
    fds = "{:g} → {:g}".format(*f["fds"])
    rss = "{:g} → {:g}".format(*f["rss_mb"])
    cells = [
        f["path"],
        f["fault"] + (" during a rebalance" if f.get("rebalance") else ""),
        mode,
        f.get("protocol", "classic"),
        str(f["tasks"]),
        _s(f["detect_s"]),
        _s(f["ready_s"]) if "ready_s" in f else "",
        _s(f["aged_s"]) if "aged_s" in f else "",
        str(sum(w.values()) if isinstance(w := f.get("warnings", ""), dict) else w),
        _s(f["stall_s"]),
        _s(f["resumed_s"]) if "resumed_s" in f else "",
        _s(f["recover_s"]),
        _pace(f),
        f"{f['redone']} / {f['redo_bound']}",
        str(f["lost"]),
        str(f["out_of_order"]),
        str(f["duplicate_outputs"]),
        fds,
        rss,
    ]
    return "| " + " | ".join(cells) + " |"


def table(figures: list[dict[str, Any]]) -> str:
    def order(f: dict[str, Any]) -> tuple[int, bool, int, bool, str]:
        fault = FAULTS.index(f["fault"])
        protocol = f.get("protocol", "classic")
        return PATHS.index(f["path"]), bool(f.get("rebalance")), fault, f["exactly_once"], protocol

    lines = [HEADER, "|" + "---|" * HEADER.count(" | ") + "---|"]
    lines += [row(f) for f in sorted(figures, key=order)]
    return "\n".join(lines)


_PRINTED = re.compile(r"faults (long-[\w-]+): (?=\{)")


def _read(where: str) -> list[dict[str, Any]]:
    found = Path(where)
    if not found.exists():
        return []
    if found.is_dir():
        return [json.loads(p.read_text()) for p in sorted(found.glob("faults-long-*.json"))]
    text = found.read_text()
    decoder = json.JSONDecoder()  # a scenario's figures hold objects (its warnings)
    return [decoder.raw_decode(text, m.end())[0] for m in _PRINTED.finditer(text)]


def main(*wheres: str) -> None:
    """Print the table of the runs found in ``wheres``; a scenario found in several, as
    the last one has it (a scenario run again replaces its earlier figures)."""
    figures: dict[tuple[str, str, bool, bool, str], dict[str, Any]] = {}
    for where in wheres:
        for f in _read(where):
            protocol = f.get("protocol", "classic")
            key = (f["path"], f["fault"], f["exactly_once"], bool(f.get("rebalance")), protocol)
            figures[key] = f
    print(table(list(figures.values())))


if __name__ == "__main__":
    main(*sys.argv[1:])
