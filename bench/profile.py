"""Hotspot summaries of py-spy profiles (``py-spy record -f raw``: collapsed stacks).

``python -m bench.profile FILE [--top N]`` prints, in percent of the samples (py-spy
samples only a thread that runs, so this is the share of CPU time):

- by package: self time grouped by where the code lives (our runtime, aiokafka, asyncio,
  the benchmark's own processor, ...);
- self time per function (the frame on top of the stack);
- inclusive time per function (the function anywhere on the stack).
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

__all__ = ["summarize"]

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^():]*)(?::(?P<line>\d+))?\)$")


def _function(frame: str) -> tuple[str, str]:
    match = _FRAME.match(frame)
    if not match:
        return frame, ""
    path = match["file"]
    for marker in ("site-packages/", "/lib/python3", "/work/main/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    if path.startswith(".") and "/" in path:
        path = path.split("/", 1)[1]
    return f"{match['func']} ({path})", path


def _package(path: str) -> str:
    if path.startswith("decaton_aio/"):
        return path
    if path.startswith("bench/"):
        return "bench (the measuring processor)"
    if "asyncio/" in path:
        return "asyncio (stdlib)"
    if path.startswith("aiokafka/"):
        return "aiokafka/" + path.split("/")[1]
    if path:
        return path.split("/")[0]
    return "native / unknown"


def summarize(path: Path | str, top: int = 15) -> str:
    """Summarize one collapsed-stack profile as text."""
    total = 0
    self_time: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    packages: Counter[str] = Counter()
    for line in Path(path).read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = [_function(f) for f in stack.split(";") if f]
        if not frames:
            continue
        leaf, leaf_path = frames[-1]
        self_time[leaf] += count
        packages[_package(leaf_path)] += count
        for name in {name for name, _ in frames}:
            inclusive[name] += count
    if not total:
        return "no samples\n"

    def table(title: str, counter: Counter[str], n: int) -> list[str]:
        rows = [f"{title} (of {total} samples)"]
        rows += [f"  {c / total * 100:5.1f}%  {name}" for name, c in counter.most_common(n)]
        return rows

    lines = table("self time by package/module", packages, top)
    lines += table("self time by function", self_time, top)
    lines += table("inclusive time by function", inclusive, top + 10)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    args = sys.argv[1:]
    n = 15
    if "--top" in args:
        i = args.index("--top")
        n = int(args[i + 1])
        del args[i : i + 2]
    for file in args:
        print(f"== {file}")
        print(summarize(file, n))
