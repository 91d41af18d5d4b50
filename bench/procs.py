"""Processes of a run: a contender's process tree, its CPU time and the broker's.

CPU time is read from ``/proc/<pid>/stat`` (user + system) of a process and all its
descendants, so a supervisor's workers and a JVM's threads all count. Sampled at the
window's open and close; a process that started in between counts from zero.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO, NamedTuple

from bench import reaper

__all__ = [
    "MachineTimes",
    "cpu_delta",
    "cpu_times",
    "descendants",
    "machine_times",
    "own_cpu",
    "rss_bytes",
    "run_delays",
    "start_process",
    "stop_process",
]

_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces: fields start after its closing paren.
    return raw[raw.rindex(")") + 2 :].split()


class MachineTimes(NamedTuple):
    """The whole machine's CPU seconds since boot, from ``/proc/stat``: busy (user, nice,
    system, irq, softirq), stolen by the hypervisor, and in all (idle and iowait too)."""

    busy: float
    steal: float
    total: float


def machine_times() -> MachineTimes:
    """The machine's CPU seconds so far (all cores; see :class:`MachineTimes`)."""
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return MachineTimes(
        busy=(user + nice + system + irq + softirq) / _TICK,
        steal=steal / _TICK,
        total=sum(fields) / _TICK,
    )


def own_cpu() -> float:
    """CPU seconds of this process alone (all its threads), not of its children."""
    times = os.times()
    return times.user + times.system


def descendants(roots: Iterable[int]) -> list[int]:
    """``roots`` and every live process below them."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields is not None:
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: list[int] = []
    stack = list(roots)
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, ()))
    return found


def cpu_times(roots: Iterable[int]) -> dict[int, float]:
    """CPU seconds (user + system) of each process of the trees under ``roots``."""
    out: dict[int, float] = {}
    for pid in descendants(roots):
        fields = _stat(pid)
        if fields is not None:
            out[pid] = (int(fields[11]) + int(fields[12])) / _TICK
    return out


def run_delays(roots: Iterable[int]) -> dict[int, float]:
    """Seconds each thread of the trees under ``roots`` was ready to run but waited for a
    core (``/proc/<pid>/task/<tid>/schedstat``, second field), by thread id: over a
    window, a loop late by more than its own work explains is one that waited here."""
    out: dict[int, float] = {}
    for pid in descendants(roots):
        try:
            tasks = list(Path(f"/proc/{pid}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                out[int(task.name)] = int((task / "schedstat").read_text().split()[1]) / 1e9
            except (OSError, IndexError, ValueError):
                continue
    return out


def rss_bytes(roots: Iterable[int]) -> tuple[int, int]:
    """The resident memory of the trees under ``roots`` (summed; pages two processes
    share count twice) and how many processes they hold."""
    total = count = 0
    for pid in descendants(roots):
        try:
            raw = Path(f"/proc/{pid}/statm").read_text()
        except OSError:
            continue
        total += int(raw.split()[1]) * _PAGE
        count += 1
    return total, count


def cpu_delta(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds spent between two :func:`cpu_times` samples."""
    return sum(t - before.get(pid, 0.0) for pid, t in after.items())


async def start_process(
    argv: list[str], *, env: dict[str, str], cwd: Path, log: Path
) -> asyncio.subprocess.Process:
    """Start a contender in a session of its own, its output into ``log``; it dies with
    the harness (:mod:`bench.reaper`) unless :func:`stop_process` stops it first."""
    with _open_log(log) as out:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
            preexec_fn=reaper.die_with_harness(),
        )
    reaper.adopt(proc.pid)
    return proc


def _open_log(path: Path) -> BinaryIO:
    return open(path, "wb")  # the caller closes it


async def stop_process(proc: asyncio.subprocess.Process, grace_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL of the whole tree after ``grace_s``."""
    tree = descendants([proc.pid])  # before the root exits and its children move away
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), grace_s)
    for pid in reversed(tree):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    if proc.returncode is None:
        await proc.wait()
    reaper.release(proc.pid)
