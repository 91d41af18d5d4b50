"""``ours-keyshare``: every usable CPU runs one process of ours, and the processes share
each partition's keys instead of dividing the partitions.

An option for a machine whose cores do not divide the partitions (3 partitions on 2
cores), measured against ``--workers auto`` (one process per partition, the cores
shared). Built from the runtime's own settings, no change to it: process ``i`` of ``n``
reads every partition in a consumer group of its own (the first one in the run's group,
so the harness's commit check reads it; the others in ``<group>-share-<i>``) and skips
the keys of the other shares with ``decaton.ignore.keys`` (their offsets completed, no
task run). A key belongs to share ``crc32(key) % n``, so each key's tasks run in one
process, in order. Every process fetches and decodes the whole topic and commits its own
offsets: the cost of the balance. The key space is the benchmark's (``0 .. keys - 1``).
Option ``shares``: the process count (default: the usable CPUs); the others are ours'.

Run by ``python -m bench.body`` like a Python peer: this process starts the shares'
``python -m decaton_aio run`` processes, forwards SIGTERM and SIGINT to them and waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
import sys
import zlib

from bench.body import Body
from bench.scenarios import Scenario
from bench.workload import RunSpec
from decaton_aio.cli._supervisor import usable_cpus
from decaton_aio.properties import IGNORE_KEYS

__all__ = ["KEYS", "main", "share_commands", "share_of"]

#: The benchmark's ordinary keys (S1 and the ladder).
KEYS = Scenario.keys
IGNORE = IGNORE_KEYS.name


def share_of(key: bytes, shares: int) -> int:
    """The share (process) a key's tasks run in."""
    return zlib.crc32(key) % shares


def share_commands(spec: RunSpec, shares: int, python: str) -> list[list[str]]:
    """The command of each share's process: ours on ``spec``'s topic in a group of its
    own, skipping the other shares' keys."""
    from bench.measure import command_line

    keys = [b"%d" % k for k in range(KEYS)]
    commands = []
    for i in range(shares):
        ignored = ",".join(k.decode() for k in keys if share_of(k, shares) != i)
        group = spec.group if i == 0 else f"{spec.group}-share-{i}"
        one = dataclasses.replace(spec, contender="ours", group=group)
        commands.append([*command_line(one, python), "--property", f"{IGNORE}={ignored}"])
    return commands


async def main(spec: RunSpec, body: Body) -> None:
    options = dict(spec.options)
    shares = int(options.pop("shares", usable_cpus()))
    spec = dataclasses.replace(spec, options=options)
    procs = [
        await asyncio.create_subprocess_exec(*argv)
        for argv in share_commands(spec, shares, sys.executable)
    ]
    loop = asyncio.get_running_loop()

    def forward(signum: int) -> None:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, forward, signum)
    codes = await asyncio.gather(*(proc.wait() for proc in procs))
    if any(codes):
        raise SystemExit(f"a share's process exited with {codes}")
