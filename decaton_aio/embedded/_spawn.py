"""Starting the broker processes from a thread that lives as long as this process.

A broker is started with a parent-death signal (``PR_SET_PDEATHSIG``) so it never
outlives the process that owns it. The kernel sends that signal when the *thread* that
forked the child ends, not the process: a broker started from a short-lived thread (a
test's ``asyncio.to_thread(broker.start)``) would die with that thread. So every broker
process is forked by the main thread, or by one worker thread kept for the purpose.

Caller: the broker classes of `decaton_aio.embedded`, when they start a process.
"""

from __future__ import annotations

import ctypes
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

__all__ = ["die_with_parent", "popen_for_life"]

_SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="decaton-aio-broker-spawner")


def popen_for_life(argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(argv, **kwargs)``, forked by a thread that lives as long as
    this process (the main thread, or the spawner thread)."""

    def fork() -> subprocess.Popen[bytes]:
        return subprocess.Popen(argv, **kwargs)

    if threading.current_thread() is threading.main_thread():
        return fork()
    return _SPAWNER.submit(fork).result()


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child receive ``sig`` when its parent dies (Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return None
    pr_set_pdeathsig = 1

    def preexec() -> None:
        libc.prctl(pr_set_pdeathsig, sig, 0, 0, 0)

    return preexec
